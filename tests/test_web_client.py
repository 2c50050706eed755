"""The web client in a real Chromium (Debian's, driven by Playwright) against
a real Huddle server in this process.

Screenshots of each step go to ``tests/artifacts/`` (gitignored). Every wait
is an auto-waiting Playwright assertion or an awaited server event, bounded
by a multiple of UNIT.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import (
    Browser,
    BrowserContext,
    Dialog,
    Locator,
    Page,
    WebSocket,
    async_playwright,
    expect,
)

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputRequested,
    ChatResponsePart,
    ChatTurnStarted,
)
from protocol.chat import (
    BooleanQuestion,
    ChatState,
    InputAnswer,
    InputOption,
    InputRequest,
    InputRequestPart,
    IntegerQuestion,
    MarkdownPart,
    Message,
    MessageOrigin,
    MultiSelectQuestion,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
    ToolCallCancelled,
    ToolCallPart,
)
from protocol.session import SessionState
from protocol.status import SessionStatus
from reducers.clock import iso_time
from server.auth import TokenAuthority
from server.build import build
from server.client import HuddleClient
from server.config import Settings
from server.edge.app import create_app
from server.edge.connection import CLOSE_GOING_AWAY
from server.edge.serve import UvicornServer, uvicorn_config
from server.runner import demo
from server.runner.turn_store import MemoryTurnStore
from server.store.memory import MemoryStore
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, WallClock, start_server
from tests.edge import CuttingProxy

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 10_000 * UNIT
"""How long any one expectation may take, in milliseconds."""
TICKET = "Open a high-priority ticket: users cannot log in"

if not Path(CHROMIUM).exists():  # pragma: no cover - .ci/setup --test installs it
    pytest.skip("needs Debian's chromium (.ci/setup --test)", allow_module_level=True)

expect.set_options(timeout=WAIT_MS)


# ─── Fixtures and helpers ────────────────────────────────────────────────────


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            await chromium.close()


@pytest.fixture
async def demo_server() -> AsyncIterator[RunningServer]:
    running = await start_server(agent=demo.agent)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def plain_server() -> AsyncIterator[RunningServer]:
    """A server without a built-in agent: the test plays the agent."""
    running = await start_server()
    try:
        yield running
    finally:
        await running.stop()


def shot(page: Page, name: str) -> Any:
    ARTIFACTS.mkdir(exist_ok=True)
    return page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def create_session(base: str, title: str) -> tuple[str, str]:
    """A new session via the HTTP API; returns (session URI, default chat URI)."""
    async with httpx.AsyncClient(base_url=base, timeout=10 * UNIT) as http:
        response = await http.post(
            "/api/sessions",
            json={"title": title},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )
    response.raise_for_status()
    body = response.json()
    return body["session"], body["chat"]


def session_href(session: str) -> str:
    return "/#/s/" + session.split(":/", 1)[1]


async def open_client(
    browser: Browser,
    base: str,
    token: str,
    *,
    session: str | None = None,
    width: int = 1280,
    height: int = 900,
    drafts: list[dict[str, Any]] | None = None,
    prepare: Callable[[Page], Awaitable[None]] | None = None,
) -> tuple[BrowserContext, Page]:
    """A fresh browser profile that opened the web client's link (the token
    becomes a cookie), then the session. ``drafts`` collects the answer
    changes the page sends; ``prepare`` runs before the page loads anything
    (to install a clock or listen to its sockets)."""
    context = await browser.new_context(viewport={"width": width, "height": height})
    context.set_default_timeout(WAIT_MS)
    page = await context.new_page()
    if drafts is not None:
        record_drafts(page, drafts)
    if prepare is not None:
        await prepare(page)
    await page.goto(f"{base}/?token={token}")
    await expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    if session is not None:
        await page.goto(base + session_href(session))
        await expect(page.get_by_label("Message to the agent")).to_be_enabled()
        # The chat itself loaded, not only its session: its turns, or its
        # empty state, are shown.
        conversation = page.get_by_role("region", name="Conversation")
        empty = conversation.get_by_text("Nothing here yet")
        shown = conversation.get_by_role("article").or_(empty)
        await expect(shown.first).to_be_visible()
    return context, page


async def start_ticket_story(page: Page) -> None:
    """Ask the demo agent for a ticket and wait for its form."""
    # Once the chat has loaded (Send is enabled then): a turn sent before
    # is refused on the spot, "the chat is still loading", as a person sees.
    await expect(page.get_by_role("button", name="Send")).to_be_enabled()
    composer = page.get_by_label("Message to the agent")
    await composer.fill(TICKET)
    await composer.press("Enter")
    await expect(page.get_by_label("Affected system")).to_be_visible()


async def answer_ticket_form(page: Page, system: str = "SSO") -> None:
    await page.get_by_label("Affected system").fill(system)
    await page.get_by_label("Some users").check()
    await page.get_by_role("button", name="Submit").click()
    await expect(page.get_by_role("button", name="Approve")).to_be_visible()


async def chat_state(running: RunningServer, chat: str) -> ChatState:
    state = (await running.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    return state


async def start_agent_turn(running: RunningServer, chat: str, text: str = "Help me") -> str:
    """Open a turn as the agent side would (no built-in agent reacts)."""
    turn_id = "t-" + text.lower().replace(" ", "-")[:20]
    await running.server.parts.host.dispatch(
        chat,
        ChatTurnStarted(
            turn_id=turn_id,
            started_at=iso_time(running.server.parts.host.now_ms()),
            message=Message(text=text, origin=MessageOrigin(kind="user")),
        ),
    )
    return turn_id


def record_drafts(page: Page, sent: list[dict[str, Any]]) -> None:
    """Collect the ``chat/inputAnswerChanged`` actions the page sends."""

    def on_socket(ws: WebSocket) -> None:
        def on_frame(payload: str | bytes) -> None:
            frame = json.loads(payload)
            if frame.get("method") == "dispatchAction":
                action = frame["params"]["action"]
                if action["type"] == "chat/inputAnswerChanged":
                    sent.append(action)

        ws.on("framesent", on_frame)

    page.on("websocket", on_socket)


# ─── Co-editing ──────────────────────────────────────────────────────────────


async def test_two_people_co_edit_a_request_and_the_demo_agent_resumes(
    browser: Browser, demo_server: RunningServer
) -> None:
    session, chat = await create_session(demo_server.http, "Login failures")
    alice_drafts: list[dict[str, Any]] = []
    _, alice = await open_client(
        browser,
        demo_server.http,
        demo_server.token(name="alice"),
        session=session,
        drafts=alice_drafts,
    )
    _, bob = await open_client(
        browser, demo_server.http, demo_server.token(name="bob"), session=session, width=390
    )

    await start_ticket_story(alice)
    await expect(bob.get_by_label("Affected system")).to_be_visible()
    await shot(alice, "coedit-1-alice-form")
    await shot(bob, "coedit-1-bob-form")

    # Alice types question 1 key by key; Bob sees it appear.
    system = alice.get_by_label("Affected system")
    await system.press_sequentially("SSO gateway", delay=15)
    await expect(bob.get_by_label("Affected system")).to_have_value("SSO gateway")
    await shot(bob, "coedit-2-bob-sees-alice-typing")
    typed = [d for d in alice_drafts if d["questionId"] == "affectedSystem"]
    assert 1 <= len(typed) < len("SSO gateway"), "drafts are debounced, not sent per keystroke"

    # Bob answers question 2; Alice sees it, without losing her focus.
    await bob.get_by_label("Some users").check()
    await expect(alice.get_by_label("Some users")).to_be_checked()
    await expect(system).to_be_focused()
    await shot(alice, "coedit-3-alice-sees-bob-choice")

    # Alice submits; both see the answers resolved and the agent resume.
    await alice.get_by_role("button", name="Submit").click()
    for page in (alice, bob):
        await expect(page.get_by_text("Submitted", exact=True)).to_be_visible()
        await expect(page.get_by_role("button", name="Approve")).to_be_visible()
    await shot(bob, "coedit-4-bob-sees-approval")
    await bob.get_by_role("button", name="Approve").click()
    for page in (alice, bob):
        await expect(page.get_by_text("is open with high priority")).to_be_visible()
    await shot(alice, "coedit-5-alice-done")
    await shot(bob, "coedit-5-bob-done")

    state = await chat_state(demo_server, chat)
    parts = state.turns[-1].response_parts
    request = next(p for p in parts if isinstance(p, InputRequestPart))
    assert request.response == "accept"
    answers = request.request.answers or {}
    assert answers["affectedSystem"].value == TextValue(value="SSO gateway")
    assert answers["impactScope"].value == SelectedValue(value="PARTIAL_USERS")


async def test_an_answer_from_someone_else_does_not_disturb_the_field_being_typed_in(
    browser: Browser, demo_server: RunningServer
) -> None:
    session, _ = await create_session(demo_server.http, "Typing")
    _, alice = await open_client(browser, demo_server.http, demo_server.token(), session=session)
    _, bob = await open_client(browser, demo_server.http, demo_server.token(), session=session)
    await start_ticket_story(alice)
    await expect(bob.get_by_label("Affected system")).to_be_visible()

    bob_system = bob.get_by_label("Affected system")
    await bob_system.click()
    await bob_system.press_sequentially("Bob is typing", delay=10)
    await alice.get_by_label("Affected system").fill("Alice wrote this")
    await alice.get_by_label("Some users").check()  # Alice's draft goes out on blur
    # Bob's own text stays while he types; Alice's answers arrive everywhere else.
    await expect(bob.get_by_label("Some users")).to_be_checked()
    await expect(bob_system).to_have_value("Bob is typing")
    await expect(bob_system).to_be_focused()
    await bob.get_by_label("All users").click()  # Bob leaves: his draft wins
    await expect(alice.get_by_label("Affected system")).to_have_value("Bob is typing")


# ─── Sessions, composer, stop ────────────────────────────────────────────────


async def test_the_sessions_list_shows_status_and_unread_and_creates_sessions(
    browser: Browser, demo_server: RunningServer
) -> None:
    _, page = await open_client(browser, demo_server.http, demo_server.token())
    sessions = page.get_by_role("list", name="Sessions")

    # A session made elsewhere appears live, unread until someone opens it.
    other, _ = await create_session(demo_server.http, "Made by an agent")
    item = sessions.get_by_role("listitem").filter(has_text="Made by an agent")
    await expect(item).to_contain_text("Idle")
    await expect(item.get_by_text("unread")).to_be_attached()

    # Creating one from the page opens it.
    await page.get_by_role("button", name="+ New session").click()
    await page.get_by_label("Title of the new session").fill("Printer on fire")
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Printer on fire")).to_be_visible()
    await start_ticket_story(page)
    mine = sessions.get_by_role("listitem").filter(has_text="Printer on fire")
    await expect(mine).to_contain_text("Needs input")
    await expect(page.get_by_role("link", name=re.compile("Printer on fire"))).to_have_attribute(
        "aria-current", "page"
    )
    await shot(page, "sessions-list")

    await item.get_by_role("link").click()
    await expect(page.get_by_role("heading", name="Made by an agent")).to_be_visible()
    await expect(item.get_by_text("unread")).not_to_be_attached()
    summaries = await demo_server.server.parts.host.aggregate.summaries()
    summary = next(s for s in summaries if s.resource == other)
    assert summary.status & SessionStatus.IS_READ


async def test_stop_cancels_the_active_turn(browser: Browser, demo_server: RunningServer) -> None:
    session, chat = await create_session(demo_server.http, "Stop")
    _, page = await open_client(browser, demo_server.http, demo_server.token(), session=session)
    await start_ticket_story(page)
    await page.get_by_role("button", name="Stop").click()
    await expect(page.get_by_text("Stopped", exact=True)).to_be_visible()
    await expect(page.get_by_role("button", name="Send")).to_be_visible()
    await expect(page.locator("section.request")).to_contain_text("Not answered")
    state = await chat_state(demo_server, chat)
    assert state.active_turn is None
    assert state.turns[-1].state == "cancelled"


# ─── Safety ──────────────────────────────────────────────────────────────────


async def left_of(place: Locator, first: str, then: str) -> bool:
    """Whether ``first`` is laid out left of ``then`` in ``place``'s text (what
    a reader sees, which a right-to-left override turns around)."""
    result = await place.evaluate(
        """(el, [first, then]) => {
          const node = el.firstChild;
          const x = (i) => {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            return range.getBoundingClientRect().left;
          };
          const text = node.textContent;
          return x(text.indexOf(first)) < x(text.indexOf(then));
        }""",
        [first, then],
    )
    assert isinstance(result, bool)
    return result


async def test_a_title_with_a_right_to_left_override_is_shown_isolated_and_made_visible(
    browser: Browser, demo_server: RunningServer
) -> None:
    title = "Invoice \u202efdp.exe"  # obeyed, it reads "Invoice exe.pdf"
    session, _ = await create_session(demo_server.http, title)
    _, page = await open_client(browser, demo_server.http, demo_server.token(), session=session)

    shown = page.get_by_role("list", name="Sessions").locator(".session-title")
    header = page.locator("h2.chat-title")
    for place in (shown, header):
        await expect(place).to_have_text("Invoice \u27e8U+202E\u27e9fdp.exe")
        await expect(place).to_have_attribute("dir", "auto")
    await expect(page).to_have_title("Invoice \u27e8U+202E\u27e9fdp.exe · Huddle")
    assert "\u202e" not in await page.title()
    for place in (shown, header):  # laid out as sent: "fdp" left of ".exe"
        assert await left_of(place, "fdp", ".exe")


async def test_a_message_with_bidi_and_zero_width_characters_shows_them_marked(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Marked")
    _, page = await open_client(browser, plain_server.http, plain_server.token(), session=session)
    composer = page.get_by_label("Message to the agent")
    await composer.fill("pay\u200bpal \u2067txt.exe\u2069 done")
    await composer.press("Enter")

    bubble = page.locator(".bubble").last
    await expect(bubble).to_have_text(
        "pay\u27e8U+200B\u27e9pal \u27e8U+2067\u27e9txt.exe\u27e8U+2069\u27e9 done"
    )
    await expect(bubble).to_have_attribute("dir", "auto")
    turn = (await chat_state(plain_server, chat)).active_turn
    assert turn is not None
    assert turn.message.text == "pay\u200bpal \u2067txt.exe\u2069 done"  # kept as sent

    # The agent's Markdown too, inside emphasis and code.
    reply = MarkdownPart(id="md", content="Open *\u202efdp.exe* or `\u202etxt.sh`")
    await plain_server.server.parts.host.dispatch(
        chat, ChatResponsePart(turn_id=turn.id, part=reply)
    )
    await expect(page.locator(".md").last).to_have_text(
        "Open \u27e8U+202E\u27e9fdp.exe or \u27e8U+202E\u27e9txt.sh"
    )


async def test_question_text_that_looks_like_html_shows_as_text_and_runs_nothing(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Escaping")
    _, page = await open_client(browser, plain_server.http, plain_server.token(), session=session)
    dialogs: list[str] = []

    async def on_dialog(dialog: Dialog) -> None:
        dialogs.append(dialog.message)
        await dialog.dismiss()

    page.on("dialog", on_dialog)
    payload = "<img src=x onerror=alert(1)>"
    await start_agent_turn(plain_server, chat)
    await plain_server.server.parts.host.dispatch(
        chat,
        ChatInputRequested(
            request=InputRequest(
                id="r1",
                message="Please answer <script>alert(2)</script> and [this](javascript:alert(3))",
                questions=[
                    TextQuestion(id="q1", message=payload, required=True),
                    SingleSelectQuestion(
                        id="q2",
                        title="<b onmouseover=alert(4)>bold</b>",
                        message=payload,
                        options=[InputOption(id="x", label=payload)],
                    ),
                ],
            )
        ),
    )
    card = page.locator("section.request")
    await expect(card.get_by_text(payload, exact=True).first).to_be_visible()
    await expect(card.get_by_text("<script>alert(2)</script>", exact=False)).to_be_visible()
    await card.get_by_text(payload, exact=True).first.hover()
    await shot(page, "escaping-question-text")
    assert await page.locator("img").count() == 0
    assert await page.locator("script:not([src])").count() == 0
    assert await card.locator("a").count() == 0, "a javascript: link is shown as text"
    assert await card.locator("b").count() == 0
    assert dialogs == []


# ─── URL requests ────────────────────────────────────────────────────────────


async def test_a_url_request_opens_only_on_click_in_a_new_tab_then_completes(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Sign in")
    context, page = await open_client(
        browser, plain_server.http, plain_server.token(), session=session
    )
    host = plain_server.server.parts.host
    await start_agent_turn(plain_server, chat)
    url = f"{plain_server.http}/healthz?next=%2Fdone#step-2"
    await host.dispatch(
        chat,
        ChatInputRequested(
            request=InputRequest(id="visit", message="Sign in to the helpdesk", url=url)
        ),
    )
    card = page.locator("section.request")
    await expect(card.locator(".url")).to_have_text(url)
    await expect(card.locator(".url-host")).to_have_text(f"127.0.0.1:{plain_server.port}")
    await shot(page, "url-request")
    assert len(context.pages) == 1, "nothing opens by itself"

    link = card.get_by_role("link", name=f"Open 127.0.0.1:{plain_server.port}")
    assert await link.get_attribute("target") == "_blank"
    assert "noopener" in (await link.get_attribute("rel") or "")
    async with context.expect_page() as opened:
        await link.click()
    tab = await opened.value
    await tab.wait_for_load_state()
    assert tab.url == url
    assert await tab.evaluate("window.opener") is None
    await tab.close()

    await card.get_by_role("button", name="Done").click()
    async with asyncio.timeout(10 * UNIT):
        outcome = await host.wait_input(chat, "visit")
    assert outcome.response == "accept"
    await expect(card.get_by_text("Done", exact=True)).to_be_visible()


async def test_a_url_request_that_is_not_http_cannot_be_opened(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Bad link")
    _, page = await open_client(browser, plain_server.http, plain_server.token(), session=session)
    await start_agent_turn(plain_server, chat)
    await plain_server.server.parts.host.dispatch(
        chat,
        ChatInputRequested(
            request=InputRequest(id="bad", message="Open this", url="javascript:alert(1)")
        ),
    )
    card = page.locator("section.request")
    await expect(card.get_by_text("not an http or https link")).to_be_visible()
    assert await card.get_by_role("link").count() == 0
    await card.get_by_role("button", name="Decline").click()
    async with asyncio.timeout(10 * UNIT):
        outcome = await plain_server.server.parts.host.wait_input(chat, "bad")
    assert outcome.response == "decline"


# ─── Tool approvals ──────────────────────────────────────────────────────────


async def test_approving_a_tool_call_with_edited_input_runs_it_with_that_input(
    browser: Browser, demo_server: RunningServer
) -> None:
    session, _ = await create_session(demo_server.http, "Approve")
    _, page = await open_client(browser, demo_server.http, demo_server.token(), session=session)
    await start_ticket_story(page)
    await answer_ticket_form(page)
    editor = page.get_by_label("Input (JSON, you may edit it)")
    await expect(editor).to_have_value(re.compile(r'"priority": "high"'))
    await shot(page, "tool-approval")

    # Not JSON: refused in the page, nothing sent.
    await editor.fill('{"priority": "normal",')
    await expect(page.get_by_text("This is not valid JSON")).to_be_visible()
    await page.get_by_role("button", name="Approve").click()
    await expect(editor).to_be_focused()
    await shot(page, "tool-approval-invalid-json")

    # JSON, but not what the tool takes: the server refuses, the page says
    # why and keeps the edit.
    edited = {
        "priority": "urgent",
        "summary": TICKET,
        "affectedSystem": "SSO",
        "impactScope": "PARTIAL_USERS",
    }
    await editor.fill(json.dumps(edited, indent=2))
    await page.get_by_role("button", name="Approve").click()
    await expect(
        page.get_by_role("alert").filter(has_text="does not fit the input schema")
    ).to_be_visible()
    await expect(editor).to_have_value(re.compile(r'"priority": "urgent"'))
    await expect(page.get_by_role("button", name="Approve")).to_be_enabled()
    await shot(page, "tool-approval-rejected-by-server")

    edited["priority"] = "normal"
    await editor.fill(json.dumps(edited, indent=2))
    await page.get_by_role("button", name="Approve").click()
    await expect(page.get_by_text("is open with normal priority")).to_be_visible()
    await shot(page, "tool-approved")


async def test_denying_a_tool_call_sends_the_reason_and_the_agent_stops(
    browser: Browser, demo_server: RunningServer
) -> None:
    session, chat = await create_session(demo_server.http, "Deny")
    _, page = await open_client(browser, demo_server.http, demo_server.token(), session=session)
    await start_ticket_story(page)
    await answer_ticket_form(page)
    await page.get_by_role("button", name="Deny", exact=True).click()
    reason = page.get_by_label("Reason for denying")
    await expect(reason).to_be_focused()
    await reason.fill("Duplicate of HUD-1000")
    await shot(page, "tool-deny-reason")
    await page.get_by_role("button", name="Deny the call").click()
    await expect(page.get_by_text("The ticket was not created")).to_be_visible()
    await expect(page.get_by_text("Denied", exact=True)).to_be_visible()
    await shot(page, "tool-denied")
    state = await chat_state(demo_server, chat)
    call = next(p.tool_call for p in state.turns[-1].response_parts if isinstance(p, ToolCallPart))
    assert isinstance(call, ToolCallCancelled)
    assert (call.reason, call.reason_message) == ("denied", "Duplicate of HUD-1000")


# ─── Keyboard only, every question kind, validation ──────────────────────────


async def focused(page: Page) -> str:
    """The focused control as "<question id>/<label>"."""
    return str(
        await page.evaluate(
            """() => {
              const el = document.activeElement;
              if (!el || el === document.body) return '';
              const field = el.closest('.field');
              const label = el.labels && el.labels.length
                ? el.labels[0].textContent.trim()
                : el.getAttribute('aria-label') || el.textContent.trim();
              return `${field ? field.dataset.questionId : ''}/${label}`;
            }"""
        )
    )


async def tab_to(page: Page, label: str, *, field: str = "", limit: int = 40) -> None:
    """Press Tab until the control named ``label`` (in question ``field``,
    when given) has focus."""
    seen = []
    for _ in range(limit):
        seen.append(await focused(page))
        where, _, name = seen[-1].partition("/")
        if name.startswith(label) and (not field or where == field):
            return
        await page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {label!r}: {seen}")


async def test_every_question_kind_works_with_the_keyboard_alone(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Keyboard")
    _, page = await open_client(browser, plain_server.http, plain_server.token(), session=session)
    await start_agent_turn(plain_server, chat)
    request = InputRequest(
        id="kb",
        message="A few details",
        questions=[
            TextQuestion(
                id="email",
                title="Contact email",
                message="Who should we reply to?",
                format="email",
                required=True,
            ),
            IntegerQuestion(
                id="seats", title="Seats", message="How many seats?", min=1, max=10, required=True
            ),
            BooleanQuestion(id="urgent", title="Urgent", message="Is it urgent?", required=True),
            SingleSelectQuestion(
                id="plan",
                title="Plan",
                message="Which plan?",
                required=True,
                options=[
                    InputOption(id="free", label="Free"),
                    InputOption(id="pro", label="Pro", recommended=True),
                ],
            ),
            MultiSelectQuestion(
                id="areas",
                title="Areas",
                message="What is affected?",
                min=1,
                max=2,
                options=[
                    InputOption(id="web", label="Web"),
                    InputOption(id="api", label="API"),
                    InputOption(id="mobile", label="Mobile"),
                ],
            ),
            TextQuestion(id="notes", title="Notes", message="Anything else?"),
        ],
    )
    await plain_server.server.parts.host.dispatch(chat, ChatInputRequested(request=request))
    await expect(page.get_by_label("Contact email")).to_be_visible()

    keys = page.keyboard
    await tab_to(page, "Contact email")
    await keys.type("not an email")
    await tab_to(page, "Seats")
    await keys.type("12")
    await tab_to(page, "Yes")
    await keys.press("Space")
    await keys.press("ArrowDown")  # the radio group moves to "No"
    await tab_to(page, "Pro")  # the recommended plan is chosen already
    await keys.press("ArrowUp")
    await tab_to(page, "Web")
    await keys.press("Space")
    await tab_to(page, "Submit")
    await keys.press("Enter")

    # The page checks what the server would, and says so per field.
    await expect(page.get_by_text("Is not a valid email address.")).to_be_visible()
    await expect(page.get_by_text("Is above the maximum 10.")).to_be_visible()
    await expect(page.get_by_label("Contact email")).to_be_focused()
    await shot(page, "keyboard-validation")

    await keys.press("Control+A")
    await keys.type("ops@example.com")
    await tab_to(page, "Seats")
    await keys.press("Control+A")
    await keys.type("3")
    await tab_to(page, "Skip", field="notes")  # Notes is optional
    await keys.press("Enter")
    await expect(page.get_by_role("button", name="Answer it")).to_be_focused()
    await tab_to(page, "Submit")
    await shot(page, "keyboard-filled")
    await keys.press("Enter")

    async with asyncio.timeout(10 * UNIT):
        outcome = await plain_server.server.parts.host.wait_input(chat, "kb")
    assert outcome.response == "accept"
    values = {
        key: (answer.state, getattr(answer.value, "value", None))
        for key, answer in outcome.answers.items()
    }
    assert values == {
        "email": ("submitted", "ops@example.com"),
        "seats": ("submitted", 3),
        "urgent": ("submitted", False),
        "plan": ("submitted", "free"),
        "areas": ("submitted", ["web"]),
        "notes": ("skipped", None),
    }
    await expect(page.get_by_text("Submitted", exact=True)).to_be_visible()
    await shot(page, "keyboard-submitted")


# ─── Surviving a restart ─────────────────────────────────────────────────────


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(
    port: int, store: MemoryStore, turns: MemoryTurnStore, agent_token: str = AGENT_TOKEN
) -> AsyncIterator[Callable[[], Any]]:
    """A server with the demo agent on a fixed port over kept stores
    (another ``agent_token`` revokes every token minted with the first)."""
    settings = Settings(port=port)
    parts = build(settings, store=store, agent=demo.agent, turn_store=turns)
    app = create_app(parts, TokenAuthority(agent_token))
    server = UvicornServer(uvicorn_config(app, settings, port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10 * UNIT):
        await server.listening.wait()
    try:
        yield lambda: app.state.server
    finally:
        server.should_exit = True
        await task


async def test_the_page_survives_a_server_restart_and_catches_up(browser: Browser) -> None:
    port, store, turns = free_port(), MemoryStore(), MemoryTurnStore()
    base = f"http://127.0.0.1:{port}"
    token = TokenAuthority(AGENT_TOKEN).mint("participant", expires_at=4_000_000_000)
    async with serving(port, store, turns):
        session, chat = await create_session(base, "Restart")
        _, page = await open_client(browser, base, token, session=session)
        await start_ticket_story(page)
        await page.get_by_label("Affected system").fill("SSO")
        await page.get_by_label("One user").click()  # the draft goes out

    banner = page.locator("#connection")
    await expect(banner).to_contain_text("Reconnecting")
    await shot(page, "restart-1-reconnecting")
    # Typing goes on while the server is away; nothing is lost.
    await page.get_by_label("Some users").check()  # chosen while offline
    await expect(banner).to_contain_text("will be sent")

    async with serving(port, store, turns) as current:
        host = current().parts.host
        # Someone else's answer lands before or while the page reconnects.
        await host.dispatch(
            chat,
            ChatInputAnswerChanged(
                request_id=open_request_id(await chat_state_of(host, chat)),
                question_id="affectedSystem",
                answer=InputAnswer(state="draft", value=TextValue(value="SSO and VPN")),
            ),
        )
        await expect(banner).to_be_hidden()
        await expect(page.get_by_label("Affected system")).to_have_value("SSO and VPN")
        await shot(page, "restart-2-back")
        answers = open_request(await chat_state_of(host, chat)).answers or {}
        assert answers["affectedSystem"].value == TextValue(value="SSO and VPN")
        assert answers["impactScope"].value == SelectedValue(value="PARTIAL_USERS")

        await page.get_by_role("button", name="Submit").click()
        await page.get_by_role("button", name="Approve").click()
        await expect(page.get_by_text("is open with high priority")).to_be_visible()
        await shot(page, "restart-3-done")


# ─── Refused: no retrying ────────────────────────────────────────────────────


def counting_sockets(opened: list[str]) -> Callable[[Page], Awaitable[None]]:
    """A ``prepare`` for open_client: every socket the page opens goes into
    ``opened`` (its URL), and the page's clock is Playwright's, so that a
    test can let the page's timers run far ahead."""

    async def prepare(page: Page) -> None:
        await page.clock.install()
        page.on("websocket", lambda ws: opened.append(ws.url))

    return prepare


