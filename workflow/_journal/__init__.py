"""The journal: the engine's changes as records. One payload type and one builder a kind.

Payloads are small JSON objects; events and values go through the codec's ``dump``, so an
event reads as ``{"$t": "model", "c": "module:Class", "v": {...fields}}``. Each kind's
payload is a ``TypedDict`` of ``_payloads`` (``PAYLOADS`` maps kind -> type): the builders
of ``_builders`` write it, and the fold, the read side, ``verify`` and the command line read
it through the same type. TypedDicts cost nothing at run time, so the fold, a hot path,
still works on the dicts ``orjson`` returns. Both modules are reached as ``_journal.X``.

The log is a promise: a field added after a kind was first written is ``NotRequired`` (the
records written before lack it), and every reader reads every shape ever written. A new
record kind is a constant, a payload type and its entry in ``PAYLOADS``, and a builder, here;
a function in the fold (``workflow/_fold.py``); and a case in the timeline page's fold
(``workflow/cli/_page.py``, with its arguments in ``_timeline.py``): see docs/log-format.md.
"""

from __future__ import annotations

from ._builders import *  # noqa: F403
from ._builders import __all__ as _builders
from ._payloads import *  # noqa: F403
from ._payloads import __all__ as _payloads

__all__ = [*_payloads, *_builders]
