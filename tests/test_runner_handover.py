"""A resume handed over to a waiting worker: the fast path of
``Runner.submit_resume``, and every fence it keeps.

A worker with nothing to do waits; a resume saved meanwhile is handed to it
started and leased, and it runs the turn without a claim, a load or a save
of its start. Nothing of the exactly-once guarantees gives way: a handed
turn is taken over like a claimed one when its worker stalls or dies, a
worker that takes it up late is fenced before anything runs, of two
concurrent resumes one wins, and a resume decided on a stale copy is
decided again on the turn as it is. On the memory store and on Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec
import pytest

from server.runner.agent import Agent, Tool, require_approval_for
from server.runner.events import EventType, RunnerEvent
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.runner import ResumeRejected, Runner
from server.runner.turn import ResumeCommand, Turn, TurnStatus
from server.runner.turn_store import (
    Claim,
    Fenced,
    Lease,
    MemoryTurnStore,
    TurnStore,
    Waiter,
)
from server.runner.worker import Worker
from tests.conftest import UNIT
from tests.redis_server import running_redis
from tests.runner_kit import Clock, Runs, agent, call, say, scripted, use

LEASE = 30.0
WITHIN = 10 * UNIT
APPROVE = ResumeCommand.approve_tool("c1")


class Recorded(TurnStore):
    """A turn store that records what its callers did (and what they were
    handed), around a real one."""

    def __init__(self, inner: TurnStore) -> None:
        self.inner = inner
        self.saves: list[tuple[TurnStatus, int | None]] = []
        """Each save: the status saved, and the lease token it was made under."""
        self.loads = 0
        self.claimed: list[str] = []
        """Turns claims took (not hand-overs)."""
        self.handed: list[str] = []
        """Turns the waits of workers returned."""
        self.waiting = asyncio.Event()
        """Set whenever a worker starts waiting."""
        self.completed = asyncio.Event()
        """Set once a save of a completed turn has landed."""

    async def create(self, turn: Turn) -> Turn:
        return await self.inner.create(turn)

    async def load(self, turn_id: str) -> Turn:
        self.loads += 1
        return await self.inner.load(turn_id)

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        self.saves.append((turn.status, None if lease is None else lease.token))
        saved = await self.inner.save(turn, lease=lease)
        if saved.status == TurnStatus.COMPLETED:
            self.completed.set()
        return saved

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        return await self.inner.save_runnable(turn, now, started=started)

    async def request_cancel(self, turn_id: str) -> None:
        await self.inner.request_cancel(turn_id)

    async def cancel_requested(self, turn_id: str) -> bool:
        return await self.inner.cancel_requested(turn_id)

    async def make_runnable(self, turn_id: str, due_at: float) -> None:
        await self.inner.make_runnable(turn_id, due_at)

    async def claim(
        self, owner: str, now: float, lease_seconds: float, turn_id: str | None = None
    ) -> Lease | None:
        return await self.inner.claim(owner, now, lease_seconds, turn_id)

    async def claim_turn(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        turn_id: str | None = None,
        *,
        waiter: Waiter | None = None,
    ) -> Claim | None:
        claim = await self.inner.claim_turn(owner, now, lease_seconds, turn_id, waiter=waiter)
        if claim is not None:
            (self.handed if claim.running else self.claimed).append(claim.lease.turn_id)
        return claim

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        return await self.inner.renew(lease, now, lease_seconds)

    async def release(self, lease: Lease) -> None:
        await self.inner.release(lease)

    async def give_up(self, lease: Lease, now: float) -> None:
        await self.inner.give_up(lease, now)

    async def by_status(self, status: TurnStatus) -> list[str]:
        return await self.inner.by_status(status)

    async def wait_for_work(self, at_most: float, waiter: Waiter | None = None) -> Claim | None:
        self.waiting.set()
        claim = await self.inner.wait_for_work(at_most, waiter)
        if claim is not None:
            self.handed.append(claim.lease.turn_id)
        return claim

    async def wake(self, waiter: Waiter) -> None:
        await self.inner.wake(waiter)

    async def stop_waiting(self, waiter: Waiter, now: float) -> None:
        await self.inner.stop_waiting(waiter, now)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Recorded]:
    async with contextlib.AsyncExitStack() as stack:
        inner: TurnStore
        if request.param == "memory":
            inner = MemoryTurnStore()
        else:
            server = await stack.enter_async_context(running_redis(10 * UNIT))
            inner = RedisTurnStore(server.url)
        recorded = Recorded(inner)
        try:
            yield recorded
        finally:
            await recorded.close()


@dataclass
class Deployment:
    """Turn ``t1`` waits for approval of call ``c1`` (``deploy``); the
    server's runner resumes it and workers' runners run it."""

    store: Recorded
    clock: Clock
    helper: Agent
    runs: Runs
    deployed: asyncio.Event = field(default_factory=asyncio.Event)
    saves_before_deploy: list[tuple[TurnStatus, int | None]] = field(default_factory=list)

    def runner(self, owner: str) -> Runner:
        return Runner(self.store, [self.helper], clock=self.clock, owner=owner, lease_seconds=LEASE)


async def deployment(store: Recorded) -> Deployment:
    runs = Runs()
    clock = Clock()
    made: list[Deployment] = []

    def deploy(arguments: dict[str, object]) -> str:
        runs.record("deploy", arguments)
        made[0].saves_before_deploy = list(store.saves)
        made[0].deployed.set()
        return "deployed"

    model = scripted(use(call("c1", "deploy", env="prod")), say("Deployed."))
    tool = Tool(name="deploy", description="Deploy", function=deploy)
    helper = agent(model, tool, approval_policy=require_approval_for("deploy"))
    made.append(Deployment(store, clock, helper, runs))
    turn = await made[0].runner("server").run(helper, "Deploy it", turn_id="t1")
    assert turn.status == TurnStatus.WAITING_FOR_APPROVAL
    store.claimed.clear()  # the run's own
    return made[0]


async def registered(store: TurnStore, clock: Clock, name: str = "worker-a") -> Waiter:
    """A worker's waiter, registered by its empty claim."""
    waiter = Waiter(id=f"{name}:1", owner=name, lease_seconds=LEASE, until=clock() + 60)
    assert await store.claim_turn(name, clock(), LEASE, waiter=waiter) is None
    return waiter


