"""AHP commands over the wire: sessions, chats, lists, turn history."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from protocol.actions import ChatTurnComplete, ChatTurnStarted
from protocol.chat import ChatState
from protocol.session import SessionState
from protocol.uris import ROOT_URI
from server.client import HuddleClient, ProtocolError
from tests.conftest import UNIT, RunningServer, user_message


async def default_chat(client: HuddleClient, session: str) -> str:
    mirror = await client.subscribe(session)
    assert isinstance(mirror.state, SessionState)
    assert mirror.state.default_chat is not None
    return mirror.state.default_chat


async def test_create_session_announces_it_on_the_root_channel(huddle: RunningServer) -> None:
    watcher = await huddle.client()
    notices: list[tuple[str, Any]] = []
    arrived = asyncio.Event()

    def note(method: str, params: Any) -> None:
        notices.append((method, params))
        arrived.set()

    watcher.notices.append(note)
    await watcher.subscribe(ROOT_URI)
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/announced", title="Printer on fire")
    async with asyncio.timeout(2 * UNIT):
        while not any(m == "root/sessionAdded" for m, _ in notices):
            arrived.clear()
            await arrived.wait()
    added = next(p for m, p in notices if m == "root/sessionAdded")
    assert added["summary"]["resource"] == "ahp-session:/announced"
    assert added["summary"]["title"] == "Printer on fire"


async def test_create_session_twice_is_an_error(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/twice")
    with pytest.raises(ProtocolError) as error:
        await agent.create_session("ahp-session:/twice")
    assert error.value.code == -32003


async def test_create_chat_adds_it_to_the_session_catalog(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/chats")
    session = await agent.subscribe("ahp-session:/chats")
    await agent.call(
        "createChat", {"channel": "ahp-session:/chats", "chat": "ahp-chat:/side", "title": "Side"}
    )
    async with asyncio.timeout(2 * UNIT):
        state = await session.wait_for(lambda s: isinstance(s, SessionState) and len(s.chats) == 2)
    assert isinstance(state, SessionState)
    assert [c.title for c in state.chats] == ["Main", "Side"]
    chat = await agent.subscribe("ahp-chat:/side")
    assert isinstance(chat.state, ChatState)


async def test_create_chat_in_a_session_that_is_gone_is_not_found(
    huddle: RunningServer,
) -> None:
    # A page still showing a disposed session may ask: it gets an answer, and
    # its connection stays (the error was once a bug that closed it, 1011).
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/gone")
    await agent.call("disposeSession", {"channel": "ahp-session:/gone"})
    participant = await huddle.client()
    with pytest.raises(ProtocolError) as error:
        await participant.call(
            "createChat", {"channel": "ahp-session:/gone", "chat": "ahp-chat:/orphan"}
        )
    assert error.value.code == -32001
    assert error.value.message == "no session ahp-session:/gone"
    assert await participant.call("ping", {"channel": ROOT_URI}) is None


async def test_list_sessions_pages_most_recent_first(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    for n in range(5):
        await agent.create_session(f"ahp-session:/list-{n}", title=f"Ticket {n}")
    first = await agent.call("listSessions", {"channel": ROOT_URI, "limit": 2})
    assert len(first["items"]) == 2
    second = await agent.call(
        "listSessions", {"channel": ROOT_URI, "limit": 10, "cursor": first["nextCursor"]}
    )
    assert "nextCursor" not in second
    titles = [s["title"] for s in first["items"] + second["items"]]
    assert sorted(titles) == [f"Ticket {n}" for n in range(5)]
    with pytest.raises(ProtocolError) as error:
        await agent.call("listSessions", {"channel": ROOT_URI, "cursor": "nonsense"})
    assert error.value.code == -32602


async def test_scoped_participant_lists_only_its_sessions(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/mine")
    await agent.create_session("ahp-session:/theirs")
    scoped = await huddle.client(sessions=["ahp-session:/mine"])
    listed = await scoped.list_sessions()
    assert [s["resource"] for s in listed] == ["ahp-session:/mine"]


async def test_fetch_turns_pages_older_turns_behind_a_windowed_snapshot(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/history")
    chat = await default_chat(agent, "ahp-session:/history")
    for n in range(7):
        await agent.dispatch_and_wait(
            chat,
            ChatTurnStarted(
                turn_id=f"t{n}",
                started_at="2026-11-30T10:00:00.000Z",
                message=user_message(f"question {n}"),
            ),
        )
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    reader = await huddle.client()
    mirror = await reader.subscribe(chat, turns=3)
    assert [t.id for t in mirror.chat.turns] == ["t4", "t5", "t6"]
    cursor = mirror.chat.turns_next_cursor
    assert cursor is not None
    page = await reader.call("fetchTurns", {"channel": chat, "cursor": cursor, "limit": 3})
    assert [t["id"] for t in page["turns"]] == ["t1", "t2", "t3"]
    last = await reader.call(
        "fetchTurns", {"channel": chat, "cursor": page["turnsNextCursor"], "limit": 3}
    )
    assert [t["id"] for t in last["turns"]] == ["t0"]
    assert "turnsNextCursor" not in last


async def test_dispose_session_removes_it_for_everyone(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/gone")
    await agent.call("disposeSession", {"channel": "ahp-session:/gone"})
    assert await agent.list_sessions() == []
    with pytest.raises(ProtocolError) as error:
        await agent.subscribe("ahp-session:/gone")
    assert error.value.code == -32001


async def test_participants_cannot_dispose_sessions(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/kept")
    participant = await huddle.client()
    with pytest.raises(ProtocolError) as error:
        await participant.call("disposeSession", {"channel": "ahp-session:/kept"})
    assert error.value.code == -32009
