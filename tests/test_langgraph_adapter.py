"""The LangGraph adapter: a real graph (no LLM) whose nodes interrupt, run
by run_with_people, each interrupt answered by a person over the WebSocket
of a real server."""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from asyncio import Task
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, StateGraph
from langgraph.pregel import Pregel
from langgraph.types import interrupt

from protocol.actions import ChatInputCompleted
from protocol.chat import InputAnswer, NumberValue, ToolCallPendingConfirmation
from server.core.expiry import Expiry
from server.integrations.langgraph import parse_interrupt, run_with_people, run_with_people_sync
from server.integrations.remote import people_of
from server.mcp.errors import Unaskable
from server.mcp.people import RemoteChat
from tests.conftest import RunningServer, WallClock, clocked_server
from tests.people_kit import (
    WITHIN,
    By,
    Room,
    approve,
    arguments_of,
    calls_waiting,
    deny,
    fill,
    open_requests,
    open_room,
    requests_open,
    time_passes,
    turn_ended,
    wait_for,
)

REFUND = {"order": "A-17", "amount": 40}
EVERYTHING = {"allow_accept": True, "allow_edit": True, "allow_respond": True, "allow_ignore": True}


class State(TypedDict, total=False):
    answers: Annotated[list[Any], operator.add]
    done: Annotated[list[str], operator.add]


def human_interrupt(action: str, args: dict[str, Any], **allow: bool) -> list[dict[str, Any]]:
    """What an Agent Inbox graph asks: a list of one HumanInterrupt."""
    request = {"action": action, "args": args}
    return [{"action_request": request, "config": allow, "description": f"{action}?"}]


@dataclass(frozen=True)
class Asking:
    """A node that interrupts with ``value`` and keeps what it got back; the
    work after the interrupt is logged in ``done`` (to count runs)."""

    name: str
    value: Any

    def __call__(self, state: State) -> State:
        answer = interrupt(self.value)
        return {"answers": [answer], "done": [self.name]}


def graph_of(
    *nodes: Asking, saver: BaseCheckpointSaver[Any] | None = None
) -> Pregel[Any, Any, Any, Any]:
    """The nodes side by side after START (one superstep: their interrupts
    come at once)."""
    builder = StateGraph(State)
    for node in nodes:
        builder.add_node(node.name, node)
        builder.add_edge(START, node.name)
    return builder.compile(checkpointer=saver or InMemorySaver())


def thread(name: str) -> RunnableConfig:
    return {"configurable": {"thread_id": name}}


async def running(huddle: RunningServer, session: str, *nodes: Asking) -> tuple[Room, Task[Any]]:
    """A room in ``session``, and the graph of ``nodes`` running with its
    people on thread ``t``."""
    room = await open_room(huddle, session)
    people = RemoteChat(room.agent, room.chat)
    return room, asyncio.create_task(
        run_with_people(graph_of(*nodes), {}, thread("t"), people=people)
    )


def refund_node(**allow: bool) -> Asking:
    return Asking("refund", human_interrupt("refund", REFUND, **allow))


Person = Callable[[Room, ToolCallPendingConfirmation], Awaitable[None]]


async def approves(room: Room, call: ToolCallPendingConfirmation) -> None:
    await approve(room, call)


async def edits(room: Room, call: ToolCallPendingConfirmation) -> None:
    await approve(room, call, edited={"order": "A-17", "amount": 25})


async def denies(room: Room, call: ToolCallPendingConfirmation) -> None:
    await deny(room, call, "Not this month")


DECISIONS = [
    pytest.param(EVERYTHING, approves, {"type": "accept", "args": None}, id="accept"),
    pytest.param(
        EVERYTHING,
        edits,
        {"type": "edit", "args": {"action": "refund", "args": {"order": "A-17", "amount": 25}}},
        id="edit",
    ),
    pytest.param(EVERYTHING, denies, {"type": "response", "args": "Not this month"}, id="respond"),
    pytest.param(
        {"allow_accept": True, "allow_ignore": True},
        denies,
        {"type": "ignore", "args": None},
        id="ignore-when-respond-is-not-allowed",
    ),
    pytest.param(
        {"allow_edit": True},
        approves,
        {"type": "edit", "args": {"action": "refund", "args": REFUND}},
        id="edit-when-only-edit-is-allowed",
    ),
    pytest.param(
        {"allow_accept": True, "allow_respond": True},
        edits,
        {
            "type": "response",
            "args": 'Approved only with these arguments: {"order": "A-17", "amount": 25}',
        },
        id="edit-when-edit-is-not-allowed",
    ),
]


