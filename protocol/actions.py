"""Every AHP 0.7 action of the root, session and chat channels.

An action is a Struct tagged by ``type`` with AHP's exact type string. The
unions at the bottom (``RootAction``, ``SessionAction``, ``ChatAction`` and
``StateAction``) are what decoders and reducers take. ``CLIENT_DISPATCHABLE``
is AHP's set of actions a client may originate; all others are server-only.
"""

from __future__ import annotations

from typing import TypeAlias, TypeGuard, get_args

from protocol.chat import (
    CancellationReason,
    ChatSummary,
    ChatSummaryChanges,
    ConfirmationOption,
    ConfirmationReason,
    Contributor,
    InputAnswer,
    InputRequest,
    InputResponseKind,
    KnownPart,
    McpAuthRequirement,
    Message,
    PendingMessageKind,
    ToolCallEdits,
    ToolCallResult,
    ToolCallRiskAssessment,
    ToolResultContent,
    Turn,
)
from protocol.session import (
    ActiveClient,
    AgentInfo,
    SessionInputRequest,
    ToolDefinition,
)
from protocol.wire import (
    URI,
    ErrorInfo,
    JsonObject,
    Number,
    StringOrMarkdown,
    UsageInfo,
    Wire,
    meta_field,
)


class Action(Wire, frozen=True, kw_only=True, tag_field="type"):
    """Base of every action; the ``type`` tag is AHP's action type string."""


# ─── Root ────────────────────────────────────────────────────────────────────


class RootAgentsChanged(Action, frozen=True, kw_only=True, tag="root/agentsChanged"):
    agents: list[AgentInfo]


class RootActiveSessionsChanged(
    Action, frozen=True, kw_only=True, tag="root/activeSessionsChanged"
):
    active_sessions: int


class RootTerminalsChanged(Action, frozen=True, kw_only=True, tag="root/terminalsChanged"):
    terminals: list[JsonObject]


class RootConfigChanged(Action, frozen=True, kw_only=True, tag="root/configChanged"):
    config: JsonObject
    replace: bool | None = None


# ─── Session ─────────────────────────────────────────────────────────────────


class SessionReady(Action, frozen=True, kw_only=True, tag="session/ready"):
    pass


class SessionCreationFailed(Action, frozen=True, kw_only=True, tag="session/creationFailed"):
    error: ErrorInfo


class SessionChatAdded(Action, frozen=True, kw_only=True, tag="session/chatAdded"):
    summary: ChatSummary


class SessionChatRemoved(Action, frozen=True, kw_only=True, tag="session/chatRemoved"):
    chat: URI


class SessionChatUpdated(Action, frozen=True, kw_only=True, tag="session/chatUpdated"):
    chat: URI
    changes: ChatSummaryChanges


class SessionDefaultChatChanged(
    Action, frozen=True, kw_only=True, tag="session/defaultChatChanged"
):
    default_chat: URI | None = None


class SessionTitleChanged(Action, frozen=True, kw_only=True, tag="session/titleChanged"):
    title: str


class SessionIsReadChanged(Action, frozen=True, kw_only=True, tag="session/isReadChanged"):
    is_read: bool


class SessionIsArchivedChanged(Action, frozen=True, kw_only=True, tag="session/isArchivedChanged"):
    is_archived: bool


class SessionActivityChanged(Action, frozen=True, kw_only=True, tag="session/activityChanged"):
    activity: str | None = None


class SessionChangesetsChanged(Action, frozen=True, kw_only=True, tag="session/changesetsChanged"):
    changesets: list[JsonObject] | None = None


class SessionServerToolsChanged(
    Action, frozen=True, kw_only=True, tag="session/serverToolsChanged"
):
    tools: list[ToolDefinition]


class SessionActiveClientSet(Action, frozen=True, kw_only=True, tag="session/activeClientSet"):
    active_client: ActiveClient


class SessionActiveClientRemoved(
    Action, frozen=True, kw_only=True, tag="session/activeClientRemoved"
):
    client_id: str


class SessionWorkingDirectorySet(
    Action, frozen=True, kw_only=True, tag="session/workingDirectorySet"
):
    directory: URI


class SessionWorkingDirectoryRemoved(
    Action, frozen=True, kw_only=True, tag="session/workingDirectoryRemoved"
):
    directory: URI


class SessionInputNeededSet(Action, frozen=True, kw_only=True, tag="session/inputNeededSet"):
    request: SessionInputRequest


class SessionInputNeededRemoved(
    Action, frozen=True, kw_only=True, tag="session/inputNeededRemoved"
):
    id: str


