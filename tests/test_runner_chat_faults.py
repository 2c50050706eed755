"""The runner's faults as people see them in chats: a real Huddle server
running the agent, a participant on a real WebSocket.

A child agent's approval is answered in its own chat; a reply cut off by a
transient failure is marked and retried in a part of its own; a turn whose
agent version is gone fails with the reason in its chat; a suspension its
chat never showed (the worker died in between) is shown by the next sweep.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pytest

from protocol.actions import (
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTurnStarted,
)
from protocol.chat import (
    ChatState,
    MarkdownPart,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from protocol.session import SessionState
from protocol.wire import ErrorInfo
from server.client import HuddleClient, Mirror
from server.errors import ActionRejected, StoreUnavailable
from server.runner.agent import Agent, Tool, TransientError, require_approval_for
from server.runner.model import ModelReply, ScriptedModel, TextSink, ToolSpec
from server.runner.resuming import STARTS
from server.runner.runner import Runner
from server.runner.service import AgentService
from server.runner.showing import INTERRUPTED
from server.runner.turn import ModelMessage, Suspension, TurnStatus
from server.runner.turn_store import MemoryTurnStore
from server.store.memory import MemoryStore
from tests.conftest import UNIT, RunningServer, start_server, user_message, watched_chat
from tests.edge import http
from tests.mcp_kit import input_parts, submitted
from tests.runner_kit import Runs, call, say, scripted, use

WITHIN = 10 * UNIT


async def until(mirror: Mirror, predicate: Callable[[ChatState], bool]) -> ChatState:
    def check(state: object) -> bool:
        return isinstance(state, ChatState) and predicate(state)

    async with asyncio.timeout(WITHIN):
        state = await mirror.wait_for(check)
    assert isinstance(state, ChatState)
    return state


def ended(state: ChatState) -> bool:
    return state.active_turn is None and bool(state.turns)


def pending(state: ChatState) -> ToolCallPendingConfirmation | None:
    for part in state.active_turn.response_parts if state.active_turn else []:
        if isinstance(part, ToolCallPart) and isinstance(
            part.tool_call, ToolCallPendingConfirmation
        ):
            return part.tool_call
    return None


async def open_chat(huddle: RunningServer, ask: str) -> tuple[HuddleClient, str, Mirror]:
    """Alice's session, whose default chat has just started turn ``t1``."""
    alice = await huddle.client(name="alice")
    chat, mirror = await watched_chat(alice, "ahp-session:/faults", title="Faults")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-01-10T10:00:00.000Z", message=user_message(ask)
    )
    await alice.dispatch_and_wait(chat, started)
    return alice, chat, mirror


async def approve(person: HuddleClient, chat: str, turn_id: str, call_id: str) -> None:
    await person.dispatch_and_wait(
        chat,
        ChatToolCallConfirmed(
            turn_id=turn_id, tool_call_id=call_id, approved=True, confirmed="user-action"
        ),
    )


# ─── A child's approval, from its own chat ───────────────────────────────────


def lead_with_a_careful_child(runs: Runs) -> Agent:
    fetcher = Agent(
        name="fetcher",
        instructions="Fetch.",
        model=scripted(use(call("f1", "fetch")), say("Fetched it.")),
        tools=(runs.tool("fetch"),),
        approval_policy=require_approval_for("fetch"),
    )
    return Agent(
        name="lead",
        instructions="Lead.",
        model=scripted(use(call("c1", "research", task="fetch the report")), say("All done.")),
        tools=(Tool(name="research", description="Research", child=fetcher),),
    )


async def test_a_child_agents_approval_is_answered_from_its_own_chat() -> None:
    runs = Runs()
    huddle = await start_server(agent=lead_with_a_careful_child(runs))
    try:
        alice, chat, mirror = await open_chat(huddle, "Research it")
        session = await alice.subscribe("ahp-session:/faults")

        def child_chat(state: object) -> bool:
            return isinstance(state, SessionState) and len(state.chats) == 2

        async with asyncio.timeout(WITHIN):
            state = await session.wait_for(child_chat)
        assert isinstance(state, SessionState)
        child = next(c.resource for c in state.chats if c.resource != chat)
        child_mirror = await alice.subscribe(child)
        waiting = await until(child_mirror, lambda s: pending(s) is not None)
        call_ = pending(waiting)
        assert call_ is not None
        assert waiting.active_turn is not None
        await approve(alice, child, waiting.active_turn.id, call_.tool_call_id)
        done = await until(mirror, ended)
    finally:
        await huddle.stop()
    assert done.turns[-1].state == "complete"
    assert runs.count("fetch") == 1


