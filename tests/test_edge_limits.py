"""The edge under abuse: malformed frames, oversized ids, oversized and
binary frames, floods, too many subscriptions, and a client that stops
reading.

Each abuse gets the answer DESIGN.md gives it (a JSON-RPC error, a
``rate-limited`` rejection, or a close code) and costs nobody else anything:
afterwards a fresh client still connects and works.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from protocol.actions import ChatDraftChanged
from protocol.session import SessionState
from protocol.uris import ROOT_URI
from reducers.limits import SizeLimits
from server.auth import Role
from server.config import Limits, Settings
from server.edge.rpc import Rpc
from server.ratelimit import SOCKETS
from tests.conftest import UNIT, RecordReads, RunningServer, start_server, user_message
from tests.edge import (
    Frame,
    Peer,
    StalledPeer,
    assert_still_serving,
    http,
    initialize_params,
    plain_reconnect,
    rpc,
)

SESSION = "ahp-session:/edge-limits"


async def session_chat(running: RunningServer) -> str:
    """Create the test's session; its default chat."""
    agent = await running.client("agent", name="setup")
    await agent.create_session(SESSION)
    mirror = await agent.subscribe(SESSION)
    assert isinstance(mirror.state, SessionState)
    assert mirror.state.default_chat is not None
    return mirror.state.default_chat


def draft(text: str) -> ChatDraftChanged:
    """An action with no validation rule: accepted unless a limit says no."""
    return ChatDraftChanged(draft=user_message(text))


@pytest.fixture
async def limited() -> AsyncIterator[RunningServer]:
    """A server with small limits: 4 KiB frames, a burst of 5 actions and
    (practically) no refill (a subscribe takes half an action of it), 2
    subscriptions, close after 5 limited in a row."""
    settings = Settings(
        port=0,
        max_frame_bytes=4096,
        limits=Limits(
            actions_per_second=0.001, action_burst=5, max_subscriptions=2, flood_close_after=5
        ),
    )
    running = await start_server(settings)
    try:
        yield running
    finally:
        await running.stop()


# ─── Malformed frames ────────────────────────────────────────────────────────

TURN_STARTED_WITH_NUMBER_ID = {
    "type": "chat/turnStarted",
    "turnId": 5,
    "startedAt": "2026-11-30T10:00:00.000Z",
    "message": {"text": "hi", "origin": {"kind": "user"}},
}
"""``turnId`` must be a string."""


def dispatch_frame(action: Any) -> Frame:
    params = {"channel": "ahp-chat:/anything", "clientSeq": 1, "action": action}
    return rpc("dispatchAction", params)


BAD_FRAMES: list[Any] = [
    pytest.param('{"jsonrpc": "2.0", "id": 1, "method": ', -32700, None, None, id="not-json"),
    pytest.param("[1, 2, 3]", -32600, None, "$", id="an-array"),
    pytest.param('"ping"', -32600, None, "$", id="a-string"),
    pytest.param(
        {"id": 1, "method": "ping", "params": {"channel": ROOT_URI}},
        -32600,
        None,
        "$",
        id="no-jsonrpc-member",
    ),
    pytest.param(
        {"jsonrpc": "1.0", "id": 1, "method": "ping", "params": {"channel": ROOT_URI}},
        -32600,
        None,
        "$.jsonrpc",
        id="wrong-jsonrpc-version",
    ),
    pytest.param(rpc("frobnicate", {}, 7), -32601, 7, None, id="unknown-method"),
    pytest.param(rpc("frobnicate", {}), -32601, None, None, id="unknown-notification"),
    pytest.param(
        {"jsonrpc": "2.0", "id": 8, "method": "subscribe"},
        -32602,
        8,
        "$.params",
        id="subscribe-without-params",
    ),
    pytest.param(
        rpc("subscribe", {"channel": 42}, 9), -32602, 9, "$.params.channel", id="channel-not-a-str"
    ),
    pytest.param(
        rpc("subscribe", {"channel": "http://example.com"}, 10),
        -32602,
        10,
        "$.params.channel",
        id="channel-not-a-channel-uri",
    ),
    pytest.param(
        rpc("dispatchAction", {"channel": ROOT_URI, "clientSeq": 1, "action": {}}, 11),
        -32600,
        11,
        None,
        id="dispatch-with-an-id",
    ),
]