async def assert_tries_no_more(page: Page, opened: list[str]) -> None:
    """The page opens no socket of its own from now on: ten minutes of its
    timers run (every retry of its backoff would be due a hundred times
    over), and it hears it is back online; then a socket the test opens in
    the page is the next one the page opened (the page reports its sockets
    in the order it opens them)."""
    before = list(opened)
    await page.clock.run_for("10:00")
    async with page.expect_websocket(lambda ws: ws.url.endswith("/after-all")) as marker:
        await page.evaluate(
            """() => {
              dispatchEvent(new Event('online'));
              new WebSocket(`${location.origin.replace('http', 'ws')}/after-all`);
            }"""
        )
    assert opened == [*before, (await marker.value).url]


async def settle(ws: str, session: str, name: str) -> None:
    """Wait until the page in ``name``'s name is in ``session``'s active
    clients and has marked it read: then none of its own actions is pending
    (closed gracefully, its socket delivers their echoes first)."""

    def settled(state: object) -> bool:
        return (
            isinstance(state, SessionState)
            and bool(state.status & SessionStatus.IS_READ)
            and any(c.display_name == name for c in state.active_clients)
        )

    async with await HuddleClient.connect(ws, AGENT_TOKEN) as agent:
        mirror = await agent.subscribe(session)
        async with asyncio.timeout(5 * UNIT):
            await mirror.wait_for(settled)