# ─── A reply cut off by a transient failure ──────────────────────────────────


class CutOffOnce(ScriptedModel):
    """Streams half a reply and fails (a dropped stream) once; then the whole."""

    def __init__(self) -> None:
        super().__init__(lambda messages: ModelReply(text="The whole answer."))
        self.cut = False

    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        if not self.cut:
            self.cut = True
            assert on_text is not None
            await on_text("The first half")
            raise TransientError("the stream dropped")
        return await super().complete(messages, tools, on_text)


async def test_a_reply_cut_off_by_a_transient_failure_is_marked_and_retried_in_its_own_part() -> (
    None
):
    agent = Agent(name="talker", instructions="Talk.", model=CutOffOnce(), retry_backoff=0.01)
    huddle = await start_server(agent=agent)
    try:
        _, _, mirror = await open_chat(huddle, "Tell me")
        done = await until(mirror, ended)
    finally:
        await huddle.stop()
    parts = {p.id: p.content for p in done.turns[-1].response_parts if isinstance(p, MarkdownPart)}
    assert parts == {"t1:md:0": "The first half" + INTERRUPTED, "t1:md:0.1": "The whole answer."}


# ─── A version that is gone ──────────────────────────────────────────────────


def deployer(version: str, runs: Runs) -> Agent:
    """Version ``version``; its ``deploy`` runs are recorded as deploy-v<version>."""

    def deploy(arguments: dict[str, Any]) -> str:
        runs.record(f"deploy-v{version}", arguments)
        return "deployed"

    return Agent(
        name="deployer",
        instructions="Deploy.",
        model=scripted(use(call("c1", "deploy")), say("Deployed.")),
        tools=(Tool(name="deploy", description="Deploy", function=deploy),),
        version=version,
        approval_policy=require_approval_for("deploy"),
    )


async def test_a_turn_whose_agent_version_is_gone_fails_with_the_reason_in_its_chat() -> None:
    runs, store, turns = Runs(), MemoryStore(), MemoryTurnStore()
    first = await start_server(store=store, turn_store=turns, agent=deployer("1", runs))
    try:
        _, chat, mirror = await open_chat(first, "Deploy it")
        await until(mirror, lambda s: pending(s) is not None)
    finally:
        await first.stop()
    # Redeployed with version 2 only, on the same stores.
    second = await start_server(store=store, turn_store=turns, agent=deployer("2", runs))
    try:
        service = second.server.parts.service
        assert service is not None
        service.runner.max_attempts, service.runner.attempt_backoff = 2, 0.01
        bob = await second.client(name="bob")
        mirror = await bob.subscribe(chat)
        await approve(bob, chat, "t1", "c1")
        done = await until(mirror, ended)
        reply = await http("GET", f"{second.http}/metrics", token=second.token("agent"))
        metrics = reply.body.decode()
    finally:
        await second.stop()
    assert 'huddle_runner_attempts_failed_total{kind="AgentVersionGone"} 2.0' in metrics
    assert 'huddle_runner_turns_ended_total{status="FAILED"} 1.0' in metrics
    assert done.turns[-1].state == "error"
    error = done.turns[-1].error
    assert isinstance(error, ErrorInfo)
    assert "agent 'deployer' version 1 is no longer deployed" in error.message
    assert runs.runs == []


# ─── A suspension its chat never showed ──────────────────────────────────────


def deploying(runs: Runs) -> Agent:
    """An agent whose one call, ``deploy`` (recorded in ``runs``), needs a
    person's approval."""
    return Agent(
        name="deployer",
        instructions="Deploy.",
        model=scripted(use(call("c1", "deploy")), say("Deployed.")),
        tools=(runs.tool("deploy"),),
        approval_policy=require_approval_for("deploy"),
    )


