"""Submissions that count once: a submit re-sent after a drop (the socket
cut after the frame went out, before its echo came back) is applied once,
and the retry gets the first one's answer; over HTTP, Idempotency-Key."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
from starlette.responses import Response

from protocol.actions import (
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
)
from protocol.chat import ChatState, InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.codec import encode
from reducers.chat import select_input_settlement
from server.auth import Grant
from server.client import HuddleClient
from server.config import Settings
from server.edge.idempotency import Idempotency
from server.store.base import ChannelStore
from server.store.memory import MemoryStore
from server.store.redis import RedisStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    RunningServer,
    new_session_chat,
    session_chat_with_turn,
    start_server,
    user_message,
)
from tests.edge import CuttingProxy, Frame, HttpReply, Peer, http, plain_reconnect
from tests.redis_server import RedisServer, running_redis
from tests.test_serve_cli import TOKEN as SERVE_TOKEN
from tests.test_serve_cli import Served, start
from tests.test_trust import TURN

SESSION = "ahp-session:/once"
FORM = InputRequest(id="details", questions=[TextQuestion(id="system", message="Which?")])
ACCEPT = ChatInputCompleted(
    request_id="details",
    response="accept",
    answers={"system": InputAnswer(state="submitted", value=TextValue(value="SSO"))},
)


@pytest.fixture
async def proxy(huddle: RunningServer) -> AsyncIterator[CuttingProxy]:
    running = await CuttingProxy(huddle.port).start()
    try:
        yield running
    finally:
        await running.close()


async def asked(huddle: RunningServer) -> tuple[HuddleClient, str]:
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    await agent.dispatch_and_wait(chat, ChatInputRequested(request=FORM))
    return agent, chat


async def test_a_submit_cut_off_before_its_echo_counts_once(
    huddle: RunningServer, proxy: CuttingProxy
) -> None:
    agent, chat = await asked(huddle)
    completions: list[int] = []
    agent.mirrors[chat].listeners.append(
        lambda e: (
            completions.append(e.server_seq) if isinstance(e.action, ChatInputCompleted) else None
        )
    )
    lee = await HuddleClient.connect(proxy.url(), huddle.token(name="Lee"))
    await lee.subscribe(chat)

    proxy.cut_after_next_send()
    async with asyncio.timeout(10 * UNIT):
        envelope = await lee.dispatch_and_wait(chat, ACCEPT)

    assert proxy.cuts == 1
    assert lee.reconnects == 1
    assert envelope.rejection_reason is None
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    settled = select_input_settlement(state, "details")
    assert settled.status == "resolved"
    assert settled.part is not None
    assert settled.part.response == "accept"
    async with asyncio.timeout(5 * UNIT):
        await agent.mirrors[chat].wait_for(lambda _: bool(completions))
    assert completions == [envelope.server_seq]  # applied once, and this is it
    await lee.close()


async def test_a_retry_with_the_same_idempotency_key_applies_nothing_twice(
    huddle: RunningServer,
) -> None:
    _, chat = await asked(huddle)
    body = encode({"channel": chat, "action": ACCEPT})
    key = {"Idempotency-Key": "submit-7f3a", "Content-Type": "application/json"}
    url = huddle.http + "/api/dispatch"

    first = await http("POST", url, token=AGENT_TOKEN, data=body, headers=key)
    again = await http("POST", url, token=AGENT_TOKEN, data=body, headers=key)
    other = await http(
        "POST", url, token=AGENT_TOKEN, data=body, headers={**key, "Idempotency-Key": "new"}
    )

    assert first.status == again.status == 200
    assert first.json() == again.json()
    assert other.status == 409  # without the key's protection: completed already
    assert other.json()["code"] == "no-open-input-request"


async def test_an_idempotency_key_goes_with_its_body(huddle: RunningServer) -> None:
    _, chat = await asked(huddle)
    key = {"Idempotency-Key": "k-1", "Content-Type": "application/json"}
    url = huddle.http + "/api/dispatch"
    first = await http(
        "POST",
        url,
        token=AGENT_TOKEN,
        data=encode({"channel": chat, "action": ACCEPT}),
        headers=key,
    )
    changed = ChatInputCompleted(request_id="details", response="decline")

    reply = await http(
        "POST",
        url,
        token=AGENT_TOKEN,
        data=encode({"channel": chat, "action": changed}),
        headers=key,
    )

    assert first.status == 200
    assert reply.status == 422


async def test_a_rejection_is_kept_for_its_key_too(huddle: RunningServer) -> None:
    _, chat = await asked(huddle)
    bad = ChatInputCompleted(request_id="no-such-request", response="accept")
    body = encode({"channel": chat, "action": bad})
    key = {"Idempotency-Key": "k-2", "Content-Type": "application/json"}
    url = huddle.http + "/api/dispatch"

    first = await http("POST", url, token=AGENT_TOKEN, data=body, headers=key)
    again = await http("POST", url, token=AGENT_TOKEN, data=body, headers=key)

    assert first.status == again.status == 409
    assert first.json() == again.json()


async def test_a_submit_cut_off_before_the_server_saw_it_is_sent_again(
    huddle: RunningServer, proxy: CuttingProxy
) -> None:
    _, chat = await asked(huddle)
    lee = await HuddleClient.connect(proxy.url(), huddle.token(name="Lee"))
    await lee.subscribe(chat)

    proxy.cut_at_next_send()
    async with asyncio.timeout(10 * UNIT):
        envelope = await lee.dispatch_and_wait(chat, ACCEPT)

    assert proxy.cuts == 1
    assert envelope.rejection_reason is None  # not lost: applied on the new connection
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert select_input_settlement(state, "details").status == "resolved"
    await lee.close()


def again(channel: str, client_seq: int, action: object) -> dict[str, object]:
    """The dispatchAction frame a client sends again after a reconnect."""
    params = {"channel": channel, "clientSeq": client_seq, "action": action}
    return {"jsonrpc": "2.0", "method": "dispatchAction", "params": params}


DRAFT = ChatInputAnswerChanged(
    request_id="details",
    question_id="system",
    answer=InputAnswer(state="draft", value=TextValue(value="SS")),
)


@pytest.mark.parametrize("action", [ACCEPT, DRAFT], ids=["invalid-twice", "valid-twice"])
async def test_the_same_client_seq_again_gets_the_first_envelope(
    huddle: RunningServer, action: object
) -> None:
    agent, chat = await asked(huddle)
    seen: list[int] = []
    agent.mirrors[chat].listeners.append(lambda e: seen.append(e.server_seq))
    first, echo = await sent_across_a_reconnect(huddle, chat, action)
    await agent.dispatch_and_wait(chat, ChatDraftChanged(draft=None))  # a marker after it

    assert echo == first
    assert "rejectionReason" not in echo
    assert seen == [first["serverSeq"], seen[-1]]  # the others saw it once


async def test_a_turn_start_sent_again_after_a_drop_gets_the_first_envelope(
    huddle: RunningServer,
) -> None:
    # Each turn start a person's token sends is stamped anew (a random
    # _meta.huddle.turn), so the copy re-sent after a reconnect differs from
    # the one the log holds under its (clientId, clientSeq): it was refused
    # as "client-seq-reused" instead of answered with the first envelope.
    agent: HuddleClient = await huddle.client("agent", name="agent")
    chat = await new_session_chat(agent, "ahp-session:/stamped-again")

    first, echo = await sent_across_a_reconnect(huddle, chat, TURN)

    assert "rejectionReason" not in first
    assert echo == first


async def sent_across_a_reconnect(
    huddle: RunningServer, chat: str, action: object
) -> tuple[Frame, Frame]:
    """A person's browser sends ``action`` as clientSeq 1, drops before
    anything else, reconnects and sends it again: both envelopes it gets."""
    token = huddle.token(name="Lee")
    first_peer = await Peer.ready(huddle.ws, token, "lee-browser")
    await first_peer.subscribe(chat)
    await first_peer.send(again(chat, 1, action))
    first = await first_peer.envelope()
    await first_peer.close()
    peer = await Peer.ready(huddle.ws, token, "lee-browser")  # its reconnect
    await peer.subscribe(chat)
    await peer.send(again(chat, 1, action))
    echo = await peer.envelope()
    await peer.close()
    return first, echo


async def test_a_plain_client_sending_a_seq_again_is_told_it_was_applied(
    huddle: RunningServer,
) -> None:
    _, chat = await asked(huddle)
    token = huddle.token(name="Lee")
    peer = await Peer.ready(huddle.ws, token, "plain-browser", extensions=())
    await peer.subscribe(chat)
    await peer.send(again(chat, 1, DRAFT))
    first = await peer.envelope()
    await peer.send(again(chat, 1, DRAFT))
    echo = await peer.envelope()

    assert "rejectionReason" not in first
    assert echo["rejectionReason"].startswith("duplicate: clientSeq 1 was applied already")
    assert echo["origin"] == {"clientId": "plain-browser", "clientSeq": 1}
    await peer.close()


async def test_an_answer_that_says_try_again_is_not_kept_for_its_key() -> None:
    once = Idempotency(MemoryStore(), ttl=60)
    grant = Grant(role="participant", sessions=None, name="Lee", token_id="tok-1")
    answers = iter([Response(b"{}", 503), Response(b'{"ok":1}', 200)])
    runs: list[int] = []

    async def run() -> Response:
        runs.append(1)
        return next(answers)

    busy = await once.once(grant, "k", b"body", run)
    retried = await once.once(grant, "k", b"body", run)
    kept = await once.once(grant, "k", b"body", run)

    assert (busy.status_code, retried.status_code, kept.status_code) == (503, 200, 200)
    assert kept.body == b'{"ok":1}'
    assert len(runs) == 2
    refused = await once.once(grant, "", b"body", run)
    assert refused.status_code == 400


async def test_a_tokens_kept_answers_are_bounded_and_a_refused_key_runs_nothing() -> None:
    # The counts are the store's, on its clock: a token's is reset a ttl
    # after its first booking.
    once = Idempotency(MemoryStore(), ttl=60, budget=9000)
    lee = Grant(role="participant", sessions=None, name="Lee", token_id="tok-1")
    dana = Grant(role="participant", sessions=None, name="Dana", token_id="tok-2")
    agent = Grant(role="agent", sessions=None, name="agent", token_id="agent")
    runs: list[str] = []

    def running(who: str) -> Callable[[], Awaitable[Response]]:
        async def run() -> Response:
            runs.append(who)
            return Response(b"x" * 4000, 200)

        return run

    first = await once.once(lee, "k1", b"a", running("lee"))  # kept until 60
    second = await once.once(lee, "k2", b"b", running("lee"))  # each keeps about 4 KiB
    refused = await once.once(lee, "k3", b"c", running("lee"))  # a third would be over 9,000
    others = await once.once(dana, "k3", b"c", running("dana"))  # another token's own
    trusted = [await once.once(agent, f"a{n}", b"d", running("agent")) for n in range(3)]
    again = await once.once(lee, "k1", b"a", running("lee"))  # a retry of a kept one

    assert [first.status_code, second.status_code, refused.status_code] == [200, 200, 429]
    assert b"retry later, or without a key" in bytes(refused.body)
    assert 0 < int(refused.headers["Retry-After"]) <= 60  # when the count is reset
    assert others.status_code == again.status_code == 200
    assert [t.status_code for t in trusted] == [200, 200, 200]
    assert runs == ["lee", "lee", "dana", "agent", "agent", "agent"]


async def test_an_answer_kept_by_an_earlier_version_as_json_is_still_given() -> None:
    store = MemoryStore()
    once = Idempotency(store, ttl=60)
    grant = Grant(role="participant", sessions=None, name="Lee", token_id="tok-1")
    fingerprint = hashlib.sha256(b"body").hexdigest()
    old = msgspec.json.encode({"fingerprint": fingerprint, "status": 200, "body": b'{"ok":1}'})
    await store.remember("idempotency:tok-1:k", old, 60)

    async def run() -> Response:
        raise AssertionError("kept: nothing runs again")

    kept = await once.once(grant, "k", b"body", run)

    assert (kept.status_code, bytes(kept.body)) == (200, b'{"ok":1}')


@pytest.mark.parametrize("status", [409, 503], ids=["kept-small", "not-kept"])
async def test_a_small_answer_to_a_large_body_gives_the_rest_of_its_room_back(
    status: int,
) -> None:
    # Room for an answer as large as the body is booked before the run; a
    # rejection kept, or an answer not kept at all, gives back what it
    # does not take: ten bodies of half the budget each all run.
    once = Idempotency(MemoryStore(), ttl=60, budget=20_000)
    lee = Grant(role="participant", sessions=None, name="Lee", token_id="tok-1")
    runs: list[int] = []

    async def run() -> Response:
        runs.append(1)
        return Response(b'{"code":"no"}', status)

    answers = [await once.once(lee, f"k{n}", b"p" * 10_000, run) for n in range(10)]

    assert [a.status_code for a in answers] == [status] * 10
    assert len(runs) == 10


async def test_a_bounded_store_is_never_asked_to_forget_and_keeps_agents_a_reserve() -> None:
    # Beyond what the store keeps, it would forget the oldest answers and
    # their retries would run again: nobody gets more room. Of that room
    # people together get half; the rest only agents' answers take.
    store = MemoryStore()
    store.remember_limit = 12_000
    once = Idempotency(store, ttl=60, pool=1 << 20)  # no token's part is full first
    lee, dana = (
        Grant(role="participant", sessions=None, name=name, token_id=f"tok-{name}")
        for name in ("lee", "dana")
    )
    agent = Grant(role="agent", sessions=None, name="agent", token_id="agent")
    runs: list[str] = []

    async def run() -> Response:
        runs.append("ran")
        return Response(b"x" * 3000, 200)  # each keeps about 3 KiB

    people = [await once.once(grant, "k", b"body", run) for grant in (lee, dana)]
    agents = [await once.once(agent, f"k{n}", b"body", run) for n in range(3)]
    first_again = await once.once(lee, "k", b"body", run)

    assert [a.status_code for a in people] == [200, 429]
    assert b"answers of participants" in bytes(people[1].body)
    assert [a.status_code for a in agents] == [200, 200, 429]
    assert b"keeps no more" in bytes(agents[2].body)
    # Room comes back as the oldest answers expire, a ttl after they were kept.
    assert people[1].headers["Retry-After"] == agents[2].headers["Retry-After"] == "60"
    assert first_again.status_code == 200  # still kept: nothing was forgotten
    assert len(runs) == 3


@pytest.mark.parametrize("back_by", ["initialize", "reconnect"])
async def test_a_plain_client_numbering_its_next_connection_from_1_has_its_actions_applied(
    huddle: RunningServer, back_by: str
) -> None:
    # AHP numbers clientSeq per connection, and its own TypeScript client
    # keeps its clientId across a reconnect: the new connection's first
    # action was refused as client-seq-reused (or, were it the same action,
    # taken for applied), for as long as the log held the old one.
    _, chat = await asked(huddle)
    token = huddle.token(name="Lee")
    peer = await Peer.ready(huddle.ws, token, "plain-browser", extensions=())
    await peer.subscribe(chat)
    await peer.send(again(chat, 1, DRAFT))
    first = await peer.envelope()
    await peer.close()
    if back_by == "initialize":
        peer = await Peer.ready(huddle.ws, token, "plain-browser", extensions=())
        await peer.subscribe(chat)
    else:
        peer = await Peer.open(huddle.ws, token, "plain-browser")
        reply = await peer.request("reconnect", plain_reconnect("plain-browser", [chat]))
        assert "result" in reply, reply
    await peer.send(again(chat, 1, DRAFT))  # the same action, numbered anew
    second = await peer.envelope()
    await peer.send(again(chat, 2, ACCEPT))
    accepted = await peer.envelope()

    assert "rejectionReason" not in first
    assert "rejectionReason" not in second
    assert "rejectionReason" not in accepted
    assert second["origin"] == {"clientId": "plain-browser", "clientSeq": 1}
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert select_input_settlement(state, "details").status == "resolved"
    await peer.close()


@pytest.mark.parametrize("extensions", [None, ()], ids=["huddle", "plain"])
async def test_a_client_seq_used_again_for_another_action_is_refused_not_taken_for_applied(
    huddle: RunningServer, extensions: tuple[str, ...] | None
) -> None:
    _, chat = await asked(huddle)
    token = huddle.token(name="Lee")
    options = {} if extensions is None else {"extensions": extensions}
    peer = await Peer.ready(huddle.ws, token, "lee-browser", **options)
    await peer.subscribe(chat)
    await peer.send(again(chat, 1, DRAFT))
    first = await peer.envelope()
    await peer.send(again(chat, 1, ACCEPT))  # another action, the same clientSeq
    echo = await peer.envelope()

    assert "rejectionReason" not in first
    assert echo["rejectionReason"].startswith("client-seq-reused: clientSeq 1 was used already")
    assert echo["action"]["type"] == "chat/inputCompleted"  # its own action comes back refused
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert select_input_settlement(state, "details").status == "open"  # the accept did nothing
    await peer.close()


async def test_a_client_seq_used_again_for_another_action_is_refused_after_its_log_is_trimmed() -> (
    None
):
    store = MemoryStore(retention_bytes=1)  # nothing kept beyond a snapshot
    huddle = await start_server(Settings(port=0), store)
    try:
        _, chat = await asked(huddle)
        peer = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee-browser")
        await peer.subscribe(chat)
        await peer.send(again(chat, 1, DRAFT))
        first = await peer.envelope()
        view = await huddle.server.parts.host.view(chat)
        await store.save_snapshot(chat, view.seq, encode(view.state))
        assert await store.read_log(chat, view.seq - 1, (await store.load(chat)).epoch) is None
        await peer.send(again(chat, 1, ACCEPT))  # another action, the same clientSeq
        echo = await peer.envelope()
        state = (await huddle.server.parts.host.view(chat)).state
        await peer.close()
    finally:
        await huddle.stop()

    assert "rejectionReason" not in first
    assert echo["rejectionReason"].startswith("client-seq-reused: clientSeq 1 was used already")
    assert isinstance(state, ChatState)
    assert select_input_settlement(state, "details").status == "open"


async def test_a_client_id_used_again_by_a_new_process_numbers_on_and_is_not_refused(
    huddle: RunningServer,
) -> None:
    _, chat = await asked(huddle)
    token = huddle.token(name="Lee")
    first = await HuddleClient.connect(huddle.ws, token, client_id="lee-agent")
    await first.dispatch_and_wait(chat, DRAFT)
    await first.close()

    again = await HuddleClient.connect(huddle.ws, token, client_id="lee-agent")  # restarted
    envelope = await again.dispatch_and_wait(chat, ACCEPT)

    assert envelope.rejection_reason is None
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert select_input_settlement(state, "details").status == "resolved"
    await again.close()


# ─── Room for kept answers, over real servers ────────────────────────────────


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def keeping(request: pytest.FixtureRequest) -> AsyncIterator[RunningServer]:
    """A server whose tokens may each keep 1 MiB of answers and whose memory
    store (not Redis, which bounds nothing itself) keeps 2 MiB at most."""
    async with contextlib.AsyncExitStack() as stack:
        store: ChannelStore
        if request.param == "memory":
            store = MemoryStore()
            store.remember_limit = 2 << 20
        else:
            redis = await stack.enter_async_context(running_redis(10 * UNIT))
            store = RedisStore(redis.url)
        running = await start_server(store=store)
        running.server.idempotency.budget = 1 << 20
        running.server.idempotency.pool = 16 << 20  # a token's part: 1 MiB
        try:
            yield running
        finally:
            await running.stop()


async def keyed(running: RunningServer, token: str, key: str, body: dict[str, Any]) -> HttpReply:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    url = running.http + "/api/dispatch"
    return await http("POST", url, token=token, data=encode(body), headers=headers)


async def test_rejected_requests_with_large_bodies_keep_only_their_small_answers(
    keeping: RunningServer,
) -> None:
    # Each body books 300 KB before it runs; its answer, a rejection, keeps
    # a few hundred bytes. Had the rest stayed booked, each token would be
    # out of room after three and the memory store after six.
    agent = await keeping.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    rejected = {
        "channel": chat,
        "action": ChatInputCompleted(request_id="nothing-asked", response="cancel"),
        "pad": "p" * 300_000,
    }
    mallories = [keeping.token(name=f"mallory-{n}") for n in range(2)]

    answers = [
        await keyed(keeping, token, f"k{n}", rejected) for token in mallories for n in range(6)
    ]
    again = await keyed(keeping, mallories[0], "k0", rejected)
    draft = {"channel": chat, "action": ChatDraftChanged(draft=user_message("hello"))}
    victim = await keyed(keeping, keeping.token(name="victim"), "mine", draft)
    trusted = await keyed(keeping, AGENT_TOKEN, "agents", draft)

    assert [a.status for a in answers] == [409] * 12
    assert (again.status, again.json()) == (409, answers[0].json())  # kept, and given again
    assert victim.status == trusted.status == 200


async def test_people_cannot_crowd_an_agent_out_of_a_bounded_store() -> None:
    store = MemoryStore()
    store.remember_limit = 2 << 20
    running = await start_server(store=store)
    running.server.idempotency.pool = 64 << 20  # no token's part is full before the store's
    try:
        agent = await running.client("agent", name="agent")
        chat = await session_chat_with_turn(agent, SESSION, TURN)
        big = {"channel": chat, "action": ChatDraftChanged(draft=user_message("d" * 60_000))}
        mallories = [running.token(name=f"mallory-{n}") for n in range(2)]
        statuses: list[int] = []
        refusal = None
        for n in range(100):  # 60 KB answers kept: people's half is full after about 17
            reply = await keyed(running, mallories[n % 2], f"k{n}", big)
            statuses.append(reply.status)
            if reply.status == 429:
                refusal = reply.json()["error"]
                break

        trusted = await keyed(running, AGENT_TOKEN, "agents", big)

        assert set(statuses[:-1]) == {200}
        assert refusal is not None
        assert "answers of participants" in refusal
        assert trusted.status == 200
    finally:
        await running.stop()


# ─── One token, one session: a part of the pool, counted in the store ───────

OTHER = "ahp-session:/once-other"


async def filled_by_one_token(running: RunningServer, token: str, chat: str) -> list[int]:
    """``token``'s keyed drafts until it is refused: their statuses."""
    draft = {"channel": chat, "action": ChatDraftChanged(draft=user_message("d" * 20_000))}
    statuses: list[int] = []
    for n in range(100):
        statuses.append((await keyed(running, token, f"k{n}", draft)).status)
        if statuses[-1] == 429:
            break
    return statuses


