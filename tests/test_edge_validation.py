"""Every validation rule of DESIGN.md, over the wire.

A rejected action is echoed only to its sender, with a ``rejectionReason``
that starts with the rule's code and the channel's current ``serverSeq``; it
consumes no seq, reaches no other subscriber and changes no state. For every
rule a well-formed action that keeps it is accepted.

The scene is one session working in ``file:///srv/outage`` with its default
chat, either idle or busy: in the busy chat turn ``t1`` is active with an
open input request ``form``, a completed one ``done``, one made from a JSON
Schema form ``profile``, tool calls ``edit`` (editable, with options),
``fixed`` (not editable) and ``ran`` (waiting for its result to be
confirmed), and a queued message ``q1``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageRemoved,
    ChatPendingMessageSet,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallResultConfirmed,
    ChatToolCallStart,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    ChatWorkingDirectorySet,
    SessionDefaultChatChanged,
    SessionServerToolsChanged,
    SessionTitleChanged,
    SessionWorkingDirectorySet,
    StateAction,
    action_type,
    is_client_dispatchable,
)
from protocol.chat import (
    BooleanQuestion,
    BooleanValue,
    ChatState,
    ConfirmationOption,
    InputAnswer,
    InputAnswerValue,
    InputOption,
    InputRequest,
    InputRequestPart,
    IntegerQuestion,
    MultiSelectQuestion,
    NumberQuestion,
    NumberValue,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
    ToolCallResult,
)
from protocol.messages import ChannelState
from protocol.session import SessionState, ToolDefinition
from protocol.uris import ROOT_URI
from reducers.validation import VALIDATION_CODES
from server.auth import Role
from server.client import HuddleClient
from tests.conftest import UNIT, RunningServer, user_message
from tests.edge import Frame, Peer

Setup = Literal["idle", "busy"]
Channel = Literal["chat", "session"]

SESSION = "ahp-session:/edge-validation"
WORKDIR = "file:///srv/outage"
"""The session's working directory."""
STARTED_AT = "2026-11-30T10:00:00.000Z"


def options(*ids: str) -> list[InputOption]:
    return [InputOption(id=i, label=i.upper()) for i in ids]


FORM = InputRequest(
    id="form",
    message="Tell us about the outage",
    questions=[
        TextQuestion(id="system", message="Which system?", required=True, max=20),
        TextQuestion(id="contact", message="Who can we reach?", format="email"),
        NumberQuestion(id="share", message="Share of users affected?", min=0, max=1),
        IntegerQuestion(id="users", message="Users affected?", min=1),
        SingleSelectQuestion(id="severity", message="Severity?", options=options("low", "high")),
        MultiSelectQuestion(
            id="regions", message="Regions?", options=options("eu", "us", "ap"), max=2
        ),
        BooleanQuestion(id="ongoing", message="Still going on?"),
    ],
)
DONE = InputRequest(id="done", message="Is this urgent?", questions=[])
PROFILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"team": {"type": "string", "title": "Team code", "pattern": "^[A-Z]{3}$"}},
    "required": ["team"],
}
WRITE_FILE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"path": {"type": "string"}},
    "required": ["path"],
}


def draft(value: InputAnswerValue | None) -> InputAnswer:
    return InputAnswer(state="draft", value=value)


def submitted(value: InputAnswerValue) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


def text(value: str) -> TextValue:
    return TextValue(value=value)


def answer(question_id: str, given: InputAnswer, request_id: str = "form") -> StateAction:
    return ChatInputAnswerChanged(request_id=request_id, question_id=question_id, answer=given)


def accept(answers: dict[str, InputAnswer], request_id: str = "form") -> StateAction:
    return ChatInputCompleted(request_id=request_id, response="accept", answers=answers)


def approve(tool_call_id: str, **fields: Any) -> StateAction:
    return ChatToolCallConfirmed(
        turn_id="t1", tool_call_id=tool_call_id, approved=True, confirmed="user-action", **fields
    )


def ready_fixed(*option_ids: str) -> StateAction:
    """The prompt of tool call ``fixed`` again, offering options of these ids."""
    offered = [ConfirmationOption(id=i, label=f"Option {i}", kind="approve") for i in option_ids]
    return ChatToolCallReady(
        turn_id="t1",
        tool_call_id="fixed",
        invocation_message="Delete b.txt",
        tool_input='{"path": "b.txt"}',
        options=offered,
    )


