"""The demo story across processes: two servers and a worker on one Redis.

Two participants fill in the form on one server, a third approves on the
other, and the turn runs in a ``huddle worker`` process of its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatTurnStarted,
)
from protocol.chat import ChatState, InputAnswer, SelectedValue, TextValue
from protocol.messages import ActionEnvelope
from protocol.session import SessionState
from server.client import HuddleClient
from tests.conftest import UNIT, user_message
from tests.redis_server import RedisServer
from tests.test_runner_demo import final_text, open_request, pending_call, wait
from tests.test_serve_cli import TOKEN, Served, read_until, start

pytestmark = pytest.mark.redis


@dataclass
class Cluster:
    first: Served
    second: Served
    worker: asyncio.subprocess.Process

    def ws(self, served: Served) -> str:
        return f"ws://127.0.0.1:{served.port}/ahp"


@pytest.fixture
async def cluster(redis_server: RedisServer) -> AsyncIterator[Cluster]:
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": redis_server.url}
    first = await start("--workers", "0", env=env)
    second = await start("--workers", "0", env=env)
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "worker",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **env},
    )
    await read_until(worker, [], "huddle worker:")
    try:
        yield Cluster(first, second, worker)
    finally:
        for process in (first.process, second.process, worker):
            if process.returncode is None:
                process.kill()
                await process.wait()


def submitted(value: TextValue | SelectedValue) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


async def test_the_story_runs_in_a_worker_with_people_on_two_servers(cluster: Cluster) -> None:
    alice = await HuddleClient.connect(cluster.ws(cluster.first), TOKEN, client_id="alice")
    bob = await HuddleClient.connect(cluster.ws(cluster.first), TOKEN, client_id="bob")
    carol = await HuddleClient.connect(cluster.ws(cluster.second), TOKEN, client_id="carol")
    await alice.create_session("ahp-session:/outage")
    session = await alice.subscribe("ahp-session:/outage")
    assert isinstance(session.state, SessionState)
    chat = session.state.default_chat
    assert chat is not None
    alice_chat, bob_chat, carol_chat = (
        await alice.subscribe(chat),
        await bob.subscribe(chat),
        await carol.subscribe(chat),
    )
    completions: list[ActionEnvelope] = []
    carol_chat.listeners.append(
        lambda e: completions.append(e) if isinstance(e.action, ChatToolCallComplete) else None
    )
    await alice.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1",
            started_at="2026-11-30T10:00:00.000Z",
            message=user_message("Open a high-priority ticket: nobody can log in"),
        ),
    )
    state = await wait(bob_chat, lambda s: open_request(s) is not None)
    request = open_request(state)
    assert request is not None
    rid = request.request.id
    await alice.dispatch_and_wait(
        chat,
        ChatInputAnswerChanged(
            request_id=rid,
            question_id="affectedSystem",
            answer=submitted(TextValue(value="Single sign-on")),
        ),
    )
    await bob.dispatch_and_wait(
        chat,
        ChatInputAnswerChanged(
            request_id=rid,
            question_id="impactScope",
            answer=submitted(SelectedValue(value="ALL_USERS")),
        ),
    )
    await bob.dispatch_and_wait(chat, ChatInputCompleted(request_id=rid, response="accept"))
    state = await wait(carol_chat, lambda s: pending_call(s) is not None)
    call = pending_call(state)
    assert call is not None
    await carol.dispatch_and_wait(
        chat,
        ChatToolCallConfirmed(
            turn_id="t1", tool_call_id=call.tool_call_id, approved=True, confirmed="user-action"
        ),
    )
    state = await wait(alice_chat, lambda s: isinstance(s, ChatState) and bool(s.turns))
    assert state.turns[-1].state == "complete"
    assert "HUD-" in final_text(state)
    async with asyncio.timeout(5 * UNIT):
        await carol_chat.wait_for(lambda s: isinstance(s, ChatState) and bool(s.turns))
    assert len(completions) == 1  # the ticket was created exactly once
    for client in (alice, bob, carol):
        await client.close()