@pytest.mark.parametrize(("frame", "code", "request_id", "path"), BAD_FRAMES)
async def test_bad_frame_gets_a_json_rpc_error(
    huddle: RunningServer, frame: Frame | str, code: int, request_id: int | None, path: str | None
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(), "sloppy")

    await peer.send(frame)

    reply = await peer.receive()
    assert reply["jsonrpc"] == "2.0"
    assert reply["id"] == request_id
    assert reply["error"]["code"] == code
    assert (reply["error"].get("data") or {}).get("path") == path


@pytest.mark.parametrize(("frame", "code", "request_id", "path"), BAD_FRAMES)
async def test_connection_keeps_working_after_a_bad_frame(
    huddle: RunningServer, frame: Frame | str, code: int, request_id: int | None, path: str | None
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(), "sloppy")
    await peer.send(frame)
    assert (await peer.receive())["error"]["code"] == code

    pong = await peer.request("ping", {"channel": ROOT_URI})
    assert "error" not in pong
    assert pong["result"] is None
    await assert_still_serving(huddle, SESSION)


DEEP = "[" * 62 + "]" * 62
"""62 arrays in params in a frame: 64 deep, as deep as a peer may nest."""


def too_deep(trees: int) -> str:
    """A ping nested one level too deep, ``trees`` times over: a parse error."""
    params = '{"channel":"ahp-root://","x":[' + ",".join(["[" + DEEP + "]"] * trees) + "]}"
    return '{"jsonrpc":"2.0","id":1,"method":"ping","params":' + params + "}"


@pytest.mark.parametrize(
    ("frame", "answers"),
    [
        pytest.param(too_deep(1), 5, id="too-deep"),
        pytest.param('{"jsonrpc": "2.0", "id": 1, "method": ', 5, id="not-json"),
        pytest.param(rpc("frobnicate", {}, 7), 5, id="unknown-method"),
        # No echo for a channel that does not exist.
        pytest.param(dispatch_frame(TURN_STARTED_WITH_NUMBER_ID), 0, id="undecodable-action"),
    ],
)
async def test_malformed_frames_in_a_row_close_with_1008(
    limited: RunningServer, frame: Frame | str, answers: int
) -> None:
    peer = await Peer.ready(limited.ws, limited.token(role="observer"), "junk")

    for _ in range(5):  # flood_close_after
        await peer.send(frame)

    assert await peer.close_code() == 1008
    assert len(peer.backlog) == answers
    await assert_still_serving(limited, "ahp-session:/after-the-junk")


async def test_a_good_frame_between_malformed_ones_keeps_the_connection(
    limited: RunningServer,
) -> None:
    peer = await Peer.ready(limited.ws, limited.token(role="observer"), "clumsy")

    for _ in range(6):
        for _ in range(2):  # a good frame halves the weight: 2, 1, 3, 1, 3, ...
            await peer.send(too_deep(1))
        assert "result" in await peer.request("ping", {"channel": ROOT_URI})

    errors = [frame["error"]["message"] for frame in peer.backlog]
    assert errors == ["JSON nested deeper than 64 levels"] * 12


async def test_a_ping_between_floods_of_malformed_frames_buys_little(
    limited: RunningServer,
) -> None:
    peer = await Peer.ready(limited.ws, limited.token(role="observer"), "flooder")

    for _ in range(4):  # one short of flood_close_after
        await peer.send(too_deep(1))
    assert "result" in await peer.request("ping", {"channel": ROOT_URI})  # 4 -> 2
    for _ in range(3):
        await peer.send(too_deep(1))

    assert await peer.close_code() == 1008