class SessionCustomizationsChanged(
    Action, frozen=True, kw_only=True, tag="session/customizationsChanged"
):
    customizations: list[JsonObject]


class SessionCustomizationToggled(
    Action, frozen=True, kw_only=True, tag="session/customizationToggled"
):
    id: str
    enabled: bool


class SessionCustomizationUpdated(
    Action, frozen=True, kw_only=True, tag="session/customizationUpdated"
):
    customization: JsonObject


class SessionCustomizationRemoved(
    Action, frozen=True, kw_only=True, tag="session/customizationRemoved"
):
    id: str


class SessionMcpServerStateChanged(
    Action, frozen=True, kw_only=True, tag="session/mcpServerStateChanged"
):
    id: str
    state: JsonObject
    channel: URI | None = None


class SessionMcpServerStartRequested(
    Action, frozen=True, kw_only=True, tag="session/mcpServerStartRequested"
):
    id: str


class SessionMcpServerStopRequested(
    Action, frozen=True, kw_only=True, tag="session/mcpServerStopRequested"
):
    id: str


class SessionConfigChanged(Action, frozen=True, kw_only=True, tag="session/configChanged"):
    config: JsonObject
    replace: bool | None = None


class SessionMetaChanged(Action, frozen=True, kw_only=True, tag="session/metaChanged"):
    meta: JsonObject | None = meta_field()


# ─── Chat: turns and streaming ───────────────────────────────────────────────


class ChatTurnStarted(Action, frozen=True, kw_only=True, tag="chat/turnStarted"):
    turn_id: str
    started_at: str
    message: Message
    queued_message_id: str | None = None
    meta: JsonObject | None = meta_field()


class ChatDelta(Action, frozen=True, kw_only=True, tag="chat/delta"):
    turn_id: str
    part_id: str
    content: str
    meta: JsonObject | None = meta_field()


class ChatResponsePart(Action, frozen=True, kw_only=True, tag="chat/responsePart"):
    turn_id: str
    part: KnownPart
    meta: JsonObject | None = meta_field()


class ChatReasoning(Action, frozen=True, kw_only=True, tag="chat/reasoning"):
    turn_id: str
    part_id: str
    content: str
    meta: JsonObject | None = meta_field()


class ChatUsage(Action, frozen=True, kw_only=True, tag="chat/usage"):
    turn_id: str
    usage: UsageInfo
    meta: JsonObject | None = meta_field()


class ChatTurnComplete(Action, frozen=True, kw_only=True, tag="chat/turnComplete"):
    turn_id: str
    duration: Number
    meta: JsonObject | None = meta_field()


class ChatTurnCancelled(Action, frozen=True, kw_only=True, tag="chat/turnCancelled"):
    turn_id: str
    duration: Number
    meta: JsonObject | None = meta_field()


class ChatError(Action, frozen=True, kw_only=True, tag="chat/error"):
    turn_id: str
    duration: Number
    error: ErrorInfo
    meta: JsonObject | None = meta_field()


class ChatActivityChanged(Action, frozen=True, kw_only=True, tag="chat/activityChanged"):
    activity: str | None = None


class ChatWorkingDirectorySet(Action, frozen=True, kw_only=True, tag="chat/workingDirectorySet"):
    directory: URI


class ChatWorkingDirectoryRemoved(
    Action, frozen=True, kw_only=True, tag="chat/workingDirectoryRemoved"
):
    directory: URI


class ChatTruncated(Action, frozen=True, kw_only=True, tag="chat/truncated"):
    """Drop every turn after ``turn_id`` (all turns when absent) and the
    active turn."""

    turn_id: str | None = None


class ChatTurnsLoaded(Action, frozen=True, kw_only=True, tag="chat/turnsLoaded"):
    turns: list[Turn]
    turns_next_cursor: str | None = None


# ─── Chat: tool calls ────────────────────────────────────────────────────────


class ChatToolCallStart(Action, frozen=True, kw_only=True, tag="chat/toolCallStart"):
    turn_id: str
    tool_call_id: str
    tool_name: str
    display_name: str
    intention: str | None = None
    contributor: Contributor | None = None
    meta: JsonObject | None = meta_field()


class ChatToolCallDelta(Action, frozen=True, kw_only=True, tag="chat/toolCallDelta"):
    turn_id: str
    tool_call_id: str
    content: str
    invocation_message: StringOrMarkdown | None = None
    meta: JsonObject | None = meta_field()


