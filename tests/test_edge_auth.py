"""Who may do what at the edge: roles, session scopes, tokens, origins.

Refusals before the socket opens are HTTP answers to the upgrade request
(401 for a bad token, 403 for a foreign origin); once connected, commands
are refused with JSON-RPC errors and actions with ``forbidden`` rejections.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.requests import HTTPConnection
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus
from websockets.typing import Origin, Subprotocol

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatInputRequested,
    ChatToolCallComplete,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTurnStarted,
    SessionTitleChanged,
    StateAction,
)
from protocol.chat import (
    ChatState,
    InputRequest,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallResult,
)
from protocol.session import SessionState
from protocol.uris import ROOT_URI
from server.auth import Grant, TokenAuthority
from server.client import HuddleClient
from server.config import Settings
from server.edge.app import check_origin
from server.edge.headers import LOOPBACK_NAMES
from server.errors import ActionRejected, AuthError
from tests.conftest import AGENT_TOKEN, RunningServer, start_server, user_message
from tests.edge import Frame, Peer, http, initialize_params

SESSION_A = "ahp-session:/team-a"
SESSION_B = "ahp-session:/team-b"


async def default_chat(agent: HuddleClient, session: str) -> str:
    await agent.create_session(session)
    mirror = await agent.subscribe(session)
    assert isinstance(mirror.state, SessionState)
    assert mirror.state.default_chat is not None
    return mirror.state.default_chat


async def chat_with_turn(huddle: RunningServer) -> str:
    """Session A's chat, with turn ``t1`` active."""
    agent = await huddle.client("agent")
    chat = await default_chat(agent, SESSION_A)
    await agent.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1", started_at="2026-11-30T10:00:00.000Z", message=user_message("Help")
        ),
    )
    return chat


def grant_of(huddle: RunningServer, name: str) -> Grant:
    """The grant the server holds for the connection of ``name``."""
    (grant,) = [c.grant for c in huddle.server.connections if c.grant.name == name]
    return grant


# ─── Roles ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    "action",
    [
        pytest.param(
            ChatInputRequested(request=InputRequest(id="sneaky", message="Your password?")),
            id="input-requested",
        ),
        pytest.param(
            ChatDelta(turn_id="t1", part_id="p1", content="I am the agent"),
            id="delta",
        ),
    ],
)
async def test_participant_cannot_dispatch_server_only_actions(
    huddle: RunningServer, action: StateAction
) -> None:
    chat = await chat_with_turn(huddle)
    participant = await Peer.ready(huddle.ws, huddle.token("participant"), "alice")
    snapshot = await participant.subscribe(chat)

    await participant.dispatch(chat, action)

    echo = await participant.envelope()
    assert echo["rejectionReason"].startswith("forbidden: ")
    assert echo["serverSeq"] == snapshot["fromSeq"]
    assert (await huddle.server.host.view(chat)).seq == snapshot["fromSeq"]


