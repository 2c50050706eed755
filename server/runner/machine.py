"""The turn's state machine: every change of every field of a turn, pure.

:func:`advance` takes a (frozen) :class:`~server.runner.turn.Turn` and one
event, and returns the turn as the event leaves it and the effects the
runner must carry out, in order. It reads no clock (each event carries its
time, ``at``, which becomes ``updated_at``) and does no I/O; the runner is
the pump: it calls the model or a tool, feeds what happened here, saves the
turn and runs the effects. An event the table does not allow in the turn's
status (or phase) raises :class:`~server.runner.errors.IllegalTransition`,
a bug in the runner, and changes nothing.

Status moves follow :data:`server.runner.turn.TRANSITIONS`; what each event
needs and changes besides:

==================  =========================  ================================  ==================
event               from (status / phase)      fields changed                    effects
==================  =========================  ================================  ==================
Started             READY, RUNNING, RETRY_     status RUNNING (RUN; RUN_TO_      (none)
                    SCHEDULED; blocked with    CANCEL when blocked and cancel
                    cancel_requested           requested), suspension cleared
Touched             RUNNING                    (updated_at only)                 Save
AttemptFailed       READY, RUNNING,            attempts + 1, last_error          (none)
                    RETRY_SCHEDULED
ModelReplied        RUNNING / MODEL            iterations + 1, retry_attempts    Notify MODEL_
                                               and attempts 0, the assistant     REPLIED, then Save,
                                               message; with tool calls: the     or with no tool
                                               calls pending, phase TOOLS; with  calls, COMPLETE's
                                               none: output, then COMPLETE       (see Finished)
ToolFinished        RUNNING / TOOLS            the call's result, tool_calls_    Save
                                               made + counted, retry_attempts
                                               and attempts 0
ToolsCollected      RUNNING / TOOLS            a tool message per result,        (none: what it
                                               pending cleared, phase MODEL      follows from is
                                                                                 saved)
Blocked             READY, RUNNING             status WAITING_FOR_* or RETRY_    Save, Notify
                                               SCHEDULED by the suspension's     TURN_SUSPENDED;
                                               type, suspension                  MakeRunnable(due)
                                                                                 for a RETRY
RetryLater          READY, RUNNING             retry_attempts + 1, then Blocked  as Blocked
                                               on a RETRY in the current phase
FormAsked           RUNNING / TOOLS            the call as it waits (marked      as Blocked
                                               form_asked), then Blocked
ChildStarted        RUNNING / TOOLS            children + the child, tool_       as Blocked
                                               calls_made + 1, then Blocked on
                                               CHILD_AGENT (resumes in TOOLS)
Resumed             WAITING_FOR_*, RETRY_      audit + the mark; failing, or a   (none: each caller
                    SCHEDULED                  user message, or the answered     saves its own way)
                                               call; status READY (RESUME),
                                               phase the suspension's resume
                                               phase, suspension cleared
Finished            RUNNING                    status by the ending, phase       Save, Notify (the
                                               FINISHED, error, suspension       ending's event),
                                               cleared                           ShowFinished;
                                                                                 CancelChildren on
                                                                                 CANCEL with
                                                                                 children;
                                                                                 WakeParent for a
                                                                                 child turn
==================  =========================  ================================  ==================

Besides :func:`advance`, only :func:`as_stored` writes a turn's fields: the
store's own bookkeeping (``version``, ``cancel_requested``), which is the
store's to know and no event's (see its docstring).
"""

from __future__ import annotations

from typing import Any, assert_never

import msgspec

from server.runner.errors import IllegalTransition
from server.runner.events import EventType
from server.runner.turn import (
    ENDINGS,
    WAIT_FOR,
    Audit,
    ModelMessage,
    PendingCall,
    Phase,
    Suspension,
    SuspensionType,
    ToolCall,
    Transition,
    Turn,
    TurnStatus,
    next_status,
)

# ─── Events ──────────────────────────────────────────────────────────────────


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """Something that happened to a turn at ``at`` (the runner's clock)."""

    at: float


class Started(Event, frozen=True):
    """A runner takes the turn up (new, resumed, taken over, a retry due,
    or blocked but to be cancelled)."""


class Touched(Event, frozen=True):
    """Nothing changed but the time: a save that makes sure the lease is
    still ours."""


class AttemptFailed(Event, frozen=True):
    """An execution failed without a step saved (its worker died, or an
    error the runner could not turn into a result)."""

    error: str


class ModelReplied(Event, frozen=True):
    text: str | None
    tool_calls: tuple[ToolCall, ...]


class ToolFinished(Event, frozen=True):
    """Pending call ``call_id`` has its ``result``; ``counted``: it ran (it
    counts against ``max_tool_calls``), rather than being denied or refused."""

    call_id: str
    result: str
    counted: bool


class ToolsCollected(Event, frozen=True):
    """Every pending call has its result: they go to the model."""


class Blocked(Event, frozen=True):
    suspension: Suspension


