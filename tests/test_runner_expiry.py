"""Waits of an agent that expire: the runner's questions and tool approvals
carry an expiry (the agent's default, or the request's own), the chat
applies its policy when nobody answers in time, and the turn goes on as the
policy says, or fails. Through a restart, with two processes on one Redis,
and for an MCP server's elicitation.

Real parts: a Huddle server running the agent, a participant on a real
WebSocket, redis-server, an in-process MCP server. Time is the server's
clock, moved by the tests; the sweeps are called, never waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest

from protocol.actions import (
    ChatError,
    ChatInputAnswerChanged,
    ChatToolCallConfirmed,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
)
from protocol.chat import InputAnswer, TextValue, ToolCallCancelled
from protocol.session import SessionState
from protocol.wire import ErrorInfo
from reducers import notes
from reducers.chat import select_latest_tool_call
from server.client import HuddleClient
from server.core.expiry import Expiry
from server.errors import ActionRejected
from server.mcp import McpServerConfig, McpToolSource
from server.runner.agent import Agent, ApprovalDecision, FormDefinition, Tool
from server.runner.context import ToolContext
from server.runner.events import EventType, RunnerEvent
from server.runner.ids import runner_turn_id
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.runner import REQUEST_USER_INPUT, ResumeRejected, Runner
from server.runner.turn import ResumeCommand, Suspension, SuspensionType, Turn, TurnStatus
from server.runner.turn_store import MemoryTurnStore, TurnStore
from server.store.base import ChannelStore
from server.store.redis import RedisStore
from tests.conftest import UNIT, UNSWEPT, RunningServer, WallClock, start_server, user_message
from tests.edge import http
from tests.mcp_kit import (
    LEGACY,
    MODES,
    Room,
    build_server,
    input_parts,
    next_request,
    reply,
    submitted,
)
from tests.redis_server import RedisServer
from tests.runner_kit import Model, Runs, call, say, scripted, started, use
from tests.test_runner_chat_faults import ended, open_chat, pending, saved_not_shown, until

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


class Ends:
    """A runner listener: the turns that ended, by id."""

    def __init__(self) -> None:
        self.ended: dict[str, asyncio.Event] = {}

    def __call__(self, event: RunnerEvent) -> None:
        if event.type in (
            EventType.TURN_COMPLETED,
            EventType.TURN_FAILED,
            EventType.TURN_CANCELLED,
        ):
            self.ended.setdefault(event.turn_id, asyncio.Event()).set()

    async def of(self, turn_id: str) -> None:
        async with asyncio.timeout(WITHIN):
            await self.ended.setdefault(turn_id, asyncio.Event()).wait()


@dataclass
class Served:
    huddle: RunningServer
    ends: Ends

    async def turn(self, chat: str) -> Turn:
        service = self.huddle.server.parts.service
        assert service is not None
        return await service.store.load(runner_turn_id(chat, "t1"))

    async def sweep(self) -> int:
        return await self.huddle.server.parts.host.expiries.sweep()


@contextlib.asynccontextmanager
async def serving(
    helper: Agent,
    clock: WallClock,
    store: ChannelStore | None = None,
    redis: RedisServer | None = None,
    turns: TurnStore | None = None,
) -> AsyncIterator[Served]:
    if redis is not None:
        turns = RedisTurnStore(redis.url)
    huddle = await start_server(UNSWEPT, store, agent=helper, turn_store=turns, clock=clock)
    ends = Ends()
    service = huddle.server.parts.service
    assert service is not None
    service.runner.listeners.append(ends)
    try:
        yield Served(huddle, ends)
    finally:
        await huddle.stop()


def asking(**options: Any) -> tuple[Agent, Model]:
    """An agent that asks for the system form, then says what it got."""
    model = scripted(use(call("c1", REQUEST_USER_INPUT, formKey="system")), say("Done."))
    helper = Agent(name="helper", instructions="Help.", model=model, forms=(SYSTEM,), **options)
    return helper, model


def approving(
    runs: Runs, decision: Callable[[], ApprovalDecision], **options: Any
) -> tuple[Agent, Model]:
    """An agent whose one call of ``deploy`` needs approval."""
    model = scripted(use(call("c1", "deploy")), say("Done."))
    return Agent(
        name="helper",
        instructions="Help.",
        model=model,
        tools=(runs.tool("deploy"),),
        approval_policy=lambda turn, call, tool: decision(),
        **options,
    ), model


async def noted(served: Served, chat: str, family: str, key: str) -> tuple[int, str]:
    """The wait's expiry, once the session's notes hold it."""
    person = served.huddle.clients[0]
    session = next(uri for uri in person.mirrors if uri.startswith("ahp-session:"))

    def holds(state: object) -> bool:
        meta = state.meta if isinstance(state, SessionState) else None
        return isinstance((notes.note_of(meta, family, chat, key) or {}).get("expiresAt"), int)

    async with asyncio.timeout(WITHIN):
        state = await person.mirrors[session].wait_for(holds)
    assert isinstance(state, SessionState)
    found = notes.note_of(state.meta, family, chat, key)
    assert found is not None
    return found["expiresAt"], found.get("onExpiry", "cancel")


async def asked_form(served: Served, chat: str) -> str:
    mirror = served.huddle.clients[0].mirrors[chat]
    part = await next_request(mirror)
    await noted(served, chat, "requests", part.request.id)
    return part.request.id


async def asked_approval(served: Served, chat: str) -> str:
    state = await until(served.huddle.clients[0].mirrors[chat], lambda s: pending(s) is not None)
    waiting = pending(state)
    assert waiting is not None
    await noted(served, chat, "toolCalls", waiting.tool_call_id)
    return waiting.tool_call_id


# ─── Questions ───────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("policy", "status"), [("cancel", "cancelled"), ("decline", "declined")])
async def test_a_form_nobody_fills_in_resumes_the_turn_as_dismissed_or_declined(
    policy: str, status: str
) -> None:
    clock = WallClock()
    helper, model = asking(input_expiry=Expiry(60, policy))  # type: ignore[arg-type]
    async with serving(helper, clock) as served:
        _, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = await asked_form(served, chat)
        at, on_expiry = await noted(served, chat, "requests", rid)
        assert (at, on_expiry) == (int(clock.now * 1000) + 60_000, policy)  # the agent's default

        clock.now += 60
        assert await served.sweep() == 1
        done = await until(mirror, ended)
        turn = await served.turn(chat)

    assert done.turns[-1].state == "complete"
    assert turn.status == TurnStatus.COMPLETED
    assert model.tool_results()["c1"] == {"status": status, "formKey": "system"}
    assert turn.audit[-1].metadata["via"] == "expiry"


async def test_a_forms_own_expiry_overrides_the_agents_and_fail_fails_the_turn() -> None:
    clock = WallClock()
    urgent = FormDefinition(
        key=SYSTEM.key,
        description=SYSTEM.description,
        schema=SYSTEM.schema,
        expiry=Expiry(5, "fail"),
    )
    model = scripted(use(call("c1", REQUEST_USER_INPUT, formKey="system")), say("Done."))
    helper = Agent(
        name="helper",
        instructions="Help.",
        model=model,
        forms=(urgent,),
        input_expiry=Expiry(3600, "cancel"),
    )
    async with serving(helper, clock) as served:
        _, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = await asked_form(served, chat)
        assert (await noted(served, chat, "requests", rid))[1] == "fail"

        clock.now += 5
        assert await served.sweep() == 1
        done = await until(mirror, ended)
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert done.turns[-1].error is not None
    assert done.turns[-1].error.error_type == "expired"
    assert turn.status == TurnStatus.FAILED
    assert turn.error == f"Nobody answered the input request {rid!r} in time."
    assert turn.suspension is None
    assert len(model.conversations) == 1  # nothing ran after the wait


async def test_a_late_answer_to_an_expired_form_is_refused_as_expired() -> None:
    clock = WallClock()
    helper, _ = asking(input_expiry=Expiry(30))
    async with serving(helper, clock) as served:
        alice, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = await asked_form(served, chat)
        clock.now += 30
        draft = ChatInputAnswerChanged(
            request_id=rid,
            question_id="system",
            answer=InputAnswer(state="draft", value=TextValue(value="SSO")),
        )
        with pytest.raises(ActionRejected) as refused:
            await alice.dispatch_and_wait(chat, draft)
        await served.sweep()
        done = await until(mirror, ended)

    assert refused.value.code == "expired"
    assert done.turns[-1].state == "complete"


async def rewind_and_ask_again(alice: HuddleClient, chat: str) -> str:
    """Alice truncates the chat (its turn over) and starts turn ``t1``
    again; returns the request id the agent asks with again."""
    await alice.dispatch_and_wait(chat, ChatTruncated())
    again = ChatTurnStarted(
        turn_id="t1", started_at="2027-01-10T11:00:00.000Z", message=user_message("Again")
    )
    await alice.dispatch_and_wait(chat, again)
    return (await next_request(alice.mirrors[chat])).request.id


async def test_a_wait_truncated_away_never_expires_the_turn_that_uses_its_id_again() -> None:
    # A request id derives from the turn id, which a client may use again
    # once a truncation took the turn away: its expiry goes with it.
    clock = WallClock()
    helper, model = asking()
    async with serving(helper, clock) as served:
        alice, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = (await next_request(mirror)).request.id
        await served.huddle.server.parts.host.expiries.expire(chat, "requests", rid, Expiry(60))
        await noted(served, chat, "requests", rid)
        await alice.dispatch_and_wait(chat, ChatTurnCancelled(turn_id="t1", duration=1))
        await served.ends.of(runner_turn_id(chat, "t1"))

        assert await rewind_and_ask_again(alice, chat) == rid
        clock.now += 60
        swept = await served.sweep()
        room = Room(alice, chat, mirror)
        await reply(room, rid, "accept", submitted(system=TextValue(value="SSO")))
        done = await until(mirror, ended)

    assert swept == 0
    assert done.turns[-1].state == "complete"
    assert model.tool_results()["c1"]["data"] == {"system": "SSO"}


async def test_a_wait_that_expired_and_was_truncated_away_leaves_its_id_answerable() -> None:
    clock = WallClock()
    helper, model = asking(input_expiry=Expiry(30))
    async with serving(helper, clock) as served:
        alice, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = await asked_form(served, chat)
        clock.now += 30
        assert await served.sweep() == 1
        await until(mirror, ended)

        assert await rewind_and_ask_again(alice, chat) == rid
        await noted(served, chat, "requests", rid)  # answered before, it has none
        room = Room(alice, chat, mirror)
        await reply(room, rid, "accept", submitted(system=TextValue(value="SSO")))
        done = await until(mirror, lambda s: ended(s) and s.turns[-1].id == "t1")
        session = (await served.huddle.server.parts.host.view("ahp-session:/faults")).state

    assert done.turns[-1].state == "complete"
    assert model.tool_results()["c1"]["data"] == {"system": "SSO"}
    assert isinstance(session, SessionState)
    note = notes.note_of(session.meta, "requests", chat, rid)
    assert note is not None
    assert "expired" not in note


async def test_a_question_answered_in_time_is_not_expired() -> None:
    clock = WallClock()
    helper, model = asking(input_expiry=Expiry(30, "fail"))
    async with serving(helper, clock) as served:
        alice, chat, mirror = await open_chat(served.huddle, "Fix it")
        rid = await asked_form(served, chat)
        room = Room(alice, chat, mirror)
        await reply(room, rid, "accept", submitted(system=TextValue(value="SSO")))
        done = await until(mirror, ended)
        clock.now += 31
        swept = await served.sweep()

    assert swept == 0
    assert done.turns[-1].state == "complete"
    assert model.tool_results()["c1"]["data"] == {"system": "SSO"}


# ─── Tool approvals ──────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("policy", "status", "reason"),
    [("cancel", "skipped", "skipped"), ("decline", "rejected", "denied")],
)
async def test_an_approval_nobody_gives_skips_or_denies_the_call_and_says_it_expired(
    policy: str, status: str, reason: str
) -> None:
    clock = WallClock()
    runs = Runs()
    helper, model = approving(
        runs,
        lambda: ApprovalDecision.require_approval(code="RISKY"),
        approval_expiry=Expiry(10, policy),  # type: ignore[arg-type]
    )
    async with serving(helper, clock) as served:
        _, chat, mirror = await open_chat(served.huddle, "Deploy")
        call_id = await asked_approval(served, chat)
        assert (await noted(served, chat, "toolCalls", call_id))[1] == policy

        clock.now += 10
        assert await served.sweep() == 1
        done = await until(mirror, ended)

    shown = select_latest_tool_call(done, "t1", call_id)
    assert isinstance(shown, ToolCallCancelled)
    assert shown.reason == reason
    assert runs.count("deploy") == 0
    assert done.turns[-1].state == "complete"
    result = model.tool_results()["c1"]
    assert result == {
        "status": status,
        "reason": "nobody approved it in time: its approval expired",
    }


async def test_a_decisions_own_expiry_overrides_the_agents_and_fail_fails_the_turn() -> None:
    clock = WallClock()
    runs = Runs()
    helper, _ = approving(
        runs,
        lambda: ApprovalDecision.require_approval(expiry=Expiry(5, "fail")),
        approval_expiry=Expiry(3600),
    )
    async with serving(helper, clock) as served:
        _, chat, mirror = await open_chat(served.huddle, "Deploy")
        call_id = await asked_approval(served, chat)
        at, policy = await noted(served, chat, "toolCalls", call_id)
        assert (at, policy) == (int(clock.now * 1000) + 5_000, "fail")

        clock.now += 5
        await served.sweep()
        await until(mirror, ended)
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert turn.status == TurnStatus.FAILED
    assert turn.error == f"Nobody answered the tool call {call_id!r} in time."
    assert runs.count("deploy") == 0


async def test_an_approval_asked_again_after_its_worker_died_keeps_the_time_it_had_left() -> None:
    clock = WallClock()
    runs = Runs()
    helper, _ = approving(
        runs, lambda: ApprovalDecision.require_approval(expiry=Expiry(600, "decline"))
    )
    huddle = await start_server(UNSWEPT, agent=helper, clock=clock, workers=0)
    try:
        opened = clock.now
        service, _, chat, _, _ = await saved_not_shown(huddle, helper, clock)
        clock.now += 400
        service.bridge.sweep.ask_again_after = 0.0
        await service.bridge.reconcile()
        served = Served(huddle, Ends())
        at, policy = await noted(served, chat, "toolCalls", "c1")
    finally:
        await huddle.stop()
    assert policy == "decline"
    assert abs(at - (opened + 600) * 1000) <= 1  # not 400 s later: ms rounding only


CLAIM = {"huddle": {"expired": {"family": "toolCalls", "id": "c1"}}}


@pytest.mark.parametrize(
    ("meta", "over_http"),
    [(None, False), (CLAIM, False), (None, True), (CLAIM, True)],
    ids=["plain", "claiming-to-be-the-expiry", "over-http", "over-http-claiming-to-be-the-expiry"],
)
async def test_an_approval_given_in_time_runs_the_call(
    meta: dict[str, Any] | None, over_http: bool
) -> None:
    # A person's approval is theirs whatever its _meta says, and over HTTP
    # (where an action has no origin) too: only the server's own
    # confirmation is the expiry's.
    clock = WallClock()
    runs = Runs()
    helper, _ = approving(
        runs, lambda: ApprovalDecision.require_approval(), approval_expiry=Expiry(9)
    )
    async with serving(helper, clock) as served:
        alice, chat, mirror = await open_chat(served.huddle, "Deploy")
        call_id = await asked_approval(served, chat)
        approve = ChatToolCallConfirmed(
            turn_id="t1", tool_call_id=call_id, approved=True, confirmed="user-action", meta=meta
        )
        if over_http:
            body = {"channel": chat, "action": msgspec.to_builtins(approve)}
            token = served.huddle.token(name="lee")
            reply = await http("POST", f"{served.huddle.http}/api/dispatch", body=body, token=token)
            assert reply.status == 200
        else:
            await alice.dispatch_and_wait(chat, approve)
        done = await until(mirror, ended)
        clock.now += 10

        assert await served.sweep() == 0
        turn = await served.turn(chat)
    assert done.turns[-1].state == "complete"
    assert runs.count("deploy") == 1
    approver = turn.audit[-1].metadata
    assert (approver["by"], approver["via"]) == ("lee" if over_http else "alice", "chat")


# ─── Restarts and processes ──────────────────────────────────────────────────


@pytest.mark.redis
async def test_a_wait_expires_after_a_restart_and_a_new_process_resumes_the_turn(
    redis_server: RedisServer,
) -> None:
    clock = WallClock()
    helper, model = asking(input_expiry=Expiry(60, "decline"))
    async with serving(helper, clock, RedisStore(redis_server.url), redis_server) as first:
        _, chat, _ = await open_chat(first.huddle, "Fix it")
        await asked_form(first, chat)
        assert (await first.turn(chat)).status == TurnStatus.WAITING_FOR_USER
    clock.now += 120
    async with serving(helper, clock, RedisStore(redis_server.url), redis_server) as second:
        mirror = await (await second.huddle.client(name="alice")).subscribe(chat)
        assert await second.sweep() == 1
        state = await until(mirror, ended)
        turn = await second.turn(chat)

    assert turn.status == TurnStatus.COMPLETED
    assert model.tool_results()["c1"] == {"status": "declined", "formKey": "system"}
    assert state.turns[-1].state == "complete"


@pytest.mark.redis
async def test_two_processes_on_one_redis_expire_a_wait_once(redis_server: RedisServer) -> None:
    clock = WallClock()
    runs = Runs()
    helper, _ = approving(
        runs, lambda: ApprovalDecision.require_approval(), approval_expiry=Expiry(10, "decline")
    )
    async with (
        serving(helper, clock, RedisStore(redis_server.url), redis_server) as a,
        serving(helper, clock, RedisStore(redis_server.url), redis_server) as b,
    ):
        _, chat, mirror = await open_chat(a.huddle, "Deploy")
        await asked_approval(a, chat)
        await b.huddle.server.parts.host.view(chat)
        clock.now += 10

        fired = await asyncio.gather(a.sweep(), b.sweep())
        done = await until(mirror, ended)
        turn = await a.turn(chat)

    assert sorted(fired) == [0, 1]
    assert done.turns[-1].state == "complete"
    assert turn.status == TurnStatus.COMPLETED
    assert [entry.metadata["via"] for entry in turn.audit] == ["expiry"]
    assert runs.count("deploy") == 0


# ─── An MCP server's question ────────────────────────────────────────────────


def filling(tools: tuple[Tool, ...], **options: Any) -> tuple[Agent, Model]:
    """An agent that calls the MCP kit's ``fill`` tool and says what it got."""
    model = scripted(use(call("c1", "fill", form_name="contact")), say("Done."))
    return Agent(name="helper", instructions="Help.", model=model, tools=tools, **options), model


