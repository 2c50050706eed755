"""A session's audit shared out: one person (a token, a shared link's
browsers together) cannot fill its reserve to keep the others' decisions
out of it. Their decisions are refused once their share is used up, on
every process alike, and every decision accepted is on record."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatTurnStarted,
)
from protocol.chat import InputRequest
from protocol.codec import encode
from protocol.rejections import RejectionCode
from server.auth import TokenAuthority
from server.client import HuddleClient, Mirror
from server.config import Limits, Settings
from server.core.audit import CHARGED, export, verify
from server.errors import ActionRejected
from server.runner.demo import agent as demo
from tests.conftest import (
    AGENT_TOKEN,
    RunningServer,
    session_chat_with_turn,
    start_server,
    user_message,
    watched_chat,
)
from tests.edge import Frame, Peer, http
from tests.redis_server import RedisServer
from tests.test_audit import audit_of, exported_once_stopped, records, served_twice
from tests.test_once import again
from tests.test_runner_demo import TICKET_DETAILS, open_request, pending_call, wait
from tests.test_serve_cli import TOKEN, Served
from tests.test_trust import TURN

SESSION = "ahp-session:/shared-out"
MAX_RECORDS = 400
"""A reserve of 40 records, a person's share of it 4: two decisions."""
DECISIONS = MAX_RECORDS // 10 // 10 // CHARGED


def turn(n: int) -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id=f"m{n}",
        started_at="2026-12-01T10:00:00.000Z",
        message=user_message("Open a high-priority ticket: nobody can log in"),
    )


class Requests:
    """Requests to decline: one that ``ask`` opens (given a number, 0, 1,
    ...), asked anew once the one before was answered; one refused stays
    open for the next to answer."""

    def __init__(self, ask: Callable[[int], Awaitable[str]]) -> None:
        self.ask = ask
        self.asked = 0
        self.open: str | None = None

    async def next(self) -> str:
        if self.open is None:
            self.open = await self.ask(self.asked)
            self.asked += 1
        return self.open


async def decline_until_refused(
    client: HuddleClient, chat: str, requests: Requests, most: int
) -> tuple[int, ActionRejected | None]:
    """Decline the open request until one is refused (at most ``most``
    times): how many were accepted, and the refusal."""
    for accepted in range(most):
        request = await requests.next()
        try:
            await client.dispatch_and_wait(
                chat, ChatInputCompleted(request_id=request, response="decline")
            )
        except ActionRejected as refused:
            return accepted, refused
        requests.open = None
    return most, None


def demo_requests(client: HuddleClient, chat: str, mirror: Mirror) -> Requests:
    """The demo agent's form, asked in each turn ``client`` starts."""

    async def ask(n: int) -> str:
        await wait(mirror, lambda s: s.active_turn is None)
        await client.dispatch_and_wait(chat, turn(n))
        part = open_request(await wait(mirror, lambda s: open_request(s) is not None))
        assert part is not None
        return part.request.id

    return Requests(ask)


async def test_declining_the_demo_form_in_a_loop_is_refused_and_the_others_approval_lands() -> None:
    limits = Limits(action_burst=10_000, actions_per_second=10_000)
    huddle = await start_server(
        Settings(port=0, audit_max_records=MAX_RECORDS, limits=limits), agent=demo
    )
    try:
        mallory = await huddle.client(name="Mallory")
        chat, flooded = await watched_chat(mallory, SESSION)
        accepted, refused = await decline_until_refused(
            mallory, chat, demo_requests(mallory, chat, flooded), 100
        )
        # Alice answers the form Mallory could not decline (one of her own
        # where every decline was taken), and approves.
        alice = await huddle.client(name="Alice")
        seen = await alice.subscribe(chat)
        state = await wait(seen, lambda s: s.active_turn is None or open_request(s) is not None)
        if state.active_turn is None:
            await alice.dispatch_and_wait(chat, replace(turn(0), turn_id="a1"))
        state = await wait(seen, lambda s: open_request(s) is not None)
        assert state.active_turn is not None
        part = open_request(state)
        assert part is not None
        await alice.dispatch_and_wait(
            chat,
            ChatInputCompleted(
                request_id=part.request.id,
                response="accept",
                answers=TICKET_DETAILS,
            ),
        )
        call = pending_call(await wait(seen, lambda s: pending_call(s) is not None))
        assert call is not None
        await alice.dispatch_and_wait(
            chat,
            ChatToolCallConfirmed(
                turn_id=state.active_turn.id,
                tool_call_id=call.tool_call_id,
                approved=True,
                confirmed="user-action",
            ),
        )
        await wait(seen, lambda s: s.active_turn is None)
        lines = await audit_of(huddle, AGENT_TOKEN, SESSION)
    finally:
        await huddle.stop()

    kept = records(lines)
    whats = [(r["what"], r["who"].get("name")) for r in kept]
    assert ("chat/toolCallConfirmed", "Alice") in whats
    assert refused is not None, "the flood was never refused"
    assert refused.code == RejectionCode.AUDIT_SHARE_USED
    assert "share" in refused.sentence
    assert accepted == DECISIONS
    assert verify(lines).records == len(kept)
    assert whats.count(("chat/inputCompleted", "Mallory")) == DECISIONS
    # Alice's decisions are on record, and so is the tool they let run.
    assert ("chat/inputCompleted", "Alice") in whats
    approved = whats.index(("chat/toolCallConfirmed", "Alice"))
    after = kept[approved:]
    assert [r["resume"]["command"] for r in after if r["what"] == "runner/resumed"] == [
        "TOOL_APPROVAL"
    ]
    assert any(r["what"] == "chat/toolCallComplete" for r in after)
    assert kept[-1]["what"] == "chat/turnComplete"
    assert "audit/full" not in {r["what"] for r in kept}


