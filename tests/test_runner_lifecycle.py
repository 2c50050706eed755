"""A turn's life apart from people: cancellation, retries with backoff,
limits, and the events listeners see on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from server.runner.agent import Tool, TransientError, require_approval_for
from server.runner.context import ToolContext
from server.runner.events import EventType, RunnerEvent
from server.runner.model import ModelReply
from server.runner.runner import REQUEST_USER_INPUT, ResumeRejected, Runner
from server.runner.turn import ModelMessage, Phase, ResumeCommand, TurnStatus
from server.runner.turn_store import MemoryTurnStore
from server.runner.worker import Worker
from tests.runner_kit import (
    DETAILS,
    WITHIN,
    Clock,
    Model,
    RenewalCountingStore,
    Runs,
    agent,
    call,
    say,
    scripted,
    use,
)

# ─── Cancellation ────────────────────────────────────────────────────────────


class Export:
    """``export`` starts (``started`` set), waits until the test lets it go,
    then reports whether it saw a cancel request."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.let_go = asyncio.Event()
        self.saw_cancel: list[bool] = []

    def tool(self) -> Tool:
        async def export(arguments: dict[str, Any]) -> str:
            self.started.set()
            async with asyncio.timeout(WITHIN):
                await self.let_go.wait()
            self.saw_cancel.append(ToolContext.current().cancellation_requested)
            return "stopped early" if self.saw_cancel[-1] else "exported"

        return Tool(name="export", description="Export everything", function=export)


async def exporting(
    export: Export, store: MemoryTurnStore, **options: Any
) -> tuple[Runner, Model, asyncio.Task[Any]]:
    """Turn ``t1`` runs in a task of the returned runner, inside ``export``."""
    model = scripted(use(call("c1", "export")), say("Exported."))
    runner = Runner(store, [agent(model, export.tool())], clock=Clock(), **options)
    task = asyncio.create_task(runner.run("helper", "Export it", turn_id="t1"))
    async with asyncio.timeout(WITHIN):
        await export.started.wait()
    return runner, model, task


def elsewhere(runner: Runner) -> Runner:
    """Another process's runner on the same store."""
    return Runner(runner.store, runner.agents.values(), clock=Clock())


async def test_a_running_tool_sees_a_cancel_made_through_its_own_runner_at_once() -> None:
    export = Export()
    # The default lease: its keeper would not look at the flag for seconds.
    runner, _, task = await exporting(export, MemoryTurnStore())
    await runner.cancel("t1")
    export.let_go.set()
    await task
    assert export.saw_cancel == [True]


async def test_a_running_tool_sees_a_cancel_made_elsewhere_when_the_lease_keeper_looks() -> None:
    export = Export()
    store = RenewalCountingStore()
    # A small lease, so that the keeper looks often; the clock stands still,
    # so the lease never expires.
    runner, _, task = await exporting(export, store, lease_seconds=0.03)
    await elsewhere(runner).cancel("t1")
    await store.wait_for_renewals(2)  # the keeper read the flag after the first
    export.let_go.set()
    await task
    assert export.saw_cancel == [True]


async def test_a_cancelled_running_turn_ends_cancelled_without_asking_the_model_again() -> None:
    export = Export()
    runner, model, task = await exporting(export, MemoryTurnStore())
    await elsewhere(runner).cancel("t1")
    export.let_go.set()
    ended = await task
    assert ended.status == TurnStatus.CANCELLED
    assert model.calls == 1


async def test_a_save_of_a_turn_loaded_before_the_cancel_keeps_the_flag() -> None:
    runner = Runner(MemoryTurnStore(), [agent(scripted(say("Hi.")))], clock=Clock())
    loaded = await runner.store.create(runner.new_turn("helper", "Hi", turn_id="t1"))
    await runner.cancel("t1")
    saved = await runner.store.save(loaded)
    assert saved.cancel_requested
    assert (await runner.store.load("t1")).cancel_requested


