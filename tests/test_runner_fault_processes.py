"""Faults injected for real: a ``huddle worker`` process killed with SIGKILL
in the middle of a tool, of a streamed reply and of an MCP call whose server
asks the people, and another worker process taking the turn over once the
lease (1 s here) has expired; and a worker stopped with SIGTERM in the middle
of a tool, as a rolling deploy stops it, which lets the tool finish or hands
the turn on at once (a lease of a minute there: nothing waits for it). A
``huddle serve`` process takes the people's actions; everything shares one
real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from protocol.actions import ChatInputCompleted, ChatToolCallComplete, ChatTurnStarted
from protocol.chat import (
    ChatState,
    InputRequestPart,
    MarkdownPart,
    NumberValue,
    SelectedValue,
    ToolCallPart,
    ToolCallRunning,
)
from protocol.messages import ActionEnvelope
from protocol.uris import channel_id
from server.client import HuddleClient, Mirror
from server.runner.ids import parse_mcp_request_id
from server.runner.showing import INTERRUPTED
from tests.conftest import UNIT, user_message, watched_chat
from tests.fault_agents import runs
from tests.mcp_kit import input_parts, submitted
from tests.redis_server import RedisServer
from tests.test_serve_cli import TOKEN, Served, read_until, start

pytestmark = pytest.mark.redis

WITHIN = 20 * UNIT
"""A lease expiring, a process starting and a stdio MCP server starting."""


@dataclass
class Deployment:
    """A server and its worker processes on one Redis, for one agent."""

    env: dict[str, str]
    directory: Path
    server: Served
    workers: list[asyncio.subprocess.Process] = field(default_factory=list)
    drains: list[asyncio.Task[None]] = field(default_factory=list)
    said: list[str] = field(default_factory=list)
    """What the workers printed, line by line."""
    heard: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at each line a worker prints."""

    async def start_worker(self) -> asyncio.subprocess.Process:
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            "worker",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.env},
        )
        self.workers.append(worker)
        await read_until(worker, [], "huddle worker:")
        self.drains.append(asyncio.create_task(self._drain(worker)))
        return worker

    async def _drain(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            self.said.append(line.decode(errors="replace"))
            self.heard.set()

    async def printed(self, text: str) -> None:
        """Wait until a worker printed a line holding ``text``."""
        async with asyncio.timeout(WITHIN):
            while not any(text in line for line in self.said):
                self.heard.clear()
                await self.heard.wait()

    async def kill(self, worker: asyncio.subprocess.Process) -> None:
        worker.kill()  # SIGKILL: no handler, no cleanup, no last save
        await worker.wait()

    def stop(self, worker: asyncio.subprocess.Process) -> None:
        worker.send_signal(signal.SIGTERM)  # as an operator or an orchestrator stops it

    def release(self) -> None:
        (self.directory / "release").touch()

    async def tool_ran(self, times: int) -> None:
        """Wait until tool bodies ran ``times`` times (another process writes
        the record: there is nothing to await)."""
        async with asyncio.timeout(WITHIN):
            while len(runs(self.directory)) < times:  # noqa: ASYNC110
                await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def deployed(
    redis_server: RedisServer, tmp_path: Path, agent: str, **settings: str
) -> AsyncIterator[Deployment]:
    """``settings``: more of the processes' environment (HUDDLE_*)."""
    env = {
        "HUDDLE_TOKEN": TOKEN,
        "HUDDLE_STORE": redis_server.url,
        "HUDDLE_AGENT": f"tests.fault_agents:{agent}",
        "HUDDLE_LEASE_SECONDS": "1",
        "HUDDLE_FAULTS_DIR": str(tmp_path),
        **settings,
    }
    server = await start("--workers", "0", env=env)
    deployment = Deployment(env, tmp_path, server)
    try:
        yield deployment
    finally:
        for process in (server.process, *deployment.workers):
            if process.returncode is None:
                process.kill()
                await process.wait()
        for drain in deployment.drains:
            drain.cancel()


async def start_turn(deployment: Deployment, ask: str) -> tuple[HuddleClient, str, Mirror]:
    person = await HuddleClient.connect(
        f"ws://127.0.0.1:{deployment.server.port}/ahp", TOKEN, client_id="alice"
    )
    chat, mirror = await watched_chat(person, "ahp-session:/faults")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-01-10T10:00:00.000Z", message=user_message(ask)
    )
    await person.dispatch_and_wait(chat, started)
    return person, chat, mirror


async def until(mirror: Mirror, predicate: Callable[[ChatState], bool]) -> ChatState:
    def check(state: object) -> bool:
        return isinstance(state, ChatState) and predicate(state)

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(check)
    assert isinstance(state, ChatState)
    return state


def ended(state: ChatState) -> bool:
    return state.active_turn is None and bool(state.turns)


def active_parts(state: ChatState) -> list[object]:
    return list(state.active_turn.response_parts) if state.active_turn else []


def running_tool(state: ChatState) -> bool:
    return any(
        isinstance(p, ToolCallPart) and isinstance(p.tool_call, ToolCallRunning)
        for p in active_parts(state)
    )


def markdown(state: ChatState) -> dict[str, str]:
    return {p.id: p.content for p in state.turns[-1].response_parts if isinstance(p, MarkdownPart)}


