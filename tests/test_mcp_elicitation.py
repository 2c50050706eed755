"""MCP elicitations answered by people in a chat: a real MCP server (the
SDK's server API, in process and over stdio), a real Huddle server, people
on real WebSockets; both protocol flows (2025-11-25 requests, 2026-07-28
``input_required`` retries)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Literal, TypeVar

import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError

from protocol.actions import ChatInputCompleted, ChatTurnCancelled
from protocol.chat import (
    BooleanValue,
    InputAnswer,
    IntegerQuestion,
    MultiSelectQuestion,
    NumberValue,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
)
from server.config import Settings
from server.core.expiry import Expiry
from server.errors import ActionRejected
from server.mcp import (
    ChatElicitation,
    HostChat,
    LinkRefused,
    RemoteChat,
    UrlCompletions,
    call_tool,
)
from server.mcp.elicitation import question_for
from tests.conftest import UNIT, RunningServer, start_server
from tests.mcp_kit import (
    EVERYTHING,
    LINK_ID,
    LINK_URL,
    MODES,
    VERSIONS,
    WITHIN,
    ExpiringCodec,
    Kit,
    build_server,
    input_parts,
    next_request,
    open_room,
    reply,
    resolved,
    stdio_command,
    submitted,
    wait_for,
)

T = TypeVar("T")

EVERYTHING_ANSWERS = submitted(
    name=TextValue(value="Ada Lovelace"),
    email=TextValue(value="ada@example.com"),
    birthday=TextValue(value="1815-12-10"),
    party=NumberValue(value=4.0),
    budget=NumberValue(value=99.5),
    vegetarian=BooleanValue(value=True),
    color=SelectedValue(value="green"),
    seat=SelectedValue(value="window"),
    courses=SelectedManyValue(value=["soup", "dessert"]),
    drinks=SelectedManyValue(value=["tea"]),
    code=TextValue(value="ABC"),
) | {"nickname": InputAnswer(state="skipped")}

EVERYTHING_RECEIVED = {
    "name": ["str", "Ada Lovelace"],
    "email": ["str", "ada@example.com"],
    "birthday": ["str", "1815-12-10"],
    "party": ["int", 4],
    "budget": ["float", 99.5],
    "vegetarian": ["bool", True],
    "color": ["str", "green"],
    "seat": ["str", "window"],
    "courses": ["list", ["soup", "dessert"]],
    "drinks": ["list", ["tea"]],
    "code": ["str", "ABC"],
}


@asynccontextmanager
async def connected(
    server: MCPServer | StdioServerParameters,
    mode: str,
    asker: ChatElicitation,
    completions: UrlCompletions | None = None,
) -> AsyncIterator[Client]:
    handler = completions.message_handler if completions else None
    client = Client(server, mode=mode, elicitation_callback=asker, message_handler=handler)
    async with client:
        assert client.protocol_version == VERSIONS[mode]
        yield client


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


def received(result: types.CallToolResult) -> dict[str, Any]:
    """What the MCP tool reported it received."""
    data: dict[str, Any] = json.loads(text_of(result))
    return data


async def within(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(WITHIN):
        return await awaitable


# ─── The form, as the chat shows it ──────────────────────────────────────────


def test_every_property_of_a_form_becomes_a_question_naming_the_server() -> None:
    params = types.ElicitRequestFormParams(message="About you", requested_schema=EVERYTHING)
    request = question_for(params, server="bookings", request_id="mcp:1").request
    assert request.message == "bookings asks: About you"
    questions = {q.id: q for q in request.questions or []}
    assert list(questions) == list(EVERYTHING["properties"])
    name = questions["name"]
    assert isinstance(name, TextQuestion)
    assert (name.title, name.message, name.required, name.min, name.max) == (
        "Name",
        "Your full name",
        True,
        2,
        40,
    )
    email = questions["email"]
    assert isinstance(email, TextQuestion)
    assert (email.format, email.message, email.required) == ("email", "Where we write to", True)
    party = questions["party"]
    assert isinstance(party, IntegerQuestion)
    assert (party.min, party.max, party.default_value, party.required) == (1, 12, 2, True)
    color = questions["color"]
    assert isinstance(color, SingleSelectQuestion)
    assert [(o.id, o.label) for o in color.options] == [
        ("red", "Red"),
        ("green", "Green"),
        ("blue", "Blue"),
    ]
    seat = questions["seat"]
    assert isinstance(seat, SingleSelectQuestion)
    assert [(o.id, o.label, o.recommended) for o in seat.options] == [
        ("window", "By the window", None),
        ("aisle", "On the aisle", True),
    ]
    courses = questions["courses"]
    assert isinstance(courses, MultiSelectQuestion)
    assert (courses.min, courses.max, courses.required) == (1, 2, True)
    drinks = questions["drinks"]
    assert isinstance(drinks, MultiSelectQuestion)
    assert [(o.id, o.label) for o in drinks.options] == [("tea", "Tea"), ("wine", "Wine")]
    assert questions["nickname"].required is None  # anyOf [string, null]: optional


# ─── Answers reach the MCP tool ──────────────────────────────────────────────


@pytest.mark.parametrize("mode", MODES)
async def test_every_field_type_reaches_the_mcp_tool_with_its_python_type(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server("bookings"), mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "everything"}))
        part = await next_request(room.mirror)
        assert part.request.message == "bookings asks: Please fill in everything"
        await reply(room, part.request.id, "accept", EVERYTHING_ANSWERS)
        result = await within(call)
    assert received(result) == {"action": "accept", "content": EVERYTHING_RECEIVED}


@pytest.mark.parametrize("mode", MODES)
async def test_a_decline_reaches_the_mcp_tool_without_content(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "contact"}))
        part = await next_request(room.mirror)
        await reply(room, part.request.id, "decline", submitted(name=TextValue(value="Ada")))
        result = await within(call)
    assert received(result) == {"action": "decline", "content": None}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["dismissed", "turn cancelled", "withdrawn by the agent"])
async def test_cancel_reaches_the_mcp_tool_when_nobody_will_answer(
    huddle: RunningServer, mode: str, how: str
) -> None:
    room = await open_room(huddle)
    host = huddle.server.host
    asker = ChatElicitation(HostChat(host, room.chat))
    async with connected(build_server(), mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "contact"}))
        part = await next_request(room.mirror)
        if how == "dismissed":
            await reply(room, part.request.id, "cancel")
        elif how == "turn cancelled":
            await room.person.dispatch_and_wait(
                room.chat, ChatTurnCancelled(turn_id="t1", duration=1)
            )
        else:
            await host.dispatch(
                room.chat, ChatInputCompleted(request_id=part.request.id, response="cancel")
            )
        result = await within(call)
    assert received(result) == {"action": "cancel", "content": None}


@pytest.mark.parametrize("mode", MODES)
async def test_an_accept_missing_a_required_field_is_refused_before_it_reaches_the_tool(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "contact"}))
        part = await next_request(room.mirror)
        with pytest.raises(ActionRejected, match="email"):
            await reply(room, part.request.id, "accept", submitted(name=TextValue(value="Ada")))
        assert not call.done()
        assert input_parts(room.mirror.chat)[-1].response is None
        answers = submitted(name=TextValue(value="Ada"), email=TextValue(value="ada@example.com"))
        await reply(room, part.request.id, "accept", answers)
        result = await within(call)
    content = {"name": ["str", "Ada"], "email": ["str", "ada@example.com"]}
    assert received(result) == {"action": "accept", "content": content}


async def test_an_accept_the_schema_refuses_is_asked_again_when_the_host_cannot_check_it(
    huddle: RunningServer,
) -> None:
    # A remote bridge cannot freeze the schema in the host, which then lets
    # `code: "abc"` through (AHP questions have no pattern): the bridge
    # checks before it accepts, and asks again with the answers kept.
    room = await open_room(huddle)
    agent = await huddle.client("agent")
    asker = ChatElicitation(RemoteChat(agent, room.chat))
    async with connected(build_server(), MODES[0], asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "everything"}))
        first = await next_request(room.mirror)
        wrong = EVERYTHING_ANSWERS | submitted(code=TextValue(value="abc"))
        await reply(room, first.request.id, "accept", wrong)
        second = await next_request(room.mirror, seen=1)
        assert "code fails the schema's `pattern` rule" in (second.request.message or "")
        assert second.request.answers == wrong
        await reply(room, second.request.id, "accept", submitted(code=TextValue(value="ABC")))
        result = await within(call)
    assert received(result) == {"action": "accept", "content": EVERYTHING_RECEIVED}


# ─── Lenient with what servers send ──────────────────────────────────────────


@pytest.mark.parametrize("mode", MODES)
async def test_a_form_without_properties_is_a_plain_confirm(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "confirm"}))
        part = await next_request(room.mirror)
        assert part.request.questions == []
        await reply(room, part.request.id, "accept")
        result = await within(call)
    assert received(result) == {"action": "accept", "content": {}}


async def test_a_request_without_a_mode_is_a_form(huddle: RunningServer) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), MODES[0], asker) as client:
        call = asyncio.create_task(call_tool(client, "fill_without_mode", {"form_name": "contact"}))
        part = await next_request(room.mirror)
        answers = submitted(name=TextValue(value="Ada"), email=TextValue(value="a@b.example"))
        await reply(room, part.request.id, "accept", answers)
        result = await within(call)
    content = {"name": ["str", "Ada"], "email": ["str", "a@b.example"]}
    assert received(result) == {"action": "accept", "content": content}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        (
            "fill",
            {"form_name": "nested"},
            "property 'address': 'type' 'object' (a nested object) is not supported",
        ),
        ("fill", {"form_name": "negated"}, "property 'code': 'not' is not supported on text"),
        ("open_link", {"url": "javascript:alert(1)"}, "the link must be an http or https URL"),
    ],
    ids=["nested object", "a keyword outside the subset", "javascript link"],
)
async def test_what_cannot_be_asked_gets_a_clear_error_and_asks_nobody(
    huddle: RunningServer, mode: str, tool: str, arguments: dict[str, Any], reason: str
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), mode, asker) as client:
        with pytest.raises(MCPError) as raised:
            await within(call_tool(client, tool, arguments))
    assert raised.value.code == types.INVALID_PARAMS
    assert reason in raised.value.message
    assert input_parts(room.mirror.chat) == []


@pytest.mark.parametrize("through", ["host", "remote"])
async def test_a_question_too_large_for_the_chat_is_an_error_naming_the_size(
    huddle: RunningServer, through: str
) -> None:
    room = await open_room(huddle)
    if through == "host":
        people: HostChat | RemoteChat = HostChat(huddle.server.host, room.chat)
    else:
        people = RemoteChat(await huddle.client("agent"), room.chat)
    async with connected(build_server(), MODES[0], ChatElicitation(people)) as client:
        with pytest.raises(MCPError) as raised:  # not a cancel, as from a person
            await within(call_tool(client, "fill", {"form_name": "huge"}))
    assert raised.value.code == types.INVALID_PARAMS
    assert "too-large: the chat/inputRequested action is" in raised.value.message
    assert "the limit is 524,288" in raised.value.message
    assert input_parts(room.mirror.chat) == []


async def test_without_a_chat_to_ask_in_the_server_gets_an_error(huddle: RunningServer) -> None:
    asker = ChatElicitation(route=lambda: None)
    async with connected(build_server(), MODES[1], asker) as client:
        with pytest.raises(MCPError) as raised:
            await within(call_tool(client, "fill", {"form_name": "contact"}))
    assert raised.value.code == types.INVALID_REQUEST
    assert "no chat" in raised.value.message


# ─── URL mode ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("mode", MODES)
async def test_a_url_elicitation_is_a_url_request_whose_accept_sends_no_content(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    completions = UrlCompletions()
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    url = "https://login.example.test/start?flow=42"
    async with connected(build_server("calendar"), mode, asker, completions) as client:
        call = asyncio.create_task(call_tool(client, "open_link", {"url": url}))
        part = await next_request(room.mirror)
        assert part.request.url == url
        assert part.request.questions is None
        assert part.request.message == "calendar asks: Sign in to continue"
        await reply(room, part.request.id, "accept")
        result = await within(call)
        if mode == MODES[0]:  # 2025-11-25: the server says when the interaction is done
            assert await completions.wait([LINK_ID], WITHIN)
    assert received(result) == {"action": "accept", "content": None}


async def test_a_url_required_error_asks_for_the_link_then_calls_again_once_complete(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle)
    kit, completions = Kit(), UrlCompletions()
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server("files", kit=kit), MODES[0], asker, completions) as client:
        call = asyncio.create_task(
            call_tool(client, "list_files", elicitation=asker, completions=completions)
        )
        part = await next_request(room.mirror)
        assert part.request.url == LINK_URL
        assert part.request.message == "files asks: Connect your files"
        await reply(room, part.request.id, "accept")
        await kit.visit(LINK_ID)  # the person's browser finished the interaction
        result = await within(call)
    assert text_of(result) == "report.pdf, plan.txt"


async def test_a_url_required_error_whose_link_is_declined_fails_the_call(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server("files"), MODES[0], asker) as client:
        call = asyncio.create_task(call_tool(client, "list_files", elicitation=asker))
        part = await next_request(room.mirror)
        await reply(room, part.request.id, "decline")
        with pytest.raises(LinkRefused, match="people declined it"):
            await within(call)


# ─── The MCP side giving up ──────────────────────────────────────────────────


async def test_the_mcp_server_giving_up_withdraws_the_chat_request(huddle: RunningServer) -> None:
    room = await open_room(huddle)
    kit = Kit()
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(kit=kit), MODES[0], asker) as client:
        call = asyncio.create_task(call_tool(client, "ask_then_give_up"))
        part = await next_request(room.mirror)
        kit.give_up.set()  # the server cancels its elicitation/create
        withdrawn = await resolved(room.mirror, part.request.id)
        result = await within(call)
    assert withdrawn.response == "cancel"
    assert text_of(result) == "gave up"


async def test_a_call_given_up_while_people_answer_withdraws_its_request(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle)
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    async with connected(build_server(), MODES[1], asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "contact"}))
        part = await next_request(room.mirror)
        call.cancel()
        withdrawn = await resolved(room.mirror, part.request.id)
        with pytest.raises(asyncio.CancelledError):
            await call
    assert withdrawn.response == "cancel"


# ─── 2026-07-28: requestState ────────────────────────────────────────────────


async def test_an_expired_request_state_is_called_again_and_asked_again(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle)
    kit, codec = Kit(), ExpiringCodec()
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    answers = submitted(name=TextValue(value="Ada"), email=TextValue(value="ada@example.com"))
    server = build_server("bookings", kit=kit, codec=codec)
    async with connected(server, MODES[1], asker) as client:
        call = asyncio.create_task(
            call_tool(client, "fill", {"form_name": "contact"}, elicitation=asker)
        )
        first = await next_request(room.mirror)
        codec.expire()  # people took longer than the server keeps its state
        await reply(room, first.request.id, "accept", answers)
        second = await next_request(room.mirror, seen=1)
        assert second.request.answers == answers  # filled in with what they gave
        assert "Asked again" in (second.request.message or "")
        await reply(room, second.request.id, "accept")
        result = await within(call)
    content = {"name": ["str", "Ada"], "email": ["str", "ada@example.com"]}
    assert received(result) == {"action": "accept", "content": content}
    assert kit.asked == 3  # the first call, the call made afresh, and its retry


# ─── Over stdio, through a remote Huddle client ──────────────────────────────


@pytest.mark.parametrize("mode", MODES)
async def test_a_stdio_server_asks_through_a_remote_huddle_client(
    huddle: RunningServer, mode: str
) -> None:
    room = await open_room(huddle)
    agent = await huddle.client("agent")
    asker = ChatElicitation(RemoteChat(agent, room.chat))
    command, args, cwd = stdio_command()
    server = StdioServerParameters(command=command, args=[*args, "weather"], cwd=cwd)
    async with connected(server, mode, asker) as client:
        call = asyncio.create_task(call_tool(client, "fill", {"form_name": "everything"}))
        part = await next_request(room.mirror)
        assert part.request.message == "weather asks: Please fill in everything"
        await reply(room, part.request.id, "accept", EVERYTHING_ANSWERS)
        result = await within(call)
    assert received(result) == {"action": "accept", "content": EVERYTHING_RECEIVED}


# ─── A remote bridge's questions that nobody answers ────────────────────────


@pytest.fixture
async def sweeping() -> AsyncIterator[RunningServer]:
    """A server whose expiry sweep runs every few milliseconds."""
    running = await start_server(Settings(port=0, expiry_check_interval=0.02 * UNIT))
    try:
        yield running
    finally:
        await running.stop()


@pytest.mark.parametrize("policy", ["cancel", "decline"])
async def test_a_remote_bridges_question_nobody_answers_gets_its_expirys_answer(
    sweeping: RunningServer, policy: Literal["cancel", "decline"]
) -> None:
    room = await open_room(sweeping)
    agent = await sweeping.client("agent")
    asker = ChatElicitation(RemoteChat(agent, room.chat), expiry=Expiry(0.1 * UNIT, policy))
    async with connected(build_server(), MODES[0], asker) as client:
        result = await within(call_tool(client, "fill", {"form_name": "contact"}))

    assert received(result) == {"action": policy, "content": None}
    [part] = input_parts(room.mirror.state)
    assert part.response == policy


async def test_a_remote_bridges_question_that_expires_with_fail_is_an_error_to_the_server(
    sweeping: RunningServer,
) -> None:
    room = await open_room(sweeping)
    agent = await sweeping.client("agent")
    asker = ChatElicitation(RemoteChat(agent, room.chat), expiry=Expiry(0.1 * UNIT, "fail"))
    async with connected(build_server(), MODES[0], asker) as client:
        with pytest.raises(MCPError) as raised:
            await within(call_tool(client, "fill", {"form_name": "contact"}))

    assert asker.expired is not None
    assert asker.expired.chat == room.chat
    assert raised.value.error.code == types.REQUEST_TIMEOUT
    state = await wait_for(room.mirror, lambda s: s.active_turn is None)
    assert state.turns[-1].error is not None
    assert state.turns[-1].error.error_type == "expired"