@pytest.mark.parametrize("mode", MODES)
async def test_an_mcp_elicitation_nobody_answers_gets_cancel(mode: str) -> None:
    clock = WallClock()
    config = McpServerConfig.in_process("kit", build_server("kit"), mode=mode)
    async with McpToolSource(config) as source:
        helper, model = filling(await source.list_tools(), input_expiry=Expiry(30))
        async with serving(helper, clock) as served:
            _, chat, mirror = await open_chat(served.huddle, "Fill it")
            await asked_form(served, chat)
            clock.now += 30
            assert await served.sweep() == 1
            done = await until(mirror, ended)

    assert done.turns[-1].state == "complete"
    told = json.loads(model.tool_results()["c1"]["result"])
    assert told == {"action": "cancel", "content": None}  # what the MCP server received


async def test_an_mcp_elicitation_that_expires_with_fail_fails_the_call_and_the_turn() -> None:
    clock = WallClock()
    config = McpServerConfig.in_process(
        "kit", build_server("kit"), mode=LEGACY, expiry=Expiry(30, "fail")
    )
    async with McpToolSource(config) as source:
        helper, model = filling(await source.list_tools(), input_expiry=Expiry(3600))
        async with serving(helper, clock) as served:
            _, chat, mirror = await open_chat(served.huddle, "Fill it")
            rid = await asked_form(served, chat)
            assert (await noted(served, chat, "requests", rid))[1] == "fail"  # the server's own
            clock.now += 30
            await served.sweep()
            done = await until(mirror, ended)
            await served.ends.of(runner_turn_id(chat, "t1"))
            turn = await served.turn(chat)

    assert done.turns[-1].error is not None
    assert turn.status == TurnStatus.FAILED
    assert turn.error == f"Nobody answered the input request {rid!r} in time."
    assert len(model.conversations) == 1
    assert input_parts(done)[-1].request.id == rid


