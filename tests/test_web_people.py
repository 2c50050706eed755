"""The web client's people side in a real Chromium against a real server:
who is here now, who typed and answered what, a shared link's names,
deadlines, and submissions that survive a cut connection exactly once.

Two people are two browser contexts with tokens of their own. Every wait is
an auto-waiting Playwright assertion or an awaited server event, bounded by
a multiple of UNIT; time in a page moves only by its installed clock.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Locator, Page, WebSocket, WebSocketRoute, expect

from protocol.actions import (
    ChatDelta,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatResponsePart,
    SessionActiveClientRemoved,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    MarkdownPart,
    TextQuestion,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from protocol.session import SessionState
from reducers import notes
from server.client import HuddleClient
from server.config import Settings
from server.core.audit import verify
from tests import test_web_client as web
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, start_server
from tests.edge import CuttingProxy
from tests.test_web_client import (
    answer_ticket_form,
    chat_state,
    create_session,
    open_client,
    open_request_id,
    shot,
    start_agent_turn,
    start_ticket_story,
)

pytestmark = pytest.mark.browser

# The web client tests' Chromium and servers, as fixtures of this module too.
browser = web.browser
demo_server = web.demo_server
plain_server = web.plain_server

FORM = InputRequest(
    id="details",
    message="Which system fails?",
    questions=[TextQuestion(id="system", title="Affected system", message="Which?", required=True)],
)


# ─── Helpers ─────────────────────────────────────────────────────────────────


def here(page: Page) -> Locator:
    """The names in the session's "Here now" list, this page's first."""
    return page.get_by_role("list", name="Here now").locator(".person-name")


def field_of(page: Page, question: str) -> Locator:
    return page.locator(f'.field[data-question-id="{question}"]')


def author_of(page: Page, question: str) -> Locator:
    """What the page says someone else does with ``question``'s answer."""
    return field_of(page, question).locator(".q-author")


async def ask(running: RunningServer, chat: str, request: InputRequest = FORM) -> None:
    """Open a turn and ask ``request`` in it, as an agent would."""
    await start_agent_turn(running, chat)
    await running.server.parts.host.dispatch(chat, ChatInputRequested(request=request))


async def session_state(running: RunningServer, session: str) -> SessionState:
    state = (await running.server.parts.host.view(session)).state
    assert isinstance(state, SessionState)
    return state


async def request_note(running: RunningServer, session: str, chat: str) -> dict[str, Any]:
    meta = (await session_state(running, session)).meta
    note = notes.note_of(meta, "requests", chat, FORM.id)
    assert note is not None
    return note


@dataclass
class Wire:
    """What a page sent and received, per WebSocket it opened."""

    sent: list[list[dict[str, Any]]] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)

    def dispatched(self, socket: int, action_type: str) -> list[dict[str, Any]]:
        """The ``dispatchAction`` params of ``action_type`` sent on ``socket``."""
        return [
            frame["params"]
            for frame in self.sent[socket]
            if frame.get("method") == "dispatchAction"
            and frame["params"]["action"]["type"] == action_type
        ]

    def rejections(self) -> list[dict[str, Any]]:
        return [
            frame["params"]
            for frame in self.received
            if frame.get("method") == "action" and "rejectionReason" in frame["params"]
        ]


def recording(wire: Wire) -> Callable[[Page], Awaitable[None]]:
    """A ``prepare`` for open_client that records the page's frames."""

    async def prepare(page: Page) -> None:
        def on_socket(ws: WebSocket) -> None:
            sent: list[dict[str, Any]] = []
            wire.sent.append(sent)
            ws.on("framesent", lambda payload: sent.append(json.loads(payload)))
            ws.on("framereceived", lambda payload: wire.received.append(json.loads(payload)))

        page.on("websocket", on_socket)

    return prepare


async def with_clock(page: Page) -> None:
    """The page's clock is Playwright's: it runs on, and tests jump it ahead."""
    await page.clock.install()


# ─── Who is here ─────────────────────────────────────────────────────────────


