"""Huddle as an MCP server (server.mcp.door): the official SDK's client over
streamable HTTP against a real server, people answering over the WebSocket.
Both client modes: the 2025-11-25 handshake and discovery (2026-07-28)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from protocol.actions import ChatInputCompleted
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputAnswer,
    InputRequestPart,
    NumberValue,
    TextValue,
    ToolCallPart,
    Turn,
)
from protocol.messages import ChannelState
from protocol.session import SessionState
from protocol.uris import ROOT_URI
from reducers import notes
from server.auth import AGENT_TOKEN_ID, TokenAuthority, token_id
from server.build import build
from server.config import Limits, Settings
from server.core.policy import active_turn_stamp
from server.edge.app import create_app
from server.errors import ActionRejected
from server.runner.ids import door_session
from server.store.redis import RedisStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    RunningServer,
    WallClock,
    clocked_server,
    start_server,
)
from tests.people_kit import (
    WITHIN,
    Room,
    approve,
    calls_waiting,
    deny,
    open_requests,
    open_room,
    pending_calls,
    requests_open,
    time_passes,
    wait_for,
)
from tests.redis_server import RedisServer

MODES = ["legacy", "auto"]
"""The SDK client's 2025-11-25 handshake, and discovery (2026-07-28)."""

CODE_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "Three capitals"},
        "party": {"type": "integer", "minimum": 1},
    },
    "required": ["code", "party"],
}
"""A form whose ``pattern`` only the frozen schema checks (an AHP text
question has no pattern: protocol.forms)."""


