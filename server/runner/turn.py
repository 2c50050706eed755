"""A durable turn: what the runner saves, with its status, phase and why it
waits. Everything here is a frozen msgspec Struct so that a turn is one JSON
document in any turn store; nothing here holds a callback.

A turn changes only by :func:`server.runner.machine.advance`, which makes
the turn an event leaves. Its status moves only by a named
:class:`Transition` that the table :data:`TRANSITIONS` (below the statuses)
allows from the status it is in; any other pair raises
:class:`~server.runner.errors.IllegalTransition` (a bug) and leaves the
turn as it was. In short: a READY turn is RUN (or blocked by
``Runner.suspend``); a RUNNING one blocks (WAIT_FOR_USER, WAIT_FOR_APPROVAL,
WAIT_FOR_CHILD, SCHEDULE_RETRY), ends (COMPLETE, FAIL, CANCEL,
REACH_MAX_ITERATIONS, EXCEED_BUDGET), or is RUN again by the runner that
takes it over after a crash; a blocked one is RESUMEd to READY, or run again
to be cancelled (RUN_TO_CANCEL) or, a retry, when it is due (RUN); a
terminal one never changes.

A blocked turn holds a :class:`Suspension`; a :class:`ResumeCommand` of the
matching type (and correlation id) is the only way out, but for a retry
that is due and a cancel.
"""

from __future__ import annotations

import enum
import json
from typing import Any, Literal

import msgspec

from server.core.expiry import Expiry
from server.runner.errors import IllegalTransition
from server.runner.ids import plain_question_id


class TurnStatus(enum.StrEnum):
    READY = "READY"
    RUNNING = "RUNNING"
    WAITING_FOR_USER = "WAITING_FOR_USER"
    WAITING_FOR_APPROVAL = "WAITING_FOR_APPROVAL"
    WAITING_FOR_CHILD = "WAITING_FOR_CHILD"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    MAX_ITERATIONS_REACHED = "MAX_ITERATIONS_REACHED"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"


class Transition(enum.StrEnum):
    """What may happen to a turn's status; :data:`TRANSITIONS` says from
    which status, and to which."""

    RUN = "RUN"
    """A runner takes the turn up: a new or resumed one, one whose runner
    died (it is RUNNING still), or a retry that is due."""
    RUN_TO_CANCEL = "RUN_TO_CANCEL"
    """A runner takes a blocked turn up because its cancel was requested:
    its next step ends it."""
    WAIT_FOR_USER = "WAIT_FOR_USER"
    WAIT_FOR_APPROVAL = "WAIT_FOR_APPROVAL"
    WAIT_FOR_CHILD = "WAIT_FOR_CHILD"
    SCHEDULE_RETRY = "SCHEDULE_RETRY"
    RESUME = "RESUME"
    """A resume command fit the suspension: the turn is runnable again."""
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    CANCEL = "CANCEL"
    REACH_MAX_ITERATIONS = "REACH_MAX_ITERATIONS"
    EXCEED_BUDGET = "EXCEED_BUDGET"


_S, _T = TurnStatus, Transition