async def test_another_session_looks_to_a_scoped_token_as_one_that_does_not_exist(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent")
    await default_chat(agent, SESSION_A)
    chat_b = await default_chat(agent, SESSION_B)
    scoped = await Peer.ready(huddle.ws, huddle.token("participant", [SESSION_A]), "scoped")

    for channel, missing in ((SESSION_B, "ahp-session:/never"), (chat_b, "ahp-chat:/never")):
        there = await scoped.request("subscribe", {"channel": channel})
        nowhere = await scoped.request("subscribe", {"channel": missing})
        assert (
            there["error"]["code"]
            == nowhere["error"]["code"]
            == (-32001 if channel == SESSION_B else -32008)
        )
        assert there["error"]["message"].replace(channel, "X") == nowhere["error"][
            "message"
        ].replace(missing, "X")


async def test_scoped_participant_reaches_its_own_session(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    chat_a = await default_chat(agent, SESSION_A)
    scoped = await Peer.ready(huddle.ws, huddle.token("participant", [SESSION_A]), "scoped")

    for channel in (SESSION_A, chat_a):
        snapshot = await scoped.subscribe(channel)
        assert snapshot["resource"] == channel


async def test_scoped_participant_cannot_dispatch_to_another_session(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent")
    await default_chat(agent, SESSION_A)
    chat_b = await default_chat(agent, SESSION_B)
    before = (await huddle.server.host.view(chat_b)).seq
    scoped = await Peer.ready(huddle.ws, huddle.token("participant", [SESSION_A]), "scoped")

    await scoped.dispatch(chat_b, ChatDraftChanged(draft=user_message("let me in")))
    await scoped.dispatch(SESSION_B, SessionTitleChanged(title="mine now"))

    # As for a channel that does not exist (AHP: ignored): no echo, so no
    # seq either; the ping's answer is the next frame.
    assert "result" in await scoped.request("ping", {"channel": "ahp-root://"})
    assert not scoped.backlog
    assert (await huddle.server.host.view(chat_b)).seq == before


async def test_observer_can_subscribe(huddle: RunningServer) -> None:
    chat = await chat_with_turn(huddle)
    observer = await Peer.ready(huddle.ws, huddle.token("observer"), "observer")

    snapshot = await observer.subscribe(chat)

    assert snapshot["state"]["activeTurn"]["id"] == "t1"


@pytest.mark.parametrize(
    ("channel", "action"),
    [
        pytest.param("chat", ChatDraftChanged(draft=user_message("hi")), id="draft-changed"),
        pytest.param(
            "chat",
            ChatTurnStarted(
                turn_id="t2", started_at="2026-11-30T10:00:00.000Z", message=user_message("hi")
            ),
            id="turn-started",
        ),
        pytest.param("chat", ChatDelta(turn_id="t1", part_id="p", content="x"), id="delta"),
        pytest.param("session", SessionTitleChanged(title="observed"), id="title-changed"),
    ],
)
async def test_observer_cannot_dispatch_anything(
    huddle: RunningServer, channel: str, action: StateAction
) -> None:
    chat = await chat_with_turn(huddle)
    uri = chat if channel == "chat" else SESSION_A
    observer = await Peer.ready(huddle.ws, huddle.token("observer"), "observer")
    snapshot = await observer.subscribe(uri)

    await observer.dispatch(uri, action)

    echo = await observer.envelope()
    assert echo["rejectionReason"] == "forbidden: observers may not dispatch actions"
    assert echo["serverSeq"] == snapshot["fromSeq"]


# ─── Tokens ──────────────────────────────────────────────────────────────────


def forged(huddle: RunningServer) -> str:
    token = huddle.token("participant")
    return token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")


def expired(huddle: RunningServer) -> str:
    return huddle.authority.mint("participant", expires_at=time.time() - 1)


def foreign(huddle: RunningServer) -> str:
    other = TokenAuthority("another-agent-token-0123456789")
    return other.mint("agent", expires_at=time.time() + 3600)


REFUSED_TOKENS: list[Any] = [
    pytest.param(lambda h: None, id="missing"),
    pytest.param(lambda h: "", id="empty-bearer"),
    pytest.param(forged, id="forged-signature"),
    pytest.param(expired, id="expired"),
    pytest.param(foreign, id="signed-by-another-server"),
    pytest.param(lambda h: "hud1.not-base64!.sig", id="malformed"),
    pytest.param(lambda h: AGENT_TOKEN + "x", id="agent-token-plus-one"),
]


@pytest.mark.parametrize("make_token", REFUSED_TOKENS)
async def test_bad_token_is_refused_with_401_before_the_socket_opens(
    huddle: RunningServer, make_token: Any
) -> None:
    token = make_token(huddle)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    with pytest.raises(InvalidStatus) as refused:
        await connect(huddle.ws, additional_headers=headers, proxy=None)

    assert refused.value.response.status_code == 401
    assert not huddle.server.connections


async def test_foreign_origin_is_refused_with_403(huddle: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}

    with pytest.raises(InvalidStatus) as refused:
        await connect(
            huddle.ws, additional_headers=headers, origin=Origin("https://evil.example"), proxy=None
        )

    assert refused.value.response.status_code == 403
    assert not huddle.server.connections


ORIGINS: list[Any] = [
    pytest.param("localhost:8765", "http://localhost:8765", LOOPBACK_NAMES, True, id="own"),
    pytest.param("[::1]:8765", "https://[::1]:8765", LOOPBACK_NAMES, True, id="own-ipv6"),
    pytest.param(
        "rebound.example:8765",
        "http://rebound.example:8765",
        LOOPBACK_NAMES,
        False,
        id="rebound-name-vouching-for-itself",
    ),
    pytest.param(
        "localhost:8765", "http://localhost:3000", LOOPBACK_NAMES, False, id="another-port"
    ),
    pytest.param(
        "rebound.example:8765",
        "https://app.example",
        LOOPBACK_NAMES,
        True,
        id="on-the-origin-allow-list",
    ),
    pytest.param(
        "rebound.example:8765",
        "http://rebound.example:8765",
        None,
        True,
        id="no-host-allow-list-nothing-to-check-against",
    ),
]


@pytest.mark.parametrize(("host", "origin", "hosts", "accepted"), ORIGINS)
def test_an_origin_is_the_servers_own_only_with_a_host_on_the_allow_list(
    host: str, origin: str, hosts: tuple[str, ...] | None, accepted: bool
) -> None:
    """The Origin check on its own (the Host guard in front refuses such a
    Host too): a rebound page's Host is its own name and vouches for
    nothing."""
    headers = [(b"host", host.encode()), (b"origin", origin.encode())]
    request = HTTPConnection({"type": "http", "headers": headers})

    if accepted:
        check_origin(request, ("https://app.example",), hosts)
    else:
        with pytest.raises(AuthError) as refused:
            check_origin(request, ("https://app.example",), hosts)
        assert refused.value.status == 403


@pytest.mark.parametrize("origin", ["http://huddle.test", "http://rebound.example"])
async def test_a_rebound_page_reaches_nothing_with_an_allow_list(origin: str) -> None:
    running = await start_server(Settings(port=0, allowed_hosts=("huddle.test",)))
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            reply = await http.get(
                f"{running.http}/api/snapshot",
                params={"channel": ROOT_URI},
                headers={
                    "Host": f"{urlsplit(origin).hostname}:{running.port}",
                    "Origin": f"{origin}:{running.port}",
                    "Authorization": f"Bearer {AGENT_TOKEN}",
                },
            )
    finally:
        await running.stop()

    assert reply.status_code == (200 if origin == "http://huddle.test" else 400)


async def test_own_origin_is_accepted(huddle: RunningServer) -> None:
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    own = Origin(f"http://127.0.0.1:{huddle.port}")

    async with connect(huddle.ws, additional_headers=headers, origin=own, proxy=None) as ws:
        await ws.send('{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"channel": "x"}}')
        assert '"result"' in str(await ws.recv())


async def test_token_is_accepted_as_bearer_header(huddle: RunningServer) -> None:
    token = huddle.token("participant", [SESSION_A], name="carol")

    peer = await Peer.ready(huddle.ws, token, "carol")

    assert grant_of(huddle, "carol") == huddle.authority.verify(token, 0)
    await peer.close()


async def test_token_is_accepted_as_subprotocol_and_ahp_is_selected(
    huddle: RunningServer,
) -> None:
    token = huddle.token("participant", [SESSION_A], name="carol")
    offered = [Subprotocol("ahp"), Subprotocol(f"huddle.token.{token}")]

    async with connect(huddle.ws, subprotocols=offered, proxy=None) as ws:
        assert ws.subprotocol == "ahp"
        peer = Peer(ws, "carol")
        reply = await peer.request("initialize", initialize_params("carol"))
        assert "result" in reply
        assert grant_of(huddle, "carol") == huddle.authority.verify(token, 0)


async def test_token_subprotocol_is_never_echoed_back(huddle: RunningServer) -> None:
    token = huddle.token("participant", name="carol")

    async with connect(
        huddle.ws, subprotocols=[Subprotocol(f"huddle.token.{token}")], proxy=None
    ) as ws:
        assert ws.subprotocol is None
        assert ws.response is not None
        assert "huddle.token" not in str(ws.response.headers)


async def test_index_with_token_sets_the_cookie_and_redirects(huddle: RunningServer) -> None:
    token = huddle.token("participant", name="carol")

    reply = await http("GET", f"{huddle.http}/?token={token}")

    assert reply.status == 303
    assert reply.headers["Location"] == "/"
    cookie = reply.headers["Set-Cookie"]
    attributes = [a.strip().lower() for a in cookie.split(";")]
    assert attributes[0] == f"huddle_token={token}".lower()
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    assert "path=/" in attributes


async def test_every_browser_opening_a_shared_link_gets_a_token_of_its_own(
    huddle: RunningServer,
) -> None:
    shared = huddle.authority.mint(
        "participant", sessions=[SESSION_A], expires_at=time.time() + 60, shared=True
    )

    cookies = [
        (await http("GET", f"{huddle.http}/?token={shared}")).headers["Set-Cookie"]
        for _ in range(2)
    ]

    tokens = [cookie.split(";")[0].split("=", 1)[1] for cookie in cookies]
    grants = [huddle.authority.verify(t, time.time()) for t in [shared, *tokens]]
    assert len({g.token_id for g in grants}) == 3
    assert {(g.role, g.sessions, g.shared, g.expires_at) for g in grants} == {
        ("participant", frozenset({SESSION_A}), True, grants[0].expires_at)
    }
    # Their rate budget stays the link's: opening it again buys no more.
    assert {g.budget_key for g in grants} == {grants[0].token_id}


async def test_token_is_accepted_from_the_cookie(huddle: RunningServer) -> None:
    token = huddle.token("participant", [SESSION_A], name="carol")
    reply = await http("GET", f"{huddle.http}/?token={token}")
    cookie = reply.headers["Set-Cookie"].split(";")[0]

    async with connect(huddle.ws, additional_headers={"Cookie": cookie}, proxy=None) as ws:
        peer = Peer(ws, "carol")
        reply_frame = await peer.request("initialize", initialize_params("carol"))
        assert "result" in reply_frame
        assert grant_of(huddle, "carol") == huddle.authority.verify(token, 0)


# ─── Scopes beyond subscribe and dispatch ────────────────────────────────────


async def test_scoped_agent_cannot_dispose_another_session(huddle: RunningServer) -> None:
    agent = await huddle.client("agent")
    await default_chat(agent, SESSION_A)
    await default_chat(agent, SESSION_B)
    token = huddle.authority.mint("agent", sessions=[SESSION_A], expires_at=time.time() + 60)
    scoped = await Peer.ready(huddle.ws, token, "scoped-agent")

    reply = await scoped.request("disposeSession", {"channel": SESSION_B})

    assert reply["error"]["code"] == -32001  # as if there were no such session
    assert SESSION_B in {s["resource"] for s in await agent.list_sessions()}


async def test_scoped_participant_hears_nothing_of_other_sessions_on_the_root_channel(
    huddle: RunningServer,
) -> None:
    scoped = await Peer.ready(huddle.ws, huddle.token("participant", [SESSION_A]), "scoped")
    await scoped.subscribe(ROOT_URI)
    agent = await huddle.client("agent")
    await agent.create_session(SESSION_B, title="Secret merger")
    await agent.create_session(SESSION_A, title="Printer")

    heard: list[Frame] = []
    while not any(f.get("method") == "root/sessionAdded" for f in heard):
        heard.append(await scoped.receive())

    assert heard[-1]["params"]["summary"]["resource"] == SESSION_A
    assert SESSION_B not in str(heard)


async def test_a_link_with_a_bad_token_sets_no_cookie(huddle: RunningServer) -> None:
    reply = await http("GET", f"{huddle.http}/?token=hud1.forged.token")
    assert reply.status == 401
    assert reply.headers["Set-Cookie"] is None


async def test_a_participant_cannot_complete_a_tool_call_it_does_not_execute(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent")
    await agent.create_session("ahp-session:/approvals")
    session = await agent.subscribe("ahp-session:/approvals")
    assert isinstance(session.state, SessionState)
    chat = session.state.default_chat
    assert chat is not None
    await agent.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1", started_at="2026-11-30T10:00:00.000Z", message=user_message("refund it")
        ),
    )
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallStart(
            turn_id="t1", tool_call_id="c1", tool_name="refund", display_name="Refund"
        ),
    )
    await agent.dispatch_and_wait(
        chat, ChatToolCallReady(turn_id="t1", tool_call_id="c1", invocation_message="Refund?")
    )
    mallory = await huddle.client(name="mallory")
    mirror = await mallory.subscribe(chat)
    done = ToolCallResult(success=True, past_tense_message="Refunded")
    with pytest.raises(ActionRejected) as rejected:
        await mallory.dispatch_and_wait(
            chat, ChatToolCallComplete(turn_id="t1", tool_call_id="c1", result=done)
        )
    assert rejected.value.reason.startswith("forbidden:")
    assert isinstance(mirror.state, ChatState)
    assert mirror.state.active_turn is not None
    part = mirror.state.active_turn.response_parts[0]
    assert isinstance(part, ToolCallPart)
    assert isinstance(part.tool_call, ToolCallPendingConfirmation)
