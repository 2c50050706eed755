"""OpenAI Agents SDK runs whose tools need approval, approved by people.

:func:`run_with_people` runs an agent with the SDK's ``Runner``; while the
result has ``interruptions`` (each a ``ToolApprovalItem``: a call of a tool
with ``needs_approval``), each is put to the chat as a tool call waiting for
approval (the tool's name, its arguments, and the agent that wants it), all
at once, and the run goes on with people's decisions until nothing waits.
It returns the SDK's ``RunResult``, with no interruptions left.

How a decision reaches the run::

    in the chat                     the run
    ------------------------------  -----------------------------------------------
    approved, arguments as asked    state.approve(item): the tool runs
    approved with edited arguments  state.reject(item, rejection_message=...) saying
                                    who approved which arguments (the SDK cannot run
                                    a call with other arguments; the model may call
                                    again with them, which is asked again)
    denied                          state.reject, the message who denied it and why
    expired, or the turn ended      state.reject, the message that nobody decided
                                    (in time, or before the turn ended)

A form: :func:`ask_people_tool` is a tool the agent calls to ask the chat's
people (a message and a flat JSON Schema form, as MCP elicitation has it;
one text answer when it gives none); it returns what they submitted, checked
against the schema, and who submitted it, as LangGraph's forms do.

Restarts: ``keep`` is given the run's state (``RunState.to_json()``) each time
it waits for people, before they are asked; keep it where the process
started again finds it (a file, a database row). Started again, load it
with ``await RunState.from_json(agent, kept)`` and pass that state as
``input``: its pending approvals are asked under the same ids (made from the
tool call's id, :func:`~server.runner.ids.adapter_id`), which finds the
chat's calls (waited on while open, decided ones return their decision),
and the run goes on once. The ids take the model's call ids to be unique in
the chat, as the OpenAI API's are: a model that numbers its calls from 1 in
every run would find an earlier run's decision. A process that dies after a
tool ran, before the run waited again, runs it again from the kept state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from agents import Agent, FunctionTool, Runner, RunResult, RunState, ToolApprovalItem
from agents.tool_context import ToolContext

from server.core.expiry import Expiry
from server.integrations.asking import ask_form
from server.mcp.errors import Unaskable
from server.mcp.people import Decision, People
from server.runner.ids import adapter_id

FRAMEWORK: Final = "openai-agents"

ANSWER: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "title": "Answer"}},
    "required": ["answer"],
}
"""The form of a question asked without one: a text answer."""
ASK_PARAMETERS: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "message": {"type": "string", "description": "What to ask the people, in a sentence"},
        "schema": {
            "type": "object",
            "description": "A flat JSON Schema object of the answers wanted (strings, numbers, "
            "booleans, enums); one text answer when left out",
        },
    },
    "required": ["message"],
}

Keep = Callable[[dict[str, Any]], Awaitable[None]]
Told = Callable[[ToolApprovalItem, Decision], None]


def tool_of(item: ToolApprovalItem) -> tuple[str, dict[str, Any]]:
    """The tool an approval item would call, and its arguments (a value
    that is not a JSON object is shown as ``{"input": value}``)."""
    tool = item.qualified_name or item.name or "tool"
    try:
        arguments = json.loads(item.arguments or "{}")
    except ValueError:
        arguments = item.arguments
    return tool, arguments if isinstance(arguments, dict) else {"input": arguments}


def call_id_of(item: ToolApprovalItem) -> str:
    """The chat's id for the call: the same for the same item after a restart."""
    tool, arguments = tool_of(item)
    return adapter_id(FRAMEWORK, item.call_id or f"{tool}:{json.dumps(arguments)}")


def settle(
    state: RunState[Any], item: ToolApprovalItem, asked: dict[str, Any], decision: Decision
) -> None:
    """Apply people's ``decision`` on ``item`` to ``state`` (the table in
    the module docstring)."""
    who = decision.decided_by.name if decision.decided_by is not None else None
    if decision.decision == "approved" and decision.arguments == asked:
        state.approve(item)
        return
    if decision.decision == "approved":
        message = (
            f"{who} approved this call only with these arguments: {json.dumps(decision.arguments)}"
        )
    elif decision.decision == "denied":
        message = f"{who} denied this call" + (f": {decision.reason}" if decision.reason else "")
    elif decision.decision == "expired":
        message = "Nobody approved this call in time; it did not run"
    else:
        message = "Nobody decided on this call before the chat's turn ended; it did not run"
    state.reject(item, rejection_message=message)


async def decide(
    people: People,
    state: RunState[Any],
    item: ToolApprovalItem,
    *,
    expiry: Expiry | None,
    told: Told | None,
) -> None:
    """Put ``item`` to ``people`` and apply their decision to ``state``."""
    tool, arguments = tool_of(item)
    reason = f"{item.agent.name} wants to run {tool}"
    decision = await people.approve(
        tool, arguments, reason=reason, expiry=expiry, call_id=call_id_of(item)
    )
    if told is not None:
        told(item, decision)
    settle(state, item, arguments, decision)


async def run_with_people(
    agent: Agent[Any],
    input: str | list[Any] | RunState[Any],
    *,
    people: People,
    keep: Keep | None = None,
    expiry: Expiry | None = None,
    told: Told | None = None,
    **options: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` (``options`` go to ``Runner.run`` as
    they are: ``run_config``, ``context``, ``max_turns``...), each approval
    it waits for put to ``people`` (with ``expiry``, if given), until none
    is left; ``told`` hears each decision (who decided, with which
    arguments). ``keep`` and a ``RunState`` as ``input``: see the module
    docstring."""
    if isinstance(input, RunState) and input.get_interruptions():
        state: RunState[Any] = input
    else:
        result = await Runner.run(agent, input, **options)
        if not result.interruptions:
            return result
        state = result.to_state()
    while True:
        if keep is not None:
            await keep(state.to_json())
        async with asyncio.TaskGroup() as group:
            for item in state.get_interruptions():
                group.create_task(decide(people, state, item, expiry=expiry, told=told))
        result = await Runner.run(agent, state, **options)
        if not result.interruptions:
            return result
        state = result.to_state()


def ask_people_tool(
    people: People, *, name: str = "ask_people", expiry: Expiry | None = None
) -> FunctionTool:
    """A tool the agent calls to ask ``people`` a form (see the module
    docstring): co-edited in the chat, returned as ``{action: accept |
    decline | cancel, content, answered_by}`` once someone submits (JSON),
    or ``{error}`` for a form the chat cannot ask. Its request id is made
    from the tool call's id, so a run resumed from kept state finds the
    request it asked, never asks twice."""

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        given = json.loads(arguments or "{}")
        schema = given.get("schema") or ANSWER
        request_id = adapter_id(FRAMEWORK, f"form:{context.tool_call_id}")
        try:
            answer = await ask_form(
                people,
                request_id,
                asker=context.agent.name if context.agent is not None else "An agent",
                message=str(given.get("message", "")),
                schema=schema,
                expiry=expiry,
            )
        except Unaskable as error:
            return json.dumps({"error": f"this form cannot be asked: {error}"})
        return json.dumps(answer.as_json())

    return FunctionTool(
        name=name,
        description="Ask the people in the chat and wait until one of them submits: for "
        "details you lack or a choice that is theirs. Returns their answers (action, content, "
        "answered_by).",
        params_json_schema=ASK_PARAMETERS,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )
