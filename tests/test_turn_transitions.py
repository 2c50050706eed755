"""The turn's status table: every allowed transition, every refused one, and
the machine's events that take them."""

from __future__ import annotations

import itertools

import pytest

from server.errors import HuddleError, InternalError
from server.runner.errors import IllegalTransition
from server.runner.machine import Blocked, Finished, Resumed, Started, advance
from server.runner.runner import Runner
from server.runner.turn import (
    TRANSITIONS,
    Audit,
    Phase,
    Suspension,
    SuspensionType,
    Transition,
    Turn,
    TurnStatus,
    copy_turn,
    next_status,
)
from server.runner.turn_store import MemoryTurnStore
from tests.runner_kit import Clock, agent, say, scripted

S, T = TurnStatus, Transition

ALLOWED: list[tuple[TurnStatus, Transition, TurnStatus]] = [
    (S.READY, T.RUN, S.RUNNING),
    (S.READY, T.WAIT_FOR_USER, S.WAITING_FOR_USER),
    (S.READY, T.WAIT_FOR_APPROVAL, S.WAITING_FOR_APPROVAL),
    (S.READY, T.WAIT_FOR_CHILD, S.WAITING_FOR_CHILD),
    (S.READY, T.SCHEDULE_RETRY, S.RETRY_SCHEDULED),
    (S.RUNNING, T.RUN, S.RUNNING),
    (S.RUNNING, T.WAIT_FOR_USER, S.WAITING_FOR_USER),
    (S.RUNNING, T.WAIT_FOR_APPROVAL, S.WAITING_FOR_APPROVAL),
    (S.RUNNING, T.WAIT_FOR_CHILD, S.WAITING_FOR_CHILD),
    (S.RUNNING, T.SCHEDULE_RETRY, S.RETRY_SCHEDULED),
    (S.RUNNING, T.COMPLETE, S.COMPLETED),
    (S.RUNNING, T.FAIL, S.FAILED),
    (S.RUNNING, T.CANCEL, S.CANCELLED),
    (S.RUNNING, T.REACH_MAX_ITERATIONS, S.MAX_ITERATIONS_REACHED),
    (S.RUNNING, T.EXCEED_BUDGET, S.BUDGET_EXCEEDED),
    (S.WAITING_FOR_USER, T.RESUME, S.READY),
    (S.WAITING_FOR_USER, T.RUN_TO_CANCEL, S.RUNNING),
    (S.WAITING_FOR_APPROVAL, T.RESUME, S.READY),
    (S.WAITING_FOR_APPROVAL, T.RUN_TO_CANCEL, S.RUNNING),
    (S.WAITING_FOR_CHILD, T.RESUME, S.READY),
    (S.WAITING_FOR_CHILD, T.RUN_TO_CANCEL, S.RUNNING),
    (S.RETRY_SCHEDULED, T.RESUME, S.READY),
    (S.RETRY_SCHEDULED, T.RUN, S.RUNNING),
    (S.RETRY_SCHEDULED, T.RUN_TO_CANCEL, S.RUNNING),
]
"""Written out by hand, not derived from the table: the table must say
exactly this."""

REFUSED = [
    (status, transition)
    for status, transition in itertools.product(TurnStatus, Transition)
    if (status, transition) not in {(s, t) for s, t, _ in ALLOWED}
]

SUSPENSIONS = {
    SuspensionType.USER_INPUT: Suspension(
        type=SuspensionType.USER_INPUT, correlation_id="c1", resume_phase=Phase.TOOLS
    ),
    SuspensionType.TOOL_APPROVAL: Suspension(
        type=SuspensionType.TOOL_APPROVAL, correlation_id="c1", resume_phase=Phase.TOOLS
    ),
    SuspensionType.CHILD_AGENT: Suspension(
        type=SuspensionType.CHILD_AGENT, correlation_id="t1.c1", resume_phase=Phase.TOOLS
    ),
    SuspensionType.RETRY: Suspension(
        type=SuspensionType.RETRY, resume_phase=Phase.MODEL, due_at=5.0
    ),
}
WAITING = {
    SuspensionType.USER_INPUT: S.WAITING_FOR_USER,
    SuspensionType.TOOL_APPROVAL: S.WAITING_FOR_APPROVAL,
    SuspensionType.CHILD_AGENT: S.WAITING_FOR_CHILD,
    SuspensionType.RETRY: S.RETRY_SCHEDULED,
}


