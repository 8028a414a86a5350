"""What a run looks like at a seq (``RunState``) and where one can go back to (``Checkpoint``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    field_serializer,
    field_validator,
    model_validator,
)

from ._events import Event

__all__ = ["Checkpoint", "InProgress", "RunState", "RunStatus", "Waiter"]

RunStatus = Literal[
    "running", "interrupted", "waiting", "finished", "failed", "cancelled", "timed_out"
]
TERMINAL: frozenset[str] = frozenset({"finished", "failed", "cancelled", "timed_out"})
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
    # The workflow that listed it (for ctx_state) and the serializer ctx_state uses.
    _source: Any = PrivateAttr(default=None)
    _serializer: Any = PrivateAttr(default=None)

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
        wf = self._source
        if wf is None:
            from ._errors import WorkflowRuntimeError

            msg = (
                "this checkpoint was not listed by a workflow, so its ctx_state is unknown"
                " here; read the state with wf.state_at(cp.run_id, cp.seq)"
            )
            raise WorkflowRuntimeError(msg)
        from ._context import Context

        ctx: Context[Any] = Context(wf)
        ctx._run = self.run_id
        ctx._idle.seq = self.seq
        return ctx.to_dict(self._serializer)


@dataclass(frozen=True, slots=True)
class InProgress:
    """An event a step took and has not finished: re-run on resume, never dropped."""

    event: Event
    attempt: int  # attempts started so far
    failures: int = 0
    event_id: int = 0


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
    """

    run_id: str
    seq: int
    status: RunStatus
    result: Any = None
    error: dict[str, Any] | None = None
    queues: dict[str, list[Event]] = field(default_factory=dict)
    in_progress: dict[str, list[InProgress]] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    collected: dict[str, dict[str, list[Event]]] = field(default_factory=dict)
    waiters: list[Waiter] = field(default_factory=list)
    stream: list[Event] = field(default_factory=list)
    workflow: str = ""
    fingerprint: str = ""
    parent: tuple[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        """The state as JSON-native data (events and values through the codec's dump)."""
        from eventstore import default_codec as codec

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
