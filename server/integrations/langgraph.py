"""LangGraph graphs whose nodes ask people: each ``interrupt()`` put to a chat.

:func:`run_with_people` runs a compiled graph (any checkpointer: LangGraph
keeps interrupts only in a checkpoint) and, while the graph waits on
interrupts, puts each to the people (all of them at once, each its own
request), then resumes it with ``Command(resume={interrupt id: value})``.
It returns what the graph's last run returned, once nothing waits.
:func:`run_with_people_sync` does the same for a caller with no event loop.

What a node may ask with ``interrupt(value)``, and what it gets back::

    value                                      put to the chat as     resumed with
    -----------------------------------------  ---------------------  --------------------------
    Agent Inbox's HumanInterrupt (alone, or    a tool call for        a list of one HumanResponse
    a list of one): {"action_request":         approval (accept or    (below)
    {"action", "args"}, "config": {allow_*},   edit allowed), else a
    "description"}                             text question
    a Huddle form: {"schema": <flat JSON       an input request, the  {"action": accept|decline|
    Schema>, "message": "..."}                 schema's questions     cancel, "content": {...}
                                                                      on accept, "answered_by"}

How people's decision becomes the HumanResponse (Huddle's chat always
offers approve, deny with a reason, and editing the arguments; what the
interrupt does not allow falls to what it does)::

    in the chat                     HumanResponse
    ------------------------------  -----------------------------------------------
    approved, arguments as asked    accept (edit with the same args if only edit is
                                    allowed)
    approved with edited arguments  edit, args {"action", "args": the edited ones}
                                    (if edit is allowed; else as a denial whose
                                    reason names the edited arguments)
    denied with a reason            response, args the reason (if respond is allowed)
    anything else (denied without   ignore
    a reason, expired, the turn
    ended)
    the text question (respond or   response with the text; ignore when left empty,
    ignore allowed, not accept or   declined or dismissed
    edit)

Each response carries ``answered_by`` beside ``type`` and ``args``: the
person who decided as the server knows them, ``{name, role, token,
declared, email, issuer}`` as the MCP server's tools say it (server.mcp.people.person;
None when nobody did). The same for the form's result.

Restarts: each request's id is made from the thread, the checkpoint the
graph waits at and the interrupt's id (:func:`~server.runner.ids.adapter_id`).
A process that died while people thought calls :func:`run_with_people`
again with the same thread: the graph still waits at that checkpoint, so
the input is not run again; its interrupts are asked under the same ids,
which finds the chat's requests (waited on while open, answered ones
return their answer) and the graph resumes once.

Errors: an interrupt that is neither shape, or a form the chat cannot ask,
raises :class:`~server.mcp.errors.Unaskable`; what the people raise
(``InputAbandoned``, ``ElicitationExpired``) propagates, the graph left
waiting at its checkpoint for a later run.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol

from langchain_core.runnables import RunnableConfig
from langgraph.pregel import Pregel
from langgraph.types import Command, Interrupt, StateSnapshot

from server.core.expiry import Expiry
from server.integrations.asking import ask_form
from server.mcp.errors import Unaskable
from server.mcp.people import Decision, People, person
from server.runner.ids import adapter_id

FRAMEWORK: Final = "langgraph"
ALLOWS: Final = ("accept", "edit", "respond", "ignore")
RESPONSE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {"response": {"type": "string", "title": "Your response"}},
}
"""The form of an interrupt that allows only a text response (or ignore)."""
IGNORE_SCHEMA: Final[dict[str, Any]] = {"type": "object", "properties": {}}
"""The form of an interrupt that allows only ignore: a confirm."""


@dataclass(frozen=True)
class HumanInterrupt:
    """Agent Inbox's HumanInterrupt, as a node asked it."""

    action: str
    args: dict[str, Any]
    allows: frozenset[str]
    description: str | None = None


@dataclass(frozen=True)
class HuddleForm:
    """A form a node asked: a flat JSON Schema and a message."""

    schema: dict[str, Any]
    message: str


def parse_interrupt(value: Any) -> HumanInterrupt | HuddleForm:
    """What an interrupt's value asks; Unaskable when it is neither shape."""
    if isinstance(value, list | tuple) and len(value) == 1:
        value = value[0]
    if not isinstance(value, Mapping):
        raise Unaskable("an interrupt is a HumanInterrupt or a Huddle form (a mapping)")
    if "action_request" in value:
        request, config = value.get("action_request"), value.get("config") or {}
        if not isinstance(request, Mapping) or not isinstance(request.get("action"), str):
            raise Unaskable("a HumanInterrupt's action_request has an action (a string)")
        args = request.get("args") or {}
        if not isinstance(args, Mapping) or not isinstance(config, Mapping):
            raise Unaskable("a HumanInterrupt's args and config are mappings")
        allows = frozenset(a for a in ALLOWS if config.get(f"allow_{a}") is True)
        description = value.get("description")
        return HumanInterrupt(
            request["action"],
            dict(args),
            allows,
            description if isinstance(description, str) else None,
        )
    schema, message = value.get("schema"), value.get("message")
    if isinstance(schema, Mapping):
        return HuddleForm(dict(schema), message if isinstance(message, str) else "")
    raise Unaskable("an interrupt is a HumanInterrupt or a Huddle form ({schema, message})")


