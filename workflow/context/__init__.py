"""LlamaIndex's ``workflows.context``: the ``Context`` and its serializers.

``Context(wf)`` names a run once it is passed to ``wf.run(ctx=ctx)``; ``ctx.to_dict()`` and
``Context.from_dict(wf, data)`` carry it to another process (see the README's "Coming from
LlamaIndex").
"""

from .._context import Context, ContextStore
from .serializers import BaseSerializer, JsonPickleSerializer, JsonSerializer, PickleSerializer

__all__ = [
    "BaseSerializer",
    "Context",
    "ContextStore",
    "JsonPickleSerializer",
    "JsonSerializer",
    "PickleSerializer",
]
