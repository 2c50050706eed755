"""Resuming a waiting turn: only the command the suspension waits for, only
once, and never a terminal turn. A refused resume changes nothing saved."""

from __future__ import annotations

import asyncio
import time

import pytest

from server.errors import StoreUnavailable
from server.runner.agent import require_approval_for
from server.runner.events import EventType, RunnerEvent
from server.runner.runner import ResumeRejected, Runner
from server.runner.turn import (
    Audit,
    ModelMessage,
    ResumeCommand,
    Suspension,
    SuspensionType,
    Turn,
    TurnStatus,
)
from server.runner.turn_store import MemoryTurnStore
from server.runner.worker import Worker
from tests.runner_kit import (
    GOOD_DETAILS,
    Clock,
    RendezvousStore,
    Runs,
    agent,
    call,
    say,
    scripted,
    use,
)


async def waiting_for_approval(
    store: MemoryTurnStore | None = None, clock: Clock | None = None
) -> tuple[Runner, Runs]:
    """Turn ``t1`` waits for a person to approve call ``c1`` of ``deploy``."""
    runs = Runs()
    model = scripted(use(call("c1", "deploy", env="prod")), say("Deployed."))
    helper = agent(model, runs.tool("deploy"), approval_policy=require_approval_for("deploy"))
    runner = Runner(store or MemoryTurnStore(), [helper], clock=clock or Clock())
    turn = await runner.run(helper, "Deploy it", turn_id="t1")
    assert turn.status == TurnStatus.WAITING_FOR_APPROVAL
    return runner, runs


MISMATCHED = [
    pytest.param(ResumeCommand.user_input("c1", GOOD_DETAILS), id="wrong-type"),
    pytest.param(ResumeCommand.approve_tool("c2"), id="wrong-correlation-id"),
    pytest.param(ResumeCommand.reject_tool("c2"), id="rejection-of-another-call"),
    pytest.param(ResumeCommand.retry(), id="retry-while-a-person-decides"),
    pytest.param(ResumeCommand.child_completed("t1.c1", "COMPLETED", "x"), id="child-completion"),
    pytest.param(ResumeCommand.user_input("yes, go"), id="plain-text-answer"),
]


@pytest.mark.parametrize("how", ["resume", "submit_resume"])
@pytest.mark.parametrize("command", MISMATCHED)
async def test_a_mismatched_resume_is_refused_and_changes_nothing(
    command: ResumeCommand, how: str
) -> None:
    runner, runs = await waiting_for_approval()
    before = await runner.store.load("t1")
    with pytest.raises(ResumeRejected) as refused:
        await getattr(runner, how)("t1", command)
    assert refused.value.turn_id == "t1"
    assert await runner.store.load("t1") == before
    assert not await Worker(runner).step()  # nothing was queued either
    assert runs.count("deploy") == 0


async def test_a_duplicate_resume_after_the_first_succeeded_is_refused_and_changes_nothing() -> (
    None
):
    runner, _ = await waiting_for_approval()
    await runner.submit_resume("t1", ResumeCommand.approve_tool("c1"))
    before = await runner.store.load("t1")
    with pytest.raises(ResumeRejected, match="duplicate"):
        await runner.submit_resume("t1", ResumeCommand.approve_tool("c1"))
    assert await runner.store.load("t1") == before


@pytest.mark.parametrize(
    "late",
    [
        pytest.param(ResumeCommand.approve_tool("c1"), id="approval-again"),
        pytest.param(ResumeCommand.reject_tool("c1"), id="rejection-after-approval"),
        pytest.param(ResumeCommand.user_input("one more thing"), id="plain-text-answer"),
    ],
)
async def test_a_late_resume_of_a_terminal_turn_reopens_nothing(late: ResumeCommand) -> None:
    runner, runs = await waiting_for_approval()
    done = await runner.resume("t1", ResumeCommand.approve_tool("c1"))
    assert done.status == TurnStatus.COMPLETED
    with pytest.raises(ResumeRejected, match="late"):
        await runner.resume("t1", late)
    assert await runner.store.load("t1") == done
    assert runs.count("deploy") == 1


async def test_of_two_concurrent_submit_resumes_for_one_suspension_exactly_one_succeeds() -> None:
    store = RendezvousStore()
    runner, runs = await waiting_for_approval(store)
    store.arm(2)  # both load the waiting turn before either saves
    results = await asyncio.gather(
        runner.submit_resume("t1", ResumeCommand.approve_tool("c1").with_metadata(by="ana")),
        runner.submit_resume("t1", ResumeCommand.approve_tool("c1").with_metadata(by="ben")),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, Turn)]
    losers = [r for r in results if isinstance(r, ResumeRejected)]
    assert (len(winners), len(losers)) == (1, 1)
    assert "duplicate" in losers[0].reason  # the loser saw the winner's save and re-checked
    assert (await runner.store.load("t1")).audit == winners[0].audit
    assert await Worker(runner).step()
    assert runs.count("deploy") == 1


async def test_submit_resume_saves_the_turn_as_runnable_and_a_worker_continues_it() -> None:
    runner, runs = await waiting_for_approval()
    submitted = await runner.submit_resume("t1", ResumeCommand.approve_tool("c1"))
    assert (submitted.status, runs.count("deploy")) == (TurnStatus.READY, 0)
    assert await Worker(runner).step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED
    assert runs.count("deploy") == 1


async def test_resume_metadata_is_kept_on_the_turns_audit() -> None:
    clock = Clock()
    runner, _ = await waiting_for_approval(clock=clock)
    command = ResumeCommand.approve_tool("c1").with_metadata(submittedBy="ana", source="web")
    done = await runner.resume("t1", command)
    assert done.audit == (
        Audit(
            command="TOOL_APPROVAL",
            correlation_id="c1",
            metadata={"submittedBy": "ana", "source": "web"},
            at=clock.now,
        ),
    )