def turn_in(status: TurnStatus, *, cancel_requested: bool = False) -> Turn:
    """A turn in ``status``, holding a suspension when it is blocked."""
    suspension = next((s for t, s in SUSPENSIONS.items() if WAITING[t] == status), None)
    return Turn(
        id="t1",
        agent="helper",
        status=status,
        phase=Phase.TOOLS if suspension else Phase.MODEL,
        suspension=suspension,
        cancel_requested=cancel_requested,
    )


# ─── The table ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("status", "transition", "to"), ALLOWED, ids=str)
def test_the_table_allows(status: TurnStatus, transition: Transition, to: TurnStatus) -> None:
    assert next_status("t1", status, transition) == to


@pytest.mark.parametrize(("status", "transition"), REFUSED, ids=str)
def test_the_table_refuses_naming_status_and_transition(
    status: TurnStatus, transition: Transition
) -> None:
    with pytest.raises(IllegalTransition) as refused:
        next_status("t1", status, transition)
    assert (refused.value.turn_id, refused.value.status, refused.value.transition) == (
        "t1",
        status,
        transition,
    )
    assert str(refused.value) == (
        f"turn t1: no transition {transition} from status {status} (a bug in the runner)"
    )


def test_the_table_lists_every_status_and_nothing_else() -> None:
    assert set(TRANSITIONS) == set(TurnStatus)
    assert sum(len(way_out) for way_out in TRANSITIONS.values()) == len(ALLOWED)


def test_an_illegal_transition_is_our_bug_not_a_huddle_error() -> None:
    error = IllegalTransition("t1", S.COMPLETED, T.RUN)
    assert isinstance(error, InternalError)
    assert not isinstance(error, HuddleError)  # no handler of peers' errors swallows it


@pytest.mark.parametrize("status", list(TurnStatus), ids=str)
def test_a_turn_is_terminal_exactly_when_its_status_has_no_way_out(status: TurnStatus) -> None:
    turn = turn_in(status)
    assert turn.is_terminal == (not any(s == status for s, _, _ in ALLOWED))
    if turn.is_terminal:
        assert not turn.is_blocked


# ─── The transitions through the machine ─────────────────────────────────────


def start(turn: Turn) -> Turn:
    return advance(turn, Started(at=1.0))[0]


def block(turn: Turn, suspension: Suspension) -> Turn:
    return advance(turn, Blocked(at=1.0, suspension=suspension))[0]


def unblock(turn: Turn) -> Turn:
    return advance(turn, Resumed(at=1.0, mark=MARK))[0]


def finish(turn: Turn, ending: Transition, error: str | None = None) -> Turn:
    return advance(turn, Finished(at=1.0, ending=ending, error=error))[0]


MARK = Audit(command="RETRY", correlation_id=None, metadata={}, at=1.0)


@pytest.mark.parametrize("status", [S.READY, S.RUNNING, S.RETRY_SCHEDULED], ids=str)
def test_start_runs_the_turn_and_drops_a_due_retry(status: TurnStatus) -> None:
    turn = start(turn_in(status))
    assert (turn.status, turn.suspension) == (S.RUNNING, None)


@pytest.mark.parametrize(
    "status",
    [S.WAITING_FOR_USER, S.WAITING_FOR_APPROVAL, S.WAITING_FOR_CHILD, S.RETRY_SCHEDULED],
    ids=str,
)
def test_start_runs_a_blocked_turn_whose_cancel_was_requested(status: TurnStatus) -> None:
    turn = start(turn_in(status, cancel_requested=True))
    assert (turn.status, turn.suspension) == (S.RUNNING, None)