async def saved_not_shown(
    huddle: RunningServer, agent: Agent, clock: Callable[[], float] = time.time
) -> tuple[AgentService, HuddleClient, str, Mirror, str]:
    """Alice's chat turn t1, whose runner's turn a worker with no chat to
    show it in (one that dies before its chat shows it) left waiting for
    approval (at ``clock``'s now): the service, Alice, the chat, her mirror
    of it and the turn's id."""
    service = huddle.server.parts.service
    assert service is not None
    alice, chat, mirror = await open_chat(huddle, "Deploy it")
    turn_id = await service.bridge.resuming.turn_of(chat, "t1")
    assert turn_id is not None
    waiting = await Runner(service.runner.store, [agent], clock=clock).execute(turn_id)
    assert waiting.status == TurnStatus.WAITING_FOR_APPROVAL
    return service, alice, chat, mirror, turn_id


@pytest.mark.parametrize(
    "started",
    [
        pytest.param(False, id="never-shown"),
        # A chaos run (bench.chaos, seed 7) found this one: a worker killed
        # between the call's start and its confirmation left the turn
        # waiting for an approval nobody could give, the sweep taking the
        # started call for an asked one.
        pytest.param(True, id="shown-only-started"),
    ],
)
async def test_an_approval_the_chat_never_showed_is_shown_by_the_next_sweep(started: bool) -> None:
    runs = Runs()
    agent = deploying(runs)
    huddle = await start_server(agent=agent, workers=0)
    try:
        service, alice, chat, mirror, turn_id = await saved_not_shown(huddle, agent)
        if started:
            worker = await huddle.client("agent")
            start = ChatToolCallStart(
                turn_id="t1", tool_call_id="c1", tool_name="deploy", display_name="Deploy"
            )
            await worker.dispatch_and_wait(chat, start)
        assert pending((await huddle.server.parts.host.view(chat)).state) is None  # type: ignore[arg-type]
        await service.bridge.reconcile()
        assert pending((await huddle.server.parts.host.view(chat)).state) is None  # type: ignore[arg-type]
        service.bridge.sweep.ask_again_after = 0.0  # as if it had gone unseen for long
        await service.bridge.reconcile()
        shown = await until(mirror, lambda s: pending(s) is not None)
        call_ = pending(shown)
        assert call_ is not None
        assert call_.tool_call_id == "c1"
        await approve(alice, chat, "t1", "c1")
        resumed: Any = await service.runner.store.load(turn_id)
        assert resumed.status == TurnStatus.READY
    finally:
        await huddle.stop()


# ─── A plain-text question ───────────────────────────────────────────────────


async def test_a_plain_text_question_is_asked_and_answered_under_its_own_id() -> None:
    agent = Agent(name="clerk", instructions="Help.", model=scripted(say("Thanks.")))
    huddle = await start_server(agent=agent, workers=0)
    try:
        service = huddle.server.parts.service
        assert service is not None
        alice, chat, mirror = await open_chat(huddle, "Where is my order?")
        turn_id = await service.bridge.resuming.turn_of(chat, "t1")
        assert turn_id is not None
        turn = await service.runner.store.load(turn_id)
        question = Suspension.user_input("Which order number?", question_id="text:0000beef")
        await service.runner.suspend(turn, question)
        state = await until(mirror, lambda s: bool(input_parts(s)))
        part = input_parts(state)[-1]
        assert part.request.id == "t1:input:text:0000beef"
        answers = submitted(reply=TextValue(value="O-1001"))
        await alice.dispatch_and_wait(
            chat, ChatInputCompleted(request_id=part.request.id, response="accept", answers=answers)
        )
        resumed = await service.runner.store.load(turn_id)
        assert resumed.status == TurnStatus.READY
        assert resumed.messages[-1] == ModelMessage(role="user", content="O-1001")
    finally:
        await huddle.stop()


# ─── Over HTTP ───────────────────────────────────────────────────────────────