async def handed(store: TurnStore, waiter: Waiter) -> Claim:
    async with asyncio.timeout(WITHIN):
        claim = await store.wait_for_work(WITHIN, waiter)
    assert claim is not None
    return claim


# ─── The direct wake-up ──────────────────────────────────────────────────────


async def test_a_resume_is_handed_to_the_waiting_worker_which_runs_it_at_once(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    # A long idle wait: only a hand-over (or a wake-up) makes it act now.
    worker = Worker(deployed.runner("worker"), idle_wait=60 * UNIT, recover_every=600 * UNIT)
    working = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(WITHIN):
            await store.waiting.wait()
        saves_at_resume = len(store.saves)
        submitted = await deployed.runner("server").submit_resume("t1", APPROVE)
        assert submitted.status == TurnStatus.RUNNING  # handed over started
        async with asyncio.timeout(WITHIN):
            await deployed.deployed.wait()
        # Neither claimed nor loaded: handed; and its start was not saved again.
        assert (store.handed, store.claimed) == (["t1"], [])
        assert deployed.saves_before_deploy[saves_at_resume:] == []
        async with asyncio.timeout(WITHIN):
            await store.completed.wait()  # the tool ran; the turn's end is saved after
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working
    assert deployed.runs.count("deploy") == 1
    assert (await store.load("t1")).status == TurnStatus.COMPLETED


async def test_a_stopped_worker_is_handed_nothing(store: Recorded) -> None:
    deployed = await deployment(store)
    worker = Worker(deployed.runner("worker"), idle_wait=60 * UNIT, recover_every=600 * UNIT)
    working = asyncio.create_task(worker.run())
    async with asyncio.timeout(WITHIN):
        await store.waiting.wait()
    working.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await working
    submitted = await deployed.runner("server").submit_resume("t1", APPROVE)
    assert submitted.status == TurnStatus.READY  # queued: nobody waits
    assert await Worker(deployed.runner("another")).step()
    assert store.claimed == ["t1"]
    assert deployed.runs.count("deploy") == 1


# ─── Fencing ─────────────────────────────────────────────────────────────────


async def test_a_handed_turn_taken_up_late_is_fenced_before_its_tool_runs(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    waiter = await registered(store, deployed.clock)
    await deployed.runner("server").submit_resume("t1", APPROVE)
    claim = await handed(store, waiter)
    # Worker A is busy past the lease; B takes the turn over and runs it.
    deployed.clock.advance(LEASE + 1)
    assert await Worker(deployed.runner("worker-b")).step()
    assert deployed.runs.count("deploy") == 1
    with pytest.raises(Fenced):
        await deployed.runner("worker-a").execute_claimed(claim.lease, claim.turn, running=True)
    assert deployed.runs.count("deploy") == 1
    assert (await store.load("t1")).status == TurnStatus.COMPLETED


async def test_a_handed_turn_taken_up_late_but_still_leased_runs_once(store: Recorded) -> None:
    deployed = await deployment(store)
    waiter = await registered(store, deployed.clock)
    await deployed.runner("server").submit_resume("t1", APPROVE)
    claim = await handed(store, waiter)
    deployed.clock.advance(LEASE / 2)
    saves = len(store.saves)
    done = await deployed.runner("worker-a").execute_claimed(claim.lease, claim.turn, running=True)
    assert done.status == TurnStatus.COMPLETED
    # Late: its lease was checked by a fenced save before the tool ran.
    assert deployed.saves_before_deploy[saves:] == [(TurnStatus.RUNNING, claim.lease.token)]
    assert deployed.runs.count("deploy") == 1


async def test_a_turn_handed_to_a_worker_that_died_is_taken_over_when_its_lease_expires(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    await registered(store, deployed.clock)  # then its worker dies, waiting
    await deployed.runner("server").submit_resume("t1", APPROVE)
    other = deployed.runner("worker-b")
    events: list[RunnerEvent] = []
    other.listeners.append(events.append)
    assert not await Worker(other).step()  # leased to the dead worker still
    deployed.clock.advance(LEASE + 1)
    assert await Worker(other).step()
    assert [e.data["attempt"] for e in events if e.type == EventType.TURN_TAKEN_OVER] == [1]
    assert deployed.runs.count("deploy") == 1
    assert (await store.load("t1")).status == TurnStatus.COMPLETED


async def test_of_two_concurrent_resumes_handed_over_exactly_one_wins(store: Recorded) -> None:
    deployed = await deployment(store)
    waiter = await registered(store, deployed.clock)
    server = deployed.runner("server")
    first, second = await store.load("t1"), await store.load("t1")
    results = await asyncio.gather(
        server.submit_resume("t1", APPROVE.with_metadata(by="ana"), loaded=first),
        server.submit_resume("t1", APPROVE.with_metadata(by="ben"), loaded=second),
        return_exceptions=True,
    )
    winners = [r for r in results if isinstance(r, Turn)]
    losers = [r for r in results if isinstance(r, ResumeRejected)]
    assert (len(winners), len(losers)) == (1, 1)
    assert "duplicate" in losers[0].reason  # decided again on the winner's save
    claim = await handed(store, waiter)
    await deployed.runner("worker-a").execute_claimed(claim.lease, claim.turn, running=True)
    assert deployed.runs.count("deploy") == 1
    assert [a.metadata["by"] for a in (await store.load("t1")).audit] == [
        winners[0].audit[-1].metadata["by"]
    ]


# ─── A resume decided on the caller's copy ───────────────────────────────────


async def test_a_resume_from_a_current_copy_loads_nothing(store: Recorded) -> None:
    deployed = await deployment(store)
    copy = await store.load("t1")
    loads = store.loads
    await deployed.runner("server").submit_resume("t1", APPROVE, loaded=copy)
    assert store.loads == loads


async def test_a_resume_from_a_stale_copy_is_decided_again_on_the_turn_as_it_is(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    stale = await store.load("t1")
    server = deployed.runner("server")
    await server.submit_resume("t1", APPROVE)
    assert await Worker(deployed.runner("worker")).step()  # deployed, and done
    with pytest.raises(ResumeRejected, match="late"):
        await server.submit_resume("t1", APPROVE, loaded=stale)
    assert deployed.runs.count("deploy") == 1


async def test_a_copy_that_looks_unanswerable_is_not_refused_before_a_fresh_load(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    # As if read while it still ran, before it waited.
    running = msgspec.structs.replace(await store.load("t1"), status=TurnStatus.RUNNING)
    submitted = await deployed.runner("server").submit_resume("t1", APPROVE, loaded=running)
    assert submitted.status in (TurnStatus.READY, TurnStatus.RUNNING)
    assert await Worker(deployed.runner("worker")).step()
    assert deployed.runs.count("deploy") == 1


async def test_a_copy_read_before_a_cancel_request_does_not_resume_the_turn(
    store: Recorded,
) -> None:
    deployed = await deployment(store)
    copy = await store.load("t1")
    await store.request_cancel("t1")
    with pytest.raises(ResumeRejected, match="cancelled"):
        await deployed.runner("server").submit_resume("t1", APPROVE, loaded=copy)
    assert (await store.load("t1")).status == TurnStatus.WAITING_FOR_APPROVAL
