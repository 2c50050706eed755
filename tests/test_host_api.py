"""The host's in-process API: sessions, asking people, waiting, aggregates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
    SessionIsReadChanged,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    NumberValue,
    SelectedValue,
    TextQuestion,
    TextValue,
)
from protocol.messages import ActionOrigin
from protocol.session import ChatInputNeeded, RootState, SessionInputRequest, SessionState
from protocol.status import ACTIVITY_MASK, SessionStatus
from protocol.uris import ROOT_URI
from server.auth import Identity
from server.build import default_agents
from server.core.channels import Applied
from server.core.host import Host
from server.errors import ActionRejected, CommandError, InputAbandoned
from server.frames import OutFrame
from server.store.base import ClientAction, Listener
from server.store.memory import MemoryStore
from tests.conftest import UNIT, RecordReads, user_message

SESSION = "ahp-session:/s1"
TICKET_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "system": {"type": "string", "title": "Affected system", "pattern": "^[A-Z]+$"},
        "impact": {"type": "string", "enum": ["one-user", "team", "everyone"]},
        "users": {"type": "integer", "minimum": 1},
    },
    "required": ["system", "impact"],
}


class Recorder:
    """A subscriber that keeps every frame it is sent."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.resynced: list[str] = []
        self.arrived = asyncio.Event()

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        self.frames.append(json.loads(frame.payload))
        self.arrived.set()

    def resync(self, channel: str) -> None:
        self.resynced.append(channel)

    def seqs(self, channel: str) -> list[int]:
        return [
            f["params"]["serverSeq"]
            for f in self.frames
            if f.get("method") == "action" and f["params"]["channel"] == channel
        ]

    def methods(self) -> list[str]:
        return [f["method"] for f in self.frames]


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    host = Host(MemoryStore(), agents=default_agents(), clock=lambda: 1_800_000_000.0)
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


async def start_turn(host: Host, chat: str, turn_id: str = "t1") -> None:
    await host.dispatch(
        chat,
        ChatTurnStarted(
            turn_id=turn_id,
            started_at="2027-01-15T08:00:00.000Z",
            message=user_message("Open a high-priority ticket: nobody can log in"),
        ),
    )


def submitted(value: Any) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


NOTE = InputRequest(
    id="q",
    message="Anything to add?",
    questions=[TextQuestion(id=name, message=f"Note {name}") for name in ("x", "a", "b")],
)
PARTICIPANT = ActionOrigin(client_id="browser-1", client_seq=1)
ALICE = Identity(role="participant", name="alice", token="t-alice")


async def answer_ticket_form(host: Host, chat: str, request_id: str, system: str) -> None:
    await host.dispatch(
        chat,
        ChatInputCompleted(
            request_id=request_id,
            response="accept",
            answers={
                "system": submitted(TextValue(value=system)),
                "impact": submitted(SelectedValue(value="everyone")),
                "users": submitted(NumberValue(value=250.0)),
            },
        ),
        origin=PARTICIPANT,
        sender=ALICE,
    )


async def wait_until_open(host: Host, chat: str, request_id: str) -> None:
    """Wait until ``request_id`` is open in ``chat`` (a subscriber sees the
    ``chat/inputRequested`` envelope, or it was open already)."""

    def is_open(state: Any) -> bool:
        assert isinstance(state, ChatState)
        turn = state.active_turn
        return turn is not None and any(
            isinstance(p, InputRequestPart) and p.request.id == request_id
            for p in turn.response_parts
        )

    await wait_until(host, chat, is_open)


async def listed(host: Host, request_id: str, chat: str | None = None) -> SessionState:
    """SESSION once its ``inputNeeded`` lists ``request_id`` (of ``chat``):
    the session is told after the chat changed, not with it."""

    def lists(state: Any) -> bool:
        return any(
            entry_key(e) == request_id and chat in (None, e.chat) for e in state.input_needed or []
        )

    await wait_until(host, SESSION, lists)
    state = (await host.view(SESSION)).state
    assert isinstance(state, SessionState)
    return state