@pytest.fixture
async def roomy() -> AsyncIterator[RunningServer]:
    """1 MiB frames (the default), close after 100 malformed in a row."""
    settings = Settings(port=0, limits=Limits(flood_close_after=100))
    running = await start_server(settings)
    try:
        yield running
    finally:
        await running.stop()


async def test_big_malformed_frames_close_sooner_than_small_ones(roomy: RunningServer) -> None:
    big = await Peer.ready(roomy.ws, roomy.token(role="observer"), "big-junk")
    frame = too_deep(4000)  # 496 KiB: weighs 1 + 31, four of them 128
    assert 31 * 16384 < len(frame) < 32 * 16384

    for _ in range(4):
        await big.send(frame)

    assert await big.close_code() == 1008
    assert len(big.backlog) == 4
    small = await Peer.ready(roomy.ws, roomy.token(role="observer"), "small-junk")
    for _ in range(99):  # one each: short of 100
        await small.send(too_deep(1))
    assert "result" in await small.request("ping", {"channel": ROOT_URI})


# ─── Initialization ──────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(rpc("subscribe", {"channel": ROOT_URI}, 1), id="subscribe"),
        pytest.param(rpc("listSessions", {"channel": ROOT_URI}, 1), id="list-sessions"),
        pytest.param(dispatch_frame({"type": "chat/draftChanged"}), id="dispatch-action"),
    ],
)
async def test_request_before_initialize_is_an_error(huddle: RunningServer, frame: Frame) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(), "hasty")

    await peer.send(frame)

    reply = await peer.receive()
    assert reply["id"] == frame.get("id")
    assert reply["error"]["code"] == -32600
    assert "initialize" in reply["error"]["message"]


async def test_initialize_without_a_shared_version_is_refused(huddle: RunningServer) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(), "time-traveller")

    reply = await peer.request("initialize", initialize_params("tt", ("0.1.0", "9.9.9")))

    assert reply["error"]["code"] == -32005
    assert "0.7.0" in reply["error"]["message"]


async def test_a_version_mismatch_says_what_is_served_and_closes(huddle: RunningServer) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(), "time-traveller")
    reply = await peer.request("initialize", initialize_params("tt", ("9.9.9",)))

    assert reply["error"]["code"] == -32005
    assert reply["error"]["data"] == {"supportedVersions": ["0.7.0"]}
    assert await peer.close_code() == 1000
    again = await Peer.open(huddle.ws, huddle.token(), "time-traveller")
    assert "result" in await again.request("initialize", initialize_params("tt"))


async def test_initialize_leaves_out_an_initial_subscription_that_is_gone(
    huddle: RunningServer,
) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(), "hopeful")
    params = {**initialize_params("hopeful"), "initialSubscriptions": [ROOT_URI, "ahp-chat:/gone"]}

    reply = await peer.request("initialize", params)

    assert [s["resource"] for s in reply["result"]["snapshots"]] == [ROOT_URI]
    (connection,) = huddle.server.connections
    assert connection.subscriptions == {ROOT_URI}


# ─── Ids ─────────────────────────────────────────────────────────────────────

ID_LIMIT = SizeLimits().id


def client_id_params(method: str, client_id: str) -> Frame:
    """``initialize`` or (as a new socket's first request) ``reconnect``."""
    if method == "initialize":
        return initialize_params(client_id)
    return {"channel": ROOT_URI, "clientId": client_id, "lastSeenServerSeq": 0, "subscriptions": []}


