"""The demo story end to end over WebSocket, with the agent in the server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.actions import (
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatTruncated,
    ChatTurnStarted,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequestPart,
    MarkdownPart,
    SelectedValue,
    SingleSelectQuestion,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from server.client import Mirror
from server.errors import ActionRejected
from server.runner.demo import agent
from server.runner.ids import runner_turn_id
from server.runner.turn import TurnStatus
from tests.conftest import UNIT, RunningServer, start_server, user_message, watched_chat
from tests.test_runner_expiry import Ends


@pytest.fixture
async def with_demo() -> AsyncIterator[RunningServer]:
    running = await start_server(agent=agent)
    try:
        yield running
    finally:
        await running.stop()


TICKET_DETAILS = {
    "affectedSystem": InputAnswer(state="submitted", value=TextValue(value="SSO")),
    "impactScope": InputAnswer(state="submitted", value=SelectedValue(value="ALL_USERS")),
}
"""The demo agent's form, filled in."""


def open_request(state: object) -> InputRequestPart | None:
    assert isinstance(state, ChatState)
    if state.active_turn is None:
        return None
    for part in state.active_turn.response_parts:
        if isinstance(part, InputRequestPart) and part.response is None:
            return part
    return None


def pending_call(state: object) -> ToolCallPendingConfirmation | None:
    assert isinstance(state, ChatState)
    if state.active_turn is None:
        return None
    for part in state.active_turn.response_parts:
        if isinstance(part, ToolCallPart) and isinstance(
            part.tool_call, ToolCallPendingConfirmation
        ):
            return part.tool_call
    return None


def final_text(state: ChatState) -> str:
    turn = state.turns[-1]
    return "".join(p.content for p in turn.response_parts if isinstance(p, MarkdownPart))


async def wait(mirror: Mirror, predicate: object) -> ChatState:
    async with asyncio.timeout(10 * UNIT):
        state = await mirror.wait_for(predicate)  # type: ignore[arg-type]
    assert isinstance(state, ChatState)
    return state


async def test_the_demo_agent_asks_waits_for_approval_and_reports_the_ticket(
    with_demo: RunningServer,
) -> None:
    alice = await with_demo.client(name="alice")
    chat, mirror = await watched_chat(alice, "ahp-session:/demo", title="Login outage")
    await alice.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1",
            started_at="2026-11-30T10:00:00.000Z",
            message=user_message("Open a high-priority ticket: nobody can log in"),
        ),
    )
    state = await wait(mirror, lambda s: open_request(s) is not None)
    request = open_request(state)
    assert request is not None
    questions = {q.id: q for q in request.request.questions or []}
    assert list(questions) == ["affectedSystem", "impactScope"]
    assert all(q.required for q in questions.values())
    scope = questions["impactScope"]
    assert isinstance(scope, SingleSelectQuestion)
    assert [o.id for o in scope.options] == ["ONE_USER", "PARTIAL_USERS", "ALL_USERS"]
    await alice.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id=request.request.id,
            response="accept",
            answers=TICKET_DETAILS,
        ),
    )
    state = await wait(mirror, lambda s: pending_call(s) is not None)
    call = pending_call(state)
    assert call is not None
    assert call.tool_name == "create_support_ticket"
    await alice.dispatch_and_wait(
        chat,
        ChatToolCallConfirmed(
            turn_id="t1", tool_call_id=call.tool_call_id, approved=True, confirmed="user-action"
        ),
    )
    state = await wait(mirror, lambda s: isinstance(s, ChatState) and bool(s.turns))
    assert state.turns[-1].state == "complete"
    assert "HUD-" in final_text(state)


async def test_truncating_a_waiting_turn_is_refused_to_people_and_cancels_it_for_the_agent(
    with_demo: RunningServer,
) -> None:
    service = with_demo.server.parts.service
    assert service is not None
    ends = Ends()
    service.runner.listeners.append(ends)
    mallory = await with_demo.client(name="Mallory")
    chat, mirror = await watched_chat(mallory, "ahp-session:/cut")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2026-12-01T10:00:00.000Z", message=user_message("Login")
    )
    await mallory.dispatch_and_wait(chat, started)
    await wait(mirror, lambda s: open_request(s) is not None)
    turn_id = runner_turn_id(chat, "t1")

    with pytest.raises(ActionRejected, match="turn-in-progress"):
        await mallory.dispatch_and_wait(chat, ChatTruncated())
    waiting = await service.store.load(turn_id)
    agent_client = await with_demo.client("agent")
    await agent_client.dispatch_and_wait(chat, ChatTruncated())
    await ends.of(turn_id)
    cancelled = await service.store.load(turn_id)

    assert waiting.status == TurnStatus.WAITING_FOR_USER
    assert cancelled.status == TurnStatus.CANCELLED
