"""What a run looks like at a seq (``RunState``) and where one can go back to (``Checkpoint``)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    field_serializer,
    field_validator,
    model_validator,
)

from ._events import Event

if TYPE_CHECKING:
    from eventstore import Codec

__all__ = [
    "Checkpoint",
    "InProgress",
    "LazyDict",
    "LazyList",
    "RunState",
    "RunStatus",
    "Waiter",
    "listed_by",
]

K = TypeVar("K")
V = TypeVar("V")
_UNREAD: Any = object()  # a value not decoded yet

# "submitted": unfinished, owned by nobody and never claimed since ``wf.submit`` recorded it
# (an "interrupted" run whose process has not died, since none ever ran it).
RunStatus = Literal[
    "running",
    "submitted",
    "interrupted",
    "waiting",
    "finished",
    "failed",
    "cancelled",
    "timed_out",
]
TERMINAL: frozenset[str] = frozenset({"finished", "failed", "cancelled", "timed_out"})
# Ended runs that refuse an event sent to them: a run stopped from outside (cancelled) or
# by its clock (timed out) goes on when it is resumed and takes in what was sent meanwhile,
# a human's late answer included; a finished or failed run ended by its own outcome.
REFUSES_EVENTS: frozenset[str] = frozenset({"finished", "failed"})
# The fields Checkpoint has for LlamaIndex users (llama-index-core 0.12's Checkpoint).
LLAMA_FIELDS: Final = ("id_", "last_completed_step", "input_event", "output_event")


class Checkpoint(BaseModel):
    """A commit of a run one can look at or fork from: the run and the commit's last seq.

    Every field is JSON-native, so ``Checkpoint.model_validate(json.loads(json.dumps(
    cp.model_dump())))`` gives back an equal checkpoint that ``run_from`` accepts.

    LlamaIndex's fields (``llama_index.core.workflow.Checkpoint``) are there too: ``id_``
    (``"run_id:seq"``), and for a commit of a step that returned, ``last_completed_step``,
    ``input_event`` (the event it took) and ``output_event`` (the last event it emitted),
    events of their exact class that dump as the codec's typed JSON and validate back
    from it. ``ctx_state`` (the context dict there) is computed when read, never when
    checkpoints are listed.
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    seq: int
    kind: str
    step: str | None = None
    event_types: list[str] = []
    id_: str = ""
    last_completed_step: str | None = None
    input_event: Any = None
    output_event: Any = None
    # (the workflow that listed it, the serializer of ctx_state), for ctx_state.
    _source: Any = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _fill_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("id_") and "run_id" in data:
            data = {**data, "id_": f"{data['run_id']}:{data.get('seq')}"}
        return data

    @field_validator("input_event", "output_event", mode="before")
    @classmethod
    def _load_event(cls, value: Any) -> Any:
        # A dump (after a JSON round trip) is rebuilt as its exact class: the codec resolves
        # it among the classes this program has registered or imported.
        if isinstance(value, dict) and "$t" in value:
            from eventstore import CodecError, default_codec

            try:
                return default_codec.load(value)
            except CodecError:  # a class this program lacks: kept as its JSON
                return value
        return value

    @field_serializer("input_event", "output_event")
    def _dump_event(self, value: Any) -> Any:
        if value is None or not isinstance(value, Event):
            return value
        from eventstore import default_codec

        return default_codec.dump(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash((self.run_id, self.seq))

    @property
    def ctx_state(self) -> dict[str, Any]:
        """The context dict (``Context.to_dict()``) at this checkpoint, read from the store.

        :raises WorkflowRuntimeError: the checkpoint was not listed by a workflow here (it
            was validated from data): ``wf.state_at(cp.run_id, cp.seq)`` reads the state.
        """
        wf, serializer = self._source or (None, None)
        if wf is None:
            from ._errors import WorkflowRuntimeError

            msg = (
                "this checkpoint was not listed by a workflow, so its ctx_state is unknown"
                " here; read the state with wf.state_at(cp.run_id, cp.seq)"
            )
            raise WorkflowRuntimeError(msg)
        # The workflow that listed it reads it (this module sits below the context's).
        state: dict[str, Any] = wf.__workflow_parts__.context_dict_at(
            self.run_id, self.seq, serializer
        )
        return state


def listed_by(cp: Checkpoint, workflow: Any, serializer: Any = None) -> Checkpoint:
    """Records that ``workflow`` listed ``cp`` (``ctx_state`` reads through it, with
    ``serializer``): set by ``Workflow.checkpoints`` and the checkpointer."""
    cp._source = (workflow, serializer)
    return cp


class LazyDict(MutableMapping[K, V]):
    """A dict whose values are decoded from the log's JSON form when first read.

    Reading a value decodes it (once); listing keys, ``len`` and ``in`` decode nothing. It
    compares equal to a dict with the same items and copies as a plain dict.
    """

    __slots__ = ("_load", "_raw", "_values")

    def __init__(self, raw: Mapping[K, Any], load: Callable[[K, Any], V]) -> None:
        self._raw = dict(raw)
        self._load = load
        self._values: dict[K, V] = {}

    def __getitem__(self, key: K) -> V:
        try:
            return self._values[key]
        except KeyError:
            pass
        raw = self._raw[key]
        value = self._values[key] = self._load(key, raw)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._raw.setdefault(key, _UNREAD)
        self._values[key] = value

    def __delitem__(self, key: K) -> None:
        del self._raw[key]
        self._values.pop(key, None)

    def __iter__(self) -> Iterator[K]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]  # mutable, like dict

    def __repr__(self) -> str:
        return repr(dict(self.items()))

    def __copy__(self) -> dict[K, V]:
        return dict(self.items())

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[K, V]:
        return copy.deepcopy(dict(self.items()), memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self.items()),))


