"""The web client's chats in a real Chromium against a real server: starting
a new chat in a session (plain AHP ``createChat``), which observers cannot,
and the way on from a chat that is full (``chat-full``), taking what was
typed along.

Every wait is an auto-waiting Playwright assertion or an awaited server
event, bounded by a multiple of UNIT.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from playwright.async_api import Browser, Locator, Page, expect

from protocol.actions import ChatTurnComplete, ChatTurnStarted
from protocol.chat import ChatState, Message, MessageOrigin
from protocol.session import SessionState
from reducers.limits import SizeLimits
from server.client import HuddleClient
from server.config import Settings
from server.errors import ActionRejected
from tests import test_web_client as web
from tests.conftest import UNIT, RunningServer, start_server
from tests.test_web_client import create_session, open_client, shot
from tests.test_web_people import Wire, recording

pytestmark = pytest.mark.browser

# The web client tests' Chromium and server, as fixtures of this module too.
browser = web.browser
plain_server = web.plain_server

CHAT_BYTES = 256 << 10
"""The size at which the small server's chats are full."""


@pytest.fixture
async def small_server() -> AsyncIterator[RunningServer]:
    """A server (no built-in agent) whose chats are full at CHAT_BYTES."""
    running = await start_server(Settings(port=0, sizes=SizeLimits(chat_bytes=CHAT_BYTES)))
    try:
        yield running
    finally:
        await running.stop()


# ─── Helpers ─────────────────────────────────────────────────────────────────


def tabs(page: Page) -> Locator:
    return page.get_by_role("navigation", name="Chats in this session").get_by_role("link")


def new_chat_button(page: Page) -> Locator:
    return page.get_by_role("button", name="New chat", exact=True)


def created_chats(wire: Wire) -> list[dict[str, Any]]:
    """The params of every ``createChat`` the page sent."""
    return [
        frame["params"]
        for sent in wire.sent
        for frame in sent
        if frame.get("method") == "createChat"
    ]


def sent_turns(wire: Wire) -> list[dict[str, Any]]:
    """The params of every ``chat/turnStarted`` the page dispatched."""
    return [
        params
        for socket in range(len(wire.sent))
        for params in wire.dispatched(socket, "chat/turnStarted")
    ]


async def agent(running: RunningServer) -> HuddleClient:
    return await running.client("agent", name="agent")


async def active_text(client: HuddleClient, chat: str) -> str:
    """The message of the chat's active turn, once it has one."""

    def started(state: object) -> bool:
        return isinstance(state, ChatState) and state.active_turn is not None

    mirror = client.mirrors.get(chat) or await client.subscribe(chat)
    async with asyncio.timeout(10 * UNIT):
        state = await mirror.wait_for(started)
    assert isinstance(state, ChatState)
    assert state.active_turn is not None
    return state.active_turn.message.text


async def fill(client: HuddleClient, chat: str) -> int:
    """Fill ``chat`` with turns of big messages, started and completed, as an
    agent would, until the server refuses the next one as full; returns how
    many turns it holds."""
    text = "x" * (60 << 10)
    refused: ActionRejected | None = None
    held = 0
    while refused is None and held < 4 * CHAT_BYTES // len(text):
        start = ChatTurnStarted(
            turn_id=f"fill-{held}",
            started_at="2026-12-01T10:00:00Z",
            message=Message(text=text, origin=MessageOrigin(kind="user")),
        )
        try:
            await client.dispatch_and_wait(chat, start)
        except ActionRejected as error:
            refused = error
            continue
        await client.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"fill-{held}", duration=1))
        held += 1
    assert refused is not None, "the chat never filled up"
    assert refused.code == "chat-full"
    return held


# ─── A new chat ──────────────────────────────────────────────────────────────