async def wait_until(host: Host, uri: str, holds: Callable[[Any], bool]) -> None:
    """Wait until the channel's state, as ``host`` has it, ``holds``."""
    recorder = Recorder()
    await host.core.subscribe(uri, recorder)

    def now() -> bool:
        view = host.core.cached(uri)
        assert view is not None
        return holds(view.state)

    try:
        async with asyncio.timeout(2 * UNIT):
            while not now():
                recorder.arrived.clear()
                await recorder.arrived.wait()
    finally:
        host.core.unsubscribe(uri, recorder)


async def test_create_session_makes_a_ready_session_with_its_default_chat(host: Host) -> None:
    chat = await host.create_session(SESSION, title="Login failures")
    session = (await host.view(SESSION)).state
    assert isinstance(session, SessionState)
    assert session.lifecycle == "ready"
    assert session.default_chat == chat
    assert [c.resource for c in session.chats] == [chat]
    root = (await host.view(ROOT_URI)).state
    assert isinstance(root, RootState)
    assert root.active_sessions == 1
    assert [s.title for s in await host.aggregate.summaries()] == ["Login failures"]


async def test_create_session_refuses_a_uri_in_use(host: Host) -> None:
    await host.create_session(SESSION)
    with pytest.raises(CommandError) as error:
        await host.create_session(SESSION)
    assert error.value.code == -32003


