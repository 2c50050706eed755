"""The authorisation policy: who may run which command and dispatch which
action, as a table of grants and actions (pure: no server)."""

from __future__ import annotations

import pytest

from protocol.actions import (
    ChatDraftChanged,
    ChatInputRequested,
    ChatToolCallComplete,
    ChatToolCallContentChanged,
    RootConfigChanged,
    SessionActiveClientRemoved,
    SessionActiveClientSet,
    SessionTitleChanged,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    ClientContributor,
    InputRequest,
    Message,
    MessageOrigin,
    ToolCallPart,
    ToolCallResult,
    ToolCallRunning,
)
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import ActiveClient, RootState, SessionState
from protocol.status import SessionStatus
from server.auth import Grant, Role
from server.policy import Command, command_refusal, dispatch_refusal, reaches

SESSION, OTHER = "ahp-session:/ours", "ahp-session:/theirs"
CHAT, ROOT = "ahp-chat:/c", "ahp-root://"


def grant(role: Role, sessions: set[str] | None = None) -> Grant:
    scope = None if sessions is None else frozenset(sessions)
    return Grant(role=role, sessions=scope, name=role, token_id=f"t-{role}")


AGENT, PARTICIPANT, OBSERVER = grant("agent"), grant("participant"), grant("observer")
SCOPED = grant("participant", {SESSION})


def chat_running(contributor: ClientContributor | None) -> ChatState:
    call = ToolCallRunning(
        tool_call_id="call-1",
        tool_name="open_browser",
        display_name="Open browser",
        invocation_message="Open it",
        confirmed="not-needed",
        contributor=contributor,
    )
    message = Message(text="hi", origin=MessageOrigin(kind="user"))
    active = ActiveTurn(
        id="turn-1",
        started_at="1970-01-01T00:00:01.000Z",
        message=message,
        response_parts=[ToolCallPart(tool_call=call)],
    )
    return ChatState(
        resource=CHAT,
        title="t",
        status=SessionStatus.IN_PROGRESS,
        modified_at="1970-01-01T00:00:01.000Z",
        turns=[],
        active_turn=active,
    )


SESSION_STATE = SessionState(
    provider="huddle",
    title="t",
    status=SessionStatus.IDLE,
    lifecycle="ready",
    active_clients=[],
    chats=[],
)
ASK = InputRequest(id="r")
ROOT_STATE = RootState(agents=[], active_sessions=0)
COMPLETE = ChatToolCallComplete(
    turn_id="turn-1",
    tool_call_id="call-1",
    result=ToolCallResult(success=True, past_tense_message="Opened"),
)
UPDATE = ChatToolCallContentChanged(turn_id="turn-1", tool_call_id="call-1", content=[])


def entry(client_id: str) -> SessionActiveClientSet:
    return SessionActiveClientSet(active_client=ActiveClient(client_id=client_id, tools=[]))


def forbidden(sentence: str) -> Rejection:
    return Rejection(RejectionCode.FORBIDDEN, sentence)


OWN_CALL = chat_running(ClientContributor(client_id="laptop"))
NOT_EXECUTED = forbidden(
    "tool call 'call-1' is not executed by this client, so it may not complete or update it"
)

ALLOWED = [
    pytest.param(
        AGENT, CHAT, ChatInputRequested(request=InputRequest(id="r")), OWN_CALL, id="agent-any"
    ),
    pytest.param(PARTICIPANT, CHAT, ChatDraftChanged(), OWN_CALL, id="participant-client-action"),
    pytest.param(PARTICIPANT, CHAT, COMPLETE, OWN_CALL, id="completes-its-own-call"),
    pytest.param(PARTICIPANT, CHAT, UPDATE, OWN_CALL, id="updates-its-own-call"),
    pytest.param(PARTICIPANT, SESSION, entry("laptop"), SESSION_STATE, id="sets-its-own-entry"),
    pytest.param(
        PARTICIPANT,
        SESSION,
        SessionActiveClientRemoved(client_id="laptop"),
        SESSION_STATE,
        id="removes-its-own-entry",
    ),
    pytest.param(PARTICIPANT, ROOT, RootConfigChanged(config={}), ROOT_STATE, id="unscoped-root"),
    pytest.param(AGENT, SESSION, entry("phone"), SESSION_STATE, id="agent-sets-any-entry"),
]

