"""Reconnect: replay inside the window, a snapshot outside it, no gaps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from msgspec.structs import replace

from protocol.actions import ChatInputAnswerChanged, ChatTurnStarted
from protocol.chat import ChatState, InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.session import SessionState
from server.config import Settings
from tests.conftest import UNIT, RunningServer, drop_socket, start_server, user_message

SESSION = "ahp-session:/reconnects"
asking: list[asyncio.Task[object]] = []
NOTE = InputRequest(id="q", questions=[TextQuestion(id="note", message="Notes")])


@pytest.fixture
async def small_window() -> AsyncIterator[RunningServer]:
    running = await start_server(Settings(port=0, replay_window=5, snapshot_every=5))
    try:
        yield running
    finally:
        await running.stop()


async def open_request(running: RunningServer) -> str:
    agent = await running.client("agent")
    await agent.create_session(SESSION)
    session = await agent.subscribe(SESSION)
    assert isinstance(session.state, SessionState)
    chat = session.state.default_chat
    assert chat is not None
    await agent.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1", started_at="2026-11-30T10:00:00.000Z", message=user_message("hello")
        ),
    )
    mirror = agent.mirrors[chat]
    asking.append(asyncio.create_task(agent.request_input(chat, NOTE)))
    async with asyncio.timeout(2 * UNIT):
        await mirror.wait_for(lambda _: has_parts(mirror.chat))
    return chat


def has_parts(state: ChatState) -> bool:
    return state.active_turn is not None and bool(state.active_turn.response_parts)


def same_state(mirrored: object, served: object) -> bool:
    """Equal but for modifiedAt, which a client stamps with its own clock."""
    assert isinstance(mirrored, ChatState)
    assert isinstance(served, ChatState)
    return replace(mirrored, modified_at="") == replace(served, modified_at="")


def typing(n: int) -> ChatInputAnswerChanged:
    return ChatInputAnswerChanged(
        request_id="q",
        question_id="note",
        answer=InputAnswer(state="draft", value=TextValue(value=f"draft {n}")),
    )


@pytest.mark.parametrize(
    ("missed", "how"),
    [
        pytest.param(3, "replay", id="inside-window"),
        pytest.param(30, "snapshot", id="outside-window"),
    ],
)
async def test_reconnect_catches_up_by_replay_or_snapshot(
    small_window: RunningServer, missed: int, how: str
) -> None:
    chat = await open_request(small_window)
    reader = await small_window.client(reconnect=False)
    mirror = await reader.subscribe(chat)
    writer = await small_window.client()
    drop_socket(reader)
    async with asyncio.timeout(2 * UNIT):
        await reader.lost.wait()
    for n in range(missed):
        await writer.dispatch_and_wait(chat, typing(n))
    await reader.reconnect()
    assert reader.resumed[chat] == how
    server_channel = await small_window.server.parts.host.view(chat)
    assert mirror.seq == server_channel.seq
    assert same_state(mirror.state, server_channel.state)


async def test_every_subscriber_sees_a_gapless_sequence_across_a_reconnect(
    huddle: RunningServer,
) -> None:
    chat = await open_request(huddle)
    reader = await huddle.client()
    mirror = await reader.subscribe(chat)
    seen: list[int] = []
    mirror.listeners.append(lambda envelope: seen.append(envelope.server_seq))
    writer = await huddle.client()
    first = mirror.seq
    for n in range(10):
        await writer.dispatch(chat, typing(n))
        if n == 4:
            drop_socket(reader)
    last = first + 10
    async with asyncio.timeout(5 * UNIT):
        await mirror.wait_for(lambda _: mirror.seq >= last)
    assert seen == list(range(first + 1, last + 1))
    assert reader.reconnects >= 1


async def test_reconnect_reports_a_channel_that_is_gone(huddle: RunningServer) -> None:
    chat = await open_request(huddle)
    reader = await huddle.client(reconnect=False)
    await reader.subscribe(chat)
    drop_socket(reader)
    async with asyncio.timeout(2 * UNIT):
        await reader.lost.wait()
    agent = await huddle.client("agent")
    await agent.call("disposeSession", {"channel": SESSION})
    await reader.reconnect()
    assert reader.resumed[chat] == "missing"
    assert chat not in reader.mirrors


async def test_subscribing_during_a_stream_of_actions_misses_nothing(
    huddle: RunningServer,
) -> None:
    chat = await open_request(huddle)
    writer = await huddle.client()
    readers = [await huddle.client(reconnect=False) for _ in range(5)]

    async def write() -> None:
        for n in range(60):  # within the per-connection burst
            await writer.dispatch(chat, typing(n))

    writing = asyncio.create_task(write())
    mirrors = [await reader.subscribe(chat) for reader in readers]
    await writing
    final = (await writer.dispatch_and_wait(chat, typing(60))).server_seq
    async with asyncio.timeout(5 * UNIT):
        for mirror in mirrors:
            await mirror.wait_for(lambda _, m=mirror: m.seq >= final)  # type: ignore[misc]
    assert all(not reader.lost.is_set() for reader in readers)