async def test_request_input_returns_typed_form_data_and_who_answered(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(
        host.request_input(
            chat, InputRequest(id="details", message="Ticket details"), schema=TICKET_FORM
        )
    )
    await wait_until_open(host, chat, "details")
    await answer_ticket_form(host, chat, "details", "SSO")
    async with asyncio.timeout(2 * UNIT):
        outcome = await asking
    assert outcome.response == "accept"
    assert outcome.data == {"system": "SSO", "impact": "everyone", "users": 250}
    assert isinstance(outcome.data["users"], int)
    assert outcome.by == ALICE
    assert outcome.origin == PARTICIPANT


async def test_accept_that_breaks_the_frozen_schema_is_rejected(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(
        host.request_input(chat, InputRequest(id="details"), schema=TICKET_FORM)
    )
    await wait_until_open(host, chat, "details")
    with pytest.raises(ActionRejected) as rejected:
        await answer_ticket_form(host, chat, "details", "lowercase-is-not-allowed")
    assert rejected.value.code == "form-invalid"
    assert "lowercase" not in rejected.value.reason
    assert not asking.done()
    await answer_ticket_form(host, chat, "details", "SSO")
    async with asyncio.timeout(2 * UNIT):
        assert (await asking).response == "accept"


@pytest.mark.parametrize(
    "end_turn",
    [
        pytest.param(ChatTurnComplete(turn_id="t1", duration=5), id="turn-complete"),
        pytest.param(ChatTurnCancelled(turn_id="t1", duration=5), id="turn-cancelled"),
        pytest.param(ChatTruncated(), id="truncated"),
    ],
)
async def test_waiting_for_input_is_abandoned_when_the_turn_goes(host: Host, end_turn: Any) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await wait_until_open(host, chat, "q")
    await host.dispatch(chat, end_turn)
    with pytest.raises(InputAbandoned):
        async with asyncio.timeout(2 * UNIT):
            await asking


async def test_request_input_without_an_active_turn_is_rejected(host: Host) -> None:
    chat = await host.create_session(SESSION)
    with pytest.raises(ActionRejected):
        await host.request_input(chat, NOTE)


async def test_wait_input_returns_at_once_for_a_completed_request(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await wait_until_open(host, chat, "q")
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="decline"))
    await asking
    outcome = await host.wait_input(chat, "q")
    assert outcome.response == "decline"
    with pytest.raises(InputAbandoned):
        await host.wait_input(chat, "never-asked")


async def open_tool_call(host: Host, chat: str) -> None:
    await host.dispatch(
        chat,
        ChatToolCallStart(
            turn_id="t1",
            tool_call_id="c1",
            tool_name="create_support_ticket",
            display_name="Create support ticket",
        ),
    )
    await host.dispatch(
        chat,
        ChatToolCallReady(
            turn_id="t1",
            tool_call_id="c1",
            invocation_message="Create P1 ticket",
            tool_input='{"priority": "high"}',
            editable=True,
        ),
    )


@pytest.mark.parametrize("approved", [True, False], ids=["approve", "deny"])
async def test_wait_tool_confirmation_returns_the_decision(host: Host, approved: bool) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    await open_tool_call(host, chat)
    waiting = asyncio.create_task(host.wait_tool_confirmation(chat, "t1", "c1"))
    await asyncio.sleep(0)  # let the waiter register before the decision
    decision = (
        ChatToolCallConfirmed(
            turn_id="t1",
            tool_call_id="c1",
            approved=True,
            confirmed="user-action",
            edited_tool_input='{"priority": "p1"}',
        )
        if approved
        else ChatToolCallConfirmed(turn_id="t1", tool_call_id="c1", approved=False, reason="denied")
    )
    await host.dispatch(chat, decision, origin=PARTICIPANT)
    async with asyncio.timeout(2 * UNIT):
        result = await waiting
    assert result.approved is approved
    assert result.origin == PARTICIPANT
    if approved:
        assert result.edited_input == '{"priority": "p1"}'
    else:
        assert result.reason == "denied"


async def test_wait_tool_confirmation_is_abandoned_when_the_turn_ends(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    await open_tool_call(host, chat)
    waiting = asyncio.create_task(host.wait_tool_confirmation(chat, "t1", "c1"))
    await asyncio.sleep(0)
    await host.dispatch(chat, ChatTurnCancelled(turn_id="t1", duration=1))
    with pytest.raises(InputAbandoned):
        async with asyncio.timeout(2 * UNIT):
            await waiting


async def test_session_mirrors_open_requests_and_the_chat_status(host: Host) -> None:
    chat = await host.create_session(SESSION)
    root = Recorder()
    await host.core.subscribe(ROOT_URI, root)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await wait_until(
        host,
        SESSION,
        lambda state: state.chats[0].status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED,
    )
    session = await listed(host, "q")
    assert [entry_key(r) for r in session.input_needed or []] == ["q"]
    assert session.status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED
    assert session.chats[0].status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED
    summary = (await host.aggregate.summaries())[0]
    assert summary.status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED
    assert "root/sessionSummaryChanged" in root.methods()

    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    after = (await host.view(SESSION)).state
    assert isinstance(after, SessionState)
    assert after.input_needed is None
    assert after.chats[0].status & ACTIVITY_MASK == SessionStatus.IN_PROGRESS


def entry_key(entry: SessionInputRequest) -> str:
    """The id of the request or tool call an ``inputNeeded`` entry lists."""
    return entry.request.id if isinstance(entry, ChatInputNeeded) else entry.tool_call.tool_call_id


async def test_two_chats_asking_alike_are_two_entries_of_their_session(host: Host) -> None:
    # Request and tool call ids are unique per chat only (a client numbering
    # its turns and a model's fixed call ids make them alike across chats):
    # an inputNeeded entry's id names its chat, so answering one chat's
    # question leaves the other's listed.
    first = await host.create_session(SESSION)
    second = "ahp-chat:/second"
    await host.create_chat(SESSION, second)
    asking = []
    for chat in (first, second):
        await start_turn(host, chat)
        asking.append(asyncio.create_task(host.request_input(chat, NOTE)))
        session = await listed(host, "q", chat)
    assert sorted((r.chat, entry_key(r)) for r in session.input_needed or []) == sorted(
        [(first, "q"), (second, "q")]
    )

    await host.dispatch(first, ChatInputCompleted(request_id="q", response="cancel"))
    await asking[0]

    after = (await host.view(SESSION)).state
    assert isinstance(after, SessionState)
    assert [(r.chat, entry_key(r)) for r in after.input_needed or []] == [(second, "q")]
    assert after.status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED
    asking[1].cancel()


async def test_a_process_new_to_a_chat_lists_its_requests_as_they_are(host: Host) -> None:
    # A process that has not followed a chat (it started since, or forgot
    # it) brings the session's entries of that chat in line with the chat
    # at its first change: none outlives its request, and none an earlier
    # Huddle listed under the request's id alone (ids did not name chats).
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    session = await listed(host, "q")
    assert session.input_needed is not None
    entry = session.input_needed[0]
    await host.dispatch(SESSION, SessionInputNeededRemoved(id=entry.id))
    await host.dispatch(SESSION, SessionInputNeededSet(request=replace(entry, id="q")))
    host.aggregate.forget(chat)  # as after a restart

    draft = ChatInputAnswerChanged(
        request_id="q",
        question_id="x",
        answer=InputAnswer(state="draft", value=TextValue(value="a")),
    )
    await host.dispatch(chat, draft, origin=PARTICIPANT, sender=ALICE)
    relisted = (await host.view(SESSION)).state
    host.aggregate.forget(chat)
    await host.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
    await asking
    settled = (await host.view(SESSION)).state

    assert isinstance(relisted, SessionState)
    assert [e.id for e in relisted.input_needed or []] == [entry.id]
    assert isinstance(settled, SessionState)
    assert settled.input_needed is None


async def test_answer_drafts_do_not_flood_the_session(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)
    asking = asyncio.create_task(host.request_input(chat, NOTE))
    await wait_until_open(host, chat, "q")
    session_seq = (await host.view(SESSION)).seq
    for n in range(20):
        draft = InputAnswer(state="draft", value=TextValue(value=f"typing {n}"))
        await host.dispatch(
            chat, ChatInputAnswerChanged(request_id="q", question_id="x", answer=draft)
        )
    assert (await host.view(SESSION)).seq - session_seq <= 1
    asking.cancel()


@asynccontextmanager
async def two_hosts(
    store: MemoryStore, *, turn: bool = True
) -> AsyncIterator[tuple[Host, Host, str]]:
    """Two hosts (two processes) on one store: a session made on the first,
    its default chat watched on the second (people are there), and a turn
    started on the first (unless not ``turn``)."""
    first, second = Host(store, agents=default_agents()), Host(store, agents=default_agents())
    await first.start()
    await second.start()
    try:
        chat = await first.create_session(SESSION)
        await second.core.subscribe(chat, Recorder())
        if turn:
            await start_turn(first, chat)
        yield first, second, chat
    finally:
        await first.stop()
        await second.stop()


async def test_two_hosts_on_one_store_deliver_the_same_envelopes_in_order() -> None:
    store = MemoryStore()
    first = Host(store, agents=default_agents())
    second = Host(store, agents=default_agents())
    await first.start()
    await second.start()
    chat = await first.create_session(SESSION)
    watcher = Recorder()
    await second.core.subscribe(chat, watcher)
    await start_turn(first, chat)
    asking = asyncio.create_task(first.request_input(chat, NOTE))
    await wait_until_open(first, chat, "q")

    async def type_on(host: Host, who: str) -> None:
        for n in range(25):
            draft = InputAnswer(state="draft", value=TextValue(value=f"{who} {n}"))
            await host.dispatch(
                chat, ChatInputAnswerChanged(request_id="q", question_id=who, answer=draft)
            )

    await asyncio.gather(type_on(first, "a"), type_on(second, "b"))
    final = (await first.view(chat)).seq
    async with asyncio.timeout(2 * UNIT):
        while watcher.seqs(chat)[-1:] != [final]:
            watcher.arrived.clear()
            await watcher.arrived.wait()
    seqs = watcher.seqs(chat)
    assert seqs == list(range(seqs[0], final + 1))
    assert (await second.view(chat)).state == (await first.view(chat)).state
    asking.cancel()
    await first.stop()
    await second.stop()


async def test_an_answer_is_unlisted_though_the_asker_moved_on_before_it_was_told() -> None:
    # The process that accepted an answer tells the session; when the
    # asker's next envelope (the resumed agent's) reached that process before
    # its own telling ran, the answered request stayed listed for good.
    store = MemoryStore()
    async with two_hosts(store) as (asker, answerer, chat):
        asking = asyncio.create_task(asker.request_input(chat, NOTE))
        await wait_until_open(answerer, chat, "q")
        heard = asyncio.Event()

        def heard_the_asker(event: Applied) -> None:
            if not event.local and isinstance(event.action, ChatDraftChanged):
                heard.set()

        async def the_asker_moves_on() -> None:
            await asker.dispatch(chat, ChatDraftChanged(draft=user_message("next")))
            await heard.wait()

        def before_the_aggregate(event: Applied) -> Awaitable[None] | None:
            heard_the_asker(event)
            if event.local and isinstance(event.action, ChatInputCompleted):
                return the_asker_moves_on()
            return None

        answerer.core.hooks.bookkeeping.insert(0, before_the_aggregate)
        async with asyncio.timeout(2 * UNIT):
            await answerer.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
            await asking
        session = (await answerer.view(SESSION)).state

        assert heard.is_set()
        assert isinstance(session, SessionState)
        assert session.input_needed is None


async def test_a_request_answered_before_its_asker_listed_it_is_not_listed() -> None:
    # The other way round: the answer is told first, by the process that
    # took it; the asker, lagging, must not list the request after that.
    store = MemoryStore()
    async with two_hosts(store, turn=False) as (asker, answerer, chat):
        await asker.core.subscribe(chat, Recorder())
        await start_turn(asker, chat)
        heard = asyncio.Event()

        async def answered_at_once() -> None:
            await wait_until_open(answerer, chat, "q")
            await answerer.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))
            await heard.wait()

        def before_the_aggregate(event: Applied) -> Awaitable[None] | None:
            if not event.local and isinstance(event.action, ChatInputCompleted):
                heard.set()
            if event.local and isinstance(event.action, ChatInputRequested):
                return answered_at_once()
            return None

        asker.core.hooks.bookkeeping.insert(0, before_the_aggregate)
        async with asyncio.timeout(2 * UNIT):
            await asker.request_input(chat, NOTE)
        sessions = [(await host.view(SESSION)).state for host in (asker, answerer)]

        assert heard.is_set()
        for session in sessions:
            assert isinstance(session, SessionState)
            assert session.input_needed is None


