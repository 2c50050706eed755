"""Nothing a client sends can starve a chat or grow memory without bound,
and the HTTP edge keeps the socket's limits: over real servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest

from protocol.actions import ChatDraftChanged, ChatTurnCancelled, ChatTurnComplete, ChatTurnStarted
from protocol.chat import Message, MessageOrigin
from protocol.codec import encode
from protocol.session import SessionState
from reducers.limits import SizeLimits
from server.config import Limits, Settings
from server.errors import ActionRejected
from server.store.memory import KEPT_BYTES, MemoryStore
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, start_server
from tests.edge import Peer, http
from tests.test_serve_cli import TOKEN, start

SESSION = "ahp-session:/bounds"
SEND_BUFFER = 256 << 10


@pytest.fixture
async def small() -> AsyncIterator[RunningServer]:
    """A server whose clients may leave 256 KiB unread."""
    settings = Settings(
        port=0,
        limits=Limits(send_buffer=SEND_BUFFER),
        sizes=SizeLimits(message=64 << 10),
        max_body_bytes=4096,
        metrics_token="metrics-scraper-token",
    )
    running = await start_server(settings)
    try:
        yield running
    finally:
        await running.stop()


async def a_chat(running: RunningServer) -> str:
    agent = await running.client("agent", name="agent")
    await agent.create_session(SESSION)
    mirror = await agent.subscribe(SESSION)
    assert isinstance(mirror.state, SessionState)
    assert mirror.state.default_chat is not None
    return mirror.state.default_chat


def big(text: str) -> Message:
    return Message(text=text * (60 << 10), origin=MessageOrigin(kind="user"))


async def test_a_chat_larger_than_a_client_can_receive_still_loads_windowed(
    small: RunningServer,
) -> None:
    chat = await a_chat(small)
    agent = small.clients[0]
    for n in range(12):  # 12 turns of 60 KiB: about three times the send buffer
        start = ChatTurnStarted(
            turn_id=f"t{n}", started_at="2026-11-30T10:00:00Z", message=big("x")
        )
        await agent.dispatch_and_wait(chat, start)
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    full = (await small.server.host.view(chat)).state
    assert len(encode(full)) > SEND_BUFFER

    peer = await Peer.ready(small.ws, small.token(name="late"), "late")
    snapshot = await peer.subscribe(chat)

    assert len(encode(snapshot)) <= SEND_BUFFER // 2
    turns = [t["id"] for t in snapshot["state"]["turns"]]
    assert turns == [f"t{n}" for n in range(12 - len(turns), 12)]
    assert 0 < len(turns) < 12
    assert snapshot["state"]["turnsNextCursor"]
    assert "result" in await peer.request("ping", {"channel": "ahp-root://"})


async def test_sessions_are_listed_a_page_at_a_time_by_default(small: RunningServer) -> None:
    agent = await small.client("agent", name="lister")
    for n in range(105):
        await agent.create_session(f"ahp-session:/many-{n:03}")
    peer = await Peer.ready(small.ws, small.token(name="reader"), "reader")

    first = (await peer.request("listSessions", {"channel": "ahp-root://"}))["result"]
    rest = (
        await peer.request(
            "listSessions", {"channel": "ahp-root://", "cursor": first["nextCursor"]}
        )
    )["result"]

    assert len(first["items"]) == 100
    assert len(rest["items"]) == 5
    assert "nextCursor" not in rest
    assert len(await agent.list_sessions()) == 105  # the Python client pages through


async def test_an_http_body_over_the_limit_is_413_before_it_is_read(small: RunningServer) -> None:
    loop = asyncio.get_running_loop()
    with socket.create_connection(("127.0.0.1", small.port)) as sock:
        sock.setblocking(False)
        head = (
            "POST /api/dispatch HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {AGENT_TOKEN}\r\nContent-Type: application/json\r\n"
            "Content-Length: 10000000\r\n\r\n"
        )
        await loop.sock_sendall(sock, head.encode())  # and never the body
        async with asyncio.timeout(5 * UNIT):
            answer = await loop.sock_recv(sock, 4096)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"the body is larger than 4,096 bytes" in answer


async def test_a_streamed_body_over_the_limit_is_413(small: RunningServer) -> None:
    reply = await http(
        "POST",
        small.http + "/api/sessions",
        token=AGENT_TOKEN,
        data=b'{"title": "' + b"x" * 5000 + b'"}',
        headers={"Content-Type": "application/json"},
    )
    assert reply.status == 413


async def test_permission_is_checked_before_the_body_is_read(small: RunningServer) -> None:
    observer = small.token("observer", name="olga")
    reply = await http("POST", small.http + "/api/dispatch", token=observer, data=b"{not json")

    assert reply.status == 403
    assert reply.json()["rejectionReason"] == "forbidden: observers may not dispatch actions"


async def test_every_answer_carries_the_security_headers(small: RunningServer) -> None:
    for path in ("/", "/healthz", "/web/app.js", "/api/snapshot?channel=ahp-root://"):
        reply = await http("GET", small.http + path, token=AGENT_TOKEN)
        assert reply.headers["X-Content-Type-Options"] == "nosniff", path
        assert reply.headers["Referrer-Policy"] == "no-referrer", path
        assert "frame-ancestors 'none'" in reply.headers["Content-Security-Policy"], path


async def test_a_foreign_host_name_is_refused(small: RunningServer) -> None:
    reply = await http("GET", small.http + "/healthz", headers={"Host": "evil.example:80"})
    assert reply.status == 400
    assert (await http("GET", small.http + "/healthz", headers={"Host": "localhost"})).status == 200


async def test_metrics_need_the_agent_token_or_the_metrics_token(small: RunningServer) -> None:
    url = small.http + "/metrics"
    assert (await http("GET", url)).status == 401
    assert (await http("GET", url, token=small.token(name="p"))).status == 403
    assert (await http("GET", url, token="metrics-scraper-token")).status == 200
    assert (await http("GET", url, token=AGENT_TOKEN)).status == 200


# ─── A real process ──────────────────────────────────────────────────────────


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def test_tokens_never_reach_the_log() -> None:
    served = await start(env={"HUDDLE_TOKEN": TOKEN})
    try:
        token = served.link.split("token=", 1)[1]
        base = f"http://127.0.0.1:{served.port}"
        await http("GET", f"{base}/?token={token}")
        await http("GET", f"{base}/?token=hud1.forged.token")
        await http("GET", f"{base}/api/snapshot?channel=ahp-root://", token=TOKEN)
    finally:
        served.process.terminate()
        assert served.process.stdout is not None
        rest = await served.process.stdout.read()
        await served.process.wait()
    printed = ("Open the web client:", "Agent token")  # for the operator, not the log
    lines = [*served.output, *rest.decode().splitlines(keepends=True)]
    log = "".join(line for line in lines if not line.startswith(printed))
    assert "token=***" in log
    assert token not in log
    assert "hud1.forged.token" not in log
    assert TOKEN not in log


async def test_memory_stays_bounded_under_large_actions_and_many_connections() -> None:
    served = await start(
        env={"HUDDLE_TOKEN": TOKEN, "HUDDLE_AGENT": "none", "HUDDLE_ACTIONS_PER_SECOND": "100000"}
    )
    pid = served.process.pid
    ws = f"ws://127.0.0.1:{served.port}/ahp"
    try:
        agent = await Peer.ready(ws, TOKEN, "agent")
        reply = await agent.request("createSession", {"channel": SESSION})
        assert "result" in reply, reply
        session = await agent.subscribe(SESSION)
        chat = session["state"]["defaultChat"]
        await agent.subscribe(chat)

        async def flood(rounds: int) -> None:
            for n in range(rounds):
                await agent.dispatch(chat, ChatDraftChanged(draft=big(str(n % 10))))
                await agent.envelope()

        async def churn(count: int) -> None:
            for n in range(count):
                peer = await Peer.ready(ws, TOKEN, f"visitor-{n}")
                await peer.subscribe(chat)
                await peer.close()

        await flood(200)
        await churn(50)
        settled = rss_kib(pid)
        await flood(1500)  # 1500 drafts of 60 KiB: 90 MiB through one channel
        await churn(300)
        grown = rss_kib(pid) - settled
    finally:
        served.process.kill()
        await served.process.wait()
    assert grown < 48 << 10, f"RSS grew by {grown} KiB"


async def test_what_the_memory_store_keeps_for_retries_is_bounded() -> None:
    store = MemoryStore()
    value = b"x" * (1 << 20)
    for n in range(2 * (KEPT_BYTES >> 20)):
        await store.remember(f"idempotency:t:{n}", value, 3600)

    assert await store.recall("idempotency:t:0") is None  # the oldest went first
    newest = f"idempotency:t:{2 * (KEPT_BYTES >> 20) - 1}"
    assert await store.recall(newest) == value
    assert store._kept_bytes <= KEPT_BYTES


async def test_a_chat_that_fills_up_takes_no_new_turn_and_stays_loadable() -> None:
    # A participant starting and cancelling turns of big messages, as fast
    # as the rate limit lets it, must not grow a chat without bound.
    store = MemoryStore()
    settings = Settings(
        port=0, sizes=SizeLimits(chat_bytes=512 << 10), limits=Limits(action_burst=1000)
    )
    running = await start_server(settings, store)
    try:
        chat = await a_chat(running)
        mallory = await running.client(name="mallory")
        refused: ActionRejected | None = None
        for n in range(100):
            start = ChatTurnStarted(
                turn_id=f"t{n}", started_at="2026-11-30T10:00:00Z", message=big("x")
            )
            try:
                await mallory.dispatch_and_wait(chat, start)
            except ActionRejected as error:
                refused = error
                break
            await mallory.dispatch_and_wait(chat, ChatTurnCancelled(turn_id=f"t{n}", duration=1))
        full = (await running.server.host.view(chat)).state
        late = await Peer.ready(running.ws, running.token(name="late"), "late")
        snapshot = await late.subscribe(chat)
    finally:
        await running.stop()

    assert refused is not None
    assert refused.code == "chat-full"
    assert "start a new chat" in refused.sentence
    # Full at the limit (give or take the envelopes since the last snapshot).
    assert len(encode(full)) + (64 << 10) * 2 >= (512 << 10)
    assert len(encode(full)) <= (512 << 10) + (64 << 10) * 2
    assert snapshot["state"]["turns"]

    # The store holds what the chat holds: loaded again, it is still full.
    again = await start_server(settings, store)
    try:
        alice = await again.client(name="alice")
        start = ChatTurnStarted(
            turn_id="t-new", started_at="2026-11-30T10:00:00Z", message=big("y")
        )
        with pytest.raises(ActionRejected) as still:
            await alice.dispatch_and_wait(chat, start)
    finally:
        await again.stop()
    assert still.value.code == "chat-full"
