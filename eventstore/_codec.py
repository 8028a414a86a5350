"""Typed values <-> JSON text: the event log's value codec.

:class:`Codec` is the facade over four parts, each a module of its own:

- :mod:`._tags`: the tagged objects of the JSON text and the classes the codec rebuilds;
- :mod:`._allowlist`: which class a name in the log stands for (never importing a module);
- :mod:`._encode`: values -> JSON-native structures, refusals naming the path at fault;
- :mod:`._decode`: JSON-native structures -> values, through :mod:`._upcast`'s upcasters
  for the older versions of a class's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final

import orjson

from ._allowlist import ClassAllowlist
from ._decode import Decoder
from ._encode import Encoder
from ._errors import DecodeError
from ._tags import MAX_DEPTH, ROOT, PicklePolicy, class_name, class_version, split_version
from ._upcast import upcaster

__all__ = [
    "MAX_DEPTH",
    "Codec",
    "class_name",
    "class_version",
    "default_codec",
    "split_version",
    "upcaster",
]


class Codec:
    """Encode values to JSON text and back to the same types, exactly and recursively.

    :param allow_pickle: store values of unsupported types as base64 pickles. Off by default,
        because unpickling a log runs whatever code the log names.
    :param how_to_register: how a user registers a class, for the error that names a class
        the codec cannot resolve (``{name}`` is replaced by its qualified name).
    :param how_to_allow_pickle: how a user opts in to pickle, for the errors that refuse a
        value only pickle could store or a pickle in the log.

    A name ``module:Qual`` resolves to the class registered (or encoded) under that name,
    else to the class ``Qual`` of ``module`` if that module is imported. ``__main__`` is a
    script's name for itself: ``python app.py`` records ``__main__:X`` where a program that
    imports ``app`` records ``app:X``. So ``__main__:X`` also resolves, in this order, to a
    registered ``X`` of a module given to :meth:`alias_main`, to ``X`` of this process's
    ``__main__``, to the only registered ``X`` of any module, to ``X`` of an aliased module;
    and where this process's ``__main__`` is the file of ``app``, ``app:X`` resolves to its
    registered (or imported) ``__main__:X`` first.
    """

    MAX_DEPTH: ClassVar[int] = MAX_DEPTH
    """How many containers deep a value may nest; see the module's :data:`MAX_DEPTH`."""

    def __init__(
        self,
        *,
        allow_pickle: bool = False,
        how_to_register: str = "Codec.register({name})",
        how_to_allow_pickle: str = "Codec(allow_pickle=True)",
    ) -> None:
        self._pickles = PicklePolicy(allowed=allow_pickle, how_to_allow=how_to_allow_pickle)
        self._allowlist = ClassAllowlist(how_to_register=how_to_register)
        self._encoder = Encoder(self._allowlist, self._pickles)
        self._decoder = Decoder(self._allowlist, self._pickles)
        self._load = self._decoder.load

    @property
    def allow_pickle(self) -> bool:
        """Whether values of unsupported types are stored, and read, as pickles."""
        return self._pickles.allowed

    @allow_pickle.setter
    def allow_pickle(self, allowed: bool) -> None:
        self._pickles.allowed = allowed

    @property
    def how_to_allow_pickle(self) -> str:
        """How a user opts in to pickle, as the errors that refuse a pickle say it."""
        return self._pickles.how_to_allow

    @how_to_allow_pickle.setter
    def how_to_allow_pickle(self, how: str) -> None:
        self._pickles.how_to_allow = how

    def register(self, *classes: type) -> None:
        """Allow ``classes`` to be rebuilt on decode, with the classes their fields name.

        Needed for classes whose module the decoding process may not have imported, and for
        classes defined in functions; imported module-level classes need no registration.

        :raises TypeError: a class is not a dataclass, attrs class, pydantic model or Enum.
        """
        self._allowlist.register(classes)

    def alias_main(self, *modules: str) -> None:
        """Reads names recorded under ``__main__`` as names of ``modules`` too.

        A script run as ``python app.py`` records its classes as ``__main__:X``; a program
        that imports ``app`` and calls ``alias_main("app")`` reads them back as ``app.X``
        (registered classes of ``app`` first, then the classes of the imported module).
        The other direction needs no call: a process whose ``__main__`` is the file of
        ``app`` reads ``app:X`` as its own ``__main__:X``.
        """
        self._allowlist.alias_main(modules)

    def resolve(self, name: str) -> type:
        """The class that ``name`` (``"module:Qual.Name"``, as the log writes it) stands for.

        Never imports a module; see the class's docstring for the order of the search.

        :raises UnknownClassError: no allowed class of that name is registered or imported;
            the message says how to register it.
        """
        return self._allowlist.resolve(name)

    def alias(self, name: str, cls: type) -> None:
        """Reads the class name ``name`` (``"old.module:OldName"``, as older logs recorded
        it) as ``cls``: for a class moved to another module or renamed since. A script's
        record of the old class (``"__main__:OldName"``) is read as ``cls`` too when nothing
        else of that name resolves.

        :raises TypeError: ``cls`` is not a dataclass, attrs class, pydantic model or Enum.
        :raises ValueError: ``name`` is not a class name (``module:QualName``).
        """
        self._allowlist.alias(name, cls)

    def register_proxy(self, cls: type, unwrap: Callable[[Any], Any]) -> None:
        """Encode instances of ``cls`` as the value ``unwrap(instance)`` returns.

        For stand-ins of plain values, such as read-only views of a list or dict: they are
        written, and so decoded, as the value they stand for.
        """
        self._encoder.register_proxy(cls, unwrap)

    def encode(self, value: object, *, depth: int = 1, name: str = ROOT) -> str:
        """Return ``value`` as compact JSON text that :meth:`decode` turns back into it.

        :param depth: the level at which ``value`` sits inside a larger value (1: it is the
            root), so that its containers count toward :data:`MAX_DEPTH` from there.
        :param name: how error paths name ``value``.
        :raises EncodeError: a part of ``value`` has an unsupported type, is a string JSON
            text cannot hold (a lone surrogate), or nests too deep (a cycle, too); the
            message names its path, e.g. ``value['a'][2]`` or ``value.field``.
        """
        return self._encoder.encode(value, depth, name)

    def decode(self, text: str | bytes) -> Any:
        """Return the value that :meth:`encode` wrote as ``text``, with its exact types.

        Never imports a module: classes resolve (:meth:`resolve`) only among registered
        classes and allowed classes (dataclass, attrs, pydantic model, Enum) of modules
        already imported.

        :raises DecodeError: ``text`` is not a value this codec wrote.
        :raises UnknownClassError: ``text`` names a class that is not allowed here.
        """
        try:
            data = orjson.loads(text)
            # Text without the tag (most of it) needs no walk; "$t" is never escaped by orjson.
            if isinstance(text, str):
                untagged = '"$t"' not in text
            else:
                untagged = isinstance(text, bytes | bytearray) and b'"$t"' not in text
        except (orjson.JSONDecodeError, TypeError) as exc:
            msg = f"not JSON text: {exc}"
            raise DecodeError(msg) from exc
        return data if untagged else self._load(data)

    def dump(self, value: object, *, depth: int = 1, name: str = ROOT) -> Any:
        """Return the JSON-native structure that :meth:`encode` serializes.

        Containers that need no tag are returned as they are, not copied: don't mutate them.
        Strings are not checked here (orjson checks them as it writes): use :meth:`encode`
        for a value that must be known to be writable.

        :param depth: as for :meth:`encode`.
        :param name: how error paths name ``value``.
        :raises EncodeError: an unsupported type, or nesting past :data:`MAX_DEPTH`.
        """
        return self._encoder.dump(value, depth, name)

    def load(self, data: Any) -> Any:
        """Return the value whose :meth:`dump` is ``data``; untagged parts are not copied."""
        return self._load(data)


default_codec: Final[Codec] = Codec()
"""The shared codec; classes encoded through it are registered on it."""