def drop_connections(running: Any, name: str) -> None:
    """The server closes the sockets of the tokens in ``name``'s name, as it
    does when it goes away: their clients reconnect."""
    for rpc in list(running.connections):
        if rpc.grant.name == name:
            rpc.connection.shut(CLOSE_GOING_AWAY, "dropped by the test")


async def test_a_page_whose_link_expired_says_so_once_dropped_and_stops_trying(
    browser: Browser, clock: WallClock
) -> None:
    running = await start_server(clock=clock)
    try:
        session, _ = await create_session(running.http, "Expiring")
        token = running.authority.mint("participant", name="Ann", expires_at=clock.now + 60)
        opened: list[str] = []
        _, page = await open_client(
            browser, running.http, token, session=session, prepare=counting_sockets(opened)
        )
        await settle(running.ws, session, "Ann")
        clock.now += 120  # past the token's expiry
        drop_connections(running.server, "Ann")

        banner = page.locator("#connection")
        await expect(banner).to_have_text(
            "This link no longer gives access: the token has expired. Ask for a new link."
        )
        await expect(banner).to_have_attribute("data-tone", "error")
        await shot(page, "refused-expired")
        await assert_tries_no_more(page, opened)
    finally:
        await running.stop()


async def test_a_page_whose_link_was_revoked_retries_while_the_server_is_down_then_stops(
    browser: Browser,
) -> None:
    port, store, turns = free_port(), MemoryStore(), MemoryTurnStore()
    base = f"http://127.0.0.1:{port}"
    token = TokenAuthority(AGENT_TOKEN).mint("participant", name="Ann", expires_at=4_000_000_000)
    opened: list[str] = []
    async with serving(port, store, turns):
        session, _ = await create_session(base, "Revoked")
        _, page = await open_client(
            browser, base, token, session=session, prepare=counting_sockets(opened)
        )
        await settle(f"ws://127.0.0.1:{port}/ahp", session, "Ann")

    banner = page.locator("#connection")
    await expect(banner).to_contain_text("Reconnecting")  # a server that is down is retried
    composer = page.get_by_label("Message to the agent")
    await composer.fill("Are you there?")
    await composer.press("Enter")  # pending until the server is back
    await expect(banner).to_contain_text("1 change will be sent")
    tries = len(opened)
    # Back under another agent token: every token minted with the old one is revoked.
    async with serving(port, store, turns, agent_token="another-agent-token-0123456789"):
        await expect(banner).to_have_text(
            "This link no longer gives access: invalid token signature. Ask for a new link."
            " 1 change may not have been saved."
        )
        assert len(opened) > tries  # it tried the server that is back, once refused
        await shot(page, "refused-revoked")
        await assert_tries_no_more(page, opened)


