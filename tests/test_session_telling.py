"""What a session is yet to hear of a chat (server.core.rollup) survives a
follow-up that is cancelled (or fails) while it sends, and a request
answered while its asker lists it is not listed."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from protocol.actions import (
    ChatDraftChanged,
    ChatInputCompleted,
    ChatTurnComplete,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
)
from protocol.chat import ChatState, InputRequest, TextQuestion
from protocol.codec import encode
from protocol.session import SessionState
from protocol.status import ACTIVITY_MASK, SessionStatus
from protocol.uris import ROOT_URI
from reducers.aggregate import select_input_needed
from server.build import default_agents
from server.client import HuddleClient
from server.core.channels import Applied
from server.core.host import Host
from server.core.rollup import SESSION_RECORDS
from server.errors import StoreUnavailable
from server.store.base import ClientAction
from server.store.memory import MemoryStore
from tests.conftest import UNIT, RunningServer, user_message
from tests.edge import http
from tests.test_host_api import (
    ALICE,
    NOTE,
    SESSION,
    entry_key,
    listed,
    start_turn,
    two_hosts,
    wait_until,
    wait_until_open,
)


async def asked_and_listed(host: Host) -> tuple[str, asyncio.Task[Any]]:
    """The session's chat with a turn asking NOTE, once the session lists it."""
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await listed(host, "q")
    return chat, asking


def status_heard(person: HuddleClient, holds: Callable[[int], bool]) -> asyncio.Event:
    """Set once ``person`` (subscribed to the root) hears SESSION's entry in
    the sessions list change to a status whose activity ``holds``."""
    heard = asyncio.Event()

    def notice(method: str, params: Any) -> None:
        if method != "root/sessionSummaryChanged" or params.get("session") != SESSION:
            return
        status = params.get("changes", {}).get("status")
        if status is not None and holds(status & ACTIVITY_MASK):
            heard.set()

    person.notices.append(notice)
    return heard


class HeldAppend(MemoryStore):
    """A memory store whose first append of an action of type ``held``
    waits until released (``reached`` says it is waiting)."""

    def __init__(self, held: str) -> None:
        super().__init__()
        self.tag = f'"{held}"'.encode()
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.held = False

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        if not self.held and self.tag in envelope:
            self.held = True
            self.reached.set()
            await self.release.wait()
        await super().append(channel, expected_seq, envelope, origin)


async def test_an_answer_whose_telling_was_cancelled_is_unlisted_all_the_same() -> None:
    # The caller of an answer gives up (a client gone, a timeout) while the
    # aggregate tells the session: the queue was popped whole before it was
    # sent, so the removal was lost and the answered request stayed listed
    # for good, whatever the chat did next.
    store = HeldAppend("session/inputNeededRemoved")
    host = Host(store, agents=default_agents())
    await host.start()
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await wait_until_open(host, chat, "q")
    completing = asyncio.create_task(
        host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    )
    async with asyncio.timeout(2 * UNIT):
        await store.reached.wait()
        completing.cancel()
        await asyncio.gather(completing, return_exceptions=True)
        store.release.set()
        await asking

    other = InputRequest(id="q2", questions=[TextQuestion(id="x", message="More?")])
    asking_again = asyncio.create_task(host.request_input(chat, other))
    session = await listed(host, "q2")  # told after all that came before it
    asking_again.cancel()
    await host.stop()

    assert isinstance(session, SessionState)
    assert [entry_key(e) for e in session.input_needed or []] == ["q2"]


async def test_a_request_answered_while_its_asker_lists_it_is_not_listed() -> None:
    # The asker found the request open and is writing its entry; the
    # answerer settles it and tells the session in between. The asker's
    # write then conflicts and is made again, unchecked: listed for good.
    store = HeldAppend("session/inputNeededSet")
    async with two_hosts(store) as (asker, answerer, chat):
        asking = asyncio.create_task(asker.request_input(chat, NOTE))
        async with asyncio.timeout(2 * UNIT):
            await store.reached.wait()
        await wait_until_open(answerer, chat, "q")
        await answerer.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
        store.release.set()
        async with asyncio.timeout(2 * UNIT):
            await asking
        sessions = [(await host.view(SESSION)).state for host in (asker, answerer)]

    for session in sessions:
        assert isinstance(session, SessionState)
        assert session.input_needed is None


