"""The turn's state machine: every event accepted where the table says, each
with the fields it changes and the effects it asks for; every other pair
refused, the turn unchanged; and, over any sequence of events, a turn that
stays consistent."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.runner.errors import IllegalTransition
from server.runner.events import EventType
from server.runner.machine import (
    AttemptFailed,
    Blocked,
    CancelChildren,
    ChildStarted,
    Finished,
    FormAsked,
    MakeRunnable,
    ModelReplied,
    Notify,
    Resumed,
    RetryLater,
    Save,
    ShowFinished,
    Started,
    ToolFinished,
    ToolsCollected,
    Touched,
    TurnEvent,
    WakeParent,
    advance,
    as_stored,
)
from server.runner.turn import (
    Audit,
    FrozenForm,
    ModelMessage,
    ParentLink,
    PendingCall,
    Phase,
    Suspension,
    SuspensionType,
    ToolCall,
    Transition,
    Turn,
    TurnStatus,
)

S, P = TurnStatus, Phase
AT = 7.0
CALL = ToolCall(id="c1", name="lookup", arguments={"q": "x"})
FORM = FrozenForm(key="system", description="Which system", schema={"type": "object"})
ASKED = Suspension(
    type=SuspensionType.USER_INPUT, correlation_id="c1", resume_phase=P.TOOLS, form=FORM
)
RETRY = Suspension(type=SuspensionType.RETRY, resume_phase=P.MODEL, due_at=5.0)
MARK = Audit(command="USER_INPUT", correlation_id="c1", metadata={}, at=AT)
WAITS = {
    S.WAITING_FOR_USER: ASKED,
    S.WAITING_FOR_APPROVAL: Suspension(
        type=SuspensionType.TOOL_APPROVAL, correlation_id="c1", resume_phase=P.TOOLS
    ),
    S.WAITING_FOR_CHILD: Suspension(
        type=SuspensionType.CHILD_AGENT, correlation_id="t1.c1", resume_phase=P.TOOLS
    ),
    S.RETRY_SCHEDULED: RETRY,
}


def turn_in(status: TurnStatus, phase: Phase, *, cancel: bool = False) -> Turn:
    """A consistent turn in ``status`` and ``phase``: in TOOLS it has one
    pending call, blocked it holds the suspension of its status."""
    terminal = status in {S.COMPLETED, S.FAILED, S.CANCELLED}
    return Turn(
        id="t1",
        agent="helper",
        status=status,
        phase=P.FINISHED if terminal else phase,
        messages=(ModelMessage(role="user", content="Hi"),),
        pending=(PendingCall(call=CALL),) if phase == P.TOOLS else (),
        suspension=WAITS.get(status),
        cancel_requested=cancel,
        updated_at=1.0,
    )


STATES = {
    "READY/MODEL": turn_in(S.READY, P.MODEL),
    "READY/TOOLS": turn_in(S.READY, P.TOOLS),
    "RUNNING/MODEL": turn_in(S.RUNNING, P.MODEL),
    "RUNNING/TOOLS": turn_in(S.RUNNING, P.TOOLS),
    "WAITING_FOR_USER": turn_in(S.WAITING_FOR_USER, P.TOOLS),
    "WAITING_FOR_USER, cancel": turn_in(S.WAITING_FOR_USER, P.TOOLS, cancel=True),
    "WAITING_FOR_APPROVAL": turn_in(S.WAITING_FOR_APPROVAL, P.TOOLS),
    "WAITING_FOR_CHILD": turn_in(S.WAITING_FOR_CHILD, P.TOOLS),
    "RETRY_SCHEDULED": turn_in(S.RETRY_SCHEDULED, P.MODEL),
    "COMPLETED": turn_in(S.COMPLETED, P.FINISHED),
    "FAILED": turn_in(S.FAILED, P.FINISHED),
    "CANCELLED": turn_in(S.CANCELLED, P.FINISHED),
}

EVENTS: dict[str, TurnEvent] = {
    "Started": Started(at=AT),
    "Touched": Touched(at=AT),
    "AttemptFailed": AttemptFailed(at=AT, error="boom"),
    "ModelReplied with calls": ModelReplied(at=AT, text=None, tool_calls=(CALL,)),
    "ModelReplied without": ModelReplied(at=AT, text="Done.", tool_calls=()),
    "ToolFinished": ToolFinished(at=AT, call_id="c1", result="42", counted=True),
    "ToolsCollected": ToolsCollected(at=AT),
    "Blocked": Blocked(at=AT, suspension=ASKED),
    "RetryLater": RetryLater(at=AT, error="slow", due_at=9.0),
    "FormAsked": FormAsked(at=AT, call=PendingCall(call=CALL, form_asked=True), suspension=ASKED),
    "ChildStarted": ChildStarted(at=AT, call_id="c1", child_id="t1.c1", message="waiting"),
    "Resumed": Resumed(at=AT, mark=MARK),
    "Finished": Finished(at=AT, ending=Transition.FAIL, error="why"),
}

READY = {"READY/MODEL", "READY/TOOLS"}
RUNNING = {"RUNNING/MODEL", "RUNNING/TOOLS"}
BLOCKED = {
    "WAITING_FOR_USER",
    "WAITING_FOR_USER, cancel",
    "WAITING_FOR_APPROVAL",
    "WAITING_FOR_CHILD",
    "RETRY_SCHEDULED",
}
ACCEPTED_IN: dict[str, set[str]] = {
    "Started": READY | RUNNING | {"RETRY_SCHEDULED", "WAITING_FOR_USER, cancel"},
    "Touched": RUNNING,
    "AttemptFailed": READY | RUNNING | {"RETRY_SCHEDULED"},
    "ModelReplied with calls": {"RUNNING/MODEL"},
    "ModelReplied without": {"RUNNING/MODEL"},
    "ToolFinished": {"RUNNING/TOOLS"},
    "ToolsCollected": {"RUNNING/TOOLS"},
    "Blocked": READY | RUNNING,
    "RetryLater": READY | RUNNING,
    "FormAsked": {"RUNNING/TOOLS"},
    "ChildStarted": {"RUNNING/TOOLS"},
    "Resumed": BLOCKED,
    "Finished": RUNNING,
}
"""Written out by hand: the machine must accept exactly this."""

PAIRS = list(itertools.product(EVENTS, STATES))


def encoded(turn: Turn) -> bytes:
    return msgspec.json.encode(turn)


# ─── Accepted and refused ────────────────────────────────────────────────────


def test_the_table_names_every_event() -> None:
    assert set(ACCEPTED_IN) == set(EVENTS)
    assert {type(e) for e in EVENTS.values()} == set(TurnEvent.__args__)


@pytest.mark.parametrize(
    ("event", "state"), [p for p in PAIRS if p[1] in ACCEPTED_IN[p[0]]], ids=" in ".join
)
def test_an_allowed_event_changes_a_new_turn_and_stamps_its_time(event: str, state: str) -> None:
    turn = STATES[state]
    before = encoded(turn)
    after, _ = advance(turn, EVENTS[event])
    assert encoded(turn) == before  # the input is never changed
    assert after.updated_at == AT
    assert after.is_blocked == (after.suspension is not None)


@pytest.mark.parametrize(
    ("event", "state"), [p for p in PAIRS if p[1] not in ACCEPTED_IN[p[0]]], ids=" in ".join
)
def test_an_event_not_allowed_raises_and_changes_nothing(event: str, state: str) -> None:
    turn = STATES[state]
    before = encoded(turn)
    with pytest.raises(IllegalTransition) as refused:
        advance(turn, EVENTS[event])
    assert refused.value.turn_id == "t1"
    assert encoded(turn) == before


RUNNING_TOOLS = STATES["RUNNING/TOOLS"]
RUNNING_MODEL = STATES["RUNNING/MODEL"]
SUSPENDED = Notify(type=EventType.TURN_SUSPENDED, data={"type": "USER_INPUT"})


@pytest.mark.parametrize(
    ("turn", "event", "fields", "effects"),
    [
        pytest.param(
            STATES["RETRY_SCHEDULED"],
            Started(at=AT),
            {"status": S.RUNNING, "suspension": None},
            (),
            id="Started drops a due retry",
        ),
        pytest.param(
            STATES["WAITING_FOR_USER, cancel"],
            Started(at=AT),
            {"status": S.RUNNING, "suspension": None},
            (),
            id="Started runs a blocked turn to cancel it",
        ),
        pytest.param(RUNNING_MODEL, Touched(at=AT), {}, (Save(),), id="Touched saves"),
        pytest.param(
            RUNNING_MODEL,
            AttemptFailed(at=AT, error="boom"),
            {"attempts": 1, "last_error": "boom"},
            (),
            id="AttemptFailed counts",
        ),
        pytest.param(
            msgspec.structs.replace(RUNNING_MODEL, attempts=2, retry_attempts=1),
            ModelReplied(at=AT, text="Let me look.", tool_calls=(CALL,)),
            {
                "iterations": 1,
                "attempts": 0,
                "retry_attempts": 0,
                "phase": P.TOOLS,
                "pending": (PendingCall(call=CALL),),
                "messages": (
                    ModelMessage(role="user", content="Hi"),
                    ModelMessage(role="assistant", content="Let me look.", tool_calls=(CALL,)),
                ),
            },
            (Notify(type=EventType.MODEL_REPLIED, data={"tool_calls": 1}), Save()),
            id="ModelReplied with calls saves them pending",
        ),
        pytest.param(
            RUNNING_MODEL,
            ModelReplied(at=AT, text="Done.", tool_calls=()),
            {
                "iterations": 1,
                "status": S.COMPLETED,
                "phase": P.FINISHED,
                "output": "Done.",
                "messages": (
                    ModelMessage(role="user", content="Hi"),
                    ModelMessage(role="assistant", content="Done."),
                ),
            },
            (
                Notify(type=EventType.MODEL_REPLIED, data={"tool_calls": 0}),
                Save(),
                Notify(type=EventType.TURN_COMPLETED, data={"status": "COMPLETED", "error": None}),
                ShowFinished(),
            ),
            id="ModelReplied without calls completes",
        ),
        pytest.param(
            msgspec.structs.replace(RUNNING_TOOLS, attempts=1, tool_calls_made=2),
            ToolFinished(at=AT, call_id="c1", result="42", counted=True),
            {
                "pending": (PendingCall(call=CALL, result="42"),),
                "tool_calls_made": 3,
                "attempts": 0,
            },
            (Save(),),
            id="ToolFinished saves the result",
        ),
        pytest.param(
            RUNNING_TOOLS,
            ToolFinished(at=AT, call_id="c1", result="denied", counted=False),
            {"pending": (PendingCall(call=CALL, result="denied"),)},
            (Save(),),
            id="ToolFinished uncounted",
        ),
        pytest.param(
            msgspec.structs.replace(RUNNING_TOOLS, pending=(PendingCall(call=CALL, result="42"),)),
            ToolsCollected(at=AT),
            {
                "pending": (),
                "phase": P.MODEL,
                "messages": (
                    ModelMessage(role="user", content="Hi"),
                    ModelMessage(role="tool", content="42", tool_call_id="c1"),
                ),
            },
            (),
            id="ToolsCollected gives the results to the model",
        ),
        pytest.param(
            RUNNING_TOOLS,
            Blocked(at=AT, suspension=ASKED),
            {"status": S.WAITING_FOR_USER, "suspension": ASKED},
            (Save(), SUSPENDED),
            id="Blocked waits",
        ),
        pytest.param(
            msgspec.structs.replace(RUNNING_MODEL, retry_attempts=1),
            RetryLater(at=AT, error="slow", due_at=9.0),
            {
                "status": S.RETRY_SCHEDULED,
                "retry_attempts": 2,
                "suspension": Suspension(
                    type=SuspensionType.RETRY,
                    message="slow",
                    resume_phase=P.MODEL,
                    due_at=9.0,
                    metadata={"attempt": 2},
                ),
            },
            (
                Save(),
                Notify(type=EventType.TURN_SUSPENDED, data={"type": "RETRY"}),
                MakeRunnable(at=9.0),
            ),
            id="RetryLater schedules",
        ),
        pytest.param(
            RUNNING_TOOLS,
            FormAsked(at=AT, call=PendingCall(call=CALL, form_asked=True), suspension=ASKED),
            {
                "status": S.WAITING_FOR_USER,
                "suspension": ASKED,
                "pending": (PendingCall(call=CALL, form_asked=True),),
            },
            (Save(), SUSPENDED),
            id="FormAsked marks the call and waits",
        ),
        pytest.param(
            RUNNING_TOOLS,
            ChildStarted(at=AT, call_id="c1", child_id="t1.c1", message="waiting for helper"),
            {
                "status": S.WAITING_FOR_CHILD,
                "children": ("t1.c1",),
                "tool_calls_made": 1,
                "suspension": Suspension(
                    type=SuspensionType.CHILD_AGENT,
                    correlation_id="t1.c1",
                    message="waiting for helper",
                    resume_phase=P.TOOLS,
                ),
            },
            (Save(), Notify(type=EventType.TURN_SUSPENDED, data={"type": "CHILD_AGENT"})),
            id="ChildStarted counts the call and waits",
        ),
        pytest.param(
            STATES["WAITING_FOR_USER"],
            Resumed(at=AT, mark=MARK, call=PendingCall(call=CALL, form_data={"a": 1})),
            {
                "status": S.READY,
                "phase": P.TOOLS,
                "suspension": None,
                "audit": (MARK,),
                "pending": (PendingCall(call=CALL, form_data={"a": 1}),),
            },
            (),
            id="Resumed with an answered call",
        ),
        pytest.param(
            STATES["RETRY_SCHEDULED"],
            Resumed(at=AT, mark=MARK, failing="expired"),
            {"status": S.READY, "phase": P.MODEL, "suspension": None, "audit": (MARK,)}
            | {"failing": "expired"},
            (),
            id="Resumed to fail",
        ),
        pytest.param(
            STATES["WAITING_FOR_USER"],
            Resumed(at=AT, mark=MARK, message=ModelMessage(role="user", content="Blue")),
            {
                "status": S.READY,
                "suspension": None,
                "audit": (MARK,),
                "messages": (
                    ModelMessage(role="user", content="Hi"),
                    ModelMessage(role="user", content="Blue"),
                ),
            },
            (),
            id="Resumed with a plain answer",
        ),
        pytest.param(
            msgspec.structs.replace(RUNNING_TOOLS, children=("t1.c1",)),
            Finished(at=AT, ending=Transition.CANCEL),
            {"status": S.CANCELLED, "phase": P.FINISHED},
            (
                Save(),
                Notify(type=EventType.TURN_CANCELLED, data={"status": "CANCELLED", "error": None}),
                ShowFinished(),
                CancelChildren(children=("t1.c1",)),
            ),
            id="Finished by a cancel cancels the children",
        ),
        pytest.param(
            msgspec.structs.replace(
                RUNNING_MODEL, parent=ParentLink(turn_id="p", call_id="c1", root_turn_id="p")
            ),
            Finished(at=AT, ending=Transition.EXCEED_BUDGET, error="over"),
            {"status": S.BUDGET_EXCEEDED, "phase": P.FINISHED, "error": "over"},
            (
                Save(),
                Notify(
                    type=EventType.TURN_FAILED, data={"status": "BUDGET_EXCEEDED", "error": "over"}
                ),
                ShowFinished(),
                WakeParent(),
            ),
            id="Finished child wakes its parent",
        ),
    ],
)
def test_an_event_changes_exactly_its_fields_and_asks_for_its_effects(
    turn: Turn, event: TurnEvent, fields: dict[str, object], effects: tuple[object, ...]
) -> None:
    after, asked = advance(turn, event)
    assert after == msgspec.structs.replace(turn, updated_at=AT, **fields)
    assert asked == effects


def test_finished_refuses_a_transition_that_ends_nothing() -> None:
    with pytest.raises(IllegalTransition, match="no transition RUN from status RUNNING"):
        advance(RUNNING_MODEL, Finished(at=AT, ending=Transition.RUN))


def test_a_refusal_names_the_event_and_where_the_turn_is() -> None:
    with pytest.raises(IllegalTransition) as refused:
        advance(RUNNING_MODEL, ToolsCollected(at=AT))
    assert str(refused.value) == (
        "turn t1: no transition ToolsCollected from status RUNNING in MODEL (a bug in the runner)"
    )


def test_as_stored_sets_only_the_stores_bookkeeping() -> None:
    stored = as_stored(RUNNING_MODEL, version=4, cancel_requested=True)
    assert stored == msgspec.structs.replace(RUNNING_MODEL, version=4, cancel_requested=True)


# ─── Only the machine writes a turn ──────────────────────────────────────────


def test_a_turn_is_frozen() -> None:
    with pytest.raises(AttributeError):
        RUNNING_MODEL.status = S.COMPLETED  # type: ignore[misc]
    with pytest.raises(AttributeError):
        RUNNING_MODEL.messages.append(ModelMessage(role="user", content="late"))  # type: ignore[attr-defined]


def sequences_are_tuples(turn: Turn) -> bool:
    """A turn's sequences (and a message's calls) are tuples: nothing can
    change them in place, so only the machine changes a turn."""
    lists = (turn.messages, turn.pending, turn.children, turn.audit)
    calls = [m.tool_calls for m in turn.messages if m.tool_calls is not None]
    return all(isinstance(seq, tuple) for seq in (*lists, *calls))


def test_nothing_in_the_server_but_the_machine_replaces_a_turns_fields() -> None:
    """``msgspec.structs.replace`` of something named a turn (the one way
    left to change a frozen turn) is the machine's alone."""
    found = []
    for path in Path("server").rglob("*.py"):
        if path.as_posix() == "server/runner/machine.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "replace"
                and node.args
                and isinstance(node.args[0], ast.Name)
                and "turn" in node.args[0].id.lower()
            ):
                found.append(f"{path}:{node.lineno}")
    assert found == []