TRANSITIONS: dict[TurnStatus, dict[Transition, TurnStatus]] = {
    _S.READY: {
        _T.RUN: _S.RUNNING,
        # Runner.suspend may block a turn that has not run yet.
        _T.WAIT_FOR_USER: _S.WAITING_FOR_USER,
        _T.WAIT_FOR_APPROVAL: _S.WAITING_FOR_APPROVAL,
        _T.WAIT_FOR_CHILD: _S.WAITING_FOR_CHILD,
        _T.SCHEDULE_RETRY: _S.RETRY_SCHEDULED,
    },
    _S.RUNNING: {
        _T.RUN: _S.RUNNING,
        _T.WAIT_FOR_USER: _S.WAITING_FOR_USER,
        _T.WAIT_FOR_APPROVAL: _S.WAITING_FOR_APPROVAL,
        _T.WAIT_FOR_CHILD: _S.WAITING_FOR_CHILD,
        _T.SCHEDULE_RETRY: _S.RETRY_SCHEDULED,
        _T.COMPLETE: _S.COMPLETED,
        _T.FAIL: _S.FAILED,
        _T.CANCEL: _S.CANCELLED,
        _T.REACH_MAX_ITERATIONS: _S.MAX_ITERATIONS_REACHED,
        _T.EXCEED_BUDGET: _S.BUDGET_EXCEEDED,
    },
    _S.WAITING_FOR_USER: {_T.RESUME: _S.READY, _T.RUN_TO_CANCEL: _S.RUNNING},
    _S.WAITING_FOR_APPROVAL: {_T.RESUME: _S.READY, _T.RUN_TO_CANCEL: _S.RUNNING},
    _S.WAITING_FOR_CHILD: {_T.RESUME: _S.READY, _T.RUN_TO_CANCEL: _S.RUNNING},
    _S.RETRY_SCHEDULED: {
        _T.RESUME: _S.READY,
        _T.RUN: _S.RUNNING,
        _T.RUN_TO_CANCEL: _S.RUNNING,
    },
    _S.COMPLETED: {},
    _S.FAILED: {},
    _S.CANCELLED: {},
    _S.MAX_ITERATIONS_REACHED: {},
    _S.BUDGET_EXCEEDED: {},
}
"""status -> transition -> the status it leads to; a pair not listed is
refused. A terminal status has no way out."""

ENDINGS = frozenset({_T.COMPLETE, _T.FAIL, _T.CANCEL, _T.REACH_MAX_ITERATIONS, _T.EXCEED_BUDGET})
"""The transitions that end a turn (the machine's ``Finished``)."""


def next_status(turn_id: str, status: TurnStatus, transition: Transition) -> TurnStatus:
    """The status ``transition`` leads to from ``status``; raises
    IllegalTransition when the table does not allow it."""
    to = TRANSITIONS[status].get(transition)
    if to is None:
        raise IllegalTransition(turn_id, status, transition)
    return to


BLOCKED = frozenset(
    {
        TurnStatus.WAITING_FOR_USER,
        TurnStatus.WAITING_FOR_APPROVAL,
        TurnStatus.WAITING_FOR_CHILD,
        TurnStatus.RETRY_SCHEDULED,
    }
)
TERMINAL = frozenset(
    {
        TurnStatus.COMPLETED,
        TurnStatus.FAILED,
        TurnStatus.CANCELLED,
        TurnStatus.MAX_ITERATIONS_REACHED,
        TurnStatus.BUDGET_EXCEEDED,
    }
)


class Phase(enum.StrEnum):
    MODEL = "MODEL"
    TOOLS = "TOOLS"
    FINISHED = "FINISHED"


class SuspensionType(enum.StrEnum):
    USER_INPUT = "USER_INPUT"
    TOOL_APPROVAL = "TOOL_APPROVAL"
    CHILD_AGENT = "CHILD_AGENT"
    RETRY = "RETRY"


WAIT_FOR = {
    SuspensionType.USER_INPUT: Transition.WAIT_FOR_USER,
    SuspensionType.TOOL_APPROVAL: Transition.WAIT_FOR_APPROVAL,
    SuspensionType.CHILD_AGENT: Transition.WAIT_FOR_CHILD,
    SuspensionType.RETRY: Transition.SCHEDULE_RETRY,
}
"""The transition that blocks a turn on a suspension of each type."""


