"""``ctx.store``: the run's context data, read and written through the running attempt.

Reads inside an attempt pin the versions they saw (a conflict re-runs the attempt); writes
are encoded at ``set()`` and buffered on the attempt until it commits. Outside an attempt
(``handler.ctx.store``, an idle context) reads see committed state and writes are operator
updates. The store reaches its run only through :class:`StoreHost`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, Protocol, cast

from pydantic import BaseModel
from typing_extensions import TypeVar

from eventstore import EncodeError

from ._attempt import MISSING, Attempt, Write, attempt_of
from ._changes import BY_SET, check_key, encode_tracked, encode_value, refused, value_change
from ._detached import (
    Detached,
    copy_for_edit,
    detached_codec,
    initial_values,
    state_dict,
    state_from_dict,
)
from ._diff import UNSURE, Tracker, changes_since, is_view, materialize, renew, spare
from ._errors import ContextKeyError
from ._state_dict import StateDict
from ._state_paths import put_at, put_on_copied_spine
from ._state_paths import split as _split
from ._state_paths import step_into as _step_into

if TYPE_CHECKING:
    from eventstore import Codec

    from .context.serializers import BaseSerializer

__all__ = ["ContextStore", "StateDict", "StoreHost"]

S = TypeVar("S", default=Any)

# Values a read outside an attempt hands out as they are (nothing can change them).
_IMMUTABLE: frozenset[type] = frozenset({str, int, float, bool, type(None), bytes})


class StoreHost(Protocol):
    """What the store reads and writes through: the executor running its run (or a stand-in
    for one: an idle context's ``Idle``, ``verify``'s replay).

    Outside an attempt only ``codec``, ``committed``, ``versions`` (by ``edit_state``) and
    ``operator_update`` are used.
    """

    @property
    def codec(self) -> Codec: ...

    @property
    def committed(self) -> dict[str, Any]: ...

    @property
    def versions(self) -> dict[str, int]: ...

    @property
    def keylog(self) -> dict[str, list[int]]: ...

    @property
    def state_lock(self) -> asyncio.Lock: ...

    def pin(self, key: str) -> None: ...

    async def operator_update(
        self,
        updates: Mapping[str, Any],
        deletes: list[str] | None = None,
        *,
        read: Mapping[str, int] | None = None,
    ) -> int: ...


class ContextStore(Generic[S]):
    """The run's context data: ``get``/``set`` with dotted paths, ``edit_state``.

    ``get`` returns a copy-on-write view: mutating it changes nothing until ``set``, and
    nothing at all if the attempt fails. A key read by an attempt that another attempt
    changed before it could commit makes it run again (a conflict), so a
    read-modify-write is never lost and never applied twice. A conflicted attempt runs
    again from the start, external calls included.
    """

    def __init__(
        self, host: StoreHost | BaseModel | Mapping[str, Any], state_type: type[S] | None = None
    ) -> None:
        if isinstance(host, BaseModel | Mapping):
            # InMemoryStateStore(MyState()), as LlamaIndex builds one: a store of its own.
            state = host
            if state_type is None and isinstance(state, BaseModel):
                state_type = cast("type[S]", type(state))
            host = Detached(detached_codec(state_type, StateDict), initial_values(state))
        self._host = host
        self._state_type = state_type
        # Per key, the tracker of a large list an attempt read last: the next attempt's view
        # is made from it when nothing holds it any more (:func:`workflow._diff.renew`).
        self._spares: dict[str, Tracker] = {}
        # The tasks inside an edit_state() block of this store: their writers are refused.
        # By id; inside a step, the attempt's (the tasks it starts write as the attempt too).
        self._editors: set[int] = set()

    def _not_editing(self, what: str) -> None:
        """Refuses a writer inside the caller's own ``edit_state()`` block, as LlamaIndex
        does (the block's end writes back the state it yielded, over what it wrote)."""
        editors = self._editors
        if editors and (
            id(asyncio.current_task()) in editors or id(attempt_of(self._host)) in editors
        ):
            msg = (
                "writer called inside edit_state: mutate the yielded state instead"
                f" (ctx.store.{what} in an edit_state() block)"
            )
            raise RuntimeError(msg)

    def bind(self, host: StoreHost) -> None:
        """Reads and writes go through ``host`` from now on (the context was bound or went idle)."""
        self._host = host

    @property
    def host(self) -> StoreHost:
        """What reads and writes go through now."""
        return self._host

    # -------------------------------------------------------------- reading

    def _root(self, att: Attempt | None, key: str) -> Any:
        host = self._host
        if att is None:
            # A copy: what the caller does with it never reaches the committed value (a
            # store of its own hands out its values, as LlamaIndex's in-memory store does).
            value = host.committed.get(key, MISSING)
            if value is MISSING or type(value) in _IMMUTABLE or isinstance(host, Detached):
                return value
            return copy.deepcopy(value)
        w = att.writes.get(key)
        if w is not None:
            if w.deleted:
                return MISSING
            if w.tracker is not None:
                return w.tracker.view
            return w.value
        tracker = att.trackers.get(key)
        if tracker is not None:
            return tracker.view
        if key not in att.reads:
            att.reads[key] = host.versions.get(key, 0)
            host.pin(key)
        value = host.committed.get(key, MISSING)
        if value is MISSING:
            return MISSING
        spares = self._spares
        version = host.versions.get(key, 0)
        tracker = None
        if key in spares:
            tracker = renew(spares, key, value, changes_since(spares[key], version))
        if tracker is None:
            tracker = Tracker(value)
        tracker.version = version
        if spare(tracker):
            spares[key] = tracker
        att.trackers[key] = tracker
        return tracker.view

    def _field_default(self, key: str) -> Any:
        """A fresh copy of the typed state model's default for field ``key``, or ``MISSING``
        (no typed state, not a field, or a required field).

        A field never written reads as its default, as ``get_state`` shows it and as
        LlamaIndex's ``get`` returns it; the default is made here and is not logged."""
        if self._state_type is None:
            return MISSING
        info = getattr(self._state_type, "model_fields", {}).get(key)
        if info is None or info.is_required():
            return MISSING
        return info.get_default(call_default_factory=True)

    async def get(self, path: str, default: Any = MISSING) -> Any:
        """The value at ``path`` (``"key"`` or dotted ``"key.field.0"``), or ``default``.

        With a typed state, a field that holds no value reads as the model's default for
        it (a read of that key all the same: a later write of it conflicts); ``default``
        applies to what is neither a value nor a field with a default.

        :raises ContextKeyError: the path does not exist and no default was given (a
            ``KeyError`` and a ``ValueError``, as LlamaIndex raises).
        """
        root_key, rest = _split(path)
        value = self._root(attempt_of(self._host), root_key)
        if value is MISSING:
            value = self._field_default(root_key)
        try:
            if value is MISSING:
                raise KeyError(root_key)
            for part in rest:
                value = _step_into(value, part)
        except (KeyError, AttributeError, IndexError, ValueError):
            if default is MISSING:
                msg = f"Path {path!r} not found in state: the context has no value at {path!r}"
                raise ContextKeyError(msg) from None
            return default
        return value

    # -------------------------------------------------------------- writing

    async def set(self, path: str, value: Any) -> None:
        """Sets the value at ``path``; committed with the attempt (outside one: at once).

        The value is encoded here, as the commit will write it (a tracked value: only
        what changed), so what the log cannot hold is refused here, and what is written
        is the value as it is now.

        :raises EncodeError: the value holds something the log cannot hold (a type the
            codec does not store, a string with a lone surrogate, nesting deeper than
            ``Codec.MAX_DEPTH``, a cycle); the message names the key, the path
            inside the value and the type.
        :raises ValueError: a typed state has no field ``path`` starts with (as in
            LlamaIndex).
        """
        if self._editors:
            self._not_editing("set()")
        root_key, rest = _split(path)
        if self._state_type is not None and root_key not in self._fields():
            msg = f'"{self._state_type.__name__}" object has no field "{root_key}"'
            raise ValueError(msg)
        await self._write(path, root_key, rest, value)

    async def _write(self, path: str, root_key: str, rest: list[str], value: Any) -> None:
        att = attempt_of(self._host)
        if att is None:
            if rest:
                await self._set_path_outside(root_key, rest, value)
            else:
                await self._host.operator_update({path: value})
            return
        host = self._host
        codec = host.codec
        if not root_key.isascii():
            check_key(codec, root_key, BY_SET, path)
        if rest:
            # Checked where it will sit before anything changes, so a refusal leaves no trace
            # (a view's change is checked as the root's patch is encoded).
            if not is_view(value):
                try:
                    codec.encode(value, depth=len(rest) + 1, name=path)
                except EncodeError as exc:
                    raise refused(exc, BY_SET.format(path)) from None
            root = self._root(att, root_key)
            if root is MISSING:  # a typed field starts from its default, as in LlamaIndex
                root = self._field_default(root_key)
            if root is MISSING:  # missing parents are created as dicts, as in LlamaIndex
                root = {}
            put_at(root, rest, value)
            value = root
        tracker = att.trackers.get(root_key)
        if tracker is not None:
            tracker.written = UNSURE  # until this write is made: it may fail half-way
        if tracker is not None and tracker.is_view(value):
            change = encode_tracked(codec, root_key, tracker, BY_SET, path)
            att.writes[root_key] = Write(tracker=tracker, change=change)
            tracker.written = (change, True)
            return
        # A value derived from the view (items + [x], {**d, k: v}) is diffed against it by
        # identity and costs the change; any other value is encoded whole once.
        text = None if tracker is not None else encode_value(codec, root_key, value, BY_SET, path)
        log = host.keylog.get(root_key)
        change, version = value_change(
            codec,
            host.committed,
            host.versions,
            root_key,
            value,
            text,
            hint=tracker,
            size=None if log is None else log[0] + log[1],
            how=BY_SET.format(path),
        )
        att.writes[root_key] = Write(value=value, change=change, text=text, version=version)
        if tracker is not None:
            tracker.written = (change, False)

    async def _set_path_outside(self, root_key: str, rest: list[str], value: Any) -> None:
        """A dotted ``set`` outside an attempt: an operator update of ``root_key``, a copy of
        its committed value with the change made, checked against the version it read (a
        step's commit in between is never undone)."""
        host = self._host
        version = host.versions.get(root_key, 0)
        root = host.committed.get(root_key, MISSING)
        if isinstance(host, Detached) and root is not MISSING:
            root = put_on_copied_spine(root, rest, value)  # what is off the path is shared
        else:
            root = self._field_default(root_key) if root is MISSING else copy.deepcopy(root)
            if root is MISSING:
                root = {}
            put_at(root, rest, value)
        await host.operator_update({root_key: root}, read={root_key: version})

    async def delete(self, path: str) -> None:
        """Removes a top-level key (committed with the attempt)."""
        self._not_editing("delete()")
        att = attempt_of(self._host)
        if att is None:
            await self._host.operator_update({}, deletes=[path])
            return
        self._root(att, path)  # a delete depends on what it deletes
        att.writes[path] = Write(deleted=True)
        tracker = att.trackers.get(path)
        if tracker is not None:
            tracker.written = UNSURE

    async def clear(self) -> None:
        """Resets the state: every key removed, or with a typed state, each field back to
        its default (a required field is removed). Committed with the attempt, as
        ``set`` and ``delete`` are (outside one: at once)."""
        self._not_editing("clear()")
        att = attempt_of(self._host)
        committed = self._host.committed
        keys = list(committed)
        if att is not None:
            keys += [k for k in att.writes if k not in committed]
        defaults: dict[str, Any] = {}
        if self._state_type is not None:
            for name, info in getattr(self._state_type, "model_fields", {}).items():
                if not info.is_required():
                    defaults[name] = info.get_default(call_default_factory=True)
        removed = [k for k in keys if k not in defaults]
        if att is None:
            await self._host.operator_update(defaults, deletes=removed)
            return
        for k in removed:
            await self.delete(k)
        for k, v in defaults.items():
            await self.set(k, v)

    # -------------------------------------------------------------- as a dict

    def to_dict(self, serializer: BaseSerializer | None = None) -> dict[str, Any]:
        """The state as it stands outside any attempt, as LlamaIndex's in-memory store dict:
        ``store_type``, ``state_type``, ``state_module`` and ``state_data`` (the state
        serialized whole, by ``serializer``: typed JSON by default)."""
        return state_dict(self._host.committed, self._state_type, serializer)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], serializer: BaseSerializer | None = None
    ) -> ContextStore[Any]:
        """A store of its own holding the state :meth:`to_dict` wrote.

        :raises ContextSerdeError: ``data`` is not such a dict, or its state cannot be read.
        """
        return cls(state_from_dict(data, serializer))

    # -------------------------------------------------------------- typed state

    async def get_state(self) -> Any:
        """The whole state: the typed state model, or a dict of every key."""
        host = self._host
        att = attempt_of(self._host)
        shared = isinstance(host, Detached)
        if self._state_type is not None:
            fields = getattr(self._state_type, "model_fields", {})
            values = {}
            for name in fields:
                v = self._root(att, name)
                if v is not MISSING:
                    values[name] = materialize(v) if att is None and not shared else v
            model_construct = getattr(self._state_type, "model_construct", None)
            if model_construct is None:
                return self._state_type(**values)
            return model_construct(**values)
        keys = list(host.committed)
        if att is not None:
            keys += [k for k in att.writes if k not in host.committed]
        out = StateDict()
        for k in keys:
            v = self._root(att, k)
            if v is not MISSING:
                out[k] = v
        return out

    def _state_data(self, state: Any) -> dict[str, Any]:
        """The keys and values of a whole state (the typed model's fields, or the dict's).

        :raises ValueError: a typed state given something other than a pydantic model (as
            LlamaIndex's ``set_state`` refuses it), or an untyped one something not a dict.
        """
        if self._state_type is not None:
            model = type(state)
            related = isinstance(state, self._state_type) or issubclass(self._state_type, model)
            if not isinstance(state, BaseModel) or not related:
                msg = (
                    f"the state is a {self._state_type.__name__} (the context's state model)"
                    f" or one of its bases, not {model.__name__}"
                )
                raise ValueError(msg)
            return {name: getattr(state, name) for name in type(state).model_fields}
        if not isinstance(state, Mapping):
            msg = f"the untyped state is a dict of its keys, not {type(state).__name__}"
            raise ValueError(msg)
        return dict(state)

    async def set_state(self, state: Any) -> None:
        """Replaces the whole state (each field or key is diffed against what it was; an
        untyped state's keys not in ``state`` are removed).

        A model of a subclass of the state's model: a store of its own takes it as its
        model from here on (``get_state`` and ``clear`` make it), as LlamaIndex's does; a
        run's context writes each of its fields (``get`` reads them) and keeps the
        workflow's model, which its log is read back with on resume.
        """
        self._not_editing("set_state()")
        data = self._state_data(state)
        state_type = self._state_type
        if isinstance(self._host, Detached) and state_type and issubclass(type(state), state_type):
            self._state_type = type(state)
        att = attempt_of(self._host)
        gone: list[str] = []
        if self._state_type is None:
            keys = list(self._host.committed) + ([] if att is None else list(att.writes))
            gone = [k for k in dict.fromkeys(keys) if k not in data]
        if att is None:
            await self._host.operator_update(data, deletes=gone)
            return
        for k, v in data.items():
            await self._write(k, k, [], v)  # a subclass's fields too
        for k in gone:
            if self._root(att, k) is not MISSING:
                await self.delete(k)

    def _fields(self) -> Mapping[str, Any]:
        return getattr(self._state_type, "model_fields", {})

    @asynccontextmanager
    async def edit_state(self) -> AsyncIterator[Any]:
        """Holds the run's state lock until the attempt commits: this edit never conflicts.

        Yields the state (the typed model, or a dict of every key whose keys are also
        attributes); what it looks like at the end of the block is written back.

        Outside a step (``handler.ctx.store.edit_state()``, an operator's edit of a live
        run) no lock is held while the block runs; what is written back is checked
        against what the block read, so a step's commit in between is never undone.

        :raises StateConflictError: outside a step, a step's commit changed a key the
            edit read before the edit was written; nothing of the edit is written (read
            the state again and redo the edit).
        :raises RuntimeError: a writer (``set``, ``clear``, ...) is called inside the block.
        """
        self._not_editing("edit_state()")
        att = attempt_of(self._host)
        task = asyncio.current_task()
        if att is None:
            state = await self.get_state()
            if isinstance(self._host, Detached):  # its values are shared: the block edits copies
                state = copy_for_edit(state)
            # The versions of what get_state read, taken in the same turn of the loop.
            versions = self._host.versions
            names = list(self._state_data(state))
            read = {k: versions.get(k, 0) for k in names}
            self._editors.add(id(task))
            try:
                yield state
            finally:
                self._editors.discard(id(task))
            await self._host.operator_update(self._state_data(state), read=read)
            return
        if not att.holds_lock:
            await self._host.state_lock.acquire()
            att.holds_lock = True
            # What the attempt read before it held the lock may already be stale.
        state = await self.get_state()
        self._editors.add(id(att))
        try:
            yield state
        finally:
            self._editors.discard(id(att))
        if self._state_type is not None:
            for name in type(state).model_fields:
                if name in state.__dict__:
                    await self.set(name, state.__dict__[name])
            return
        for k, v in state.items():
            await self.set(k, v)
        removed = [k for k in self._host.committed if k not in state and k not in att.writes]
        for k in removed:
            await self.delete(k)
