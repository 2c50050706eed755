"""An AHP turn id used again after a truncation: a real Huddle server
running the agent, a participant on a real WebSocket.

AHP turn ids are the client's choice, and a chat rewound with
``chat/truncated`` may see one again (a client that numbers its turns
does). The second turn of the id gets an agent's turn of its own, and the
first one's agent turn, should it still be winding down, cannot reach the
chat turn that now bears its id: the server stamps each person's turn
(``_meta.huddle.turn``), and the bridge matches turns by id and stamp.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest

from protocol.actions import ChatInputCompleted, ChatTruncated, ChatTurnCancelled, ChatTurnStarted
from protocol.chat import ChatState, InputRequest, InputRequestPart, MarkdownPart, TextValue
from server.auth import Role
from server.client import HuddleClient, Mirror
from server.core.policy import turn_stamp
from server.errors import InputAbandoned
from server.mcp.tools import people_of_current_call
from server.runner.agent import Agent, Tool
from server.runner.ids import runner_turn_id
from server.runner.model import ModelReply
from server.runner.runner import REQUEST_USER_INPUT
from server.runner.service import AgentService
from server.runner.turn import ModelMessage, TurnStatus
from server.runner.worker import Worker
from tests.conftest import UNIT, RunningServer, start_server, user_message, watched_chat
from tests.mcp_kit import submitted
from tests.runner_kit import Model, call, say, use
from tests.test_runner_chat_faults import ended, until
from tests.test_runner_chat_resume import SYSTEM, open_form

WITHIN = 10 * UNIT
ToolFunction = Callable[[dict[str, Any]], Awaitable[str]]


class SlowTool:
    """A tool that runs until the test lets it finish."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, arguments: dict[str, Any]) -> str:
        self.started.set()
        await self.release.wait()
        return "done"


def slow_or_asking(slow: ToolFunction) -> Agent:
    """Works slowly when told to (``slow``); otherwise asks which system,
    then thanks."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        asked = next(m.content for m in messages if m.role == "user") or ""
        step = sum(1 for m in messages if m.role == "assistant")
        if asked.startswith("Work"):
            return use(call("c1", "slow")) if step == 0 else say("Worked.")
        ask = call("c1", REQUEST_USER_INPUT, formKey="system", message="Which?")
        return use(ask) if step == 0 else say("Thanks.")

    tool = Tool(name="slow", description="Works slowly", function=slow)
    return Agent(
        name="helper", instructions="Help.", model=Model(script), tools=(tool,), forms=(SYSTEM,)
    )


def started(text: str) -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id="t1", started_at="2027-02-01T10:00:00.000Z", message=user_message(text)
    )


async def chat_state(huddle: RunningServer, chat: str) -> ChatState:
    state = (await huddle.server.host.view(chat)).state
    assert isinstance(state, ChatState)
    return state


async def rewound(
    huddle: RunningServer, service: AgentService, slow: SlowTool, role: Role = "participant"
) -> tuple[HuddleClient, str, Mirror, asyncio.Task[bool]]:
    """Alice (of ``role``) starts turn ``t1`` to work slowly, stops it while
    its tool runs on (until the test releases it), rewinds the chat and
    starts ``t1`` again, which the agent runs up to its form. Returns her
    client, the chat, her mirror of it and the first turn's run."""
    alice = await huddle.client(role, name="alice")
    chat, mirror = await watched_chat(alice, "ahp-session:/again", title="Again")
    await alice.dispatch_and_wait(chat, started("Work on it"))
    first_run = asyncio.create_task(Worker(service.runner).step())
    async with asyncio.timeout(WITHIN):
        await slow.started.wait()
    await alice.dispatch_and_wait(chat, ChatTurnCancelled(turn_id="t1", duration=1))
    await alice.dispatch_and_wait(chat, ChatTruncated())
    await alice.dispatch_and_wait(chat, started("Ask me"))
    assert await Worker(service.runner).step()  # the second turn, up to its form
    await until(mirror, lambda s: open_form(s) is not None)
    return alice, chat, mirror, first_run


