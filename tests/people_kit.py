"""What the tests of the doors to people share (RemoteChat, the framework
adapters): a chat with nobody's turn in it, a person watching it over the
WebSocket, and what that person does with what the agent puts to them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.actions import ChatInputCompleted, ChatToolCallConfirmed
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequestPart,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from protocol.messages import ChannelState
from protocol.session import SessionState
from server.client import HuddleClient, Mirror
from tests.conftest import UNIT, RunningServer, WallClock

WITHIN = 10 * UNIT
"""How long a test waits for something that must happen."""


async def time_passes(huddle: RunningServer, clock: WallClock, seconds: float) -> None:
    """``seconds`` go by on the clock of a
    :func:`~tests.conftest.clocked_server`, and it expires what is due."""
    clock.now += seconds
    await huddle.server.parts.host.expiries.sweep()


@dataclass
class Room:
    """A chat with no active turn, ``person`` watching it (their own
    participant token, in their name)."""

    person: HuddleClient
    agent: HuddleClient
    chat: str
    mirror: Mirror
    name: str


async def open_room(huddle: RunningServer, session: str, name: str = "dana") -> Room:
    """Session ``session`` made by an agent token; ``name`` watches its chat."""
    agent = await huddle.client("agent")
    await agent.create_session(session, title="Doors")
    state = (await agent.subscribe(session)).state
    assert isinstance(state, SessionState)
    chat = state.default_chat
    assert chat is not None
    person = await huddle.client(sessions=[session], name=name)
    mirror = await person.subscribe(chat)
    return Room(person, agent, chat, mirror, name)


async def wait_for(mirror: Mirror, predicate: Callable[[ChatState], bool]) -> ChatState:
    def check(state: ChannelState) -> bool:
        assert isinstance(state, ChatState)
        return predicate(state)

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(check)
    assert isinstance(state, ChatState)
    return state


def pending_calls(state: ChatState) -> list[ToolCallPendingConfirmation]:
    turn = state.active_turn
    if turn is None:
        return []
    calls = [part.tool_call for part in turn.response_parts if isinstance(part, ToolCallPart)]
    return [call for call in calls if isinstance(call, ToolCallPendingConfirmation)]


def open_requests(state: ChatState) -> list[InputRequestPart]:
    turn = state.active_turn
    if turn is None:
        return []
    return [p for p in turn.response_parts if isinstance(p, InputRequestPart) and not p.response]


async def calls_waiting(room: Room, count: int = 1) -> list[ToolCallPendingConfirmation]:
    """The calls waiting for approval, once there are ``count``."""
    state = await wait_for(room.mirror, lambda s: len(pending_calls(s)) >= count)
    return pending_calls(state)


async def requests_open(room: Room, count: int = 1) -> list[InputRequestPart]:
    """The open input requests, once there are ``count``."""
    state = await wait_for(room.mirror, lambda s: len(open_requests(s)) >= count)
    return open_requests(state)


def arguments_of(call: ToolCallPendingConfirmation) -> Any:
    return json.loads(call.tool_input or "null")


async def approve(
    room: Room, call: ToolCallPendingConfirmation, edited: dict[str, Any] | None = None
) -> None:
    turn = room.mirror.chat.active_turn
    assert turn is not None
    action = ChatToolCallConfirmed(
        turn_id=turn.id,
        tool_call_id=call.tool_call_id,
        approved=True,
        confirmed="user-action",
        selected_option_id="approve",
        edited_tool_input=None if edited is None else json.dumps(edited),
    )
    await room.person.dispatch_and_wait(room.chat, action)


async def deny(room: Room, call: ToolCallPendingConfirmation, reason: str) -> None:
    turn = room.mirror.chat.active_turn
    assert turn is not None
    action = ChatToolCallConfirmed(
        turn_id=turn.id,
        tool_call_id=call.tool_call_id,
        approved=False,
        reason="denied",
        selected_option_id="deny",
        reason_message=reason,
    )
    await room.person.dispatch_and_wait(room.chat, action)


def submitted(**values: str) -> dict[str, InputAnswer]:
    return {
        key: InputAnswer(state="submitted", value=TextValue(value=value))
        for key, value in values.items()
    }


async def fill(room: Room, request: InputRequestPart, **values: str) -> None:
    action = ChatInputCompleted(
        request_id=request.request.id, response="accept", answers=submitted(**values)
    )
    await room.person.dispatch_and_wait(room.chat, action)


async def turn_ended(room: Room) -> ChatState:
    """The chat once its active turn ended."""
    return await wait_for(room.mirror, lambda s: s.active_turn is None)


class By:
    """Equal to the ``answered_by`` / ``decided_by`` a door gives for the
    participant named ``name`` (server.mcp.people.person: the server's word,
    with the id of their token, which is not the test's to know)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, dict)
            and set(other) == {"name", "role", "token", "declared", "email", "issuer"}
            and (other["name"], other["role"], other["declared"], other["email"])
            == (self.name, "participant", False, None)
            and isinstance(other["token"], str)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"By({self.name!r})"