async def test_who_is_here_shows_each_person_by_name_and_drops_those_who_leave(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, _ = await create_session(base, "Presence")
    _, alice = await open_client(browser, base, plain_server.token(name="Alice"), session=session)
    bob_context, bob = await open_client(
        browser, base, plain_server.token(name="Bob"), session=session
    )

    await expect(here(alice)).to_have_text(["Alice", "Bob"])
    await expect(here(bob)).to_have_text(["Bob", "Alice"])
    mine = alice.get_by_role("list", name="Here now").get_by_role("listitem").first
    await expect(mine).to_contain_text("(you)")
    await expect(alice.get_by_role("dialog")).to_have_count(0)  # named tokens are not asked
    await shot(alice, "people-here-now")
    state = await session_state(plain_server, session)
    assert sorted(c.display_name or "" for c in state.active_clients) == ["Alice", "Bob"]

    # Bob goes back to the list: he takes himself out; back in, he is there again.
    await bob.goto(base + "/#/")
    await expect(here(alice)).to_have_text(["Alice"])
    await bob.go_back()
    await expect(here(alice)).to_have_text(["Alice", "Bob"])

    # Bob closes his browser: the server takes his entry out.
    await bob_context.close()
    await expect(here(alice)).to_have_text(["Alice"])


# ─── Who typed and answered what ─────────────────────────────────────────────


async def test_answers_show_who_types_who_answered_who_submitted_and_who_approved(
    browser: Browser, demo_server: RunningServer
) -> None:
    base = demo_server.http
    session, chat = await create_session(base, "Authors")
    _, alice = await open_client(browser, base, demo_server.token(name="Alice"), session=session)
    _, bob = await open_client(browser, base, demo_server.token(name="Bob"), session=session)
    await start_ticket_story(alice)
    await expect(bob.get_by_label("Affected system")).to_be_visible()

    # Alice types and stays in the field: Bob sees her typing; her own page says nothing.
    system = alice.get_by_label("Affected system")
    await system.press_sequentially("SSO", delay=15)
    await expect(author_of(bob, "affectedSystem")).to_have_text("Alice is typing…")
    await expect(author_of(alice, "affectedSystem")).to_be_hidden()
    await shot(bob, "people-alice-is-typing")

    # She leaves the field: that is her answer.
    await system.press("Tab")
    await expect(author_of(bob, "affectedSystem")).to_have_text("answered by Alice")

    # Bob picks the scope; Alice sees who did.
    await bob.get_by_label("Some users").check()
    await expect(author_of(alice, "impactScope")).to_have_text("answered by Bob")
    await expect(author_of(bob, "impactScope")).to_be_hidden()

    # Bob submits: each answer stays its author's, the submit is Bob's.
    await bob.get_by_role("button", name="Submit").click()
    for page in (alice, bob):
        card = page.locator("section.request")
        await expect(card.locator(".outcome")).to_have_text("Submitted by Bob")
        answers = card.locator(".answers dd")
        await expect(answers).to_have_text(
            ["SSO — answered by Alice", "Some users — answered by Bob"]
        )
    await shot(alice, "people-submitted-by-bob")

    # Alice approves the tool call; both see who did.
    await alice.get_by_role("button", name="Approve").click()
    for page in (alice, bob):
        await expect(page.get_by_text("is open with high priority")).to_be_visible()
        await expect(page.locator("section.tool .credit")).to_have_text("Approved by Alice")
    await shot(bob, "people-approved-by-alice")

    meta = (await session_state(demo_server, session)).meta
    request = next(iter(((meta or {})["huddle"]["requests"][chat]).values()))
    assert request["answers"]["affectedSystem"]["by"]["name"] == "Alice"
    assert request["answers"]["affectedSystem"]["state"] == "submitted"
    assert request["answers"]["impactScope"]["by"]["name"] == "Bob"
    assert request["completed"]["by"]["name"] == "Bob"
    decided = next(iter(((meta or {})["huddle"]["toolCalls"][chat]).values()))["decided"]
    assert (decided["by"]["name"], decided["approved"]) == ("Alice", True)


async def test_a_draft_someone_else_skipped_shows_as_skipped_by_them(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, chat = await create_session(plain_server.http, "Skipped")
    _, alice = await open_client(
        browser, plain_server.http, plain_server.token(name="Alice"), session=session
    )
    optional = TextQuestion(id="system", title="Affected system", message="Which?")
    await ask(
        plain_server, chat, InputRequest(id="details", message="Which?", questions=[optional])
    )
    await alice.get_by_label("Affected system").press_sequentially("SSO", delay=15)
    await alice.get_by_label("Affected system").press("Tab")
    bob = await plain_server.client(name="Bob")  # completes it, skipping what Alice wrote

    def by_alice(state: Any) -> bool:
        note = notes.note_of(state.meta, "requests", chat, "details") or {}
        return bool(note.get("answers", {}).get("system", {}).get("by", {}).get("name") == "Alice")

    async with asyncio.timeout(5 * UNIT):
        await (await bob.subscribe(session)).wait_for(by_alice)
    skipped = InputAnswer(state="skipped", value=TextValue(value="SSO"))
    await bob.dispatch_and_wait(
        chat,
        ChatInputCompleted(request_id="details", response="accept", answers={"system": skipped}),
    )

    answers = alice.locator("section.request .answers dd")
    await expect(answers).to_have_text(["Skipped — skipped by Bob"])


# ─── A shared link ───────────────────────────────────────────────────────────


async def test_a_shared_observer_link_asks_no_name_nobody_would_see(
    browser: Browser, plain_server: RunningServer
) -> None:
    session, _ = await create_session(plain_server.http, "Shared watching")
    link_token = plain_server.authority.mint(
        "observer", name="observer", expires_at=time.time() + 3600, shared=True
    )
    _, olga = await open_client(browser, plain_server.http, link_token, session=session)
    await expect(olga.get_by_text("You are watching this chat.")).to_be_visible()
    await expect(olga.get_by_role("dialog")).to_have_count(0)
    await expect(olga.get_by_role("button", name="Set your name")).to_be_hidden()


async def test_a_shared_link_asks_for_a_name_once_and_shows_it_marked(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, chat = await create_session(base, "Shared link")
    link_token = plain_server.authority.mint(
        "participant", name="participant", expires_at=time.time() + 3600, shared=True
    )
    wire = Wire()
    _, dana = await open_client(browser, base, link_token, session=session, prepare=recording(wire))

    dialog = dana.get_by_role("dialog", name="What should people call you?")
    await expect(dialog).to_be_visible()
    await expect(dialog.get_by_label("Your name")).to_be_focused()
    await shot(dana, "people-shared-link-asks-a-name")
    await dialog.get_by_role("button", name="Continue").click()  # nothing typed: asked again
    await expect(dialog.get_by_role("alert")).to_have_text("Type the name people know you by.")
    await dialog.get_by_label("Your name").fill("\u202eanaD")  # would show as "Dana"
    await dialog.get_by_role("button", name="Continue").click()  # refused here, not sent
    await expect(dialog.get_by_role("alert")).to_have_text(
        "A name cannot hold U+202E: it shows as nothing or reorders the text around it"
    )
    await dialog.get_by_label("Your name").fill("  Dana  ")
    await dialog.get_by_role("button", name="Continue").click()
    await expect(dialog).to_be_hidden()
    await expect(dana.locator("#identity")).to_contain_text("Dana · shared link")

    _, lee = await open_client(browser, base, plain_server.token(name="Lee"), session=session)
    await expect(here(lee)).to_have_text(["Lee", "Dana · shared link"])
    await expect(here(dana)).to_have_text(["Dana · shared link", "Lee"])

    await ask(plain_server, chat)
    await dana.get_by_label("Affected system").press_sequentially("VPN", delay=15)
    await expect(author_of(lee, "system")).to_have_text("Dana · shared link is typing…")
    await shot(lee, "people-shared-link-typing")
    note = await request_note(plain_server, session, chat)
    assert note["answers"]["system"]["by"]["name"] == "Dana"
    assert note["answers"]["system"]["by"]["declared"] is True

    # The name is remembered: opened again, the page asks nothing and says it at once.
    assert await dana.evaluate("localStorage.getItem('huddle.name')") == "Dana"
    await dana.reload()
    await expect(dana.locator("#identity")).to_contain_text("Dana · shared link")
    await expect(dana.get_by_role("dialog")).to_have_count(0)
    initializes = [
        frame["params"]
        for frames in wire.sent
        for frame in frames
        if frame.get("method") == "initialize"
    ]
    assert initializes[0]["capabilities"]["huddle.identity"] == {}
    assert initializes[-1]["capabilities"]["huddle.identity"] == {"name": "Dana"}


async def test_a_name_typed_for_a_token_of_ones_own_changes_nothing(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    session, _ = await create_session(base, "Own token")

    async def claims_to_be_the_boss(page: Page) -> None:
        await page.add_init_script("localStorage.setItem('huddle.name', 'The Boss')")

    _, lee = await open_client(
        browser,
        base,
        plain_server.token(name="Lee"),
        session=session,
        prepare=claims_to_be_the_boss,
    )
    await expect(lee.locator("#identity")).to_contain_text("Lee")
    await expect(lee.locator("#identity").get_by_role("button")).to_be_hidden()
    await expect(here(lee)).to_have_text(["Lee"])


# ─── Deadlines ───────────────────────────────────────────────────────────────


async def test_a_deadline_counts_down_says_what_happens_then_and_shows_expired(
    browser: Browser, demo_server: RunningServer
) -> None:
    base = demo_server.http
    host = demo_server.server.parts.host
    session, chat = await create_session(base, "Deadlines")
    _, page = await open_client(
        browser, base, demo_server.token(name="Ann"), session=session, prepare=with_clock
    )
    await start_ticket_story(page)
    request_id = open_request_id(await chat_state(demo_server, chat))
    at = host.now_ms() + 10 * 60_000
    await host.notes.note(
        session,
        chat,
        lambda meta: notes.expiring(meta, "requests", chat, request_id, at, "decline"),
    )
    deadline = page.locator("section.request .deadline")
    await expect(deadline).to_have_text(
        re.compile(r"^(10:00|9:[0-5]\d) left · then it is declined$")
    )
    await shot(page, "people-deadline")

    await page.get_by_label("Affected system").fill("SSO")
    await page.get_by_label("Some users").check()
    await page.get_by_role("button", name="Submit").click()
    await expect(page.get_by_role("button", name="Approve")).to_be_visible()
    await expect(page.locator("section.request .outcome")).to_have_text("Submitted by Ann")
    call_id = pending_tool_call_id(await chat_state(demo_server, chat))
    soon = host.now_ms() + 90_000
    await host.notes.note(
        session,
        chat,
        lambda meta: notes.expiring(meta, "toolCalls", chat, call_id, soon, "decline"),
    )
    countdown = page.locator("section.tool .deadline")
    await expect(countdown).to_have_text(re.compile(r"^1:(30|2\d) left · then it is denied$"))

    # Past the deadline by this page's clock: it says so, and the server still decides.
    await page.clock.fast_forward("02:00")
    await expect(countdown).to_have_text("Expired")
    await shot(page, "people-deadline-expired")
    approve = page.get_by_role("button", name="Approve")
    await expect(approve).to_be_enabled()
    await approve.click()
    await expect(page.get_by_text("is open with high priority")).to_be_visible()
    await expect(page.locator("section.tool .credit")).to_have_text("Approved by Ann")


def pending_tool_call_id(state: ChatState) -> str:
    assert state.active_turn is not None
    calls = [p.tool_call for p in state.active_turn.response_parts if isinstance(p, ToolCallPart)]
    return next(c.tool_call_id for c in calls if isinstance(c, ToolCallPendingConfirmation))


# ─── A submit through a cut connection ───────────────────────────────────────


@dataclass
class AgentSide:
    """The agent's side of a chat, over its own socket (no proxy): every
    ``chat/inputCompleted`` it sees, and the session's active clients."""

    client: HuddleClient
    chat: str
    completions: list[int] = field(default_factory=list)
    removed: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def proxied(plain_server: RunningServer) -> AsyncIterator[CuttingProxy]:
    proxy = await CuttingProxy(plain_server.port).start()
    try:
        yield proxy
    finally:
        await proxy.close()


@pytest.fixture
async def forgetful_server() -> AsyncIterator[RunningServer]:
    """A server that keeps one envelope per channel for replay (and one
    client action for its once-only rule), with a snapshot after every
    action: a client two envelopes behind gets a snapshot when it reconnects."""
    running = await start_server(Settings(port=0, replay_window=1, snapshot_every=1))
    try:
        yield running
    finally:
        await running.stop()


async def watching_agent(running: RunningServer, session: str, chat: str) -> AgentSide:
    client = await HuddleClient.connect(running.ws, AGENT_TOKEN)
    running.clients.append(client)
    agent = AgentSide(client, chat)
    mirror = await client.subscribe(chat)
    mirror.listeners.append(
        lambda e: (
            agent.completions.append(e.server_seq)
            if isinstance(e.action, ChatInputCompleted)
            else None
        )
    )
    people = await client.subscribe(session)
    people.listeners.append(
        lambda e: agent.removed.set() if isinstance(e.action, SessionActiveClientRemoved) else None
    )
    return agent


async def answered_through(
    browser: Browser, running: RunningServer, proxy: CuttingProxy, wire: Wire
) -> tuple[Page, AgentSide, str]:
    """Lee's page, loaded through ``proxy``, with the request answered and
    the answer on the server: the next frame the page sends is its submit."""
    base = f"http://127.0.0.1:{proxy.listening_port}"
    session, chat = await create_session(running.http, "Cut")
    agent = await watching_agent(running, session, chat)
    _, page = await open_client(
        browser, base, running.token(name="Lee"), session=session, prepare=recording(wire)
    )
    await expect(here(page)).to_have_text(["Lee"])
    await ask(running, chat)
    await page.get_by_label("Affected system").fill("SSO")
    await page.get_by_label("Affected system").press("Tab")  # the answer goes out now
    await expect(page.get_by_role("button", name="Submit")).to_be_focused()
    async with asyncio.timeout(5 * UNIT):
        await agent.client.mirrors[session].wait_for(
            lambda state: bool(
                (notes.note_of(state.meta, "requests", chat, FORM.id) or {})
                .get("answers", {})
                .get("system", {})
                .get("state")
                == "submitted"
            )
        )
    return page, agent, session


async def assert_submitted_once(page: Page, agent: AgentSide, running: RunningServer) -> None:
    card = page.locator("section.request")
    await expect(card.locator(".outcome")).to_have_text("Submitted by Lee")
    async with asyncio.timeout(10 * UNIT):
        outcome = await running.server.parts.host.wait_input(agent.chat, FORM.id)
        await agent.client.mirrors[agent.chat].wait_for(lambda _: bool(agent.completions))
    assert outcome.response == "accept"
    assert len(agent.completions) == 1
    await expect(page.get_by_role("alert")).to_have_count(0)


async def test_a_submit_cut_off_after_it_went_out_is_applied_once(
    browser: Browser, plain_server: RunningServer, proxied: CuttingProxy
) -> None:
    wire = Wire()
    page, agent, session = await answered_through(browser, plain_server, proxied, wire)

    proxied.cut_after_next_send()
    await page.get_by_role("button", name="Submit").click()

    await assert_submitted_once(page, agent, plain_server)
    await shot(page, "people-cut-after-submit")
    assert proxied.cuts == 1
    assert len(wire.sent) == 2, "the page reconnected once"
    assert wire.sent[0][-1]["params"]["action"]["type"] == "chat/inputCompleted"
    assert wire.rejections() == []
    # Back in: the server took the dropped connection's entry out, the page put it back.
    async with asyncio.timeout(5 * UNIT):
        await agent.removed.wait()
        await agent.client.mirrors[session].wait_for(
            lambda state: any(c.display_name == "Lee" for c in getattr(state, "active_clients", []))
        )


async def test_a_submit_lost_before_it_reached_the_server_is_sent_again_and_applied(
    browser: Browser, plain_server: RunningServer, proxied: CuttingProxy
) -> None:
    wire = Wire()
    page, agent, _ = await answered_through(browser, plain_server, proxied, wire)

    proxied.cut_at_next_send()
    await page.get_by_role("button", name="Submit").click()

    await assert_submitted_once(page, agent, plain_server)
    assert proxied.cuts == 1
    lost = wire.dispatched(0, "chat/inputCompleted")
    again = wire.dispatched(1, "chat/inputCompleted")
    assert len(lost) == len(again) == 1
    assert again[0]["clientSeq"] == lost[0]["clientSeq"], "sent again as the same action"
    assert wire.rejections() == []


async def test_a_submit_that_landed_is_confirmed_by_the_server_after_a_snapshot_resume(
    browser: Browser, forgetful_server: RunningServer
) -> None:
    proxy = await CuttingProxy(forgetful_server.port).start()
    try:
        wire = Wire()
        page, agent, _ = await answered_through(browser, forgetful_server, proxy, wire)
        host = forgetful_server.server.parts.host

        proxy.hold_new_connections()
        proxy.cut_after_next_send()
        await page.get_by_role("button", name="Submit").click()
        async with asyncio.timeout(10 * UNIT):
            await host.wait_input(agent.chat, FORM.id)
        # While the page is away, the chat moves on past what the server
        # keeps for replay: the page comes back to a snapshot.
        turn = (await chat_state(forgetful_server, agent.chat)).active_turn
        assert turn is not None
        await host.dispatch(
            agent.chat,
            ChatResponsePart(turn_id=turn.id, part=MarkdownPart(id="after", content="Thanks")),
        )
        await host.dispatch(agent.chat, ChatDelta(turn_id=turn.id, part_id="after", content="!"))
        proxy.release()

        await assert_submitted_once(page, agent, forgetful_server)
        await expect(page.get_by_text("Thanks!")).to_be_visible()
        sent = wire.dispatched(0, "chat/inputCompleted")
        again = wire.dispatched(1, "chat/inputCompleted")
        assert len(sent) == len(again) == 1
        assert again[0]["clientSeq"] == sent[0]["clientSeq"]
        answers = [
            frame["params"]
            for frame in wire.received
            if frame.get("method") == "action"
            and frame["params"]["action"]["type"] == "chat/inputCompleted"
        ]
        assert len(answers) == 1, "the first one's echo was cut off; this is the answer to the copy"
        assert answers[0]["origin"]["clientSeq"] == sent[0]["clientSeq"]
        assert answers[0]["serverSeq"] == agent.completions[0]
        assert wire.rejections() == []
    finally:
        await proxy.close()


async def lee_and_olga(
    browser: Browser, running: RunningServer, title: str
) -> tuple[str, Page, Page, Wire]:
    """A new session with Lee (a participant) in it, then Olga (an
    observer), whose frames are recorded: (session, Lee, Olga, her wire)."""
    base = running.http
    session, _ = await create_session(base, title)
    _, lee = await open_client(browser, base, running.token(name="Lee"), session=session)
    wire = Wire()
    olga_token = running.token("observer", name="Olga")
    _, olga = await open_client(browser, base, olga_token, session=session, prepare=recording(wire))
    return session, lee, olga, wire


async def test_an_observer_sees_who_is_here_without_being_listed(
    browser: Browser, plain_server: RunningServer
) -> None:
    base = plain_server.http
    _, lee, olga, wire = await lee_and_olga(browser, plain_server, "Watching")
    await expect(here(olga)).to_have_text(["Lee"])
    # Lee leaves and comes back: Olga's page has long settled by then.
    await lee.goto(base + "/#/")
    await expect(olga.get_by_role("list", name="Here now")).to_be_hidden()
    await lee.go_back()
    await expect(here(olga)).to_have_text(["Lee"])
    assert wire.dispatched(0, "session/activeClientSet") == []
    await expect(olga.get_by_role("alert")).to_have_count(0)


# ─── The audit ───────────────────────────────────────────────────────────────


async def test_the_audit_downloads_as_a_chain_that_verifies_and_an_observer_is_told_no(
    browser: Browser, demo_server: RunningServer, tmp_path: Path
) -> None:
    base = demo_server.http
    session, _ = await create_session(base, "Audited")
    _, lee = await open_client(browser, base, demo_server.token(name="Lee"), session=session)
    await start_ticket_story(lee)
    await lee.get_by_label("Affected system").fill("SSO")
    await lee.get_by_label("Some users").check()
    await lee.get_by_role("button", name="Submit").click()
    await expect(lee.get_by_role("button", name="Approve")).to_be_visible()
    await demo_server.server.parts.host.audit.settled()

    async with lee.expect_download() as downloading:
        await lee.get_by_role("button", name="Download audit").click()
    download = await downloading.value
    saved = tmp_path / download.suggested_filename
    await download.save_as(saved)

    assert download.suggested_filename == f"audit-{session.split('/', 1)[1]}.jsonl"
    lines = saved.read_bytes().splitlines()
    checked = verify(lines)
    assert checked.session == session
    kept = [json.loads(line) for line in lines]
    completed = next(r for r in kept if r["what"] == "chat/inputCompleted")
    assert completed["who"]["name"] == "Lee"
    await expect(lee.get_by_text(f"The audit was saved as {saved.name}.")).to_be_visible()

    wire = Wire()
    _, olga = await open_client(
        browser,
        base,
        demo_server.token("observer", name="Olga"),
        session=session,
        prepare=recording(wire),
    )
    await olga.get_by_role("button", name="Download audit").click()
    assert wire.dispatched(0, "session/isReadChanged") == []  # an observer sends nothing
    await expect(olga.get_by_role("alert")).to_contain_text(
        "You may not download this session's audit"
    )


# ─── An observer ─────────────────────────────────────────────────────────────


async def test_an_observer_watches_the_requests_live_with_nothing_to_press(
    browser: Browser, demo_server: RunningServer
) -> None:
    _, lee, olga, wire = await lee_and_olga(browser, demo_server, "Watched work")
    # No composer (so no Stop), no suggestions, no new session: a line saying why.
    await expect(olga.get_by_text("You are watching this chat.")).to_be_visible()
    await expect(olga.get_by_label("Message to the agent")).to_be_hidden()
    await expect(olga.get_by_role("button", name="+ New session")).to_be_hidden()
    await expect(olga.locator(".suggestion")).to_be_hidden()
    await expect(lee.get_by_label("Message to the agent")).to_be_visible()

    # The form: its questions as people fill them in, none of them editable.
    await start_ticket_story(lee)
    system = olga.get_by_label("Affected system")
    await expect(system).to_be_disabled()
    await expect(olga.get_by_text("Waiting for a participant to answer.")).to_be_visible()
    await expect(olga.get_by_text("Waiting for a participant", exact=True)).to_be_visible()
    for button in ("Submit", "Decline", "Cancel request"):
        await expect(olga.get_by_role("button", name=button)).to_have_count(0)
    await lee.get_by_label("Affected system").fill("SSO")
    await lee.get_by_label("Some users").check()
    await expect(system).to_have_value("SSO")
    await shot(olga, "observer-form")
    await lee.get_by_role("button", name="Submit").click()

    # The approval: what the tool will do, nothing to approve or deny with.
    await expect(lee.get_by_role("button", name="Approve")).to_be_visible()
    await expect(
        olga.get_by_text("Waiting for a participant to approve or deny it.")
    ).to_be_visible()
    for button in ("Approve", "Deny"):
        await expect(olga.get_by_role("button", name=button)).to_have_count(0)
    await expect(olga.get_by_role("textbox")).to_have_count(0)  # nor a tool input to edit
    await shot(olga, "observer-approval")
    await lee.get_by_role("button", name="Approve").click()
    await expect(olga.get_by_text("Approved by Lee")).to_be_visible()
    assert [frame for frame in wire.sent[0] if frame.get("method") == "dispatchAction"] == []
    await expect(olga.get_by_role("alert")).to_have_count(0)  # nothing refused: nothing sent


# ─── Two people deciding at once ─────────────────────────────────────────────


@dataclass
class Deaf:
    """A page's sockets whose frames from the server can be held back, as a
    slow network would: what the page sends goes on at once."""

    holding: bool = False
    held: list[tuple[WebSocketRoute, str | bytes]] = field(default_factory=list)
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a held frame refuses an action of the page's."""

    async def prepare(self, page: Page) -> None:
        def route(ws: WebSocketRoute) -> None:
            server = ws.connect_to_server()
            ws.on_message(server.send)

            def from_server(message: str | bytes) -> None:
                if self.holding:
                    self.held.append((ws, message))
                    if "rejectionReason" in str(message):
                        self.refused.set()
                else:
                    ws.send(message)

            server.on_message(from_server)

        await page.route_web_socket(re.compile(r"/ahp"), route)

    def release(self) -> None:
        self.holding = False
        for ws, message in self.held:
            ws.send(message)
        self.held.clear()


async def test_a_denial_that_lost_the_race_to_an_approval_is_told_so(
    browser: Browser, demo_server: RunningServer
) -> None:
    base = demo_server.http
    session, _ = await create_session(base, "Both at once")
    _, lee = await open_client(browser, base, demo_server.token(name="Lee"), session=session)
    dana_ears = Deaf()
    _, dana = await open_client(
        browser, base, demo_server.token(name="Dana"), session=session, prepare=dana_ears.prepare
    )
    await start_ticket_story(lee)
    await answer_ticket_form(lee)
    await expect(dana.get_by_role("button", name="Deny")).to_be_visible()

    # Lee approves while Dana's page has not heard of it yet; Dana denies.
    dana_ears.holding = True
    await lee.get_by_role("button", name="Approve").click()
    await expect(lee.get_by_text("Approved by Lee")).to_be_visible()
    await dana.get_by_role("button", name="Deny").click()
    await dana.get_by_role("button", name="Deny the call").click()
    async with asyncio.timeout(10 * UNIT):
        await dana_ears.refused.wait()
    dana_ears.release()

    await expect(
        dana.get_by_role("status").filter(has_text="Your denial did not count")
    ).to_be_visible()
    await expect(dana.get_by_text("Approved by Lee")).to_be_visible()
    await expect(dana.get_by_role("alert")).to_have_count(0)
    await shot(dana, "race-lost")


# ─── An answer typed offline, another given meanwhile ────────────────────────


async def dana_answers_meanwhile(running: RunningServer, chat: str, proxy: CuttingProxy) -> None:
    """While Lee's page is held away, Dana answers "SSO and VPN"; then it may come back."""
    dana = InputAnswer(state="submitted", value=TextValue(value="SSO and VPN"))
    changed = ChatInputAnswerChanged(request_id=FORM.id, question_id="system", answer=dana)
    await running.server.parts.host.dispatch(chat, changed)
    proxy.release()


async def typing_cut_off(
    browser: Browser, running: RunningServer, proxy: CuttingProxy
) -> tuple[Page, AgentSide, Wire, Locator]:
    """Lee's page with "SSO" answered, typing "SSO only" into the field as its
    connection is cut (what it sends next is lost; it is kept away until
    ``proxy.release()``): the page, the agent, its wire, the field."""
    wire = Wire()
    page, agent, _ = await answered_through(browser, running, proxy, wire)
    proxy.hold_new_connections()
    proxy.cut_at_next_send()
    system = page.get_by_label("Affected system")
    await system.fill("SSO only")
    return page, agent, wire, system


def assert_none_after_the_cut(wire: Wire, *kinds: str) -> None:
    """The page sent no action of ``kinds`` on the sockets it opened after the cut."""
    later = range(1, len(wire.sent))
    for kind in kinds:
        assert [wire.dispatched(i, kind) for i in later] == [[] for _ in later], kind


async def test_an_answer_typed_offline_does_not_replace_one_given_meanwhile(
    browser: Browser, plain_server: RunningServer, proxied: CuttingProxy
) -> None:
    page, agent, wire, system = await typing_cut_off(browser, plain_server, proxied)
    await system.press("Tab")  # lost with the connection: it waits on the page
    await expect(page.locator("#connection")).to_contain_text("Reconnecting")
    await page.get_by_role("button", name="Submit").click()  # with that answer, it waits too

    await dana_answers_meanwhile(plain_server, agent.chat, proxied)

    told = page.get_by_role("status").filter(has_text="Your answer to")
    await expect(told).to_contain_text("someone changed it while you were offline")
    await expect(told).to_contain_text("You had answered: “SSO only”")
    not_submitted = page.get_by_role("status").filter(has_text="Your submit was not sent either")
    await expect(not_submitted).to_be_visible()
    await expect(page.get_by_role("button", name="Submit")).to_be_visible()  # still open
    await expect(page.locator("#connection")).to_be_hidden()
    await expect(system).to_have_value("SSO and VPN")
    turn = (await chat_state(plain_server, agent.chat)).active_turn
    assert turn is not None
    request = next(p.request for p in turn.response_parts if isinstance(p, InputRequestPart))
    assert (request.answers or {})["system"].value == TextValue(value="SSO and VPN")
    assert_none_after_the_cut(wire, "chat/inputAnswerChanged", "chat/inputCompleted")
    await shot(page, "answer-overtaken")


async def test_an_answer_still_being_typed_when_it_is_overtaken_is_not_sent_on_leaving(
    browser: Browser, plain_server: RunningServer, proxied: CuttingProxy
) -> None:
    page, agent, wire, system = await typing_cut_off(
        browser, plain_server, proxied
    )  # the draft goes out after a pause: lost, it waits
    await expect(page.locator("#connection")).to_contain_text("Reconnecting")
    await dana_answers_meanwhile(plain_server, agent.chat, proxied)

    told = page.get_by_role("status").filter(has_text="Your answer to")
    await expect(told).to_contain_text("You had answered: “SSO only”")
    await expect(system).to_be_focused()  # still in the field...
    await expect(system).to_have_value("SSO and VPN")  # ...which shows theirs
    await system.press("Tab")  # leaving it sends nothing...
    await expect(page.get_by_role("button", name="Submit")).to_be_focused()
    await page.keyboard.press("Enter")  # ...so the submit, after it, completes with theirs
    async with asyncio.timeout(10 * UNIT):
        outcome = await plain_server.server.parts.host.wait_input(agent.chat, FORM.id)
    assert outcome.answers["system"].value == TextValue(value="SSO and VPN")
    assert_none_after_the_cut(wire, "chat/inputAnswerChanged")
    await expect(told).to_be_visible()  # it stays until dismissed: the typed text is in it