class Deafened(MemoryStore):
    """A memory store that holds back what one process hears of the others'
    appends until released (as a slow link to it would)."""

    def __init__(self) -> None:
        super().__init__()
        self.deaf: Listener | None = None
        self.held: list[tuple[str, int, bytes]] = []

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        return super().add_listener(_Holding(self, listener))

    def release(self) -> None:
        deaf, self.deaf = self.deaf, None
        assert deaf is not None
        for held in self.held:
            deaf.envelope_appended(*held)
        self.held.clear()


class _Holding(Listener):
    def __init__(self, store: Deafened, listener: Listener) -> None:
        self.store, self.listener = store, listener

    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        if self.store.deaf is self.listener:
            self.store.held.append((channel, seq, envelope))
        else:
            self.listener.envelope_appended(channel, seq, envelope)

    def notice(self, topic: str, payload: bytes) -> None:
        self.listener.notice(topic, payload)

    def store_reconnected(self) -> None:
        self.listener.store_reconnected()


def unlisted(state: Any) -> bool:
    return isinstance(state, SessionState) and state.input_needed is None


async def test_a_request_the_asker_listed_after_it_was_answered_and_unlisted_is_unlisted() -> None:
    # What two processes tell a session lands in no set order: here the
    # answering process unlists the request before the asker, which has not
    # heard of the answer yet, lists it. Once the asker hears of it, it
    # takes the entry away again.
    store = Deafened()
    async with two_hosts(store) as (asker, answerer, chat):

        async def answered_first() -> None:
            await wait_until_open(answerer, chat, "q")
            store.deaf = asker.core
            await answerer.dispatch(chat, ChatInputCompleted(request_id="q", response="cancel"))

        def before_the_aggregate(event: Applied) -> Awaitable[None] | None:
            if event.local and isinstance(event.action, ChatInputRequested):
                return answered_first()
            return None

        asker.core.hooks.bookkeeping.insert(0, before_the_aggregate)
        asking = asyncio.create_task(asker.request_input(chat, NOTE))
        await wait_until(asker, SESSION, lambda state: not unlisted(state))  # listed late
        store.release()
        async with asyncio.timeout(2 * UNIT):
            await asking
        await wait_until(answerer, SESSION, unlisted)
        await wait_until(asker, SESSION, unlisted)


