"""Retry conditions: whether a failed attempt's exception may be retried.

Conditions combine with ``|`` (either) and ``&`` (both); the names and parameters are
LlamaIndex Workflows' (tenacity's). Users import them from :mod:`workflow.retry_policy`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable

from ._retry_protocols import ExcTypes, RetryCondition, exception_types_of, flatten, show_call

__all__ = [
    "retry_all",
    "retry_always",
    "retry_any",
    "retry_if_exception",
    "retry_if_exception_cause_type",
    "retry_if_exception_message",
    "retry_if_exception_type",
    "retry_if_not_exception_message",
    "retry_if_not_exception_type",
    "retry_never",
    "retry_unless_exception_type",
]


class _Condition(ABC):
    """A retry condition that combines with ``|`` and ``&``."""

    @abstractmethod
    def __call__(self, error: BaseException, /) -> bool: ...

    def __or__(self, other: RetryCondition) -> retry_any:
        if not callable(other):
            return NotImplemented
        return retry_any(*flatten(retry_any, (self, other)))

    def __ror__(self, other: RetryCondition) -> retry_any:
        if not callable(other):
            return NotImplemented
        return retry_any(*flatten(retry_any, (other, self)))

    def __and__(self, other: RetryCondition) -> retry_all:
        if not callable(other):
            return NotImplemented
        return retry_all(*flatten(retry_all, (self, other)))

    def __rand__(self, other: RetryCondition) -> retry_all:
        if not callable(other):
            return NotImplemented
        return retry_all(*flatten(retry_all, (other, self)))


class retry_if_exception(_Condition):
    """Retries when ``predicate(error)`` is true."""

    def __init__(self, predicate: Callable[[BaseException], bool]) -> None:
        if not callable(predicate):
            msg = f"retry_if_exception takes a function of the exception, not {predicate!r}"
            raise TypeError(msg)
        self.predicate = predicate

    def __call__(self, error: BaseException, /) -> bool:
        return bool(self.predicate(error))

    def __repr__(self) -> str:
        return show_call(type(self).__name__, self.predicate)


class retry_if_exception_type(_Condition):
    """Retries when the exception is an instance of ``exception_types`` (subclasses count)."""

    def __init__(self, exception_types: ExcTypes = Exception) -> None:
        self.exception_types = exception_types_of(exception_types, type(self).__name__)

    def __call__(self, error: BaseException, /) -> bool:
        return isinstance(error, self.exception_types)

    def __repr__(self) -> str:
        return show_call(type(self).__name__, self.exception_types)


class retry_if_not_exception_type(retry_if_exception_type):
    """Retries unless the exception is an instance of ``exception_types``."""

    def __call__(self, error: BaseException, /) -> bool:
        return not isinstance(error, self.exception_types)


class retry_unless_exception_type(retry_if_not_exception_type):
    """Retries unless the exception is an instance of ``exception_types`` (tenacity's name)."""


class retry_if_exception_message(_Condition):
    """Retries when ``str(error)`` equals ``message``, or when the regex ``match`` is found in it.

    Give exactly one of the two. ``match`` is searched anywhere in the message (a ``str`` is
    compiled; a compiled pattern is used as it is).
    """

    def __init__(
        self, message: str | None = None, match: str | re.Pattern[str] | None = None
    ) -> None:
        name = type(self).__name__
        if message is None and match is None:
            msg = f"{name}() missing 1 required argument 'message' or 'match'"
            raise TypeError(msg)
        if message is not None and match is not None:
            msg = f"{name}() takes either 'message' or 'match', not both"
            raise TypeError(msg)
        self.message = message
        self.match = match
        self._pattern = re.compile(match) if isinstance(match, str) else match

    def _matches(self, error: BaseException) -> bool:
        text = str(error)
        if self._pattern is None:
            return text == self.message
        return self._pattern.search(text) is not None

    def __call__(self, error: BaseException, /) -> bool:
        return self._matches(error)

    def __repr__(self) -> str:
        if self.match is None:
            return show_call(type(self).__name__, message=self.message)
        return show_call(type(self).__name__, match=self.match)


class retry_if_not_exception_message(retry_if_exception_message):
    """Retries unless the message equals ``message`` (or contains a match of ``match``)."""

    def __call__(self, error: BaseException, /) -> bool:
        return not self._matches(error)


class retry_if_exception_cause_type(_Condition):
    """Retries when an exception in the ``raise ... from`` chain is of ``exception_types``.

    The chain is ``error.__cause__``, its ``__cause__``, and so on; the error itself and the
    implicit ``__context__`` do not count (as in tenacity). A cyclic chain ends the walk.
    """

    def __init__(self, exception_types: ExcTypes = Exception) -> None:
        self.exception_types = exception_types_of(exception_types, type(self).__name__)

    def __call__(self, error: BaseException, /) -> bool:
        seen = {id(error)}
        cause = error.__cause__
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, self.exception_types):
                return True
            seen.add(id(cause))
            cause = cause.__cause__
        return False

    def __repr__(self) -> str:
        return show_call(type(self).__name__, self.exception_types)


class retry_any(_Condition):
    """Retries when any of the conditions does (what ``a | b`` builds); none: never."""

    def __init__(self, *retries: RetryCondition) -> None:
        self.parts = retries

    @property
    def retries(self) -> tuple[RetryCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(self, error: BaseException, /) -> bool:
        return any(r(error) for r in self.parts)

    def __repr__(self) -> str:
        return show_call(type(self).__name__, *self.parts)


class retry_all(_Condition):
    """Retries when every condition does (what ``a & b`` builds); none: always."""

    def __init__(self, *retries: RetryCondition) -> None:
        self.parts = retries

    @property
    def retries(self) -> tuple[RetryCondition, ...]:
        """The conditions, in the order they are asked."""
        return self.parts

    def __call__(self, error: BaseException, /) -> bool:
        return all(r(error) for r in self.parts)

    def __repr__(self) -> str:
        return show_call(type(self).__name__, *self.parts)


class retry_always(_Condition):
    """Retries every exception."""

    def __call__(self, error: BaseException, /) -> bool:
        return True

    def __repr__(self) -> str:
        return "retry_always()"


class retry_never(_Condition):
    """Retries no exception."""

    def __call__(self, error: BaseException, /) -> bool:
        return False

    def __repr__(self) -> str:
        return "retry_never()"
