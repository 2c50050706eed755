"""Durability: leases fence stale workers, a crash never re-runs a finished
tool, a child's completion wakes its parent even after a crash, and workers
pick up whatever is due (or was left asleep)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from server.runner.agent import Agent, Tool
from server.runner.context import ToolContext
from server.runner.errors import TurnNotFound
from server.runner.events import EventType, RunnerEvent
from server.runner.runner import ResumeRejected, Runner, TurnBusy
from server.runner.turn import ParentLink, ResumeCommand, SuspensionType, Turn, TurnStatus
from server.runner.turn_store import Fenced, MemoryTurnStore
from server.runner.worker import Worker
from tests.runner_kit import (
    WITHIN,
    Clock,
    Crash,
    CrashingStore,
    Model,
    Runs,
    agent,
    call,
    say,
    scripted,
    use,
)

LEASE = 30.0


# ─── Fencing ─────────────────────────────────────────────────────────────────


class Payments:
    """``charge`` books a payment once per idempotency key; its first run
    stalls (``in_charge`` set) until the test lets it go."""

    def __init__(self) -> None:
        self.ledger: dict[str, int] = {}
        self.bodies = 0
        self.in_charge = asyncio.Event()
        self.let_go = asyncio.Event()

    def tool(self) -> Tool:
        async def charge(arguments: dict[str, Any]) -> str:
            self.bodies += 1
            if self.bodies == 1:
                self.in_charge.set()
                async with asyncio.timeout(WITHIN):
                    await self.let_go.wait()
            self.ledger.setdefault(ToolContext.current().idempotency_key, arguments["amount"])
            return "charged"

        return Tool(name="charge", description="Charge the customer", function=charge)


async def stalled_in_charge(
    payments: Payments, store: MemoryTurnStore, clock: Clock
) -> tuple[Agent, asyncio.Task[Turn]]:
    """Worker ``worker-1`` runs turn ``t1`` and stalls inside ``charge``."""
    helper = agent(scripted(use(call("c1", "charge", amount=5)), say("Paid.")), payments.tool())
    stale = Runner(store, [helper], clock=clock, owner="worker-1", lease_seconds=LEASE)
    task = asyncio.create_task(stale.run(helper, "Charge me 5", turn_id="t1"))
    async with asyncio.timeout(WITHIN):
        await payments.in_charge.wait()
    return helper, task


async def test_a_turn_leased_by_a_live_worker_is_busy_for_everyone_else() -> None:
    clock, store, payments = Clock(), MemoryTurnStore(), Payments()
    helper, stale = await stalled_in_charge(payments, store, clock)
    other = Runner(store, [helper], clock=clock, owner="worker-2", lease_seconds=LEASE)
    with pytest.raises(TurnBusy):
        await other.execute("t1")
    payments.let_go.set()
    assert (await stale).status == TurnStatus.COMPLETED


async def test_a_stale_worker_is_fenced_after_its_lease_is_taken_over_under_the_same_owner() -> (
    None
):
    clock, store, payments = Clock(), MemoryTurnStore(), Payments()
    helper, stale = await stalled_in_charge(payments, store, clock)
    clock.advance(LEASE + 1)  # the lease expires while worker-1 stalls
    fresh = Runner(store, [helper], clock=clock, owner="worker-1", lease_seconds=LEASE)
    done = await fresh.execute("t1")
    assert done.status == TurnStatus.COMPLETED
    payments.let_go.set()
    with pytest.raises(Fenced):
        await stale
    assert await store.load("t1") == done
    # Both bodies ran (a tool cannot be interrupted); the payment, keyed by
    # the idempotency key, landed once.
    assert (payments.bodies, payments.ledger) == (2, {"t1:c1": 5})


# ─── Crashes ─────────────────────────────────────────────────────────────────


async def crashed_between_tools(clock: Clock) -> tuple[CrashingStore, Agent, Runs]:
    """Turn ``t1`` calls ``reserve`` (c1) then ``pay`` (c2); its process
    dies while saving the result of ``pay``: that of ``reserve`` was saved
    on its own."""
    runs = Runs()
    model = scripted(use(call("c1", "reserve"), call("c2", "pay")), say("Booked."))
    helper = agent(model, runs.tool("reserve"), runs.tool("pay"))
    store = CrashingStore()
    store.crash_when = lambda turn: any(p.call.id == "c2" and p.result for p in turn.pending)
    doomed = Runner(store, [helper], clock=clock, lease_seconds=LEASE)
    with pytest.raises(Crash):
        await doomed.run(helper, "Book it", turn_id="t1")
    return store, helper, runs


async def test_a_crash_after_the_first_of_two_tools_does_not_run_it_again() -> None:
    clock = Clock()
    store, helper, runs = await crashed_between_tools(clock)
    clock.advance(LEASE + 1)
    done = await Runner(store, [helper], clock=clock).execute("t1")
    assert done.status == TurnStatus.COMPLETED
    assert (runs.count("reserve"), runs.count("pay")) == (1, 2)


async def test_the_idempotency_key_is_stable_when_another_runner_replays_the_call() -> None:
    clock = Clock()
    store, helper, runs = await crashed_between_tools(clock)
    clock.advance(LEASE + 1)
    await Runner(store, [helper], clock=clock).execute("t1")
    keys = [run.idempotency_key for run in runs.runs if run.tool == "pay"]
    assert keys == ["t1:c2", "t1:c2"]


async def test_a_turn_whose_runner_failed_is_taken_over_by_a_worker_once_its_lease_expires() -> (
    None
):
    clock = Clock()
    store, helper, _ = await crashed_between_tools(clock)
    worker = Worker(Runner(store, [helper], clock=clock, lease_seconds=LEASE))
    assert not await worker.step()  # the failed runner's lease still holds
    clock.advance(LEASE + 1)
    assert await worker.step()
    assert (await store.load("t1")).status == TurnStatus.COMPLETED


# ─── Child agents ────────────────────────────────────────────────────────────


def family() -> tuple[Agent, Model]:
    """A parent whose ``research`` tool delegates to a child agent."""
    child = Agent(name="researcher", instructions="Research.", model=scripted(say("3 papers.")))
    model = scripted(use(call("c1", "research", task="find papers")), say("Found 3 papers."))
    research = Tool(name="research", description="Delegate research", child=child)
    return agent(model, research, name="lead"), model


async def test_a_runner_knows_the_child_agents_of_its_agents() -> None:
    parent, _ = family()
    runner = Runner(MemoryTurnStore(), [parent], clock=Clock())
    assert runner.agent("researcher").instructions == "Research."


async def test_a_parent_waits_for_its_child_turn() -> None:
    parent, _ = family()
    runner = Runner(MemoryTurnStore(), [parent], clock=Clock())
    waiting = await runner.run(parent, "Find papers", turn_id="p")
    assert waiting.status == TurnStatus.WAITING_FOR_CHILD
    assert waiting.suspension is not None
    assert waiting.suspension.type == SuspensionType.CHILD_AGENT
    assert waiting.suspension.correlation_id == "p.c1"
    child = await runner.store.load("p.c1")
    assert child.parent == ParentLink(turn_id="p", call_id="c1", root_turn_id="p")
    assert child.messages[-1].content == "find papers"


async def test_a_parent_resumes_with_its_childs_output_when_a_worker_ran_the_child() -> None:
    parent, model = family()
    runner = Runner(MemoryTurnStore(), [parent], clock=Clock())
    await runner.run(parent, "Find papers", turn_id="p")
    worker = Worker(runner)
    assert await worker.step()  # the child, which wakes its parent
    assert await worker.step()  # the parent
    done = await runner.store.load("p")
    assert (done.status, done.output) == (TurnStatus.COMPLETED, "Found 3 papers.")
    assert model.tool_results() == {"c1": {"status": "COMPLETED", "output": "3 papers."}}


async def test_a_childs_completion_resumes_only_the_call_that_started_it() -> None:
    # A parent whose record says it waits for a child that no call of it
    # waits for (its call has a result already) refuses the completion; it
    # raised StopIteration inside the resume before.
    parent, _ = family()
    runner = Runner(MemoryTurnStore(), [parent], clock=Clock())
    waiting = await runner.run(parent, "Find papers", turn_id="p")
    waiting = msgspec.structs.replace(
        waiting, pending=tuple(p.with_result("done") for p in waiting.pending)
    )
    await runner.store.save(waiting)
    with pytest.raises(ResumeRejected, match=r"no call of the turn waits for child turn 'p\.c1'"):
        await runner.submit_resume("p", ResumeCommand.child_completed("p.c1", "COMPLETED", "x"))
    assert (await runner.store.load("p")).status == TurnStatus.WAITING_FOR_CHILD


async def test_a_child_turn_counts_against_its_parents_tool_call_budget() -> None:
    # A child's result comes back through the resume, past the count: an
    # agent could start child turns without limit.
    child = Agent(name="researcher", instructions="Research.", model=scripted(say("3 papers.")))
    model = scripted(
        use(call("c1", "research", task="find papers")),
        use(call("c2", "research", task="find more")),
        say("-"),
    )
    research = Tool(name="research", description="Delegate research", child=child)
    parent = agent(model, research, name="lead", max_tool_calls=1)
    runner = Runner(MemoryTurnStore(), [parent], clock=Clock())
    await runner.run(parent, "Find papers", turn_id="p")
    worker = Worker(runner)
    assert await worker.step()  # the child, which wakes its parent
    assert await worker.step()  # the parent, whose second child is one call too many

    done = await runner.store.load("p")
    assert done.status == TurnStatus.BUDGET_EXCEEDED
    assert done.tool_calls_made == 1
    with pytest.raises(TurnNotFound):
        await runner.store.load("p.c2")


async def test_a_child_completion_after_a_crash_still_wakes_the_parent() -> None:
    parent, model = family()
    store = CrashingStore()
    runner = Runner(store, [parent], clock=Clock())
    await runner.run(parent, "Find papers", turn_id="p")
    # The child's process dies right after the child is saved COMPLETED,
    # while it wakes the parent.
    store.crash_when = lambda turn: turn.id == "p" and turn.status == TurnStatus.READY
    with pytest.raises(Crash):
        await runner.execute("p.c1")
    assert (await store.load("p.c1")).status == TurnStatus.COMPLETED
    assert (await store.load("p")).status == TurnStatus.WAITING_FOR_CHILD
    await runner.recover()
    assert await Worker(runner).step()
    assert (await store.load("p")).status == TurnStatus.COMPLETED
    assert model.tool_results() == {"c1": {"status": "COMPLETED", "output": "3 papers."}}


# ─── Workers ─────────────────────────────────────────────────────────────────


def echo() -> Agent:
    return agent(scripted(say("Hello.")), name="echo")


async def test_a_worker_claims_a_started_turn_and_runs_it() -> None:
    runner = Runner(MemoryTurnStore(), [echo()], clock=Clock())
    started = await runner.start("echo", "Hi", turn_id="t1")
    assert started.status == TurnStatus.READY
    worker = Worker(runner)
    assert await worker.step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED
    assert not await worker.step()


async def test_a_worker_leaves_a_turn_leased_elsewhere_until_the_lease_expires() -> None:
    clock = Clock()
    runner = Runner(MemoryTurnStore(), [echo()], clock=clock, lease_seconds=LEASE)
    await runner.start("echo", "Hi", turn_id="t1")
    assert await runner.store.claim("elsewhere", clock(), LEASE, "t1") is not None
    worker = Worker(runner)
    assert not await worker.step()
    clock.advance(LEASE + 1)
    assert await worker.step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED


async def test_recover_requeues_a_ready_turn_nobody_queued() -> None:
    runner = Runner(MemoryTurnStore(), [echo()], clock=Clock())
    # As when a process dies between saving a resume and queueing the turn.
    await runner.store.create(runner.new_turn("echo", "Hi", turn_id="t1"))
    worker = Worker(runner)
    assert not await worker.step()
    await worker.recover()
    assert await worker.step()
    assert (await runner.store.load("t1")).status == TurnStatus.COMPLETED


async def test_a_running_worker_picks_up_a_turn_started_while_it_idles() -> None:
    runner = Runner(MemoryTurnStore(), [echo()], clock=Clock())
    completed = asyncio.Event()

    def on_event(event: RunnerEvent) -> None:
        if event.type == EventType.TURN_COMPLETED:
            completed.set()

    runner.listeners.append(on_event)
    working = asyncio.create_task(Worker(runner, idle_wait=WITHIN).run())
    try:
        await runner.start("echo", "Hi", turn_id="t1")
        async with asyncio.timeout(WITHIN):
            await completed.wait()
    finally:
        working.cancel()
        with pytest.raises(asyncio.CancelledError):
            await working
    turn: Turn = await runner.store.load("t1")
    assert turn.output == "Hello."