async def test_a_chat_status_told_late_by_one_process_is_set_right_when_it_hears_the_newer() -> (
    None
):
    # The approving process's "in progress" landed after the worker's
    # "idle" at the turn's end: the session's catalog said in progress for
    # good. The process that told the older state corrects it once it hears
    # of the newer one.
    store = Deafened()
    async with two_hosts(store, turn=False) as (starter, ender, chat):

        def active(state: Any) -> bool:
            return isinstance(state, ChatState) and state.active_turn is not None

        async def ended_first() -> None:
            await wait_until(ender, chat, active)
            store.deaf = starter.core
            await ender.dispatch(chat, ChatTurnComplete(turn_id="t1", duration=5))

        def before_the_aggregate(event: Applied) -> Awaitable[None] | None:
            if event.local and isinstance(event.action, ChatTurnStarted):
                return ended_first()
            return None

        starter.core.hooks.bookkeeping.insert(0, before_the_aggregate)
        await start_turn(starter, chat)

        def idle(state: Any) -> bool:
            assert isinstance(state, SessionState)
            return state.chats[0].status & ACTIVITY_MASK == SessionStatus.IDLE

        told_late = (await starter.view(SESSION)).state
        store.release()
        await wait_until(starter, SESSION, idle)
        await wait_until(ender, SESSION, idle)

    assert not idle(told_late)


