"""Values as short text: codec dumps read raw (no user code imported), or typed values.

A raw dump names its classes as the log does (``pkg.mod:Class``), so what is shown without
the user's code still says which class a value is and what its fields hold. Rendering has a
budget: a 100 MB context value costs as much to show as a short one.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import reprlib
import shutil
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from tabulate import tabulate

__all__ = [
    "Show",
    "bare_class",
    "clip",
    "fmt_time",
    "short_class",
    "show_dump",
    "show_typed",
    "table",
    "terminal_width",
]

# Renders a value (a dump, or a typed value) as text of at most ``limit`` characters.
Show = Callable[[Any, int], str]

TAG: Final = "$t"
ELLIPSIS: Final = "…"
# The engine's own event classes read better by their public names.
_OWN_MODULE: Final = "workflow._events:"


class _Full(Exception):
    """The budget ran out: the walk stops at once instead of rendering the rest."""


class _Out:
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.left = limit

    def put(self, text: str) -> None:
        self.parts.append(text)
        self.left -= len(text)
        if self.left < 0:
            raise _Full


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when something was cut."""
    if limit <= 0 or len(text) <= limit:
        return text
    return text[: max(0, limit - 1)] + ELLIPSIS


def bare_class(name: str | None) -> str:
    """A class name without its module (``EventA``), for narrow columns."""
    if not name:
        return ""
    return name.rsplit(":", 1)[-1]


def short_class(name: str) -> str:
    """A class name as the log writes it, with the engine's own module left out."""
    return name[len(_OWN_MODULE) :] if name.startswith(_OWN_MODULE) else name


def show_dump(value: Any, limit: int = 120) -> str:
    """A codec dump as Python-like text (``pkg:Cls(field='x')``), without decoding it."""
    out = _Out(limit)
    try:
        _walk(value, out)
    except _Full:
        return clip("".join(out.parts), limit)
    except RecursionError:
        return clip("".join(out.parts), limit - 1) + ELLIPSIS
    return "".join(out.parts)


class _InOrder(reprlib.Repr):
    """reprlib's bounds, with a dict's keys in their order (reprlib sorts them, so a result
    read back would not look like the value the step returned)."""

    def repr_dict(self, x: dict[Any, Any], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{" + self.fillvalue + "}"
        pieces = [
            f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
            for k, v in itertools.islice(x.items(), self.maxdict)
        ]
        if len(x) > self.maxdict:
            pieces.append(self.fillvalue)
        return "{" + ", ".join(pieces) + "}"


_repr = _InOrder()
_repr.maxstring = 200
_repr.maxother = 200
_repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = _repr.maxdict = 20
_repr.maxlevel = 4


def show_typed(value: Any, limit: int = 120) -> str:
    """A decoded value's repr, bounded in effort (reprlib) and then in length."""
    try:
        text = _repr.repr(value)
    except Exception as exc:  # a user's __repr__ may raise anything
        text = f"<{type(value).__name__}: repr failed: {exc}>"
    return clip(text, limit)


def _str(text: str, out: _Out) -> None:
    # Only the part that can be shown is repr'd, so a huge string costs its budget.
    cut = text[: max(0, out.left) + 2]
    out.put(repr(cut)[:-1] + ("" if len(cut) == len(text) else ELLIPSIS) + repr(cut)[-1])


def _items(values: Iterable[Any], out: _Out, open_: str, close: str) -> None:
    out.put(open_)
    for i, value in enumerate(values):
        if i:
            out.put(", ")
        _walk(value, out)
    out.put(close)


def _walk(value: Any, out: _Out) -> None:
    t = type(value)
    if t is str:
        _str(value, out)
    elif value is None or t is bool or t is int or t is float:
        out.put(repr(value))
    elif t is list:
        _items(value, out, "[", "]")
    elif t is dict:
        if TAG in value:
            _tagged(value, out)
            return
        out.put("{")
        for i, (key, item) in enumerate(value.items()):
            out.put(", " if i else "")
            _str(str(key), out)
            out.put(": ")
            _walk(item, out)
        out.put("}")
    else:
        out.put(repr(value))


def _fields(fields: Any, out: _Out) -> None:
    if isinstance(fields, dict) and TAG not in fields:
        for i, (key, item) in enumerate(fields.items()):
            out.put(f"{', ' if i else ''}{key}=")
            _walk(item, out)
    else:
        _walk(fields, out)


def _tagged(tagged: dict[str, Any], out: _Out) -> None:
    tag, inner = tagged.get(TAG), tagged.get("v")
    if tag in ("model", "dataclass", "attrs"):
        out.put(f"{short_class(str(tagged.get('c', '?')))}(")
        _fields(inner, out)
        out.put(")")
    elif tag == "enum":
        out.put(f"{tagged.get('c', '?')}(")
        _walk(inner, out)
        out.put(")")
    elif tag in ("int", "float"):
        out.put(str(inner))
    elif tag == "tuple":
        items = inner if isinstance(inner, list) else []
        _items(items, out, "(", ",)" if len(items) == 1 else ")")
    elif tag in ("set", "frozenset"):
        items = inner if isinstance(inner, list) else []
        if not items:
            out.put(f"{tag}()")
            return
        _items(items, out, "{" if tag == "set" else "frozenset({", "}" if tag == "set" else "})")
    elif tag == "dict":
        out.put("{")
        for i, pair in enumerate(inner if isinstance(inner, list) else []):
            out.put(", " if i else "")
            if isinstance(pair, list) and len(pair) == 2:
                _walk(pair[0], out)
                out.put(": ")
                _walk(pair[1], out)
        out.put("}")
    elif tag in ("bytes", "bytearray"):
        text = str(inner)
        head = text[: (max(0, out.left) * 2 // 4 + 1) * 4]  # whole base64 quanta only
        try:
            raw = base64.b64decode(head)
        except ValueError:
            raw = b"?"
        shown = repr(raw if len(head) >= len(text) else raw + b"...")
        out.put(shown if tag == "bytes" else f"bytearray({shown})")
    elif tag in ("datetime", "date", "time"):
        zone = f", tz={tagged['z']!r}" if "z" in tagged else ""
        out.put(f"{tag}({inner!r}{zone})")
    elif tag == "timedelta" and isinstance(inner, list) and len(inner) == 3:
        days, secs, us = inner
        out.put(f"timedelta(days={days}, seconds={secs}, microseconds={us})")
    elif tag == "decimal":
        out.put(f"Decimal({inner!r})")
    elif tag == "uuid":
        out.put(f"UUID({inner!r})")
    elif tag == "path":
        out.put(f"{tagged.get('k', 'Path')}({inner!r})")
    elif tag == "pickle":
        out.put(f"<pickled, {len(str(inner)) * 3 // 4} bytes>")
    else:
        out.put(f"<{tag}: ")
        _walk(inner, out)
        out.put(">")


def fmt_time(us: int) -> str:
    """Microseconds since the epoch as UTC text to the second."""
    return dt.datetime.fromtimestamp(us / 1e6, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def terminal_width() -> int:
    """The terminal's width (120 when output is not a terminal)."""
    return shutil.get_terminal_size((120, 24)).columns


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain text table with a rule under its headers."""
    text: str = tabulate(rows, headers=list(headers), tablefmt="simple", disable_numparse=True)
    return text
