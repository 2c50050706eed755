"""The runner through a Redis restart, with real parts: a real redis-server
stopped and started again on the same data, a Huddle server whose turns and
channels live in it, a participant on a real WebSocket.

Nothing is lost and nothing runs twice that finished: a turn waiting for
approval waits on through the restart; a tool whose result could not be
saved (Redis was down) is taken over once the lease expires and replays
under its idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from protocol.actions import ChatToolCallConfirmed, ChatTurnStarted
from protocol.chat import ChatState, MarkdownPart, ToolCallPart, ToolCallPendingConfirmation
from protocol.rejections import RejectionCode
from server.client import HuddleClient, Mirror
from server.config import Settings
from server.errors import ActionRejected
from server.runner.agent import Agent, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.redis_turn_store import RedisTurnStore
from server.store.redis import RedisStore
from tests.conftest import UNIT, RunningServer, start_server, user_message, watched_chat
from tests.redis_server import RedisServer
from tests.runner_kit import call, say, scripted, use

pytestmark = pytest.mark.redis

WITHIN = 20 * UNIT
LEASE = 1.0


class Ledger:
    """``charge`` books once per idempotency key; its first body stalls
    (``in_charge``) until the test lets it go."""

    def __init__(self) -> None:
        self.booked: dict[str, int] = {}
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
            self.booked.setdefault(ToolContext.current().idempotency_key, arguments["amount"])
            return "charged"

        return Tool(name="charge", description="Charge", function=charge)


def cashier(ledger: Ledger, **options: Any) -> Agent:
    return Agent(
        name="cashier",
        instructions="Charge.",
        model=scripted(use(call("c1", "charge", amount=5)), say("Charged 5.")),
        tools=(ledger.tool(),),
        **options,
    )


@contextlib.asynccontextmanager
async def on_redis(redis_server: RedisServer, agent: Agent) -> AsyncIterator[RunningServer]:
    huddle = await start_server(
        Settings(port=0, lease_seconds=LEASE, store=redis_server.url),
        RedisStore(redis_server.url),
        agent=agent,
        turn_store=RedisTurnStore(redis_server.url),
    )
    try:
        yield huddle
    finally:
        await huddle.stop()


async def open_chat(huddle: RunningServer) -> tuple[HuddleClient, str, Mirror]:
    alice = await huddle.client(name="alice")
    chat, mirror = await watched_chat(alice, "ahp-session:/till", title="Till")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-01-10T10:00:00.000Z", message=user_message("Charge 5")
    )
    await alice.dispatch_and_wait(chat, started)
    return alice, chat, mirror


async def until(mirror: Mirror, predicate: Callable[[ChatState], bool]) -> ChatState:
    def check(state: object) -> bool:
        return isinstance(state, ChatState) and predicate(state)

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(check)
    assert isinstance(state, ChatState)
    return state


def ended(state: ChatState) -> bool:
    return state.active_turn is None and bool(state.turns)


def final_text(state: ChatState) -> str:
    parts = state.turns[-1].response_parts
    return "".join(p.content for p in parts if isinstance(p, MarkdownPart))


class WorkerFailure(logging.Handler):
    """Set when a worker reports that a turn failed in it (its save could
    not reach the store): something to await instead of a guess."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "failed in the worker" in record.getMessage():
            self.seen.set()


@contextlib.contextmanager
def watching_worker_failures() -> Iterator[WorkerFailure]:
    handler = WorkerFailure()
    logger = logging.getLogger("huddle.runner.worker")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


async def restart(redis_server: RedisServer) -> None:
    await redis_server.stop()  # as an operator would: SIGTERM, the AOF flushed
    async with asyncio.timeout(WITHIN):
        await redis_server.start()


async def test_a_turn_waiting_for_approval_waits_on_through_a_redis_restart(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger()
    ledger.bodies = 1  # no stall: the body books at once
    agent = cashier(ledger, approval_policy=require_approval_for("charge"))
    async with on_redis(redis_server, agent) as huddle:
        alice, chat, mirror = await open_chat(huddle)

        def waiting(state: ChatState) -> bool:
            parts = state.active_turn.response_parts if state.active_turn else []
            return any(
                isinstance(p, ToolCallPart) and isinstance(p.tool_call, ToolCallPendingConfirmation)
                for p in parts
            )

        await until(mirror, waiting)
        await restart(redis_server)
        approve = ChatToolCallConfirmed(
            turn_id="t1", tool_call_id="c1", approved=True, confirmed="user-action"
        )
        async with asyncio.timeout(WITHIN):
            while True:  # the server finds Redis again by itself; until then it refuses
                try:
                    await alice.dispatch_and_wait(chat, approve)
                    break
                except ActionRejected as error:
                    if error.code != RejectionCode.STORE_UNAVAILABLE:
                        raise
                    await asyncio.sleep(0.05)
        done = await until(mirror, ended)
    assert done.turns[-1].state == "complete"
    assert final_text(done) == "Charged 5."
    assert list(ledger.booked.values()) == [5]


async def test_a_tool_result_lost_to_a_redis_restart_is_replayed_once_under_its_key(
    redis_server: RedisServer,
) -> None:
    ledger = Ledger()
    async with on_redis(redis_server, cashier(ledger)) as huddle:
        _, _, mirror = await open_chat(huddle)
        async with asyncio.timeout(WITHIN):
            await ledger.in_charge.wait()
        await redis_server.stop()
        with watching_worker_failures() as failure:
            ledger.let_go.set()  # the tool finishes while Redis is down
            async with asyncio.timeout(WITHIN):
                await failure.seen.wait()  # its result could not be saved
        async with asyncio.timeout(WITHIN):
            await redis_server.start()
        done = await until(mirror, ended)
    assert done.turns[-1].state == "complete"
    assert final_text(done) == "Charged 5."
    # The body ran again after the takeover (its result was never saved),
    # under the same key: the charge was booked once.
    assert ledger.bodies == 2
    assert len(ledger.booked) == 1
