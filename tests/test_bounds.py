"""Nothing a client sends can starve a chat or grow memory without bound,
and the HTTP edge keeps the socket's limits: over real servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import pytest

from protocol.actions import ChatDraftChanged, ChatTurnCancelled, ChatTurnComplete, ChatTurnStarted
from protocol.chat import ChatState, Message, MessageOrigin, Turn
from protocol.codec import encode
from protocol.session import SessionState
from protocol.uris import ROOT_URI
from reducers.limits import SizeLimits
from server.config import Limits, Settings
from server.core.sessions import windowed
from server.errors import ActionRejected
from server.store.memory import KEPT_BYTES, MemoryStore
from tests.conftest import AGENT_TOKEN, UNIT, RecordReads, RunningServer, start_server
from tests.edge import HttpReply, Peer, http, initialize_params, plain_reconnect
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


async def a_long_chat(running: RunningServer) -> str:
    """A chat of 12 turns of 60 KiB (t0 .. t11): about three times the send
    buffer."""
    chat = await a_chat_of(running, 12)
    full = (await running.server.host.view(chat)).state
    assert len(encode(full)) > SEND_BUFFER
    return chat


async def a_chat_of(running: RunningServer, turns: int) -> str:
    """A chat of ``turns`` completed turns of 60 KiB each (t0, t1, ...)."""
    chat = await a_chat(running)
    agent = running.clients[0]
    for n in range(turns):
        start = ChatTurnStarted(
            turn_id=f"t{n}", started_at="2026-11-30T10:00:00Z", message=big("x")
        )
        await agent.dispatch_and_wait(chat, start)
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    return chat


async def test_a_chat_larger_than_a_client_can_receive_still_loads_windowed(
    small: RunningServer,
) -> None:
    chat = await a_long_chat(small)

    peer = await Peer.ready(small.ws, small.token(name="late"), "late")
    snapshot = await peer.subscribe(chat)

    assert len(encode(snapshot)) <= SEND_BUFFER // 2
    turns = [t["id"] for t in snapshot["state"]["turns"]]
    assert turns == [f"t{n}" for n in range(12 - len(turns), 12)]
    assert 0 < len(turns) < 12
    assert snapshot["state"]["turnsNextCursor"]
    assert "result" in await peer.request("ping", {"channel": "ahp-root://"})


async def snapshot_over_http(running: RunningServer, **query: str) -> HttpReply:
    token = running.token("observer", name="olga")
    reply = await http("GET", f"{running.http}/api/snapshot?{urlencode(query)}", token=token)
    assert reply.status == 200, reply.body[:200]
    assert len(reply.body) <= SEND_BUFFER // 2
    return reply


async def test_an_http_snapshot_of_a_long_chat_is_windowed_as_the_sockets_is(
    small: RunningServer,
) -> None:
    chat = await a_long_chat(small)
    peer = await Peer.ready(small.ws, small.token(name="late"), "late")

    reply = await snapshot_over_http(small, channel=chat)

    state = reply.json()["state"]
    assert 0 < len(state["turns"]) < 12
    assert state["turnsNextCursor"]
    assert state == (await peer.subscribe(chat))["state"]


async def test_http_pages_a_long_chats_older_turns_until_none_are_left(
    small: RunningServer,
) -> None:
    chat = await a_long_chat(small)
    state = (await snapshot_over_http(small, channel=chat)).json()["state"]
    seen = [t["id"] for t in state["turns"]]
    cursor = state["turnsNextCursor"]

    while cursor is not None:
        page = (await snapshot_over_http(small, channel=chat, cursor=cursor)).json()
        assert page["resource"] == chat
        assert page["turns"]
        seen = [t["id"] for t in page["turns"]] + seen
        cursor = page.get("turnsNextCursor")

    assert seen == [f"t{n}" for n in range(12)]


async def test_http_snapshot_and_pages_take_at_most_the_turns_asked_for(
    small: RunningServer,
) -> None:
    chat = await a_long_chat(small)

    state = (await snapshot_over_http(small, channel=chat, turns="1")).json()["state"]
    page = await snapshot_over_http(small, channel=chat, cursor=state["turnsNextCursor"], turns="1")

    assert [t["id"] for t in state["turns"]] == ["t11"]
    assert [t["id"] for t in page.json()["turns"]] == ["t10"]
    assert page.json()["turnsNextCursor"]


async def test_an_http_page_with_an_unknown_cursor_is_400(small: RunningServer) -> None:
    chat = await a_chat(small)
    query = urlencode({"channel": chat, "cursor": "not-a-cursor"})

    reply = await http("GET", f"{small.http}/api/snapshot?{query}", token=AGENT_TOKEN)

    assert reply.status == 400
    assert reply.json()["path"] == "$.cursor"


def test_a_window_is_taken_only_when_the_whole_chat_does_not_fit() -> None:
    turns = [
        Turn(id=f"t{n}", message=big("x"), response_parts=[], state="complete") for n in range(3)
    ]
    chat = ChatState(resource="ahp-chat:/c", title="c", status=0, modified_at="", turns=turns)
    size = len(encode(chat))

    assert windowed(chat, None, size) is chat
    assert windowed(chat, None, size - 1).turns == turns[1:]
    assert windowed(chat, 3, size) is chat
    assert windowed(chat, 2, size).turns == turns[1:]


def test_a_window_never_encodes_a_turn_it_leaves_out() -> None:
    # Older turns that cannot be encoded at all: a window that fits without
    # them must not touch them (a chat may hold far more than a client gets).
    broken = Message(text=object(), origin=MessageOrigin(kind="user"))  # type: ignore[arg-type]
    older = [
        Turn(id=f"o{n}", message=broken, response_parts=[], state="complete") for n in range(3)
    ]
    newest = [
        Turn(id=f"t{n}", message=big("x"), response_parts=[], state="complete") for n in range(3)
    ]
    chat = ChatState(
        resource="ahp-chat:/c", title="c", status=0, modified_at="", turns=older + newest
    )

    window = windowed(chat, None, 2 * len(encode(newest[0])) + 1024)

    assert [t.id for t in window.turns] == ["t1", "t2"]
    assert window.turns_next_cursor is not None


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


async def test_a_page_of_sessions_takes_no_more_than_one_answer_may() -> None:
    running = await start_server(Settings(port=0, limits=Limits(send_buffer=32 << 10)))
    try:
        agent = await running.client("agent", name="agent")
        for n in range(40):  # about 1.2 KiB of summary each: some 13 fit in 16 KiB
            await agent.create_session(f"ahp-session:/long-{n}", title=f"{n:04d}" + "x" * 1000)
        peer = await Peer.ready(running.ws, running.token(name="lee"), "lee")
        pages: list[list[str]] = []
        params: dict[str, object] = {"channel": "ahp-root://", "limit": 100}
        while True:
            frame = await peer.request("listSessions", params)
            result = frame["result"]
            assert len(encode(result)) <= (32 << 10) // 2
            pages.append([item["resource"] for item in result["items"]])
            if not result.get("nextCursor"):
                break
            params = {"channel": "ahp-root://", "limit": 100, "cursor": result["nextCursor"]}
    finally:
        await running.stop()

    listed = [resource for page in pages for resource in page]
    assert sorted(listed) == sorted(f"ahp-session:/long-{n}" for n in range(40))
    assert len(pages) > 1


async def test_a_page_of_older_turns_takes_no_more_than_one_answer_may(
    small: RunningServer,
) -> None:
    chat = await a_chat(small)
    agent = small.clients[0]
    for n in range(12):  # 12 turns of 60 KiB: a page of 50 would be 720 KiB
        start = ChatTurnStarted(
            turn_id=f"t{n}", started_at="2026-11-30T10:00:00Z", message=big("x")
        )
        await agent.dispatch_and_wait(chat, start)
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    peer = await Peer.ready(small.ws, small.token(name="late"), "late")
    snapshot = await peer.subscribe(chat)
    seen = [t["id"] for t in snapshot["state"]["turns"]]
    cursor = snapshot["state"]["turnsNextCursor"]
    while cursor:
        frame = await peer.request("fetchTurns", {"channel": chat, "cursor": cursor, "limit": 50})
        assert len(encode(frame)) <= SEND_BUFFER // 2
        page = frame["result"]
        assert page["turns"]
        seen = [t["id"] for t in page["turns"]] + seen
        cursor = page.get("turnsNextCursor")

    assert seen == [f"t{n}" for n in range(12)]


async def test_pages_of_older_turns_spend_the_tokens_budget() -> None:
    limits = Limits(actions_per_second=0.001, action_burst=4)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        chat = await a_chat(running)
        peer = await Peer.ready(running.ws, running.token(name="lee"), "lee")
        answers = [await peer.request("fetchTurns", {"channel": chat}) for _ in range(9)]
    finally:
        await running.stop()

    assert all("result" in answer for answer in answers[:8])  # half an action each
    assert answers[8]["error"]["code"] == -32011
    assert "rate-limited" in answers[8]["error"]["message"]


@pytest.mark.parametrize(
    ("method", "params"),
    [("subscribe", {"channel": SESSION}), ("listSessions", {"channel": ROOT_URI})],
)
async def test_subscribes_and_pages_of_sessions_spend_the_tokens_budget(
    method: str, params: dict[str, str]
) -> None:
    limits = Limits(actions_per_second=0.001, action_burst=4)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        await a_chat(running)
        peer = await Peer.ready(running.ws, running.token(name="lee"), "lee")
        answers = [await peer.request(method, params) for _ in range(9)]
    finally:
        await running.stop()

    assert all("result" in answer for answer in answers[:8])  # half an action each
    assert answers[8]["error"]["code"] == -32011
    assert "rate-limited" in answers[8]["error"]["message"]


async def test_the_snapshots_of_initialize_and_reconnect_are_charged_not_refused() -> None:
    limits = Limits(actions_per_second=0.001, action_burst=2)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        chat = await a_chat(running)
        token = running.token(name="lee")
        channels = [ROOT_URI, SESSION, chat]
        first = await Peer.open(running.ws, token, "lee")
        opened = await first.request(
            "initialize",
            initialize_params("lee", extensions=()) | {"initialSubscriptions": channels},
        )
        room = await first.request("subscribe", {"channel": SESSION})
        after_initialize = await first.request("subscribe", {"channel": SESSION})
        second = await Peer.open(running.ws, token, "lee-too")
        resumed = await second.request(
            "reconnect",
            plain_reconnect("lee-too", channels),
        )
        after_reconnect = await second.request("listSessions", {"channel": ROOT_URI})
    finally:
        await running.stop()

    # Three snapshots each time, all answered (1.5 actions against a burst of 2) ...
    assert len(opened["result"]["snapshots"]) == 3
    assert len(resumed["result"]["snapshots"]) == 3
    # ... and what they took is gone from the budget: room for one read, then none.
    assert "result" in room
    assert "rate-limited" in after_initialize["error"]["message"]
    assert "rate-limited" in after_reconnect["error"]["message"]


async def test_initialize_and_reconnect_answer_each_channel_once_and_within_one_answer() -> None:
    # One frame naming a session 500 times was answered with 500 snapshots
    # (gigabytes for a large session); sessions are not windowed as chats are.
    budget = 32 << 10
    running = await start_server(Settings(port=0, limits=Limits(send_buffer=32 << 10)))
    try:
        maker = await Peer.ready(running.ws, AGENT_TOKEN, "maker", extensions=())
        sessions = [f"ahp-session:/wide-{n}" for n in range(4)]
        for n, session in enumerate(sessions):  # about 12 KiB each: two fit in 32 KiB
            dirs = [f"file:///{n}/{d}/" + "d" * 1000 for d in range(12)]
            made = await maker.request(
                "createSession", {"channel": session, "workingDirectories": dirs}
            )
            assert "result" in made, made
        token, named = running.token(name="lee"), [sessions[0]] * 500 + sessions[1:]
        lee = await Peer.open(running.ws, token, "lee")
        opened = await lee.request(
            "initialize", initialize_params("lee", extensions=()) | {"initialSubscriptions": named}
        )
        later = await lee.subscribe(sessions[2])  # left out, not refused
        back = await Peer.open(running.ws, token, "lee-too")
        plain = await back.request(
            "reconnect",
            plain_reconnect("lee-too", named),
        )
        huddle = await Peer.ready(running.ws, token, "lee-three")
        cursors = [{"channel": uri, "lastSeenServerSeq": 0} for uri in named]
        own = await huddle.request(
            "reconnect", {"channel": ROOT_URI, "clientId": "lee-three", "cursors": cursors}
        )
    finally:
        await running.stop()

    for answer in (opened, plain, own):
        assert len(encode(answer["result"])) <= budget
    assert [s["resource"] for s in opened["result"]["snapshots"]] == sessions[:2]
    assert later["resource"] == sessions[2]
    assert [s["resource"] for s in plain["result"]["snapshots"]] == sessions[:2]
    assert [r["channel"] for r in own["result"]["channels"]] == sessions


async def test_a_large_snapshot_costs_its_size_as_over_http() -> None:
    limits = Limits(actions_per_second=0.001, action_burst=2)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        chat = await a_chat_of(running, 2)  # 120 KiB of chat: one action more than half a read
        peer = await Peer.ready(running.ws, running.token(name="lee"), "lee")
        answers = [await peer.request("subscribe", {"channel": chat}) for _ in range(3)]
    finally:
        await running.stop()

    # 2 - 0.5 - 1 (the debt) - 0.5: the third finds no half action left.
    assert ["result" in answer for answer in answers] == [True, True, False]
    assert "rate-limited" in answers[2]["error"]["message"]


async def test_pages_of_sessions_asked_at_once_read_the_store_once() -> None:
    # Every page read and decoded every session (10 MB from Redis for 9,000
    # sessions): a participant's loop of listSessions pinned the server.
    store = RecordReads()
    running = await start_server(Settings(port=0), store)
    try:
        agent = await running.client("agent", name="agent")
        for n in range(3):
            await agent.create_session(f"ahp-session:/listed-{n}")
        peer = await Peer.ready(running.ws, running.token(name="lee"), "lee")
        store.reads.clear()
        pages = [await peer.request("listSessions", {"channel": ROOT_URI}) for _ in range(20)]
        whole_reads = [read for read in store.reads if read[1] == "*"]
        await agent.create_session("ahp-session:/listed-3")  # this process changed it
        after = await peer.request("listSessions", {"channel": ROOT_URI})
    finally:
        await running.stop()

    assert all(len(page["result"]["items"]) == 3 for page in pages)
    assert len(whole_reads) <= 2  # once, and again only if a second passed
    assert len(after["result"]["items"]) == 4


async def test_initialize_is_refused_while_its_token_is_in_debt() -> None:
    # Snapshots are charged after the answer: a loop of initialize naming
    # large chats ran up a debt nothing ever refused (a core pinned).
    limits = Limits(actions_per_second=0.001, action_burst=2)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        chat = await a_chat_of(running, 2)  # 120 KiB of chat: a snapshot costs 1.5
        token = running.token(name="lee")
        answers = []
        for _ in range(3):
            peer = await Peer.open(running.ws, token, "lee")
            params = initialize_params("lee", extensions=()) | {"initialSubscriptions": [chat]}
            answers.append(await peer.request("initialize", params))
            await peer.ws.close()
    finally:
        await running.stop()

    assert ["result" in answer for answer in answers] == [True, True, False]  # 2, 0.5, -1
    assert answers[2]["error"]["code"] == -32011
    assert "rate-limited" in answers[2]["error"]["message"]


async def test_initialize_looks_at_no_more_channels_than_it_may_subscribe_to() -> None:
    running = await start_server(Settings(port=0, limits=Limits(max_subscriptions=5)))
    try:
        chat = await a_chat(running)
        gone = [f"ahp-chat:/gone-{n}" for n in range(5)]
        peer = await Peer.open(running.ws, running.token(name="lee"), "lee")
        params = initialize_params("lee", extensions=()) | {"initialSubscriptions": [*gone, chat]}
        opened = await peer.request("initialize", params)
        back = await Peer.open(running.ws, running.token(name="lee"), "lee-too")
        many = [*(f"ahp-chat:/gone-{n}" for n in range(11)), chat]
        refused = await back.request(
            "reconnect",
            plain_reconnect("lee-too", many),
        )
    finally:
        await running.stop()

    assert opened["result"]["snapshots"] == []  # the chat came sixth: beyond what is read
    assert refused["error"]["code"] == -32009
    assert "this reconnect names 12" in refused["error"]["message"]
