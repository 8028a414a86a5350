"""The untyped state as ``get_state`` and ``edit_state`` give it (LlamaIndex's ``DictState``)."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["StateDict"]


class StateDict(dict[str, Any]):
    """The untyped state ``get_state`` / ``edit_state`` give: a dict whose keys are also
    attributes (``state.count += 1``), as LlamaIndex's ``DictState``; ``_data`` is itself."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            msg = f"'DictState' object has no attribute {name!r}"
            raise AttributeError(msg, name=name, obj=self) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _data(self) -> dict[str, Any]:
        return self

    def to_dict(self) -> dict[str, Any]:
        """The state as a plain dict (a copy), as LlamaIndex's ``DictState.to_dict``."""
        return copy.deepcopy(dict(self))

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """The state as LlamaIndex's ``DictState`` model dumps it: ``{"_data": {...}}``."""
        return {"_data": self.to_dict()}