def agent_requests(agent: HuddleClient, chat: str, mirror: Mirror) -> Requests:
    """Requests the agent opens in its turn."""

    async def ask(n: int) -> str:
        request = InputRequest(id=f"r{n}", message="Go on?")
        await agent.dispatch_and_wait(chat, ChatInputRequested(request=request))
        await wait(mirror, lambda s: _open_id(s) == request.id)
        return request.id

    return Requests(ask)


def _open_id(state: object) -> str | None:
    part = open_request(state)
    return None if part is None else part.request.id


async def test_a_shared_links_browsers_spend_one_share() -> None:
    huddle = await start_server(Settings(port=0, audit_max_records=MAX_RECORDS))
    try:
        agent = await huddle.client("agent", name="agent")
        chat = await session_chat_with_turn(agent, SESSION, TURN)
        expires = time.time() + 600
        link = huddle.authority.mint("participant", expires_at=expires, shared=True)
        link_id = huddle.authority.verify(link, 0).token_id
        first, second = [
            await HuddleClient.connect(
                huddle.ws,
                huddle.authority.mint("participant", expires_at=expires, shared=True, link=link_id),
            )
            for _ in range(2)
        ]
        alice = await huddle.client(name="Alice")
        opened = agent_requests(agent, chat, await alice.subscribe(chat))
        accepted, _ = await decline_until_refused(first, chat, opened, DECISIONS)
        # The link's other browser (its own token id) finds the link's share used.
        _, refused = await decline_until_refused(second, chat, opened, 1)
        # Alice's own is whole.
        alice_accepted, alice_refused = await decline_until_refused(alice, chat, opened, 1)
        for client in (first, second):
            await client.close()
    finally:
        await huddle.stop()

    assert accepted == DECISIONS
    assert refused is not None
    assert refused.code == RejectionCode.AUDIT_SHARE_USED
    assert (alice_accepted, alice_refused) == (1, None)


async def test_a_decision_sent_again_after_it_took_the_last_of_the_share_is_applied_once(
    huddle: RunningServer,
) -> None:
    huddle.server.parts.host.audit.max_records = MAX_RECORDS
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    requests = agent_requests(agent, chat, agent.mirrors[chat])
    peer = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee-browser")
    await peer.subscribe(chat)
    echoes, sent = [], {}
    for client_seq in (*range(1, DECISIONS + 1), DECISIONS, DECISIONS + 1):
        if client_seq not in sent:
            sent[client_seq] = ChatInputCompleted(
                request_id=await requests.next(), response="decline"
            )
        await peer.send(again(chat, client_seq, sent[client_seq]))
        echo = await echo_of(peer, client_seq)
        if "rejectionReason" not in echo:
            requests.open = None
        echoes.append(echo)
    await peer.close()

    *taken, sent_again, refused = echoes
    assert ["rejectionReason" in echo for echo in taken] == [False] * DECISIONS
    # Said to be applied (it was), not refused for the share it took.
    assert "rejectionReason" not in sent_again
    assert sent_again["serverSeq"] == taken[-1]["serverSeq"]
    assert refused["rejectionReason"].startswith("audit-share-used: your share")


async def echo_of(peer: Peer, client_seq: int) -> Frame:
    """The echo of the peer's action numbered ``client_seq`` (past the
    others' actions)."""
    while True:
        envelope = await peer.envelope()
        if (envelope.get("origin") or {}).get("clientSeq") == client_seq:
            return envelope