def turn_started(turn_id: str) -> StateAction:
    return ChatTurnStarted(
        turn_id=turn_id, started_at=STARTED_AT, message=user_message("The login page is down")
    )


VALID_FORM = {
    "system": submitted(text("SSO")),
    "contact": submitted(text("ops@example.com")),
    "share": submitted(NumberValue(value=0.25)),
    "users": submitted(NumberValue(value=3.0)),
    "severity": submitted(SelectedValue(value="high")),
    "regions": submitted(SelectedManyValue(value=["eu", "us"])),
}

# ─── The scene ───────────────────────────────────────────────────────────────


@dataclass
class Scene:
    running: RunningServer
    chat: str
    agent: HuddleClient
    watcher: HuddleClient

    def uri(self, channel: Channel) -> str:
        return SESSION if channel == "session" else self.chat

    def mirror_states(self) -> list[tuple[str, int, ChannelState]]:
        """What every mirror of every client holds now."""
        return [
            (mirror.uri, mirror.seq, mirror.state)
            for client in (self.agent, self.watcher)
            for mirror in client.mirrors.values()
        ]

    async def settle_mirrors(self) -> None:
        """A ping round trip per client: every frame the server queued for
        it before the pong has been applied once this returns."""
        for client in (self.agent, self.watcher):
            await client.call("ping", {"channel": ROOT_URI})

    async def peer(self, name: str, action: StateAction, channel: Channel) -> Peer:
        """A raw peer subscribed to ``channel``, in the least role that may
        dispatch ``action`` (participant, or agent for server-only ones)."""
        role: Role = "participant" if is_client_dispatchable(action) else "agent"
        peer = await Peer.ready(self.running.ws, self.running.token(role, name=name), name)
        await peer.subscribe(self.uri(channel))
        return peer


