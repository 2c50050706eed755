"""What the MCP bridge tests share: real MCP servers built with the SDK's
server API, and the people's side of a chat over WebSocket.

``python -m tests.mcp_kit [NAME]`` serves :func:`build_server` over stdio.

Every tool asks the way its client's protocol wants: on 2025-11-25 it sends
``elicitation/create`` and waits; on 2026-07-28 it returns an
``input_required`` result and finds the answer in the retry.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.request_state import AESGCMRequestStateCodec, RequestStateSecurity
from mcp.server.session import ServerSession
from mcp.shared.exceptions import UrlElicitationRequiredError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from protocol.actions import ChatInputCompleted, ChatTurnStarted
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputAnswerValue,
    InputRequestPart,
    InputResponseKind,
)
from protocol.session import SessionState
from server.client import HuddleClient, Mirror
from tests.conftest import UNIT, RunningServer, user_message

WITHIN = 10 * UNIT
"""How long a test waits for something that must happen."""

LEGACY = "legacy"
MODERN = "auto"
MODES = [LEGACY, MODERN]
"""The SDK client modes: the 2025-11-25 handshake, and discovery (which
settles on 2026-07-28 with these servers, and learns their names)."""
VERSIONS = {LEGACY: "2025-11-25", MODERN: "2026-07-28"}

# ─── Forms ───────────────────────────────────────────────────────────────────

EVERYTHING: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "title": "Name",
            "description": "Your full name",
            "minLength": 2,
            "maxLength": 40,
        },
        "email": {"type": "string", "format": "email", "description": "Where we write to"},
        "website": {"type": "string", "format": "uri"},
        "birthday": {"type": "string", "format": "date"},
        "party": {"type": "integer", "minimum": 1, "maximum": 12, "default": 2},
        "budget": {"type": "number", "minimum": 0, "maximum": 1000.5},
        "vegetarian": {"type": "boolean", "default": False},
        "color": {
            "type": "string",
            "enum": ["red", "green", "blue"],
            "enumNames": ["Red", "Green", "Blue"],
        },
        "seat": {
            "type": "string",
            "oneOf": [
                {"const": "window", "title": "By the window"},
                {"const": "aisle", "title": "On the aisle"},
            ],
            "default": "aisle",
        },
        "courses": {
            "type": "array",
            "items": {"type": "string", "enum": ["soup", "main", "dessert"]},
            "minItems": 1,
            "maxItems": 2,
        },
        "drinks": {
            "type": "array",
            "items": {
                "anyOf": [{"const": "tea", "title": "Tea"}, {"const": "wine", "title": "Wine"}]
            },
        },
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "notes": {"type": "string"},
    },
    "required": ["name", "email", "party", "courses"],
}

FORMS: dict[str, dict[str, Any]] = {
    "everything": EVERYTHING,
    "contact": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "title": "Name"},
            "email": {"type": "string", "format": "email"},
        },
        "required": ["name", "email"],
    },
    "confirm": {"type": "object", "properties": {}},
    "nested": {
        "type": "object",
        "properties": {"address": {"type": "object", "properties": {"city": {"type": "string"}}}},
    },
    "negated": {"type": "object", "properties": {"code": {"type": "string", "not": {"const": ""}}}},
    "huge": {  # about 600 KB as a chat request: over the 512 KiB an action may be
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "description": "x" * 15_000} for i in range(40)},
    },
}

BOOKING: dict[str, Any] = {
    "type": "object",
    "properties": {
        "party": {"type": "integer", "title": "Party size", "minimum": 1, "maximum": 12},
        "time": {"type": "string", "enum": ["18:00", "19:30", "21:00"]},
    },
    "required": ["party", "time"],
}

LINK_ID = "files"
LINK_URL = "https://files.example.test/connect?e=files"


# ─── The server ──────────────────────────────────────────────────────────────


@dataclass
class Kit:
    """What an in-process server lets its test do: make a waiting tool give
    up, complete a link out of band (as a person's browser would)."""

    give_up: anyio.Event = field(default_factory=anyio.Event)
    linked: set[str] = field(default_factory=set)
    sessions: list[ServerSession] = field(default_factory=list)
    asked: int = 0

    async def visit(self, elicitation_id: str) -> None:
        """The link was opened and its interaction is done: tell the client."""
        self.linked.add(elicitation_id)
        for session in self.sessions:
            await session.send_elicit_complete(elicitation_id)

    def visit_quietly(self, elicitation_id: str) -> None:
        """The interaction at the link is done, and the server never says so
        (delivery of the completion is not guaranteed)."""
        self.linked.add(elicitation_id)


class ExpiringCodec:
    """Seals ``requestState`` as the SDK does; :meth:`expire` makes every
    token sealed before it fail verification, as the end of a TTL would."""

    def __init__(self) -> None:
        self._codec = AESGCMRequestStateCodec([os.urandom(32)])

    def seal(self, payload: bytes) -> str:
        return self._codec.seal(payload)

    def unseal(self, token: str) -> bytes:
        return self._codec.unseal(token)

    def expire(self) -> None:
        self._codec = AESGCMRequestStateCodec([os.urandom(32)])


def report(result: types.ElicitResult) -> str:
    """What a tool received: the action, and each value with its Python type."""
    content = result.content
    typed = None if content is None else {k: [type(v).__name__, v] for k, v in content.items()}
    return json.dumps({"action": result.action, "content": typed})


async def elicit(
    ctx: Context, key: str, params: types.ElicitRequestParams
) -> types.ElicitResult | types.InputRequiredResult:
    """Ask the client, the way its protocol version wants."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        answered = (ctx.input_responses or {}).get(key)
        if isinstance(answered, types.ElicitResult):
            return answered
        request = types.ElicitRequest(params=params)
        return types.InputRequiredResult(input_requests={key: request}, request_state=key)
    related = ServerMessageMetadata(related_request_id=ctx.request_context.request_id)
    session: ServerSession = ctx.session
    return await session.send_request(
        types.ElicitRequest(params=params), types.ElicitResult, metadata=related
    )


def form(message: str, schema: dict[str, Any]) -> types.ElicitRequestFormParams:
    return types.ElicitRequestFormParams(message=message, requested_schema=schema)


ASKING_TOOLS = frozenset({"fill", "book_table"})


class ChoosyServer(MCPServer):
    """Lists its asking tools only to clients that declared elicitation, as
    the reference "everything" server does."""

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listed = await super()._handle_list_tools(ctx, params)
        capabilities = ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            listed.tools = [tool for tool in listed.tools if tool.name not in ASKING_TOOLS]
        return listed


def build_server(
    name: str = "kit",
    *,
    kit: Kit | None = None,
    codec: ExpiringCodec | None = None,
    choosy: bool = False,
) -> MCPServer:
    """The test server: tools that elicit forms and links, sample, list
    roots; ``choosy`` hides the asking tools from clients that cannot ask."""
    kit = kit or Kit()
    security = RequestStateSecurity(codec=codec) if codec is not None else None
    mcp = (ChoosyServer if choosy else MCPServer)(name, request_state_security=security)

    @mcp.tool(description="Ask to fill in one of the test forms")
    async def fill(form_name: str, ctx: Context) -> str | types.InputRequiredResult:
        kit.asked += 1
        result = await elicit(ctx, "fill", form(f"Please fill in {form_name}", FORMS[form_name]))
        return result if isinstance(result, types.InputRequiredResult) else report(result)

    @mcp.tool(description="Ask without a mode, as 2025-06-18 servers do")
    async def fill_without_mode(form_name: str, ctx: Context) -> str:
        # No mode on the wire: the request's dump leaves out the None.
        params = types.ElicitRequestFormParams.model_construct(
            message="Old style", requested_schema=FORMS[form_name], mode=None
        )
        related = ServerMessageMetadata(related_request_id=ctx.request_context.request_id)
        request = types.ElicitRequest(params=params)
        return report(await ctx.session.send_request(request, types.ElicitResult, metadata=related))

    @mcp.tool(description="Ask a person to open a link")
    async def open_link(url: str, ctx: Context) -> str | types.InputRequiredResult:
        legacy = ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
        params = types.ElicitRequestURLParams(
            message="Sign in to continue", url=url, elicitation_id=LINK_ID if legacy else None
        )
        result = await elicit(ctx, "link", params)
        if isinstance(result, types.InputRequiredResult):
            return result
        if legacy and result.action == "accept":
            await ctx.session.send_elicit_complete(LINK_ID)
        return report(result)

    @mcp.tool(description="Needs a link opened before it can answer (-32042)")
    async def list_files(ctx: Context) -> str:
        kit.sessions.append(ctx.session)
        if LINK_ID not in kit.linked:
            link = types.ElicitRequestURLParams(
                message="Connect your files", url=LINK_URL, elicitation_id=LINK_ID
            )
            raise UrlElicitationRequiredError([link])
        return "report.pdf, plan.txt"

    @mcp.tool(description="Asks, and gives up when the test says so")
    async def ask_then_give_up(ctx: Context) -> str:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def stop() -> None:
                    await kit.give_up.wait()
                    scope.cancel()

                group.start_soon(stop)
                await elicit(ctx, "contact", form("Who are you?", FORMS["contact"]))
                group.cancel_scope.cancel()
                return "answered"
        return "gave up"

    @mcp.tool(description="Always fails")
    def broken() -> str:
        raise ToolError("the kitchen is closed")

    @mcp.tool(description="Has the client's model summarize a text")
    async def summarize(text: str, ctx: Context) -> str | types.InputRequiredResult:
        message = types.SamplingMessage(
            role="user", content=types.TextContent(type="text", text=f"Summarize: {text}")
        )
        params = types.CreateMessageRequestParams(
            messages=[message], max_tokens=200, system_prompt="You write short summaries."
        )
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            answered = (ctx.input_responses or {}).get("summary")
            if not isinstance(answered, types.CreateMessageResult):
                request = types.CreateMessageRequest(params=params)
                return types.InputRequiredResult(
                    input_requests={"summary": request}, request_state="summary"
                )
            result = answered
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # sampling is deprecated in 2026-07-28
                result = await ctx.session.create_message(
                    messages=[message], max_tokens=200, system_prompt=params.system_prompt
                )
        content = result.content
        said = content.text if isinstance(content, types.TextContent) else "?"
        return f"summary by {result.model}: {said}"

    @mcp.tool(description="Names the client's roots")
    async def roots(ctx: Context) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # roots are deprecated in 2026-07-28
            listed = await ctx.session.list_roots()
        return ", ".join(str(root.uri) for root in listed.roots)

    @mcp.tool(description="Book a table at a restaurant")
    async def book_table(restaurant: str, ctx: Context) -> str | types.InputRequiredResult:
        kit.asked += 1
        result = await elicit(ctx, "booking", form(f"Booking at {restaurant}", BOOKING))
        if isinstance(result, types.InputRequiredResult):
            return result
        if result.action != "accept" or result.content is None:
            return f"No booking ({result.action})"
        party, time = result.content["party"], result.content["time"]
        return f"Booked {restaurant} for {party} ({type(party).__name__}) at {time}"

    return mcp


def stdio_command() -> tuple[str, list[str], str]:
    """How to run this module's server over stdio: command, args, cwd."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sys.executable, ["-m", "tests.mcp_kit"], root


# ─── The people's side ───────────────────────────────────────────────────────


@dataclass
class Room:
    """A participant in a chat with an active turn."""

    person: HuddleClient
    chat: str
    mirror: Mirror


async def open_room(huddle: RunningServer, name: str = "alice", turn: str = "t1") -> Room:
    """A session whose chat has an active turn, with ``name`` watching it."""
    person = await huddle.client(name=name)
    session = f"ahp-session:/{name}-{turn}"
    await person.create_session(session, title="MCP")
    state = (await person.subscribe(session)).state
    assert isinstance(state, SessionState)
    chat = state.default_chat
    assert chat is not None
    mirror = await person.subscribe(chat)
    started = ChatTurnStarted(
        turn_id=turn, started_at="2027-03-01T09:00:00.000Z", message=user_message("Go")
    )
    await person.dispatch_and_wait(chat, started)
    return Room(person, chat, mirror)


def input_parts(state: object) -> list[InputRequestPart]:
    assert isinstance(state, ChatState)
    parts = [p for t in state.turns for p in t.response_parts]
    if state.active_turn is not None:
        parts.extend(state.active_turn.response_parts)
    return [p for p in parts if isinstance(p, InputRequestPart)]


async def wait_for(mirror: Mirror, predicate: Callable[[ChatState], bool]) -> ChatState:
    def check(state: object) -> bool:
        return isinstance(state, ChatState) and predicate(state)

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(check)
    assert isinstance(state, ChatState)
    return state


async def next_request(mirror: Mirror, seen: int = 0) -> InputRequestPart:
    """The open input request, once there are more than ``seen`` requests."""

    def ready(state: ChatState) -> bool:
        parts = input_parts(state)
        return len(parts) > seen and parts[-1].response is None

    return input_parts(await wait_for(mirror, ready))[-1]


async def resolved(mirror: Mirror, request_id: str) -> InputRequestPart:
    """The request, once resolved."""

    def done(state: ChatState) -> bool:
        return any(p.request.id == request_id and p.response for p in input_parts(state))

    parts = input_parts(await wait_for(mirror, done))
    return next(p for p in parts if p.request.id == request_id)


def submitted(**values: InputAnswerValue) -> dict[str, InputAnswer]:
    return {key: InputAnswer(state="submitted", value=value) for key, value in values.items()}


async def reply(
    room: Room,
    request_id: str,
    response: InputResponseKind = "accept",
    answers: dict[str, InputAnswer] | None = None,
) -> None:
    action = ChatInputCompleted(request_id=request_id, response=response, answers=answers)
    await room.person.dispatch_and_wait(room.chat, action)


if __name__ == "__main__":
    arguments = sys.argv[1:]
    choosy = "--choosy" in arguments
    names = [a for a in arguments if a != "--choosy"]
    build_server(names[0] if names else "kit", choosy=choosy).run("stdio")