async def test_a_turn_started_over_http_runs_the_agent() -> None:
    # An action sent over HTTP has no origin; it is still a person's (the
    # server's word on who sent it), so the agent answers it.
    agent = Agent(name="helper", instructions="Help.", model=scripted(say("Hello.")))
    huddle = await start_server(agent=agent)
    try:
        alice = await huddle.client(name="alice")
        chat, mirror = await watched_chat(alice, "ahp-session:/http")
        started = ChatTurnStarted(
            turn_id="t1", started_at="2027-01-10T10:00:00.000Z", message=user_message("Hi")
        )
        body = {"channel": chat, "action": msgspec.to_builtins(started)}

        reply = await http(
            "POST", f"{huddle.http}/api/dispatch", body=body, token=huddle.token(name="lee")
        )
        done = await until(mirror, ended)
    finally:
        await huddle.stop()

    assert reply.status == 200
    assert done.turns[-1].state == "complete"


async def test_an_approval_whose_resume_was_lost_is_resumed_by_the_sweep() -> None:
    # The sweep built the approval's resume without `confirmed`, which
    # ChatToolCallConfirmed refuses: the ValueError ended the sweep, and the
    # approved turn waited for good.
    runs = Runs()
    agent = deploying(runs)
    huddle = await start_server(agent=agent)
    try:
        service = huddle.server.parts.service
        assert service is not None
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        await until(mirror, lambda s: pending(s) is not None)
        turn_id = await service.bridge.resuming.turn_of(chat, "t1")
        assert turn_id is not None
        lost: list[str] = []

        async def crash(turn: str, *args: Any, **kwargs: Any) -> None:
            lost.append(turn)  # the process died between the chat's accept and the resume

        runner: Any = service.runner
        runner.submit_resume = crash
        await approve(alice, chat, "t1", "c1")
        del runner.submit_resume
        assert lost == [turn_id]

        assert await service.bridge.reconcile() == 1
        done = await until(mirror, ended)
    finally:
        await huddle.stop()
    assert done.turns[-1].state == "complete"
    assert [run.tool for run in runs.runs] == ["deploy"]


async def test_a_persons_approval_claiming_none_was_needed_is_refused() -> None:
    # Every path resumes from the chat's state, where "not-needed" is
    # nobody's approval: a person's approval saying so would show the call
    # running while its turn waited for good. The host refuses it instead.
    runs = Runs()
    huddle = await start_server(agent=deploying(runs))
    try:
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        await until(mirror, lambda s: pending(s) is not None)
        claim = ChatToolCallConfirmed(
            turn_id="t1", tool_call_id="c1", approved=True, confirmed="not-needed"
        )
        with pytest.raises(ActionRejected, match="'not-needed' says nobody had to"):
            await alice.dispatch_and_wait(chat, claim)
        assert isinstance(mirror.state, ChatState)
        assert pending(mirror.state) is not None  # still waiting
        await approve(alice, chat, "t1", "c1")
        done = await until(mirror, ended)
    finally:
        await huddle.stop()
    assert done.turns[-1].state == "complete"
    assert [run.tool for run in runs.runs] == ["deploy"]


# ─── The sweep against a call still being shown ──────────────────────────────


async def test_the_sweep_never_approves_a_call_that_is_streaming_or_waiting() -> None:
    # The chaos run's finding: a worker saved the suspension and was still
    # showing the call (`toolCallStart`, then `toolCallReady`) when the
    # sweep read the chat, took the streaming call for an approved one and
    # resumed the turn: the tool ran with nobody approving it.
    runs = Runs()
    agent = deploying(runs)
    huddle = await start_server(agent=agent, workers=0)
    try:
        service, alice, chat, _, turn_id = await saved_not_shown(huddle, agent)
        shower = await huddle.client(role="agent")
        steps: list[Any] = [
            ChatToolCallStart(
                turn_id="t1", tool_call_id="c1", tool_name="deploy", display_name="D"
            ),
            ChatToolCallReady(turn_id="t1", tool_call_id="c1", invocation_message="Deploy?"),
        ]
        for step in steps:
            await shower.dispatch_and_wait(chat, step)
            assert await service.bridge.reconcile() == 0
            turn = await service.runner.store.load(turn_id)
            assert turn.status == TurnStatus.WAITING_FOR_APPROVAL
        await approve(alice, chat, "t1", "c1")
        resumed = await service.runner.store.load(turn_id)
    finally:
        await huddle.stop()
    assert runs.runs == []
    assert resumed.status == TurnStatus.READY
    assert resumed.audit[-1].metadata["by"] == "alice"