@pytest.mark.parametrize("role", ["participant", "agent"])
async def test_a_turn_id_used_again_after_a_truncation_gets_a_turn_the_first_cannot_reach(
    role: Role,
) -> None:
    slow = SlowTool()
    huddle = await start_server(agent=slow_or_asking(slow), workers=0)
    service = huddle.server.parts.service
    assert isinstance(service, AgentService)
    try:
        alice, chat, mirror, first_run = await rewound(huddle, service, slow, role)
        stamp = turn_stamp((await chat_state(huddle, chat)).active_turn.message)  # type: ignore[union-attr]
        assert stamp is not None
        slow.release.set()  # the first one winds down now, cancelled
        async with asyncio.timeout(WITHIN):
            assert await first_run

        first = await service.store.load(runner_turn_id(chat, "t1"))
        second = await service.store.load(runner_turn_id(chat, "t1", stamp))
        assert first.status == TurnStatus.CANCELLED
        assert second.status == TurnStatus.WAITING_FOR_USER
        state = await chat_state(huddle, chat)
        assert state.active_turn is not None  # the first's end did not end it
        assert turn_stamp(state.active_turn.message) == stamp
        form = open_form(state)
        assert form is not None
        answer = ChatInputCompleted(
            request_id=form.request.id,
            response="accept",
            answers=submitted(system=TextValue(value="SSO")),
        )
        await alice.dispatch_and_wait(chat, answer)
        assert await Worker(service.runner).step()
        state = await until(mirror, ended)
        turn = state.turns[-1]
        assert (turn.id, turn.state) == ("t1", "complete")
        text = "".join(p.content for p in turn.response_parts if isinstance(p, MarkdownPart))
        assert text == "Thanks."
        assert (await service.store.load(second.id)).status == TurnStatus.COMPLETED
    finally:
        await huddle.stop()


async def test_a_turn_started_twice_under_its_stamp_starts_one_agent_turn() -> None:
    slow = SlowTool()
    huddle = await start_server(agent=slow_or_asking(slow), workers=0)
    service = huddle.server.parts.service
    assert isinstance(service, AgentService)
    try:
        alice = await huddle.client(name="alice")
        chat, _ = await watched_chat(alice, "ahp-session:/twice", title="Twice")
        await alice.dispatch_and_wait(chat, started("Ask me"))
        state = await chat_state(huddle, chat)
        assert state.active_turn is not None
        action = ChatTurnStarted(
            turn_id="t1", started_at=state.active_turn.started_at, message=state.active_turn.message
        )
        # The bridge hears the same start again (as after a crash and a replay).
        await service.bridge.resuming.accepted(chat, action, {}, state)

        assert await Worker(service.runner).step()
        assert not await Worker(service.runner).step()  # nothing else to run
        turn = await service.store.load(runner_turn_id(chat, "t1"))
        assert turn.chat_turn_stamp == turn_stamp(state.active_turn.message) is not None
    finally:
        await huddle.stop()


async def test_a_tool_of_a_turn_that_is_over_asks_in_no_later_turn() -> None:
    # A tool still running once its turn was cancelled and truncated away
    # (as an MCP server's elicitation would) must not ask in the turn that
    # now bears its id.
    slow = SlowTool()
    asked: list[str] = []

    async def late_question(arguments: dict[str, Any]) -> str:
        await slow(arguments)
        people = people_of_current_call()
        assert people is not None
        try:
            await people.ask(InputRequest(id="late", message="Still there?"), None)
        except InputAbandoned as error:
            asked.append(f"abandoned: {error}")
        return "done"

    huddle = await start_server(agent=slow_or_asking(late_question), workers=0)
    service = huddle.server.parts.service
    assert isinstance(service, AgentService)
    try:
        _, chat, _, first_run = await rewound(huddle, service, slow)
        slow.release.set()
        async with asyncio.timeout(WITHIN):
            assert await first_run

        state = await chat_state(huddle, chat)
        assert state.active_turn is not None
        ids = [
            p.request.id
            for p in state.active_turn.response_parts
            if isinstance(p, InputRequestPart)
        ]
        assert "late" not in ids
        assert len(asked) == 1
        assert asked[0].startswith("abandoned: ")
    finally:
        await huddle.stop()
