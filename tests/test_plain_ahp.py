"""Plain AHP 0.7 clients work unchanged: a client that asks for no Huddle
extension gets exactly AHP's commands, results, errors and notifications,
over a real socket.

:class:`PlainClient` behaves as AHP's reference client does: one
``lastSeenServerSeq`` (the largest ``serverSeq`` it has seen), its own
mirrors reduced with the reducers every AHP client runs, ``reconnect`` as
the first request of a new socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatResponsePart,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionTitleChanged,
    StateAction,
)
from protocol.chat import MarkdownPart
from protocol.codec import convert, convert_state, encode, to_builtins
from protocol.messages import ActionEnvelope, ChannelState
from protocol.uris import ROOT_URI, channel_kind
from reducers import reduce
from server.client import HuddleClient
from server.config import Limits, Settings
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, start_server, user_message
from tests.edge import Frame, Peer, initialize_params, rpc
from tests.redis_server import RedisServer
from tests.test_serve_cli import TOKEN, start

SESSION = "ahp-session:/plain"


class PlainClient:
    """An AHP 0.7 client that asks for nothing Huddle-specific."""

    def __init__(self, url: str, token: str, client_id: str) -> None:
        self.url, self.token, self.client_id = url, token, client_id
        self.peer: Peer | None = None
        self.last_seen = 0
        self.mirrors: dict[str, ChannelState] = {}
        self.seen: list[int] = []

    async def connect(self, subscriptions: list[str]) -> Frame:
        self.peer = await Peer.open(self.url, self.token, self.client_id)
        params = {
            **initialize_params(self.client_id, extensions=()),
            "initialSubscriptions": subscriptions,
        }
        reply = await self.peer.request("initialize", params)
        result: Frame = reply["result"]
        self.last_seen = max(self.last_seen, result["serverSeq"])
        for snapshot in result["snapshots"]:
            self.install(snapshot)
        return result

    def install(self, snapshot: Frame) -> None:
        uri = snapshot["resource"]
        self.mirrors[uri] = convert_state(snapshot["state"], channel_kind(uri))
        self.last_seen = max(self.last_seen, snapshot["fromSeq"])

    @property
    def live(self) -> Peer:
        assert self.peer is not None
        return self.peer

    def apply(self, frame: Frame) -> None:
        """One ``action`` notification, as an AHP mirror applies it."""
        envelope = frame["params"]
        assert envelope["serverSeq"] >= self.last_seen, "serverSeq went back"
        self.last_seen = envelope["serverSeq"]
        if "rejectionReason" in envelope:
            return
        assert envelope["serverSeq"] not in self.seen, "an envelope applied twice"
        self.seen.append(envelope["serverSeq"])
        action: StateAction = convert(envelope["action"], StateAction)  # type: ignore[arg-type]
        uri = envelope["channel"]
        if uri in self.mirrors:
            self.mirrors[uri] = reduce(self.mirrors[uri], action, 0)

    async def drain(self) -> None:
        """Apply every frame until a ping's answer (all sent before it)."""
        reply = await self.live.request("ping", {"channel": ROOT_URI})
        assert "result" in reply
        while self.live.backlog:
            frame = self.live.backlog.popleft()
            if frame.get("method") == "action":
                self.apply(frame)

    def drop(self) -> None:
        self.live.ws.transport.abort()

    async def reconnect(self) -> Frame:
        """AHP's reconnect as the first request on a new socket."""
        self.peer = await Peer.open(self.url, self.token, self.client_id)
        params = {
            "channel": ROOT_URI,
            "clientId": self.client_id,
            "lastSeenServerSeq": self.last_seen,
            "subscriptions": list(self.mirrors),
        }
        reply = await self.live.request("reconnect", params)
        result: Frame = reply["result"]
        if result["type"] == "replay":
            for envelope in result["actions"]:
                self.apply({"method": "action", "params": envelope})
            for uri in result["missing"]:
                del self.mirrors[uri]
        else:
            kept = {s["resource"] for s in result["snapshots"]}
            self.mirrors = {uri: m for uri, m in self.mirrors.items() if uri in kept}
            for snapshot in result["snapshots"]:
                self.install(snapshot)
        return result


