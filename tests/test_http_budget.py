"""The HTTP API under abuse: every route spends its token's budget, failed
authentications are throttled per client address, and a token holds only so
many long polls.

Requests go through httpx (real connections to uvicorn on port 0, one
client address or another: 127.0.0.1 and 127.0.0.2 are both loopback);
what the test sets up in the server it sets up through the host, so that no
setup spends a budget under test.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from protocol.actions import (
    ChatDraftChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatTurnComplete,
    ChatTurnStarted,
)
from protocol.chat import InputRequest, TextQuestion
from protocol.codec import to_builtins
from server.auth import Grant
from server.config import Limits, Settings
from server.ratelimit import (
    DRAWN_SHARE,
    FAILED_AUTHENTICATIONS,
    LONG_POLLS,
    Budget,
    Budgets,
    RateLimited,
)
from server.store.redis import RedisStore
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, WallClock, start_server, user_message
from tests.edge import eventually
from tests.redis_server import RedisServer

SESSION = "ahp-session:/budget"
Query = dict[str, str | float]


def turn(turn_id: str, text: str = "Deploy?") -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id=turn_id, started_at="2026-11-30T10:00:00.000Z", message=user_message(text)
    )


def draft(text: str) -> Any:
    return to_builtins(ChatDraftChanged(draft=user_message(text)))


def question(request_id: str) -> ChatInputRequested:
    return ChatInputRequested(
        request=InputRequest(
            id=request_id,
            message="May we deploy?",
            questions=[TextQuestion(id="why", message="Why?")],
        )
    )


async def chat_asking(running: RunningServer, session: str = SESSION, request: str = "r") -> str:
    """A session whose chat asks ``request``, set up in-process."""
    host = running.server.parts.host
    chat = await host.create_session(session)
    await host.dispatch(chat, turn("t1"))
    await host.dispatch(chat, question(request))
    return chat


def client(
    running: RunningServer, token: str | None = None, address: str = "127.0.0.1"
) -> httpx.AsyncClient:
    """An HTTP client of the server from ``address``, carrying ``token``."""
    return httpx.AsyncClient(
        base_url=running.http,
        headers={"Authorization": f"Bearer {token}"} if token is not None else {},
        transport=httpx.AsyncHTTPTransport(local_address=address),
        timeout=10 * UNIT,
        trust_env=False,
    )


def grant_of(running: RunningServer, token: str) -> Grant:
    return running.authority.verify(token, time.time())


def retry_after(reply: httpx.Response) -> int:
    seconds = int(reply.headers["Retry-After"])
    assert seconds >= 1
    return seconds


@pytest.fixture
async def tight() -> AsyncIterator[RunningServer]:
    """A server whose every token may spend 3 actions and (practically)
    never more."""
    limits = Limits(
        actions_per_second=0.001,
        action_burst=3,
        agent_actions_per_second=0.001,
        agent_action_burst=3,
    )
    running = await start_server(Settings(port=0, limits=limits))
    try:
        yield running
    finally:
        await running.stop()


@pytest.mark.redis
async def test_a_token_gets_one_budget_however_many_processes_it_talks_to(
    redis_server: RedisServer, clock: WallClock
) -> None:
    burst = 16
    limits = Limits(actions_per_second=0.001, action_burst=burst)
    settings = Settings(port=0, limits=limits)
    one = await start_server(settings, RedisStore(redis_server.url), clock=clock)
    other = await start_server(settings, RedisStore(redis_server.url), clock=clock)
    try:
        chat = await chat_asking(one)
        token = one.token("participant")
        statuses = []
        async with client(one, token) as first, client(other, token) as second:
            for n in range(4 * burst):  # by turns, each process spending its draw
                http = first if n % 2 else second
                sent = await http.post(
                    "/api/dispatch", json={"channel": chat, "action": draft(f"draft {n}")}
                )
                statuses.append(sent.status_code)
    finally:
        await one.stop()
        await other.stop()

    accepted = statuses.count(200)
    # Each process holds at most one draw (a DRAWN_SHARE-th of the burst)
    # it has not spent; on its own bucket each would have given the burst.
    assert burst - 2 * burst // DRAWN_SHARE <= accepted <= burst
    assert statuses.count(429) == 4 * burst - accepted


async def test_while_the_store_fails_each_process_keeps_the_budget_itself() -> None:
    gone = RedisStore("redis://127.0.0.1:1/0", timeout=UNIT)  # nothing listens there
    budgets = Budgets(Budget(0.001, 2), Budget(0.001, 2), draw=gone.draw)
    grant = Grant(role="participant", sessions=None, name="Lee", token_id="t-lee")
    try:
        await budgets.spend(grant)
        await budgets.spend(grant)
        with pytest.raises(RateLimited):
            await budgets.spend(grant)
    finally:
        await gone.close()


# ─── Every route spends the token's budget ───────────────────────────────────


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    params: Callable[[str], dict[str, Any]] = lambda chat: {}
    body: Callable[[str], Any] = lambda chat: None
    served: int = 200
    """The status when the budget allows."""

    async def send(self, http: httpx.AsyncClient, chat: str) -> httpx.Response:
        return await http.request(
            self.method, self.path, params=self.params(chat), json=self.body(chat)
        )


CALLS: list[Any] = [
    pytest.param(
        Call("POST", "/api/sessions", body=lambda c: {"id": "later"}, served=201), id="sessions"
    ),
    pytest.param(Call("GET", "/api/snapshot", params=lambda c: {"channel": c}), id="snapshot"),
    pytest.param(Call("GET", "/api/audit", params=lambda c: {"session": SESSION}), id="audit"),
    pytest.param(
        Call(
            "POST",
            "/api/expiry",
            body=lambda c: {"channel": c, "requestId": "r", "seconds": 60, "onExpiry": "cancel"},
        ),
        id="expiry",
    ),
    pytest.param(
        Call("POST", "/api/dispatch", body=lambda c: {"channel": c, "action": draft("x")}),
        id="dispatch",
    ),
    pytest.param(
        Call(
            "GET",
            "/api/input/wait",
            params=lambda c: {"chat": c, "request": "r", "timeout": 0},
            served=408,  # still open after no time at all
        ),
        id="input-wait",
    ),
    pytest.param(Call("POST", "/api/tokens", body=lambda c: {"role": "observer"}), id="tokens"),
    pytest.param(Call("GET", "/metrics"), id="metrics"),
]


@pytest.mark.parametrize("call", CALLS)
async def test_a_token_over_its_budget_gets_429_with_retry_after_on_every_route(
    tight: RunningServer, call: Call
) -> None:
    chat = await chat_asking(tight)
    spender = tight.authority.mint("agent", expires_at=time.time() + 60)
    async with client(tight, spender) as http, client(tight, AGENT_TOKEN) as fresh:
        for n in range(3):  # the whole burst
            spent = await http.post(
                "/api/dispatch", json={"channel": chat, "action": draft(f"draft {n}")}
            )
            assert spent.status_code == 200, spent.text

        refused = await call.send(http, chat)
        other = await call.send(fresh, chat)

    assert refused.status_code == 429, refused.text
    assert retry_after(refused) > 100  # 0.001 a second: a long wait
    assert refused.json()["code"] == "rate-limited"
    # Another token's budget is its own; and the refused call did nothing
    # (the session "later" was not created: the other token creates it).
    assert other.status_code == call.served, other.text


async def test_a_refused_dispatch_still_answers_as_a_rejected_action(tight: RunningServer) -> None:
    chat = await chat_asking(tight)
    token = tight.token("participant")
    async with client(tight, token) as http:
        for n in range(3):
            await http.post("/api/dispatch", json={"channel": chat, "action": draft(f"draft {n}")})

        refused = await http.post("/api/dispatch", json={"channel": chat, "action": draft("4")})

    assert refused.status_code == 429
    assert refused.json() == {
        "rejectionReason": "rate-limited: at most 0.001 actions a second per token",
        "code": "rate-limited",
    }
    retry_after(refused)


async def test_reads_cost_half_of_what_writes_do(tight: RunningServer) -> None:
    chat = await chat_asking(tight)
    reader, writer = tight.token("participant"), tight.token("participant")
    async with client(tight, reader) as reads, client(tight, writer) as writes:
        read = [(await reads.get("/api/snapshot", params={"channel": chat})) for _ in range(7)]
        written = [
            await writes.post(
                "/api/dispatch", json={"channel": chat, "action": draft(f"draft {n}")}
            )
            for n in range(4)
        ]

    assert [r.status_code for r in read] == [200] * 6 + [429]
    assert [w.status_code for w in written] == [200] * 3 + [429]


async def test_the_browsers_of_one_shared_link_spend_its_budget_over_http(
    tight: RunningServer,
) -> None:
    chat = await chat_asking(tight)
    shared = tight.authority.mint("participant", expires_at=time.time() + 60, shared=True)
    async with client(tight) as anonymous:
        opened = [await anonymous.get("/", params={"token": shared}) for _ in range(2)]
    first, second = (reply.cookies["huddle_token"] for reply in opened)
    async with client(tight, first) as one, client(tight, second) as two:
        for n in range(3):
            await one.post("/api/dispatch", json={"channel": chat, "action": draft(f"draft {n}")})

        refused = await two.get("/api/snapshot", params={"channel": chat})

    assert refused.status_code == 429


@pytest.mark.parametrize("export", ["snapshot", "audit"])
async def test_a_large_export_is_charged_by_its_size_and_the_next_read_waits(
    tight: RunningServer, export: str
) -> None:
    chat = await tight.server.parts.host.create_session(SESSION)
    if export == "snapshot":  # 4 turns of 60 KiB: more than 3 times 64 KiB
        for n in range(4):
            await tight.server.parts.host.dispatch(chat, turn(f"t{n}", "x" * (60 << 10)))
            await tight.server.parts.host.dispatch(
                chat, ChatTurnComplete(turn_id=f"t{n}", duration=1)
            )
        url, params = "/api/snapshot", {"channel": chat}
    else:  # 300 records: 3 times 100
        record = {"at": "2026-12-01T10:00:00.000Z", "session": SESSION, "what": "chat/turnStarted"}
        for _ in range(300):
            await tight.server.parts.host.audit.record(
                SESSION, {**record, "who": {"role": "server"}}
            )
        await tight.server.parts.host.audit.settled()
        url, params = "/api/audit", {"session": SESSION}
    async with client(tight, tight.token("participant")) as http:
        exported = await http.get(url, params=params)
        small = await http.get("/api/snapshot", params={"channel": "ahp-root://"})

    assert exported.status_code == 200
    assert small.status_code == 429  # 3 - 0.5 - 3 left: not even half an action


# ─── Failed authentications, per client address ──────────────────────────────


async def test_a_failed_authentication_flood_is_throttled_for_its_address_alone(
    huddle: RunningServer, clock: WallClock
) -> None:
    """Decision: an address may fail FAILED_AUTHENTICATIONS.burst (20) times
    in a row, then once a second. While it has no failure left to make,
    every authentication from it is 429, a valid token's too (the token is
    not looked at: a right guess must not be told apart); other addresses
    are untouched, and the address is served again once it has room."""
    huddle.server.failures.clock = clock
    valid = huddle.token("participant")
    root = {"channel": "ahp-root://"}
    async with (
        client(huddle, "hud1.guess.sig") as guesser,
        client(huddle, valid) as victim,
        client(huddle, valid, address="127.0.0.2") as elsewhere,
        client(huddle, "hud1.guess.sig", address="127.0.0.2") as elsewhere_guessing,
    ):
        burst = FAILED_AUTHENTICATIONS.burst
        guesses = [await guesser.get("/api/snapshot", params=root) for _ in range(burst - 1)]
        assert (await victim.get("/api/snapshot", params=root)).status_code == 200
        guesses.append(await guesser.get("/api/snapshot", params=root))
        assert [g.status_code for g in guesses] == [401] * burst

        throttled = await guesser.get("/api/snapshot", params=root)
        locked = await victim.get("/api/snapshot", params=root)
        with pytest.raises(InvalidStatus) as socket_refused:
            await connect(
                huddle.ws, additional_headers={"Authorization": f"Bearer {valid}"}, proxy=None
            )
        assert (await elsewhere.get("/api/snapshot", params=root)).status_code == 200
        assert (await elsewhere_guessing.get("/api/snapshot", params=root)).status_code == 401

        clock.now += 1.0  # one failure's room again
        served = await victim.get("/api/snapshot", params=root)
        guessed = await guesser.get("/api/snapshot", params=root)
        again = await guesser.get("/api/snapshot", params=root)

    assert throttled.status_code == locked.status_code == 429
    assert retry_after(throttled) == 1
    assert "failed authentications" in throttled.json()["error"]
    assert socket_refused.value.response.status_code == 429
    assert served.status_code == 200
    assert [guessed.status_code, again.status_code] == [401, 429]


async def test_no_token_or_an_expired_one_of_ours_is_no_guess_and_not_counted(
    huddle: RunningServer,
) -> None:
    expired = huddle.authority.mint("participant", expires_at=time.time() - 1)
    valid = huddle.token("participant")
    root = {"channel": "ahp-root://"}
    async with client(huddle, expired) as stale, client(huddle) as bare:
        refused = [
            await anyone.get("/api/snapshot", params=root)
            for _ in range(FAILED_AUTHENTICATIONS.burst + 5)
            for anyone in (stale, bare)
        ]
        served = await stale.get(
            "/api/snapshot", params=root, headers={"Authorization": f"Bearer {valid}"}
        )

    assert {r.status_code for r in refused} == {401}
    assert served.status_code == 200


async def test_links_with_bad_tokens_count_as_failed_authentications(
    huddle: RunningServer,
) -> None:
    async with client(huddle) as browser:
        for _ in range(FAILED_AUTHENTICATIONS.burst):
            assert (await browser.get("/", params={"token": "hud1.x.y"})).status_code == 401

        refused = await browser.get("/", params={"token": huddle.token("participant")})

    assert refused.status_code == 429
    assert "set-cookie" not in refused.headers
    retry_after(refused)


# ─── Long polls ──────────────────────────────────────────────────────────────


async def test_a_token_holds_at_most_eight_long_polls_at_once(huddle: RunningServer) -> None:
    chat = await chat_asking(huddle)
    token, other = huddle.token("participant"), huddle.token("participant")
    query: Query = {"chat": chat, "request": "r", "timeout": 5 * UNIT}
    async with client(huddle, token) as http, client(huddle, other) as another:
        polls = [asyncio.create_task(http.get("/api/input/wait", params=query)) for _ in range(8)]
        await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) == LONG_POLLS)

        refused = await http.get("/api/input/wait", params=query)
        elsewhere = asyncio.create_task(another.get("/api/input/wait", params=query))
        await eventually(
            lambda: huddle.server.parts.host.waiters.waiting_on(chat) == LONG_POLLS + 1
        )

        await huddle.server.parts.host.dispatch(
            chat, ChatInputCompleted(request_id="r", response="cancel")
        )
        answers = await asyncio.gather(*polls, elsewhere)

    assert refused.status_code == 429
    assert refused.json() == {"error": "at most 8 long polls at once per token", "code": "too-many"}
    assert [a.status_code for a in answers] == [200] * (LONG_POLLS + 1)
    assert huddle.server.polls.held(grant_of(huddle, token)) == 0


ENDINGS = ["answered", "timed-out", "hung-up", "turn-ended"]


@pytest.mark.parametrize("ending", ENDINGS)
async def test_a_long_poll_gives_its_slot_back_however_it_ends(
    huddle: RunningServer, ending: str
) -> None:
    chat = await chat_asking(huddle)
    other_chat = await chat_asking(huddle, "ahp-session:/budget-2", "last")
    token = huddle.token("participant")
    grant = grant_of(huddle, token)
    query: Query = {"chat": chat, "request": "r", "timeout": 5 * UNIT}
    last: Query = {
        "chat": other_chat,
        "request": "last",
        "timeout": 2 * UNIT if ending == "timed-out" else 5 * UNIT,
    }
    async with client(huddle, token) as http:
        polls = [asyncio.create_task(http.get("/api/input/wait", params=query)) for _ in range(7)]
        await eventually(lambda: huddle.server.polls.held(grant) == LONG_POLLS - 1)
        ending_poll = asyncio.create_task(http.get("/api/input/wait", params=last))
        await eventually(lambda: huddle.server.polls.held(grant) == LONG_POLLS)
        assert (await http.get("/api/input/wait", params=query)).status_code == 429

        host = huddle.server.parts.host
        if ending != "timed-out":
            await eventually(lambda: host.waiters.waiting_on(other_chat) == 1)
        if ending == "answered":
            await host.dispatch(
                other_chat, ChatInputCompleted(request_id="last", response="cancel")
            )
        elif ending == "turn-ended":
            await host.dispatch(other_chat, ChatTurnComplete(turn_id="t1", duration=1))
        elif ending == "hung-up":
            ending_poll.cancel()  # httpx closes the connection
        if ending == "hung-up":
            await eventually(lambda: huddle.server.polls.held(grant) == LONG_POLLS - 1)
        else:
            ended = await ending_poll
            expected = {"answered": 200, "timed-out": 408, "turn-ended": 410}[ending]
            assert ended.status_code == expected, ended.text
        held_after = huddle.server.polls.held(grant)

        polls.append(asyncio.create_task(http.get("/api/input/wait", params=query)))
        await eventually(lambda: host.waiters.waiting_on(chat) == LONG_POLLS)
        await host.dispatch(chat, ChatInputCompleted(request_id="r", response="cancel"))
        answers = await asyncio.gather(*polls)

    assert held_after == LONG_POLLS - 1
    assert [a.status_code for a in answers] == [200] * LONG_POLLS
    assert huddle.server.polls.held(grant) == 0


async def test_a_long_poll_refused_as_a_bad_request_takes_no_slot(huddle: RunningServer) -> None:
    token = huddle.token("participant")
    bad: Query = {"chat": "ahp-session:/not-a-chat", "request": "r"}
    async with client(huddle, token) as http:
        replies = [await http.get("/api/input/wait", params=bad) for _ in range(LONG_POLLS + 1)]

    assert [r.status_code for r in replies] == [400] * (LONG_POLLS + 1)
    assert huddle.server.polls.held(grant_of(huddle, token)) == 0