class RetryLater(Event, frozen=True):
    """A transient failure: wait until ``due_at`` and try the step again."""

    error: str
    due_at: float


class FormAsked(Event, frozen=True):
    """The tool of a pending call raised FormRequired: ``call`` is that
    call as it waits (marked asked), and the turn waits on ``suspension``
    for its form."""

    call: PendingCall
    suspension: Suspension


class ChildStarted(Event, frozen=True):
    """Pending call ``call_id`` started child turn ``child_id``: wait for it."""

    call_id: str
    child_id: str
    message: str


class Resumed(Event, frozen=True):
    """A resume command fit the suspension (``mark`` records it). At most
    one of: ``failing`` (the turn is to fail), ``message`` (a plain answer),
    ``call`` (the pending call as the answer leaves it)."""

    mark: Audit
    failing: str | None = None
    message: ModelMessage | None = None
    call: PendingCall | None = None


class Finished(Event, frozen=True):
    ending: Transition
    error: str | None = None


TurnEvent = (
    Started
    | Touched
    | AttemptFailed
    | ModelReplied
    | ToolFinished
    | ToolsCollected
    | Blocked
    | RetryLater
    | FormAsked
    | ChildStarted
    | Resumed
    | Finished
)

# ─── Effects ─────────────────────────────────────────────────────────────────


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    """What the runner does after an event, in order."""


class Save(Effect, frozen=True):
    """Save the turn (under the lease); the effects after it see it saved."""


class Notify(Effect, frozen=True):
    """Tell the listeners ``type`` with ``data``."""

    type: EventType
    data: dict[str, Any] = msgspec.field(default_factory=dict)


class MakeRunnable(Effect, frozen=True):
    """Queue the turn for a worker at ``at`` (a retry's due time)."""

    at: float


class ShowFinished(Effect, frozen=True):
    """Tell the chat port the turn ended."""


class CancelChildren(Effect, frozen=True):
    children: tuple[str, ...]


class WakeParent(Effect, frozen=True):
    """The turn is a child that ended: resume the parent waiting for it."""


TurnEffect = Save | Notify | MakeRunnable | ShowFinished | CancelChildren | WakeParent


ENDED_AS = {
    Transition.COMPLETE: EventType.TURN_COMPLETED,
    Transition.CANCEL: EventType.TURN_CANCELLED,
}
"""The listeners' event for each ending (any other: TURN_FAILED)."""

_RUNNING = frozenset({TurnStatus.RUNNING})
_MAY_FAIL_AN_ATTEMPT = frozenset({TurnStatus.READY, TurnStatus.RUNNING, TurnStatus.RETRY_SCHEDULED})

# ─── advance ─────────────────────────────────────────────────────────────────


def advance(turn: Turn, event: TurnEvent) -> tuple[Turn, tuple[TurnEffect, ...]]:
    """``turn`` as ``event`` leaves it, and what the runner must do next
    (see the table in the module docstring). Raises IllegalTransition when
    the event is not allowed in the turn's status or phase."""
    at = event.at
    match event:
        case Started():
            blocked_to_cancel = turn.is_blocked and turn.cancel_requested
            moved = _move(turn, Transition.RUN_TO_CANCEL if blocked_to_cancel else Transition.RUN)
            return _set(moved, at, suspension=None), ()
        case Touched():
            _require(turn, event, _RUNNING)
            return _set(turn, at), (Save(),)
        case AttemptFailed():
            _require(turn, event, _MAY_FAIL_AN_ATTEMPT)
            return _set(turn, at, attempts=turn.attempts + 1, last_error=event.error), ()
        case ModelReplied():
            _require(turn, event, _RUNNING, Phase.MODEL)
            replied = _set(
                turn,
                at,
                iterations=turn.iterations + 1,
                retry_attempts=0,
                attempts=0,
                messages=(
                    *turn.messages,
                    ModelMessage(
                        role="assistant", content=event.text, tool_calls=event.tool_calls or None
                    ),
                ),
            )
            told = Notify(type=EventType.MODEL_REPLIED, data={"tool_calls": len(event.tool_calls)})
            if event.tool_calls:
                pending = tuple(PendingCall(call=call) for call in event.tool_calls)
                return _set(replied, at, pending=pending, phase=Phase.TOOLS), (told, Save())
            completed = Finished(at=at, ending=Transition.COMPLETE)
            ended, effects = _finish(_set(replied, at, output=event.text), completed)
            return ended, (told, *effects)
        case ToolFinished():
            _require(turn, event, _RUNNING, Phase.TOOLS)
            pending = tuple(
                msgspec.structs.replace(p, result=event.result) if p.call.id == event.call_id else p
                for p in turn.pending
            )
            finished = _set(
                turn,
                at,
                pending=pending,
                tool_calls_made=turn.tool_calls_made + event.counted,
                retry_attempts=0,
                attempts=0,
            )
            return finished, (Save(),)
        case ToolsCollected():
            _require(turn, event, _RUNNING, Phase.TOOLS)
            results = tuple(
                ModelMessage(role="tool", content=p.result, tool_call_id=p.call.id)
                for p in turn.pending
            )
            return _set(
                turn, at, messages=(*turn.messages, *results), pending=(), phase=Phase.MODEL
            ), ()
        case Blocked():
            return _block(turn, at, event.suspension)
        case RetryLater():
            attempt = turn.retry_attempts + 1
            suspension = Suspension(
                type=SuspensionType.RETRY,
                message=event.error,
                resume_phase=turn.phase,
                due_at=event.due_at,
                metadata={"attempt": attempt},
            )
            return _block(_set(turn, at, retry_attempts=attempt), at, suspension)
        case FormAsked():
            _require(turn, event, _RUNNING, Phase.TOOLS)
            pending = _with_call(turn, event.call)
            return _block(_set(turn, at, pending=pending), at, event.suspension)
        case ChildStarted():
            _require(turn, event, _RUNNING, Phase.TOOLS)
            suspension = Suspension(
                type=SuspensionType.CHILD_AGENT,
                correlation_id=event.child_id,
                message=event.message,
                resume_phase=Phase.TOOLS,
            )
            counted = _set(
                turn,
                at,
                children=(*turn.children, event.child_id),
                tool_calls_made=turn.tool_calls_made + 1,
            )
            return _block(counted, at, suspension)
        case Resumed():
            return _resume(turn, event), ()
        case Finished():
            return _finish(turn, event)
        case _:
            assert_never(event)