@pytest.fixture
async def background() -> AsyncIterator[list[asyncio.Task[Any]]]:
    """Tasks a test leaves waiting (the agent's form request); cancelled at
    the end, before the server stops."""
    tasks: list[asyncio.Task[Any]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task


def has_request(request_id: str) -> Any:
    def holds(state: ChannelState) -> bool:
        assert isinstance(state, ChatState)
        parts = state.active_turn.response_parts if state.active_turn else []
        return any(type(p) is InputRequestPart and p.request.id == request_id for p in parts)

    return holds


async def make_busy(
    running: RunningServer, agent: HuddleClient, chat: str, background: list[asyncio.Task[Any]]
) -> None:
    options_offered = [
        ConfirmationOption(id="allow", label="Allow", kind="approve"),
        ConfirmationOption(id="deny", label="Deny", kind="deny"),
    ]
    steps: list[StateAction] = [
        turn_started("t1"),
        ChatInputRequested(request=FORM),
        ChatInputRequested(request=DONE),
        ChatInputCompleted(request_id="done", response="cancel"),
        ChatToolCallStart(
            turn_id="t1", tool_call_id="edit", tool_name="write_file", display_name="Write"
        ),
        ChatToolCallReady(
            turn_id="t1",
            tool_call_id="edit",
            invocation_message="Write a.txt",
            tool_input='{"path": "a.txt"}',
            editable=True,
            options=options_offered,
        ),
        ChatToolCallStart(
            turn_id="t1", tool_call_id="fixed", tool_name="delete_file", display_name="Delete"
        ),
        ChatToolCallReady(
            turn_id="t1",
            tool_call_id="fixed",
            invocation_message="Delete b.txt",
            tool_input='{"path": "b.txt"}',
        ),
        ChatToolCallStart(
            turn_id="t1", tool_call_id="ran", tool_name="read_file", display_name="Read"
        ),
        ChatToolCallReady(
            turn_id="t1", tool_call_id="ran", invocation_message="Read c.txt", confirmed="setting"
        ),
        ChatToolCallComplete(
            turn_id="t1",
            tool_call_id="ran",
            result=ToolCallResult(success=True, past_tense_message="Read c.txt"),
            requires_result_confirmation=True,
        ),
        ChatPendingMessageSet(kind="queued", id="q1", message=user_message("The API too")),
    ]
    for step in steps:
        await agent.dispatch_and_wait(chat, step)
    profile = InputRequest(id="profile", message="Which team owns it?")
    host = running.server.host
    background.append(asyncio.create_task(host.request_input(chat, profile, schema=PROFILE_SCHEMA)))
    await agent.mirrors[chat].wait_for(has_request("profile"))


async def make_scene(
    running: RunningServer, setup: Setup, background: list[asyncio.Task[Any]]
) -> Scene:
    # Session summaries then follow every chat action at once, not on a
    # timer, so that no mirror changes behind the test's back.
    running.server.host.aggregate.modified_at_interval = 0.0
    async with asyncio.timeout(5 * UNIT):
        agent = await running.client("agent", name="agent")
        await agent.create_session(SESSION, title="Outage")
        session = await agent.subscribe(SESSION)
        await agent.dispatch_and_wait(SESSION, SessionWorkingDirectorySet(directory=WORKDIR))
        assert isinstance(session.state, SessionState)
        chat = session.state.default_chat
        assert chat is not None
        await agent.subscribe(chat)
        await agent.dispatch_and_wait(chat, turn_started("t0"))  # an earlier, completed turn
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t0", duration=1))
        if setup == "busy":
            await make_busy(running, agent, chat, background)
        watcher = await running.client(name="watcher")
        await watcher.subscribe(SESSION)
        await watcher.subscribe(chat)
    return Scene(running, chat, agent, watcher)


# ─── The rules ───────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Case:
    setup: Setup
    channel: Channel
    action: StateAction


def case(setup: Setup, action: StateAction, code: str, name: str) -> Any:
    channel: Channel = "session" if action_type(action).startswith("session/") else "chat"
    return pytest.param(Case(setup, channel, action), code, id=name)


BROKEN_RULES = [
    case("busy", turn_started("t2"), "turn-in-progress", "turn-started-while-a-turn-is-active"),
    case("idle", turn_started("t0"), "turn-id-reused", "turn-started-with-an-earlier-turns-id"),
    case(
        "idle",
        ChatTurnCancelled(turn_id="t1", duration=1),
        "no-active-turn",
        "turn-cancelled-with-no-active-turn",
    ),
    case(
        "busy",
        ChatTurnCancelled(turn_id="t0", duration=1),
        "no-active-turn",
        "turn-cancelled-for-another-turn",
    ),
    case(
        "busy",
        approve("ran"),
        "tool-call-not-pending",
        "tool-call-confirmed-when-not-pending-confirmation",
    ),
    case(
        "busy",
        approve("nope"),
        "tool-call-not-pending",
        "tool-call-confirmed-for-an-unknown-call",
    ),
    case(
        "busy",
        ChatToolCallResultConfirmed(turn_id="t1", tool_call_id="edit", approved=True),
        "tool-call-not-pending",
        "tool-result-confirmed-when-not-pending-result-confirmation",
    ),
    case(
        "busy",
        approve("edit", selected_option_id="maybe"),
        "unknown-option",
        "tool-call-confirmed-with-an-unknown-option",
    ),
    case(
        "busy",
        ready_fixed("allow", "allow"),
        "invalid-options",
        "tool-call-ready-offering-an-option-id-twice",
    ),
    case(
        "busy",
        ready_fixed("allow", ""),
        "invalid-options",
        "tool-call-ready-offering-an-option-with-an-empty-id",
    ),
    case(
        "busy",
        approve("fixed", edited_tool_input='{"path": "c.txt"}'),
        "not-editable",
        "tool-input-edited-on-a-call-that-is-not-editable",
    ),
    case(
        "busy",
        approve("edit", edited_tool_input='{"path": '),
        "invalid-tool-input",
        "tool-input-edited-to-invalid-json",
    ),
    case(
        "busy",
        approve("edit", edited_tool_input='["a.txt"]'),
        "invalid-tool-input",
        "tool-input-edited-to-something-not-an-object",
    ),
    case(
        "busy",
        answer("system", draft(text("SSO")), request_id="nope"),
        "no-open-input-request",
        "answer-to-an-unknown-request",
    ),
    case(
        "busy",
        answer("anything", draft(text("late")), request_id="done"),
        "no-open-input-request",
        "answer-to-a-completed-request",
    ),
    case(
        "idle",
        ChatInputCompleted(request_id="form", response="cancel"),
        "no-open-input-request",
        "completion-with-no-active-turn",
    ),
    case(
        "busy",
        ChatInputCompleted(request_id="done", response="accept"),
        "no-open-input-request",
        "second-completion-of-a-request",
    ),
    case(
        "busy",
        answer("shoe-size", draft(text("42"))),
        "unknown-question",
        "answer-to-an-unknown-question",
    ),
    case(
        "busy",
        accept({**VALID_FORM, "shoe-size": submitted(text("42"))}),
        "unknown-question",
        "completion-answering-an-unknown-question",
    ),
    case(
        "busy",
        answer("system", draft(None)),
        "answer-missing-value",
        "draft-without-a-value",
    ),
    case(
        "busy",
        answer("system", InputAnswer(state="submitted")),
        "answer-missing-value",
        "submitted-answer-without-a-value",
    ),
    case(
        "busy",
        answer("system", draft(NumberValue(value=1))),
        "answer-kind-mismatch",
        "number-for-a-text-question",
    ),
    case(
        "busy",
        answer("ongoing", draft(text("yes"))),
        "answer-kind-mismatch",
        "text-for-a-boolean-question",
    ),
    case(
        "busy",
        answer("regions", draft(SelectedValue(value="eu"))),
        "answer-kind-mismatch",
        "single-selection-for-a-multi-select-question",
    ),
    case(
        "busy",
        answer("system", submitted(text("x" * 21))),
        "invalid-answer",
        "text-longer-than-its-max",
    ),
    case(
        "busy",
        answer("contact", submitted(text("ops at example"))),
        "invalid-answer",
        "text-not-of-its-format",
    ),
    case(
        "busy",
        answer("share", submitted(NumberValue(value=1.5))),
        "invalid-answer",
        "number-above-its-max",
    ),
    case(
        "busy",
        answer("users", submitted(NumberValue(value=2.5))),
        "invalid-answer",
        "integer-without-an-integral-value",
    ),
    case(
        "busy",
        answer("severity", submitted(SelectedValue(value="critical"))),
        "invalid-answer",
        "option-not-offered",
    ),
    case(
        "busy",
        answer("regions", submitted(SelectedManyValue(value=["eu", "us", "ap"]))),
        "invalid-answer",
        "more-items-than-its-max",
    ),
    case(
        "busy",
        accept({**VALID_FORM, "users": submitted(NumberValue(value=0))}),
        "invalid-answer",
        "completion-carrying-a-broken-answer",
    ),
    case(
        "busy",
        accept({}),
        "required-unanswered",
        "accept-without-the-required-answer",
    ),
    case(
        "busy",
        accept({"system": draft(text("SSO"))}),
        "required-unanswered",
        "accept-with-only-a-draft-of-the-required-answer",
    ),
    case(
        "busy",
        accept({"team": submitted(text("ops"))}, request_id="profile"),
        "form-invalid",
        "accept-that-fails-the-frozen-schema",
    ),
    case(
        "busy",
        ChatPendingMessageRemoved(kind="queued", id="q9"),
        "no-pending-message",
        "pending-message-removed-that-is-not-there",
    ),
    case(
        "busy",
        ChatPendingMessageRemoved(kind="steering", id="q1"),
        "no-pending-message",
        "pending-message-removed-of-the-wrong-kind",
    ),
    case(
        "idle",
        SessionDefaultChatChanged(default_chat="ahp-chat:/elsewhere"),
        "unknown-chat",
        "default-chat-not-in-the-catalog",
    ),
    case(
        "idle",
        ChatWorkingDirectorySet(directory="file:///etc"),
        "unknown-directory",
        "working-directory-the-session-does-not-have",
    ),
]

KEPT_RULES = [
    case("idle", turn_started("t1"), "turn-in-progress", "turn-started-when-idle"),
    case("idle", turn_started("t2"), "turn-id-reused", "turn-started-with-a-new-id"),
    case(
        "busy",
        ChatTurnCancelled(turn_id="t1", duration=1),
        "no-active-turn",
        "active-turn-cancelled",
    ),
    case("busy", approve("fixed"), "tool-call-not-pending", "pending-tool-call-confirmed"),
    case(
        "busy",
        ChatToolCallResultConfirmed(turn_id="t1", tool_call_id="ran", approved=True),
        "tool-call-not-pending",
        "pending-tool-result-confirmed",
    ),
    case(
        "busy",
        approve("edit", selected_option_id="allow"),
        "unknown-option",
        "tool-call-confirmed-with-an-offered-option",
    ),
    case(
        "busy",
        ready_fixed("allow", "deny"),
        "invalid-options",
        "tool-call-ready-offering-distinct-option-ids",
    ),
    case(
        "busy",
        approve("edit", edited_tool_input='{"path": "c.txt"}'),
        "not-editable",
        "editable-tool-input-edited",
    ),
    case(
        "busy",
        approve("edit", edited_tool_input='{"path": "d.txt", "append": true}'),
        "invalid-tool-input",
        "tool-input-edited-to-a-json-object",
    ),
    case(
        "busy",
        answer("ongoing", draft(BooleanValue(value=True))),
        "unknown-question",
        "answer-to-a-known-question",
    ),
    case(
        "busy",
        answer("system", draft(text("SS"))),
        "answer-kind-mismatch",
        "half-typed-draft-of-the-right-kind",
    ),
    case(
        "busy",
        answer("system", InputAnswer(state="skipped")),
        "answer-missing-value",
        "skipped-answer-without-a-value",
    ),
    case(
        "busy",
        answer("regions", submitted(SelectedManyValue(value=["eu", "ap"]))),
        "invalid-answer",
        "submitted-answer-that-fits-its-question",
    ),
    case("busy", accept(VALID_FORM), "required-unanswered", "accept-with-every-answer-valid"),
    case(
        "busy",
        accept({"team": submitted(text("OPS"))}, request_id="profile"),
        "form-invalid",
        "accept-that-fits-the-frozen-schema",
    ),
    case(
        "busy",
        ChatInputCompleted(request_id="form", response="decline"),
        "no-open-input-request",
        "first-completion-of-a-request",
    ),
    case(
        "busy",
        ChatPendingMessageRemoved(kind="queued", id="q1"),
        "no-pending-message",
        "queued-message-removed",
    ),
    case(
        "idle",
        ChatWorkingDirectorySet(directory=WORKDIR),
        "unknown-directory",
        "working-directory-of-the-session",
    ),
]

ACCEPTED_AFTERWARDS: dict[Channel, StateAction] = {
    "chat": ChatDraftChanged(draft=user_message("Also the")),
    "session": SessionTitleChanged(title="Outage, still"),
}
"""An action with no rule, to show what the other subscriber gets next."""


def test_the_tables_cover_every_rejection_code() -> None:
    # answered-question-dropped guards chat/inputRequested, which only agents
    # send; its rule is covered in tests/test_validation.py.
    codes = set(VALIDATION_CODES) - {"answered-question-dropped"}
    assert {p.values[1] for p in BROKEN_RULES} == codes
    # unknown-chat is kept by its own test: its action names the scene's chat.
    assert {p.values[1] for p in KEPT_RULES} == codes - {"unknown-chat"}


def action_of(envelope: Frame) -> Any:
    return msgspec.convert(envelope["action"], StateAction)


# ─── Rejections ──────────────────────────────────────────────────────────────


@pytest.mark.parametrize(("rule", "code"), BROKEN_RULES)
async def test_sender_gets_the_rejection_with_the_current_seq(
    huddle: RunningServer, background: list[asyncio.Task[Any]], rule: Case, code: str
) -> None:
    scene = await make_scene(huddle, rule.setup, background)
    uri = scene.uri(rule.channel)
    sender = await scene.peer("sender", rule.action, rule.channel)
    current = (await huddle.server.host.view(uri)).seq

    client_seq = await sender.dispatch(uri, rule.action)
    echo = await sender.envelope()

    assert echo["rejectionReason"].startswith(f"{code}: ")
    assert echo["serverSeq"] == current
    assert echo["channel"] == uri
    assert echo["origin"] == {"clientId": "sender", "clientSeq": client_seq}
    assert action_of(echo) == rule.action


@pytest.mark.parametrize(("rule", "code"), BROKEN_RULES)
async def test_other_subscribers_never_see_a_rejection_and_no_seq_is_used(
    huddle: RunningServer, background: list[asyncio.Task[Any]], rule: Case, code: str
) -> None:
    scene = await make_scene(huddle, rule.setup, background)
    uri = scene.uri(rule.channel)
    sender = await scene.peer("sender", rule.action, rule.channel)
    other = await Peer.ready(huddle.ws, huddle.token(name="other"), "other")
    seq = (await other.subscribe(uri))["fromSeq"]

    await sender.dispatch(uri, rule.action)
    assert (await sender.envelope())["rejectionReason"].startswith(f"{code}: ")
    good = ACCEPTED_AFTERWARDS[rule.channel]
    await sender.dispatch(uri, good)

    following = await other.envelope()
    assert following["serverSeq"] == seq + 1
    assert "rejectionReason" not in following
    assert following["action"]["type"] == action_type(good)


@pytest.mark.parametrize(("rule", "code"), BROKEN_RULES)
async def test_a_rejection_leaves_every_state_untouched(
    huddle: RunningServer, background: list[asyncio.Task[Any]], rule: Case, code: str
) -> None:
    scene = await make_scene(huddle, rule.setup, background)
    uri = scene.uri(rule.channel)
    sender = await scene.peer("sender", rule.action, rule.channel)
    before = scene.mirror_states()
    held = (await huddle.server.host.view(uri)).state

    await sender.dispatch(uri, rule.action)
    assert (await sender.envelope())["rejectionReason"].startswith(f"{code}: ")
    async with asyncio.timeout(5 * UNIT):
        await scene.settle_mirrors()

    assert scene.mirror_states() == before
    assert (await huddle.server.host.view(uri)).state == held


# ─── Actions that keep the rules ─────────────────────────────────────────────


@pytest.mark.parametrize(("rule", "code"), KEPT_RULES)
async def test_an_action_that_keeps_the_rule_is_accepted_and_broadcast(
    huddle: RunningServer, background: list[asyncio.Task[Any]], rule: Case, code: str
) -> None:
    scene = await make_scene(huddle, rule.setup, background)
    uri = scene.uri(rule.channel)
    sender = await scene.peer("sender", rule.action, rule.channel)
    other = await Peer.ready(huddle.ws, huddle.token(name="other"), "other")
    seq = (await other.subscribe(uri))["fromSeq"]

    await sender.dispatch(uri, rule.action)

    for envelope in (await sender.envelope(), await other.envelope()):
        assert "rejectionReason" not in envelope
        assert envelope["serverSeq"] == seq + 1
        assert unstamped(action_of(envelope)) == rule.action


def unstamped(action: Any) -> Any:
    """``action`` without what the server stamps a person's message with
    (server.core.policy.stamped: the token, and a turn's stamp), as its sender
    sent it."""
    message = getattr(action, "message", None)
    if message is None or not message.meta:
        return action
    meta = {k: v for k, v in message.meta.items() if k != "huddle"}
    huddle = {k: v for k, v in message.meta["huddle"].items() if k not in ("by", "turn")}
    if huddle:
        meta["huddle"] = huddle
    return replace(action, message=replace(message, meta=meta or None))


async def test_default_chat_in_the_catalog_is_accepted(
    huddle: RunningServer, background: list[asyncio.Task[Any]]
) -> None:
    scene = await make_scene(huddle, "idle", background)
    action = SessionDefaultChatChanged(default_chat=scene.chat)
    sender = await scene.peer("sender", action, "session")

    await sender.dispatch(SESSION, action)

    envelope = await sender.envelope()
    assert "rejectionReason" not in envelope
    assert envelope["action"] == {"type": "session/defaultChatChanged", "defaultChat": scene.chat}


async def test_edited_tool_input_that_breaks_the_tools_input_schema_is_rejected(
    huddle: RunningServer, background: list[asyncio.Task[Any]]
) -> None:
    scene = await make_scene(huddle, "busy", background)
    tool = ToolDefinition(name="write_file", input_schema=WRITE_FILE_SCHEMA)
    await scene.agent.dispatch_and_wait(SESSION, SessionServerToolsChanged(tools=[tool]))
    action = approve("edit", edited_tool_input='{"path": 7}')
    sender = await scene.peer("sender", action, "chat")

    await sender.dispatch(scene.chat, action)

    echo = await sender.envelope()
    assert echo.get("rejectionReason", "").startswith("invalid-tool-input: ")
