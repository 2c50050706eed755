"""A session's notes stay within their bound however many requests people
settle, and what is current stays: over a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatTurnStarted,
)
from protocol.chat import InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.codec import encode
from protocol.session import SessionState
from reducers import notes
from reducers.limits import SizeLimits
from server.client import HuddleClient
from server.config import Limits, Settings
from tests.conftest import UNIT, RunningServer, start_server, user_message
from tests.edge import Peer

SESSION = "ahp-session:/noted"
NOTES = 64 << 10
SEND_BUFFER = 256 << 10
"""Notes that grew past this could not be sent to a new subscriber at all."""
QUESTIONS = 20
"""Questions of 250-byte ids: a settled request's note takes about 7.5 KB."""


@pytest.fixture
async def running() -> AsyncIterator[RunningServer]:
    settings = Settings(
        port=0,
        sizes=SizeLimits(notes=NOTES),
        limits=Limits(send_buffer=SEND_BUFFER, action_burst=1000),
    )
    server = await start_server(settings)
    try:
        yield server
    finally:
        await server.stop()


def question_id(n: int) -> str:
    return f"q{n}-".ljust(250, "q")


def answer(state: str = "submitted") -> InputAnswer:
    return InputAnswer(state=state, value=TextValue(value="x"))  # type: ignore[arg-type]


@dataclass
class Flood:
    """Three chats of one session: in ``quiet`` Dana settled a few requests
    and is typing in an open one (``open``); then many requests were
    settled in ``busy`` and, last, in ``current``."""

    agent: HuddleClient
    dana: HuddleClient
    quiet: str
    busy: str
    current: str
    open: str = "open"


async def a_chat(agent: HuddleClient, name: str) -> str:
    chat = f"ahp-chat:/{name}"
    await agent.call("createChat", {"channel": SESSION, "chat": chat})
    start = ChatTurnStarted(
        turn_id="t", started_at="2026-12-01T10:00:00Z", message=user_message("go")
    )
    await agent.dispatch_and_wait(chat, start)
    return chat


async def ask(agent: HuddleClient, chat: str, request_id: str) -> None:
    questions = [TextQuestion(id=question_id(n), message="?") for n in range(QUESTIONS)]
    request = InputRequest(id=request_id, questions=list(questions))
    await agent.dispatch_and_wait(chat, ChatInputRequested(request=request))


async def settle(agent: HuddleClient, dana: HuddleClient, chat: str, count: int) -> None:
    """``count`` requests asked in ``chat`` and completed by Dana."""
    for n in range(count):
        await ask(agent, chat, f"r{n}")
        answers = {question_id(q): answer() for q in range(QUESTIONS)}
        completion = ChatInputCompleted(request_id=f"r{n}", response="accept", answers=answers)
        await dana.dispatch_and_wait(chat, completion)


async def noted(agent: HuddleClient, check: Any) -> dict[str, Any]:
    """The session's ``_meta`` once ``check`` holds for it."""
    async with asyncio.timeout(10 * UNIT):
        state = await agent.mirrors[SESSION].wait_for(lambda s: bool(check(s.meta)))
    assert isinstance(state, SessionState)
    return state.meta or {}


async def flooded(running: RunningServer) -> Flood:
    agent = await running.client("agent", name="agent")
    dana = await running.client(name="Dana")
    await agent.create_session(SESSION)
    await agent.subscribe(SESSION)
    quiet, busy, current = [await a_chat(agent, name) for name in ("quiet", "busy", "current")]
    await settle(agent, dana, quiet, 3)
    await ask(agent, quiet, "open")
    draft = ChatInputAnswerChanged(
        request_id="open", question_id=question_id(0), answer=answer("draft")
    )
    await dana.dispatch_and_wait(quiet, draft)
    await settle(agent, dana, busy, 10)
    await settle(agent, dana, current, 30)  # about 400 KB of notes unbounded
    flood = Flood(agent, dana, quiet, busy, current)
    await noted(agent, lambda m: notes.note_of(m, "requests", current, "r29"))
    return flood


async def test_a_session_whose_notes_outgrow_the_bound_still_loads_for_a_new_subscriber(
    running: RunningServer,
) -> None:
    await flooded(running)

    late = await Peer.ready(running.ws, running.token("observer", name="late"), "late")
    snapshot = await late.subscribe(SESSION)

    meta = snapshot["state"]["_meta"]
    assert notes.notes_bytes(meta) <= NOTES
    assert len(encode(snapshot)) < SEND_BUFFER // 2
    state = (await running.server.parts.host.view(SESSION)).state
    assert isinstance(state, SessionState)
    assert notes.notes_bytes(state.meta) <= NOTES


