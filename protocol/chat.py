"""State of an AHP chat channel (``ahp-chat:/<id>``).

Turns, the active turn, messages and attachments, response parts, the tool
call lifecycle and input requests (elicitation), as AHP 0.7 defines them in
``types/channels-chat/state.ts``. Unions are tagged exactly as AHP tags them
(``kind``, ``status``, ``type``); every tag value is AHP's spelling.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from protocol.wire import (
    URI,
    ErrorInfo,
    FileDiff,
    FileEdit,
    FileEditSide,
    JsonObject,
    Number,
    StringOrMarkdown,
    TextRange,
    TextSelection,
    UsageInfo,
    Wire,
    meta_field,
)

# ─── Messages ────────────────────────────────────────────────────────────────

MessageKind: TypeAlias = Literal["user", "agent", "tool", "systemNotification"]


class MessageOrigin(Wire, frozen=True, kw_only=True):
    kind: MessageKind


class ModelSelection(Wire, frozen=True, kw_only=True):
    id: str
    config: JsonObject | None = None


class AgentSelection(Wire, frozen=True, kw_only=True):
    uri: URI


class Attachment(Wire, frozen=True, kw_only=True, tag_field="type"):
    """Fields every message attachment has; tagged by ``type``."""

    label: str
    range: TextRange | None = None
    display_kind: str | None = None
    meta: JsonObject | None = meta_field()


class SimpleAttachment(Attachment, frozen=True, kw_only=True, tag="simple"):
    model_representation: str | None = None


class EmbeddedResourceAttachment(Attachment, frozen=True, kw_only=True, tag="embeddedResource"):
    data: str
    content_type: str
    selection: TextSelection | None = None


class ResourceAttachment(Attachment, frozen=True, kw_only=True, tag="resource"):
    uri: URI
    size_hint: Number | None = None
    content_type: str | None = None
    nonce: str | None = None
    selection: TextSelection | None = None


class AnnotationsAttachment(Attachment, frozen=True, kw_only=True, tag="annotations"):
    resource: URI
    annotation_ids: list[str] | None = None


class ChatAttachment(Attachment, frozen=True, kw_only=True, tag="chat"):
    resource: URI
    end_turn: str | None = None


MessageAttachment: TypeAlias = (
    SimpleAttachment
    | EmbeddedResourceAttachment
    | ResourceAttachment
    | AnnotationsAttachment
    | ChatAttachment
)


class Message(Wire, frozen=True, kw_only=True):
    """A message that starts or steers a turn."""

    text: str
    origin: MessageOrigin
    attachments: list[MessageAttachment] | None = None
    model: ModelSelection | None = None
    agent: AgentSelection | None = None
    meta: JsonObject | None = meta_field()


class PendingMessage(Wire, frozen=True, kw_only=True):
    id: str
    message: Message


PendingMessageKind: TypeAlias = Literal["steering", "queued"]

# ─── Input requests (elicitation) ────────────────────────────────────────────


class InputOption(Wire, frozen=True, kw_only=True):
    """A choice of a select question; for MCP enums ``id`` is the enum value."""

    id: str
    label: str
    description: str | None = None
    recommended: bool | None = None


class Question(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every question has; tagged by ``kind``."""

    id: str
    title: str | None = None
    message: str
    required: bool | None = None


class TextQuestion(Question, frozen=True, kw_only=True, tag="text"):
    format: str | None = None
    min: int | None = None
    max: int | None = None
    default_value: str | None = None


class NumberQuestion(Question, frozen=True, kw_only=True, tag="number"):
    min: Number | None = None
    max: Number | None = None
    default_value: Number | None = None


class IntegerQuestion(Question, frozen=True, kw_only=True, tag="integer"):
    min: Number | None = None
    max: Number | None = None
    default_value: Number | None = None


class BooleanQuestion(Question, frozen=True, kw_only=True, tag="boolean"):
    default_value: bool | None = None


class SingleSelectQuestion(Question, frozen=True, kw_only=True, tag="single-select"):
    options: list[InputOption]
    allow_freeform_input: bool | None = None


class MultiSelectQuestion(Question, frozen=True, kw_only=True, tag="multi-select"):
    options: list[InputOption]
    allow_freeform_input: bool | None = None
    min: int | None = None
    max: int | None = None


InputQuestion: TypeAlias = (
    TextQuestion
    | NumberQuestion
    | IntegerQuestion
    | BooleanQuestion
    | SingleSelectQuestion
    | MultiSelectQuestion
)