def comparable(state: ChannelState) -> Any:
    """A state without ``modifiedAt`` (AHP's reducers stamp the client's clock)."""
    plain = to_builtins(state)
    plain.pop("modifiedAt", None)
    for chat in plain.get("chats", []):
        chat.pop("modifiedAt", None)
    return plain


async def agent_session(running: RunningServer, session: str = SESSION) -> tuple[Any, str]:
    agent = await running.client("agent", name="agent")
    await agent.create_session(session)
    mirror = await agent.subscribe(session)
    chat = mirror.state.default_chat  # type: ignore[union-attr]
    assert chat is not None
    await agent.subscribe(chat)
    return agent, chat


def turn(turn_id: str) -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id=turn_id, started_at="2026-11-30T10:00:00.000Z", message=user_message(turn_id)
    )


async def same_as_server(running: RunningServer, client: PlainClient) -> None:
    """The client's mirrors equal the server's states, once the side effects
    of the last action (the session hears of a chat just after its echo)
    have reached the client too."""

    async def differing() -> list[str]:
        host = running.server.parts.host
        return [
            uri
            for uri, state in client.mirrors.items()
            if comparable(state) != comparable((await host.view(uri)).state)
        ]

    async with asyncio.timeout(5 * UNIT):
        while await differing():
            frame = await client.live.receive()
            if frame.get("method") == "action":
                client.apply(frame)


# ─── initialize ──────────────────────────────────────────────────────────────


async def test_initialize_answers_in_ahps_shape(huddle: RunningServer) -> None:
    _, chat = await agent_session(huddle)
    client = PlainClient(huddle.ws, huddle.token(name="p"), "plain-1")

    result = await client.connect([ROOT_URI, SESSION, chat])

    assert set(result) == {"protocolVersion", "serverSeq", "serverInfo", "snapshots"}
    assert result["serverSeq"] == 0
    assert [s["fromSeq"] for s in result["snapshots"]] == [0, 0, 0]
    await same_as_server(huddle, client)


async def test_extensions_are_used_only_when_asked_and_then_announced(
    huddle: RunningServer,
) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(), "asking")
    params = initialize_params("asking", extensions=("huddle.titles", "x-someone-elses"))

    result = (await peer.request("initialize", params))["result"]

    assert result["_meta"] == {"huddle": {"extensions": ["huddle.titles"]}}


async def test_the_root_says_what_huddles_agents_can_do(huddle: RunningServer) -> None:
    # AHP: without multipleChats a client MUST NOT createChat beyond the
    # default chat, without multipleWorkingDirectories it MUST NOT change a
    # session's or chat's directories; Huddle serves both.
    client = PlainClient(huddle.ws, huddle.token(name="p"), "plain-caps")

    result = await client.connect([ROOT_URI])

    (agent,) = result["snapshots"][0]["state"]["agents"]
    assert agent["capabilities"] == {"multipleChats": {}, "multipleWorkingDirectories": {}}


