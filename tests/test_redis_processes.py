"""Several ``huddle serve`` processes on one Redis: one system."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.actions import ChatInputAnswerChanged, ChatInputCompleted, ChatTurnStarted
from protocol.chat import ChatState, InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.session import SessionState
from reducers.chat import select_input_settlement
from server.client import HuddleClient
from tests.conftest import UNIT, user_message
from tests.redis_server import RedisServer
from tests.test_serve_cli import TOKEN, Served, start

pytestmark = pytest.mark.redis

FORM = InputRequest(
    id="details",
    message="Ticket details",
    questions=[TextQuestion(id=q, message=q) for q in ("system", "scope", "note")],
)


@pytest.fixture
async def two_servers(redis_server: RedisServer) -> AsyncIterator[tuple[Served, Served]]:
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": redis_server.url, "HUDDLE_AGENT": "none"}
    first = await start(env=env)
    second = await start(env=env)
    try:
        yield first, second
    finally:
        for served in (first, second):
            if served.process.returncode is None:
                served.process.kill()
                await served.process.wait()


def ws(served: Served) -> str:
    return f"ws://127.0.0.1:{served.port}/ahp"


def draft(text: str) -> InputAnswer:
    return InputAnswer(state="draft", value=TextValue(value=text))


async def test_clients_on_two_processes_co_edit_one_request(
    two_servers: tuple[Served, Served],
) -> None:
    a_server, b_server = two_servers
    agent = await HuddleClient.connect(ws(a_server), TOKEN)
    await agent.create_session("ahp-session:/shared")
    session = await agent.subscribe("ahp-session:/shared")
    assert isinstance(session.state, SessionState)
    chat = session.state.default_chat
    assert chat is not None
    alice = await HuddleClient.connect(ws(a_server), TOKEN)
    bob = await HuddleClient.connect(ws(b_server), TOKEN)
    alice_chat = await alice.subscribe(chat)
    bob_chat = await bob.subscribe(chat)
    seen: dict[str, list[int]] = {"alice": [], "bob": []}
    alice_chat.listeners.append(lambda e: seen["alice"].append(e.server_seq))
    bob_chat.listeners.append(lambda e: seen["bob"].append(e.server_seq))
    start_seq = alice_chat.seq
    await bob.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1",
            started_at="2026-11-30T10:00:00.000Z",
            message=user_message("Nobody can log in"),
        ),
    )
    agent_chat = await agent.subscribe(chat)
    async with asyncio.timeout(5 * UNIT):
        await agent_chat.wait_for(lambda s: isinstance(s, ChatState) and s.active_turn is not None)
    asking = asyncio.create_task(agent.request_input(chat, FORM))
    async with asyncio.timeout(5 * UNIT):
        await bob_chat.wait_for(
            lambda s: (
                isinstance(s, ChatState) and select_input_settlement(s, "details").status == "open"
            )
        )
    for n in range(10):
        await alice.dispatch(
            chat,
            ChatInputAnswerChanged(
                request_id="details", question_id="system", answer=draft(f"SSO {n}")
            ),
        )
        await bob.dispatch(
            chat,
            ChatInputAnswerChanged(
                request_id="details", question_id="scope", answer=draft(f"staff {n}")
            ),
        )
    await alice.dispatch_and_wait(chat, ChatInputCompleted(request_id="details", response="accept"))
    async with asyncio.timeout(10 * UNIT):
        completion = await asking
        final = max(alice_chat.seq, bob_chat.seq)
        await alice_chat.wait_for(lambda _: alice_chat.seq >= final)
        await bob_chat.wait_for(lambda _: bob_chat.seq >= final)
    assert completion.response == "accept"
    assert seen["alice"] == seen["bob"] == list(range(start_seq + 1, final + 1))
    for client in (agent, alice, bob):
        await client.close()