# ─── The runner on its own, and reconciling ──────────────────────────────────


async def test_a_plain_question_gets_the_agents_default_and_a_fail_resume_ends_the_turn() -> None:
    helper, model = asking(input_expiry=Expiry(45, "decline"))
    runner = Runner(MemoryTurnStore(), [helper])
    turn = started(await runner.store.create(runner.new_turn(helper, "Fix it")))
    asked = await runner.suspend(turn, Suspension.user_input("Which one?"))
    own = await runner.suspend(
        await runner.store.create(runner.new_turn(helper, "Again", turn_id="t2")),
        Suspension.user_input("Which?", expiry=Expiry(5, "fail")),
    )
    assert asked.suspension is not None
    assert asked.suspension.expiry == Expiry(45, "decline")
    assert own.suspension is not None
    assert own.suspension.expiry == Expiry(5, "fail")

    command = ResumeCommand.fail(
        SuspensionType.USER_INPUT, asked.suspension.correlation_id, "nobody answered"
    )
    failed = await runner.resume(asked.id, command)
    with pytest.raises(ResumeRejected):
        await runner.resume(asked.id, command)  # once

    assert failed.status == TurnStatus.FAILED
    assert failed.error == "nobody answered"
    assert failed.suspension is None
    assert model.conversations == []  # nothing ran