class ChatToolCallReady(Action, frozen=True, kw_only=True, tag="chat/toolCallReady"):
    turn_id: str
    tool_call_id: str
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmation_title: StringOrMarkdown | None = None
    risk_assessment: ToolCallRiskAssessment | None = None
    edits: ToolCallEdits | None = None
    editable: bool | None = None
    confirmed: ConfirmationReason | None = None
    options: list[ConfirmationOption] | None = None
    meta: JsonObject | None = meta_field()


class ChatToolCallConfirmed(Action, frozen=True, kw_only=True, tag="chat/toolCallConfirmed"):
    """Approve (``approved`` with ``confirmed``) or deny (``approved=False``
    with ``reason``) a tool call waiting for confirmation.

    AHP splits this into two variants on ``approved``; it is one Struct here
    and the decoder checks that each variant carries its required field.
    """

    turn_id: str
    tool_call_id: str
    approved: bool
    confirmed: ConfirmationReason | None = None
    edited_tool_input: str | None = None
    reason: CancellationReason | None = None
    user_suggestion: Message | None = None
    reason_message: StringOrMarkdown | None = None
    selected_option_id: str | None = None
    meta: JsonObject | None = meta_field()

    def __post_init__(self) -> None:
        if self.approved and self.confirmed is None:
            raise ValueError("an approval needs `confirmed`")
        if not self.approved and self.reason not in ("denied", "skipped"):
            raise ValueError("a denial needs `reason` 'denied' or 'skipped'")


class ChatToolCallComplete(Action, frozen=True, kw_only=True, tag="chat/toolCallComplete"):
    turn_id: str
    tool_call_id: str
    result: ToolCallResult
    requires_result_confirmation: bool | None = None
    meta: JsonObject | None = meta_field()


class ChatToolCallResultConfirmed(
    Action, frozen=True, kw_only=True, tag="chat/toolCallResultConfirmed"
):
    turn_id: str
    tool_call_id: str
    approved: bool
    meta: JsonObject | None = meta_field()


class ChatToolCallContentChanged(
    Action, frozen=True, kw_only=True, tag="chat/toolCallContentChanged"
):
    turn_id: str
    tool_call_id: str
    content: list[ToolResultContent]
    meta: JsonObject | None = meta_field()


class ChatToolCallAuthRequired(Action, frozen=True, kw_only=True, tag="chat/toolCallAuthRequired"):
    turn_id: str
    tool_call_id: str
    auth: McpAuthRequirement
    meta: JsonObject | None = meta_field()


class ChatToolCallAuthResolved(Action, frozen=True, kw_only=True, tag="chat/toolCallAuthResolved"):
    turn_id: str
    tool_call_id: str
    meta: JsonObject | None = meta_field()


# ─── Chat: pending messages, draft, input requests ───────────────────────────


class ChatPendingMessageSet(Action, frozen=True, kw_only=True, tag="chat/pendingMessageSet"):
    kind: PendingMessageKind
    id: str
    message: Message


class ChatPendingMessageRemoved(
    Action, frozen=True, kw_only=True, tag="chat/pendingMessageRemoved"
):
    kind: PendingMessageKind
    id: str


class ChatQueuedMessagesReordered(
    Action, frozen=True, kw_only=True, tag="chat/queuedMessagesReordered"
):
    order: list[str]


class ChatDraftChanged(Action, frozen=True, kw_only=True, tag="chat/draftChanged"):
    draft: Message | None = None


class ChatInputRequested(Action, frozen=True, kw_only=True, tag="chat/inputRequested"):
    """Insert an input request into the active turn, or replace the open one
    with the same id (keeping its drafts when ``answers`` is absent)."""

    request: InputRequest


class ChatInputAnswerChanged(Action, frozen=True, kw_only=True, tag="chat/inputAnswerChanged"):
    """Set one question's answer; an absent ``answer`` clears it."""

    request_id: str
    question_id: str
    answer: InputAnswer | None = None


class ChatInputCompleted(Action, frozen=True, kw_only=True, tag="chat/inputCompleted"):
    """Resolve an open request; ``answers`` overlay the synced drafts."""

    request_id: str
    response: InputResponseKind
    answers: dict[str, InputAnswer] | None = None


# ─── Unions ──────────────────────────────────────────────────────────────────

RootAction: TypeAlias = (
    RootAgentsChanged | RootActiveSessionsChanged | RootTerminalsChanged | RootConfigChanged
)