# ─── Any sequence of events ──────────────────────────────────────────────────

SUSPENSIONS = st.sampled_from([ASKED, RETRY, *WAITS.values()])
AT_TIMES = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)

ANY_EVENT: st.SearchStrategy[TurnEvent] = st.one_of(
    st.builds(Started, at=AT_TIMES),
    st.builds(Touched, at=AT_TIMES),
    st.builds(AttemptFailed, at=AT_TIMES, error=st.text(max_size=5)),
    st.builds(
        ModelReplied,
        at=AT_TIMES,
        text=st.none() | st.text(max_size=5),
        tool_calls=st.lists(st.just(CALL), max_size=1),
    ),
    st.builds(
        ToolFinished, at=AT_TIMES, call_id=st.just("c1"), result=st.just("r"), counted=st.booleans()
    ),
    st.builds(ToolsCollected, at=AT_TIMES),
    st.builds(Blocked, at=AT_TIMES, suspension=SUSPENSIONS),
    st.builds(RetryLater, at=AT_TIMES, error=st.just("slow"), due_at=AT_TIMES),
    st.builds(
        FormAsked,
        at=AT_TIMES,
        call=st.just(PendingCall(call=CALL, form_asked=True)),
        suspension=st.just(ASKED),
    ),
    st.builds(
        ChildStarted,
        at=AT_TIMES,
        call_id=st.just("c1"),
        child_id=st.just("t1.c1"),
        message=st.just("w"),
    ),
    st.builds(Resumed, at=AT_TIMES, mark=st.just(MARK), failing=st.none() | st.just("gone")),
    st.builds(Finished, at=AT_TIMES, ending=st.sampled_from(list(Transition)), error=st.none()),
)