async def test_beyond_the_bound_the_oldest_notes_go_first_and_the_current_ones_stay(
    running: RunningServer,
) -> None:
    flood = await flooded(running)
    state = (await running.server.parts.host.view(SESSION)).state
    assert isinstance(state, SessionState)
    meta = state.meta

    def kept(chat: str) -> list[str]:
        return list(((notes.huddle_meta(meta, "requests") or {}).get(chat)) or {})

    # The chats noted least recently lost their settled notes first; the
    # chat noted last, its oldest ones.
    assert kept(flood.busy) == []
    assert kept(flood.quiet) == ["open"]
    assert "r0" not in kept(flood.current)
    assert kept(flood.current) == [f"r{n}" for n in range(30 - len(kept(flood.current)), 30)]
    # What is current stays: the request just completed, with its authors,
    # and Dana's draft in the request still open.
    newest = notes.note_of(meta, "requests", flood.current, "r29")
    assert newest is not None
    assert newest["completed"]["by"]["name"] == "Dana"
    assert newest["answers"][question_id(QUESTIONS - 1)]["by"]["name"] == "Dana"
    typing = notes.note_of(meta, "requests", flood.quiet, "open")
    assert typing is not None
    assert list(typing) == ["turn", "answers"]  # of its turn, a draft in it
    assert list(typing["answers"]) == [question_id(0)]
    assert typing["answers"][question_id(0)]["state"] == "draft"
    assert typing["answers"][question_id(0)]["by"]["name"] == "Dana"


async def test_a_note_on_an_old_chat_makes_it_the_newest_and_keeps_it(
    running: RunningServer,
) -> None:
    flood = await flooded(running)

    more = ChatInputAnswerChanged(
        request_id="open", question_id=question_id(1), answer=answer("draft")
    )
    await flood.dana.dispatch_and_wait(flood.quiet, more)

    meta = await noted(
        flood.agent,
        lambda m: (
            (notes.note_of(m, "requests", flood.quiet, "open") or {}).get("answers", {})
        ).get(question_id(1)),
    )
    assert notes.notes_bytes(meta) <= NOTES
    assert list(notes.huddle_meta(meta, "requests"))[-1] == flood.quiet
    assert notes.note_of(meta, "requests", flood.current, "r29") is not None


async def test_notes_that_come_together_are_written_together(running: RunningServer) -> None:
    # Each note re-sends every note to every watcher (AHP replaces the whole
    # _meta): twenty drafts in a row were twenty copies of all the notes.
    agent = await running.client("agent", name="agent")
    dana = await running.client(name="Dana")
    await agent.create_session(SESSION)
    await agent.subscribe(SESSION)
    chat = await a_chat(agent, "drafts")
    await ask(agent, chat, "r")
    watcher = await Peer.ready(running.ws, running.token(name="Lee"), "lee")
    await watcher.subscribe(SESSION)
    await dana.subscribe(chat)

    for n in range(QUESTIONS):  # each a note of its own: a new question answered
        draft = ChatInputAnswerChanged(
            request_id="r", question_id=question_id(n), answer=answer("draft")
        )
        await dana.dispatch(chat, draft)

    def drafted(meta: dict[str, Any]) -> int:
        found = notes.note_of(meta, "requests", chat, "r") or {}
        return len(found.get("answers") or {})

    changes = 0
    async with asyncio.timeout(10 * UNIT):
        while True:
            envelope = await watcher.envelope()
            if envelope["action"]["type"] == "session/metaChanged":
                changes += 1
                if drafted(envelope["action"]["_meta"]) == QUESTIONS:
                    break
    assert changes < QUESTIONS // 2  # the first at once, the rest a few at a time


async def test_a_sessions_input_needed_stays_loadable_however_much_is_asked(
    running: RunningServer,
) -> None:
    # inputNeeded mirrors every open request of every chat in full: an agent
    # (or an MCP server through it) asking large questions in many chats
    # made the session too large for anyone to load.
    agent = await running.client("agent", name="agent")
    await agent.create_session(SESSION)
    await agent.subscribe(SESSION)
    for n in range(6):  # about 100 KB a request: 600 KB unbounded
        chat = await a_chat(agent, f"asking-{n}")
        questions = [TextQuestion(id=f"q{q}", message="?" * 10_000) for q in range(10)]
        request = InputRequest(id=f"r{n}", questions=list(questions))
        await agent.dispatch_and_wait(chat, ChatInputRequested(request=request))
    newcomer = await Peer.ready(running.ws, running.token(name="Lee"), "lee")
    snapshot = await newcomer.subscribe(SESSION)

    listed = snapshot["state"].get("inputNeeded") or []
    assert len(encode(listed)) <= 256 << 10
    assert 0 < len(listed) < 6  # the first ones, then no more
