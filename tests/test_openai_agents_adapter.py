"""The OpenAI Agents SDK adapter: the SDK's real Runner with a scripted
Model (it calls a tool that needs approval, then says what came of it), each
approval decided by a person over the WebSocket of a real server."""

from __future__ import annotations

import asyncio
import json
from asyncio import Task
from collections.abc import AsyncIterator
from typing import Any

from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    RunConfig,
    RunResult,
    RunState,
    Tool,
    ToolApprovalItem,
    Usage,
    function_tool,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from server.core.expiry import Expiry
from server.integrations.openai_agents import run_with_people, tool_of
from server.mcp.people import Decision, RemoteChat
from tests.conftest import RunningServer, WallClock, clocked_server
from tests.people_kit import (
    WITHIN,
    Room,
    approve,
    arguments_of,
    calls_waiting,
    deny,
    open_room,
    time_passes,
    turn_ended,
)

REFUND = {"order": "A-17", "amount": 40}
QUIET = RunConfig(tracing_disabled=True)
"""No traces sent anywhere (there is no OpenAI key here)."""


class Scripted(Model):
    """A model that first calls ``refund`` once for each of ``calls`` (call
    id: arguments), all at once, then answers with the tools' outputs as the
    final message."""

    def __init__(self, calls: dict[str, dict[str, Any]]) -> None:
        self.calls = calls

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        outputs = [
            item.get("output")
            for item in (input if isinstance(input, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        if not outputs:
            calls = [
                ResponseFunctionToolCall(
                    type="function_call",
                    name="refund",
                    call_id=call_id,
                    arguments=json.dumps(arguments),
                    id=f"fc-{call_id}",
                )
                for call_id, arguments in self.calls.items()
            ]
            return ModelResponse(output=list(calls), usage=Usage(), response_id=None)
        said = "; ".join(str(output) for output in outputs)
        text = ResponseOutputText(annotations=[], text=said, type="output_text")
        message = ResponseOutputMessage(
            id="msg", content=[text], role="assistant", status="completed", type="message"
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("these tests run the agent unstreamed")


def refunding_agent(
    refunds: list[dict[str, Any]], calls: dict[str, dict[str, Any]] | None = None
) -> Agent[Any]:
    """An agent whose ``refund`` tool needs approval, called as ``calls``
    say (one call of REFUND by default); each run of it is appended to
    ``refunds``."""

    @function_tool(needs_approval=True)
    def refund(order: str, amount: int) -> str:
        """Refund an order."""
        refunds.append({"order": order, "amount": amount})
        return f"refunded {amount} on {order}"

    return Agent(name="Billing", model=Scripted(calls or {"call-1": REFUND}), tools=[refund])


async def running(
    huddle: RunningServer,
    session: str,
    asked: str,
    calls: dict[str, dict[str, Any]] | None = None,
    **options: Any,
) -> tuple[Room, list[dict[str, Any]], Task[RunResult]]:
    """A room in ``session``, the refunds made, and the agent (calling as
    ``calls`` say) running on ``asked`` with the room's people."""
    room = await open_room(huddle, session)
    refunds: list[dict[str, Any]] = []
    people = RemoteChat(room.agent, room.chat)
    run = run_with_people(
        refunding_agent(refunds, calls), asked, people=people, run_config=QUIET, **options
    )
    return room, refunds, asyncio.create_task(run)


async def test_an_approved_call_runs_the_tool_and_the_run_goes_on(huddle: RunningServer) -> None:
    decisions: list[Decision] = []
    room, refunds, run = await running(
        huddle,
        "ahp-session:/agents-approve",
        "Refund A-17",
        told=lambda _item, decision: decisions.append(decision),
    )
    [call] = await calls_waiting(room)
    assert (call.tool_name, arguments_of(call)) == ("refund", REFUND)
    assert call.confirmation_title == "Billing wants to run refund"
    await approve(room, call)
    async with asyncio.timeout(WITHIN):
        result = await run
    assert result.interruptions == []
    assert result.final_output == "refunded 40 on A-17"
    assert refunds == [REFUND]
    [decision] = decisions
    assert decision.decided_by is not None
    assert (decision.decision, decision.decided_by.name) == ("approved", "dana")
    await turn_ended(room)


async def test_a_denied_call_is_rejected_with_the_persons_reason(huddle: RunningServer) -> None:
    room, refunds, run = await running(huddle, "ahp-session:/agents-deny", "Refund A-17")
    [call] = await calls_waiting(room)
    await deny(room, call, "Not this month")
    async with asyncio.timeout(WITHIN):
        result = await run
    assert refunds == []
    assert result.final_output == "dana denied this call: Not this month"


async def test_an_edited_approval_tells_the_model_the_arguments_it_may_run_with(
    huddle: RunningServer,
) -> None:
    room, refunds, run = await running(huddle, "ahp-session:/agents-edit", "Refund A-17")
    [call] = await calls_waiting(room)
    await approve(room, call, edited={"order": "A-17", "amount": 25})
    async with asyncio.timeout(WITHIN):
        result = await run
    assert refunds == []  # not with the arguments nobody approved
    assert result.final_output == (
        'dana approved this call only with these arguments: {"order": "A-17", "amount": 25}'
    )


async def test_two_calls_at_once_each_get_their_own_approval(huddle: RunningServer) -> None:
    other = {"order": "B-2", "amount": 5}
    room, refunds, run = await running(
        huddle, "ahp-session:/agents-two", "Refund both", {"call-a": REFUND, "call-b": other}
    )
    calls = {arguments_of(call)["order"]: call for call in await calls_waiting(room, 2)}
    await deny(room, calls["A-17"], "Too much")
    await approve(room, calls["B-2"])
    async with asyncio.timeout(WITHIN):
        result = await run
    assert refunds == [other]
    assert result.final_output == "dana denied this call: Too much; refunded 5 on B-2"


async def test_a_run_started_again_from_its_kept_state_finds_the_call_and_runs_the_tool_once(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/agents-restart")
    refunds: list[dict[str, Any]] = []
    kept: list[dict[str, Any]] = []

    async def keep(state: dict[str, Any]) -> None:
        kept.append(json.loads(json.dumps(state)))  # as a file would hold it

    dying = RemoteChat(room.agent, room.chat)
    run = asyncio.create_task(
        run_with_people(
            refunding_agent(refunds),
            "Refund A-17",
            people=dying,
            keep=keep,
            run_config=QUIET,
        )
    )
    [call] = await calls_waiting(room)
    run.cancel()  # the agent's process dies while people think
    await room.agent.close()
    await approve(room, call)
    agent = refunding_agent(refunds)
    state = await RunState.from_json(agent, kept[-1])
    again = RemoteChat(await huddle.client("agent"), room.chat)
    async with asyncio.timeout(WITHIN):
        result = await run_with_people(agent, state, people=again, run_config=QUIET)
    assert result.final_output == "refunded 40 on A-17"
    assert refunds == [REFUND]
    ended = await turn_ended(room)
    assert sum(len(turn.response_parts) for turn in ended.turns) == 1  # asked once


def test_an_approval_item_names_its_tool_and_arguments() -> None:
    agent = refunding_agent([])
    raw = ResponseFunctionToolCall(
        type="function_call", name="refund", call_id="c", arguments="[1, 2]"
    )
    assert tool_of(ToolApprovalItem(agent=agent, raw_item=raw)) == ("refund", {"input": [1, 2]})


async def test_a_call_nobody_approves_in_time_is_rejected_as_such(clock: WallClock) -> None:
    async with clocked_server(clock) as huddle:
        room, refunds, run = await running(
            huddle, "ahp-session:/agents-late", "Refund A-17", expiry=Expiry(60, "decline")
        )
        await calls_waiting(room)
        await time_passes(huddle, clock, 61)
        async with asyncio.timeout(WITHIN):
            result = await run
    assert refunds == []
    assert result.final_output == "Nobody approved this call in time; it did not run"