def as_stored(turn: Turn, *, version: int, cancel_requested: bool) -> Turn:
    """``turn`` with the store's bookkeeping: its compare-and-set
    ``version`` and the ``cancel_requested`` flag the store keeps apart
    from saves (so that no save clears it). These two are the store's to
    set, as it loads or saves, and no event's: the only writer of a turn's
    fields besides :func:`advance`."""
    return msgspec.structs.replace(turn, version=version, cancel_requested=cancel_requested)


# ─── The rules ───────────────────────────────────────────────────────────────


def _set(turn: Turn, at: float, **changes: Any) -> Turn:
    return msgspec.structs.replace(turn, updated_at=at, **changes)


def _move(turn: Turn, transition: Transition) -> Turn:
    return msgspec.structs.replace(turn, status=next_status(turn.id, turn.status, transition))


def _require(
    turn: Turn, event: Event, statuses: frozenset[TurnStatus], phase: Phase | None = None
) -> None:
    if turn.status not in statuses or (phase is not None and turn.phase != phase):
        where = turn.status.value if phase is None else f"{turn.status.value} in {turn.phase.value}"
        raise IllegalTransition(turn.id, where, type(event).__name__)


def _with_call(turn: Turn, updated: PendingCall) -> tuple[PendingCall, ...]:
    return tuple(updated if p.call.id == updated.call.id else p for p in turn.pending)


def _block(turn: Turn, at: float, suspension: Suspension) -> tuple[Turn, tuple[TurnEffect, ...]]:
    blocked = _set(_move(turn, WAIT_FOR[suspension.type]), at, suspension=suspension)
    effects: tuple[TurnEffect, ...] = (
        Save(),
        Notify(type=EventType.TURN_SUSPENDED, data={"type": suspension.type.value}),
    )
    if suspension.type == SuspensionType.RETRY and suspension.due_at is not None:
        effects = (*effects, MakeRunnable(at=suspension.due_at))
    return blocked, effects


def _resume(turn: Turn, event: Resumed) -> Turn:
    suspension = turn.suspension
    moved = _move(turn, Transition.RESUME)
    assert suspension is not None, f"turn {turn.id} is blocked without a suspension"
    changes: dict[str, Any] = {"audit": (*turn.audit, event.mark)}
    if event.failing is not None:
        changes["failing"] = event.failing
    if event.message is not None:
        changes["messages"] = (*turn.messages, event.message)
    if event.call is not None:
        changes["pending"] = _with_call(turn, event.call)
    return _set(moved, event.at, phase=suspension.resume_phase, suspension=None, **changes)


def _finish(turn: Turn, event: Finished) -> tuple[Turn, tuple[TurnEffect, ...]]:
    ending = event.ending
    if ending not in ENDINGS:
        raise IllegalTransition(turn.id, turn.status, ending)
    ended = _set(
        _move(turn, ending), event.at, phase=Phase.FINISHED, error=event.error, suspension=None
    )
    kind = ENDED_AS.get(ending, EventType.TURN_FAILED)
    effects: tuple[TurnEffect, ...] = (
        Save(),
        Notify(type=kind, data={"status": ended.status.value, "error": event.error}),
        ShowFinished(),
    )
    if ending == Transition.CANCEL and ended.children:
        effects = (*effects, CancelChildren(children=ended.children))
    if ended.parent is not None:
        effects = (*effects, WakeParent())
    return ended, effects