async def test_a_page_opened_without_its_link_says_it_has_no_access_and_stops_trying(
    browser: Browser, plain_server: RunningServer
) -> None:
    context = await browser.new_context()
    context.set_default_timeout(WAIT_MS)
    page = await context.new_page()
    opened: list[str] = []
    await counting_sockets(opened)(page)
    await page.goto(plain_server.http)  # no ?token=, no cookie

    await expect(page.locator("#connection")).to_have_text(
        "This page has no access: a token is required."
        " Open the link you were given, or the one huddle serve printed."
    )
    assert len(opened) == 1  # refused at once: no retry before the final word
    await assert_tries_no_more(page, opened)


async def test_a_page_whose_initialize_is_refused_says_so_and_stops_trying(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, _ = await create_session(base, "Two links")
    opened: list[str] = []
    context, page = await open_client(
        browser,
        base,
        plain_server.token(name="Ann"),
        session=session,
        prepare=counting_sockets(opened),
    )
    # Another link opened in the same browser: its token is the cookie now,
    # and Ann's page reconnects with it under a client id Ann's token holds.
    other = await context.new_page()
    await other.goto(f"{base}/?token={plain_server.token(name='Bob')}")
    await expect(other.locator("#identity")).to_contain_text("Bob")
    await settle(plain_server.ws, session, "Ann")
    drop_connections(plain_server.server, "Ann")

    banner = page.locator("#connection")
    await expect(banner).to_have_text(
        re.compile(
            r"^Huddle refused this page: clientId '[^']+' belongs to another token: "
            r"choose another\. Reload the page to try again\.$"
        )
    )
    await shot(page, "refused-initialize")
    await assert_tries_no_more(page, opened)

    await page.reload()  # what the page says to do: a new page, a new client id
    await expect(page.locator("#identity")).to_contain_text("Bob")
    await expect(banner).to_be_hidden()


def open_request(state: ChatState) -> InputRequest:
    assert state.active_turn is not None
    parts = state.active_turn.response_parts
    return next(p.request for p in parts if isinstance(p, InputRequestPart) and p.response is None)


def open_request_id(state: ChatState) -> str:
    return open_request(state).id


async def chat_state_of(host: Any, chat: str) -> ChatState:
    state = (await host.view(chat)).state
    assert isinstance(state, ChatState)
    return state


async def test_a_connection_gone_dead_is_given_up_at_the_ping_timeout(
    browser: Browser, demo_server: RunningServer
) -> None:
    # A network that goes dead without closing anything: the ping timed out
    # and the page closed its socket, but Chromium held the close event for
    # the close handshake, about a minute; the page said nothing and a
    # submit showed "Sending…" all that while.
    proxy = await CuttingProxy(demo_server.port).start()
    try:
        base = f"http://127.0.0.1:{proxy.listening_port}"
        session, _ = await create_session(demo_server.http, "Dead network")
        opened: list[str] = []
        token = demo_server.token(name="alice")
        _, page = await open_client(
            browser, base, token, session=session, prepare=counting_sockets(opened)
        )
        proxy.go_silent()
        async with page.expect_websocket() as reopened:
            await page.clock.run_for("00:31")  # the ping's wait, its timeout, the first retry
        assert (await reopened.value).url == opened[-1]
        await expect(page.get_by_label("Message to the agent")).to_be_enabled()
    finally:
        await proxy.close()
