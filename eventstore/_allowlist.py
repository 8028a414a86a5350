"""The class allowlist: which class a name in the log (``"module:Qual"``) stands for.

Decoding never imports a module: a name resolves only to a class registered (or encoded)
under it, or to an allowed class (dataclass, attrs class, pydantic model, Enum) of a module
already imported, with the ``__main__`` rules that :class:`~eventstore.Codec` documents.
"""

from __future__ import annotations

import contextlib
import os
import sys
import typing
from collections.abc import Callable
from typing import Any

from ._errors import UnknownClassError
from ._tags import MAIN, class_name, classes_in, kind_of, split_version

__all__ = ["ClassAllowlist", "main_names"]


class ClassAllowlist:
    """The classes one codec may rebuild, by the names the log records them under.

    :param how_to_register: how a user registers a class, for the error that names a class
        it cannot resolve (``{name}`` is replaced by its qualified name).
    """

    def __init__(self, *, how_to_register: str) -> None:
        self._how_to_register = how_to_register
        self._classes: dict[str, type] = {}  # registered (or encoded) classes by their name
        self._by_qualname: dict[str, dict[str, type]] = {}  # the same, by qualified name
        self._resolved: dict[str, type] = {}  # names resolved to a class of some module
        self._main_aliases: list[str] = []
        # Aliased classes by the qualified name of the alias (``legacy:Query`` -> Query):
        # a script recorded it as ``__main__:Query``, which the alias matches last.
        self._aliased: dict[str, dict[str, type]] = {}
        self._caches: list[dict[str, Any]] = [self._resolved]

    def cache(self) -> dict[str, Any]:
        """A new cache by class name, from which a name is dropped whenever what it
        resolves to may have changed (a registration, an alias)."""
        cache: dict[str, Any] = {}
        self._caches.append(cache)
        return cache

    def register(self, classes: tuple[type, ...]) -> None:
        """Allows ``classes``, with the classes their fields name (see ``Codec.register``).

        :raises TypeError: a class is not a dataclass, attrs class, pydantic model or Enum.
        """
        seen: set[type] = set()
        stack = [(cls, True) for cls in classes]
        while stack:
            cls, explicit = stack.pop()
            kind = kind_of(cls) if isinstance(cls, type) else None
            if kind is None and explicit:
                msg = f"cannot register {cls!r}: not a dataclass, attrs class, model or Enum"
                raise TypeError(msg)
            if kind is None or cls in seen:
                continue
            seen.add(cls)
            self.admit(cls)
            hints: list[Any] = []
            # Unresolvable forward references: register what resolves.
            with contextlib.suppress(Exception):
                hints.extend(typing.get_type_hints(cls, include_extras=True).values())
            if kind == "model":
                # Resolved by pydantic where get_type_hints fails; a model not yet complete
                # holds forward references here, which get_type_hints resolved above.
                hints.extend(f.annotation for f in cls.model_fields.values())  # type: ignore[attr-defined]
            stack.extend((c, False) for hint in hints for c in classes_in(hint))

    def admit(self, cls: type) -> None:
        """Allows the one class ``cls`` under its own name (an encoded class is admitted,
        so that this process decodes what it encoded)."""
        name = class_name(cls)
        if self._classes.get(name) is not cls:
            self._classes[name] = cls
            self._by_qualname.setdefault(cls.__qualname__, {})[name] = cls
            # What resolved to another class of this qualified name may resolve to this now.
            qualname = cls.__qualname__
            self._forget(lambda n: n.partition(":")[2] == qualname)

    def alias_main(self, modules: tuple[str, ...]) -> None:
        """Reads names recorded under ``__main__`` as names of ``modules`` too."""
        for module in modules:
            if module != MAIN and module not in self._main_aliases:
                self._main_aliases.append(module)
                self._forget(lambda name: name.startswith(MAIN + ":"))

    def alias(self, name: str, cls: type) -> None:
        """Reads the class name ``name`` as ``cls`` (see ``Codec.alias``).

        :raises TypeError: ``cls`` is not a dataclass, attrs class, pydantic model or Enum.
        :raises ValueError: ``name`` is not a class name (``module:QualName``).
        """
        if not isinstance(cls, type) or kind_of(cls) is None:
            msg = f"cannot alias {name!r} to {cls!r}: not a dataclass, attrs class, model or Enum"
            raise TypeError(msg)
        module, _, qual = name.partition(":")
        if not module or not qual or "@" in name:
            msg = f"{name!r} is not a class name (module:QualName)"
            raise ValueError(msg)
        self.admit(cls)
        self._classes[name] = cls
        self._aliased.setdefault(qual, {})[name] = cls
        main_name = f"{MAIN}:{qual}"
        self._forget(lambda n: split_version(n)[0] in (name, main_name))

    def resolve(self, name: str) -> type:
        """The class that ``name`` stands for; never imports a module.

        :raises UnknownClassError: no allowed class of that name is registered or imported;
            the message says how to register it.
        """
        cls = self._classes.get(name) or self._resolved.get(name)
        if cls is None:
            if "@" in name:  # a versioned tag: the version is the builder's concern
                return self.resolve(split_version(name)[0])
            cls = self._resolved[name] = self._find(name)
        return cls

    def _forget(self, which: Callable[[str], bool]) -> None:
        for cache in self._caches:
            for name in [n for n in cache if which(n)]:
                del cache[name]

    def _find(self, name: str) -> type:
        module_name, _, qualname = name.partition(":")
        if not module_name or not qualname:
            raise UnknownClassError(name, "not a class name (module:QualName)")
        # Where to look, in order: registered classes (a list: one is the answer, several
        # are ambiguous) and the names of modules already imported.
        found = self._by_qualname.get(qualname, {})
        others: list[type] = []
        places: list[list[type] | str]
        if module_name == MAIN:
            # Written by a script: here, most likely the module of one of our workflows.
            others = [c for c in found.values() if c.__module__ != MAIN]
            ours = [c for c in others if c.__module__ in self._main_aliases]
            places = [ours, MAIN, others, *self._main_aliases]
        elif module_name in main_names():
            # This process runs that very module as its script.
            twin = found.get(f"{MAIN}:{qualname}")
            places = [[twin] if twin is not None else [], MAIN, module_name]
        else:
            places = [module_name]
        for place in places:
            if isinstance(place, list):
                if len(place) == 1:
                    return place[0]
                continue
            cls = _lookup(name, place, qualname)
            if cls is not None:
                return cls
        aliased = set(self._aliased.get(qualname, {}).values()) if module_name == MAIN else ()
        if len(aliased) == 1:
            return next(iter(aliased))  # renamed from any module's ``qualname``: this class
        imported = [p for p in places if isinstance(p, str) and p in sys.modules]
        if len(others) > 1:
            names = ", ".join(sorted(map(class_name, others)))
            why = f"several registered classes are named {qualname!r} ({names})"
        elif not imported:
            why = f"module {module_name!r} is not imported and no class of it is registered"
        else:
            why = (
                f"neither {' nor '.join(imported)} has a {qualname!r}"
                if len(imported) > 1
                else f"{imported[0]} has no {qualname!r}"
            )
            if "<locals>" in qualname:
                why += " (classes in functions must be registered)"
        how = self._how_to_register.format(name=qualname)
        msg = f"{why}; register it with {how} (decoding never imports modules)"
        raise UnknownClassError(name, msg)