async def test_a_cancelled_waiting_turn_is_ended_by_a_worker_and_resumes_no_more() -> None:
    runs = Runs()
    model = scripted(use(call("c1", "deploy")), say("Deployed."))
    helper = agent(model, runs.tool("deploy"), approval_policy=require_approval_for("deploy"))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    await runner.run(helper, "Deploy it", turn_id="t1")
    await runner.cancel("t1")
    assert await Worker(runner).step()
    assert (await runner.store.load("t1")).status == TurnStatus.CANCELLED
    with pytest.raises(ResumeRejected):
        await runner.resume("t1", ResumeCommand.approve_tool("c1"))
    assert runs.count("deploy") == 0


# ─── Retries ─────────────────────────────────────────────────────────────────

BACKOFF = 2.0


async def scheduled_retry(failures: int = 1, **options: Any) -> tuple[Runner, Clock, Model]:
    """Turn ``t1``, whose model failed ``failures`` times in a row and which
    is scheduled to try again in BACKOFF seconds."""
    clock = Clock()
    model = scripted(say("Hello."), failures=failures)
    helper = agent(model, retry_backoff=BACKOFF, **options)
    runner = Runner(MemoryTurnStore(), [helper], clock=clock)
    turn = await runner.run(helper, "Hi", turn_id="t1")
    assert turn.status == TurnStatus.RETRY_SCHEDULED
    return runner, clock, model


async def test_a_transient_model_error_schedules_a_retry_with_backoff() -> None:
    runner, clock, _ = await scheduled_retry()
    turn = await runner.store.load("t1")
    assert turn.suspension is not None
    assert turn.suspension.due_at == clock.now + BACKOFF
    assert turn.retry_attempts == 1


async def test_the_backoff_doubles_at_each_attempt() -> None:
    runner, clock, _ = await scheduled_retry(failures=2)
    clock.advance(BACKOFF)
    again = await runner.resume("t1", ResumeCommand.retry())
    assert again.status == TurnStatus.RETRY_SCHEDULED
    assert again.suspension is not None
    assert again.suspension.due_at == clock.now + 2 * BACKOFF


async def test_a_retry_before_it_is_due_is_refused_and_changes_nothing() -> None:
    runner, clock, _ = await scheduled_retry()
    clock.advance(BACKOFF / 2)
    before = await runner.store.load("t1")
    with pytest.raises(ResumeRejected, match="not due"):
        await runner.resume("t1", ResumeCommand.retry())
    assert await runner.store.load("t1") == before


async def test_a_retry_once_it_is_due_resumes_and_completes() -> None:
    runner, clock, model = await scheduled_retry()
    clock.advance(BACKOFF)
    done = await runner.resume("t1", ResumeCommand.retry())
    assert (done.status, done.output, model.calls) == (TurnStatus.COMPLETED, "Hello.", 2)


async def test_a_worker_claims_a_scheduled_retry_when_it_is_due_and_not_before() -> None:
    runner, clock, _ = await scheduled_retry()
    worker = Worker(runner)
    clock.advance(BACKOFF / 2)
    assert not await worker.step()
    clock.advance(BACKOFF / 2)
    assert await worker.step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED


async def test_executing_a_retry_before_it_is_due_keeps_it_scheduled_for_its_time() -> None:
    runner, clock, model = await scheduled_retry()
    early = await runner.execute("t1")
    assert (early.status, model.calls) == (TurnStatus.RETRY_SCHEDULED, 1)
    worker = Worker(runner)
    assert not await worker.step()
    clock.advance(BACKOFF)
    assert await worker.step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED


async def test_running_out_of_retries_fails_the_turn() -> None:
    runner, clock, _ = await scheduled_retry(failures=5, max_retries=2)
    worker = Worker(runner)
    for wait in (BACKOFF, 2 * BACKOFF):
        clock.advance(wait)
        assert await worker.step()
    failed = await runner.store.load("t1")
    assert failed.status == TurnStatus.FAILED
    assert failed.error is not None
    assert failed.error.startswith("gave up")