class AnswerValue(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the answer values; tagged by ``kind``."""


class TextValue(AnswerValue, frozen=True, kw_only=True, tag="text"):
    value: str


class NumberValue(AnswerValue, frozen=True, kw_only=True, tag="number"):
    value: Number


class BooleanValue(AnswerValue, frozen=True, kw_only=True, tag="boolean"):
    value: bool


class SelectedValue(AnswerValue, frozen=True, kw_only=True, tag="selected"):
    value: str
    freeform_values: list[str] | None = None


class SelectedManyValue(AnswerValue, frozen=True, kw_only=True, tag="selected-many"):
    value: list[str]
    freeform_values: list[str] | None = None


InputAnswerValue: TypeAlias = (
    TextValue | NumberValue | BooleanValue | SelectedValue | SelectedManyValue
)

AnswerState: TypeAlias = Literal["draft", "submitted", "skipped"]


class InputAnswer(Wire, frozen=True, kw_only=True):
    """A draft, submitted or skipped answer to one question.

    AHP types this as a union of ``{state: draft|submitted, value}`` and
    ``{state: skipped, freeformValues?}``; it is one Struct here so that an
    answer missing its value decodes and can be rejected with a clear reason.
    """

    state: AnswerState
    value: InputAnswerValue | None = None
    freeform_values: list[str] | None = None


class InputRequest(Wire, frozen=True, kw_only=True):
    """The request carried by an input-request response part."""

    id: str
    message: str | None = None
    url: URI | None = None
    questions: list[InputQuestion] | None = None
    answers: dict[str, InputAnswer] | None = None


InputResponseKind: TypeAlias = Literal["accept", "decline", "cancel"]

# ─── Tool calls ──────────────────────────────────────────────────────────────


class ToolCallContributor(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """Who contributes the tool: a client or an MCP server."""


class ClientContributor(ToolCallContributor, frozen=True, kw_only=True, tag="client"):
    client_id: str


class McpContributor(ToolCallContributor, frozen=True, kw_only=True, tag="mcp"):
    customization_id: str


Contributor: TypeAlias = ClientContributor | McpContributor


class McpOAuthClient(Wire, frozen=True, kw_only=True):
    client_id: str
    client_secret: str | None = None


class McpAuthRequirement(Wire, frozen=True, kw_only=True):
    """An MCP authentication challenge (RFC 9728 metadata kept verbatim)."""

    reason: Literal["required", "expired", "insufficientScope"]
    resource: JsonObject
    oauth_client: McpOAuthClient | None = None
    required_scopes: list[str] | None = None
    description: str | None = None


ConfirmationReason: TypeAlias = Literal["not-needed", "user-action", "setting"]
CancellationReason: TypeAlias = Literal["denied", "skipped", "result-denied"]


class ConfirmationOption(Wire, frozen=True, kw_only=True):
    id: str
    label: str
    kind: Literal["approve", "deny"]
    group: int | None = None


class RiskAssessment(Wire, frozen=True, kw_only=True, tag_field="status"):
    kind: Literal["judge"]


class RiskAssessmentLoading(RiskAssessment, frozen=True, kw_only=True, tag="loading"):
    pass


class RiskAssessmentComplete(RiskAssessment, frozen=True, kw_only=True, tag="complete"):
    reason: StringOrMarkdown
    safety: Number


ToolCallRiskAssessment: TypeAlias = RiskAssessmentLoading | RiskAssessmentComplete


class ToolCallEdits(Wire, frozen=True, kw_only=True):
    items: list[FileEdit]


class ToolResultContentBase(Wire, frozen=True, kw_only=True, tag_field="type"):
    pass


class TextContent(ToolResultContentBase, frozen=True, kw_only=True, tag="text"):
    text: str


class EmbeddedResourceContent(
    ToolResultContentBase, frozen=True, kw_only=True, tag="embeddedResource"
):
    data: str
    content_type: str


class ResourceContent(ToolResultContentBase, frozen=True, kw_only=True, tag="resource"):
    uri: URI
    size_hint: Number | None = None
    content_type: str | None = None
    nonce: str | None = None


class FileEditContent(ToolResultContentBase, frozen=True, kw_only=True, tag="fileEdit"):
    before: FileEditSide | None = None
    after: FileEditSide | None = None
    diff: FileDiff | None = None


class TerminalCommandResult(Wire, frozen=True, kw_only=True):
    exit_code: int | None = None
    preview: str | None = None
    truncated: bool | None = None


class TerminalContent(ToolResultContentBase, frozen=True, kw_only=True, tag="terminal"):
    resource: URI
    title: str
    is_pty: bool | None = None
    result: TerminalCommandResult | None = None


class SubagentContent(ToolResultContentBase, frozen=True, kw_only=True, tag="subagent"):
    resource: URI
    title: str
    agent_name: str | None = None
    description: str | None = None


ToolResultContent: TypeAlias = (
    TextContent
    | EmbeddedResourceContent
    | ResourceContent
    | FileEditContent
    | TerminalContent
    | SubagentContent
)


class ToolError(Wire, frozen=True, kw_only=True):
    message: str
    code: str | None = None


class ToolCallResult(Wire, frozen=True, kw_only=True):
    """What a finished tool produced (mirrors MCP ``CallToolResult``)."""

    success: bool
    past_tense_message: StringOrMarkdown
    content: list[ToolResultContent] | None = None
    structured_content: JsonObject | None = None
    error: ToolError | None = None


class ToolCall(Wire, frozen=True, kw_only=True, tag_field="status"):
    """Fields of every tool-call state; tagged by ``status``."""

    tool_call_id: str
    tool_name: str
    display_name: str
    intention: str | None = None
    contributor: Contributor | None = None
    meta: JsonObject | None = meta_field()


class ToolCallStreaming(ToolCall, frozen=True, kw_only=True, tag="streaming"):
    partial_input: str | None = None
    invocation_message: StringOrMarkdown | None = None


class ToolCallPendingConfirmation(ToolCall, frozen=True, kw_only=True, tag="pending-confirmation"):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmation_title: StringOrMarkdown | None = None
    risk_assessment: ToolCallRiskAssessment | None = None
    edits: ToolCallEdits | None = None
    editable: bool | None = None
    options: list[ConfirmationOption] | None = None


class ToolCallRunning(ToolCall, frozen=True, kw_only=True, tag="running"):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmed: ConfirmationReason
    selected_option: ConfirmationOption | None = None
    content: list[ToolResultContent] | None = None


class ToolCallAuthRequired(ToolCall, frozen=True, kw_only=True, tag="auth-required"):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmed: ConfirmationReason
    selected_option: ConfirmationOption | None = None
    auth: McpAuthRequirement
    content: list[ToolResultContent] | None = None


class ToolCallPendingResultConfirmation(
    ToolCall, frozen=True, kw_only=True, tag="pending-result-confirmation"
):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmed: ConfirmationReason
    selected_option: ConfirmationOption | None = None
    success: bool
    past_tense_message: StringOrMarkdown
    content: list[ToolResultContent] | None = None
    structured_content: JsonObject | None = None
    error: ToolError | None = None


class ToolCallCompleted(ToolCall, frozen=True, kw_only=True, tag="completed"):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    confirmed: ConfirmationReason
    selected_option: ConfirmationOption | None = None
    success: bool
    past_tense_message: StringOrMarkdown
    content: list[ToolResultContent] | None = None
    structured_content: JsonObject | None = None
    error: ToolError | None = None


class ToolCallCancelled(ToolCall, frozen=True, kw_only=True, tag="cancelled"):
    invocation_message: StringOrMarkdown
    tool_input: str | None = None
    reason: CancellationReason
    reason_message: StringOrMarkdown | None = None
    user_suggestion: Message | None = None
    selected_option: ConfirmationOption | None = None


ToolCallState: TypeAlias = (
    ToolCallStreaming
    | ToolCallPendingConfirmation
    | ToolCallRunning
    | ToolCallAuthRequired
    | ToolCallPendingResultConfirmation
    | ToolCallCompleted
    | ToolCallCancelled
)

ToolCallConfirmationState: TypeAlias = (
    ToolCallPendingConfirmation | ToolCallPendingResultConfirmation
)

# ─── Response parts ──────────────────────────────────────────────────────────


class Part(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """Base of the response parts; tagged by ``kind``."""


class MarkdownPart(Part, frozen=True, kw_only=True, tag="markdown"):
    id: str
    content: str


class ContentRefPart(Part, frozen=True, kw_only=True, tag="contentRef"):
    uri: URI
    size_hint: Number | None = None
    content_type: str | None = None
    nonce: str | None = None


class ToolCallPart(Part, frozen=True, kw_only=True, tag="toolCall"):
    tool_call: ToolCallState


class ReasoningPart(Part, frozen=True, kw_only=True, tag="reasoning"):
    id: str
    content: str


class SystemNotificationPart(Part, frozen=True, kw_only=True, tag="systemNotification"):
    content: StringOrMarkdown
    meta: JsonObject | None = meta_field()


class InputRequestPart(Part, frozen=True, kw_only=True, tag="inputRequest"):
    """A live or resolved input request; ``response`` is absent while open."""

    request: InputRequest
    response: InputResponseKind | None = None


class AsRead:
    """The JSON object of a part of an unknown kind, exactly as it was read.

    Not a msgspec type on purpose: the codec's encoder calls its hook on
    meeting one, which is how :func:`protocol.codec.encode` learns that a
    value holds an unknown part without searching every value it encodes.
    """

    __slots__ = ("json",)

    def __init__(self, json: JsonObject) -> None:
        self.json = json

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AsRead) and other.json == self.json

    __hash__ = None  # type: ignore[assignment]  # as unhashable as the dict it holds

    def __repr__(self) -> str:
        return f"AsRead({self.json!r})"


class UnknownPart(Part, frozen=True, kw_only=True, tag="huddle/unknown"):
    """A part of a kind this version does not know, read from stored state
    written by a newer peer. ``raw`` is the part as it was; reducers leave it
    alone and :func:`protocol.codec.encode` and
    :func:`protocol.codec.to_builtins` write it back as it was. Only
    :func:`protocol.codec.convert_state` makes one: every other decoder
    refuses a part of an unknown kind, and the ``huddle/unknown`` wrapper too."""

    raw: AsRead


KNOWN_PART_KINDS = frozenset(
    {"markdown", "contentRef", "toolCall", "reasoning", "systemNotification", "inputRequest"}
)

KnownPart: TypeAlias = (
    MarkdownPart
    | ContentRefPart
    | ToolCallPart
    | ReasoningPart
    | SystemNotificationPart
    | InputRequestPart
)
"""The parts an action may carry: only kinds this version knows."""

ResponsePart: TypeAlias = KnownPart | UnknownPart
"""The parts state may hold: a stored state may keep a newer peer's part."""

# ─── Turns and the chat ──────────────────────────────────────────────────────

TurnState: TypeAlias = Literal["complete", "cancelled", "error"]


class Turn(Wire, frozen=True, kw_only=True):
    """A finished request/response cycle."""

    id: str
    started_at: str | None = None
    duration: Number | None = None
    message: Message
    response_parts: list[ResponsePart]
    usage: UsageInfo | None = None
    state: TurnState
    error: ErrorInfo | None = None


class ActiveTurn(Wire, frozen=True, kw_only=True):
    """The turn in progress."""

    id: str
    started_at: str
    message: Message
    response_parts: list[ResponsePart]
    usage: UsageInfo | None = None


class SideChatSelection(Wire, frozen=True, kw_only=True):
    text: str
    response_part_id: str | None = None


class Origin(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """How a chat came into existence; tagged by ``kind``."""


class UserOrigin(Origin, frozen=True, kw_only=True, tag="user"):
    pass


class ForkOrigin(Origin, frozen=True, kw_only=True, tag="fork"):
    chat: URI
    turn_id: str


class SideChatOrigin(Origin, frozen=True, kw_only=True, tag="sideChat"):
    chat: URI
    turn_id: str
    selection: SideChatSelection | None = None


class ToolOrigin(Origin, frozen=True, kw_only=True, tag="tool"):
    chat: URI
    tool_call_id: str


ChatOrigin: TypeAlias = UserOrigin | ForkOrigin | SideChatOrigin | ToolOrigin

ChatInteractivity: TypeAlias = Literal["full", "read-only", "hidden"]


class ChatSummary(Wire, frozen=True, kw_only=True):
    """The catalog entry of a chat, carried in the session's ``chats``."""

    resource: URI
    title: str
    status: int
    activity: str | None = None
    modified_at: str
    origin: ChatOrigin | None = None
    interactivity: ChatInteractivity | None = None
    working_directories: list[URI] | None = None


class ChatSummaryChanges(Wire, frozen=True, kw_only=True):
    """``Partial<ChatSummary>``: a field left UNSET is not changed; a field
    sent as ``null`` is cleared."""

    resource: URI | msgspec.UnsetType = msgspec.UNSET
    title: str | msgspec.UnsetType = msgspec.UNSET
    status: int | msgspec.UnsetType = msgspec.UNSET
    activity: str | msgspec.UnsetType | None = msgspec.UNSET
    modified_at: str | msgspec.UnsetType = msgspec.UNSET
    origin: ChatOrigin | msgspec.UnsetType | None = msgspec.UNSET
    interactivity: ChatInteractivity | msgspec.UnsetType | None = msgspec.UNSET
    working_directories: list[URI] | msgspec.UnsetType | None = msgspec.UNSET


class ChatState(Wire, frozen=True, kw_only=True):
    """Full state of one chat; its summary fields are denormalized onto it."""

    resource: URI
    title: str
    status: int
    activity: str | None = None
    modified_at: str
    origin: ChatOrigin | None = None
    interactivity: ChatInteractivity | None = None
    working_directories: list[URI] | None = None
    turns: list[Turn]
    turns_next_cursor: str | None = None
    active_turn: ActiveTurn | None = None
    steering_message: PendingMessage | None = None
    queued_messages: list[PendingMessage] | None = None
    draft: Message | None = None
    meta: JsonObject | None = meta_field()