def _lookup(name: str, module_name: str, qualname: str) -> type | None:
    """The allowed class ``qualname`` of an imported module; None if it has none."""
    obj: Any = sys.modules.get(module_name)
    if obj is None:
        return None
    for part in qualname.split("."):
        try:  # vars(), not getattr(): a module __getattr__ could run code, even import
            obj = vars(obj)[part]
        except (KeyError, TypeError):
            return None
    if not isinstance(obj, type):
        raise UnknownClassError(name, f"not a class but {type(obj)!r}")
    if kind_of(obj) is None:
        msg = "only dataclasses, attrs classes, pydantic models and Enums are rebuilt"
        raise UnknownClassError(name, msg)
    return obj


def main_names() -> set[str]:
    """The module names under which this process's ``__main__`` could be imported.

    ``python -m app`` says it in ``__spec__``; ``python app.py`` only gives the file, which
    is module ``app`` (or ``pkg.app``) for each ``sys.path`` entry it is under.
    """
    main = sys.modules.get(MAIN)
    names: set[str] = set()
    spec = getattr(main, "__spec__", None)
    if spec is not None and isinstance(spec.name, str):
        names.add(spec.name)
    file = getattr(main, "__file__", None)
    if isinstance(file, str) and file.endswith(".py"):
        stem = os.path.realpath(file)[:-3]
        for entry in sys.path:
            root = os.path.join(os.path.realpath(entry or os.curdir), "")
            if stem.startswith(root):
                parts = stem[len(root) :].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                if parts and all(p.isidentifier() for p in parts):
                    names.add(".".join(parts))
    names.discard(MAIN)
    return names