async def test_a_worker_killed_in_a_tool_is_taken_over_and_the_tool_runs_again_with_its_key(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with deployed(redis_server, tmp_path, "exporter") as deployment:
        first = await deployment.start_worker()
        person, chat, mirror = await start_turn(deployment, "Export the ledger")
        completions: list[ActionEnvelope] = []
        mirror.listeners.append(
            lambda e: completions.append(e) if isinstance(e.action, ChatToolCallComplete) else None
        )
        await until(mirror, running_tool)
        await deployment.tool_ran(1)  # inside the body now
        await deployment.kill(first)
        await deployment.start_worker()
        deployment.release()
        state = await until(mirror, ended)
        await person.close()
    assert state.turns[-1].state == "complete"
    assert markdown(state)["t1:md:1"] == "Done: exported the ledger."
    # The body ran twice (a killed tool cannot be resumed, only replayed),
    # both times under the same key; the chat shows one completion.
    key = f"{channel_id(chat)}.t1:c1"
    assert runs(tmp_path) == [("slow_export", key), ("slow_export", key)]
    assert len(completions) == 1


LONG_LEASE = "60"
"""A lease no test outlives: a turn taken over within WITHIN was handed on."""


@dataclass
class Exporting:
    """A deployment whose one worker is inside the exporter's tool."""

    deployment: Deployment
    worker: asyncio.subprocess.Process
    person: HuddleClient
    chat: str
    mirror: Mirror


@contextlib.asynccontextmanager
async def exporting(
    redis_server: RedisServer, tmp_path: Path, drain: str
) -> AsyncIterator[Exporting]:
    async with deployed(
        redis_server,
        tmp_path,
        "exporter",
        HUDDLE_LEASE_SECONDS=LONG_LEASE,
        HUDDLE_DRAIN_SECONDS=drain,
    ) as deployment:
        worker = await deployment.start_worker()
        person, chat, mirror = await start_turn(deployment, "Export the ledger")
        await until(mirror, running_tool)
        await deployment.tool_ran(1)
        yield Exporting(deployment, worker, person, chat, mirror)
        await person.close()


async def test_a_worker_stopped_in_a_tool_lets_the_tool_finish_and_the_turn_go_on_first(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with exporting(redis_server, tmp_path, str(10 * WITHIN)) as run:
        run.deployment.stop(run.worker)
        await run.deployment.printed("huddle worker: stopping")
        run.deployment.release()  # the tool may finish now: the stop waits for it
        state = await until(run.mirror, ended)
        async with asyncio.timeout(WITHIN):
            code = await run.worker.wait()
    assert code == 0
    assert state.turns[-1].state == "complete"
    assert markdown(state)["t1:md:1"] == "Done: exported the ledger."
    assert runs(tmp_path) == [("slow_export", f"{channel_id(run.chat)}.t1:c1")]  # once


async def test_a_worker_stopped_in_a_tool_past_its_drain_hands_the_turn_on_at_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with exporting(redis_server, tmp_path, "0") as run:
        run.deployment.stop(run.worker)
        async with asyncio.timeout(WITHIN):
            code = await run.worker.wait()
        await run.deployment.start_worker()
        await run.deployment.tool_ran(2)  # taken over long before the lease ends
        run.deployment.release()
        state = await until(run.mirror, ended)
    assert code == 0
    assert state.turns[-1].state == "complete"
    key = f"{channel_id(run.chat)}.t1:c1"
    assert runs(tmp_path) == [("slow_export", key), ("slow_export", key)]


async def test_text_a_killed_worker_streamed_is_marked_interrupted_and_the_retry_has_its_own(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with deployed(redis_server, tmp_path, "talker") as deployment:
        first = await deployment.start_worker()
        person, _, mirror = await start_turn(deployment, "Tell me")
        await until(mirror, lambda s: any(isinstance(p, MarkdownPart) for p in active_parts(s)))
        await deployment.kill(first)
        await deployment.start_worker()
        state = await until(mirror, ended)
        await person.close()
    assert state.turns[-1].state == "complete"
    assert markdown(state) == {
        "t1:md:0": "The first half" + INTERRUPTED,
        "t1:md:0.1": "The whole answer.",
    }


async def test_an_mcp_question_left_open_by_a_killed_worker_is_withdrawn_and_asked_again(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async with deployed(redis_server, tmp_path, "booker") as deployment:
        first = await deployment.start_worker()
        person, chat, mirror = await start_turn(deployment, "A table for four")

        def open_mcp(state: ChatState) -> list[InputRequestPart]:
            return [
                p
                for p in input_parts(state)
                if p.response is None and parse_mcp_request_id(p.request.id) is not None
            ]

        asked = open_mcp(await until(mirror, lambda s: bool(open_mcp(s))))[0]
        await deployment.kill(first)
        await deployment.start_worker()

        def asked_again(state: ChatState) -> bool:
            withdrawn = [p for p in input_parts(state) if p.request.id == asked.request.id]
            return withdrawn[0].response == "cancel" and bool(open_mcp(state))

        again = open_mcp(await until(mirror, asked_again))[0]
        assert again.request.message == "bookings asks: Booking at Chez Huddle"
        answers = submitted(party=NumberValue(value=4), time=SelectedValue(value="19:30"))
        await person.dispatch_and_wait(
            chat,
            ChatInputCompleted(request_id=again.request.id, response="accept", answers=answers),
        )
        state = await until(mirror, ended)
        await person.close()
    assert state.turns[-1].state == "complete"
    assert "Booked Chez Huddle for 4 (int) at 19:30" in markdown(state)["t1:md:1"]