@pytest.fixture
async def two_sessions() -> AsyncIterator[tuple[RunningServer, str, str]]:
    """A server keeping 2 MiB at most (people's pool 1 MiB: a token's part
    64 KiB, a session's 256 KiB) and a chat in each of two sessions."""
    store = MemoryStore()
    store.remember_limit = 2 << 20
    running = await start_server(store=store)
    try:
        agent = await running.client("agent", name="agent")
        chat = await session_chat_with_turn(agent, SESSION, TURN)
        other = await session_chat_with_turn(agent, OTHER, TURN)
        yield running, chat, other
    finally:
        await running.stop()


@pytest.mark.parametrize("same_session", [False, True], ids=["another session", "same session"])
async def test_a_token_that_fills_its_part_leaves_another_token_room(
    two_sessions: tuple[RunningServer, str, str], same_session: bool
) -> None:
    running, chat, other = two_sessions
    mallory = running.token(sessions=[SESSION], name="mallory")

    statuses = await filled_by_one_token(running, mallory, chat)
    where, session = (chat, SESSION) if same_session else (other, OTHER)
    # As large as each of mallory's: refused if mallory had taken the pool.
    draft = {"channel": where, "action": ChatDraftChanged(draft=user_message("m" * 20_000))}
    victim = await keyed(running, running.token(sessions=[session], name="v"), "mine", draft)

    assert victim.status == 200
    assert statuses[-1] == 429
    assert len(statuses) <= 4  # its part (64 KiB), not people's pool (1 MiB)