class Record(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of the runner's saved shapes (the turn itself is frozen too)."""


# ─── What the model sees ─────────────────────────────────────────────────────


class ToolCall(Record, frozen=True):
    """A call the model asked for; ``id`` is stable for the whole turn."""

    id: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class ModelMessage(Record, frozen=True):
    """One message of the conversation the model is given."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None


# ─── Waiting ─────────────────────────────────────────────────────────────────


class FrozenForm(Record, frozen=True):
    """A form as it was when the turn asked for it: later changes to the
    agent's form affect only new turns."""

    key: str
    description: str
    schema: dict[str, Any]


class Suspension(Record, frozen=True):
    """Why a turn waits, and what may resume it.

    ``correlation_id`` is the tool call id for USER_INPUT from a form and
    for TOOL_APPROVAL, the child turn id for CHILD_AGENT, the question's own
    id for a plain-text USER_INPUT (:meth:`user_input`), and absent for
    RETRY. A USER_INPUT suspension without ``form`` is a plain-text question.
    ``expiry`` (USER_INPUT, TOOL_APPROVAL) goes with the question to the
    chat, which applies its policy when nobody answers in time.
    """

    type: SuspensionType
    correlation_id: str | None = None
    message: str = ""
    resume_phase: Phase = Phase.MODEL
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    form: FrozenForm | None = None
    due_at: float | None = None
    expiry: Expiry | None = None

    @property
    def is_plain_question(self) -> bool:
        return self.type == SuspensionType.USER_INPUT and self.form is None

    @classmethod
    def user_input(
        cls,
        message: str,
        *,
        question_id: str | None = None,
        expiry: Expiry | None = None,
        **metadata: Any,
    ) -> Suspension:
        """A plain-text question, with a correlation id of its own
        (``question_id``, a new :func:`~server.runner.ids.plain_question_id`
        by default); resumed by ``ResumeCommand.user_input(content,
        question=...)`` with that id, whose content becomes a user message.
        An answer to another question (late, duplicate) is refused.
        ``expiry``: nobody answering in time is a reply of ``""`` (cancel,
        decline) or fails the turn (fail)."""
        return cls(
            type=SuspensionType.USER_INPUT,
            correlation_id=question_id or plain_question_id(),
            message=message,
            resume_phase=Phase.MODEL,
            metadata=metadata,
            expiry=expiry,
        )


class ResumeCommand(Record, frozen=True):
    """What ends a suspension. Build it with the class methods."""

    type: SuspensionType
    correlation_id: str | None = None
    content: str | None = None
    data: dict[str, Any] | None = None
    response: Literal["accept", "decline", "cancel"] = "accept"
    approved: bool | None = None
    reason: str | None = None
    skipped: bool = False
    """A rejected tool call that was skipped (its approval expired with
    ``cancel``) rather than denied."""
    failure: str | None = None
    """The wait can never be answered (it expired with ``fail``, or its chat
    turn failed): the turn fails with this error."""
    edited_arguments: dict[str, Any] | None = None
    child_output: str | None = None
    child_status: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    @classmethod
    def user_input(
        cls,
        content_or_call_id: str,
        data: dict[str, Any] | None = None,
        *,
        response: Literal["accept", "decline", "cancel"] = "accept",
        question: str | None = None,
    ) -> ResumeCommand:
        """``user_input(content, question=id)`` answers the plain-text
        question ``id`` (the suspension's correlation id);
        ``user_input(call_id, data)`` submits a form (``response`` decline or
        cancel with no data when the people said no)."""
        if question is not None or (data is None and response == "accept"):
            return cls(
                type=SuspensionType.USER_INPUT, correlation_id=question, content=content_or_call_id
            )
        return cls(
            type=SuspensionType.USER_INPUT,
            correlation_id=content_or_call_id,
            data=data,
            response=response,
        )

    @classmethod
    def approve_tool(
        cls, call_id: str, *, edited_arguments: dict[str, Any] | None = None
    ) -> ResumeCommand:
        return cls(
            type=SuspensionType.TOOL_APPROVAL,
            correlation_id=call_id,
            approved=True,
            edited_arguments=edited_arguments,
        )

    @classmethod
    def reject_tool(
        cls, call_id: str, reason: str | None = None, *, skipped: bool = False
    ) -> ResumeCommand:
        """Deny the call (``skipped``: it was skipped instead); it never runs."""
        return cls(
            type=SuspensionType.TOOL_APPROVAL,
            correlation_id=call_id,
            approved=False,
            reason=reason,
            skipped=skipped,
        )

    @classmethod
    def fail(cls, type_: SuspensionType, correlation_id: str | None, failure: str) -> ResumeCommand:
        """End the wait on ``correlation_id`` (of a ``type_`` suspension) by
        failing the turn with ``failure``: a worker ends it FAILED at once."""
        return cls(type=type_, correlation_id=correlation_id, failure=failure)

    @classmethod
    def child_completed(cls, child_turn_id: str, status: str, output: str | None) -> ResumeCommand:
        return cls(
            type=SuspensionType.CHILD_AGENT,
            correlation_id=child_turn_id,
            child_status=status,
            child_output=output,
        )

    @classmethod
    def retry(cls) -> ResumeCommand:
        return cls(type=SuspensionType.RETRY)

    def with_metadata(self, **metadata: Any) -> ResumeCommand:
        """The same command with more audit metadata (who, from where)."""
        return msgspec.structs.replace(self, metadata={**self.metadata, **metadata})


# ─── The turn ────────────────────────────────────────────────────────────────


class PendingCall(Record, frozen=True):
    """A tool call of the current TOOLS batch: saved before any of them
    runs; ``result`` is saved as soon as that one tool finishes."""

    call: ToolCall
    result: str | None = None
    approved: bool = False
    form_data: dict[str, Any] | None = None
    form_asked: bool = False
    """The tool raised FormRequired once: a second time is a protocol error."""

    def with_result(self, value: Any) -> PendingCall:
        """This call finished with ``value`` (as :func:`result_text`)."""
        return msgspec.structs.replace(self, result=result_text(value))


def result_text(value: Any) -> str:
    """A tool's result as the text a :class:`PendingCall` saves and the
    model is given: a string as it is, anything else as JSON (what JSON
    cannot encode, as its ``str``)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


class Audit(Record, frozen=True):
    """One resume, for the record: what, for which call, and who."""

    command: str
    correlation_id: str | None
    metadata: dict[str, Any]
    at: float


class ParentLink(Record, frozen=True):
    turn_id: str
    call_id: str
    root_turn_id: str


class Turn(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A turn as saved, frozen: :func:`server.runner.machine.advance` makes
    the turn each event leaves (and nothing else changes a field but
    :func:`~server.runner.machine.as_stored`). ``version`` is the store's
    compare-and-set counter; ``cancel_requested`` is a flag the store keeps
    apart from saves, so that no save can clear it. Its sequences are
    tuples, so nothing changes them in place."""

    id: str
    agent: str
    agent_version: str = "1"
    chat: str | None = None
    chat_turn: str | None = None
    """The AHP turn id in ``chat`` this turn answers (unique per chat only)."""
    chat_turn_stamp: str | None = None
    """The server's stamp on that AHP turn (``_meta.huddle.turn``: see
    server.core.policy.turn_stamp), when it has one: a chat truncated back may
    see its turn id again, and this turn shows only the chat turn stamped so."""
    status: TurnStatus = TurnStatus.READY
    phase: Phase = Phase.MODEL
    messages: tuple[ModelMessage, ...] = ()
    pending: tuple[PendingCall, ...] = ()
    iterations: int = 0
    tool_calls_made: int = 0
    retry_attempts: int = 0
    """Transient failures in a row (model or tool), for its backoff."""
    attempts: int = 0
    """Executions in a row that ended without a step saved: a worker that
    died or stalled (its turn taken over), or an error the runner could not
    turn into a result. Bounded by the runner's ``max_attempts``."""
    last_error: str | None = None
    """Why the latest failed attempt failed."""
    suspension: Suspension | None = None
    parent: ParentLink | None = None
    children: tuple[str, ...] = ()
    output: str | None = None
    error: str | None = None
    failing: str | None = None
    """Set by a resume that fails the turn (``ResumeCommand.fail``): its next
    execution ends it FAILED with this error, running nothing."""
    audit: tuple[Audit, ...] = ()
    version: int = 0
    cancel_requested: bool = False
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def is_blocked(self) -> bool:
        return self.status in BLOCKED

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def root_turn_id(self) -> str:
        return self.parent.root_turn_id if self.parent else self.id

    def call(self, call_id: str) -> PendingCall | None:
        return next((p for p in self.pending if p.call.id == call_id), None)


def copy_turn(turn: Turn) -> Turn:
    """A deep copy: a turn is frozen, but its lists are shared by the turns
    :func:`~server.runner.machine.advance` derives from it, so a store that
    holds one keeps a copy of its own."""
    return msgspec.json.decode(msgspec.json.encode(turn), type=Turn)
