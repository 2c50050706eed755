"""State of an AHP session channel (``ahp-session:/<id>``) and of the root
channel (``ahp-root://``).

Huddle reduces customizations, changesets, terminals, config schemas and
RFC 9728 metadata exactly as AHP does but does not interpret them, so they
are carried as JSON objects: whatever a newer peer puts in them survives.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from protocol.chat import (
    ChatSummary,
    InputRequest,
    ToolCallAuthRequired,
    ToolCallConfirmationState,
    ToolCallState,
)
from protocol.wire import URI, ConfigState, ErrorInfo, JsonObject, Wire, meta_field

SessionLifecycle: TypeAlias = Literal["creating", "ready", "creationFailed"]


class ToolAnnotations(Wire, frozen=True, kw_only=True):
    title: str | None = None
    read_only_hint: bool | None = None
    destructive_hint: bool | None = None
    idempotent_hint: bool | None = None
    open_world_hint: bool | None = None


class ToolDefinition(Wire, frozen=True, kw_only=True):
    name: str
    title: str | None = None
    description: str | None = None
    input_schema: JsonObject | None = None
    output_schema: JsonObject | None = None
    annotations: ToolAnnotations | None = None
    meta: JsonObject | None = meta_field()


class ActiveClient(Wire, frozen=True, kw_only=True):
    """A client connected to the session, with the tools it contributes."""

    client_id: str
    display_name: str | None = None
    tools: list[ToolDefinition]
    customizations: list[JsonObject] | None = None


class SessionInputNeeded(Wire, frozen=True, kw_only=True, tag_field="kind"):
    """An entry of the session's ``inputNeeded`` queue; tagged by ``kind``."""

    id: str
    chat: URI


class ChatInputNeeded(SessionInputNeeded, frozen=True, kw_only=True, tag="chatInput"):
    request: InputRequest


class ToolConfirmationNeeded(SessionInputNeeded, frozen=True, kw_only=True, tag="toolConfirmation"):
    turn_id: str
    tool_call: ToolCallConfirmationState


class ToolClientExecutionNeeded(
    SessionInputNeeded, frozen=True, kw_only=True, tag="toolClientExecution"
):
    turn_id: str
    client_id: str
    tool_call: ToolCallState


class ToolAuthenticationNeeded(
    SessionInputNeeded, frozen=True, kw_only=True, tag="toolAuthentication"
):
    turn_id: str
    tool_call: ToolCallAuthRequired


SessionInputRequest: TypeAlias = (
    ChatInputNeeded | ToolConfirmationNeeded | ToolClientExecutionNeeded | ToolAuthenticationNeeded
)


class ProjectInfo(Wire, frozen=True, kw_only=True):
    uri: URI
    display_name: str


class AnnotationsSummary(Wire, frozen=True, kw_only=True):
    resource: URI
    annotation_count: int
    entry_count: int


class SessionState(Wire, frozen=True, kw_only=True):
    """Full state of one session."""

    provider: str
    title: str
    status: int
    activity: str | None = None
    project: ProjectInfo | None = None
    working_directories: list[URI] | None = None
    annotations: AnnotationsSummary | None = None
    lifecycle: SessionLifecycle
    creation_error: ErrorInfo | None = None
    server_tools: list[ToolDefinition] | None = None
    active_clients: list[ActiveClient]
    chats: list[ChatSummary]
    default_chat: URI | None = None
    config: ConfigState | None = None
    customizations: list[JsonObject] | None = None
    changesets: list[JsonObject] | None = None
    input_needed: list[SessionInputRequest] | None = None
    meta: JsonObject | None = meta_field()


class ChangesSummary(Wire, frozen=True, kw_only=True):
    additions: int | None = None
    deletions: int | None = None
    files: int | None = None


class SessionSummary(Wire, frozen=True, kw_only=True):
    """A session as the sessions list (``listSessions``, root notices) shows it."""

    resource: URI
    provider: str
    title: str
    status: int
    activity: str | None = None
    project: ProjectInfo | None = None
    working_directories: list[URI] | None = None
    annotations: AnnotationsSummary | None = None
    created_at: str
    modified_at: str
    changes: ChangesSummary | None = None
    meta: JsonObject | None = meta_field()


# ─── Root channel ────────────────────────────────────────────────────────────


class SessionModelInfo(Wire, frozen=True, kw_only=True):
    id: str
    provider: str
    name: str
    max_context_window: int | None = None
    max_output_tokens: int | None = None
    max_prompt_tokens: int | None = None
    supports_vision: bool | None = None
    policy_state: Literal["enabled", "disabled", "unconfigured"] | None = None
    config_schema: JsonObject | None = None
    meta: JsonObject | None = meta_field()


class AgentInfo(Wire, frozen=True, kw_only=True):
    """An agent provider the host offers."""

    provider: str
    display_name: str
    description: str
    models: list[SessionModelInfo]
    protected_resources: list[JsonObject] | None = None
    customizations: list[JsonObject] | None = None
    capabilities: JsonObject | None = None


class RootState(Wire, frozen=True, kw_only=True):
    agents: list[AgentInfo]
    active_sessions: int | None = None
    terminals: list[JsonObject] | None = None
    config: ConfigState | None = None
    meta: JsonObject | None = meta_field()