async def test_a_transient_tool_error_retries_the_tool_and_not_the_model() -> None:
    clock, attempts = Clock(), []

    def fetch(arguments: dict[str, Any]) -> str:
        attempts.append(ToolContext.current().idempotency_key)
        if len(attempts) == 1:
            raise TransientError("the upstream is busy")
        return "fetched"

    model = scripted(use(call("c1", "fetch")), say("Fetched."))
    helper = agent(model, Tool(name="fetch", description="Fetch", function=fetch))
    runner = Runner(MemoryTurnStore(), [helper], clock=clock)
    waiting = await runner.run(helper, "Fetch it", turn_id="t1")
    assert waiting.suspension is not None
    assert waiting.suspension.resume_phase == Phase.TOOLS
    clock.advance(helper.retry_backoff)
    done = await runner.resume("t1", ResumeCommand.retry())
    assert (done.status, attempts, model.calls) == (TurnStatus.COMPLETED, ["t1:c1"] * 2, 2)


# ─── Limits ──────────────────────────────────────────────────────────────────


def always_pinging() -> Model:
    """A model that calls ``ping`` at every step, with a new call id."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        step = sum(1 for m in messages if m.role == "assistant")
        return use(call(f"c{step}", "ping"))

    return Model(script)


@pytest.mark.parametrize(
    ("limit", "status", "pings"),
    [
        pytest.param({"max_iterations": 3}, TurnStatus.MAX_ITERATIONS_REACHED, 3, id="iterations"),
        pytest.param({"max_tool_calls": 2}, TurnStatus.BUDGET_EXCEEDED, 2, id="tool-calls"),
    ],
)
async def test_a_turn_that_reaches_a_limit_ends_with_its_status(
    limit: dict[str, Any], status: TurnStatus, pings: int
) -> None:
    runs = Runs()
    helper = agent(always_pinging(), runs.tool("ping"), **limit)
    turn = await Runner(MemoryTurnStore(), [helper], clock=Clock()).run(helper, "Go")
    assert (turn.status, runs.count("ping")) == (status, pings)


# ─── Events ──────────────────────────────────────────────────────────────────


async def test_the_events_of_an_approved_call_reach_listeners_in_order() -> None:
    runs = Runs()
    model = scripted(use(call("c1", "deploy")), say("Deployed."))
    helper = agent(model, runs.tool("deploy"), approval_policy=require_approval_for("deploy"))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    seen: list[RunnerEvent] = []
    runner.listeners.append(seen.append)
    await runner.run(helper, "Deploy it", turn_id="t1")
    await runner.resume("t1", ResumeCommand.approve_tool("c1"))
    assert [event.type for event in seen] == [
        EventType.TURN_STARTED,
        EventType.MODEL_REPLIED,
        EventType.TOOL_APPROVAL_REQUESTED,
        EventType.TURN_SUSPENDED,
        EventType.TURN_RESUMED,
        EventType.TURN_STARTED,
        EventType.TOOL_STARTED,
        EventType.TOOL_COMPLETED,
        EventType.MODEL_REPLIED,
        EventType.TURN_COMPLETED,
    ]
    assert {event.turn_id for event in seen} == {"t1"}


async def test_a_form_request_is_an_input_requested_event_before_the_suspension() -> None:
    model = scripted(use(call("c1", REQUEST_USER_INPUT, formKey=DETAILS.key)), say("Thanks."))
    helper = agent(model, forms=(DETAILS,))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    seen: list[RunnerEvent] = []
    runner.listeners.append(seen.append)
    await runner.run(helper, "Open a ticket", turn_id="t1")
    assert [event.type for event in seen][-2:] == [
        EventType.TOOL_INPUT_REQUESTED,
        EventType.TURN_SUSPENDED,
    ]
    assert seen[-2].data == {"call_id": "c1", "form": DETAILS.key}


async def test_a_listener_that_raises_does_not_break_the_turn() -> None:
    helper = agent(scripted(say("Hello.")))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    seen: list[EventType] = []

    def broken(event: RunnerEvent) -> None:
        raise RuntimeError("a listener bug")

    runner.listeners.extend([broken, lambda event: seen.append(event.type)])
    turn = await runner.run(helper, "Hi")
    assert turn.status == TurnStatus.COMPLETED
    assert seen[-1] == EventType.TURN_COMPLETED