async def test_a_turn_whose_chat_turn_failed_meanwhile_is_failed_by_reconcile() -> None:
    clock = WallClock()
    helper, _ = asking()
    async with serving(helper, clock) as served:
        _, chat, mirror = await open_chat(served.huddle, "Fix it")
        await next_request(mirror)
        # The server ends the chat turn, and the bridge does not hear of it
        # (no expiry's note: as if the process died before it acted).
        error = ChatError(
            turn_id="t1", duration=0, error=ErrorInfo(error_type="x", message="it broke")
        )
        await served.huddle.server.parts.host.dispatch(chat, error)
        assert (await served.turn(chat)).status == TurnStatus.WAITING_FOR_USER
        service = served.huddle.server.parts.service
        assert service is not None

        assert await service.bridge.reconcile() == 1
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert turn.status == TurnStatus.FAILED
    assert turn.error == "it broke"
    assert turn.audit[-1].metadata["via"] == "reconcile"


async def test_an_agent_ending_the_chat_turn_with_an_error_fails_the_waiting_turn() -> None:
    helper, _ = asking()
    async with serving(helper, WallClock()) as served:
        _, chat, mirror = await open_chat(served.huddle, "Fix it")
        await next_request(mirror)
        other = await served.huddle.client("agent")
        error = ChatError(
            turn_id="t1", duration=0, error=ErrorInfo(error_type="x", message="stopped by ops")
        )
        await other.dispatch_and_wait(chat, error)
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert turn.status == TurnStatus.FAILED
    assert turn.error == "stopped by ops"
    assert turn.audit[-1].metadata["role"] == "agent"


