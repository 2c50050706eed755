"""A chat's working directories: some of its session's, and never in the
session's catalog.

- AHP: a chat's ``workingDirectories`` are a subset of its session's, and a
  host MUST reject a ``chat/workingDirectorySet`` or a ``createChat`` entry
  that is not one of them (the rule's cases are the shared ones of
  ``tests/fixtures/validation/working-directories.json``; over the wire in
  ``tests/test_edge_validation.py``); ``createChat`` is refused before
  anything is created, and a chat it makes works in the directories it
  names;
- when the session loses a directory its chats keep theirs (AHP says
  nothing; Huddle leaves them);
- the session's catalog leaves a chat's directories out, so that a session
  at its caps (1,000 chats, the largest titles, every chat in 50 working
  directories of 1 KiB) still loads for a client that subscribes, over a
  real server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatWorkingDirectorySet,
    SessionWorkingDirectoryRemoved,
    SessionWorkingDirectorySet,
)
from protocol.chat import ChatState
from protocol.codec import encode
from protocol.rejections import Rejection, RejectionCode
from protocol.session import SessionState
from reducers.aggregate import chat_summary, derive_session_actions
from reducers.limits import SizeLimits, json_bytes
from reducers.validation import working_directories_problem
from server.config import Limits, Settings
from server.core.sessions import new_chat
from server.errors import ActionRejected, ChannelGone
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, start_server
from tests.edge import Frame, Peer

SESSION = "ahp-session:/workspace"
API, WEB = "file:///srv/api", "file:///srv/web"
INVALID_PARAMS = -32602
LARGEST_TITLE = '"' * 512
"""A title of 1,024 bytes as JSON, as large as a title may be."""


def directories(count: int, size: int) -> list[str]:
    """``count`` distinct directories of ``size`` bytes of JSON each."""
    return [f"file:///{n:04d}".ljust(size, "d") for n in range(count)]


# ─── Pure: the rule for several directories, the catalog ─────────────────────

ACME = SessionState(
    provider="huddle",
    title="s",
    status=1,
    lifecycle="ready",
    active_clients=[],
    chats=[],
    working_directories=[API, WEB],
)


@pytest.mark.parametrize(
    ("asked", "missing"),
    [
        pytest.param([], None, id="none"),
        pytest.param([WEB, API, WEB], None, id="all-of-the-sessions"),
        pytest.param([API, "file:///etc", "file:///root"], "file:///etc", id="the-first-missing"),
    ],
)
def test_a_chats_directories_must_all_be_the_sessions(asked: list[str], missing: str) -> None:
    got = working_directories_problem(ACME, asked)

    if missing is None:
        assert got is None
    else:
        assert got == Rejection(
            RejectionCode.UNKNOWN_DIRECTORY,
            f"the session has no working directory {missing}; add it to the session first",
        )


def test_the_catalog_never_carries_a_chats_working_directories() -> None:
    blank = new_chat(SESSION, "ahp-chat:/c", "Chat", "2026-01-01T00:00:00.000Z")
    focused = replace(blank, working_directories=[API])

    assert chat_summary(focused).working_directories is None
    assert chat_summary(focused) == chat_summary(blank)
    assert derive_session_actions(blank, focused) == []
    assert derive_session_actions(focused, replace(focused, working_directories=None)) == []


def test_a_new_chat_takes_each_directory_once_in_order() -> None:
    chat = new_chat(SESSION, "ahp-chat:/c", "Chat", "t", [WEB, API, WEB])
    assert chat.working_directories == [WEB, API]
    assert new_chat(SESSION, "ahp-chat:/c", "Chat", "t", []).working_directories == []
    assert new_chat(SESSION, "ahp-chat:/c", "Chat", "t").working_directories is None


# ─── createChat, and a session losing a directory ────────────────────────────


@pytest.fixture
async def running() -> AsyncIterator[RunningServer]:
    server = await start_server(Settings(port=0))
    try:
        yield server
    finally:
        await server.stop()


async def workspace(running: RunningServer, *held: str) -> Peer:
    """The session, working in ``held``; a participant's peer."""
    agent = await running.client("agent", name="agent")
    await agent.create_session(SESSION)
    for directory in held:
        await agent.dispatch_and_wait(SESSION, SessionWorkingDirectorySet(directory=directory))
    return await Peer.ready(running.ws, running.token(name="Lee"), "lee")


async def create_chat(peer: Peer, chat: str, **params: Any) -> Frame:
    return await peer.request("createChat", {"channel": SESSION, "chat": chat, **params})


async def state_of(running: RunningServer, uri: str) -> Any:
    return (await running.server.host.view(uri)).state


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param({}, id="alone"),
        pytest.param(
            {"initialMessage": {"text": "Build it", "origin": {"kind": "user"}}},
            id="with-an-initial-message",
        ),
    ],
)
async def test_create_chat_refuses_a_directory_the_session_does_not_have(
    running: RunningServer, extra: Frame
) -> None:
    peer = await workspace(running, API)
    before = await state_of(running, SESSION)

    reply = await create_chat(
        peer, "ahp-chat:/outside", workingDirectories=[API, "file:///etc"], **extra
    )

    assert reply["error"]["code"] == INVALID_PARAMS, reply
    assert reply["error"]["message"] == (
        "unknown-directory: the session has no working directory file:///etc; "
        "add it to the session first - at `$.params.workingDirectories`"
    )
    assert reply["error"]["data"] == {"path": "$.params.workingDirectories"}
    with pytest.raises(ChannelGone):
        await running.server.host.view("ahp-chat:/outside")
    assert await state_of(running, SESSION) == before