@pytest.mark.parametrize(("allow", "person", "expected"), DECISIONS)
async def test_a_human_interrupt_is_a_tool_approval_and_resumes_with_the_human_response(
    huddle: RunningServer, allow: dict[str, bool], person: Person, expected: dict[str, Any]
) -> None:
    room, run = await running(huddle, "ahp-session:/graph", refund_node(**allow))
    [call] = await calls_waiting(room)
    assert (call.tool_name, arguments_of(call), call.confirmation_title) == (
        "refund",
        REFUND,
        "refund?",
    )
    await person(room, call)
    async with asyncio.timeout(WITHIN):
        state = await run
    assert state["answers"] == [[{**expected, "answered_by": By("dana")}]]
    assert state["done"] == ["refund"]


async def test_an_interrupt_that_allows_only_a_response_is_a_text_question(
    huddle: RunningServer,
) -> None:
    room, run = await running(
        huddle, "ahp-session:/respond", refund_node(allow_respond=True, allow_ignore=True)
    )
    [request] = await requests_open(room)
    assert request.request.message == "LangGraph asks: refund?"
    await fill(room, request, response="Only half")
    async with asyncio.timeout(WITHIN):
        state = await run
    assert state["answers"] == [
        [{"type": "response", "args": "Only half", "answered_by": By("dana")}]
    ]


async def submit(room: Room, request_id: str, **numbers: int) -> None:
    answers = {
        key: InputAnswer(state="submitted", value=NumberValue(value=value))
        for key, value in numbers.items()
    }
    action = ChatInputCompleted(request_id=request_id, response="accept", answers=answers)
    await room.person.dispatch_and_wait(room.chat, action)


FORM = {
    "message": "How much should we refund?",
    "schema": {
        "type": "object",
        "properties": {"amount": {"type": "integer", "minimum": 1}, "note": {"type": "string"}},
        "required": ["amount"],
    },
}


async def test_a_huddle_form_resumes_with_the_content_typed_as_the_schema_says(
    huddle: RunningServer,
) -> None:
    room, run = await running(huddle, "ahp-session:/form", Asking("amount", FORM))
    [request] = await requests_open(room)
    assert [q.id for q in request.request.questions or []] == ["amount", "note"]
    await submit(room, request.request.id, amount=25)
    async with asyncio.timeout(WITHIN):
        state = await run
    assert state["answers"] == [
        {"action": "accept", "content": {"amount": 25}, "answered_by": By("dana")}
    ]
    await turn_ended(room)


async def test_two_interrupts_at_once_each_get_their_own_request(huddle: RunningServer) -> None:
    room, run = await running(
        huddle, "ahp-session:/two", refund_node(**EVERYTHING), Asking("amount", FORM)
    )
    [call] = await calls_waiting(room)
    [request] = await requests_open(room)
    await submit(room, request.request.id, amount=7)
    await deny(room, call, "No")
    async with asyncio.timeout(WITHIN):
        state = await run
    assert sorted(state["done"]) == ["amount", "refund"]
    assert {"action": "accept", "content": {"amount": 7}, "answered_by": By("dana")} in state[
        "answers"
    ]
    assert [{"type": "response", "args": "No", "answered_by": By("dana")}] in state["answers"]


