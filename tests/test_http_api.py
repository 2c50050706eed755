"""The HTTP API, for agents without a socket: sessions, snapshots,
dispatch, the input long poll, tokens, health and metrics.

Requests go through ``urllib`` (see :func:`tests.edge.http`); people answer
over the WebSocket, as the web client does.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

import pytest

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionTitleChanged,
    StateAction,
)
from protocol.chat import InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.codec import encode, to_builtins
from server.config import Settings
from tests.conftest import AGENT_TOKEN, UNIT, RecordReads, RunningServer, start_server, user_message
from tests.edge import HttpReply, Peer, eventually, http
from tests.test_session_telling import HeldAppend

SESSION = "ahp-session:/http-1"


def action_json(action: StateAction) -> Any:
    return to_builtins(action)


def turn_json(action: ChatTurnStarted, recorded: Any) -> Any:
    """``action`` as JSON, with the stamp the server gave its turn (the one
    in ``recorded``, the action as the server recorded it: 8 hex digits)."""
    stamp = recorded["message"]["_meta"]["huddle"]["turn"]
    assert re.fullmatch("[0-9a-f]{8}", stamp)
    expected = action_json(action)
    expected["message"]["_meta"] = {"huddle": {"turn": stamp}}
    return expected


async def post(huddle: RunningServer, path: str, body: Any, token: str = AGENT_TOKEN) -> HttpReply:
    return await http("POST", huddle.http + path, token=token, body=body)


async def get(
    huddle: RunningServer,
    path: str,
    query: Mapping[str, str | float] | None = None,
    token: str = AGENT_TOKEN,
) -> HttpReply:
    url = f"{huddle.http}{path}?{urlencode(query)}" if query else huddle.http + path
    return await http("GET", url, token=token)


async def new_session(huddle: RunningServer) -> str:
    """Create SESSION over HTTP; its default chat."""
    reply = await post(huddle, "/api/sessions", {"id": "http-1", "title": "Over HTTP"})
    assert reply.status == 201, reply
    chat: str = reply.json()["chat"]
    return chat


async def dispatch(
    huddle: RunningServer, channel: str, action: StateAction, token: str = AGENT_TOKEN
) -> HttpReply:
    return await post(
        huddle, "/api/dispatch", {"channel": channel, "action": action_json(action)}, token
    )


TURN = ChatTurnStarted(
    turn_id="t1", started_at="2026-11-30T10:00:00.000Z", message=user_message("Deploy?")
)
REQUEST = InputRequest(
    id="approval",
    message="May we deploy on Friday?",
    questions=[TextQuestion(id="why", message="Why?", required=True)],
)
BECAUSE = InputAnswer(state="submitted", value=TextValue(value="tests are green"))


async def chat_asking(huddle: RunningServer) -> str:
    """A chat whose active turn has the open request ``approval``."""
    chat = await new_session(huddle)
    for action in (TURN, ChatInputRequested(request=REQUEST)):
        assert (await dispatch(huddle, chat, action)).status == 200
    return chat


def wait_query(chat: str, timeout: float) -> dict[str, str | float]:
    return {"chat": chat, "request": "approval", "timeout": timeout}


async def parked_poll(huddle: RunningServer, chat: str) -> asyncio.Task[HttpReply]:
    """Start the long poll; returns once the server is waiting on it."""
    poll = asyncio.create_task(get(huddle, "/api/input/wait", wait_query(chat, 5 * UNIT)))
    await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) > 0)
    return poll


# ─── Sessions and snapshots ──────────────────────────────────────────────────


async def test_agent_creates_a_session(huddle: RunningServer) -> None:
    reply = await post(huddle, "/api/sessions", {"id": "http-1", "title": "Over HTTP"})

    assert reply.status == 201
    body = reply.json()
    assert body["session"] == SESSION
    assert body["chat"].startswith("ahp-chat:/")


async def test_snapshot_returns_the_channel_state(huddle: RunningServer) -> None:
    chat = await new_session(huddle)

    reply = await get(huddle, "/api/snapshot", {"channel": SESSION})

    assert reply.status == 200
    body = reply.json()
    assert body["resource"] == SESSION
    assert body["state"]["title"] == "Over HTTP"
    assert body["state"]["defaultChat"] == chat
    assert body["fromSeq"] == (await huddle.server.parts.host.view(SESSION)).seq


async def test_snapshot_of_an_unknown_chat_is_404(huddle: RunningServer) -> None:
    reply = await get(huddle, "/api/snapshot", {"channel": "ahp-chat:/nowhere"})

    assert reply.status == 404


# ─── Dispatch ────────────────────────────────────────────────────────────────


async def test_dispatch_returns_the_envelope(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    seq = (await get(huddle, "/api/snapshot", {"channel": chat})).json()["fromSeq"]

    reply = await dispatch(huddle, chat, TURN)

    assert reply.status == 200
    recorded = reply.json()["action"]
    assert reply.json() == {
        "channel": chat,
        "action": turn_json(TURN, recorded),
        "serverSeq": seq + 1,
    }


async def test_dispatch_reaches_websocket_subscribers(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    watcher = await Peer.ready(huddle.ws, huddle.token(), "watcher")
    seq = (await watcher.subscribe(chat))["fromSeq"]

    await dispatch(huddle, chat, TURN)

    envelope = await watcher.envelope()
    assert envelope["serverSeq"] == seq + 1
    assert envelope["action"] == turn_json(TURN, envelope["action"])


async def test_rejected_dispatch_is_409_with_the_reason(huddle: RunningServer) -> None:
    chat = await new_session(huddle)

    reply = await dispatch(huddle, chat, ChatTurnComplete(turn_id="t1", duration=1))
    cancel = await post(
        huddle,
        "/api/dispatch",
        {"channel": chat, "action": {"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}},
    )

    assert reply.status == 200  # no rule for turnComplete: a no-op, as in AHP
    assert cancel.status == 409
    assert cancel.json()["rejectionReason"].startswith("no-active-turn: ")


async def test_participant_dispatching_a_server_only_action_is_403(
    huddle: RunningServer,
) -> None:
    chat = await new_session(huddle)
    await dispatch(huddle, chat, TURN)

    reply = await dispatch(
        huddle, chat, ChatInputRequested(request=REQUEST), token=huddle.token("participant")
    )

    assert reply.status == 403
    assert reply.json() == {
        "rejectionReason": "forbidden: chat/inputRequested is dispatched only by the server",
        "code": "forbidden",
    }


async def test_observer_dispatching_anything_is_403(huddle: RunningServer) -> None:
    chat = await new_session(huddle)

    reply = await dispatch(huddle, chat, TURN, token=huddle.token("observer"))

    assert reply.status == 403
    assert reply.json()["rejectionReason"] == "forbidden: observers may not dispatch actions"


async def test_both_edges_refuse_an_observers_action_with_the_same_reason(
    huddle: RunningServer,
) -> None:
    chat = await new_session(huddle)
    token = huddle.token("observer", name="olga")
    observer = await Peer.ready(huddle.ws, token, "olga")
    await observer.subscribe(chat)

    await observer.dispatch(chat, TURN)
    echoed = (await observer.envelope())["rejectionReason"]
    reply = await dispatch(huddle, chat, TURN, token=token)

    assert echoed == reply.json()["rejectionReason"]


async def test_another_session_is_404_to_a_scoped_token_as_if_it_did_not_exist(
    huddle: RunningServer,
) -> None:
    chat = await new_session(huddle)
    token = huddle.token("participant", ["ahp-session:/elsewhere"])

    reply = await dispatch(huddle, chat, TURN, token=token)
    missing = await dispatch(huddle, "ahp-chat:/never", TURN, token=token)

    assert reply.status == missing.status == 404
    assert reply.json()["error"].replace(chat, "X") == missing.json()["error"].replace(
        "ahp-chat:/never", "X"
    )


async def test_action_of_another_channels_family_is_rejected(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    seq = (await huddle.server.parts.host.view(chat)).seq

    reply = await dispatch(huddle, chat, SessionTitleChanged(title="wrong place"))

    assert reply.status == 409
    assert reply.json()["rejectionReason"].startswith("wrong-channel: ")
    assert (await huddle.server.parts.host.view(chat)).seq == seq


# ─── The input long poll ─────────────────────────────────────────────────────


async def test_long_poll_returns_the_answers_a_participant_submits(
    huddle: RunningServer,
) -> None:
    chat = await chat_asking(huddle)
    alice_token = huddle.token(name="alice")
    alice = await Peer.ready(huddle.ws, alice_token, "alice")
    await alice.subscribe(chat)
    poll = await parked_poll(huddle, chat)

    await alice.dispatch(
        chat, ChatInputAnswerChanged(request_id="approval", question_id="why", answer=BECAUSE)
    )
    await alice.dispatch(chat, ChatInputCompleted(request_id="approval", response="accept"))

    async with asyncio.timeout(5 * UNIT):
        reply = await poll
    assert reply.status == 200
    assert reply.json() == {
        "response": "accept",
        "answers": {"why": to_builtins(BECAUSE)},
        "by": "alice",
        "who": {
            "name": "alice",
            "role": "participant",
            "token": huddle.authority.verify(alice_token, 0).token_id,
            "link": True,
        },
    }


async def test_long_poll_of_an_already_completed_request_returns_at_once(
    huddle: RunningServer,
) -> None:
    chat = await chat_asking(huddle)
    await dispatch(huddle, chat, ChatInputCompleted(request_id="approval", response="decline"))

    reply = await get(huddle, "/api/input/wait", wait_query(chat, 5 * UNIT))

    assert reply.status == 200
    assert reply.json()["response"] == "decline"


async def test_long_poll_times_out_with_408(huddle: RunningServer) -> None:
    chat = await chat_asking(huddle)

    reply = await get(huddle, "/api/input/wait", wait_query(chat, 0.1 * UNIT))

    assert reply.status == 408
    assert huddle.server.parts.host.waiters.waiting_on(chat) == 0


async def test_long_poll_ends_with_410_when_the_turn_ends(huddle: RunningServer) -> None:
    chat = await chat_asking(huddle)
    poll = await parked_poll(huddle, chat)

    await dispatch(huddle, chat, ChatTurnComplete(turn_id="t1", duration=1))

    async with asyncio.timeout(5 * UNIT):
        reply = await poll
    assert reply.status == 410


async def test_long_poll_stops_waiting_when_its_client_hangs_up(huddle: RunningServer) -> None:
    chat = await chat_asking(huddle)
    query = urlencode(wait_query(chat, 60 * UNIT))
    _, writer = await asyncio.open_connection("127.0.0.1", huddle.port)
    writer.write(
        f"GET /api/input/wait?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {AGENT_TOKEN}\r\n\r\n".encode()
    )
    await writer.drain()
    await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) > 0)

    writer.close()  # the client goes away long before the poll's timeout
    await writer.wait_closed()

    await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) == 0)


async def test_long_poll_of_an_unknown_request_is_410(huddle: RunningServer) -> None:
    chat = await chat_asking(huddle)
    query: dict[str, str | float] = {"chat": chat, "request": "never-asked", "timeout": 5 * UNIT}

    reply = await get(huddle, "/api/input/wait", query)

    assert reply.status == 410


async def test_long_polls_of_requests_never_asked_read_no_form() -> None:
    store = RecordReads()
    running = await start_server(Settings(port=0), store)
    try:
        chat = await chat_asking(running)
        poller = running.token(name="poller")
        for n in range(3):
            query: dict[str, str | float] = {"chat": chat, "request": f"never-{n}", "timeout": 1}

            reply = await get(running, "/api/input/wait", query, poller)

            assert reply.status == 410
        # (The agent's own request, "approval", has its form read ahead.)
        assert [key for kind, key in store.reads if kind == "form" and "never-" in key] == []
    finally:
        await running.stop()


# ─── Tokens ──────────────────────────────────────────────────────────────────


async def mint(huddle: RunningServer, body: Any, token: str = AGENT_TOKEN) -> HttpReply:
    return await post(huddle, "/api/tokens", body, token)


async def test_minted_token_connects_with_its_role_and_scope(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    other = (await post(huddle, "/api/sessions", {"id": "http-2"})).json()["chat"]
    reply = await mint(huddle, {"role": "participant", "sessions": [SESSION], "name": "dana"})
    assert reply.status == 200
    assert reply.json()["link"] == f"{huddle.http}/?token={reply.json()['token']}"

    dana = await Peer.ready(huddle.ws, reply.json()["token"], "dana")

    assert (await dana.subscribe(chat))["resource"] == chat
    # Out of the token's scope looks like no such channel (-32008).
    assert (await dana.request("subscribe", {"channel": other}))["error"]["code"] == -32008
    (grant,) = [c.grant for c in huddle.server.connections if c.grant.name == "dana"]
    assert grant.role == "participant"


async def test_minted_observer_token_cannot_dispatch(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    token = (await mint(huddle, {"role": "observer"})).json()["token"]
    observer = await Peer.ready(huddle.ws, token, "watcher")
    await observer.subscribe(chat)

    await observer.dispatch(chat, TURN)

    assert (await observer.envelope())["rejectionReason"].startswith("forbidden: ")


async def test_minted_token_expires_after_its_ttl(huddle: RunningServer) -> None:
    huddle.server.commands.clock = lambda: 1_000_000.0
    token = (await mint(huddle, {"role": "participant", "ttl": 60})).json()["token"]

    huddle.server.commands.clock = lambda: 1_000_061.0
    reply = await get(huddle, "/api/snapshot", {"channel": "ahp-root://"}, token)

    assert reply.status == 401


async def test_participant_cannot_mint_tokens(huddle: RunningServer) -> None:
    reply = await mint(huddle, {"role": "participant"}, token=huddle.token("participant"))

    assert reply.status == 403


# ─── Bad requests ────────────────────────────────────────────────────────────

BAD_BODIES: list[Any] = [
    pytest.param("/api/tokens", {"role": "boss"}, "$.role", id="token-with-an-unknown-role"),
    pytest.param(
        "/api/tokens",
        {"role": "participant", "sessions": "ahp-session:/a"},
        "$.sessions",
        id="token-sessions-not-a-list",
    ),
    pytest.param(
        "/api/tokens", {"role": "participant", "ttl": -1}, "$.ttl", id="token-ttl-negative"
    ),
    pytest.param(
        "/api/tokens", {"role": "participant", "ttl": "1h"}, "$.ttl", id="token-ttl-a-string"
    ),
    pytest.param(
        "/api/tokens", {"role": "participant", "ttl": True}, "$.ttl", id="token-ttl-a-boolean"
    ),
    pytest.param(
        "/api/tokens",
        b'{"role": "participant", "ttl": 1e999}',
        None,  # a number no double holds: not JSON Huddle reads
        id="token-ttl-infinite",
    ),
    pytest.param("/api/tokens", b'{"role": "participant", "ttl": NaN}', None, id="token-ttl-nan"),
    pytest.param(
        "/api/tokens",
        {"role": "participant", "name": "\u202eecilA"},  # shows as "Alice"
        "$.name",
        id="token-name-with-a-right-to-left-override",
    ),
    pytest.param("/api/sessions", {"id": "no spaces/here"}, "$.id", id="session-id-not-an-id"),
    pytest.param(
        "/api/dispatch",
        {"channel": 5, "action": {"type": "chat/draftChanged"}},
        "$.channel",
        id="dispatch-channel-not-a-str",
    ),
    pytest.param(
        "/api/dispatch",
        {"channel": "ahp-chat:/x", "action": {"type": "chat/turnCancelled", "turnId": 1}},
        "$.action.turnId",
        id="dispatch-action-field-of-the-wrong-type",
    ),
    pytest.param(
        "/api/dispatch",
        {"channel": "ahp-chat:/x", "action": {"type": "chat/teleported"}},
        "$.action.type",
        id="dispatch-unknown-action-type",
    ),
    pytest.param(
        "/api/dispatch",
        {"channel": "nowhere", "action": {"type": "chat/draftChanged"}},
        "$.channel",
        id="dispatch-channel-not-a-channel-uri",
    ),
    pytest.param("/api/dispatch", b"[1, 2]", "$", id="body-not-an-object"),
    pytest.param("/api/dispatch", b"{not json", None, id="body-not-json"),
]


@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
async def test_bad_body_is_400_naming_the_field(
    huddle: RunningServer, path: str, body: Any, field: str | None
) -> None:
    data = body if isinstance(body, bytes) else encode(body)

    reply = await http("POST", huddle.http + path, token=AGENT_TOKEN, data=data)

    assert reply.status == 400
    assert reply.json().get("path") == field


@pytest.mark.parametrize(
    ("path", "query", "field"),
    [
        pytest.param("/api/snapshot", {"channel": "nowhere"}, "$.channel", id="snapshot-channel"),
        pytest.param(
            "/api/snapshot",
            {"channel": "ahp-root://", "turns": "many"},
            "$.turns",
            id="snapshot-turns-not-a-number",
        ),
        pytest.param(
            "/api/snapshot",
            {"channel": "ahp-root://", "turns": "0"},
            "$.turns",
            id="snapshot-no-turns",
        ),
        pytest.param(
            "/api/snapshot",
            {"channel": "ahp-root://", "turns": "²"},
            "$.turns",
            id="snapshot-turns-not-ascii-digits",
        ),
        pytest.param(
            "/api/snapshot",
            {"channel": "ahp-root://", "turns": "9" * 5000},
            "$.turns",
            id="snapshot-turns-beyond-any-chat",
        ),
        pytest.param(
            "/api/snapshot",
            {"channel": "ahp-session:/x", "cursor": "c"},
            "$.channel",
            id="snapshot-cursor-of-a-session",
        ),
        pytest.param(
            "/api/input/wait",
            {"chat": "ahp-chat:/x", "request": "r", "timeout": "soon"},
            "$.timeout",
            id="wait-timeout-not-a-number",
        ),
        pytest.param(
            "/api/input/wait", {"chat": "", "request": "r"}, "$.chat", id="wait-without-chat"
        ),
        pytest.param(
            "/api/input/wait",
            {"chat": "ahp-session:/x", "request": "r"},
            "$.chat",
            id="wait-on-a-session",
        ),
        pytest.param(
            "/api/input/wait", {"chat": "ahp-root://", "request": "r"}, "$.chat", id="wait-on-root"
        ),
    ],
)
async def test_bad_query_is_400_naming_the_field(
    huddle: RunningServer, path: str, query: dict[str, str], field: str
) -> None:
    reply = await get(huddle, path, query)

    assert reply.status == 400
    assert reply.json()["path"] == field


@pytest.mark.parametrize(
    ("method", "path"),
    [
        pytest.param("POST", "/api/sessions", id="sessions"),
        pytest.param("GET", "/api/snapshot?channel=ahp-root://", id="snapshot"),
        pytest.param("POST", "/api/dispatch", id="dispatch"),
        pytest.param("GET", "/api/input/wait?chat=ahp-chat:/x&request=r", id="wait"),
        pytest.param("POST", "/api/tokens", id="tokens"),
    ],
)
async def test_api_without_a_token_is_401(huddle: RunningServer, method: str, path: str) -> None:
    reply = await http(method, huddle.http + path, data=b"{}" if method == "POST" else None)

    assert reply.status == 401


# ─── Health and metrics ──────────────────────────────────────────────────────


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_health_endpoints_answer_200_without_a_token(
    huddle: RunningServer, path: str
) -> None:
    reply = await http("GET", huddle.http + path)

    assert reply.status == 200


async def test_metrics_show_connections_and_actions_by_type(huddle: RunningServer) -> None:
    chat = await new_session(huddle)
    await Peer.ready(huddle.ws, huddle.token(), "connected")
    await dispatch(huddle, chat, TURN)
    await dispatch(huddle, chat, TURN)

    reply = await http("GET", huddle.http + "/metrics", token=AGENT_TOKEN)

    assert reply.status == 200
    lines = reply.body.decode().splitlines()
    assert "huddle_connections 1.0" in lines
    assert 'huddle_actions_accepted_total{type="chat/turnStarted"} 1.0' in lines
    assert 'huddle_actions_rejected_total{type="chat/turnStarted"} 1.0' in lines


async def test_a_dispatch_cut_off_by_the_stop_is_answered_503_try_again() -> None:
    # uvicorn cancels what still runs after its graceful timeout: the request
    # was answered 500 with a CancelledError's traceback, whether or not the
    # action had landed.
    store = HeldAppend("chat/turnStarted")
    huddle = await start_server(store=store)
    huddle.uvicorn.config.timeout_graceful_shutdown = 0
    chat = await new_session(huddle)
    sending = asyncio.create_task(dispatch(huddle, chat, TURN))
    async with asyncio.timeout(10 * UNIT):
        await store.reached.wait()
        huddle.uvicorn.should_exit = True
        reply = await sending
        store.release.set()
        await huddle.task

    assert reply.status == 503, reply
    assert reply.headers["Retry-After"] == "1"
    assert "try again" in reply.json()["error"]