async def test_a_change_told_after_the_check_that_followed_it_is_checked_again() -> None:
    # The asker's telling is slow (its listing of a question waits on the
    # store). Meanwhile another process's change queues a check, the asker's
    # own answer queues its "in progress" behind that check, and the other
    # process ends the turn and says "idle", which the queued check covers.
    # The check runs first and finds nothing to correct; then the older
    # "in progress" lands last. The sender checks again after its own.
    store = HeldAppend("session/inputNeededSet")
    async with two_hosts(store) as (asker, other, chat):
        heard: dict[type, asyncio.Event] = {ChatDraftChanged: asyncio.Event()}
        heard[ChatTurnComplete] = asyncio.Event()

        def hearing(event: Applied) -> None:
            if not event.local and type(event.action) in heard:
                heard[type(event.action)].set()

        asker.core.hooks.bookkeeping.insert(0, hearing)
        asking = asyncio.create_task(asker.request_input(chat, NOTE))
        async with asyncio.timeout(2 * UNIT):
            await store.reached.wait()  # the asker's sender is held
            await wait_until_open(other, chat, "q")
            await other.dispatch(chat, ChatDraftChanged(draft=user_message("hm")))
            await heard[ChatDraftChanged].wait()  # a check is queued
            answer = ChatInputCompleted(request_id="q", response="cancel")
            answering = asyncio.create_task(asker.dispatch(chat, answer))
            await wait_until(asker, chat, answered)  # its "in progress" is queued
            await other.dispatch(chat, ChatTurnComplete(turn_id="t1", duration=5))
            await heard[ChatTurnComplete].wait()
            store.release.set()
            await asking
            await answering
            for host in (asker, other):
                await wait_until(host, SESSION, idle_and_unlisted)


def answered(state: Any) -> bool:
    return isinstance(state, ChatState) and not select_input_needed(state)


def idle_and_unlisted(state: Any) -> bool:
    assert isinstance(state, SessionState)
    idle = state.chats[0].status & ACTIVITY_MASK == SessionStatus.IDLE
    return idle and state.input_needed is None


async def test_the_follow_ups_after_one_its_caller_gave_up_in_still_run() -> None:
    # A hook before the session's (the runner's resume, say) is still at
    # work when the answer's caller is cancelled (uvicorn's graceful
    # timeout at a stop cancels the requests still running): the follow-ups
    # after it (the notes, the audit, the session's telling) were never
    # awaited, and the answered request stayed listed.
    reached, release = asyncio.Event(), asyncio.Event()

    async def slow(_: Applied) -> None:
        reached.set()
        await release.wait()

    host = Host(MemoryStore(), agents=default_agents())
    await host.start()
    try:
        chat, asking = await asked_and_listed(host)
        host.add_hook(lambda event: slow(event) if event.uri == chat else None)
        completing = asyncio.create_task(
            host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
        )
        async with asyncio.timeout(2 * UNIT):
            await reached.wait()
            completing.cancel()
            await asyncio.gather(completing, return_exceptions=True)
            await asking
        await wait_until(host, SESSION, lambda state: not state.input_needed)
    finally:
        release.set()
        await host.stop()


