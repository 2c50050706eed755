"""MCP servers as tool sources of an agent: the runner calls their tools
under the agent's approval policy, and their elicitations reach the people
of the turn's chat. Real MCP servers over stdio and streamable HTTP, a real
Huddle server running the agent, a participant on a real WebSocket."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
import uvicorn

from protocol.actions import ChatToolCallConfirmed, ChatTurnStarted
from protocol.chat import (
    ChatState,
    InputRequestPart,
    MarkdownPart,
    NumberValue,
    SelectedValue,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from server.config import Settings, settings_from
from server.edge.serve import UvicornServer
from server.mcp import McpServerConfig, McpToolFailed, McpToolSource
from server.runner.agent import Agent, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.model import ModelReply, ScriptedModel, last_tool_result
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.turn import ModelMessage, ToolCall
from server.runner.worker import Crew
from server.store.redis import RedisStore
from tests.conftest import RunningServer, start_server, user_message
from tests.edge import eventually, http
from tests.mcp_kit import (
    LEGACY,
    MODERN,
    WITHIN,
    Kit,
    Room,
    build_server,
    next_request,
    open_room,
    reply,
    stdio_command,
    submitted,
    wait_for,
)
from tests.redis_server import RedisServer


@asynccontextmanager
async def served_over_http(name: str) -> AsyncIterator[str]:
    """The kit's MCP server on a free port (streamable HTTP); yields its URL."""
    app = build_server(name).streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
    server = UvicornServer(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(WITHIN):
            await server.listening.wait()
        yield f"http://127.0.0.1:{server.port}/mcp"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def bookings_source(transport: str, mode: str) -> AsyncIterator[McpToolSource]:
    if transport == "stdio":
        command, args, cwd = stdio_command()
        config = McpServerConfig.stdio("bookings", command, *args, "bookings", cwd=cwd, mode=mode)
        async with McpToolSource(config) as source:
            yield source
    else:
        async with served_over_http("bookings") as url:
            config = McpServerConfig.http("bookings", url, mode=mode)
            async with McpToolSource(config) as source:
                yield source


def concierge(tools: Sequence[Tool]) -> Agent:
    """Books a table at Chez Huddle, then reports what the tool said."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        result = last_tool_result(messages, "book_table")
        if result is None:
            call = ToolCall(id="c1", name="book_table", arguments={"restaurant": "Chez Huddle"})
            return ModelReply(tool_calls=[call])
        return ModelReply(text=f"All set. {result}")

    return Agent(
        name="concierge",
        instructions="Book tables.",
        model=ScriptedModel(script),
        tools=tuple(tools),
        approval_policy=require_approval_for("book_table", message="Book a table?"),
    )


@asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[RunningServer]:
    huddle = await start_server(agent=agent)
    try:
        yield huddle
    finally:
        await huddle.stop()


async def start_turn(huddle: RunningServer) -> Room:
    person = await huddle.client(name="alice")
    await person.create_session("ahp-session:/dinner", title="Dinner")
    session = await person.subscribe("ahp-session:/dinner")
    chat = getattr(session.state, "default_chat", None)
    assert isinstance(chat, str)
    mirror = await person.subscribe(chat)
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-03-01T19:00:00.000Z", message=user_message("A table")
    )
    await person.dispatch_and_wait(chat, started)
    return Room(person, chat, mirror)


def pending(state: ChatState) -> ToolCallPendingConfirmation | None:
    turn = state.active_turn
    for part in turn.response_parts if turn else []:
        if isinstance(part, ToolCallPart) and isinstance(
            part.tool_call, ToolCallPendingConfirmation
        ):
            return part.tool_call
    return None


def final_text(state: ChatState) -> str:
    return "".join(p.content for p in state.turns[-1].response_parts if isinstance(p, MarkdownPart))


@pytest.mark.parametrize(
    ("transport", "mode"),
    [("stdio", LEGACY), ("stdio", MODERN), ("http", LEGACY), ("http", MODERN)],
)
async def test_an_agent_turn_calls_an_mcp_tool_that_is_approved_and_asks_the_chat(
    transport: str, mode: str
) -> None:
    async with bookings_source(transport, mode) as source:
        agent = concierge(await source.list_tools())
        assert agent.tool("book_table") is not None
        async with running(agent) as huddle:
            room = await start_turn(huddle)
            state = await wait_for(room.mirror, lambda s: pending(s) is not None)
            call = pending(state)
            assert call is not None
            assert call.tool_name == "book_table"
            assert json.loads(call.tool_input or "{}") == {"restaurant": "Chez Huddle"}
            approve = ChatToolCallConfirmed(
                turn_id="t1", tool_call_id=call.tool_call_id, approved=True, confirmed="user-action"
            )
            await room.person.dispatch_and_wait(room.chat, approve)
            part = await next_request(room.mirror)
            assert part.request.message == "bookings asks: Booking at Chez Huddle"
            answers = submitted(party=NumberValue(value=4), time=SelectedValue(value="19:30"))
            await reply(room, part.request.id, "accept", answers)
            done = await wait_for(room.mirror, lambda s: bool(s.turns))
    assert done.turns[-1].state == "complete"
    said = final_text(done).removeprefix("All set. ")
    assert json.loads(said) == {"result": "Booked Chez Huddle for 4 (int) at 19:30"}


async def test_an_mcp_tool_call_denied_in_the_chat_never_reaches_the_server() -> None:
    kit = Kit()
    config = McpServerConfig.in_process("bookings", build_server("bookings", kit=kit))
    async with McpToolSource(config) as source:
        agent = concierge(await source.list_tools())
        async with running(agent) as huddle:
            room = await start_turn(huddle)
            state = await wait_for(room.mirror, lambda s: pending(s) is not None)
            call = pending(state)
            assert call is not None
            deny = ChatToolCallConfirmed(
                turn_id="t1", tool_call_id=call.tool_call_id, approved=False, reason="denied"
            )
            await room.person.dispatch_and_wait(room.chat, deny)
            done = await wait_for(room.mirror, lambda s: bool(s.turns))
    assert done.turns[-1].state == "complete"
    assert "rejected" in final_text(done)
    assert kit.asked == 0


async def test_an_mcp_tool_error_fails_the_call_with_the_tool_text() -> None:
    config = McpServerConfig.in_process("bookings", build_server("bookings"), prefix="bk_")
    async with McpToolSource(config) as source:
        tools = {tool.name: tool for tool in await source.list_tools()}
        assert "bk_broken" in tools
        with pytest.raises(McpToolFailed, match="the kitchen is closed"):
            await source.call("broken", {}, people=None)


async def test_tools_listed_outside_an_event_loop_are_called_in_the_servers_loop() -> None:
    # How `huddle serve --agent module:function` defines an agent: no loop to await in.
    command, args, cwd = stdio_command()
    config = McpServerConfig.stdio("bookings", command, *args, "bookings", cwd=cwd)
    async with McpToolSource(config) as source:
        tools = {tool.name: tool for tool in source.list_tools_sync()}
        assert tools["book_table"].description == "Book a table at a restaurant"
        with pytest.raises(McpToolFailed, match="the kitchen is closed"):
            await source.call("broken", {}, people=None)


def asker(tools: Sequence[Tool], *, asks: int = 1, seen: list[str] | None = None) -> Agent:
    """Has the MCP server ask for a contact (``asks`` times, one call after
    the other), then reports what it said. ``seen`` collects the chat of any
    tool context the model finds itself in (it runs outside every tool)."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        with contextlib.suppress(LookupError):
            if seen is not None:
                seen.append(str(ToolContext.current().chat))
        result = last_tool_result(messages, "fill")
        if result is None:
            calls = [ToolCall(id=f"c{i}", name="fill", arguments=CONTACT) for i in range(asks)]
            return ModelReply(tool_calls=calls)
        return ModelReply(text=f"Said: {result}")

    return Agent(name="asker", instructions="Ask.", model=ScriptedModel(script), tools=tuple(tools))


CONTACT = {"form_name": "contact"}
ALICE = submitted(name=TextValue(value="Alice"), email=TextValue(value="alice@example.com"))


async def asked(huddle: RunningServer, name: str) -> tuple[Room, InputRequestPart]:
    """``name``'s chat, where the asker's turn waits on the MCP server's question."""
    room = await open_room(huddle, name)
    return room, await next_request(room.mirror)


async def answered(room: Room, part: InputRequestPart) -> ChatState:
    await reply(room, part.request.id, "accept", ALICE)
    return await wait_for(room.mirror, lambda s: bool(s.turns))


async def metrics_of(huddle: RunningServer) -> str:
    reply = await http("GET", f"{huddle.http}/metrics", token=huddle.token("agent"))
    return reply.body.decode()


async def lends_its_place(huddle: RunningServer) -> None:
    """One worker (the default): an MCP question holds it, and a spare runs
    the other chats' turns meanwhile (the spare in a context of its own: not
    the tool's that lent it)."""
    try:
        crew = huddle.server.parts.service.crew  # type: ignore[union-attr]
        first, waiting = await asked(huddle, "alice")
        assert crew.lent == 1
        second, other = await asked(huddle, "bob")  # stalled here before
        assert crew.lent == 2  # the spare's own question lent its place too
        assert "huddle_runner_spare_workers 2.0" in await metrics_of(huddle)
        assert (await answered(second, other)).turns[-1].state == "complete"
        done = await answered(first, waiting)
        await eventually(lambda: crew.lent == 0)  # the spares retire
    finally:
        await huddle.stop()
    assert done.turns[-1].state == "complete"
    assert "Alice" in final_text(done)


async def test_an_unanswered_mcp_question_leaves_the_worker_to_other_chats() -> None:
    config = McpServerConfig.in_process("kit", build_server("kit"))
    seen: list[str] = []
    async with McpToolSource(config) as source:
        agent = asker(await source.list_tools(), seen=seen)
        await lends_its_place(await start_server(agent=agent))
    assert seen == []  # bob's model ran in the spare, which alice's tool had started


async def test_a_spare_worker_waits_for_work_in_redis(redis_server: RedisServer) -> None:
    config = McpServerConfig.in_process("kit", build_server("kit"))
    async with McpToolSource(config) as source:
        agent, url = asker(await source.list_tools()), redis_server.url
        turns = RedisTurnStore(url)
        await lends_its_place(
            await start_server(None, RedisStore(url), agent=agent, turn_store=turns)
        )


@asynccontextmanager
async def asking_server(
    spares: int = 8, asks: int = 1
) -> AsyncIterator[tuple[RunningServer, Crew]]:
    """A server whose agent the kit's MCP server asks through (``asks``
    questions a turn), with one worker and ``spares`` spares; and its crew."""
    config = McpServerConfig.in_process("kit", build_server("kit"))
    async with McpToolSource(config) as source:
        agent = asker(await source.list_tools(), asks=asks)
        huddle = await start_server(Settings(port=0, spare_workers=spares), agent=agent)
        try:
            assert huddle.server.parts.service is not None
            yield huddle, huddle.server.parts.service.crew
        finally:
            await huddle.stop()


async def test_with_no_spare_left_other_turns_wait_for_an_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with asking_server(spares=0) as (huddle, crew):
        first, waiting = await asked(huddle, "alice")
        assert "all 0 spare workers are lent" in caplog.text
        assert "huddle_runner_spares_exhausted_total 1.0" in await metrics_of(huddle)
        second = await open_room(huddle, "bob")  # waits for the worker
        assert (await answered(first, waiting)).turns[-1].state == "complete"
        other = await next_request(second.mirror)  # its turn ran once the worker was free
        assert (await answered(second, other)).turns[-1].state == "complete"
        assert crew.lent == 0


async def test_a_place_that_comes_free_goes_to_a_wait_that_found_none() -> None:
    async with asking_server(spares=1) as (huddle, crew):
        alice, for_alice = await asked(huddle, "alice")  # the worker lends its place
        bob, for_bob = await asked(huddle, "bob")  # the spare asks, and finds none
        await answered(alice, for_alice)  # the worker is free again...
        carol, for_carol = await asked(huddle, "carol")  # ...and asks: the cap is reached
        await answered(bob, for_bob)  # the spare ends bob's turn, in carol's worker's place
        dave, for_dave = await asked(huddle, "dave")  # stalled here before
        assert crew.lent == 1
        for room, part in ((carol, for_carol), (dave, for_dave)):
            assert (await answered(room, part)).turns[-1].state == "complete"
        await eventually(lambda: crew.lent == 0)


async def test_one_turns_questions_in_a_row_keep_one_spare() -> None:
    async with asking_server(asks=3) as (huddle, crew):
        room, part = await asked(huddle, "alice")
        for seen in (1, 2):
            await reply(room, part.request.id, "accept", ALICE)
            part = await next_request(room.mirror, seen)
            assert crew.lent == 1  # the spare still finishing stays; no second one
        assert (await answered(room, part)).turns[-1].state == "complete"


def test_worker_counts_are_zero_or_more() -> None:
    assert settings_from({"spare_workers": 0}, {}).spare_workers == 0
    with pytest.raises(ValueError, match="--spare-workers is a count: 0 or more, not -5"):
        settings_from({"spare_workers": -5}, {})
    with pytest.raises(ValueError, match="--workers is a count"):
        settings_from({}, {"HUDDLE_WORKERS": "-1"})


async def test_a_spare_that_stops_gives_its_place_to_the_first_wait_without_one() -> None:
    async with asking_server(spares=2) as (huddle, crew):
        alice, for_alice = await asked(huddle, "alice")  # the worker lends: spare 1
        bob, for_bob = await asked(huddle, "bob")  # spare 1 lends: spare 2
        carol, for_carol = await asked(huddle, "carol")  # spare 2 asks: none left
        assert (crew.lent, crew.exhausted) == (2, 1)
        await answered(alice, for_alice)  # spare 1 is to stop once bob's turn ends
        await answered(bob, for_bob)  # it does; its place goes to spare 2's wait
        await eventually(lambda: crew.lent == 2 and not crew._wanting)
        assert (await answered(carol, for_carol)).turns[-1].state == "complete"
        await eventually(lambda: crew.lent == 0)