def human_response(asked: HumanInterrupt, decision: Decision) -> dict[str, Any]:
    """The HumanResponse for people's ``decision`` on ``asked`` (the table
    in the module docstring)."""
    by = person(decision.decided_by)
    reason = decision.reason if decision.decision == "denied" else None
    if decision.decision == "approved":
        edited = decision.arguments != asked.args
        if not edited and "accept" in asked.allows:
            return _response("accept", None, by)
        if "edit" in asked.allows:
            return _response("edit", {"action": asked.action, "args": decision.arguments}, by)
        reason = f"Approved only with these arguments: {json.dumps(decision.arguments)}"
    if reason and "respond" in asked.allows:
        return _response("response", reason, by)
    return _response("ignore", None, by)


def _response(kind: str, args: Any, by: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": kind, "args": args, "answered_by": by}


async def answer(
    people: People,
    interrupt: Interrupt[Any],
    request_id: str,
    *,
    asker: str,
    expiry: Expiry | None = None,
) -> Any:
    """Put ``interrupt`` to ``people`` as ``request_id``; the value to
    resume it with."""
    asked = parse_interrupt(interrupt.value)
    if isinstance(asked, HuddleForm):
        form = await ask_form(
            people,
            request_id,
            asker=asker,
            message=asked.message,
            schema=asked.schema,
            expiry=expiry,
        )
        return form.as_json()
    if asked.allows & {"accept", "edit"}:
        decision = await people.approve(
            asked.action, asked.args, reason=asked.description, expiry=expiry, call_id=request_id
        )
        return [human_response(asked, decision)]
    schema = RESPONSE_SCHEMA if "respond" in asked.allows else IGNORE_SCHEMA
    message = asked.description or asked.action
    form = await ask_form(
        people, request_id, asker=asker, message=message, schema=schema, expiry=expiry
    )
    text = (form.content or {}).get("response")
    if form.action == "accept" and isinstance(text, str) and text.strip():
        return [_response("response", text, form.answered_by)]
    return [_response("ignore", None, form.answered_by)]


# ─── Running the graph ───────────────────────────────────────────────────────


class _Graph(Protocol):
    """A graph run in the adapter's event loop: its own (async) methods, or
    its sync ones in threads."""

    @property
    def name(self) -> str: ...

    async def state(self, config: RunnableConfig) -> StateSnapshot: ...

    async def invoke(self, input: Any, config: RunnableConfig) -> Any: ...


@dataclass(frozen=True)
class _Async:
    graph: Pregel[Any, Any, Any, Any]

    @property
    def name(self) -> str:
        return self.graph.name

    async def state(self, config: RunnableConfig) -> StateSnapshot:
        return await self.graph.aget_state(config)

    async def invoke(self, input: Any, config: RunnableConfig) -> Any:
        return await self.graph.ainvoke(input, config)


@dataclass(frozen=True)
class _Threaded:
    """For sync checkpointers and nodes: the graph's sync methods, each in a
    thread, so that the people are still asked in the loop."""

    graph: Pregel[Any, Any, Any, Any]

    @property
    def name(self) -> str:
        return self.graph.name

    async def state(self, config: RunnableConfig) -> StateSnapshot:
        return await asyncio.to_thread(self.graph.get_state, config)

    async def invoke(self, input: Any, config: RunnableConfig) -> Any:
        return await asyncio.to_thread(self.graph.invoke, input, config)


async def run_with_people(
    graph: Pregel[Any, Any, Any, Any],
    input: Any,
    config: RunnableConfig,
    *,
    people: People,
    expiry: Expiry | None = None,
) -> Any:
    """Run ``graph`` on ``input`` with ``config`` (its ``configurable``
    names the ``thread_id``), putting every interrupt to ``people`` (each
    with ``expiry``, if given), until the graph waits on none; returns the
    graph's output. A thread that already waits on interrupts (a process
    that died while people thought) is resumed, ``input`` not run again."""
    return await _run(_Async(graph), input, config, people, expiry)


def run_with_people_sync(
    graph: Pregel[Any, Any, Any, Any],
    input: Any,
    config: RunnableConfig,
    *,
    people: AbstractAsyncContextManager[People],
    expiry: Expiry | None = None,
) -> Any:
    """:func:`run_with_people` for a caller with no event loop, with the
    graph's sync methods (so sync checkpointers work). ``people`` is
    entered in the run's own loop and left when it ends:
    :func:`~server.integrations.remote.people_of`, say."""

    async def run() -> Any:
        async with people as chat:
            return await _run(_Threaded(graph), input, config, chat, expiry)

    return asyncio.run(run())


async def _run(
    graph: _Graph, input: Any, config: RunnableConfig, people: People, expiry: Expiry | None
) -> Any:
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread is None:
        raise ValueError("a graph that asks people runs on a thread: config needs a thread_id")
    snapshot = await graph.state(config)
    output = None
    if not snapshot.interrupts:
        output = await graph.invoke(input, config)
        snapshot = await graph.state(config)
    while snapshot.interrupts:
        checkpoint = str(snapshot.config.get("configurable", {}).get("checkpoint_id"))
        async with asyncio.TaskGroup() as group:
            asking = {
                interrupt.id: group.create_task(
                    answer(
                        people,
                        interrupt,
                        adapter_id(FRAMEWORK, str(thread), checkpoint, interrupt.id),
                        asker=graph.name,
                        expiry=expiry,
                    )
                )
                for interrupt in snapshot.interrupts
            }
        resume = {interrupt_id: task.result() for interrupt_id, task in asking.items()}
        output = await graph.invoke(Command(resume=resume), config)
        snapshot = await graph.state(config)
    return output