@contextlib.asynccontextmanager
async def _transport(url: str, token: str | None) -> AsyncIterator[Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = httpx2.Timeout(WITHIN, read=None)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def mcp_client(
    huddle: RunningServer, mode: str, token: str = AGENT_TOKEN, name: str = "test-agent"
) -> Client:
    """The SDK's client for Huddle's ``/mcp``, calling itself ``name``."""
    return Client(
        _transport(f"{huddle.http}/mcp", token),
        mode=mode,
        client_info=types.Implementation(name=name, version="1"),
    )


def structured(result: types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


def submitted(**values: str | int) -> dict[str, InputAnswer]:
    return {
        key: InputAnswer(
            state="submitted",
            value=TextValue(value=value) if isinstance(value, str) else NumberValue(value=value),
        )
        for key, value in values.items()
    }


async def answer(room: Room, request: InputRequestPart, **values: str | int) -> None:
    action = ChatInputCompleted(
        request_id=request.request.id, response="accept", answers=submitted(**values)
    )
    await room.person.dispatch_and_wait(room.chat, action)


def all_parts(state: ChatState) -> list[object]:
    """Every response part of the chat, oldest turn first."""
    turns: list[ActiveTurn | Turn] = [*state.turns]
    if state.active_turn is not None:
        turns.append(state.active_turn)
    return [part for turn in turns for part in turn.response_parts]


def requests_named(state: ChatState, request_id: str) -> list[InputRequestPart]:
    return [
        part
        for part in all_parts(state)
        if isinstance(part, InputRequestPart) and part.request.id == request_id
    ]


async def expiry_set(room: Room, session: str, request_id: str) -> None:
    """Once the request's expiry is in its session's notes (the agent sets
    it just after asking), so that time may pass on it."""
    mirror = room.person.mirrors.get(session) or await room.person.subscribe(session)
    turn = active_turn_stamp(room.mirror.chat)

    def noted(state: ChannelState) -> bool:
        meta = getattr(state, "meta", None)
        return notes.expiry_of(meta, "requests", room.chat, request_id, turn) is not None

    async with asyncio.timeout(WITHIN):
        await mirror.wait_for(noted)


# ─── Tools ───────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mode", MODES)
async def test_every_tool_lists_an_input_and_an_output_schema(
    huddle: RunningServer, mode: str
) -> None:
    async with mcp_client(huddle, mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {
        "ask_people",
        "request_approval",
        "ask_to_visit",
        "list_sessions",
        "create_session",
    }
    for tool in tools.values():
        assert tool.description
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None
    assert tools["ask_people"].input_schema["required"] == ["message"]
    assert "idempotency_key" in tools["request_approval"].input_schema["properties"]
    output = tools["ask_people"].output_schema
    assert output is not None
    assert "answered_by" in output["properties"]


@pytest.mark.parametrize("mode", MODES)
async def test_ask_people_returns_the_submitted_answers_credited_to_who_submitted_them(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle, f"ahp-session:/ask-{mode}")
    async with mcp_client(huddle, mode) as client:
        call = asyncio.create_task(
            client.call_tool(
                "ask_people",
                {"message": "Which code?", "schema": CODE_FORM, "chat": room.chat},
            )
        )
        [request] = await requests_open(room)
        assert request.request.message == "test-agent asks: Which code?"
        with pytest.raises(ActionRejected, match="code"):
            await answer(room, request, code="abc", party=2)  # the frozen schema's pattern
        await answer(room, request, code="ABC", party=2)
        async with asyncio.timeout(WITHIN):
            result = structured(await call)
    assert result["action"] == "accept"
    assert result["content"] == {"code": "ABC", "party": 2}
    person = huddle.token(sessions=[f"ahp-session:/ask-{mode}"], name=room.name)
    assert result["answered_by"]["name"] == room.name
    assert result["answered_by"]["role"] == "participant"
    assert result["answered_by"]["token"] != token_id(person)  # each client's own token
    assert result["answered_by"]["token"] not in (AGENT_TOKEN_ID, AGENT_TOKEN)


async def test_ask_people_with_ahp_questions_returns_the_answers_by_question(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/questions")
    questions = [{"kind": "text", "id": "system", "message": "Which system?", "required": True}]
    async with mcp_client(huddle, "legacy") as client:
        call = asyncio.create_task(
            client.call_tool(
                "ask_people",
                {"message": "Help", "questions": questions, "chat": room.chat},
            )
        )
        [request] = await requests_open(room)
        await answer(room, request, system="billing")
        async with asyncio.timeout(WITHIN):
            result = structured(await call)
    assert result["content"] == {"system": "billing"}


@pytest.mark.parametrize(
    "arguments",
    [
        {"tool": "ask_to_visit", "url": "javascript:alert(1)", "message": "Look"},
        {"tool": "ask_people", "message": "Hi", "schema": {"type": "object", "not": {}}},
        {"tool": "ask_people", "message": "Hi", "chat": "ahp-session:/not-a-chat"},
        {"tool": "ask_people", "message": "Hi", "expires_in": 0},
        {"tool": "ask_people", "message": "Hi", "chat": "ahp-chat:/nowhere"},
    ],
    ids=["not-http", "not-flat", "not-a-chat-uri", "no-time", "no-such-chat"],
)
async def test_what_cannot_be_asked_is_a_tool_error_and_asks_nobody(
    huddle: RunningServer, arguments: dict[str, Any]
) -> None:
    room = await open_room(huddle, "ahp-session:/refusals")
    tool = arguments.pop("tool")
    arguments.setdefault("chat", room.chat)
    async with mcp_client(huddle, "legacy") as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error
    assert not open_requests(room.mirror.chat)


async def test_the_audit_credits_the_request_to_the_agent_token_and_the_answer_to_the_person(
    huddle: RunningServer,
) -> None:
    session = "ahp-session:/audited"
    room = await open_room(huddle, session)
    async with mcp_client(huddle, "legacy") as client:
        call = asyncio.create_task(
            client.call_tool("ask_people", {"message": "Ready?", "session": session})
        )
        [request] = await requests_open(room)
        await answer(room, request)
        async with asyncio.timeout(WITHIN):
            assert structured(await call)["action"] == "accept"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {AGENT_TOKEN}"}) as http:
        audit = await http.get(f"{huddle.http}/api/audit", params={"session": session})
    records = [json.loads(line) for line in audit.text.splitlines()]
    asked = next(r for r in records if r.get("what") == "chat/inputRequested")
    done = next(r for r in records if r.get("what") == "chat/inputCompleted")
    assert asked["who"] == {"role": "agent", "name": "agent", "token": AGENT_TOKEN_ID}
    assert done["who"]["name"] == room.name
    assert done["who"]["role"] == "participant"


@pytest.mark.parametrize("mode", MODES)
async def test_request_approval_returns_the_arguments_a_person_edited(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle, f"ahp-session:/approve-{mode}")
    async with mcp_client(huddle, mode) as client:
        call = asyncio.create_task(
            client.call_tool(
                "request_approval",
                {
                    "tool": "refund",
                    "arguments": {"order": "A-1", "amount": 50},
                    "reason": "The customer asked",
                    "chat": room.chat,
                },
            )
        )
        [waiting] = await calls_waiting(room)
        assert waiting.tool_name == "refund"
        await approve(room, waiting, edited={"order": "A-1", "amount": 20})
        async with asyncio.timeout(WITHIN):
            result = structured(await call)
    assert result["decision"] == "approved"
    assert result["arguments"] == {"order": "A-1", "amount": 20}
    assert result["decided_by"]["name"] == room.name


async def test_request_approval_returns_a_denial_and_its_reason(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/deny")
    async with mcp_client(huddle, "legacy") as client:
        call = asyncio.create_task(
            client.call_tool(
                "request_approval",
                {"tool": "drop_table", "arguments": {"table": "users"}, "chat": room.chat},
            )
        )
        [waiting] = await calls_waiting(room)
        await deny(room, waiting, "Not on a Friday")
        async with asyncio.timeout(WITHIN):
            result = structured(await call)
    assert result["decision"] == "denied"
    assert result["reason"] == "Not on a Friday"
    assert result["arguments"] == {"table": "users"}
    assert result["decided_by"]["name"] == room.name


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancelled_call_withdraws_its_request_from_the_chat(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle, f"ahp-session:/cancel-{mode}")
    async with mcp_client(huddle, mode) as client:
        call = asyncio.create_task(
            client.call_tool("ask_people", {"message": "Still there?", "chat": room.chat})
        )
        [request] = await requests_open(room)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call

        def withdrawn(state: ChatState) -> bool:
            return [p.response for p in requests_named(state, request.request.id)] == ["cancel"]

        await wait_for(room.mirror, withdrawn)


async def test_a_cancelled_approval_is_withdrawn_from_the_chat(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/cancel-call")
    async with mcp_client(huddle, "legacy") as client:
        call = asyncio.create_task(
            client.call_tool(
                "request_approval", {"tool": "deploy", "arguments": {}, "chat": room.chat}
            )
        )
        await calls_waiting(room)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await wait_for(room.mirror, lambda state: not pending_calls(state))


async def test_an_expired_request_returns_what_its_policy_says(clock: WallClock) -> None:
    async with clocked_server(clock) as huddle:
        room = await open_room(huddle, "ahp-session:/expire")
        async with mcp_client(huddle, "legacy") as client:
            asked = asyncio.create_task(
                client.call_tool(
                    "ask_people",
                    {
                        "message": "Quick!",
                        "chat": room.chat,
                        "expires_in": 60,
                        "on_expiry": "decline",
                    },
                )
            )
            approval = asyncio.create_task(
                client.call_tool(
                    "request_approval",
                    {
                        "tool": "deploy",
                        "arguments": {"to": "prod"},
                        "chat": room.chat,
                        "expires_in": 60,
                    },
                )
            )
            [request] = await requests_open(room)
            await expiry_set(room, "ahp-session:/expire", request.request.id)
            await calls_waiting(room)  # its expiry comes with it
            await time_passes(huddle, clock, 61)
            async with asyncio.timeout(WITHIN):
                answered, decided = structured(await asked), structured(await approval)
        assert answered == {"action": "decline", "content": None, "answered_by": None}
        assert decided["decision"] == "expired"
        assert decided["arguments"] == {"to": "prod"}
        assert decided["decided_by"] is None


async def test_a_request_that_expires_with_fail_is_a_tool_error(clock: WallClock) -> None:
    async with clocked_server(clock) as huddle:
        room = await open_room(huddle, "ahp-session:/expire-fail")
        async with mcp_client(huddle, "legacy") as client:
            asked = asyncio.create_task(
                client.call_tool(
                    "ask_people",
                    {"message": "Quick!", "chat": room.chat, "expires_in": 60, "on_expiry": "fail"},
                )
            )
            [request] = await requests_open(room)
            await expiry_set(room, "ahp-session:/expire-fail", request.request.id)
            await time_passes(huddle, clock, 61)
            async with asyncio.timeout(WITHIN):
                result = await asked
        assert result.is_error
        assert not open_requests(room.mirror.chat)


@pytest.mark.parametrize("mode", MODES)
async def test_progress_notifications_come_while_people_think(mode: str) -> None:
    huddle = await start_server(Settings(port=0, mcp_progress_interval=0.05 * UNIT))
    try:
        room = await open_room(huddle, f"ahp-session:/progress-{mode}")
        progressed = asyncio.Event()
        reports: list[float] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            reports.append(progress)
            progressed.set()

        async with mcp_client(huddle, mode) as client:
            call = asyncio.create_task(
                client.call_tool(
                    "ask_people",
                    {"message": "Take your time", "chat": room.chat},
                    progress_callback=on_progress,
                )
            )
            [request] = await requests_open(room)
            async with asyncio.timeout(WITHIN):
                await progressed.wait()
            await answer(room, request)
            async with asyncio.timeout(WITHIN):
                assert structured(await call)["action"] == "accept"
        assert reports == sorted(reports)
    finally:
        await huddle.stop()


# ─── Where ───────────────────────────────────────────────────────────────────


async def test_a_client_without_a_chat_asks_in_its_own_session_every_time(
    huddle: RunningServer,
) -> None:
    session = door_session(AGENT_TOKEN_ID, "cursor")
    person = await huddle.client(sessions=[session], name="erin")
    created = asyncio.Event()

    def note(method: str, params: Any) -> None:
        if method == "root/sessionAdded" and params["summary"]["resource"] == session:
            created.set()

    person.notices.append(note)
    await person.subscribe(ROOT_URI)
    seen = []
    for _ in range(2):  # two connections of the same client: the same session
        async with mcp_client(huddle, "legacy", name="cursor") as client:
            call = asyncio.create_task(
                client.call_tool(
                    "ask_to_visit", {"url": "https://example.test/login", "message": "Sign in"}
                )
            )
            async with asyncio.timeout(WITHIN):
                await created.wait()
            state = (person.mirrors.get(session) or await person.subscribe(session)).state
            assert isinstance(state, SessionState)
            assert state.default_chat is not None
            chat = state.default_chat
            mirror = person.mirrors.get(chat) or await person.subscribe(chat)
            [request] = await _open_in(mirror)
            seen.append(request.request.id)
            assert request.request.url == "https://example.test/login"
            await person.dispatch_and_wait(
                chat, ChatInputCompleted(request_id=request.request.id, response="accept")
            )
            async with asyncio.timeout(WITHIN):
                result = structured(await call)
            assert result["action"] == "accept"
            assert result["answered_by"]["name"] == "erin"
    assert len(set(seen)) == 2
    async with mcp_client(huddle, "legacy", name="cursor") as client:
        listed = structured(await client.call_tool("list_sessions", {}))
    [own] = [s for s in listed["sessions"] if s["session"] == session]
    assert own["title"] == "cursor"
    assert own["link"] == f"{huddle.http}/#/s/{session.removeprefix('ahp-session:/')}"


async def _open_in(mirror: Any) -> list[InputRequestPart]:
    def asked(state: object) -> bool:
        return isinstance(state, ChatState) and bool(open_requests(state))

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(asked)
    return open_requests(state)


async def test_create_session_links_to_its_chat_without_a_token(huddle: RunningServer) -> None:
    async with mcp_client(huddle, "legacy") as client:
        created = structured(await client.call_tool("create_session", {"title": "Launch"}))
    session, chat = created["session"], created["chat"]
    assert created["title"] == "Launch"
    sid, cid = session.removeprefix("ahp-session:/"), chat.removeprefix("ahp-chat:/")
    assert created["link"] == f"{huddle.http}/#/s/{sid}/c/{cid}"
    assert "token" not in created["link"]


# ─── Who may ─────────────────────────────────────────────────────────────────


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"},
    },
}


async def _post_initialize(huddle: RunningServer, token: str | None) -> httpx2.Response:
    headers = {"Accept": "application/json, text/event-stream"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx2.AsyncClient() as http:
        return await http.post(f"{huddle.http}/mcp", json=INITIALIZE, headers=headers)


@pytest.mark.parametrize(
    ("who", "status"),
    [("nobody", 401), ("forged", 401), ("participant", 403), ("observer", 403), ("agent", 200)],
)
async def test_only_agent_tokens_reach_the_mcp_server(
    huddle: RunningServer, who: str, status: int
) -> None:
    token = {
        "nobody": None,
        "forged": "hud1.not-a-token",
        "participant": huddle.token("participant"),
        "observer": huddle.token("observer"),
        "agent": AGENT_TOKEN,
    }[who]
    answer = await _post_initialize(huddle, token)
    assert answer.status_code == status
    if status == 401:
        assert answer.headers["www-authenticate"].startswith("Bearer")


async def test_a_token_scoped_to_sessions_reaches_only_those(huddle: RunningServer) -> None:
    mine, other = "ahp-session:/mine", "ahp-session:/other"
    room = await open_room(huddle, mine)
    await open_room(huddle, other, name="fay")
    scoped = huddle.authority.mint("agent", sessions=[mine], expires_at=10**10, name="bot")
    async with mcp_client(huddle, "legacy", token=scoped) as client:
        listed = structured(await client.call_tool("list_sessions", {}))
        refused = await client.call_tool("ask_people", {"message": "Hi", "session": other})
        not_made = await client.call_tool("create_session", {"title": "Elsewhere"})
        call = asyncio.create_task(client.call_tool("ask_people", {"message": "Hi"}))
        [request] = await requests_open(room)  # its one session is its default
        await answer(room, request)
        async with asyncio.timeout(WITHIN):
            assert structured(await call)["action"] == "accept"
    assert [s["session"] for s in listed["sessions"]] == [mine]
    assert refused.is_error
    assert not_made.is_error


async def test_another_tokens_mcp_session_id_is_an_unknown_session(
    huddle: RunningServer,
) -> None:
    answer = await _post_initialize(huddle, AGENT_TOKEN)
    session_id = answer.headers["mcp-session-id"]
    other = huddle.authority.mint("agent", expires_at=10**10, name="other")
    headers = {
        "Authorization": f"Bearer {other}",
        "Mcp-Session-Id": session_id,
        "Accept": "application/json, text/event-stream",
        "Mcp-Protocol-Version": "2025-11-25",
    }
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    async with httpx2.AsyncClient() as http:
        reused = await http.post(f"{huddle.http}/mcp", json=ping, headers=headers)
    assert reused.status_code == 404


# ─── Restarts ────────────────────────────────────────────────────────────────


@contextlib.asynccontextmanager
async def _restarted_while_waiting(
    redis_server: RedisServer,
    session: str,
    mode: str,
    call: tuple[str, dict[str, Any]],
    waiting: Callable[[Room], Awaitable[object]],
) -> AsyncIterator[tuple[RunningServer, Room]]:
    """A server on Redis stopped while ``call`` waits (once ``waiting`` says
    people see it); yields the one started after it, and dana in the chat."""

    def on_redis() -> Any:
        return start_server(Settings(port=0, store=redis_server.url), RedisStore(redis_server.url))

    first = await on_redis()
    try:
        room = await open_room(first, session)
        async with mcp_client(first, mode) as client:
            waits = asyncio.create_task(client.call_tool(*call))
            await waiting(room)
            await first.stop()  # the server goes while people think
            with contextlib.suppress(Exception):
                await waits
    finally:
        if not first.task.done():
            await first.stop()
    second = await on_redis()
    try:
        person = await second.client(sessions=[session], name="dana")
        mirror = await person.subscribe(room.chat)
        yield second, Room(person, person, room.chat, mirror, "dana")
    finally:
        await second.stop()


@pytest.mark.redis
@pytest.mark.parametrize(
    ("mode", "tool"),
    [("legacy", "ask_people"), ("auto", "ask_people"), ("legacy", "ask_to_visit")],
)
async def test_a_call_made_again_after_a_restart_gets_the_same_request_and_its_answer(
    redis_server: RedisServer, mode: str, tool: str
) -> None:
    session = f"ahp-session:/restart-{mode}-{tool}"
    arguments = {"message": "Deploy?", "session": session, "idempotency_key": "deploy-42"}
    if tool == "ask_to_visit":
        arguments["url"] = "https://deploy.example.test/confirm"
    call = (tool, arguments)
    restarted = _restarted_while_waiting(redis_server, session, mode, call, requests_open)
    async with restarted as (second, room), mcp_client(second, mode) as client:
        waits = asyncio.create_task(client.call_tool(*call))
        [asked] = await requests_open(room)
        await answer(room, asked)
        async with asyncio.timeout(WITHIN):
            result = structured(await waits)
        assert result["action"] == "accept"
        assert result["answered_by"]["name"] == "dana"
        # Called once more: its answer, and still one request.
        again = structured(await client.call_tool(*call))
    assert again["action"] == "accept"
    assert len(requests_named(room.mirror.chat, asked.request.id)) == 1


@pytest.mark.redis
async def test_an_approval_asked_again_after_a_restart_is_the_same_call(
    redis_server: RedisServer,
) -> None:
    session = "ahp-session:/restart-approval"
    arguments = {
        "tool": "deploy",
        "arguments": {"to": "prod"},
        "session": session,
        "idempotency_key": "deploy-43",
    }
    call = ("request_approval", arguments)
    restarted = _restarted_while_waiting(redis_server, session, "legacy", call, calls_waiting)
    async with restarted as (second, room), mcp_client(second, "legacy") as client:
        waits = asyncio.create_task(client.call_tool(*call))
        [pending] = await calls_waiting(room)
        await approve(room, pending, edited={"to": "staging"})
        async with asyncio.timeout(WITHIN):
            result = structured(await waits)
    assert result["decision"] == "approved"
    assert result["arguments"] == {"to": "staging"}
    assert result["decided_by"]["name"] == "dana"
    calls = [
        part
        for part in all_parts(room.mirror.chat)
        if isinstance(part, ToolCallPart) and part.tool_call.tool_call_id == pending.tool_call_id
    ]
    assert len(calls) == 1


async def test_a_client_that_hangs_up_has_its_request_withdrawn(huddle: RunningServer) -> None:
    """On 2025-11-25 the SDK goes on with a call whose response stream
    dropped (nothing to resume it from): the door withdraws it."""
    room = await open_room(huddle, "ahp-session:/hung-up")
    opened = await _post_initialize(huddle, AGENT_TOKEN)
    headers = {
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Accept": "application/json, text/event-stream",
        "Mcp-Session-Id": opened.headers["mcp-session-id"],
        "Mcp-Protocol-Version": "2025-11-25",
    }
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "ask_people", "arguments": {"message": "Hi", "chat": room.chat}},
    }
    async with httpx2.AsyncClient(headers=headers) as http:
        ready = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await http.post(f"{huddle.http}/mcp", json=ready)
        async with http.stream("POST", f"{huddle.http}/mcp", json=call):
            [request] = await requests_open(room)
        # The stream is closed: the client hung up.

    def withdrawn(state: ChatState) -> bool:
        return [p.response for p in requests_named(state, request.request.id)] == ["cancel"]

    await wait_for(room.mirror, withdrawn)


async def test_each_request_pays_from_the_tokens_budget() -> None:
    limits = Limits(agent_actions_per_second=0.001, agent_action_burst=1)
    huddle = await start_server(Settings(port=0, limits=limits))
    try:
        answers = [await _post_initialize(huddle, AGENT_TOKEN) for _ in range(3)]
    finally:
        await huddle.stop()
    assert [a.status_code for a in answers] == [200, 200, 429]  # a read each: half an action
    assert int(answers[-1].headers["retry-after"]) >= 1


@pytest.mark.parametrize("seconds", [0.0, -1.0, 31.0, float("nan")])
def test_a_progress_interval_that_would_not_keep_clients_waiting_is_refused(
    seconds: float,
) -> None:
    with pytest.raises(ValueError, match="progress interval"):
        create_app(build(Settings(mcp_progress_interval=seconds)), TokenAuthority(AGENT_TOKEN))
