"""Waits that expire: each policy for a question and a tool approval, a
late answer refused with ``expired``, the expiry kept across a restart and
fired once by two processes on one Redis, and the wire's ways to set one.

Time is the hosts' own clock, moved by the tests; sweeps are called, not
waited for (but where a test says it runs on the sweeper)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnStarted,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    TextQuestion,
    TextValue,
    ToolCallCancelled,
)
from protocol.session import SessionState
from reducers import notes
from reducers.chat import select_input_settlement, select_tool_call
from server.auth import Identity
from server.build import default_agents
from server.config import Settings
from server.core.expiry import EXPIRY_RECORDS, Expiry
from server.core.host import Host
from server.core.policy import stamped
from server.errors import ActionRejected, InputAbandoned
from server.store.memory import MemoryStore
from server.store.redis import RedisStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    UNSWEPT,
    RunningServer,
    WallClock,
    clocked_server,
    session_chat_with_turn,
    start_server,
)
from tests.edge import Peer, http, initialize_params
from tests.redis_server import RedisServer
from tests.test_trust import TURN

SESSION = "ahp-session:/expiring"
REQUEST = InputRequest(id="details", questions=[TextQuestion(id="system", message="Which?")])
DANA = Identity(role="participant", name="Dana", token="t-dana")
AGENT = Identity(role="agent", name="agent", token="t-agent")


@pytest.fixture
async def huddle(clock: WallClock) -> AsyncIterator[RunningServer]:
    async with clocked_server(clock) as running:
        yield running


async def chat_with_turn(huddle: RunningServer) -> str:
    agent = await huddle.client("agent", name="agent")
    return await session_chat_with_turn(agent, SESSION, TURN)


async def asked(huddle: RunningServer, expiry: Expiry) -> tuple[str, asyncio.Task[Any]]:
    chat = await chat_with_turn(huddle)
    host = huddle.server.parts.host
    waiter = await host.waiters.expect_input(chat, REQUEST.id, TURN.turn_id)
    await host.ask(chat, REQUEST, expiry=expiry)
    return chat, asyncio.create_task(host.waiters.input_outcome(waiter))


async def chat_state(huddle: RunningServer, chat: str) -> ChatState:
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    return state


async def note(huddle: RunningServer, chat: str, family: str, key: str) -> dict[str, Any]:
    state = (await huddle.server.parts.host.view(SESSION)).state
    assert isinstance(state, SessionState)
    found = notes.note_of(state.meta, family, chat, key)
    assert found is not None
    return found


def answer(value: str) -> ChatInputAnswerChanged:
    return ChatInputAnswerChanged(
        request_id="details",
        question_id="system",
        answer=InputAnswer(state="draft", value=TextValue(value=value)),
    )


def submitted(value: str) -> ChatInputCompleted:
    """The question answered with ``value`` and submitted."""
    return ChatInputCompleted(
        request_id="details",
        response="accept",
        answers={"system": InputAnswer(state="submitted", value=TextValue(value=value))},
    )


# ─── Input requests ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("policy", ["cancel", "decline"])
async def test_a_question_nobody_answers_is_withdrawn_or_declined_once_its_time_is_up(
    huddle: RunningServer, clock: WallClock, policy: str
) -> None:
    chat, waiting = await asked(huddle, Expiry(60, policy))  # type: ignore[arg-type]
    noted = await note(huddle, chat, "requests", "details")
    assert noted["expiresAt"] == int(clock.now * 1000) + 60_000
    assert noted["onExpiry"] == policy

    assert await huddle.server.parts.host.expiries.sweep() == 0  # not due yet
    clock.now += 61
    assert await huddle.server.parts.host.expiries.sweep() == 1
    async with asyncio.timeout(5 * UNIT):
        outcome = await waiting

    assert outcome.response == policy
    settled = select_input_settlement(await chat_state(huddle, chat), "details")
    assert settled.status == "resolved"
    assert (await chat_state(huddle, chat)).active_turn is not None  # the turn goes on
    assert (await note(huddle, chat, "requests", "details"))["expired"] is True
    assert await huddle.server.parts.store.records(EXPIRY_RECORDS) == {}
    assert await huddle.server.parts.host.expiries.sweep() == 0  # once


async def test_a_question_with_fail_ends_its_turn_with_a_clear_error(
    huddle: RunningServer, clock: WallClock
) -> None:
    chat, waiting = await asked(huddle, Expiry(5, "fail"))
    clock.now += 5

    await huddle.server.parts.host.expiries.sweep()

    with pytest.raises(InputAbandoned, match="Nobody answered the input request 'details' in time"):
        async with asyncio.timeout(5 * UNIT):
            await waiting
    state = await chat_state(huddle, chat)
    assert state.active_turn is None
    assert state.turns[-1].state == "error"
    assert state.turns[-1].error is not None
    assert state.turns[-1].error.error_type == "expired"


async def test_a_late_answer_is_refused_as_expired_before_and_after_the_sweep(
    huddle: RunningServer, clock: WallClock
) -> None:
    chat, waiting = await asked(huddle, Expiry(30))
    lee = await huddle.client(name="Lee")
    await lee.dispatch_and_wait(chat, answer("S"))  # in time
    clock.now += 30

    with pytest.raises(ActionRejected, match="expired") as before:
        await lee.dispatch_and_wait(chat, answer("SS"))
    with pytest.raises(ActionRejected, match="expired") as extended:  # too late to extend
        await huddle.server.parts.host.expire(chat, "requests", "details", Expiry(60))
    await huddle.server.parts.host.expiries.sweep()
    with pytest.raises(ActionRejected) as after:
        await lee.dispatch_and_wait(
            chat, ChatInputCompleted(request_id="details", response="accept")
        )

    assert before.value.code == after.value.code == extended.value.code == "expired"
    assert "the input request 'details' expired at" in str(after.value)
    assert (await waiting).response == "cancel"


async def test_a_question_answered_in_time_is_left_alone(
    huddle: RunningServer, clock: WallClock
) -> None:
    chat, waiting = await asked(huddle, Expiry(30, "fail"))
    lee = await huddle.client(name="Lee")
    await lee.dispatch_and_wait(
        chat,
        submitted("SSO"),
    )
    clock.now += 31

    assert await huddle.server.parts.host.expiries.sweep() == 0
    assert (await waiting).response == "accept"
    assert await huddle.server.parts.store.records(EXPIRY_RECORDS) == {}  # the sweep tidied it
    assert (await chat_state(huddle, chat)).active_turn is not None


# ─── Tool approvals ──────────────────────────────────────────────────────────


async def ready_call(huddle: RunningServer, chat: str, expiry: Any) -> None:
    agent = huddle.clients[0]
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallStart(
            turn_id="t1", tool_call_id="deploy", tool_name="deploy", display_name="Deploy"
        ),
    )
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallReady(
            turn_id="t1",
            tool_call_id="deploy",
            invocation_message="Deploy to production",
            meta={"huddle": {"expiry": expiry}} if expiry else None,
        ),
    )


@pytest.mark.parametrize(("policy", "reason"), [("cancel", "skipped"), ("decline", "denied")])
async def test_a_tool_approval_nobody_gives_is_skipped_or_denied(
    huddle: RunningServer, clock: WallClock, policy: str, reason: str
) -> None:
    chat = await chat_with_turn(huddle)
    await ready_call(huddle, chat, {"seconds": 10, "onExpiry": policy})
    noted = await note(huddle, chat, "toolCalls", "deploy")
    assert noted["onExpiry"] == policy

    clock.now += 10
    await huddle.server.parts.host.expiries.sweep()

    call = select_tool_call(await chat_state(huddle, chat), "deploy")
    assert isinstance(call, ToolCallCancelled)
    assert call.reason == reason
    assert call.reason_message == "Nobody approved it in time."
    assert (await note(huddle, chat, "toolCalls", "deploy"))["expired"] is True
    assert (await chat_state(huddle, chat)).active_turn is not None


async def test_a_tool_approval_with_fail_ends_the_turn(
    huddle: RunningServer, clock: WallClock
) -> None:
    chat = await chat_with_turn(huddle)
    await ready_call(huddle, chat, {"seconds": 10, "onExpiry": "fail"})
    clock.now += 11

    await huddle.server.parts.host.expiries.sweep()

    state = await chat_state(huddle, chat)
    assert state.active_turn is None
    assert state.turns[-1].error is not None
    assert "tool call 'deploy'" in state.turns[-1].error.message


@pytest.mark.parametrize(
    "expiry",
    [{"seconds": -1}, {"seconds": "NaN"}, {"seconds": 1e300}, {"seconds": 5, "onExpiry": "x"}, 7],
    ids=["negative", "a-string", "too-long", "unknown-policy", "not-an-object"],
)
async def test_a_tool_calls_expiry_that_makes_no_sense_is_refused(
    huddle: RunningServer, expiry: Any
) -> None:
    # Its sender must not believe a deadline was set.
    chat = await chat_with_turn(huddle)

    with pytest.raises(ActionRejected, match=r"invalid-action: _meta.huddle.expiry: "):
        await ready_call(huddle, chat, expiry)

    assert await huddle.server.parts.store.records(EXPIRY_RECORDS) == {}


# ─── The wire ────────────────────────────────────────────────────────────────


async def test_a_remote_agent_sets_an_expiry_over_the_socket_and_the_sweeper_fires_it() -> None:
    running = await start_server(Settings(port=0, expiry_check_interval=0.02 * UNIT))
    try:
        agent = await running.client("agent", name="agent")
        await agent.create_session(SESSION)
        session = await agent.subscribe(SESSION)
        assert isinstance(session.state, SessionState)
        chat = session.state.default_chat
        assert chat is not None
        await agent.dispatch_and_wait(chat, TURN)

        async with asyncio.timeout(10 * UNIT):
            completion = await agent.request_input(
                chat, REQUEST, expires_in=0.1 * UNIT, on_expiry="decline"
            )
    finally:
        await running.stop()

    assert completion.response == "decline"


async def test_huddle_expire_is_an_extension_and_for_agents(huddle: RunningServer) -> None:
    chat = await chat_with_turn(huddle)
    await huddle.clients[0].dispatch_and_wait(chat, ChatInputRequested(request=REQUEST))
    params = {"channel": chat, "requestId": "details", "seconds": 60}

    plain = await Peer.ready(huddle.ws, AGENT_TOKEN, "plain", extensions=())
    unknown = await plain.request("huddle/expire", params)
    lee = await Peer.open(huddle.ws, huddle.token(name="Lee"), "lee")
    asked = initialize_params("lee", extensions=("huddle.expiry",))
    await lee.request("initialize", asked)
    refused = await lee.request("huddle/expire", params)
    agent = await Peer.open(huddle.ws, AGENT_TOKEN, "agent-2")
    await agent.request("initialize", initialize_params("agent-2", extensions=("huddle.expiry",)))
    done = await agent.request("huddle/expire", params)
    both = await agent.request("huddle/expire", {**params, "toolCallId": "x"})
    closed = await agent.request("huddle/expire", {**params, "requestId": "gone"})
    too_long = await agent.request("huddle/expire", {**params, "seconds": 10**9})

    assert unknown["error"]["code"] == -32601
    assert refused["error"]["code"] == -32009
    assert done["result"]["expiresAt"] > 0
    assert both["error"]["code"] == too_long["error"]["code"] == -32602
    assert closed["error"]["code"] == -32011
    assert "no open wait 'gone'" in closed["error"]["message"]
    for peer in (plain, lee, agent):
        await peer.close()


async def test_an_expiry_over_http(huddle: RunningServer) -> None:
    chat = await chat_with_turn(huddle)
    await huddle.clients[0].dispatch_and_wait(chat, ChatInputRequested(request=REQUEST))
    url = huddle.http + "/api/expiry"
    body = {"channel": chat, "requestId": "details", "seconds": 60, "onExpiry": "fail"}

    set_ = await http("POST", url, token=AGENT_TOKEN, body=body)
    by_a_person = await http("POST", url, token=huddle.token(name="Lee"), body=body)
    bad = await http("POST", url, token=AGENT_TOKEN, body={**body, "onExpiry": "later"})
    nowhere = await http("POST", url, token=AGENT_TOKEN, body={**body, "channel": "ahp-chat:/nope"})

    assert set_.status == 200
    assert (
        set_.json()["expiresAt"] == (await note(huddle, chat, "requests", "details"))["expiresAt"]
    )
    assert by_a_person.status == 403
    assert bad.status == 400
    assert nowhere.status == 404


def test_an_expiry_is_checked_when_made() -> None:
    assert Expiry.of({"seconds": 5}) == Expiry(5.0, "cancel")
    wrongs: list[object] = [
        [],
        {"seconds": "5"},
        {"seconds": True},
        {"seconds": 5, "onExpiry": "x"},
    ]
    for wrong in wrongs:
        with pytest.raises(ValueError, match=r"expiry|onExpiry"):
            Expiry.of(wrong)
    with pytest.raises(ValueError, match="onExpiry"):
        Expiry(5, "later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="above 0"):
        Expiry(0)


# ─── Restarts and processes ──────────────────────────────────────────────────


@pytest.mark.redis
async def test_an_expiry_survives_a_restart(redis_server: RedisServer, clock: WallClock) -> None:
    first = await start_server(UNSWEPT, RedisStore(redis_server.url), clock=clock)
    try:
        chat, waiting = await asked(first, Expiry(60))
    finally:
        await first.stop()
    with pytest.raises(InputAbandoned, match="stopping"):
        await waiting  # a stop leaves no one waiting
    clock.now += 120
    second = await start_server(UNSWEPT, RedisStore(redis_server.url), clock=clock)
    try:
        fired = await second.server.parts.host.expiries.sweep()
        state = await chat_state(second, chat)
    finally:
        await second.stop()

    assert fired == 1
    settled = select_input_settlement(state, "details")
    assert settled.part is not None
    assert settled.part.response == "cancel"


@pytest.mark.redis
async def test_two_processes_fire_an_expiry_once(
    redis_server: RedisServer, clock: WallClock
) -> None:
    a = await start_server(UNSWEPT, RedisStore(redis_server.url), clock=clock)
    b = await start_server(UNSWEPT, RedisStore(redis_server.url), clock=clock)
    try:
        chat, waiting = await asked(a, Expiry(60, "decline"))
        await b.server.parts.host.view(chat)
        clock.now += 61

        fired = await asyncio.gather(
            a.server.parts.host.expiries.sweep(), b.server.parts.host.expiries.sweep()
        )
        async with asyncio.timeout(5 * UNIT):
            outcome = await waiting
        entries = (await a.server.parts.store.load(chat)).log
    finally:
        await a.stop()
        await b.stop()

    assert sorted(fired) == [0, 1]
    assert outcome.response == "decline"
    assert entries is not None
    completions = [e for e in entries if b'"chat/inputCompleted"' in e]
    assert len(completions) == 1


# ─── A wait's id used again ──────────────────────────────────────────────────


class ExpiryPuts(MemoryStore):
    """A memory store that says when an expiry record is put."""

    def __init__(self) -> None:
        super().__init__()
        self.put = asyncio.Event()

    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        await super().put_record(kind, key, value)
        if kind == EXPIRY_RECORDS:
            self.put.set()


async def expiring_in_a_batch(host: Host, store: ExpiryPuts) -> tuple[str, asyncio.Task[int]]:
    """A chat whose turn (stamped ``aaaaaaaa``) asks a question that
    ``host`` is giving an expiry: its record is put, its note waits for
    the notes' interval (a draft was just noted)."""
    chat = await host.create_session(SESSION)
    await host.dispatch(chat, stamped_turn("aaaaaaaa"))
    await host.ask(chat, REQUEST)
    await host.dispatch(chat, answer("IAM"), sender=DANA)
    expiring = asyncio.create_task(host.expire(chat, "requests", "details", Expiry(60)))
    async with asyncio.timeout(2 * UNIT):
        await store.put.wait()  # then its note joins those waiting for the interval
    assert SESSION in host.notes._waiting
    return chat, expiring


