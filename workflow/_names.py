"""Whether a workflow name a run's log records is a given workflow class's."""

from __future__ import annotations

from eventstore import class_name
from eventstore._allowlist import main_names

__all__ = ["same_name"]


def same_name(recorded: str, cls: type) -> bool:
    """Whether a workflow name the log records (``module:Qual.Name``) can be ``cls``'s: its
    own, the same qualified name under ``__main__`` (a script's run), or, for a class of this
    process's ``__main__``, a module name its file imports as."""
    if recorded == class_name(cls):
        return True
    module, _, qualname = recorded.rpartition(":")
    if qualname != cls.__qualname__:
        return False
    return module == "__main__" or (cls.__module__ == "__main__" and module in main_names())
