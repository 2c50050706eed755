"""Shared fixtures: a real Huddle server (uvicorn on port 0) and clients.

Every timeout in the tests is a multiple of UNIT seconds (``HUDDLE_TEST_UNIT``,
default 1), so a slow machine can scale them all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest

from protocol.actions import ChatTurnStarted
from protocol.chat import Message, MessageOrigin
from protocol.session import SessionState
from server.auth import Role, TokenAuthority
from server.build import build
from server.client import HuddleClient, Mirror
from server.config import Limits, Settings
from server.edge.app import Server, create_app
from server.edge.serve import UvicornServer, uvicorn_config
from server.runner.agent import Agent
from server.runner.turn_store import TurnStore
from server.store.base import ChannelStore
from server.store.memory import MemoryStore
from tests.redis_server import RedisServer, running_redis

UNIT = float(os.environ.get("HUDDLE_TEST_UNIT", "1"))

# Property tests draw the same examples on every run, so that CI is
# deterministic; HUDDLE_HYPOTHESIS=explore draws new ones (and keeps failures).
hypothesis.settings.register_profile("repeatable", derandomize=True, database=None)
hypothesis.settings.register_profile("explore")
hypothesis.settings.load_profile(
    "explore" if os.environ.get("HUDDLE_HYPOTHESIS") == "explore" else "repeatable"
)
AGENT_TOKEN = "test-agent-token-0123456789abcdef"


@dataclass
class RunningServer:
    """A server listening on loopback, with what tests need to reach it."""

    server: Server
    uvicorn: UvicornServer
    task: asyncio.Task[None]
    authority: TokenAuthority
    clients: list[HuddleClient] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.uvicorn.port

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ahp"

    def token(
        self, role: Role = "participant", sessions: list[str] | None = None, name: str | None = None
    ) -> str:
        if role == "agent":
            return AGENT_TOKEN
        return self.authority.mint(
            role, sessions=sessions, name=name, expires_at=time.time() + 3600
        )

    async def client(
        self,
        role: Role = "participant",
        sessions: list[str] | None = None,
        name: str | None = None,
        **options: Any,
    ) -> HuddleClient:
        client = await HuddleClient.connect(self.ws, self.token(role, sessions, name), **options)
        self.clients.append(client)
        return client

    async def stop(self) -> None:
        for client in self.clients:
            await client.close()
        self.uvicorn.should_exit = True
        await self.task


async def start_server(
    settings: Settings | None = None,
    store: ChannelStore | None = None,
    *,
    agent: Agent | None = None,
    turn_store: TurnStore | None = None,
    workers: int = 1,
    clock: Callable[[], float] = time.time,
) -> RunningServer:
    """A server on a free port; with ``agent``, people's turns start it;
    ``clock`` is the host's (tests that move time pass one of their own)."""
    settings = settings or Settings(port=0)
    authority = TokenAuthority(AGENT_TOKEN)
    parts = build(
        settings,
        store=store or MemoryStore(retention=settings.replay_window),
        agent=agent,
        turn_store=turn_store,
        workers=workers,
        clock=clock,
    )
    app = create_app(parts, authority)
    server = UvicornServer(uvicorn_config(app, settings, port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10 * UNIT):
        await server.listening.wait()
    return RunningServer(app.state.server, server, task, authority)


@pytest.fixture
async def huddle() -> AsyncIterator[RunningServer]:
    running = await start_server()
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
def limits() -> Limits:
    return Limits()


def user_message(text: str) -> Message:
    return Message(text=text, origin=MessageOrigin(kind="user"))


async def new_session_chat(client: HuddleClient, session: str, *, title: str | None = None) -> str:
    """Create ``session`` as ``client`` (subscribed to it); returns its
    default chat's URI."""
    await client.create_session(session, title=title)
    mirror = await client.subscribe(session)
    assert isinstance(mirror.state, SessionState)
    chat = mirror.state.default_chat
    assert chat is not None
    return chat


async def watched_chat(
    client: HuddleClient, session: str, *, title: str | None = None
) -> tuple[str, Mirror]:
    """As :func:`new_session_chat`, then subscribed to the chat too: its URI
    and its live mirror (which sees the chat's first turn start)."""
    chat = await new_session_chat(client, session, title=title)
    return chat, await client.subscribe(chat)


async def session_chat_with_turn(agent: HuddleClient, session: str, turn: ChatTurnStarted) -> str:
    """Create ``session`` as ``agent`` (subscribed) and start ``turn`` in its
    default chat; returns the chat's URI."""
    chat = await new_session_chat(agent, session)
    await agent.dispatch_and_wait(chat, turn)
    return chat


@dataclass
class WallClock:
    """A server's clock that starts at the real time and moves only when
    the test moves ``now``."""

    now: float = field(default_factory=time.time)

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> WallClock:
    return WallClock()


UNSWEPT = Settings(port=0, expiry_check_interval=3600.0)
"""The expiry sweeper never runs by itself: the tests sweep."""


@contextlib.asynccontextmanager
async def clocked_server(clock: WallClock) -> AsyncIterator[RunningServer]:
    """A server on ``clock``, whose expiries wait for the test to sweep."""
    running = await start_server(UNSWEPT, clock=clock)
    try:
        yield running
    finally:
        await running.stop()


class RecordReads(MemoryStore):
    """A memory store that tells when records are read."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self.read = asyncio.Event()

    async def get_record(self, kind: str, key: str) -> bytes | None:
        self.reads.append((kind, key))
        self.read.set()
        return await super().get_record(kind, key)

    async def records(self, kind: str) -> dict[str, bytes]:
        self.reads.append((kind, "*"))
        return await super().records(kind)


@pytest.fixture
async def redis_server() -> AsyncIterator[RedisServer]:
    """A redis-server of the test's own (real, started from the binary)."""
    async with running_redis(10 * UNIT) as server:
        yield server


def drop_socket(client: HuddleClient) -> None:
    """Cut ``client``'s socket as a network would (no closing handshake);
    the client reconnects by itself."""
    assert client._ws is not None
    client._ws.transport.abort()
