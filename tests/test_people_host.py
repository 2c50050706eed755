"""HostChat: approvals put to the people of a chat from inside the server's
own process (a tool of the runner's turn, a framework adapter run beside
it): the same decisions as RemoteChat's, people answering over a real
WebSocket."""

from __future__ import annotations

import asyncio

import pytest

from protocol.actions import ChatTurnStarted
from protocol.chat import Message, MessageOrigin, ToolCallCompleted, ToolCallPart
from server.core.expiry import Expiry
from server.errors import InputAbandoned
from server.mcp.people import HostChat
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
)

REFUND = {"order": "A-17", "amount": 40}


async def room_in_a_turn(huddle: RunningServer, session: str) -> tuple[Room, HostChat]:
    """Dana's chat, with a turn the agent's side opened (the server's own
    turn, which no runner takes), and its people as the host asks them."""
    room = await open_room(huddle, session)
    started = ChatTurnStarted(
        turn_id="t1",
        started_at="2027-01-10T10:00:00.000Z",
        message=Message(text="Refunds", origin=MessageOrigin(kind="agent")),
    )
    await huddle.server.parts.host.dispatch(room.chat, started)
    return room, HostChat(huddle.server.parts.host, room.chat)


async def test_an_approval_edited_by_a_person_returns_their_arguments_and_name(
    huddle: RunningServer,
) -> None:
    room, people = await room_in_a_turn(huddle, "ahp-session:/host-approve")
    decision = asyncio.create_task(people.approve("refund", REFUND, reason="Refund A-17?"))
    [call] = await calls_waiting(room)
    assert (call.tool_name, arguments_of(call), call.confirmation_title) == (
        "refund",
        REFUND,
        "Refund A-17?",
    )
    await approve(room, call, edited={"order": "A-17", "amount": 25})
    async with asyncio.timeout(WITHIN):
        decided = await decision

    assert (decided.decision, decided.arguments) == ("approved", {"order": "A-17", "amount": 25})
    assert decided.decided_by is not None
    assert (decided.decided_by.name, decided.decided_by.role) == ("dana", "participant")
    state = (await huddle.server.parts.host.view(room.chat)).state
    [part] = [p for p in state.active_turn.response_parts if isinstance(p, ToolCallPart)]  # type: ignore[union-attr]
    assert isinstance(part.tool_call, ToolCallCompleted)  # the agent's side runs it


async def test_a_denial_carries_the_persons_reason_and_name(huddle: RunningServer) -> None:
    room, people = await room_in_a_turn(huddle, "ahp-session:/host-deny")
    decision = asyncio.create_task(people.approve("refund", REFUND))
    [call] = await calls_waiting(room)
    await deny(room, call, "Not this month")
    async with asyncio.timeout(WITHIN):
        decided = await decision

    assert (decided.decision, decided.reason, decided.arguments) == (
        "denied",
        "Not this month",
        REFUND,
    )
    assert decided.decided_by is not None
    assert decided.decided_by.name == "dana"


async def test_an_approval_nobody_gives_in_time_is_expired_and_credits_nobody(
    clock: WallClock,
) -> None:
    async with clocked_server(clock) as huddle:
        room, people = await room_in_a_turn(huddle, "ahp-session:/host-expiry")
        asked = people.approve("refund", REFUND, expiry=Expiry(seconds=60, on_expiry="decline"))
        decision = asyncio.create_task(asked)
        await calls_waiting(room)
        await time_passes(huddle, clock, 61)
        async with asyncio.timeout(WITHIN):
            decided = await decision

    assert (decided.decision, decided.decided_by) == ("expired", None)


async def test_a_call_asked_again_once_settled_returns_its_decision_without_asking(
    huddle: RunningServer,
) -> None:
    room, people = await room_in_a_turn(huddle, "ahp-session:/host-again")
    decision = asyncio.create_task(people.approve("refund", REFUND, call_id="refund-1"))
    [call] = await calls_waiting(room)
    await approve(room, call)
    async with asyncio.timeout(WITHIN):
        await decision

    again = await people.approve("refund", REFUND, call_id="refund-1")  # a tool run again

    assert (again.decision, again.arguments) == ("approved", REFUND)


async def test_a_chat_with_no_turn_to_ask_in_is_abandoned(huddle: RunningServer) -> None:
    room = await open_room(huddle, "ahp-session:/host-none")
    with pytest.raises(InputAbandoned, match="no turn"):
        await HostChat(huddle.server.parts.host, room.chat).approve("refund", REFUND)
