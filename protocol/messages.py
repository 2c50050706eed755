"""JSON-RPC 2.0 frames, AHP error codes, action envelopes, snapshots and the
params and results of the AHP commands Huddle serves.

A frame is decoded in two steps: first the JSON-RPC envelope, with ``params``
kept as raw JSON, then the params by method (see :mod:`protocol.codec`).
"""

from __future__ import annotations

from typing import Any, Final, Literal, TypeAlias

import msgspec

from protocol.actions import StateAction
from protocol.chat import ChatState, Message, Turn
from protocol.session import ActiveClient, RootState, SessionState, SessionSummary
from protocol.wire import URI, JsonObject, Number, Wire, meta_field

PROTOCOL_VERSION: Final = "0.7.0"
SUPPORTED_PROTOCOL_VERSIONS: Final = (PROTOCOL_VERSION,)


class ErrorCode:
    """JSON-RPC 2.0 and AHP error codes."""

    PARSE_ERROR: Final = -32700
    INVALID_REQUEST: Final = -32600
    METHOD_NOT_FOUND: Final = -32601
    INVALID_PARAMS: Final = -32602
    INTERNAL_ERROR: Final = -32603
    SESSION_NOT_FOUND: Final = -32001
    PROVIDER_NOT_FOUND: Final = -32002
    SESSION_ALREADY_EXISTS: Final = -32003
    TURN_IN_PROGRESS: Final = -32004
    UNSUPPORTED_PROTOCOL_VERSION: Final = -32005
    CONTENT_NOT_FOUND: Final = -32006
    AUTH_REQUIRED: Final = -32007
    NOT_FOUND: Final = -32008
    PERMISSION_DENIED: Final = -32009
    ALREADY_EXISTS: Final = -32010
    CONFLICT: Final = -32011


CLIENT_ID_PATH: Final = "$.params.clientId"
"""The ``data.path`` of the PERMISSION_DENIED error refusing a ``clientId``
that another token holds, at ``initialize`` or ``reconnect``: what tells it
from other refusals, so that a client starts again with a fresh id."""

RequestId: TypeAlias = int | str

# ─── JSON-RPC frames ─────────────────────────────────────────────────────────