async def test_create_session_takes_its_working_directories_and_active_client(
    huddle: RunningServer,
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee-1", extensions=())
    me = {"clientId": "lee-1", "displayName": "what I call myself", "tools": []}
    dirs = ["file:///work/a", "file:///work/b", "file:///work/a"]

    created = await peer.request(
        "createSession",
        {"channel": SESSION, "workingDirectories": dirs, "activeClient": me},
    )
    state = (await peer.subscribe(SESSION))["state"]
    (summary,) = (await peer.request("listSessions", {"channel": ROOT_URI}))["result"]["items"]
    chat = "ahp-chat:/in-b"
    made = await peer.request(
        "createChat",
        {"channel": SESSION, "chat": chat, "workingDirectories": ["file:///work/b"]},
    )

    assert created["result"] is None
    assert state["workingDirectories"] == summary["workingDirectories"] == dirs[:2]
    # In the session as AHP's session/activeClientSet would put it, under the
    # name the server knows the token by.
    assert state["activeClients"] == [me | {"displayName": "Lee"}]
    assert made["result"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"activeClient": {"clientId": "someone-else", "tools": []}}, "activeClient.clientId"),
        ({"workingDirectories": ["file:///" + "x" * 2000]}, "workingDirectories"),
        # Forking is not supported: a fork made an empty session, silently.
        ({"fork": {"session": "ahp-session:/other", "turnId": "t1"}}, "fork"),
    ],
)
async def test_create_session_refuses_what_its_actions_would_and_creates_nothing(
    huddle: RunningServer, params: Frame, field: str
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee-1", extensions=())

    refused = await peer.request("createSession", {"channel": SESSION} | params)
    listed = await peer.request("listSessions", {"channel": ROOT_URI})

    assert refused["error"]["code"] == -32602
    assert refused["error"]["data"]["path"] == f"$.params.{field}"
    assert listed["result"]["items"] == []


@pytest.mark.parametrize(
    "source",
    [
        {"kind": "fork", "chat": "ahp-chat:/main", "turnId": "t1"},
        {"kind": "sideChat", "chat": "ahp-chat:/main", "turnId": "t1"},
    ],
)
async def test_a_chat_from_a_source_is_refused_as_the_agents_advertise_none(
    huddle: RunningServer, source: Frame
) -> None:
    # AHP: the host MUST reject a source its agent does not advertise
    # (multipleChats.fork, .sideChat); Huddle made an empty chat instead.
    peer = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee-1", extensions=())
    await peer.request("createSession", {"channel": SESSION})

    refused = await peer.request(
        "createChat", {"channel": SESSION, "chat": "ahp-chat:/forked", "source": source}
    )
    state = (await peer.subscribe(SESSION))["state"]

    assert refused["error"]["code"] == -32602
    assert refused["error"]["data"]["path"] == "$.params.source"
    assert "ahp-chat:/forked" not in [chat["resource"] for chat in state["chats"]]


async def test_a_plain_client_gets_no_title_window_or_page_it_did_not_ask_for(
    huddle: RunningServer,
) -> None:
    agent, chat = await agent_session(huddle)
    for n in range(3):
        await agent.dispatch_and_wait(chat, turn(f"t{n}"))
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    peer = await Peer.ready(huddle.ws, huddle.token(name="p"), "plain", extensions=())

    created = await peer.request(
        "createSession", {"channel": "ahp-session:/titled", "title": "Mine"}
    )
    windowed = await peer.request("subscribe", {"channel": chat, "view": {"turns": 1}})
    fetched = await peer.request("fetchTurns", {"channel": chat})

    assert created["result"] is None
    titled = (await huddle.server.parts.host.view("ahp-session:/titled")).state
    assert titled.title == "New session"  # type: ignore[union-attr]
    assert len(windowed["result"]["snapshot"]["state"]["turns"]) == 3
    assert fetched["result"] == {}


# ─── reconnect ───────────────────────────────────────────────────────────────


async def test_reconnect_first_replays_exactly_what_was_missed(huddle: RunningServer) -> None:
    agent, chat = await agent_session(huddle)
    client = PlainClient(huddle.ws, huddle.token(name="p"), "plain-2")
    await client.connect([ROOT_URI, SESSION, chat])
    await agent.dispatch_and_wait(chat, turn("t1"))
    await client.drain()

    client.drop()
    await agent.dispatch_and_wait(chat, ChatDraftChanged(draft=user_message("while away")))
    await agent.dispatch_and_wait(SESSION, SessionTitleChanged(title="Renamed while away"))
    await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t1", duration=2))
    result = await client.reconnect()

    assert result["type"] == "replay"
    assert result["missing"] == []
    numbers = [e["serverSeq"] for e in result["actions"]]
    assert numbers == sorted(numbers)
    assert len(result["actions"]) >= 3
    await same_as_server(huddle, client)
    # The connection goes on, numbered on from the replay.
    await agent.dispatch_and_wait(chat, turn("t2"))
    await client.drain()
    await same_as_server(huddle, client)


async def test_reconnect_says_missing_for_a_session_disposed_meanwhile(
    huddle: RunningServer,
) -> None:
    agent, chat = await agent_session(huddle)
    client = PlainClient(huddle.ws, huddle.token(name="p"), "plain-3")
    await client.connect([ROOT_URI, SESSION, chat])

    client.drop()
    await agent.call("disposeSession", {"channel": SESSION})
    result = await client.reconnect()

    assert result["type"] == "replay"
    assert sorted(result["missing"]) == sorted([SESSION, chat])
    assert list(client.mirrors) == [ROOT_URI]
    await same_as_server(huddle, client)


async def test_reconnect_with_a_seq_this_process_never_sent_gets_snapshots(
    huddle: RunningServer,
) -> None:
    agent, chat = await agent_session(huddle)
    client = PlainClient(huddle.ws, huddle.token(name="p"), "plain-4")
    await client.connect([SESSION, chat])
    client.drop()
    await agent.dispatch_and_wait(chat, turn("t1"))
    client.last_seen += 1000  # as after a drop from another process

    result = await client.reconnect()

    assert result["type"] == "snapshot"
    assert sorted(s["resource"] for s in result["snapshots"]) == sorted([SESSION, chat])
    assert all(s["fromSeq"] >= client.last_seen - 1000 for s in result["snapshots"])
    await same_as_server(huddle, client)


async def test_reconnect_after_a_gap_beyond_the_replay_window_gets_snapshots() -> None:
    running = await start_server(Settings(port=0, replay_window=5, snapshot_every=5))
    try:
        agent, chat = await agent_session(running)
        client = PlainClient(running.ws, running.token(name="p"), "plain-5")
        await client.connect([chat])
        client.drop()
        for n in range(20):
            await agent.dispatch_and_wait(chat, ChatDraftChanged(draft=user_message(f"{n}")))

        result = await client.reconnect()

        assert result["type"] == "snapshot"
        await same_as_server(running, client)
    finally:
        await running.stop()


async def test_reconnect_with_another_tokens_client_id_is_refused(huddle: RunningServer) -> None:
    client = PlainClient(huddle.ws, huddle.token(name="alice"), "alices-laptop")
    await client.connect([ROOT_URI])
    client.drop()

    mallory = await Peer.open(huddle.ws, huddle.token(name="mallory"), "x")
    reply = await mallory.request(
        "reconnect",
        {
            "channel": ROOT_URI,
            "clientId": "alices-laptop",
            "lastSeenServerSeq": 0,
            "subscriptions": [],
        },
    )

    assert reply["error"]["code"] == -32009


# ─── fetchTurns ──────────────────────────────────────────────────────────────


@pytest.fixture
async def cramped() -> AsyncIterator[RunningServer]:
    """A server whose clients may leave 64 KiB unread: chats get windowed."""
    running = await start_server(Settings(port=0, limits=Limits(send_buffer=64 << 10)))
    try:
        yield running
    finally:
        await running.stop()


async def test_fetch_turns_loads_older_turns_into_the_callers_chat_before_answering(
    cramped: RunningServer,
) -> None:
    agent, chat = await agent_session(cramped)
    for n in range(8):
        began = ChatTurnStarted(
            turn_id=f"t{n}", started_at="2026-11-30T10:00:00Z", message=user_message("x" * 10_000)
        )
        await agent.dispatch_and_wait(chat, began)
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
    client = PlainClient(cramped.ws, cramped.token(name="p"), "plain-6")
    await client.connect([chat])
    state = client.mirrors[chat]
    assert state.turns_next_cursor is not None  # type: ignore[union-attr]
    assert 0 < len(state.turns) < 8  # type: ignore[union-attr]

    while (cursor := client.mirrors[chat].turns_next_cursor) is not None:  # type: ignore[union-attr]
        reply = await client.live.request("fetchTurns", {"channel": chat, "cursor": cursor})
        assert reply["result"] == {}
        loaded = client.live.backlog.popleft()  # it came before the answer
        assert loaded["params"]["action"]["type"] == "chat/turnsLoaded"
        client.apply(loaded)

    assert [t.id for t in client.mirrors[chat].turns] == [f"t{n}" for n in range(8)]  # type: ignore[union-attr]
    await same_as_server(cramped, client)


async def test_fetch_turns_with_an_unknown_cursor_is_invalid_params(huddle: RunningServer) -> None:
    _, chat = await agent_session(huddle)
    peer = await Peer.ready(huddle.ws, huddle.token(name="p"), "plain", extensions=())

    reply = await peer.request("fetchTurns", {"channel": chat, "cursor": "no-such-cursor"})

    assert reply["error"]["code"] == -32602


# ─── Actions and commands ────────────────────────────────────────────────────


async def test_an_action_that_does_not_decode_comes_back_rejected(huddle: RunningServer) -> None:
    _, chat = await agent_session(huddle)
    peer = await Peer.ready(huddle.ws, huddle.token(name="p"), "plain", extensions=())
    await peer.subscribe(chat)
    teleport = {"type": "chat/teleported", "turnId": "t1"}
    missing = {"type": "chat/draftChanged", "draft": {"origin": {"kind": "user"}}}

    await peer.send(rpc("dispatchAction", {"channel": chat, "clientSeq": 1, "action": teleport}))
    await peer.send(rpc("dispatchAction", {"channel": chat, "clientSeq": 2, "action": missing}))
    await peer.send(
        rpc("dispatchAction", {"channel": "ahp-chat:/nowhere", "clientSeq": 3, "action": teleport})
    )

    echoes = [await peer.envelope() for _ in range(2)]
    assert [e["action"] for e in echoes] == [teleport, missing]
    assert [e["origin"] for e in echoes] == [
        {"clientId": "plain", "clientSeq": 1},
        {"clientId": "plain", "clientSeq": 2},
    ]
    assert all(
        e["rejectionReason"].startswith("invalid-action: the action does not decode: ")
        for e in echoes
    )
    # The channel that does not exist: ignored, as AHP says.
    assert "result" in await peer.request("ping", {"channel": ROOT_URI})
    assert not peer.backlog


async def test_dispose_chat_removes_it_from_its_session(huddle: RunningServer) -> None:
    agent, chat = await agent_session(huddle)
    await agent.call("createChat", {"channel": SESSION, "chat": "ahp-chat:/side"})
    watcher = await Peer.ready(huddle.ws, huddle.token(name="w"), "watcher", extensions=())
    await watcher.subscribe(SESSION)
    admin = await Peer.ready(huddle.ws, AGENT_TOKEN, "admin", extensions=())

    disposed = await admin.request("disposeChat", {"channel": "ahp-chat:/side"})
    default = await admin.request("disposeChat", {"channel": chat})
    by_participant = await watcher.request("disposeChat", {"channel": chat})

    assert disposed["result"] is None
    removed = await watcher.envelope()
    assert removed["action"] == {"type": "session/chatRemoved", "chat": "ahp-chat:/side"}
    assert default["error"]["code"] == -32011
    assert by_participant["error"]["code"] == -32009
    session = (await huddle.server.parts.host.view(SESSION)).state
    assert [c.resource for c in session.chats] == [chat]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "method", ["completions", "createTerminal", "resourceRead", "authenticate"]
)
async def test_a_command_huddle_does_not_serve_is_method_not_found(
    huddle: RunningServer, method: str
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(name="p"), "plain", extensions=())

    reply = await peer.request(method, {"channel": ROOT_URI})

    assert reply["error"]["code"] == -32601
    assert "result" in await peer.request("ping", {"channel": ROOT_URI})