async def test_a_created_chat_works_in_the_directories_it_names(running: RunningServer) -> None:
    peer = await workspace(running, API, WEB)

    reply = await create_chat(peer, "ahp-chat:/web", workingDirectories=[WEB, WEB])
    assert "result" in reply, reply
    plain = await create_chat(peer, "ahp-chat:/all")
    assert "result" in plain, plain

    web = await state_of(running, "ahp-chat:/web")
    assert isinstance(web, ChatState)
    assert web.working_directories == [WEB]
    everything = await state_of(running, "ahp-chat:/all")
    assert isinstance(everything, ChatState)
    assert everything.working_directories is None  # AHP: absent, the session's whole set
    session = await state_of(running, SESSION)
    assert isinstance(session, SessionState)
    assert [c.working_directories for c in session.chats] == [None, None, None]


async def test_the_in_process_api_refuses_a_directory_the_session_does_not_have(
    running: RunningServer,
) -> None:
    await workspace(running, API)
    host = running.server.host

    with pytest.raises(ActionRejected) as refused:
        await host.create_chat(SESSION, "ahp-chat:/outside", working_directories=[WEB])
    assert refused.value.code == RejectionCode.UNKNOWN_DIRECTORY
    await host.create_chat(SESSION, "ahp-chat:/api", working_directories=[API])

    with pytest.raises(ChannelGone):
        await host.view("ahp-chat:/outside")
    chat = await state_of(running, "ahp-chat:/api")
    assert isinstance(chat, ChatState)
    assert chat.working_directories == [API]


async def test_a_chat_keeps_a_directory_its_session_loses(running: RunningServer) -> None:
    peer = await workspace(running, API, WEB)
    assert "result" in await create_chat(peer, "ahp-chat:/api", workingDirectories=[API])
    await peer.subscribe("ahp-chat:/api")
    await peer.subscribe(SESSION)

    await peer.dispatch(SESSION, SessionWorkingDirectoryRemoved(directory=API))
    assert "rejectionReason" not in await peer.envelope()
    await peer.dispatch("ahp-chat:/api", ChatWorkingDirectorySet(directory=API))
    echo = await peer.envelope()

    assert echo["rejectionReason"].startswith("unknown-directory: ")
    chat = await state_of(running, "ahp-chat:/api")
    assert isinstance(chat, ChatState)
    assert chat.working_directories == [API]


# ─── A session at its caps still loads ───────────────────────────────────────


@pytest.fixture
async def roomy() -> AsyncIterator[RunningServer]:
    """Default sizes; participants' budgets large enough to fill a session
    quickly (the fill is what a patient participant could do anyway)."""
    limits = Limits(actions_per_second=1e6, action_burst=1_000_000)
    server = await start_server(Settings(port=0, limits=limits))
    try:
        yield server
    finally:
        await server.stop()


async def test_a_session_at_its_caps_with_every_chat_in_every_directory_still_loads(
    roomy: RunningServer,
) -> None:
    sizes = roomy.server.host.sizes
    assert sizes == SizeLimits()
    budget = roomy.server.settings.limits.send_buffer // 2
    held = directories(sizes.working_directories, sizes.uri)
    assert {json_bytes(d) for d in held} == {sizes.uri}
    agent = await roomy.client("agent", name="agent")
    await agent.create_session(SESSION, title=LARGEST_TITLE)
    session = await agent.subscribe(SESSION)
    assert isinstance(session.state, SessionState)
    main = session.state.default_chat
    assert main is not None
    lee = await roomy.client("participant", name="Lee")
    await lee.subscribe(SESSION)
    await lee.subscribe(main)
    for directory in held:  # the session's, then the default chat's
        await lee.dispatch_and_wait(SESSION, SessionWorkingDirectorySet(directory=directory))
        await lee.dispatch_and_wait(main, ChatWorkingDirectorySet(directory=directory))
    # The agent's tokens: a person's stop at nine tenths of the chats.
    people = [await Peer.ready(roomy.ws, AGENT_TOKEN, f"agent-{n}") for n in range(8)]

    async def fill(peer: Peer, start: int) -> None:
        for n in range(start, sizes.chats - 1, len(people)):
            chat = f"ahp-chat:/{n:03d}" + "x" * 124  # the longest chat URI there is
            reply = await create_chat(peer, chat, title=LARGEST_TITLE, workingDirectories=held)
            assert "result" in reply, reply

    async with asyncio.timeout(120 * UNIT):
        await asyncio.gather(*(fill(peer, n) for n, peer in enumerate(people)))
    for peer in people:
        await peer.close()

    kept = await state_of(roomy, main)
    assert isinstance(kept, ChatState)
    assert kept.working_directories == held  # each chat's own state holds them
    late = await roomy.client("participant", name="late")  # reads frames of any size
    async with asyncio.timeout(10 * UNIT):
        mirror = await late.subscribe(SESSION)

    assert isinstance(mirror.state, SessionState)
    assert len(mirror.state.chats) == sizes.chats
    assert mirror.state.working_directories == held
    assert mirror.state == await state_of(roomy, SESSION)
    assert len(encode(mirror.state)) <= budget  # the snapshot: a session's is never windowed
