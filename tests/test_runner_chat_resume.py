"""A person's answer in a chat resumes the turn with nothing read on its path,
and a tool's call shows in order: a real Huddle server running the agent, a
participant on a real WebSocket.

The bridge reads the turn ahead when its question shows, so the resume is
one save; a stale copy read ahead only costs a load. A coroutine tool starts
before its call shows (it shows while it runs), a plain function after; the
chat sees every step of a call in order either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from protocol.actions import ChatInputCompleted
from protocol.chat import ChatState, InputRequestPart, TextValue
from protocol.messages import ActionEnvelope
from server.client import HuddleClient, Mirror
from server.runner.agent import Agent, FormDefinition, Tool, require_approval_for
from server.runner.ids import runner_turn_id
from server.runner.runner import REQUEST_USER_INPUT
from server.runner.service import AgentService
from server.runner.turn import Turn
from server.runner.turn_store import MemoryTurnStore
from server.runner.worker import Worker
from tests.conftest import UNIT, RunningServer, start_server
from tests.mcp_kit import submitted
from tests.runner_kit import Runs, call, say, scripted, use
from tests.test_runner_chat_faults import approve, ended, open_chat, pending, until

WITHIN = 10 * UNIT

SYSTEM = FormDefinition(
    key="system",
    description="Which system",
    schema={
        "type": "object",
        "properties": {"system": {"type": "string", "title": "System"}},
        "required": ["system"],
    },
)


class Counted(MemoryTurnStore):
    """Counts loads and tells when the turn was saved runnable."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0
        self.resumed = asyncio.Event()

    async def load(self, turn_id: str) -> Turn:
        self.loads += 1
        return await super().load(turn_id)

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        saved = await super().save_runnable(turn, now, started=started)
        self.resumed.set()
        return saved


async def served(helper: Agent, store: Counted) -> tuple[RunningServer, AgentService]:
    """A server whose turns no worker runs on its own: the test steps them."""
    huddle = await start_server(agent=helper, turn_store=store, workers=0)
    service = huddle.server.parts.service
    assert service is not None
    return huddle, service


async def read_ahead(service: AgentService, turn_id: str) -> None:
    """Wait until the bridge has read ``turn_id`` ahead (its reads run in
    the background once the question shows)."""
    bridge = service.bridge.resuming
    async with asyncio.timeout(WITHIN):
        while bridge._tasks:
            await asyncio.wait(set(bridge._tasks))
    assert turn_id in bridge._read_ahead


def open_form(state: ChatState) -> InputRequestPart | None:
    for part in state.active_turn.response_parts if state.active_turn else []:
        if isinstance(part, InputRequestPart) and part.response is None:
            return part
    return None


def asking_approval(runs: Runs) -> Agent:
    return Agent(
        name="deployer",
        instructions="Deploy.",
        model=scripted(use(call("c1", "deploy")), say("Deployed.")),
        tools=(runs.tool("deploy"),),
        approval_policy=require_approval_for("deploy"),
    )


def asking_a_form(runs: Runs) -> Agent:
    ask = call("c1", REQUEST_USER_INPUT, formKey="system", message="Which?")
    return Agent(
        name="asker",
        instructions="Ask.",
        model=scripted(use(ask), use(call("c2", "deploy")), say("Deployed.")),
        tools=(runs.tool("deploy"),),
        forms=(SYSTEM,),
    )


async def answer(person: HuddleClient, chat: str, mirror: Mirror) -> None:
    """Approve the call waiting for confirmation, or submit the open form."""
    state = await until(mirror, lambda s: pending(s) is not None or open_form(s) is not None)
    waiting = pending(state)
    if waiting is not None:
        await approve(person, chat, "t1", waiting.tool_call_id)
        return
    form = open_form(state)
    assert form is not None
    completed = ChatInputCompleted(
        request_id=form.request.id,
        response="accept",
        answers=submitted(system=TextValue(value="SSO")),
    )
    await person.dispatch_and_wait(chat, completed)