async def test_the_sweep_never_approves_a_call_readied_without_a_confirmation() -> None:
    # `toolCallReady` with `confirmed` skips the confirmation: the call runs
    # as "not-needed", which is nobody's approval of a call that needs one.
    runs = Runs()
    agent = deploying(runs)
    huddle = await start_server(agent=agent, workers=0)
    try:
        service, _, chat, _, turn_id = await saved_not_shown(huddle, agent)
        shower = await huddle.client(role="agent")
        start = ChatToolCallStart(
            turn_id="t1", tool_call_id="c1", tool_name="deploy", display_name="D"
        )
        ready = ChatToolCallReady(
            turn_id="t1", tool_call_id="c1", invocation_message="Deploy", confirmed="not-needed"
        )
        await shower.dispatch_and_wait(chat, start)
        await shower.dispatch_and_wait(chat, ready)
        assert await service.bridge.reconcile() == 0
        turn = await service.runner.store.load(turn_id)
    finally:
        await huddle.stop()
    assert turn.status == TurnStatus.WAITING_FOR_APPROVAL
    assert runs.runs == []


# ─── A start a crash left undone ─────────────────────────────────────────────


async def test_a_chat_turn_whose_start_a_crash_lost_is_started_by_the_sweep() -> None:
    # A server killed right after it accepted a person's chat/turnStarted
    # left the chat turn active with no runner's turn behind it, for good:
    # the sweep looked only at waiting turns (found by a chaos run).
    agent = Agent(name="helper", instructions="Help.", model=scripted(say("Hello.")))
    huddle = await start_server(agent=agent)
    try:
        service = huddle.server.parts.service
        assert service is not None
        runner: Any = service.runner
        lost: list[str] = []

        async def crash(agent: Agent, text: str, **kwargs: Any) -> None:
            # The store went away before the runner's turn began, as it does
            # for a process killed there: nothing after the append was done.
            lost.append(kwargs["turn_id"])
            raise StoreUnavailable("gone before the turn began")

        runner.start = crash
        _, chat, mirror = await open_chat(huddle, "Hi")
        del runner.start
        assert len(lost) == 1
        assert await service.bridge.resuming.turn_of(chat, "t1") is None
        assert await service.bridge.reconcile() == 0  # its process may be starting it now
        service.bridge.sweep.ask_again_after = 0.0  # as if it had gone unstarted for long

        assert await service.bridge.reconcile() == 1
        done = await until(mirror, ended)
        assert await service.bridge.reconcile() == 0  # started once
    finally:
        await huddle.stop()
    assert done.turns[-1].state == "complete"
    assert await huddle.server.parts.store.records(STARTS) == {}


async def test_a_start_that_never_landed_leaves_no_record_after_the_sweep() -> None:
    # Written ahead of an append the chat then refused (or one lost with
    # its process): its chat has no such turn, so the sweep drops it.
    agent = Agent(name="helper", instructions="Help.", model=scripted(say("Hello.")))
    huddle = await start_server(agent=agent)
    try:
        service = huddle.server.parts.service
        assert service is not None
        alice = await huddle.client(name="alice")
        chat, _ = await watched_chat(alice, "ahp-session:/faults", title="Faults")
        store = huddle.server.parts.store
        record = json.dumps({"turn": "t9", "at": 0.0}).encode()
        await store.put_record(STARTS, chat, record)
        await store.put_record(STARTS, "ahp-chat:/gone", record)

        assert await service.bridge.reconcile() == 0
        assert await store.records(STARTS) == {}
        assert (await huddle.server.parts.host.view(chat)).state.active_turn is None  # type: ignore[union-attr]
    finally:
        await huddle.stop()
