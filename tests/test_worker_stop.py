"""A crew stops as a rolling deploy needs (server.runner.worker.Crew.stop):
nothing handed to a worker is lost by its stop, a running turn is handed on
at once, and the stop of a server leaves what follows the drain its own
time. (The stop of real ``huddle worker`` processes, by SIGTERM, is in
tests.test_runner_fault_processes.)"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator

import pytest

import server.build as build_module
from server.build import build
from server.config import Settings
from server.runner.agent import Agent, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.runner import Runner
from server.runner.turn import ResumeCommand, TurnStatus
from server.runner.turn_store import MemoryTurnStore, TurnStore
from server.runner.worker import Crew
from tests.conftest import UNIT
from tests.redis_server import running_redis
from tests.runner_kit import Clock, Runs, agent, call, say, scripted, use

LEASE = 30.0
"""Longer than any test here: a turn claimed again was handed on."""
APPROVE = ResumeCommand.approve_tool("c1")


@pytest.fixture
async def redis_url() -> AsyncIterator[str]:
    async with running_redis(10 * UNIT) as server:
        yield server.url


def deployer(runs: Runs, slow: asyncio.Event | None = None) -> Agent:
    """Deploys after an approval; with ``slow``, the deploy waits for it."""

    async def deploy(arguments: dict[str, object]) -> str:
        runs.record("deploy", arguments)
        if slow is not None:
            await slow.wait()
        return "deployed"

    model = scripted(use(call("c1", "deploy", env="prod")), say("Deployed."))
    tool = Tool(name="deploy", description="Deploy", function=deploy)
    return agent(model, tool, approval_policy=require_approval_for("deploy"))


@pytest.mark.redis
async def test_a_turn_handed_to_an_idle_worker_as_its_crew_stops_goes_back_to_the_queue(
    redis_url: str,
) -> None:
    runs, clock = Runs(), Clock()
    helper = deployer(runs)
    store = RedisTurnStore(redis_url)
    server = Runner(store, [helper], clock=clock, owner="server", lease_seconds=LEASE)
    assert (await server.run(helper, "Deploy it", turn_id="t1")).status == (
        TurnStatus.WAITING_FOR_APPROVAL
    )
    crew = Crew(
        Runner(store, [helper], clock=clock, owner="worker", lease_seconds=LEASE),
        1,
        idle_wait=60 * UNIT,
        recover_every=600.0,
    )
    crew.start()
    async with asyncio.timeout(10 * UNIT):
        while not await store.client.zcard("{huddle:turn}:waiting"):  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # registered: nothing to await across clients
    await asyncio.sleep(0.05 * UNIT)  # and in its BLPOP (Redis tells no one)

    # The resume comes from another process while this loop is busy: the
    # hand-over reaches the worker's socket, unread, before the stop begins.
    def resume_elsewhere() -> None:
        async def resume() -> None:
            other = RedisTurnStore(redis_url)
            api = Runner(other, [helper], clock=clock, owner="api", lease_seconds=LEASE)
            saved = await api.submit_resume("t1", APPROVE)
            assert saved.status == TurnStatus.RUNNING  # handed over, started
            await other.close()

        asyncio.run(resume())

    thread = threading.Thread(target=resume_elsewhere)
    thread.start()
    thread.join()
    await crew.stop(10 * UNIT)
    lease = await store.claim("another", clock(), LEASE)
    await store.close()
    assert lease is not None  # not leased to the stopped worker
    assert lease.turn_id == "t1"
    assert runs.count("deploy") == 0


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[TurnStore]:
    if request.param == "memory":
        yield MemoryTurnStore()
        return
    async with running_redis(10 * UNIT) as server:
        made = RedisTurnStore(server.url)
        yield made
        await made.close()


async def test_a_turn_running_past_the_grace_is_handed_on_at_once(store: TurnStore) -> None:
    runs, clock, slow = Runs(), Clock(), asyncio.Event()
    helper = deployer(runs, slow)
    server = Runner(store, [helper], clock=clock, owner="server", lease_seconds=LEASE)
    await server.run(helper, "Deploy it", turn_id="t1")
    await server.submit_resume("t1", APPROVE)
    runner = Runner(store, [helper], clock=clock, owner="worker", lease_seconds=LEASE)
    crew = Crew(runner, 1, idle_wait=0.05, recover_every=600.0)
    crew.start()
    async with asyncio.timeout(10 * UNIT):
        while not runs.count("deploy"):  # noqa: ASYNC110 - the tool's body records it
            await asyncio.sleep(0.01)
    await crew.stop(0.0)
    lease = await store.claim("another", clock(), LEASE)  # now, not once the lease ends
    turn = await store.load("t1")
    assert lease is not None
    assert lease.turn_id == "t1"
    assert turn.status == TurnStatus.RUNNING


async def test_a_turn_handed_on_by_more_stops_than_its_attempts_is_not_failed(
    store: TurnStore,
) -> None:
    runs, clock, slow = Runs(), Clock(), asyncio.Event()
    helper = deployer(runs, slow)
    server = Runner(store, [helper], clock=clock, owner="server", lease_seconds=LEASE)
    await server.run(helper, "Deploy it", turn_id="t1")
    await server.submit_resume("t1", APPROVE)
    hops = server.max_attempts + 1  # a rolling deploy of that many workers
    for hop in range(hops):
        runner = Runner(store, [helper], clock=clock, owner=f"worker-{hop}", lease_seconds=LEASE)
        crew = Crew(runner, 1, idle_wait=0.05, recover_every=600.0)
        crew.start()
        async with asyncio.timeout(10 * UNIT):
            while runs.count("deploy") <= hop:  # noqa: ASYNC110 - the tool's body records it
                await asyncio.sleep(0.01)
        await crew.stop(0.0)
    slow.set()
    last = Runner(store, [helper], clock=clock, owner="last", lease_seconds=LEASE)
    done = await last.execute("t1")
    assert done.status == TurnStatus.COMPLETED
    assert done.attempts == 0


async def test_what_follows_the_drain_of_a_stop_has_its_own_patience(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(build_module, "STOP_PATIENCE", 0.5 * UNIT)
    running = asyncio.Event()

    async def work(arguments: dict[str, object]) -> str:
        running.set()
        await asyncio.sleep(0.7 * UNIT)  # within the drain, past the patience
        ToolContext.current().emit_progress("almost")
        return "ok"

    helper = agent(
        scripted(use(call("c1", "work")), say("done")),
        Tool(name="work", description="Work", function=work),
    )
    parts = build(Settings(drain_seconds=5 * UNIT, workers=1), agent=helper)
    await parts.start()
    service = parts.service
    assert service is not None

    async def slow_progress(*args: object) -> None:
        await asyncio.sleep(0.1 * UNIT)  # a chat append, say

    monkeypatch.setattr(service.runner.port, "tool_progress", slow_progress)
    await service.runner.start(helper, "go", turn_id="t1")
    async with asyncio.timeout(10 * UNIT):
        await running.wait()
    with caplog.at_level(logging.INFO):
        await parts.stop()
    assert (await service.store.load("t1")).status == TurnStatus.COMPLETED
    assert "cut off at the stop" not in caplog.text