# ─── The plain-text path ─────────────────────────────────────────────────────


QUESTION = "text:0123abcd"


async def plain_text_waiting() -> tuple[Runner, list[list[ModelMessage]]]:
    """Turn ``t1`` suspended by hand on a plain-text question, ``QUESTION``."""
    model = scripted(say("Order O-1001 ships today."), say("And it ships on Monday."))
    helper = agent(model)
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    turn = await runner.store.create(runner.new_turn(helper, "Where is my order?", turn_id="t1"))
    asked = Suspension.user_input("Which order number?", question_id=QUESTION)
    waiting = await runner.suspend(turn, asked)
    assert waiting.status == TurnStatus.WAITING_FOR_USER
    assert waiting.suspension == Suspension(
        type=SuspensionType.USER_INPUT, correlation_id=QUESTION, message="Which order number?"
    )
    return runner, model.conversations


def test_every_plain_text_question_gets_a_correlation_id_of_its_own() -> None:
    first, second = Suspension.user_input("Which order?"), Suspension.user_input("Which order?")
    assert first.correlation_id is not None
    assert second.correlation_id is not None
    assert first.correlation_id != second.correlation_id
    assert first.correlation_id.startswith("text:")


async def test_a_plain_text_suspension_resumed_by_content_adds_a_user_message() -> None:
    runner, conversations = await plain_text_waiting()
    done = await runner.resume("t1", ResumeCommand.user_input("O-1001", question=QUESTION))
    assert done.status == TurnStatus.COMPLETED
    assert conversations[-1][-1] == ModelMessage(role="user", content="O-1001")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(ResumeCommand.user_input("O-1001"), id="without-its-question"),
        pytest.param(
            ResumeCommand.user_input("O-1001", question="text:99999999"), id="to-another-question"
        ),
        pytest.param(ResumeCommand.user_input("c1", GOOD_DETAILS), id="form-data"),
    ],
)
async def test_a_plain_text_suspension_refuses_an_answer_that_is_not_to_it(
    answer: ResumeCommand,
) -> None:
    runner, _ = await plain_text_waiting()
    before = await runner.store.load("t1")
    with pytest.raises(ResumeRejected):
        await runner.resume("t1", answer)
    assert await runner.store.load("t1") == before


async def test_a_late_answer_to_a_plain_text_question_never_resumes_the_next_one() -> None:
    runner, conversations = await plain_text_waiting()
    first = ResumeCommand.user_input("O-1001", question=QUESTION)
    ready = await runner.submit_resume("t1", first)
    # Custom control flow asks a second question before the turn runs on.
    waiting = await runner.suspend(ready, Suspension.user_input("Which day?"))
    before = await runner.store.load("t1")
    for late in (first, ResumeCommand.user_input("O-1001")):  # a duplicate, a stale client
        with pytest.raises(ResumeRejected):
            await runner.submit_resume("t1", late)
    assert await runner.store.load("t1") == before
    assert waiting.suspension is not None
    answer = ResumeCommand.user_input("Monday", question=waiting.suspension.correlation_id)
    finished = await runner.resume("t1", answer)
    assert finished.status == TurnStatus.COMPLETED
    assert [m.content for m in conversations[-1] if m.role == "user"][-2:] == ["O-1001", "Monday"]


class SavedUnanswered(MemoryTurnStore):
    """A turn store that saves the first runnable turn and then fails as if
    its answer had been lost on the way (a Redis reply timed out), and
    refuses the next ``refusals`` loads (Redis still away)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.lost, self.refusals = False, refusals

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        saved = await super().save_runnable(turn, now, started=started)
        if not self.lost:
            self.lost = True
            raise StoreUnavailable("the store's answer was lost")
        return saved

    async def load(self, turn_id: str) -> Turn:
        if self.lost and self.refusals > 0:
            self.refusals -= 1
            raise StoreUnavailable("still away")
        return await super().load(turn_id)


async def test_a_resume_saved_while_its_answer_was_lost_is_told_to_the_listeners() -> None:
    # The turn resumed (a worker ran it on) but the audit, which listens for
    # the runner's resumes, never heard of it: nothing says who approved.
    store = SavedUnanswered(refusals=3)
    runner, runs = await waiting_for_approval(store)
    heard: list[RunnerEvent] = []
    runner.listeners.append(heard.append)
    with pytest.raises(StoreUnavailable):
        await runner.submit_resume("t1", ResumeCommand.approve_tool("c1"))
    await runner.settled(time.monotonic() + 10)

    assert store.refusals == 0
    [resumed] = [event for event in heard if event.type == EventType.TURN_RESUMED]
    assert resumed.turn_id == "t1"
    assert resumed.data["resume"].command == "TOOL_APPROVAL"
    assert await Worker(runner).step()  # it was handed on all the same: it runs
    assert runs.count("deploy") == 1


class NotSaved(MemoryTurnStore):
    """A turn store that refuses the first runnable save (Redis down)."""

    refused = False

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        if not self.refused:
            self.refused = True
            raise StoreUnavailable("down")
        return await super().save_runnable(turn, now, started=started)


async def test_a_resume_whose_save_did_not_land_is_told_to_no_one() -> None:
    runner, _ = await waiting_for_approval(NotSaved())
    heard: list[RunnerEvent] = []
    runner.listeners.append(heard.append)
    with pytest.raises(StoreUnavailable):
        await runner.submit_resume("t1", ResumeCommand.approve_tool("c1"))
    await runner.settled(time.monotonic() + 10)

    assert heard == []
    assert (await runner.store.load("t1")).status == TurnStatus.WAITING_FOR_APPROVAL