async def test_the_follow_up_a_cancelled_caller_was_awaiting_runs_to_its_end() -> None:
    # It was cancelled with its caller (a request cut off at a stop): an
    # audit record it was writing, a resume it was saving, was lost.
    reached, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow(_: Applied) -> None:
        reached.set()
        await release.wait()
        finished.set()

    host = Host(MemoryStore(), agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        host.add_hook(lambda event: slow(event) if event.uri == chat else None)
        starting = asyncio.create_task(start_turn(host, chat))
        async with asyncio.timeout(2 * UNIT):
            await reached.wait()
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            release.set()
            await host.core.settle(time.monotonic() + 2 * UNIT)
        assert finished.is_set()
    finally:
        release.set()
        await host.stop()


async def test_a_stopped_core_starts_nothing_that_a_cancelled_task_hands_on() -> None:
    # What a caller gave up on runs in the background, but not past a stop:
    # the store it would write to is closing.
    host = Host(MemoryStore(), agents=default_agents())
    await host.start()
    await host.stop()

    async def follow_up() -> None:
        raise AssertionError("ran after the stop")

    handed_on = follow_up()
    host.core.spawn(handed_on)

    assert inspect.getcoroutinestate(handed_on) == inspect.CORO_CLOSED


class LostReply(MemoryStore):
    """A memory store that takes the first append of an action of type
    ``lost`` and then fails as if its answer had been lost on the way."""

    def __init__(self, lost: str) -> None:
        super().__init__()
        self.tag = f'"{lost}"'.encode()
        self.lost = False

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        await super().append(channel, expected_seq, envelope, origin)
        if not self.lost and self.tag in envelope:
            self.lost = True
            raise StoreUnavailable("the store's answer was lost")


async def test_an_answer_whose_append_landed_unanswered_is_this_processs_all_the_same() -> None:
    # The append took, its answer did not come back (a Redis reply timed
    # out): the caller is told the store is unavailable, and the process
    # later took the entry in as another process's, whose hooks are that
    # process's to run: nobody audited the answer nor told its session.
    store = LostReply("chat/inputCompleted")
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat, asking = await asked_and_listed(host)
        answer = ChatInputCompleted(request_id="q", response="cancel")
        with pytest.raises(StoreUnavailable):
            await host.dispatch(chat, answer, sender=ALICE)
        await host.core.check_heads()  # as the next head check would
        async with asyncio.timeout(2 * UNIT):
            assert (await asking).response == "cancel"
        await wait_until(host, SESSION, lambda state: not state.input_needed)
        await host.audit.settled()
        records = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    finally:
        await host.stop()

    answers = [r for r in records if r["what"] == "chat/inputCompleted"]
    assert [r["who"]["name"] for r in answers] == ["alice"]


async def test_an_answer_whose_append_landed_unanswered_is_audited_at_a_stop_right_after() -> None:
    # The process stopped before a head check read the entry back: the
    # restarted one takes it as another process's, and nobody audits it.
    store = LostReply("chat/inputCompleted")
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        await start_turn(host, chat)
        asking = asyncio.create_task(host.request_input(chat, NOTE))
        await listed(host, "q")
        answer = ChatInputCompleted(request_id="q", response="cancel")
        with pytest.raises(StoreUnavailable):
            await host.dispatch(chat, answer, sender=ALICE)
    finally:
        await host.stop()

    assert (await asking).response == "cancel"
    records = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    answers = [r for r in records if r["what"] == "chat/inputCompleted"]
    assert [r["who"]["name"] for r in answers] == ["alice"]


class SessionDownAWhile(MemoryStore):
    """A memory store that refuses the first ``refusals`` appends of an
    action of type ``refused`` (Redis away a moment)."""

    def __init__(self, refused: str, refusals: int) -> None:
        super().__init__()
        self.tag = f'"{refused}"'.encode()
        self.refusals = refusals

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        if self.refusals > 0 and self.tag in envelope:
            self.refusals -= 1
            raise StoreUnavailable("down")
        await super().append(channel, expected_seq, envelope, origin)


async def test_an_answer_whose_telling_the_store_refused_is_told_again() -> None:
    # Redis away a moment as the session was told of the answer: the telling
    # was dropped, and the answered request stayed listed until the chat
    # changed again (after a restart, for as long as the turn waited on).
    store = SessionDownAWhile("session/inputNeededRemoved", refusals=1)
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat, asking = await asked_and_listed(host)
        await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
        await asking
        await wait_until(host, SESSION, lambda state: not state.input_needed)
    finally:
        await host.stop()

    assert store.refusals == 0


class LostReplyThenHung(LostReply):
    """LostReply, whose log reads then hang until ``release`` (Redis hung)."""

    def __init__(self, lost: str) -> None:
        super().__init__(lost)
        self.release = asyncio.Event()

    async def read_log(self, channel: str, after_seq: int, epoch: str) -> list[bytes] | None:
        if self.lost:
            await self.release.wait()
        return await super().read_log(channel, after_seq, epoch)


async def test_a_stop_reads_back_no_longer_than_its_time() -> None:
    # Each read back could wait out a store timeout past the stop's time.
    store = LostReplyThenHung("chat/turnStarted")
    host = Host(store, agents=default_agents())
    await host.start()
    chat = await host.create_session(SESSION)
    with pytest.raises(StoreUnavailable):
        await start_turn(host, chat)
    async with asyncio.timeout(2 * UNIT):
        await host.core.settle(time.monotonic() + 0.1)
    store.release.set()
    await host.stop()


async def test_a_session_subscribed_to_unlists_what_its_chats_settled(
    huddle: RunningServer,
) -> None:
    # A stop with the store down throughout left an answered request listed
    # (its unlisting untold, the retries gone with the process); the next
    # process listed it until the chat changed again, which a turn waiting
    # on people may not do for long.
    host = huddle.server.parts.host
    chat, asking = await asked_and_listed(host)
    entry = (await listed(host, "q")).input_needed or []
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    await wait_until(host, SESSION, lambda state: not state.input_needed)
    await host.dispatch(SESSION, SessionInputNeededSet(request=entry[0]))  # left listed
    host.aggregate.forget(chat)  # a process that started since

    person = await huddle.client(sessions=[SESSION])
    mirror = await person.subscribe(SESSION)

    async with asyncio.timeout(2 * UNIT):
        await mirror.wait_for(lambda state: not getattr(state, "input_needed", None))


async def test_a_session_subscribed_to_lists_what_its_chats_hold_open(
    huddle: RunningServer,
) -> None:
    # The other way round: the listing of a request was lost at such a stop,
    # and the open request stayed unlisted until it was answered.
    host = huddle.server.parts.host
    chat, asking = await asked_and_listed(host)
    [entry] = (await listed(host, "q")).input_needed or []
    await host.dispatch(SESSION, SessionInputNeededRemoved(id=entry.id))  # its listing lost
    host.aggregate.forget(chat)  # a process that started since

    person = await huddle.client(sessions=[SESSION])
    mirror = await person.subscribe(SESSION)

    async with asyncio.timeout(2 * UNIT):
        await mirror.wait_for(lambda state: bool(getattr(state, "input_needed", None)))
    asking.cancel()
    await asyncio.gather(asking, return_exceptions=True)


async def test_an_unwatched_chats_append_whose_answer_was_lost_is_read_back() -> None:
    # The head check looked only at channels with subscribers or pins: a
    # chat written over HTTP alone kept its landed append unread (not
    # audited, its session not told) until the process stopped.
    store = LostReply("chat/turnStarted")
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        with pytest.raises(StoreUnavailable):
            await start_turn(host, chat)
        await host.core.check_heads()  # as the next head check would
        await host.audit.settled()
        records = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    finally:
        await host.stop()

    assert [r["what"] for r in records] == ["chat/turnStarted"]


async def test_a_session_read_over_http_unlists_what_its_chats_settled(
    huddle: RunningServer,
) -> None:
    # As a subscribe does: HTTP clients read sessions with /api/snapshot.
    host = huddle.server.parts.host
    chat, asking = await asked_and_listed(host)
    [entry] = (await listed(host, "q")).input_needed or []
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    await wait_until(host, SESSION, lambda state: not state.input_needed)
    await host.dispatch(SESSION, SessionInputNeededSet(request=entry))  # left listed
    host.aggregate.forget(chat)  # a process that started since

    url = f"{huddle.http}/api/snapshot?channel={SESSION}"
    reply = await http("GET", url, token=huddle.token(sessions=[SESSION]))

    assert reply.status == 200
    await wait_until(host, SESSION, lambda state: not state.input_needed)


async def test_a_session_listed_is_checked_and_its_entry_said_again(
    huddle: RunningServer,
) -> None:
    # The sessions list said what such a stop left (a request still waiting
    # on people) until someone opened the session: listSessions read the
    # entries and checked nothing.
    host = huddle.server.parts.host
    person = await huddle.client(sessions=[SESSION])
    await person.subscribe(ROOT_URI)
    chat, asking = await asked_and_listed(host)
    [entry] = (await listed(host, "q")).input_needed or []
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    await wait_until(host, SESSION, lambda state: not state.input_needed)
    waiting = status_heard(person, lambda status: status == SessionStatus.INPUT_NEEDED)
    await host.dispatch(SESSION, SessionInputNeededSet(request=entry))  # left listed
    host.aggregate.forget(chat)  # a process that started since
    async with asyncio.timeout(2 * UNIT):
        await waiting.wait()

    settled = status_heard(person, lambda status: status != SessionStatus.INPUT_NEEDED)
    [before] = await person.list_sessions()  # what it said, and then it is checked
    assert before["status"] & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED

    async with asyncio.timeout(2 * UNIT):
        await settled.wait()
    [after] = await person.list_sessions()
    assert after["status"] & ACTIVITY_MASK != SessionStatus.INPUT_NEEDED
    state = (await host.view(SESSION)).state
    assert isinstance(state, SessionState)
    assert not state.input_needed


async def test_a_listed_entry_the_store_kept_old_is_said_again(huddle: RunningServer) -> None:
    # The session was told, but writing its entry failed: the list kept
    # the entry from before, which the session no longer says.
    host = huddle.server.parts.host
    person = await huddle.client(sessions=[SESSION])
    await person.subscribe(ROOT_URI)
    answered = status_heard(person, lambda status: status != SessionStatus.INPUT_NEEDED)
    chat, asking = await asked_and_listed(host)
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    async with asyncio.timeout(2 * UNIT):
        await answered.wait()
    [summary] = await host.aggregate.summaries()
    busy = summary.status & ~ACTIVITY_MASK | SessionStatus.INPUT_NEEDED
    stale = msgspec.structs.replace(summary, status=busy)
    await host.core.store.put_record(SESSION_RECORDS, SESSION, encode(stale))  # left as was
    host.aggregate.forget(SESSION)  # a process that started since
    host.aggregate.forget(chat)

    said_again = status_heard(person, lambda status: status != SessionStatus.INPUT_NEEDED)
    await person.list_sessions()

    async with asyncio.timeout(2 * UNIT):
        await said_again.wait()
    [after] = await person.list_sessions()
    assert after["status"] & ACTIVITY_MASK != SessionStatus.INPUT_NEEDED
