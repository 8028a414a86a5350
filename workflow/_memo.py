"""Memoized calls: an outside call a step makes is paid once per input, not once per attempt.

``await ctx.memo(key, fn, *args, **kwargs)`` (or a function decorated with
:func:`memoized`) calls ``fn`` and commits a ``memoized`` record of its result on its own,
before returning it: the record is durable before the step goes on and is kept whatever the
attempt's outcome. A later attempt at the same input (after a crash, a conflict, a wait, a
resume of a failed run; after a retry policy's re-run only with ``reuse_on_retry=True``)
whose call has the same key and the same arguments gets the recorded result without calling
``fn``. Arguments are compared by a digest of their encoding, so a call whose arguments
changed (a prompt built from newer state) is made again and recorded anew.

What is reused is what the log holds: results go through the typed codec (a result it
cannot store is refused at the call), and a recorded exception comes back as
:class:`MemoizedError` (the codec never builds arbitrary exception classes).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, overload

import orjson

from eventstore import Codec, EncodeError

from . import _journal as J
from ._attempt import Attempt, current_attempt
from ._changes import refused
from ._errors import MemoizedError, WorkflowRuntimeError
from .retry_policy import RetryPolicy, _ask, _derive

if TYPE_CHECKING:
    from ._fold import Folded, MemoRec

__all__ = ["MemoHost", "call_memoized", "memoized"]

P = ParamSpec("P")
R = TypeVar("R")


class MemoHost(Protocol):
    """What a memoized call needs of the run it runs in (the executor, or verify's replay)."""

    codec: Codec
    run_id: str
    # True when a step is re-executed against its log (``workflow verify``): a call with no
    # matching record is a divergence, never a new paid call.
    replaying: bool

    def memos_of(self, step: str, event_id: int) -> Mapping[str, MemoRec]:
        """The recorded memoized calls of ``step``'s input ``event_id``, by key."""
        ...

    def folded_state(self) -> Folded:
        """The run's folded state (``ctx.patched`` reads its starts; never when replaying)."""
        ...

    async def append(self, records: list[Any], **kw: Any) -> int: ...


def _name_of(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None)
    return name if isinstance(name, str) else type(fn).__qualname__


def _digest(codec: Codec, key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short digest of the call's arguments as the codec encodes them (types included)."""
    try:
        text = codec.encode([list(args), kwargs], name="arguments")
    except EncodeError as exc:
        how = (
            f"refused by the memoized call {key!r}: its arguments are compared across re-runs,"
            " so they must be values the log can hold (pass others through a closure)"
        )
        raise refused(exc, how) from None
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _key(att: Attempt, key: str | None, name: str) -> str:
    """The call's key within the attempt: ``key`` (default: the function's name), with
    ``#n`` for its n-th use in the attempt, so repeated calls keep their call order."""
    base = name if key is None else key
    if not isinstance(base, str) or not base:
        msg = f"a memoized call's key must be a non-empty str, not {base!r}"
        raise WorkflowRuntimeError(msg)
    counts = att.memo_keys
    if counts is None:
        counts = att.memo_keys = {}
    n = counts[base] = counts.get(base, 0) + 1
    return base if n == 1 else f"{base}#{n}"


def _reusable(rec: MemoRec, digest: str, *, cache_errors: bool, reuse_on_retry: bool) -> bool:
    """Whether a recorded call answers this one: same arguments, and allowed to be reused."""
    return (
        rec.digest == digest
        and (reuse_on_retry or not rec.retried)
        and (rec.error is None or cache_errors)
    )


async def call_memoized(
    att: Attempt | None,
    key: str | None,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    cache_errors: bool = False,
    reuse_on_retry: bool = False,
    retry_policy: RetryPolicy | None = None,
) -> Any:
    """Calls ``fn(*args, **kwargs)`` once per input, key and arguments (module docstring).

    :raises WorkflowRuntimeError: called outside a step, or with a key that is not a str.
    :raises EncodeError: the arguments or the result cannot be stored (the result is refused
        after ``fn`` ran: nothing is recorded, and a re-run calls it again).
    :raises MemoizedError: ``fn`` raised, with ``cache_errors=True`` (now or in the attempt
        that recorded it).
    """
    if att is None or att.host is None:
        msg = "memoized calls work inside a step; outside one, call the function itself"
        raise WorkflowRuntimeError(msg)
    if not callable(fn):
        msg = f"a memoized call needs a callable, not {type(fn).__name__}"
        raise WorkflowRuntimeError(msg)
    host: MemoHost = att.host
    fn = getattr(fn, "__memoized__", fn)  # ctx.memo of a @memoized function: one record
    codec = host.codec
    name = _name_of(fn)
    k = _key(att, key, name)
    digest = _digest(codec, k, args, kwargs)
    rec = host.memos_of(att.step, att.event_id).get(k)
    if rec is not None and _reusable(
        rec, digest, cache_errors=cache_errors, reuse_on_retry=reuse_on_retry
    ):
        if rec.error is not None:
            raise MemoizedError(rec.error["type"], rec.error["message"])
        # Decoded from its own text: the caller may mutate what it gets.
        return codec.decode(orjson.dumps(rec.result))
    if host.replaying:
        what = "no record" if rec is None else "a record of other arguments"
        msg = f"the memoized call {k!r} of step {att.step!r} has {what} in the log"
        raise WorkflowRuntimeError(msg)
    started = time.monotonic()
    error: Exception | None = None
    result: Any = None
    failures = 0
    while True:
        try:
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            break
        except Exception as exc:
            failures += 1
            delay = None
            if retry_policy is not None:
                seed = _derive("memo", host.run_id, att.step, att.event_id, k, failures)
                delay = _ask(retry_policy, time.monotonic() - started, failures, exc, seed)
            if delay is None:
                error = exc
                break
            await asyncio.sleep(delay)
    elapsed = time.monotonic() - started
    if error is not None and not cache_errors:
        raise error
    text = None
    if error is None:
        try:
            text = codec.encode(result, name=f"{name}()")
        except EncodeError as exc:
            how = f"refused by the memoized call {k!r}: its result is recorded for re-runs"
            raise refused(exc, how) from None
    record = J.memoized(
        att.step,
        att.event_id,
        att.attempt,
        k,
        name,
        digest,
        None if text is None else orjson.Fragment(text),
        error,
        elapsed,
        0 if text is None else len(text.encode()),
    )
    await host.append([record])
    if error is not None:
        raise MemoizedError(type(error).__qualname__, str(error)) from error
    return result


@overload
def memoized(fn: Callable[P, Awaitable[R]], /) -> Callable[P, Awaitable[R]]: ...


@overload
def memoized(
    *,
    key: str | None = None,
    cache_errors: bool = False,
    reuse_on_retry: bool = False,
    retry_policy: RetryPolicy | None = None,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]: ...


def memoized(
    fn: Callable[P, Awaitable[R]] | None = None,
    /,
    *,
    key: str | None = None,
    cache_errors: bool = False,
    reuse_on_retry: bool = False,
    retry_policy: RetryPolicy | None = None,
) -> Any:
    """Makes a coroutine function a memoized call whenever a step calls it.

    ``@memoized`` or ``@memoized(key=..., cache_errors=..., reuse_on_retry=...,
    retry_policy=...)``: each call inside a step is ``ctx.memo(key, fn, *args, **kwargs)``
    with the key defaulting to the function's qualified name (``#2``, ``#3`` for the calls
    after the first in one attempt). Outside a step it raises ``WorkflowRuntimeError``:
    nothing could be recorded there.
    """

    def wrap(f: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        if not inspect.iscoroutinefunction(f):
            msg = f"@memoized takes a coroutine function (async def), not {f!r}"
            raise TypeError(msg)

        @functools.wraps(f)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            result: R = await call_memoized(
                current_attempt.get(),
                key,
                f,
                args,
                dict(kwargs),
                cache_errors=cache_errors,
                reuse_on_retry=reuse_on_retry,
                retry_policy=retry_policy,
            )
            return result

        call.__memoized__ = f  # type: ignore[attr-defined]
        return call

    return wrap if fn is None else wrap(fn)