@pytest.mark.parametrize(
    "status", [S.WAITING_FOR_USER, S.WAITING_FOR_APPROVAL, S.WAITING_FOR_CHILD], ids=str
)
def test_start_refuses_a_waiting_turn_and_leaves_it_waiting(status: TurnStatus) -> None:
    turn = turn_in(status)
    before = copy_turn(turn)
    with pytest.raises(IllegalTransition, match=f"no transition RUN from status {status}"):
        start(turn)
    assert turn == before


@pytest.mark.parametrize("status", [S.READY, S.RUNNING], ids=str)
@pytest.mark.parametrize("kind", list(SuspensionType), ids=str)
def test_block_waits_on_the_suspension_by_its_type(
    status: TurnStatus, kind: SuspensionType
) -> None:
    turn = block(turn_in(status), SUSPENSIONS[kind])
    assert (turn.status, turn.suspension) == (WAITING[kind], SUSPENSIONS[kind])


def test_block_refuses_a_turn_that_waits_already() -> None:
    turn = turn_in(S.WAITING_FOR_USER)
    before = copy_turn(turn)
    with pytest.raises(IllegalTransition, match="WAIT_FOR_APPROVAL from status WAITING_FOR_USER"):
        block(turn, SUSPENSIONS[SuspensionType.TOOL_APPROVAL])
    assert turn == before


@pytest.mark.parametrize("kind", list(SuspensionType), ids=str)
def test_unblock_makes_the_turn_ready_in_the_suspensions_resume_phase(
    kind: SuspensionType,
) -> None:
    turn = unblock(turn_in(WAITING[kind]))
    assert (turn.status, turn.phase, turn.suspension) == (
        S.READY,
        SUSPENSIONS[kind].resume_phase,
        None,
    )


@pytest.mark.parametrize("status", [S.READY, S.RUNNING, S.COMPLETED], ids=str)
def test_unblock_refuses_a_turn_that_does_not_wait(status: TurnStatus) -> None:
    turn = turn_in(status)
    before = copy_turn(turn)
    with pytest.raises(IllegalTransition, match=f"no transition RESUME from status {status}"):
        unblock(turn)
    assert turn == before


@pytest.mark.parametrize(
    ("ending", "to"),
    [(t, to) for s, t, to in ALLOWED if s == S.RUNNING and TRANSITIONS[to] == {}],
    ids=str,
)
def test_finish_ends_a_running_turn(ending: Transition, to: TurnStatus) -> None:
    turn = finish(turn_in(S.RUNNING), ending, "why")
    assert (turn.status, turn.phase, turn.error, turn.suspension) == (
        to,
        Phase.FINISHED,
        "why",
        None,
    )
    assert turn.is_terminal


@pytest.mark.parametrize(
    ("status", "ending"),
    [(S.READY, T.COMPLETE), (S.WAITING_FOR_USER, T.FAIL), (S.COMPLETED, T.CANCEL)],
    ids=str,
)
def test_finish_refuses_a_turn_that_is_not_running(status: TurnStatus, ending: Transition) -> None:
    turn = turn_in(status)
    before = copy_turn(turn)
    with pytest.raises(IllegalTransition, match=f"no transition {ending} from status {status}"):
        finish(turn, ending)
    assert turn == before


@pytest.mark.parametrize("transition", [T.RUN, T.RESUME, T.WAIT_FOR_USER], ids=str)
def test_finish_refuses_a_transition_that_ends_nothing(transition: Transition) -> None:
    turn = turn_in(S.RUNNING)
    before = copy_turn(turn)
    with pytest.raises(IllegalTransition, match=f"no transition {transition} from status RUNNING"):
        finish(turn, transition)
    assert turn == before


# ─── Through the runner ──────────────────────────────────────────────────────


async def test_suspending_a_waiting_turn_again_is_refused_and_saves_nothing() -> None:
    helper = agent(scripted(say("Hello.")))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    turn = await runner.store.create(runner.new_turn(helper, "Hi", turn_id="t1"))
    waiting = await runner.suspend(turn, Suspension.user_input("Which order?"))
    with pytest.raises(IllegalTransition, match="WAIT_FOR_USER from status WAITING_FOR_USER"):
        await runner.suspend(waiting, Suspension.user_input("And which day?"))
    assert await runner.store.load("t1") == waiting