def stamped_turn(stamp: str) -> ChatTurnStarted:
    """TURN as the server records it: its message stamped ``stamp``."""
    return replace(TURN, message=stamped(TURN.message, None, turn=stamp))


async def test_an_expiry_noted_late_for_a_truncated_wait_does_not_reach_its_successor(
    clock: WallClock,
) -> None:
    # Process A gives a question an expiry while its notes wait out their
    # interval; process B truncates the turn away meanwhile and forgets the
    # question's notes and expiry at once. A's note (and a record put after
    # B deleted it) then arrive late: the next turn, which asks a question of
    # the same id, must neither be refused as expired nor expire by it.
    store = ExpiryPuts()
    a = Host(store, agents=default_agents(), clock=clock, expiry_check_interval=3600.0)
    b = Host(store, agents=default_agents(), clock=clock, expiry_check_interval=3600.0)
    await a.start()
    await b.start()
    chat, expiring = await expiring_in_a_batch(a, store)
    records = await store.records(EXPIRY_RECORDS)
    await b.view(chat)
    await b.dispatch(chat, ChatTruncated(), sender=AGENT)
    async with asyncio.timeout(2 * UNIT):
        await expiring
    for name, raw in records.items():
        await store.put_record(EXPIRY_RECORDS, name, raw)

    await b.dispatch(chat, stamped_turn("bbbbbbbb"))
    await b.ask(chat, REQUEST)
    clock.now += 61
    fired = [await host.expiries.sweep() for host in (b, a)]  # B has the new turn
    await b.dispatch(
        chat,
        submitted("SSO"),
        sender=DANA,
    )
    state = (await b.view(chat)).state
    await a.stop()
    await b.stop()

    assert fired == [0, 0]
    assert isinstance(state, ChatState)
    settled = select_input_settlement(state, "details")
    assert settled.part is not None
    assert settled.part.response == "accept"