async def test_a_share_spent_over_the_socket_is_spent_over_http_too(huddle: RunningServer) -> None:
    huddle.server.parts.host.audit.max_records = MAX_RECORDS
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    requests = agent_requests(agent, chat, agent.mirrors[chat])
    token = huddle.token(name="Lee")
    lee = await HuddleClient.connect(huddle.ws, token)
    accepted, _ = await decline_until_refused(lee, chat, requests, DECISIONS)
    decline = ChatInputCompleted(request_id=await requests.next(), response="decline")
    body = encode({"channel": chat, "action": decline})
    reply = await http("POST", f"{huddle.http}/api/dispatch", token=token, data=body)
    await lee.close()

    assert accepted == DECISIONS
    assert reply.status == 409
    assert reply.json()["code"] == RejectionCode.AUDIT_SHARE_USED


async def test_an_audit_without_room_for_people_refuses_their_decisions_not_the_agents() -> None:
    huddle = await start_server(Settings(port=0, audit_max_records=MAX_RECORDS))
    try:
        audit = huddle.server.parts.host.audit
        agent = await huddle.client("agent", name="agent")
        chat = await session_chat_with_turn(agent, SESSION, TURN)
        await agent.dispatch_and_wait(
            chat, ChatInputRequested(request=InputRequest(id="r", message="Go on?"))
        )
        held = 2  # the turn started, the request
        resumed = {"at": "2026-12-01T10:00:00.000Z", "session": SESSION, "who": {"role": "server"}}
        # All but the reserve's last half, the agent's and the server's own
        # (an audit/reserve marker among them).
        for _ in range(MAX_RECORDS - MAX_RECORDS // 10 // 2 - held - 1):
            await audit.record(SESSION, {**resumed, "what": "runner/resumed"})
        alice = await huddle.client(name="Alice")
        await alice.subscribe(chat)
        with pytest.raises(ActionRejected) as refused:
            await alice.dispatch_and_wait(
                chat, ChatInputCompleted(request_id="r", response="accept")
            )
        await agent.dispatch_and_wait(chat, ChatInputCompleted(request_id="r", response="cancel"))
        await audit.settled()
        lines = [line async for line in export(huddle.server.parts.store, SESSION)]
    finally:
        await huddle.stop()

    assert refused.value.code == RejectionCode.AUDIT_FULL
    kept = records(lines)
    assert len(kept) == MAX_RECORDS - MAX_RECORDS // 10 // 2 + 1
    assert kept[-1]["what"] == "chat/inputCompleted"
    assert kept[-1]["who"]["role"] == "agent"


@pytest.fixture
async def two_servers(redis_server: RedisServer) -> AsyncIterator[tuple[Served, Served]]:
    async with served_twice(redis_server, "--audit-max-records", str(MAX_RECORDS)) as both:
        yield both


@pytest.mark.redis
async def test_a_flood_split_over_two_processes_spends_one_share(
    two_servers: tuple[Served, Served], redis_server: RedisServer, tmp_path: Path
) -> None:
    a, b = (f"ws://127.0.0.1:{served.port}/ahp" for served in two_servers)
    mint = TokenAuthority(TOKEN).mint
    expires = time.time() + 600
    mallory_token = mint("participant", name="Mallory", expires_at=expires)
    agent = await HuddleClient.connect(a, TOKEN)
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    on_a, on_b = [await HuddleClient.connect(url, mallory_token) for url in (a, b)]
    dana = await HuddleClient.connect(b, mint("participant", name="Dana", expires_at=expires))
    opened = agent_requests(agent, chat, await dana.subscribe(chat))
    taken: list[tuple[int, ActionRejected | None]] = []
    for _ in range(DECISIONS + 1):  # one decline more than the share, on each process
        for mallory in (on_a, on_b):
            taken.append(await decline_until_refused(mallory, chat, opened, 1))
    dana_taken = await decline_until_refused(dana, chat, opened, 1)
    for client in (agent, on_a, on_b, dana):
        await client.close()
    *lines, _ = await exported_once_stopped(two_servers, redis_server, tmp_path, SESSION)

    assert sum(accepted for accepted, _ in taken) == DECISIONS
    refusals = [refused for _, refused in taken if refused is not None]
    assert {refused.code for refused in refusals} == {RejectionCode.AUDIT_SHARE_USED}
    assert len(refusals) == len(taken) - DECISIONS  # on both processes
    assert dana_taken == (1, None)
    assert verify(lines).records == len(lines)
    completed = [r["who"]["name"] for r in records(lines) if r["what"] == "chat/inputCompleted"]
    assert completed == ["Mallory"] * DECISIONS + ["Dana"]