class Frame(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Base of the JSON-RPC frames: every field is always written (JSON-RPC
    wants ``"jsonrpc": "2.0"`` on every message, ``"id": null`` when the
    request's id could not be read)."""


NO_PARAMS = msgspec.Raw(b"")


class Request(Wire, frozen=True, kw_only=True):
    """A request (with ``id``) or a notification (without); ``params`` stay
    raw JSON until the method is known (empty when absent)."""

    jsonrpc: Literal["2.0"]
    method: str
    id: RequestId | None = None
    params: msgspec.Raw = NO_PARAMS


class RpcError(Wire, frozen=True, kw_only=True):
    code: int
    message: str
    data: Any = None


class ErrorResponse(Frame, frozen=True, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId | None
    error: RpcError


class Response(Frame, frozen=True, kw_only=True):
    """A success response; ``result`` is any encodable value."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    result: Any


class Notification(Frame, frozen=True, kw_only=True):
    jsonrpc: Literal["2.0"] = "2.0"
    method: str
    params: Any


class IncomingResponse(Wire, frozen=True, kw_only=True):
    """A response as a client reads it: a result or an error."""

    jsonrpc: Literal["2.0"]
    id: RequestId | None = None
    result: msgspec.Raw = NO_PARAMS
    """Raw JSON of the result (empty for an error response)."""
    error: RpcError | None = None


# ─── Envelopes and snapshots ─────────────────────────────────────────────────


class ActionOrigin(Wire, frozen=True, kw_only=True):
    client_id: str
    client_seq: int


class ActionEnvelope(Wire, frozen=True, kw_only=True):
    """An action as every subscriber of ``channel`` receives it.

    ``server_seq`` is the channel's sequence number: per channel, strictly
    increasing with no gaps. A rejection carries ``rejection_reason``, goes
    only to its sender and repeats the channel's current seq.
    """

    channel: URI
    action: StateAction
    server_seq: int
    origin: ActionOrigin | None = None
    rejection_reason: str | None = None


ChannelState: TypeAlias = RootState | SessionState | ChatState


class Snapshot(Wire, frozen=True, kw_only=True):
    """A channel's state at ``from_seq``; later actions have a greater seq."""

    resource: URI
    state: ChannelState
    from_seq: int


# ─── Command params and results ──────────────────────────────────────────────


class Implementation(Wire, frozen=True, kw_only=True):
    name: str
    version: str | None = None
    title: str | None = None


class InitializeParams(Wire, frozen=True, kw_only=True):
    channel: URI
    protocol_versions: list[str]
    client_id: str
    client_info: Implementation | None = None
    initial_subscriptions: list[URI] | None = None
    locale: str | None = None
    capabilities: JsonObject | None = None


class InitializeResult(Wire, frozen=True, kw_only=True):
    protocol_version: str
    server_seq: int
    server_info: Implementation | None = None
    snapshots: list[Snapshot]
    meta: JsonObject | None = meta_field()
    """Huddle: which of the extensions the client asked for it serves
    (``{"huddle": {"extensions": [...]}}``); absent for plain AHP clients."""


class ChannelParams(Wire, frozen=True, kw_only=True):
    """Params of commands that name only their channel (``ping``,
    ``unsubscribe``, ``disposeSession``, ``disposeChat``)."""

    channel: URI


class SubscribeView(Wire, frozen=True, kw_only=True):
    turns: int | None = None


class DeliveryOptions(Wire, frozen=True, kw_only=True):
    max_latency_ms: int | None = None


class SubscribeParams(Wire, frozen=True, kw_only=True):
    channel: URI
    delivery: DeliveryOptions | None = None
    view: SubscribeView | None = None


class SubscribeResult(Wire, frozen=True, kw_only=True):
    snapshot: Snapshot | None = None


class DispatchActionParams(Wire, frozen=True, kw_only=True):
    channel: URI
    client_seq: int
    action: StateAction


class ChannelCursor(Wire, frozen=True, kw_only=True):
    """The last ``serverSeq`` a client saw on one channel."""

    channel: URI
    last_seen_server_seq: int


class ReconnectParams(Wire, frozen=True, kw_only=True):
    """Resume after a dropped connection.

    AHP's form: the last ``serverSeq`` the client saw and the channels it
    was subscribed to. Huddle's extension (``huddle.channelSeqs``): one
    cursor per channel, since Huddle's channel seqs are per channel.
    """

    channel: URI
    client_id: str
    last_seen_server_seq: int | None = None
    subscriptions: list[URI] | None = None
    cursors: list[ChannelCursor] | None = None


class ChannelResume(Wire, frozen=True, kw_only=True, tag_field="type"):
    """How one channel resumes; tagged by ``type``."""

    channel: URI


class ReplayResume(ChannelResume, frozen=True, kw_only=True, tag="replay"):
    """The store still held the gap: these envelopes follow the cursor."""

    actions: list[ActionEnvelope]


class SnapshotResume(ChannelResume, frozen=True, kw_only=True, tag="snapshot"):
    """The gap is gone (trimmed, or the log's epoch changed): start over."""

    snapshot: Snapshot


class MissingResume(ChannelResume, frozen=True, kw_only=True, tag="missing"):
    """The channel no longer exists."""


Resume: TypeAlias = ReplayResume | SnapshotResume | MissingResume


class ReconnectResult(Wire, frozen=True, kw_only=True):
    """Huddle's answer to per-channel cursors: how each channel resumes."""

    channels: list[Resume]


class ReconnectReplay(Wire, frozen=True, kw_only=True, tag_field="type", tag="replay"):
    """AHP: the envelopes missed since ``lastSeenServerSeq`` (every
    subscribed channel's, in order), and the subscriptions that are gone or
    no longer permitted."""

    actions: list[ActionEnvelope]
    missing: list[URI]


class ReconnectSnapshots(Wire, frozen=True, kw_only=True, tag_field="type", tag="snapshot"):
    """AHP: a fresh snapshot of every subscription that still exists."""

    snapshots: list[Snapshot]


class EmptyResult(Wire, frozen=True, kw_only=True):
    """AHP's ``{}`` result (``fetchTurns``)."""


class CreateSessionParams(Wire, frozen=True, kw_only=True):
    channel: URI
    provider: str | None = None
    working_directories: list[URI] | None = None
    config: JsonObject | None = None
    active_client: ActiveClient | None = None
    title: str | None = None
    fork: JsonObject | None = None
    """Kept only to be refused: Huddle forks no session."""


class CreateChatParams(Wire, frozen=True, kw_only=True):
    """Create the chat ``chat`` in the session named by ``channel``."""

    channel: URI
    chat: URI
    initial_message: Message | None = None
    working_directories: list[URI] | None = None
    title: str | None = None
    source: JsonObject | None = None
    """Kept only to be refused: no agent Huddle serves advertises
    ``multipleChats.fork`` or ``sideChat``, and AHP has the host reject an
    unsupported source."""


class ListSessionsParams(Wire, frozen=True, kw_only=True):
    channel: URI
    limit: int | None = None
    cursor: str | None = None


class ListSessionsResult(Wire, frozen=True, kw_only=True):
    items: list[SessionSummary]
    next_cursor: str | None = None


class FetchTurnsParams(Wire, frozen=True, kw_only=True):
    channel: URI
    cursor: str | None = None
    limit: int | None = None


class ExpireParams(Wire, frozen=True, kw_only=True):
    """Huddle's ``huddle/expire`` (extension ``huddle.expiry``): give the
    open input request ``request_id`` (or the tool call ``tool_call_id``
    waiting for approval) of chat ``channel`` an expiry."""

    channel: URI
    seconds: Number
    request_id: str | None = None
    tool_call_id: str | None = None
    on_expiry: Literal["cancel", "decline", "fail"] = "cancel"


class ExpireResult(Wire, frozen=True, kw_only=True):
    expires_at: int
    """When the policy applies, ms since the epoch (the server's clock)."""


class FetchTurnsResult(Wire, frozen=True, kw_only=True):
    """Huddle's ``fetchTurns`` page (extension ``huddle.turnsPage``): the
    older turns, returned to the caller, and the cursor before them."""

    turns: list[Turn]
    turns_next_cursor: str | None = None


# ─── Root notifications ──────────────────────────────────────────────────────


class SessionAddedParams(Wire, frozen=True, kw_only=True):
    channel: URI
    summary: SessionSummary


class SessionRemovedParams(Wire, frozen=True, kw_only=True):
    channel: URI
    session: URI


class SessionSummaryChangedParams(Wire, frozen=True, kw_only=True):
    channel: URI
    session: URI
    changes: JsonObject
