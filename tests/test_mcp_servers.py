"""MCP servers as they are in the wild, with real servers over stdio and
streamable HTTP: one that lists its asking tools only to clients that can
answer, FastMCP (which refuses to ask on 2026-07-28 connections and sends
pydantic's schema shapes), links whose completion never comes, sampling and
roots."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
import pytest
import uvicorn
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from protocol.chat import (
    BooleanValue,
    IntegerQuestion,
    NumberQuestion,
    NumberValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
)
from server.edge.serve import UvicornServer
from server.errors import ActionRejected
from server.mcp import (
    ChatElicitation,
    HostChat,
    LinkRefused,
    McpServerConfig,
    McpToolFailed,
    McpToolSource,
    UrlCompletions,
    call_tool,
)
from server.mcp.sampling import MESSAGE
from server.runner.agent import Agent
from server.runner.model import ModelReply, last_tool_result
from server.runner.turn import ModelMessage, ToolCall
from tests.conftest import RunningServer, start_server
from tests.fastmcp_kit import build as build_fastmcp
from tests.mcp_kit import (
    LINK_ID,
    LINK_URL,
    MODERN,
    WITHIN,
    Kit,
    Room,
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
from tests.runner_kit import Model
from tests.test_mcp_agent import final_text, start_turn

# ─── Capabilities on every path ──────────────────────────────────────────────


def choosy_stdio(**options: Any) -> McpServerConfig:
    command, args, cwd = stdio_command()
    return McpServerConfig.stdio("kit", command, *args, "kit", "--choosy", cwd=cwd, **options)


async def test_tools_listed_outside_an_event_loop_include_those_offered_only_to_askers() -> None:
    command, args, cwd = stdio_command()
    bare = StdioServerParameters(command=command, args=[*args, "kit", "--choosy"], cwd=cwd)
    async with Client(bare, mode="legacy") as client:  # declares no elicitation
        hidden = {tool.name for tool in (await client.list_tools()).tools}
    assert "book_table" not in hidden  # the server is choosy indeed
    async with McpToolSource(choosy_stdio(mode="legacy")) as source:
        listed = {tool.name for tool in source.list_tools_sync()}
        pooled = {tool.name for tool in await source.list_tools()}
    assert "book_table" in listed
    assert listed == pooled


# ─── FastMCP ─────────────────────────────────────────────────────────────────


@asynccontextmanager
async def fastmcp_source(transport: str) -> AsyncIterator[McpToolSource]:
    if transport == "stdio":
        root = stdio_command()[2]
        config = McpServerConfig.stdio(
            "tables", sys.executable, "-m", "tests.fastmcp_kit", cwd=root, mode=MODERN
        )
        async with McpToolSource(config) as source:
            yield source
        return
    app = build_fastmcp().http_app()
    server = UvicornServer(
        uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(WITHIN):
            await server.listening.wait()
        url = f"http://127.0.0.1:{server.port}/mcp"
        async with McpToolSource(McpServerConfig.http("tables", url, mode=MODERN)) as source:
            yield source
    finally:
        server.should_exit = True
        await task


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_fastmcp_server_that_refuses_to_ask_in_2026_is_asked_in_2025_with_its_schema(
    huddle: RunningServer, transport: str
) -> None:
    room = await open_room(huddle)
    async with fastmcp_source(transport) as source:
        assert source.mode == MODERN
        call = asyncio.create_task(
            source.call(
                "book",
                {"restaurant": "Chez Huddle"},
                people=HostChat(huddle.server.host, room.chat),
            )
        )
        part = await next_request(room.mirror)
        questions = {q.id: q for q in part.request.questions or []}
        party, budget = questions["party"], questions["budget"]
        assert isinstance(party, IntegerQuestion)
        assert (party.min, party.max, party.required) == (1, 12, True)  # gt=0, lt=13
        assert isinstance(budget, NumberQuestion)
        assert (budget.min, budget.default_value) == (0, 50.0)
        assert budget.message == "Budget per person (a multiple of 0.5)"
        agree, seat = questions["agree"], questions["seat"]
        assert isinstance(agree, SingleSelectQuestion)
        assert [o.id for o in agree.options] == ["yes"]
        assert isinstance(seat, SingleSelectQuestion)
        assert [(o.id, o.recommended) for o in seat.options] == [
            ("window", None),
            ("aisle", True),
        ]
        assert isinstance(questions["notes"], TextQuestion)
        answers = submitted(
            party=NumberValue(value=4),
            budget=NumberValue(value=37.5),
            agree=SelectedValue(value="yes"),
            seat=SelectedValue(value="window"),
            meal=SelectedValue(value="lunch"),
            vegetarian=BooleanValue(value=True),
        )
        await reply(room, part.request.id, "accept", answers)
        async with asyncio.timeout(WITHIN):
            said = await call
        assert source.mode == "legacy"  # and it keeps to it
    assert json.loads(said["result"]) == {
        "party": ["int", 4],
        "budget": ["float", 37.5],
        "agree": ["str", "yes"],
        "seat": ["str", "window"],
        "meal": ["str", "lunch"],
        "vegetarian": ["bool", True],
        "notes": ["str", ""],
    }


async def test_an_answer_off_a_rule_only_the_schema_knows_is_refused_in_the_chat(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle)
    async with fastmcp_source("stdio") as source:
        call = asyncio.create_task(
            source.call("book", {"restaurant": "X"}, people=HostChat(huddle.server.host, room.chat))
        )
        part = await next_request(room.mirror)
        off_step = submitted(party=NumberValue(value=2), budget=NumberValue(value=10.2))
        with pytest.raises(ActionRejected, match="budget fails the schema's `multipleOf` rule"):
            await reply(room, part.request.id, "accept", off_step)
        await reply(room, part.request.id, "decline")
        async with asyncio.timeout(WITHIN):
            assert await call == {"result": "no booking (decline)"}


# ─── Links whose completion never comes ──────────────────────────────────────


@asynccontextmanager
async def calling_list_files(
    huddle: RunningServer, kit: Kit, **options: Any
) -> AsyncIterator[tuple[Room, asyncio.Task[types.CallToolResult]]]:
    """``list_files`` called, its link put to the chat and accepted."""
    room = await open_room(huddle)
    completions = UrlCompletions()
    asker = ChatElicitation(HostChat(huddle.server.host, room.chat))
    handler = completions.message_handler
    server = build_server("files", kit=kit)
    async with Client(
        server, mode="legacy", elicitation_callback=asker, message_handler=handler
    ) as client:
        call = asyncio.create_task(
            call_tool(client, "list_files", elicitation=asker, completions=completions, **options)
        )
        link = await next_request(room.mirror)
        assert link.request.url == LINK_URL
        await reply(room, link.request.id, "accept")
        yield room, call


async def test_people_saying_done_at_a_link_call_again_at_once(huddle: RunningServer) -> None:
    kit = Kit()
    async with calling_list_files(huddle, kit, link_wait=600.0) as (room, call):
        done = await next_request(room.mirror, seen=1)
        assert "done at files.example.test" in (done.request.message or "")
        kit.visit_quietly(LINK_ID)  # finished there; the server never says so
        await reply(room, done.request.id, "accept")
        async with asyncio.timeout(WITHIN):  # not the 600 s of link_wait
            result = await call
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    assert block.text == "report.pdf, plan.txt"


async def test_a_links_completion_withdraws_the_done_question(huddle: RunningServer) -> None:
    kit = Kit()
    async with calling_list_files(huddle, kit) as (room, call):
        done = await next_request(room.mirror, seen=1)
        await kit.visit(LINK_ID)  # the server says so this time
        async with asyncio.timeout(WITHIN):
            await call
        withdrawn = await resolved(room.mirror, done.request.id)
    assert withdrawn.response == "cancel"


async def test_people_saying_they_will_not_finish_at_a_link_fail_the_call(
    huddle: RunningServer,
) -> None:
    async with calling_list_files(huddle, Kit()) as (room, call):
        done = await next_request(room.mirror, seen=1)
        await reply(room, done.request.id, "decline")
        with pytest.raises(LinkRefused):
            async with asyncio.timeout(WITHIN):
                await call


# ─── Sampling and roots ──────────────────────────────────────────────────────


def summarizer(tools: Sequence[Any]) -> tuple[Agent, Model]:
    """Calls ``summarize``, and is the model the MCP server's sampling
    reaches too (a different conversation: the server's)."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        if messages and messages[0].content == "You write short summaries.":
            return ModelReply(text=f"short ({messages[-1].content})")
        result = last_tool_result(messages, "summarize")
        if result is None:
            call = ToolCall(id="c1", name="summarize", arguments={"text": "a long report"})
            return ModelReply(tool_calls=[call])
        return ModelReply(text=f"All set. {result}")

    model = Model(script)
    agent = Agent(name="summarizer", instructions="Summarize.", model=model, tools=tuple(tools))
    return agent, model


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_a_servers_sampling_is_approved_and_edited_by_people_then_the_agents_model_answers(
    mode: str,
) -> None:
    config = McpServerConfig.in_process("kit", build_server("kit"), mode=mode, sampling=True)
    async with McpToolSource(config) as source:
        agent, model = summarizer(await source.list_tools())
        huddle = await start_server(agent=agent)
        try:
            room = await start_turn(huddle)
            part = await next_request(room.mirror)
            assert part.request.message == (
                "kit wants to send this to the agent's model:\n\n"
                "System: You write short summaries.\n\nUser: Summarize: a long report"
            )
            prefilled = (part.request.answers or {})[MESSAGE].value
            assert prefilled is not None
            assert getattr(prefilled, "value", None) == "Summarize: a long report"
            edited = submitted(**{MESSAGE: TextValue(value="Summarize in five words")})
            await reply(room, part.request.id, "accept", edited)
            done = await wait_for(room.mirror, lambda s: bool(s.turns))
        finally:
            await huddle.stop()
    said = json.loads(final_text(done).removeprefix("All set. "))
    assert said == {"result": "summary by Model: short (Summarize in five words)"}
    assert model.conversations[1][-1].content == "Summarize in five words"


async def test_sampling_is_off_by_default_and_nobody_is_asked(huddle: RunningServer) -> None:
    room = await open_room(huddle)
    config = McpServerConfig.in_process("kit", build_server("kit"), mode="legacy")
    async with McpToolSource(config) as source:
        with pytest.raises((McpToolFailed, MCPError), match=r"[Ss]ampling not supported"):
            await source.call(
                "summarize", {"text": "x"}, people=HostChat(huddle.server.host, room.chat)
            )
    assert input_parts(room.mirror.chat) == []


async def test_roots_from_the_configuration_are_what_the_server_lists() -> None:
    roots = ("file:///srv/project", "file:///srv/shared")
    config = McpServerConfig.in_process("kit", build_server("kit"), mode="legacy", roots=roots)
    async with McpToolSource(config) as source:
        assert await source.call("roots", {}, people=None) == {"result": ", ".join(roots)}