async def test_the_form_of_a_request_another_host_opened_is_read_before_the_accept() -> None:
    store = RecordReads()
    asker, answerer = Host(store, agents=default_agents()), Host(store, agents=default_agents())
    await asker.start()
    await answerer.start()
    chat = await asker.create_session(SESSION)
    await answerer.core.subscribe(chat, Recorder())  # people are on the other process
    await start_turn(asker, chat)
    asking = asyncio.create_task(
        asker.request_input(chat, InputRequest(id="details"), schema=TICKET_FORM)
    )
    async with asyncio.timeout(2 * UNIT):
        while ("form", f"{chat} details") not in store.reads:
            store.read.clear()
            await store.read.wait()
    reads = len(store.reads)
    with pytest.raises(ActionRejected) as rejected:  # checked against the form asked
        await answer_ticket_form(answerer, chat, "details", "lowercase-is-not-allowed")
    assert rejected.value.code == "form-invalid"
    await answer_ticket_form(answerer, chat, "details", "SSO")
    assert [kind for kind, _ in store.reads[reads:] if kind == "form"] == []
    async with asyncio.timeout(2 * UNIT):
        assert (await asking).data == {"system": "SSO", "impact": "everyone", "users": 250}
    await asker.stop()
    await answerer.stop()


async def test_a_completion_of_a_request_that_is_not_open_reads_no_form() -> None:
    store = RecordReads()
    host = Host(store, agents=default_agents())
    await host.start()
    chat = await host.create_session(SESSION)
    await start_turn(host, chat)

    for n in range(3):
        with pytest.raises(ActionRejected) as rejected:
            await host.dispatch(
                chat, ChatInputCompleted(request_id=f"never-asked-{n}", response="cancel")
            )
        assert rejected.value.code == "no-open-input-request"

    assert [key for kind, key in store.reads if kind == "form"] == []
    await host.stop()