class LazyList(Sequence[V], Generic[V]):
    """A list whose items are decoded from the log's JSON form when first read.

    ``len`` decodes nothing; an item is decoded (once) when it is read. It compares equal
    to a list with the same items and copies as a plain list.
    """

    __slots__ = ("_load", "_raw", "_values")

    def __init__(self, raw: Iterable[Any], load: Callable[[Any], V]) -> None:
        self._raw = list(raw)
        self._load = load
        self._values: list[Any] = [_UNREAD] * len(self._raw)

    def _get(self, i: int) -> V:
        value = self._values[i]
        if value is _UNREAD:
            value = self._values[i] = self._load(self._raw[i])
        return value  # type: ignore[no-any-return]

    @overload
    def __getitem__(self, index: int) -> V: ...

    @overload
    def __getitem__(self, index: slice) -> list[V]: ...

    def __getitem__(self, index: int | slice) -> V | list[V]:
        if isinstance(index, slice):
            return [self._get(i) for i in range(len(self._raw))[index]]
        n = len(self._raw)
        if not -n <= index < n:
            msg = "list index out of range"
            raise IndexError(msg)
        return self._get(index % n)

    def __len__(self) -> int:
        return len(self._raw)

    def __iter__(self) -> Iterator[V]:
        return (self._get(i) for i in range(len(self._raw)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))

    def __copy__(self) -> list[V]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[V]:
        return copy.deepcopy(list(self), memo)

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


@dataclass(frozen=True, slots=True)
class InProgress:
    """An event a step took and has not finished: re-run on resume, never dropped."""

    event: Event
    attempt: int  # attempts started so far
    failures: int = 0
    event_id: int = 0
    retry_at: float | None = None  # a recorded retry not yet begun is due then (Unix time)


@dataclass(frozen=True, slots=True)
class Waiter:
    """A step suspended in ``wait_for_event`` until a matching event arrives."""

    waiter_id: str
    step: str
    event: Event  # the step's input, delivered again when the wait is answered
    awaited: str  # qualified name of the awaited event class
    requirements: dict[str, Any]
    deadline: float | None  # Unix time, or None
    waiter_event: Event | None
    event_id: int = 0


@dataclass(slots=True)
class RunState:
    """The state of a run at a seq: the fold of its log up to that seq.

    ``queues[step]`` are the events enqueued and not yet taken, in order;
    ``in_progress[step]`` the events taken and not finished; ``context`` the latest value
    of each key; ``collected`` the collect buffers (``"step:buffer id"`` -> event class's
    qualified name -> events; the id is ``buffer_id=`` or a digest of the expected classes);
    ``waiters`` the suspended waits; ``stream`` what steps wrote to the stream.

    A state read from the log decodes lazily: a context value, a step's queue (or its events
    in progress), a collect buffer, a waiter or a stream event is decoded when it is first
    read (:class:`LazyDict`, :class:`LazyList`), so a read costs what the caller looks at;
    one the log holds damaged raises :class:`~eventstore.LogCorruptedError` then, naming it
    and the seq of the record it came from.
    """

    run_id: str
    seq: int
    status: RunStatus
    result: Any = None
    error: dict[str, Any] | None = None
    queues: MutableMapping[str, list[Event]] = field(default_factory=dict)
    in_progress: MutableMapping[str, list[InProgress]] = field(default_factory=dict)
    context: MutableMapping[str, Any] = field(default_factory=dict)
    collected: MutableMapping[str, dict[str, list[Event]]] = field(default_factory=dict)
    waiters: Sequence[Waiter] = field(default_factory=list)
    stream: Sequence[Event] = field(default_factory=list)
    workflow: str = ""
    fingerprint: str = ""
    parent: tuple[str, int] | None = None

    def to_json(self, codec: Codec | None = None) -> dict[str, Any]:
        """The state as JSON-native data (events and values through the codec's dump: the
        default codec, or the workflow's, e.g. one that opted in to pickle)."""
        if codec is None:
            from eventstore import default_codec

            codec = default_codec

        def ev(e: Event) -> Any:
            return codec.dump(e)

        return {
            "run_id": self.run_id,
            "seq": self.seq,
            "status": self.status,
            "result": codec.dump(self.result),
            "error": self.error,
            "queues": {s: [ev(e) for e in q] for s, q in self.queues.items()},
            "in_progress": {
                s: [
                    {"event": ev(p.event), "attempt": p.attempt, "failures": p.failures}
                    for p in lst
                ]
                for s, lst in self.in_progress.items()
            },
            "context": {k: codec.dump(v) for k, v in self.context.items()},
            "collected": {
                b: {t: [ev(e) for e in es] for t, es in d.items()}
                for b, d in self.collected.items()
            },
            "waiters": [
                {
                    "waiter_id": w.waiter_id,
                    "step": w.step,
                    "event": ev(w.event),
                    "awaited": w.awaited,
                    "requirements": codec.dump(w.requirements),
                    "deadline": w.deadline,
                    "waiter_event": None if w.waiter_event is None else ev(w.waiter_event),
                }
                for w in self.waiters
            ],
            "stream": [ev(e) for e in self.stream],
            "workflow": self.workflow,
            "fingerprint": self.fingerprint,
            "parent": list(self.parent) if self.parent else None,
        }