def test_envelopes_decode_as_ahp_envelopes() -> None:
    envelope = ActionEnvelope(channel=SESSION, action=SessionTitleChanged(title="x"), server_seq=3)
    assert convert(to_builtins(envelope), ActionEnvelope) == envelope
    assert b'"origin"' not in encode(envelope)


# ─── Two processes on Redis ──────────────────────────────────────────────────


@pytest.mark.redis
async def test_a_plain_client_reconnecting_to_another_process_misses_nothing(
    redis_server: RedisServer,
) -> None:
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": redis_server.url, "HUDDLE_AGENT": "none"}
    first, second = await start(env=env), await start(env=env)
    try:
        url = f"ws://127.0.0.1:{first.port}/ahp"
        agent = await HuddleClient.connect(f"ws://127.0.0.1:{second.port}/ahp", TOKEN)
        await agent.create_session(SESSION)
        session = await agent.subscribe(SESSION)
        chat = session.state.default_chat  # type: ignore[union-attr]
        assert chat is not None
        token = first.link.split("token=", 1)[1]
        client = PlainClient(url, token, "roamer")
        await client.connect([ROOT_URI, SESSION, chat])
        await agent.dispatch_and_wait(chat, turn("t1"))
        await client.drain()

        client.drop()
        await agent.dispatch_and_wait(chat, ChatDraftChanged(draft=user_message("meanwhile")))
        await agent.dispatch_and_wait(SESSION, SessionTitleChanged(title="Elsewhere"))
        client.url = f"ws://127.0.0.1:{second.port}/ahp"
        result = await client.reconnect()

        assert result["type"] == "snapshot"  # the other process never numbered for it
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t1", duration=1))
        servers = [agent.mirrors.get(uri) or await agent.subscribe(uri) for uri in client.mirrors]
        async with asyncio.timeout(5 * UNIT):
            # The session hears of the turn's end just after its echo: drain until it has.
            while any(comparable(m.state) != comparable(client.mirrors[m.uri]) for m in servers):
                frame = await client.live.receive()
                if frame.get("method") == "action":
                    client.apply(frame)
        await agent.close()
    finally:
        for served in (first, second):
            served.process.kill()
            await served.process.wait()


async def test_reconnect_after_missing_more_than_half_the_buffer_of_a_streaming_turn(
    cramped: RunningServer,
) -> None:
    # A streaming turn's parts cannot be windowed: its snapshot may take more
    # than a subscription's share of an answer, and must still be sent.
    agent, chat = await agent_session(cramped)
    began = ChatTurnStarted(
        turn_id="t1", started_at="2026-11-30T10:00:00Z", message=user_message("go")
    )
    await agent.dispatch_and_wait(chat, began)
    part = MarkdownPart(id="m", content="")
    await agent.dispatch_and_wait(chat, ChatResponsePart(turn_id="t1", part=part))
    client = PlainClient(cramped.ws, cramped.token(name="p"), "plain-stream")
    await client.connect([ROOT_URI, SESSION, chat])
    client.drop()
    for _ in range(8):  # 40 KB missed, more than half of 64 KiB
        await agent.dispatch_and_wait(
            chat, ChatDelta(turn_id="t1", part_id="m", content="x" * 5000)
        )

    result = await client.reconnect()

    assert result["type"] == "snapshot"
    assert [s["resource"] for s in result["snapshots"]] == [ROOT_URI, SESSION, chat]
    await same_as_server(cramped, client)
