"""Serializers of context values, under LlamaIndex's names (``workflows.context.serializers``).

A context dict (``ctx.to_dict()``) holds the run's values in the codec's typed JSON, which
restores every value as its exact type. :class:`JsonSerializer` (the default) is that codec;
:class:`PickleSerializer` is the same codec with pickle allowed as its fallback, the explicit
opt-in for values JSON cannot hold. Any other :class:`BaseSerializer` subclass turns each
value into the text its ``serialize`` returns, and back with its ``deserialize``; the values
it gives back must still be what the log can hold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from eventstore import Codec

__all__ = ["BaseSerializer", "JsonPickleSerializer", "JsonSerializer", "PickleSerializer"]


class BaseSerializer(ABC):
    """What a serializer of context values does: a value to text, and text back to a value."""

    @abstractmethod
    def serialize(self, value: Any) -> str:
        """The value as text."""

    @abstractmethod
    def deserialize(self, value: str) -> Any:
        """The value back from :meth:`serialize`'s text."""


class JsonSerializer(BaseSerializer):
    """The codec's typed JSON: values come back as their exact types, and nothing else is
    built (a class is resolved only among those registered or already imported).

    :param codec: the codec to use; by default one of its own. Inside ``to_dict`` /
        ``from_dict`` the workflow's codec is used, which knows the workflow's classes.
    """

    #: How a context dict names the values this serializer wrote.
    kind = "json"

    def __init__(self, codec: Codec | None = None) -> None:
        self.codec = codec if codec is not None else self._new_codec()

    def _new_codec(self) -> Codec:
        return Codec()

    def serialize(self, value: Any) -> str:
        """The value as the codec's JSON text.

        :raises EncodeError: the value holds something the codec cannot store.
        """
        return self.codec.encode(value)

    def deserialize(self, value: str) -> Any:
        """The value back from its JSON text, as its exact type."""
        return self.codec.decode(value)


class PickleSerializer(JsonSerializer):
    """Typed JSON, with pickle for what JSON cannot hold: the explicit opt-in to pickle.

    Unpickling runs whatever code the text names: restore only dicts you wrote.
    """

    kind = "pickle"

    def _new_codec(self) -> Codec:
        return Codec(allow_pickle=True)


# LlamaIndex's older name for PickleSerializer.
JsonPickleSerializer = PickleSerializer