async def test_a_process_started_again_finds_the_request_and_resumes_the_graph_once(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/restart")
    saver = InMemorySaver()  # what outlives the process: the checkpoints, and the chat
    before = graph_of(refund_node(**EVERYTHING), saver=saver)
    dying = RemoteChat(room.agent, room.chat)
    run = asyncio.create_task(run_with_people(before, {}, thread("t"), people=dying))
    [call] = await calls_waiting(room)
    run.cancel()  # the agent's process dies while people think
    await room.agent.close()
    await approve(room, call)
    after = graph_of(refund_node(**EVERYTHING), saver=saver)
    again = RemoteChat(await huddle.client("agent"), room.chat)
    async with asyncio.timeout(WITHIN):
        state = await run_with_people(after, {}, thread("t"), people=again)
    assert state["answers"] == [[{"type": "accept", "args": None, "answered_by": By("dana")}]]
    assert state["done"] == ["refund"]  # resumed once
    ended = await turn_ended(room)
    assert sum(len(turn.response_parts) for turn in ended.turns) == 1  # asked once


async def test_the_sync_entry_point_runs_a_graph_on_a_sync_checkpointer(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/sync")
    saver = SqliteSaver(sqlite3.connect(":memory:", check_same_thread=False))
    graph = graph_of(refund_node(**EVERYTHING), saver=saver)
    people = people_of(huddle.ws, huddle.token("agent"), room.chat)
    run = asyncio.create_task(
        asyncio.to_thread(run_with_people_sync, graph, {}, thread("t"), people=people)
    )
    [call] = await calls_waiting(room)
    await approve(room, call)
    async with asyncio.timeout(WITHIN):
        state = await run
    assert state["answers"] == [[{"type": "accept", "args": None, "answered_by": By("dana")}]]


@dataclass(frozen=True)
class Twice:
    """A node that asks the form twice: the second interrupt of a node is a
    request of its own, not the first one found again."""

    name: str = "twice"

    def __call__(self, state: State) -> State:
        return {"answers": [interrupt(FORM), interrupt(FORM)], "done": [self.name]}


async def test_a_node_that_asks_twice_gets_each_answer(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/twice")
    builder = StateGraph(State)
    builder.add_node("twice", Twice())
    builder.add_edge(START, "twice")
    graph = builder.compile(checkpointer=InMemorySaver())
    people = RemoteChat(room.agent, room.chat)
    run = asyncio.create_task(run_with_people(graph, {}, thread("t"), people=people))
    [first] = await requests_open(room)
    await submit(room, first.request.id, amount=1)
    state = await wait_for(
        room.mirror,
        lambda s: len(open_requests(s)) == 1 and open_requests(s)[0].request.id != first.request.id,
    )
    [second] = open_requests(state)
    await submit(room, second.request.id, amount=2)
    async with asyncio.timeout(WITHIN):
        done = await run
    assert [answer["content"] for answer in done["answers"]] == [{"amount": 1}, {"amount": 2}]


CODE_FORM = {
    "message": "Which code?",
    "schema": {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]+$"}},
        "required": ["code"],
    },
}


async def test_answers_that_do_not_fit_the_schema_are_asked_again_never_returned(
    huddle: RunningServer,
) -> None:
    room, run = await running(huddle, "ahp-session:/misfit", Asking("code", CODE_FORM))
    [first] = await requests_open(room)
    await fill(room, first, code="lower")  # the pattern is the schema's alone: the chat takes it
    state = await wait_for(
        room.mirror,
        lambda s: any(part.request.id != first.request.id for part in open_requests(s)),
    )
    [again] = open_requests(state)
    assert "did not fit" in (again.request.message or "")
    await fill(room, again, code="UPPER")
    async with asyncio.timeout(WITHIN):
        done = await run
    assert done["answers"] == [
        {"action": "accept", "content": {"code": "UPPER"}, "answered_by": By("dana")}
    ]


async def test_an_approval_nobody_gives_in_time_resumes_with_ignore(clock: WallClock) -> None:
    async with clocked_server(clock) as huddle:
        room = await open_room(huddle, "ahp-session:/late")
        graph = graph_of(refund_node(**EVERYTHING))
        people = RemoteChat(room.agent, room.chat)
        expiry = Expiry(60, "decline")
        run = asyncio.create_task(
            run_with_people(graph, {}, thread("t"), people=people, expiry=expiry)
        )
        await calls_waiting(room)
        await time_passes(huddle, clock, 61)
        async with asyncio.timeout(WITHIN):
            state = await run
    assert state["answers"] == [[{"type": "ignore", "args": None, "answered_by": None}]]


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Approve?", id="a-string"),
        pytest.param({"question": "Approve?"}, id="neither-shape"),
        pytest.param({"action_request": {"args": {}}}, id="no-action"),
        pytest.param({"action_request": {"action": "x", "args": [1]}}, id="args-not-a-mapping"),
        pytest.param(human_interrupt("a", {}) * 2, id="a-list-of-two"),
    ],
)
def test_an_interrupt_of_no_known_shape_is_unaskable(value: Any) -> None:
    with pytest.raises(Unaskable):
        parse_interrupt(value)


async def test_a_graph_run_without_a_thread_is_refused(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/nothread")
    people = RemoteChat(room.agent, room.chat)
    with pytest.raises(ValueError, match="thread_id"):
        await run_with_people(graph_of(refund_node(**EVERYTHING)), {}, {}, people=people)