@given(
    start=st.sampled_from(sorted(STATES)),
    cancel=st.booleans(),
    events=st.lists(ANY_EVENT, max_size=30),
)
def test_any_sequence_of_events_keeps_the_turn_consistent(
    start: str, cancel: bool, events: list[TurnEvent]
) -> None:
    turn = as_stored(STATES[start], version=1, cancel_requested=cancel)
    for event in events:
        before = encoded(turn)
        was_terminal = turn.is_terminal
        try:
            after, effects = advance(turn, event)
        except IllegalTransition:
            assert encoded(turn) == before
            continue
        assert not was_terminal, "a terminal turn accepts nothing"
        assert encoded(turn) == before  # never changed in place
        assert advance(turn, event) == (after, effects)  # deterministic
        assert after.updated_at == event.at
        assert after.is_blocked == (after.suspension is not None)
        assert after.is_terminal == (after.phase == P.FINISHED)
        assert sequences_are_tuples(after)
        if after.phase == P.TOOLS:
            assert after.pending, "a turn in TOOLS has calls to run"
        assert (after.version, after.cancel_requested) == (turn.version, turn.cancel_requested)
        if after.is_terminal:
            assert Save() in effects
            assert effects.index(Save()) < effects.index(ShowFinished())
        if after.is_blocked and not turn.is_blocked:
            assert effects[:2] == (
                Save(),
                Notify(
                    type=EventType.TURN_SUSPENDED,
                    data={"type": after.suspension.type.value if after.suspension else ""},
                ),
            )
        turn = after