class CancelSeen(MemoryTurnStore):
    """Tells when a cancel of any turn was requested."""

    def __init__(self) -> None:
        super().__init__()
        self.requested = asyncio.Event()

    async def request_cancel(self, turn_id: str) -> None:
        await super().request_cancel(turn_id)
        self.requested.set()


@dataclass
class Working:
    helper: Agent
    model: Model
    started: asyncio.Event
    seen: list[bool]
    """Whether ``deploy`` saw the cancel, once it was requested."""
    go_on: asyncio.Event
    """With ``progress``: set it for ``deploy`` to report its progress."""


def working(store: CancelSeen, *, progress: bool = False) -> Working:
    """An agent whose ``deploy`` starts (and, with ``progress``, reports
    progress once ``go_on`` is set), waits for a cancel to be requested,
    then says whether it sees it; then the model would say "Done."."""
    seen: list[bool] = []
    started, go_on = asyncio.Event(), asyncio.Event()

    async def deploy(arguments: dict[str, Any]) -> str:
        context = ToolContext.current()
        started.set()
        async with asyncio.timeout(WITHIN):
            if progress:
                await go_on.wait()
                context.emit_progress("halfway")
            await store.requested.wait()
        seen.append(context.cancellation_requested)
        return "stopped" if seen[-1] else "deployed"

    model = scripted(use(call("c1", "deploy")), say("Done."))
    tools = (Tool(name="deploy", description="Deploy", function=deploy),)
    helper = Agent(name="helper", instructions="Help.", model=model, tools=tools)
    return Working(helper, model, started, seen, go_on)