@pytest.mark.parametrize("role", ["participant", "observer"])
@pytest.mark.parametrize("method", ["initialize", "reconnect"])
async def test_a_client_id_over_the_id_limit_is_refused_and_kept_nowhere(
    huddle: RunningServer, method: str, role: Role
) -> None:
    too_long = "c" * (ID_LIMIT + 1)
    peer = await Peer.open(huddle.ws, huddle.token(role, name="mallory"))

    reply = await peer.request(method, client_id_params(method, too_long))

    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"] == {"path": "$.params.clientId"}
    assert "the clientId is 257 bytes; the limit is 256" in reply["error"]["message"]
    assert await huddle.server.parts.host.store.claim(f"client:{too_long}", "another", 60) is None
    assert "result" in await peer.request("initialize", initialize_params("mallory-1"))


@pytest.mark.parametrize("method", ["initialize", "reconnect"])
async def test_a_client_id_with_a_control_character_is_refused_and_kept_nowhere(
    huddle: RunningServer, method: str
) -> None:
    # The store sets a plain connection's scope off its clientId with one
    # (server.core.channels.origin_key): a clientId holding it could name its
    # actions as another connection's.
    forged = "alice\x1f0123456789ab"
    peer = await Peer.open(huddle.ws, huddle.token(name="mallory"))

    reply = await peer.request(method, client_id_params(method, forged))

    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"] == {"path": "$.params.clientId"}
    assert "the clientId holds the control character U+001F" in reply["error"]["message"]
    assert await huddle.server.parts.host.store.claim(f"client:{forged}", "another", 60) is None