async def test_a_participant_starts_a_new_chat_writes_there_and_switches_back(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, main = await create_session(base, "Two topics")
    wire = Wire()
    _, page = await open_client(
        browser, base, plain_server.token(name="Lee"), session=session, prepare=recording(wire)
    )
    await expect(tabs(page)).to_have_count(0)  # one chat: no tabs

    # With the keyboard: the control is a labelled button.
    await new_chat_button(page).press("Enter")
    await expect(tabs(page)).to_have_text(["Main", "Chat 2"])
    await expect(tabs(page).filter(has_text="Chat 2")).to_have_attribute("aria-current", "page")
    composer = page.get_by_label("Message to the agent")
    await expect(composer).to_be_focused()
    await shot(page, "new-chat-open")

    # It asked in AHP's form: the session, the new chat's URI, nothing else.
    [params] = created_chats(wire)
    chat = params["chat"]
    assert params == {"channel": session, "chat": chat}
    assert re.fullmatch(r"ahp-chat:/[0-9a-f]{16}", chat)
    state = (await plain_server.server.parts.host.view(session)).state
    assert isinstance(state, SessionState)
    assert [c.resource for c in state.chats] == [main, chat]

    # A message sent there starts a turn in the new chat, not in Main.
    await composer.fill("Second topic: the printer")
    await composer.press("Enter")
    bot = await agent(plain_server)
    assert await active_text(bot, chat) == "Second topic: the printer"
    main_state = (await plain_server.server.parts.host.view(main)).state
    assert isinstance(main_state, ChatState)
    assert main_state.active_turn is None
    assert main_state.turns == []

    # Back to Main, and to the new chat again.
    await tabs(page).filter(has_text="Main").click()
    await expect(tabs(page).filter(has_text="Main")).to_have_attribute("aria-current", "page")
    await expect(page.get_by_text("Nothing here yet")).to_be_visible()
    await expect(page.get_by_text("Second topic: the printer")).to_have_count(0)
    await tabs(page).filter(has_text="Chat 2").click()
    await expect(page.get_by_text("Second topic: the printer")).to_be_visible()
    await shot(page, "new-chat-switched-back")


async def test_an_observer_has_no_new_chat_control(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, _ = await create_session(base, "Watched")
    wire = Wire()
    _, olga = await open_client(
        browser,
        base,
        plain_server.token("observer", name="Olga"),
        session=session,
        prepare=recording(wire),
    )
    _, lee = await open_client(
        browser, base, plain_server.token(name="Lee"), session=session, width=390
    )
    await expect(new_chat_button(lee)).to_be_visible()  # at phone width too

    # The observer's page shows the session's chats as they come, never the control.
    bot = await agent(plain_server)
    await bot.call("createChat", {"channel": session, "chat": "ahp-chat:/by-the-agent"})
    await expect(tabs(olga)).to_have_text(["Main", "Chat 2"])
    await expect(olga.get_by_role("heading", name="Watched")).to_be_visible()
    await expect(new_chat_button(olga)).to_be_hidden()
    assert created_chats(wire) == []
    await shot(olga, "new-chat-observer")
    await expect(tabs(lee)).to_have_text(["Main", "Chat 2"])
    await shot(lee, "new-chat-phone")


async def test_a_new_chat_the_server_refuses_is_said_with_its_reason(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, _ = await create_session(base, "Going away")
    _, page = await open_client(browser, base, plain_server.token(name="Lee"), session=session)
    bot = await agent(plain_server)
    await bot.call("disposeSession", {"channel": session})

    await new_chat_button(page).click()
    await expect(
        page.get_by_role("alert").filter(has_text="Could not start a new chat")
    ).to_have_text(re.compile(rf"Could not start a new chat: no session {re.escape(session)}"))
    await expect(new_chat_button(page)).to_be_enabled()
    await expect(tabs(page)).to_have_count(0)


# ─── A full chat ─────────────────────────────────────────────────────────────


async def test_a_full_chat_offers_a_new_chat_that_opens_with_the_typed_text(
    browser: Browser, small_server: RunningServer
) -> None:
    base = small_server.http
    session, full = await create_session(base, "Long story")
    bot = await agent(small_server)
    held = await fill(bot, full)
    wire = Wire()
    _, page = await open_client(
        browser, base, small_server.token(name="Lee"), session=session, prepare=recording(wire)
    )
    await expect(page.locator("article.turn")).to_have_count(held)

    # The person's message is refused: the page says why and keeps the text.
    composer = page.get_by_label("Message to the agent")
    await composer.fill("Where were we?")
    await composer.press("Enter")
    notice = page.get_by_role("alert").filter(has_text="This chat is full")
    await expect(notice).to_contain_text("Your message was not sent: the chat holds about")
    await expect(notice).to_contain_text(f"the limit is {CHAT_BYTES:,}: start a new chat")
    await expect(composer).to_have_value("Where were we?")
    await shot(page, "chat-full-notice")

    # Starting a new chat from the notice opens it with the text in its composer, unsent.
    await notice.get_by_role("button", name="Start a new chat").click()
    await expect(tabs(page)).to_have_text(["Main", "Chat 2"])
    await expect(tabs(page).filter(has_text="Chat 2")).to_have_attribute("aria-current", "page")
    await expect(composer).to_have_value("Where were we?")
    await expect(composer).to_be_focused()
    await expect(notice).to_be_hidden()
    await shot(page, "chat-full-new-chat")
    [params] = created_chats(wire)
    chat = params["chat"]

    # Sent by the person, it starts the new chat's first turn: the page sent
    # nothing by itself (one refused start in the full chat, this one).
    await composer.press("Enter")
    assert await active_text(bot, chat) == "Where were we?"
    starts = sent_turns(wire)
    assert [s["channel"] for s in starts] == [full, chat]
    assert [s["action"]["message"]["text"] for s in starts] == ["Where were we?"] * 2
    new_state = (await small_server.server.parts.host.view(chat)).state
    assert isinstance(new_state, ChatState)
    assert new_state.turns == []
    full_state = (await small_server.server.parts.host.view(full)).state
    assert isinstance(full_state, ChatState)
    assert full_state.active_turn is None
    assert len(full_state.turns) == held

    # Back in the full chat, the page still says it is full.
    await tabs(page).filter(has_text="Main").click()
    await expect(notice).to_be_visible()