def agent_ends(how: str) -> ChatError | ChatTurnComplete:
    if how == "error":
        error = ErrorInfo(error_type="x", message="stopped by ops")
        return ChatError(turn_id="t1", duration=0, error=error)
    return ChatTurnComplete(turn_id="t1", duration=0)


@pytest.mark.parametrize("how", ["error", "complete"])
async def test_an_agent_ending_the_chat_turn_while_a_tool_runs_cancels_the_turn(how: str) -> None:
    # The chat says the turn is over: the runner's turn must not go on
    # (its tools and the model's next reply would show nowhere).
    store = CancelSeen()
    work = working(store)
    async with serving(work.helper, WallClock(), turns=store) as served:
        _, chat, _ = await open_chat(served.huddle, "Deploy")
        async with asyncio.timeout(WITHIN):
            await work.started.wait()
        other = await served.huddle.client("agent")
        await other.dispatch_and_wait(chat, agent_ends(how))
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert work.seen == [True]
    assert turn.status == TurnStatus.CANCELLED
    assert work.model.calls == 1  # not asked again after the tool


async def test_a_turn_whose_chat_turn_ended_unheard_is_cancelled_when_it_next_shows_something() -> (
    None
):
    # The server's own chat/error is no agent's: the bridge does not act on
    # it, as when the process that accepted an agent's died before it did.
    # The tool's progress then finds its chat turn over.
    store = CancelSeen()
    work = working(store, progress=True)
    async with serving(work.helper, WallClock(), turns=store) as served:
        _, chat, _ = await open_chat(served.huddle, "Deploy")
        async with asyncio.timeout(WITHIN):
            await work.started.wait()
        await served.huddle.server.parts.host.dispatch(chat, agent_ends("error"))
        work.go_on.set()  # the progress comes after the chat turn ended
        await served.ends.of(runner_turn_id(chat, "t1"))
        turn = await served.turn(chat)

    assert work.seen == [True]
    assert turn.status == TurnStatus.CANCELLED
    assert work.model.calls == 1