async def test_a_sessions_tokens_together_take_only_their_part(
    two_sessions: tuple[RunningServer, str, str],
) -> None:
    running, chat, other = two_sessions
    refused: list[str] = []
    for n in range(40):  # a session's part is 256 KiB: full after a few tokens' two
        token = running.token(sessions=[SESSION], name=f"mallory-{n}")
        draft = {"channel": chat, "action": ChatDraftChanged(draft=user_message("d" * 20_000))}
        first = await keyed(running, token, "k", draft)
        if first.status == 429:
            refused.append(first.json()["error"])
            break
        await keyed(running, token, "k2", draft)
    draft = {"channel": other, "action": ChatDraftChanged(draft=user_message("mine"))}
    victim = await keyed(running, running.token(sessions=[OTHER], name="v"), "mine", draft)

    assert refused
    assert "this session's tokens" in refused[0]
    assert victim.status == 200


async def served_post(served: Served, path: str, token: str, body: Any, key: str = "") -> HttpReply:
    headers = {"Idempotency-Key": key} if key else {}
    url = f"http://127.0.0.1:{served.port}{path}"
    return await http("POST", url, token=token, data=encode(body), headers=headers)


@pytest.fixture
async def two_processes(redis_server: RedisServer) -> AsyncIterator[tuple[Served, Served]]:
    """Two ``huddle serve`` processes on one Redis; people's pool 1 MiB, so
    a token's part is 64 KiB."""
    env = {
        "HUDDLE_TOKEN": SERVE_TOKEN,
        "HUDDLE_STORE": redis_server.url,
        "HUDDLE_AGENT": "none",
        "HUDDLE_IDEMPOTENCY_POOL": str(1 << 20),
    }
    servers = (await start(env=env), await start(env=env))
    try:
        yield servers
    finally:
        for served in servers:
            if served.process.returncode is None:
                served.process.kill()
                await served.process.wait()