REFUSED = [
    pytest.param(
        AGENT,
        CHAT,
        SessionTitleChanged(title="x"),
        OWN_CALL,
        Rejection(RejectionCode.WRONG_CHANNEL, "a session action cannot go to a chat channel"),
        id="wrong-channel",
    ),
    pytest.param(
        OBSERVER,
        CHAT,
        ChatDraftChanged(),
        OWN_CALL,
        forbidden("observers may not dispatch actions"),
        id="observer",
    ),
    pytest.param(
        SCOPED,
        ROOT,
        RootConfigChanged(config={}),
        ROOT_STATE,
        forbidden("a token scoped to sessions may not change the root channel"),
        id="scoped-token-writes-root",
    ),
    pytest.param(
        PARTICIPANT,
        CHAT,
        ChatInputRequested(request=ASK),
        OWN_CALL,
        forbidden("chat/inputRequested is dispatched only by the server"),
        id="server-only-action",
    ),
    pytest.param(
        PARTICIPANT,
        CHAT,
        COMPLETE,
        chat_running(ClientContributor(client_id="phone")),
        NOT_EXECUTED,
        id="completes-another-clients-call",
    ),
    pytest.param(
        PARTICIPANT,
        CHAT,
        UPDATE,
        chat_running(ClientContributor(client_id="phone")),
        NOT_EXECUTED,
        id="updates-another-clients-call",
    ),
    pytest.param(
        PARTICIPANT,
        CHAT,
        COMPLETE,
        chat_running(None),
        NOT_EXECUTED,
        id="completes-the-agents-call",
    ),
    pytest.param(
        PARTICIPANT,
        SESSION,
        entry("phone"),
        SESSION_STATE,
        forbidden("a client may set only its own active-client entry, not 'phone'"),
        id="sets-another-clients-entry",
    ),
    pytest.param(
        PARTICIPANT,
        SESSION,
        SessionActiveClientRemoved(client_id="phone"),
        SESSION_STATE,
        forbidden("a client may remove only its own active-client entry, not 'phone'"),
        id="removes-another-clients-entry",
    ),
]


@pytest.mark.parametrize(("who", "uri", "action", "state"), ALLOWED)
def test_policy_allows(who: Grant, uri: str, action: StateAction, state: ChannelState) -> None:
    assert dispatch_refusal(who, uri, action, state, "laptop") is None


@pytest.mark.parametrize(("who", "uri", "action", "state", "refusal"), REFUSED)
def test_policy_refuses(
    who: Grant, uri: str, action: StateAction, state: ChannelState, refusal: Rejection
) -> None:
    assert dispatch_refusal(who, uri, action, state, "laptop") == refusal


@pytest.mark.parametrize(
    ("who", "session", "reached"),
    [
        pytest.param(PARTICIPANT, OTHER, True, id="unscoped-reaches-every-session"),
        pytest.param(SCOPED, SESSION, True, id="scoped-reaches-its-session"),
        pytest.param(SCOPED, OTHER, False, id="scoped-does-not-reach-another"),
        pytest.param(SCOPED, None, True, id="scoped-reads-the-root"),
    ],
)
def test_a_token_reaches_the_sessions_of_its_scope(
    who: Grant, session: str | None, reached: bool
) -> None:
    assert reaches(who, session) is reached


@pytest.mark.parametrize(
    ("who", "command", "allowed"),
    [
        pytest.param(AGENT, Command.CREATE_SESSION, True, id="agent-creates-sessions"),
        pytest.param(PARTICIPANT, Command.CREATE_SESSION, True, id="unscoped-creates-sessions"),
        pytest.param(SCOPED, Command.CREATE_SESSION, False, id="scoped-does-not"),
        pytest.param(OBSERVER, Command.CREATE_SESSION, False, id="observer-does-not"),
        pytest.param(PARTICIPANT, Command.DISPOSE_SESSION, False, id="only-agents-dispose"),
        pytest.param(AGENT, Command.DISPOSE_SESSION, True, id="agent-disposes"),
        pytest.param(OBSERVER, Command.CREATE_CHAT, False, id="observer-creates-no-chat"),
        pytest.param(PARTICIPANT, Command.CREATE_CHAT, True, id="participant-creates-chats"),
        pytest.param(PARTICIPANT, Command.MINT_TOKEN, False, id="only-agents-mint"),
        pytest.param(AGENT, Command.MINT_TOKEN, True, id="agent-mints"),
        pytest.param(OBSERVER, Command.READ, True, id="anyone-reads"),
    ],
)
def test_commands_by_role(who: Grant, command: Command, allowed: bool) -> None:
    assert (command_refusal(who, command) is None) is allowed