async def test_a_client_id_is_measured_in_utf8_bytes(huddle: RunningServer) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(name="mallory"))

    reply = await peer.request("initialize", initialize_params("é" * (ID_LIMIT // 2 + 1)))

    assert "the clientId is 258 bytes; the limit is 256" in reply["error"]["message"]


async def test_a_client_id_at_the_id_limit_is_served(huddle: RunningServer) -> None:
    chat = await session_chat(huddle)
    peer = await Peer.ready(huddle.ws, huddle.token(name="verbose"), "c" * ID_LIMIT)
    await peer.subscribe(chat)

    await peer.dispatch(chat, draft("hi"))

    envelope = await peer.envelope()
    assert envelope.get("rejectionReason") is None
    assert envelope["origin"]["clientId"] == "c" * ID_LIMIT


async def test_completions_of_requests_never_asked_read_no_form() -> None:
    """A rejected ``chat/inputCompleted`` costs no form read and no cache
    entry, and a request id over the id limit is refused as too large."""
    store = RecordReads()
    running = await start_server(Settings(port=0), store)
    try:
        chat = await session_chat(running)
        peer = await Peer.ready(running.ws, running.token(name="mallory"), "mallory")
        await peer.subscribe(chat)
        ids = [f"{n}-" + "r" * 200 for n in range(3)] + ["r" * 900_000]

        for request_id in ids:
            await peer.dispatch(
                chat, {"type": "chat/inputCompleted", "requestId": request_id, "response": "cancel"}
            )
        reasons = [(await peer.envelope())["rejectionReason"] for _ in ids]

        assert [r.partition(":")[0] for r in reasons[:3]] == ["no-open-input-request"] * 3
        assert reasons[3] == "too-large: the requestId is 900,000 bytes; the limit is 256"
        assert [key for kind, key in store.reads if kind == "form"] == []
    finally:
        await running.stop()


# ─── Frames the socket does not take ─────────────────────────────────────────


async def test_a_persons_token_starts_only_so_many_client_ids(huddle: RunningServer) -> None:
    # Each client id is kept for the token's lifetime: an observer opening
    # sockets with fresh ids filled the store at 500 a second.
    token = huddle.token(role="observer")

    async def initialize(client_id: str) -> Frame:
        peer = await Peer.open(huddle.ws, token, client_id)
        reply = await peer.request("initialize", initialize_params(client_id))
        await peer.ws.close()
        return reply

    started = [await initialize(f"tab-{n}") for n in range(30)]
    refused = await initialize("tab-30")
    again = await initialize("tab-0")
    other = await Peer.ready(huddle.ws, huddle.token(role="observer"), "tab-31")

    assert all("result" in reply for reply in started)
    assert refused["error"]["code"] == -32011
    assert "started 30 client ids lately" in refused["error"]["message"]
    assert "result" in again  # coming back with its own costs nothing
    assert (await other.request("ping", {"channel": ROOT_URI}))["result"] is None


async def test_a_persons_token_holds_only_so_many_sockets(huddle: RunningServer) -> None:
    # Each socket may leave the send buffer unread (4 MiB): 600 slow sockets
    # of one token held 3.3 GB.
    token = huddle.token()
    held = [await Peer.open(huddle.ws, token, f"s{n}") for n in range(SOCKETS)]

    with pytest.raises(InvalidStatus) as refused:
        await Peer.open(huddle.ws, token, "one-more")
    other = await Peer.ready(huddle.ws, huddle.token(), "another-token")

    assert refused.value.response.status_code == 429
    assert b"at most 32 connections at once per token" in refused.value.response.body
    assert (await other.request("ping", {"channel": ROOT_URI}))["result"] is None
    assert (await held[0].request("ping", {"channel": ROOT_URI}))["result"] is None


async def test_oversized_frame_closes_with_1009(limited: RunningServer) -> None:
    bystander = await limited.client("agent", name="bystander")
    peer = await Peer.ready(limited.ws, limited.token(), "bulky")

    await peer.send(rpc("ping", {"channel": ROOT_URI, "pad": "x" * 5000}, 2))

    assert await peer.close_code() == 1009
    assert await bystander.call("ping", {"channel": ROOT_URI}) is None
    await assert_still_serving(limited, SESSION)


async def test_frame_under_the_limit_is_served(limited: RunningServer) -> None:
    peer = await Peer.ready(limited.ws, limited.token(), "bulky")

    pong = await peer.request("ping", {"channel": ROOT_URI, "pad": "x" * 3000})

    assert pong["result"] is None


async def test_binary_frame_closes_with_1003(huddle: RunningServer) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(), "binary")

    await peer.ws.send(b'{"jsonrpc": "2.0", "id": 2, "method": "ping"}')

    assert await peer.close_code() == 1003
    await assert_still_serving(huddle, SESSION)


# ─── Floods ──────────────────────────────────────────────────────────────────


async def test_actions_beyond_the_burst_are_rejected_as_rate_limited(
    limited: RunningServer,
) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(), "eager")
    seq = (await peer.subscribe(chat))["fromSeq"]  # half an action: 4.5 left

    for n in range(5):
        await peer.dispatch(chat, draft(f"draft {n}"))
    echoes = [await peer.envelope() for _ in range(5)]

    assert [e.get("rejectionReason") for e in echoes[:4]] == [None] * 4
    assert [e["serverSeq"] for e in echoes] == [seq + 1, seq + 2, seq + 3, seq + 4, seq + 4]
    assert echoes[4]["rejectionReason"].startswith("rate-limited: ")


async def test_one_tokens_rate_limit_does_not_hold_back_another(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    eager = await Peer.ready(limited.ws, limited.token(), "eager")
    await eager.subscribe(chat)
    for n in range(6):
        await eager.dispatch(chat, draft(f"draft {n}"))
    assert (await eager.request("ping", {"channel": ROOT_URI}))["result"] is None
    calm = await limited.client(name="calm")
    await calm.subscribe(chat)

    envelope = await calm.dispatch_and_wait(chat, draft("my turn"))

    assert envelope.rejection_reason is None
    await assert_still_serving(limited, "ahp-session:/after-the-flood")


async def test_a_tokens_sockets_share_one_budget(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    token = limited.token(name="many")
    peers = [await Peer.ready(limited.ws, token, f"socket-{n}") for n in range(4)]
    for peer in peers:
        await peer.subscribe(chat)

    for peer in peers:
        await peer.dispatch(chat, draft(f"from {peer.client_id}"))

    async def own_echo(peer: Peer) -> Frame:
        while (envelope := await peer.envelope())["origin"]["clientId"] != peer.client_id:
            pass
        return envelope

    reasons = [(await own_echo(peer)).get("rejectionReason") for peer in peers]
    assert reasons[:3] == [None, None, None]  # the burst of 5, shared, less 4 subscribes
    assert str(reasons[3]).startswith("rate-limited: at most 0.001 actions a second per token")


async def test_the_browsers_of_one_shared_link_share_its_budget(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    shared = limited.authority.mint(
        "participant", expires_at=time.time() + 60, shared=True, name="participant"
    )
    tokens = [
        (await http("GET", f"{limited.http}/?token={shared}"))
        .headers["Set-Cookie"]
        .split(";")[0]
        .split("=", 1)[1]
        for _ in range(4)
    ]
    peers = [await Peer.ready(limited.ws, token, f"browser-{n}") for n, token in enumerate(tokens)]
    for peer in peers:
        await peer.subscribe(chat)

    for peer in peers:
        await peer.dispatch(chat, draft(f"from {peer.client_id}"))

    async def own_echo(peer: Peer) -> Frame:
        while (envelope := await peer.envelope())["origin"]["clientId"] != peer.client_id:
            pass
        return envelope

    reasons = [(await own_echo(peer)).get("rejectionReason") for peer in peers]
    assert reasons[:3] == [None, None, None]  # the link's burst, shared, less 4 subscribes
    assert str(reasons[3]).startswith("rate-limited: ")


async def test_agent_tokens_have_a_budget_of_their_own(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    agent = await limited.client("agent", name="streamer")
    await agent.subscribe(chat)

    for n in range(20):  # far beyond a participant's burst of 5
        envelope = await agent.dispatch_and_wait(chat, draft(f"delta {n}"))
        assert envelope.rejection_reason is None


async def test_sustained_flood_closes_with_1008(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(), "flooder")

    for n in range(5 + 5):  # the burst, then 5 limited in a row
        await peer.dispatch(chat, draft(f"draft {n}"))

    assert await peer.close_code() == 1008
    reasons = [f["params"].get("rejectionReason", "") for f in peer.backlog]
    assert len(reasons) == 4
    assert all(r.startswith("rate-limited: ") for r in reasons)
    await assert_still_serving(limited, "ahp-session:/after-the-flood")


# ─── Subscriptions ───────────────────────────────────────────────────────────


async def test_subscriptions_beyond_the_limit_are_refused(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(), "collector")
    await peer.subscribe(ROOT_URI)
    await peer.subscribe(SESSION)

    reply = await peer.request("subscribe", {"channel": chat})

    assert reply["error"]["code"] == -32009
    assert "at most 2 subscriptions" in reply["error"]["message"]
    await assert_still_serving(limited, "ahp-session:/after-the-collector")


async def test_subscribing_again_to_the_same_channel_does_not_count(
    limited: RunningServer,
) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(), "collector")
    await peer.subscribe(ROOT_URI)
    await peer.subscribe(ROOT_URI)

    snapshot = await peer.subscribe(chat)

    assert snapshot["resource"] == chat


async def test_unsubscribing_frees_a_subscription(limited: RunningServer) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(), "collector")
    await peer.subscribe(ROOT_URI)
    await peer.subscribe(SESSION)
    await peer.send(rpc("unsubscribe", {"channel": SESSION}))

    snapshot = await peer.subscribe(chat)

    assert snapshot["resource"] == chat


def subscriptions_of(running: RunningServer, name: str) -> set[str]:
    (connection,) = [c for c in running.server.connections if c.grant.name == name]
    return connection.subscriptions


async def test_a_plain_reconnect_beyond_the_limit_is_refused_and_subscribes_nothing(
    limited: RunningServer,
) -> None:
    chat = await session_chat(limited)
    peer = await Peer.open(limited.ws, limited.token(name="hoarder"), "hoarder")

    reply = await peer.request("reconnect", plain_reconnect("hoarder", [ROOT_URI, SESSION, chat]))

    assert reply["error"]["code"] == -32009
    assert "at most 2 subscriptions" in reply["error"]["message"]
    assert subscriptions_of(limited, "hoarder") == set()
    # AHP's reference client falls back to initialize on the same socket:
    # it works, and leaves out what is beyond the limit.
    params = {
        **initialize_params("hoarder", extensions=()),
        "initialSubscriptions": [ROOT_URI, SESSION, chat],
    }
    result = (await peer.request("initialize", params))["result"]
    assert [s["resource"] for s in result["snapshots"]] == [ROOT_URI, SESSION]
    assert subscriptions_of(limited, "hoarder") == {ROOT_URI, SESSION}


async def test_a_plain_reconnect_counts_only_channels_it_reaches_and_does_not_hold(
    limited: RunningServer,
) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(name="returner"), "returner", ())
    await peer.subscribe(ROOT_URI)

    too_many = await peer.request("reconnect", plain_reconnect("returner", [SESSION, chat]))
    held = await peer.request(
        "reconnect", plain_reconnect("returner", [ROOT_URI, SESSION, "ahp-chat:/gone"])
    )

    assert too_many["error"]["code"] == -32009
    assert held["result"]["type"] == "snapshot"
    assert sorted(s["resource"] for s in held["result"]["snapshots"]) == [ROOT_URI, SESSION]
    assert subscriptions_of(limited, "returner") == {ROOT_URI, SESSION}


async def test_a_reconnect_with_cursors_beyond_the_limit_is_refused_and_subscribes_nothing(
    limited: RunningServer,
) -> None:
    chat = await session_chat(limited)
    peer = await Peer.ready(limited.ws, limited.token(name="hoarder"), "hoarder")
    cursors = [{"channel": uri, "lastSeenServerSeq": 0} for uri in (ROOT_URI, SESSION, chat)]

    reply = await peer.request(
        "reconnect", {"channel": ROOT_URI, "clientId": "hoarder", "cursors": cursors}
    )

    assert reply["error"]["code"] == -32009
    assert "at most 2 subscriptions" in reply["error"]["message"]
    assert subscriptions_of(limited, "hoarder") == set()
    within = await peer.request(
        "reconnect", {"channel": ROOT_URI, "clientId": "hoarder", "cursors": cursors[1:]}
    )
    assert [r["channel"] for r in within["result"]["channels"]] == [SESSION, chat]
    assert subscriptions_of(limited, "hoarder") == {SESSION, chat}


# ─── A client that stops reading ─────────────────────────────────────────────

BIG_DRAFT = "x" * (32 << 10)
MAX_FLOOD = 2000
"""The most 32 KiB drafts a flood may take (64 MiB, far beyond any socket
buffer) before the server must have let go of a client that reads nothing."""


@pytest.fixture
async def small_queues() -> AsyncIterator[RunningServer]:
    """A server that lets a client leave 64 KiB unread, and no rate limit."""
    limits = Limits(send_buffer=64 << 10, actions_per_second=1e9, action_burst=10**9)
    running = await start_server(Settings(port=0, limits=limits))
    try:
        yield running
    finally:
        await running.stop()


def connection_of(running: RunningServer, name: str) -> Rpc:
    (connection,) = [c for c in running.server.connections if c.grant.name == name]
    return connection


async def flood_until_dropped(running: RunningServer, chat: str, connection: Rpc) -> int:
    """Dispatch 32 KiB drafts on ``chat`` until the server has let go of
    ``connection``; how many were dispatched."""
    agent = await running.client("agent", name="flooder")
    await agent.subscribe(chat)
    sent = 0
    async with asyncio.timeout(30 * UNIT):
        while connection in running.server.connections:
            assert sent < MAX_FLOOD, f"the server never let go of {connection.grant.name}"
            await agent.dispatch_and_wait(chat, draft(BIG_DRAFT))
            sent += 1
    return sent


class Collector:
    """Every envelope a peer receives, read as fast as they come."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.envelopes: list[Frame] = []
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            self.envelopes.append(await self.peer.envelope())
            self._arrived.set()

    async def until(self, count: int) -> list[Frame]:
        """Wait (at most 5 UNIT) for ``count`` envelopes, then stop reading."""
        async with asyncio.timeout(5 * UNIT):
            while len(self.envelopes) < count:
                self._arrived.clear()
                await self._arrived.wait()
        self._task.cancel()
        return self.envelopes


async def test_others_get_every_envelope_in_order_while_a_client_stalls(
    small_queues: RunningServer,
) -> None:
    running = small_queues
    chat = await session_chat(running)
    token = running.token(name="stalled")
    with await StalledPeer.subscribed(running, token, chat):
        healthy = await Peer.ready(running.ws, running.token(name="healthy"), "healthy")
        start = (await healthy.subscribe(chat))["fromSeq"]
        collector = Collector(healthy)

        sent = await flood_until_dropped(running, chat, connection_of(running, "stalled"))

        envelopes = await collector.until(sent)
    assert [e["serverSeq"] for e in envelopes] == list(range(start + 1, start + sent + 1))
    assert all("rejectionReason" not in e for e in envelopes)
    await assert_still_serving(running, "ahp-session:/after-the-stall")


async def test_stalled_client_is_dropped_with_its_subscriptions(
    small_queues: RunningServer,
) -> None:
    running = small_queues
    chat = await session_chat(running)
    with await StalledPeer.subscribed(running, running.token(name="stalled"), chat):
        stalled = connection_of(running, "stalled")

        await flood_until_dropped(running, chat, stalled)

        assert stalled.connection not in running.server.parts.host.core.subscribers(chat)
        assert not stalled.subscriptions
    metrics = running.server.metrics.render().decode()
    assert "huddle_send_queue_drops_total 1.0" in metrics
    assert f"huddle_connections {len(running.server.connections)}.0" in metrics


async def test_stalled_client_finds_its_socket_closed_when_it_reads_again(
    small_queues: RunningServer,
) -> None:
    running = small_queues
    chat = await session_chat(running)
    with await StalledPeer.subscribed(running, running.token(name="stalled"), chat) as peer:
        sent = await flood_until_dropped(running, chat, connection_of(running, "stalled"))

        leftover = await peer.read_to_end()

    assert len(leftover) < sent * len(BIG_DRAFT)


async def test_a_400_quotes_only_the_start_of_a_huge_value_the_decoder_refused(
    huddle: RunningServer,
) -> None:
    action = {"type": "z" * 100_000}
    reply = await http(
        "POST",
        f"{huddle.http}/api/dispatch",
        token=huddle.token(role="agent"),
        body={"channel": "ahp-chat:/x", "action": action},
    )

    assert reply.status == 400
    assert len(reply.body) < 1_000
    assert "characters)" in reply.json()["error"]


async def test_errors_quote_only_the_start_of_a_huge_uri_or_method(huddle: RunningServer) -> None:
    huge = "ahp-chat:/" + "x" * 100_000
    reply = await http(
        "GET", f"{huddle.http}/api/snapshot?channel={huge}", token=huddle.token(role="agent")
    )
    peer = await Peer.ready(huddle.ws, huddle.token(), "sloppy")
    unknown = await peer.request("y" * 100_000, {})

    assert reply.status == 400
    assert len(reply.body) < 1_000
    assert "(100,010 characters)" in reply.json()["error"]
    assert unknown["error"]["code"] == -32601
    assert len(unknown["error"]["message"]) < 300
    await peer.close()
