"""RemoteChat: an outside agent's approvals and questions, put to the people
of a chat through an agent token; over a real server."""

from __future__ import annotations

import asyncio

from protocol.actions import ChatTurnStarted
from protocol.chat import (
    InputRequest,
    TextQuestion,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallPart,
)
from server.mcp.people import RemoteChat
from server.runner.demo import agent as demo
from tests.conftest import RunningServer, start_server, user_message
from tests.people_kit import (
    WITHIN,
    approve,
    arguments_of,
    calls_waiting,
    deny,
    fill,
    open_room,
    requests_open,
    turn_ended,
)

REFUND = {"order": "A-17", "amount": 40}


async def test_an_approval_in_a_chat_with_no_turn_opens_one_and_credits_the_approver(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/approve")
    people = RemoteChat(room.agent, room.chat)
    decision = asyncio.create_task(people.approve("refund", REFUND, reason="Refund A-17?"))
    [call] = await calls_waiting(room)
    assert call.tool_name == "refund"
    assert arguments_of(call) == REFUND
    assert call.confirmation_title == "Refund A-17?"
    await approve(room, call)
    async with asyncio.timeout(WITHIN):
        decided = await decision
    assert decided.decision == "approved"
    assert decided.arguments == REFUND
    assert decided.decided_by is not None
    assert (decided.decided_by.name, decided.decided_by.role) == ("dana", "participant")
    state = await turn_ended(room)
    [part] = [p for p in state.turns[-1].response_parts if isinstance(p, ToolCallPart)]
    assert isinstance(part.tool_call, ToolCallCompleted)  # not skipped by the turn's end


async def test_an_approval_returns_the_arguments_as_the_person_edited_them(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/edit")
    people = RemoteChat(room.agent, room.chat)
    decision = asyncio.create_task(people.approve("refund", REFUND))
    [call] = await calls_waiting(room)
    await approve(room, call, edited={"order": "A-17", "amount": 25})
    async with asyncio.timeout(WITHIN):
        decided = await decision
    assert (decided.decision, decided.arguments) == ("approved", {"order": "A-17", "amount": 25})


async def test_a_denial_carries_the_persons_reason(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/deny")
    people = RemoteChat(room.agent, room.chat)
    decision = asyncio.create_task(people.approve("refund", REFUND))
    [call] = await calls_waiting(room)
    await deny(room, call, "Not this month")
    async with asyncio.timeout(WITHIN):
        decided = await decision
    assert (decided.decision, decided.reason) == ("denied", "Not this month")
    assert decided.decided_by is not None
    assert decided.decided_by.name == "dana"
    state = await turn_ended(room)
    [part] = [p for p in state.turns[-1].response_parts if isinstance(p, ToolCallPart)]
    assert isinstance(part.tool_call, ToolCallCancelled)


async def test_two_approvals_at_once_share_one_turn_and_each_waits_for_its_own(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/two")
    people = RemoteChat(room.agent, room.chat)
    first = asyncio.create_task(people.approve("refund", REFUND, call_id="first"))
    second = asyncio.create_task(people.approve("close", {"ticket": 9}, call_id="second"))
    calls = {call.tool_call_id: call for call in await calls_waiting(room, 2)}
    await deny(room, calls["second"], "Keep it open")
    async with asyncio.timeout(WITHIN):
        assert (await second).decision == "denied"
    assert not first.done()
    assert room.mirror.chat.active_turn is not None  # the first still waits in it
    await approve(room, calls["first"])
    async with asyncio.timeout(WITHIN):
        assert (await first).decision == "approved"
    state = await turn_ended(room)
    assert len(state.turns) == 1


async def test_an_approval_asked_again_after_a_restart_is_found_not_shown_twice(
    huddle: RunningServer,
) -> None:
    room = await open_room(huddle, "ahp-session:/again")
    before = RemoteChat(room.agent, room.chat)
    asking = asyncio.create_task(before.approve("refund", REFUND, call_id="thread-1:call"))
    [call] = await calls_waiting(room)
    asking.cancel()  # the agent's process dies while people think
    await room.agent.close()
    await approve(room, call)
    again = RemoteChat(await huddle.client("agent"), room.chat)
    async with asyncio.timeout(WITHIN):
        decided = await again.approve("refund", REFUND, call_id="thread-1:call")
    assert decided.decision == "approved"
    assert decided.decided_by is not None
    assert decided.decided_by.name == "dana"
    state = await turn_ended(room)  # the turn the dead process opened is ended
    calls = [p for t in state.turns for p in t.response_parts if isinstance(p, ToolCallPart)]
    assert len(calls) == 1


async def test_asking_in_a_persons_turn_leaves_their_turn_open(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/theirs")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-03-01T09:00:00.000Z", message=user_message("Go")
    )
    await room.person.dispatch_and_wait(room.chat, started)
    people = RemoteChat(room.agent, room.chat)
    decision = asyncio.create_task(people.approve("refund", REFUND))
    [call] = await calls_waiting(room)
    await approve(room, call)
    async with asyncio.timeout(WITHIN):
        assert (await decision).decision == "approved"
    active = room.mirror.chat.active_turn
    assert active is not None
    assert active.id == "t1"


async def test_a_question_credits_whoever_answered_it(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/ask")
    people = RemoteChat(room.agent, room.chat)
    request = InputRequest(id="why", questions=[TextQuestion(id="why", message="Why?")])
    reply = asyncio.create_task(people.ask(request, None))
    [part] = await requests_open(room)
    await fill(room, part, why="Late delivery")
    async with asyncio.timeout(WITHIN):
        answered = await reply
    assert answered.response == "accept"
    assert answered.answered_by is not None
    assert answered.answered_by.name == "dana"
    await turn_ended(room)


async def test_the_sessions_own_agent_leaves_a_turn_an_outside_agent_opened_alone() -> None:
    running = await start_server(agent=demo)
    try:
        room = await open_room(running, "ahp-session:/outside")
        people = RemoteChat(room.agent, room.chat)
        decision = asyncio.create_task(people.approve("refund", REFUND))
        [call] = await calls_waiting(room)
        await approve(room, call)
        async with asyncio.timeout(WITHIN):
            await decision
        state = await turn_ended(room)
        [turn] = state.turns
        # Only the outside agent's call: the demo agent never answered its turn.
        assert [type(part).__name__ for part in turn.response_parts] == ["ToolCallPart"]
    finally:
        await running.stop()