@pytest.mark.parametrize("make", [asking_approval, asking_a_form], ids=["approval", "form"])
async def test_a_persons_answer_resumes_the_turn_without_reading_it_again(
    make: Callable[[Runs], Agent],
) -> None:
    runs, store = Runs(), Counted()
    huddle, service = await served(make(runs), store)
    try:
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        assert await Worker(service.runner).step()  # up to the question
        await until(mirror, lambda s: pending(s) is not None or open_form(s) is not None)
        await read_ahead(service, runner_turn_id(chat, "t1"))
        read_ahead_loads = store.loads
        await answer(alice, chat, mirror)
        async with asyncio.timeout(WITHIN):
            await store.resumed.wait()
        assert store.loads == read_ahead_loads  # the resume read nothing
        assert await Worker(service.runner).step()
        await until(mirror, ended)
        assert runs.count("deploy") == 1
    finally:
        await huddle.stop()


async def test_a_turn_read_ahead_and_changed_since_is_resumed_from_the_store() -> None:
    runs, store = Runs(), Counted()
    huddle, service = await served(asking_approval(runs), store)
    try:
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        assert await Worker(service.runner).step()
        state = await until(mirror, lambda s: pending(s) is not None)
        turn_id = runner_turn_id(chat, "t1")
        await read_ahead(service, turn_id)
        # The turn changes after the bridge read it (a save elsewhere).
        await store.save(await store.load(turn_id))
        loads = store.loads
        waiting = pending(state)
        assert waiting is not None
        await approve(alice, chat, "t1", waiting.tool_call_id)
        async with asyncio.timeout(WITHIN):
            await store.resumed.wait()
        assert store.loads == loads + 1  # the stale copy's save failed: loaded, decided again
        assert await Worker(service.runner).step()
        await until(mirror, ended)
        assert runs.count("deploy") == 1
    finally:
        await huddle.stop()


# ─── A call's steps in the chat, in order ────────────────────────────────────


def call_steps(envelopes: list[ActionEnvelope], call_id: str) -> list[str]:
    """The types of the actions about tool call ``call_id``, in seq order."""
    ordered = sorted(envelopes, key=lambda e: e.server_seq)
    return [
        type(e.action).__name__
        for e in ordered
        if getattr(e.action, "tool_call_id", None) == call_id
    ]


def working(kind: str, runs: Runs) -> Tool:
    async def coroutine(arguments: dict[str, Any]) -> str:
        runs.record("work", arguments)
        await asyncio.sleep(0)  # the call shows meanwhile
        return "done"

    def plain(arguments: dict[str, Any]) -> str:
        runs.record("work", arguments)
        return "done"

    function: Callable[[dict[str, Any]], Awaitable[str] | str]
    function = coroutine if kind == "coroutine" else plain
    return Tool(name="work", description="Work", function=function)


@pytest.mark.parametrize("kind", ["coroutine", "plain"])
async def test_a_calls_steps_show_in_order_whether_it_starts_before_they_show_or_after(
    kind: str,
) -> None:
    runs, store = Runs(), Counted()
    helper = Agent(
        name="worker",
        instructions="Work.",
        model=scripted(use(call("c1", "work"), call("c2", "work")), say("Worked.")),
        tools=(working(kind, runs),),
    )
    huddle, service = await served(helper, store)
    try:
        _, _, mirror = await open_chat(huddle, "Work")
        seen: list[ActionEnvelope] = []
        mirror.listeners.append(seen.append)
        assert await Worker(service.runner).step()
        await until(mirror, ended)
        for call_id in ("c1", "c2"):
            assert call_steps(seen, call_id) == [
                "ChatToolCallStart",
                "ChatToolCallReady",
                "ChatToolCallComplete",
            ]
        assert runs.count("work") == 2
    finally:
        await huddle.stop()