@pytest.mark.redis
async def test_a_tokens_part_is_counted_across_two_processes_on_one_redis(
    two_processes: tuple[Served, Served],
) -> None:
    one, two = two_processes
    chats: list[str] = []
    tokens: list[str] = []
    sessions: list[str] = []
    for name in ("a", "b"):
        created = await served_post(one, "/api/sessions", SERVE_TOKEN, {"id": name})
        chats.append(created.json()["chat"])
        sessions.append(created.json()["session"])
        minted = await served_post(
            one,
            "/api/tokens",
            SERVE_TOKEN,
            {"role": "participant", "sessions": [created.json()["session"]]},
        )
        tokens.append(minted.json()["token"])
    big = {"channel": chats[0], "action": ChatDraftChanged(draft=user_message("d" * 20_000))}

    on_one = [
        (await served_post(one, "/api/dispatch", tokens[0], big, f"k{n}")).status for n in range(3)
    ]
    on_two = await served_post(two, "/api/dispatch", tokens[0], big, "k3")
    neighbour = await served_post(
        one, "/api/tokens", SERVE_TOKEN, {"role": "participant", "sessions": sessions[:1]}
    )
    victims = [
        await served_post(two, "/api/dispatch", token, {**big, "channel": chat}, "mine")
        for token, chat in ((tokens[1], chats[1]), (neighbour.json()["token"], chats[0]))
    ]

    assert on_one == [200, 200, 200]  # about 60 KiB of 64 KiB
    assert on_two.status == 429  # the three kept by the first process count
    assert "this token has" in on_two.json()["error"]
    assert [v.status for v in victims] == [200, 200]  # another session's token, then its own