SessionAction: TypeAlias = (
    SessionReady
    | SessionCreationFailed
    | SessionChatAdded
    | SessionChatRemoved
    | SessionChatUpdated
    | SessionDefaultChatChanged
    | SessionTitleChanged
    | SessionIsReadChanged
    | SessionIsArchivedChanged
    | SessionActivityChanged
    | SessionChangesetsChanged
    | SessionServerToolsChanged
    | SessionActiveClientSet
    | SessionActiveClientRemoved
    | SessionWorkingDirectorySet
    | SessionWorkingDirectoryRemoved
    | SessionInputNeededSet
    | SessionInputNeededRemoved
    | SessionCustomizationsChanged
    | SessionCustomizationToggled
    | SessionCustomizationUpdated
    | SessionCustomizationRemoved
    | SessionMcpServerStateChanged
    | SessionMcpServerStartRequested
    | SessionMcpServerStopRequested
    | SessionConfigChanged
    | SessionMetaChanged
)

ChatAction: TypeAlias = (
    ChatTurnStarted
    | ChatDelta
    | ChatResponsePart
    | ChatReasoning
    | ChatUsage
    | ChatTurnComplete
    | ChatTurnCancelled
    | ChatError
    | ChatActivityChanged
    | ChatWorkingDirectorySet
    | ChatWorkingDirectoryRemoved
    | ChatTruncated
    | ChatTurnsLoaded
    | ChatToolCallStart
    | ChatToolCallDelta
    | ChatToolCallReady
    | ChatToolCallConfirmed
    | ChatToolCallComplete
    | ChatToolCallResultConfirmed
    | ChatToolCallContentChanged
    | ChatToolCallAuthRequired
    | ChatToolCallAuthResolved
    | ChatPendingMessageSet
    | ChatPendingMessageRemoved
    | ChatQueuedMessagesReordered
    | ChatDraftChanged
    | ChatInputRequested
    | ChatInputAnswerChanged
    | ChatInputCompleted
)

StateAction: TypeAlias = RootAction | SessionAction | ChatAction


ROOT_ACTIONS: tuple[type[Action], ...] = get_args(RootAction)
SESSION_ACTIONS: tuple[type[Action], ...] = get_args(SessionAction)
CHAT_ACTIONS: tuple[type[Action], ...] = get_args(ChatAction)
ACTION_TYPES: dict[str, type[Action]] = {
    str(cls.__struct_config__.tag): cls for cls in ROOT_ACTIONS + SESSION_ACTIONS + CHAT_ACTIONS
}
"""Every action class by its AHP ``type`` string."""


_KINDS: dict[type, tuple[bool, bool, bool]] = {}
"""Whether a class is a root, a session or a chat action, by class: asked
for every action, and ``isinstance`` against a tuple of Struct classes
costs about 2 us (a dict lookup, 0.05)."""


def _kind(action: Action) -> tuple[bool, bool, bool]:
    cls = type(action)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _KINDS[cls] = (
            issubclass(cls, ROOT_ACTIONS),
            issubclass(cls, SESSION_ACTIONS),
            issubclass(cls, CHAT_ACTIONS),
        )
    return kind


def is_root_action(action: Action) -> TypeGuard[RootAction]:
    return _kind(action)[0]


def is_session_action(action: Action) -> TypeGuard[SessionAction]:
    return _kind(action)[1]


def is_chat_action(action: Action) -> TypeGuard[ChatAction]:
    return _kind(action)[2]


def action_type(action: Action) -> str:
    """The AHP ``type`` string of an action."""
    tag = type(action).__struct_config__.tag
    assert isinstance(tag, str)
    return tag


CLIENT_DISPATCHABLE: frozenset[type[Action]] = frozenset(
    {
        RootConfigChanged,
        SessionTitleChanged,
        SessionActiveClientSet,
        SessionActiveClientRemoved,
        SessionWorkingDirectorySet,
        SessionWorkingDirectoryRemoved,
        SessionCustomizationToggled,
        SessionMcpServerStartRequested,
        SessionMcpServerStopRequested,
        SessionIsReadChanged,
        SessionIsArchivedChanged,
        SessionConfigChanged,
        ChatTurnStarted,
        ChatToolCallConfirmed,
        ChatToolCallComplete,
        ChatToolCallResultConfirmed,
        ChatToolCallContentChanged,
        ChatTurnCancelled,
        ChatWorkingDirectorySet,
        ChatWorkingDirectoryRemoved,
        ChatPendingMessageSet,
        ChatPendingMessageRemoved,
        ChatQueuedMessagesReordered,
        ChatDraftChanged,
        ChatInputAnswerChanged,
        ChatInputCompleted,
        ChatTruncated,
    }
)
"""AHP's client-dispatchable actions; every other action is server-only."""


def is_client_dispatchable(action: Action) -> bool:
    return type(action) in CLIENT_DISPATCHABLE