class GatedAppends(MemoryStore):
    """A memory store whose appends wait while ``gate`` is closed, as a
    network store's wait for their answer; ``waiting`` is set when one does."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = asyncio.Event()

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        self.waiting.set()
        await self.gate.wait()
        await super().append(channel, expected_seq, envelope, origin)


async def test_an_accept_is_checked_against_the_form_of_a_request_that_opened_while_it_waited() -> (
    None
):
    """The host reads a completion's form only when the request is open;
    one that opens between that look and the chat's lock (here: another
    process's, caught up on by the write ahead of it) is still checked."""
    store = GatedAppends()
    asker = Host(store, agents=default_agents(), idle_check_interval=0)
    answerer = Host(store, agents=default_agents(), idle_check_interval=0)
    await asker.start()
    await answerer.start()
    chat = await asker.create_session(SESSION)
    await answerer.core.subscribe(chat, Recorder())
    assert answerer.core._remove_listener is not None
    answerer.core._remove_listener()  # it hears no hints: its chat stays behind
    await start_turn(asker, chat)
    asking = asyncio.create_task(
        asker.request_input(chat, InputRequest(id="details"), schema=TICKET_FORM)
    )
    await wait_until_open(asker, chat, "details")
    store.gate.clear()
    store.waiting.clear()
    ahead = asyncio.create_task(answerer.dispatch(chat, ChatDraftChanged(draft=user_message("hi"))))
    await store.waiting.wait()  # `ahead` holds the chat's lock, its append waits
    behind = answerer.core.cached(chat)
    assert behind is not None
    assert isinstance(behind.state, ChatState)
    assert behind.state.active_turn is None  # the answerer has not seen the request
    accept = asyncio.create_task(
        answer_ticket_form(answerer, chat, "details", "lowercase-is-not-allowed")
    )
    store.gate.set()

    await ahead
    with pytest.raises(ActionRejected) as rejected:
        await accept
    assert rejected.value.code == "form-invalid"
    await answer_ticket_form(answerer, chat, "details", "SSO")
    async with asyncio.timeout(2 * UNIT):
        assert (await asking).data == {"system": "SSO", "impact": "everyone", "users": 250}
    await asker.stop()
    await answerer.stop()


async def test_an_append_whose_hint_was_lost_arrives_with_the_idle_check() -> None:
    store = MemoryStore()
    first = Host(store, agents=default_agents(), idle_check_interval=0)
    second = Host(store, agents=default_agents(), idle_check_interval=0)
    await first.start()
    await second.start()
    chat = await first.create_session(SESSION)
    watcher = Recorder()
    await second.core.subscribe(chat, watcher)
    assert second.core._remove_listener is not None
    second.core._remove_listener()  # from now on `second` hears no hints
    await start_turn(first, chat)
    assert watcher.seqs(chat) == []
    await second.core.check_heads()
    assert watcher.seqs(chat) == [(await first.view(chat)).seq]
    await first.stop()
    await second.stop()


async def test_news_in_a_chat_makes_its_session_unread_again(host: Host) -> None:
    chat = await host.create_session(SESSION)
    await host.dispatch(SESSION, SessionIsReadChanged(is_read=True))
    session = (await host.view(SESSION)).state
    assert isinstance(session, SessionState)
    assert session.status & SessionStatus.IS_READ
    await start_turn(host, chat)
    session = (await host.view(SESSION)).state
    assert isinstance(session, SessionState)
    assert not session.status & SessionStatus.IS_READ
