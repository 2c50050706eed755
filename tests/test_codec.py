"""Wire types and codecs: round-trips, JSON names and tags, malformed frames,
channel URIs, and unknown response parts kept in stored state.

The strategies here build any well-typed value of every wire Struct from its
msgspec type information (:class:`WireStrategies`); the reducer property tests
reuse them with tighter id pools.
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Union, get_args, get_origin

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import actions, chat, messages, session, wire
from protocol.actions import (
    ACTION_TYPES,
    ChatDelta,
    ChatToolCallConfirmed,
    ChatToolCallStart,
    ChatTruncated,
    action_type,
    is_client_dispatchable,
)
from protocol.chat import (
    KNOWN_PART_KINDS,
    AsRead,
    ChatState,
    ChatSummaryChanges,
    Message,
    UnknownPart,
)
from protocol.codec import (
    PARAMS,
    UNKNOWN_KIND,
    MalformedFrame,
    convert,
    convert_state,
    decode_action,
    decode_envelope,
    decode_json,
    decode_params,
    decode_request,
    decode_response,
    decode_snapshot,
    decode_state,
    encode,
    nested_too_deep,
    to_builtins,
)
from protocol.messages import (
    NO_PARAMS,
    ActionEnvelope,
    ChannelState,
    ErrorCode,
    ErrorResponse,
    Notification,
    Request,
    Response,
    RpcError,
    Snapshot,
)
from protocol.session import RootState, SessionState
from protocol.uris import (
    ROOT_URI,
    BadChannelUri,
    channel_id,
    channel_kind,
    chat_uri,
    session_uri,
)
from protocol.wire import Wire
from reducers.chat import reduce_chat

# ─── Strategies for every wire Struct ────────────────────────────────────────

JSON_LEAVES: st.SearchStrategy[Any] = (
    st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=4), inner, max_size=2)
    ),
    max_leaves=4,
)
"""JSON payloads we carry without interpreting. No ``null``: a null inside
an opaque payload would hide a null the encoder wrote for an absent field."""

SHORT_TEXT = st.text(max_size=6)
FieldKey = tuple[type[msgspec.Struct], str]


class WireStrategies:
    """Strategies for wire Structs, read off their msgspec type information.

    ``classes`` replaces the strategy of a whole Struct class wherever it
    appears; ``fields`` replaces one field of one class; ``names`` replaces
    every field of that name in any class. Optional fields are sometimes left
    out, so defaults are exercised too.
    """

    def __init__(
        self,
        *,
        classes: Mapping[type[Any], st.SearchStrategy[Any]] | None = None,
        fields: Mapping[FieldKey, st.SearchStrategy[Any]] | None = None,
        names: Mapping[str, st.SearchStrategy[Any]] | None = None,
        text: st.SearchStrategy[str] = SHORT_TEXT,
    ) -> None:
        self.classes = dict(classes or {})
        self.fields = dict(fields or {})
        self.names = dict(names or {})
        self.text = text
        self._built: dict[type[Any], st.SearchStrategy[Any]] = {}

    def of(self, cls: type[Any]) -> st.SearchStrategy[Any]:
        """Any value of the Struct class ``cls``."""
        if cls in self.classes:
            return self.classes[cls]
        if cls not in self._built:
            self._built[cls] = st.deferred(lambda: self.build(cls))
        return self._built[cls]

    def build(self, cls: type[Any], **fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        """Values of ``cls`` ignoring its class override; ``fixed`` fields
        are always given, from the strategies passed."""
        required: dict[str, st.SearchStrategy[Any]] = {}
        optional: dict[str, st.SearchStrategy[Any]] = {}
        for field in msgspec.structs.fields(cls):
            strategy = fixed.get(field.name)
            if strategy is None:
                strategy = self.fields.get((cls, field.name))
            if strategy is None:
                strategy = self.names.get(field.name)
            if strategy is None:
                strategy = self.of_annotation(field.type)
            target = required if field.required or field.name in fixed else optional
            target[field.name] = strategy
        return st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))

    def of_annotation(self, annotation: Any) -> st.SearchStrategy[Any]:
        # Unions and lists are read off the annotation itself: msgspec cannot
        # describe a union of untagged Structs (the three channel states).
        args = get_args(annotation)
        if get_origin(annotation) in (Union, types.UnionType):
            return st.one_of([self.of_annotation(arg) for arg in args])
        if get_origin(annotation) is list:
            return st.lists(self.of_annotation(args[0]), max_size=2)
        if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
            return self.of(annotation)
        if annotation is msgspec.UnsetType:
            return st.just(msgspec.UNSET)
        return self.of_info(mi.type_info(annotation))

    def of_info(self, info: mi.Type) -> st.SearchStrategy[Any]:
        match info:
            case mi.StructType():
                return self.of(info.cls)
            case mi.UnionType():
                return st.one_of([self.of_info(t) for t in info.types])
            case mi.ListType():
                return st.lists(self.of_info(info.item_type), max_size=2)
            case mi.DictType():
                keys, values = self.of_info(info.key_type), self.of_info(info.value_type)
                return st.dictionaries(keys, values, max_size=2)
            case mi.LiteralType():
                return st.sampled_from(info.values)
            case mi.StrType():
                return self.text
            case mi.BoolType():
                return st.booleans()
            case mi.IntType():
                return st.integers(min_value=-(2**53), max_value=2**53)
            case mi.FloatType():
                return st.floats(allow_nan=False, allow_infinity=False)
            case mi.NoneType():
                return st.none()
            case mi.AnyType():
                return JSON_VALUES
            case mi.RawType():
                return JSON_VALUES.map(lambda v: msgspec.Raw(msgspec.json.encode(v)))
        raise NotImplementedError(f"no strategy for {info!r}")


UNKNOWN_PART_RAW = st.fixed_dictionaries(
    {"kind": st.sampled_from(["huddle/poll", "terminalSnapshot", "x-from-the-future"])},
    optional={"id": st.text(max_size=4), "payload": JSON_VALUES},
)
"""Parts a newer peer may write: their kind is none we know."""


def confirmations(strategies: WireStrategies) -> st.SearchStrategy[ChatToolCallConfirmed]:
    """Approvals carry ``confirmed``, denials a denial reason (AHP's two
    variants of ``chat/toolCallConfirmed``)."""
    return st.one_of(
        strategies.build(
            ChatToolCallConfirmed,
            approved=st.just(True),
            confirmed=st.sampled_from(["not-needed", "user-action", "setting"]),
        ),
        strategies.build(
            ChatToolCallConfirmed,
            approved=st.just(False),
            reason=st.sampled_from(["denied", "skipped"]),
        ),
    )


def wire_strategies(**kwargs: Any) -> WireStrategies:
    """A :class:`WireStrategies` that builds only valid confirmations and
    unknown parts of unknown kinds; ``kwargs`` as for the class."""
    strategies = WireStrategies(**kwargs)
    strategies.classes.setdefault(ChatToolCallConfirmed, confirmations(strategies))
    strategies.classes.setdefault(
        UnknownPart, st.builds(UnknownPart, raw=UNKNOWN_PART_RAW.map(AsRead))
    )
    return strategies


ANY = wire_strategies()
KNOWN_PARTS_ONLY = wire_strategies(classes={UnknownPart: st.nothing()})
"""Values the strict decoders read back: a part of an unknown kind is written
as it was read, and only :func:`protocol.codec.convert_state` reads it again."""


def wire_classes() -> list[type[msgspec.Struct]]:
    """Every Struct the wire modules define (forms are not wire types)."""
    found: list[type[msgspec.Struct]] = []
    for module in (wire, chat, session, actions, messages):
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, msgspec.Struct)
                and value.__module__ == module.__name__
            ):
                found.append(value)
    return found


WIRE_CLASSES = wire_classes()
HOLDS_A_SNAPSHOT = {
    messages.Snapshot,
    messages.InitializeResult,
    messages.SubscribeResult,
    messages.SnapshotResume,
    messages.ReconnectResult,
    messages.ReconnectSnapshots,
}
"""Results whose snapshot ``state`` is the untagged union of the three channel
states: msgspec encodes them but cannot build a decoder for them, so a client
reads their snapshots with :func:`protocol.codec.decode_snapshot`."""

HOLDS_RAW = {messages.Request, messages.IncomingResponse}
"""Frames that keep a member as raw JSON, which has no builtins form."""

ROUND_TRIPPING = [
    cls
    for cls in WIRE_CLASSES
    if cls not in HOLDS_A_SNAPSHOT and cls not in {messages.IncomingResponse, UnknownPart}
]
"""Every Struct msgspec can decode; IncomingResponse is left out until its
``result`` decodes (see ``test_response_with_a_result_decodes``), UnknownPart
because it is written as the part it was read from."""

ROUND_TRIP = settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
"""For the tests parametrised over every Struct: a few examples each."""

STATE_ROUND_TRIP = settings(ROUND_TRIP, max_examples=100)
"""For channel states and envelopes, which nest most other Structs."""


def by_name(classes: Iterable[type[Any]]) -> list[Any]:
    return [pytest.param(cls, id=cls.__name__) for cls in sorted(classes, key=lambda c: c.__name__)]


# ─── Round-trips ─────────────────────────────────────────────────────────────


@pytest.mark.parametrize("cls", by_name(ROUND_TRIPPING))
@ROUND_TRIP
@given(data=st.data())
def test_struct_round_trips_through_json(cls: type[Wire], data: st.DataObject) -> None:
    value = data.draw(KNOWN_PARTS_ONLY.of(cls))
    assert msgspec.json.decode(encode(value), type=cls) == value


@pytest.mark.parametrize("cls", by_name(set(ROUND_TRIPPING) - HOLDS_RAW))
@ROUND_TRIP
@given(data=st.data())
def test_struct_round_trips_through_builtins(cls: type[Wire], data: st.DataObject) -> None:
    value = data.draw(KNOWN_PARTS_ONLY.of(cls))
    assert convert(to_builtins(value), cls) == value


@pytest.mark.parametrize("cls", by_name(set(ACTION_TYPES.values())))
@ROUND_TRIP
@given(data=st.data())
def test_action_round_trips_through_the_action_decoder(
    cls: type[Wire], data: st.DataObject
) -> None:
    value = data.draw(KNOWN_PARTS_ONLY.of(cls))
    assert decode_action(encode(value)) == value


@STATE_ROUND_TRIP
@given(envelope=KNOWN_PARTS_ONLY.of(ActionEnvelope))
def test_envelope_round_trips_through_the_envelope_decoder(envelope: ActionEnvelope) -> None:
    assert decode_envelope(encode(envelope)) == envelope


CHANNELS: dict[type[Any], str] = {
    RootState: ROOT_URI,
    SessionState: "ahp-session:/acme",
    ChatState: "ahp-chat:/t-1",
}
STATE_KIND: dict[type[Any], str] = {RootState: "root", SessionState: "session", ChatState: "chat"}


@pytest.mark.parametrize("cls", by_name(set(CHANNELS)))
@STATE_ROUND_TRIP
@given(data=st.data())
def test_snapshot_round_trips_through_decode_snapshot(
    cls: type[ChannelState], data: st.DataObject
) -> None:
    state = data.draw(ANY.of(cls))
    written = {"resource": CHANNELS[cls], "state": to_builtins(state), "fromSeq": 3}
    assert decode_snapshot(written) == Snapshot(resource=CHANNELS[cls], state=state, from_seq=3)


@pytest.mark.parametrize("cls", by_name(set(CHANNELS)))
@STATE_ROUND_TRIP
@given(data=st.data())
def test_state_round_trips_through_decode_state(
    cls: type[ChannelState], data: st.DataObject
) -> None:
    state = data.draw(ANY.of(cls))
    assert decode_state(CHANNELS[cls], encode(state)) == state


@pytest.mark.parametrize("cls", by_name(set(CHANNELS)))
@STATE_ROUND_TRIP
@given(data=st.data())
def test_state_round_trips_through_stored_builtins(
    cls: type[ChannelState], data: st.DataObject
) -> None:
    state = data.draw(ANY.of(cls))
    stored = json.loads(json.dumps(to_builtins(state)))
    assert convert_state(stored, STATE_KIND[cls]) == state


def test_only_results_holding_a_snapshot_lack_a_decoder() -> None:
    undecodable = set()
    for cls in WIRE_CLASSES:
        try:
            msgspec.json.Decoder(cls)
        except TypeError:
            undecodable.add(cls)
    assert undecodable == HOLDS_A_SNAPSHOT


# ─── JSON-RPC frames ─────────────────────────────────────────────────────────

OUTGOING = [
    pytest.param(Response(id=7, result={"ok": True}), id="Response"),
    pytest.param(Notification(method="action", params={"channel": ROOT_URI}), id="Notification"),
    pytest.param(
        ErrorResponse(id=7, error=RpcError(code=ErrorCode.INVALID_PARAMS, message="bad")),
        id="ErrorResponse",
    ),
]


@pytest.mark.parametrize("frame", OUTGOING)
def test_outgoing_frame_says_jsonrpc_2_0(frame: msgspec.Struct) -> None:
    assert json.loads(encode(frame))["jsonrpc"] == "2.0"


def test_error_response_for_an_unreadable_request_has_a_null_id() -> None:
    frame = ErrorResponse(id=None, error=RpcError(code=ErrorCode.PARSE_ERROR, message="bad"))
    assert json.loads(encode(frame))["id"] is None


def test_success_response_always_has_a_result() -> None:
    assert "result" in json.loads(encode(Response(id=1, result=None)))


def test_request_without_params_has_empty_raw_params() -> None:
    request = decode_request(b'{"jsonrpc":"2.0","method":"ping","id":"r1"}')
    assert request == Request(jsonrpc="2.0", method="ping", id="r1")
    assert not request.params


def test_request_keeps_its_params_raw_until_the_method_is_known() -> None:
    request = decode_request(b'{"jsonrpc":"2.0","method":"ping","id":1,"params":{"channel":"x"}}')
    assert bytes(request.params) == b'{"channel":"x"}'


def test_response_with_a_result_decodes() -> None:
    response = decode_response(b'{"jsonrpc":"2.0","id":1,"result":{"snapshot":null}}')
    assert response.result is not None


def test_error_response_decodes_for_a_client() -> None:
    response = decode_response(b'{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no"}}')
    assert response.error == RpcError(code=-32601, message="no")


# ─── Absent fields, names and tags on the wire ───────────────────────────────


def structs_in(value: Any) -> Iterator[msgspec.Struct]:
    """``value`` and every Struct nested in it."""
    if isinstance(value, msgspec.Struct):
        yield value
        for name in value.__struct_fields__:
            yield from structs_in(getattr(value, name))
    elif isinstance(value, list):
        for item in value:
            yield from structs_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from structs_in(item)


@pytest.mark.parametrize("cls", by_name(WIRE_CLASSES))
@ROUND_TRIP
@given(data=st.data())
def test_absent_optional_fields_are_left_out_never_null(
    cls: type[Wire], data: st.DataObject
) -> None:
    for struct in structs_in(data.draw(ANY.of(cls))):
        written = json.loads(encode(struct))
        for field in msgspec.structs.fields(struct):
            value = getattr(struct, field.name)
            if (value is None and field.default is None) or value is msgspec.UNSET:
                assert field.encode_name not in written, f"{type(struct).__name__}.{field.name}"


def test_a_minimal_chat_state_writes_only_its_required_fields() -> None:
    state = ChatState(resource="ahp-chat:/t-1", title="Order", status=1, modified_at="z", turns=[])
    assert encode(state) == (
        b'{"resource":"ahp-chat:/t-1","title":"Order","status":1,"modifiedAt":"z","turns":[]}'
    )


def test_chat_summary_changes_write_only_what_they_change_and_null_to_clear() -> None:
    changes = ChatSummaryChanges(title="Escalated", activity=None)
    assert json.loads(encode(changes)) == {"title": "Escalated", "activity": None}


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


@pytest.mark.parametrize("cls", by_name(WIRE_CLASSES))
def test_fields_are_camel_case_and_meta_is_underscore_meta(cls: type[Wire]) -> None:
    for field in msgspec.structs.fields(cls):
        wanted = "_meta" if field.name == "meta" else camel(field.name)
        assert field.encode_name == wanted, f"{cls.__name__}.{field.name}"


AHP_NAMES = [
    (chat.ToolCallPendingResultConfirmation, "past_tense_message", "pastTenseMessage"),
    (chat.ToolCallPendingConfirmation, "confirmation_title", "confirmationTitle"),
    (chat.ChatState, "turns_next_cursor", "turnsNextCursor"),
    (chat.MultiSelectQuestion, "allow_freeform_input", "allowFreeformInput"),
    (chat.SelectedManyValue, "freeform_values", "freeformValues"),
    (chat.McpAuthRequirement, "required_scopes", "requiredScopes"),
    (chat.ChatAttachment, "end_turn", "endTurn"),
    (session.SessionState, "input_needed", "inputNeeded"),
    (session.ToolAnnotations, "open_world_hint", "openWorldHint"),
    (actions.ChatToolCallConfirmed, "edited_tool_input", "editedToolInput"),
    (actions.ChatToolCallComplete, "requires_result_confirmation", "requiresResultConfirmation"),
    (actions.ChatTurnStarted, "queued_message_id", "queuedMessageId"),
    (actions.SessionMetaChanged, "meta", "_meta"),
    (messages.ChannelCursor, "last_seen_server_seq", "lastSeenServerSeq"),
    (messages.ActionEnvelope, "rejection_reason", "rejectionReason"),
]


@pytest.mark.parametrize(
    ("cls", "field", "wire_name"),
    [pytest.param(c, f, n, id=f"{c.__name__}.{f}") for c, f, n in AHP_NAMES],
)
def test_field_has_its_ahp_wire_name(cls: type[Wire], field: str, wire_name: str) -> None:
    names = {f.name: f.encode_name for f in msgspec.structs.fields(cls)}
    assert names[field] == wire_name


AHP_ACTIONS: list[tuple[type[Wire], str, bool]] = [
    (actions.RootAgentsChanged, "root/agentsChanged", False),
    (actions.RootActiveSessionsChanged, "root/activeSessionsChanged", False),
    (actions.RootTerminalsChanged, "root/terminalsChanged", False),
    (actions.RootConfigChanged, "root/configChanged", True),
    (actions.SessionReady, "session/ready", False),
    (actions.SessionCreationFailed, "session/creationFailed", False),
    (actions.SessionChatAdded, "session/chatAdded", False),
    (actions.SessionChatRemoved, "session/chatRemoved", False),
    (actions.SessionChatUpdated, "session/chatUpdated", False),
    (actions.SessionDefaultChatChanged, "session/defaultChatChanged", False),
    (actions.SessionTitleChanged, "session/titleChanged", True),
    (actions.SessionIsReadChanged, "session/isReadChanged", True),
    (actions.SessionIsArchivedChanged, "session/isArchivedChanged", True),
    (actions.SessionActivityChanged, "session/activityChanged", False),
    (actions.SessionChangesetsChanged, "session/changesetsChanged", False),
    (actions.SessionServerToolsChanged, "session/serverToolsChanged", False),
    (actions.SessionActiveClientSet, "session/activeClientSet", True),
    (actions.SessionActiveClientRemoved, "session/activeClientRemoved", True),
    (actions.SessionWorkingDirectorySet, "session/workingDirectorySet", True),
    (actions.SessionWorkingDirectoryRemoved, "session/workingDirectoryRemoved", True),
    (actions.SessionInputNeededSet, "session/inputNeededSet", False),
    (actions.SessionInputNeededRemoved, "session/inputNeededRemoved", False),
    (actions.SessionCustomizationsChanged, "session/customizationsChanged", False),
    (actions.SessionCustomizationToggled, "session/customizationToggled", True),
    (actions.SessionCustomizationUpdated, "session/customizationUpdated", False),
    (actions.SessionCustomizationRemoved, "session/customizationRemoved", False),
    (actions.SessionMcpServerStateChanged, "session/mcpServerStateChanged", False),
    (actions.SessionMcpServerStartRequested, "session/mcpServerStartRequested", True),
    (actions.SessionMcpServerStopRequested, "session/mcpServerStopRequested", True),
    (actions.SessionConfigChanged, "session/configChanged", True),
    (actions.SessionMetaChanged, "session/metaChanged", False),
    (actions.ChatTurnStarted, "chat/turnStarted", True),
    (actions.ChatDelta, "chat/delta", False),
    (actions.ChatResponsePart, "chat/responsePart", False),
    (actions.ChatReasoning, "chat/reasoning", False),
    (actions.ChatUsage, "chat/usage", False),
    (actions.ChatTurnComplete, "chat/turnComplete", False),
    (actions.ChatTurnCancelled, "chat/turnCancelled", True),
    (actions.ChatError, "chat/error", False),
    (actions.ChatActivityChanged, "chat/activityChanged", False),
    (actions.ChatWorkingDirectorySet, "chat/workingDirectorySet", True),
    (actions.ChatWorkingDirectoryRemoved, "chat/workingDirectoryRemoved", True),
    (actions.ChatTruncated, "chat/truncated", True),
    (actions.ChatTurnsLoaded, "chat/turnsLoaded", False),
    (actions.ChatToolCallStart, "chat/toolCallStart", False),
    (actions.ChatToolCallDelta, "chat/toolCallDelta", False),
    (actions.ChatToolCallReady, "chat/toolCallReady", False),
    (actions.ChatToolCallConfirmed, "chat/toolCallConfirmed", True),
    (actions.ChatToolCallComplete, "chat/toolCallComplete", True),
    (actions.ChatToolCallResultConfirmed, "chat/toolCallResultConfirmed", True),
    (actions.ChatToolCallContentChanged, "chat/toolCallContentChanged", True),
    (actions.ChatToolCallAuthRequired, "chat/toolCallAuthRequired", False),
    (actions.ChatToolCallAuthResolved, "chat/toolCallAuthResolved", False),
    (actions.ChatPendingMessageSet, "chat/pendingMessageSet", True),
    (actions.ChatPendingMessageRemoved, "chat/pendingMessageRemoved", True),
    (actions.ChatQueuedMessagesReordered, "chat/queuedMessagesReordered", True),
    (actions.ChatDraftChanged, "chat/draftChanged", True),
    (actions.ChatInputRequested, "chat/inputRequested", False),
    (actions.ChatInputAnswerChanged, "chat/inputAnswerChanged", True),
    (actions.ChatInputCompleted, "chat/inputCompleted", True),
]
"""Every root, session and chat action with AHP 0.7's ``ActionType`` string
and whether AHP lets a client dispatch it."""


def test_the_action_table_lists_every_action_once() -> None:
    assert sorted(name for _, name, _ in AHP_ACTIONS) == sorted(ACTION_TYPES)


@pytest.mark.parametrize(
    ("cls", "wire_type"), [pytest.param(c, t, id=t) for c, t, _ in AHP_ACTIONS]
)
def test_action_is_tagged_with_its_ahp_type(cls: type[Wire], wire_type: str) -> None:
    assert cls.__struct_config__.tag_field == "type"
    assert cls.__struct_config__.tag == wire_type
    assert ACTION_TYPES[wire_type] is cls


@pytest.mark.parametrize(
    ("cls", "dispatchable"), [pytest.param(c, d, id=t) for c, t, d in AHP_ACTIONS]
)
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_client_may_dispatch_exactly_the_ahp_client_actions(
    cls: type[Wire], dispatchable: bool, data: st.DataObject
) -> None:
    assert is_client_dispatchable(data.draw(ANY.of(cls))) is dispatchable


def test_action_type_reads_the_tag_of_an_action() -> None:
    assert action_type(ChatTruncated()) == "chat/truncated"


AHP_TAGS: list[tuple[type[Wire], str, str]] = [
    (chat.MarkdownPart, "kind", "markdown"),
    (chat.ContentRefPart, "kind", "contentRef"),
    (chat.ToolCallPart, "kind", "toolCall"),
    (chat.ReasoningPart, "kind", "reasoning"),
    (chat.SystemNotificationPart, "kind", "systemNotification"),
    (chat.InputRequestPart, "kind", "inputRequest"),
    (chat.ToolCallStreaming, "status", "streaming"),
    (chat.ToolCallPendingConfirmation, "status", "pending-confirmation"),
    (chat.ToolCallRunning, "status", "running"),
    (chat.ToolCallAuthRequired, "status", "auth-required"),
    (chat.ToolCallPendingResultConfirmation, "status", "pending-result-confirmation"),
    (chat.ToolCallCompleted, "status", "completed"),
    (chat.ToolCallCancelled, "status", "cancelled"),
    (chat.TextQuestion, "kind", "text"),
    (chat.NumberQuestion, "kind", "number"),
    (chat.IntegerQuestion, "kind", "integer"),
    (chat.BooleanQuestion, "kind", "boolean"),
    (chat.SingleSelectQuestion, "kind", "single-select"),
    (chat.MultiSelectQuestion, "kind", "multi-select"),
    (chat.TextValue, "kind", "text"),
    (chat.NumberValue, "kind", "number"),
    (chat.BooleanValue, "kind", "boolean"),
    (chat.SelectedValue, "kind", "selected"),
    (chat.SelectedManyValue, "kind", "selected-many"),
    (chat.SimpleAttachment, "type", "simple"),
    (chat.EmbeddedResourceAttachment, "type", "embeddedResource"),
    (chat.ResourceAttachment, "type", "resource"),
    (chat.AnnotationsAttachment, "type", "annotations"),
    (chat.ChatAttachment, "type", "chat"),
    (chat.TextContent, "type", "text"),
    (chat.EmbeddedResourceContent, "type", "embeddedResource"),
    (chat.ResourceContent, "type", "resource"),
    (chat.FileEditContent, "type", "fileEdit"),
    (chat.TerminalContent, "type", "terminal"),
    (chat.SubagentContent, "type", "subagent"),
    (chat.UserOrigin, "kind", "user"),
    (chat.ForkOrigin, "kind", "fork"),
    (chat.SideChatOrigin, "kind", "sideChat"),
    (chat.ToolOrigin, "kind", "tool"),
    (chat.ClientContributor, "kind", "client"),
    (chat.McpContributor, "kind", "mcp"),
    (chat.RiskAssessmentLoading, "status", "loading"),
    (chat.RiskAssessmentComplete, "status", "complete"),
    (session.ChatInputNeeded, "kind", "chatInput"),
    (session.ToolConfirmationNeeded, "kind", "toolConfirmation"),
    (session.ToolClientExecutionNeeded, "kind", "toolClientExecution"),
    (session.ToolAuthenticationNeeded, "kind", "toolAuthentication"),
]


@pytest.mark.parametrize(
    ("cls", "tag_field", "tag"),
    [pytest.param(c, f, t, id=f"{c.__name__}={t}") for c, f, t in AHP_TAGS],
)
def test_union_member_is_tagged_as_ahp_spells_it(cls: type[Wire], tag_field: str, tag: str) -> None:
    assert (cls.__struct_config__.tag_field, cls.__struct_config__.tag) == (tag_field, tag)


def test_known_part_kinds_are_the_ahp_part_tags() -> None:
    part_tags = {tag for cls, field, tag in AHP_TAGS if issubclass(cls, chat.Part)}
    assert part_tags == KNOWN_PART_KINDS


def test_approval_without_confirmed_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="an approval needs `confirmed`"):
        ChatToolCallConfirmed(turn_id="t", tool_call_id="c", approved=True)


def test_denial_without_a_denial_reason_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="a denial needs `reason` 'denied' or 'skipped'"):
        ChatToolCallConfirmed(turn_id="t", tool_call_id="c", approved=False, reason="result-denied")


# ─── Malformed frames ────────────────────────────────────────────────────────


def malformed(decode: Any, *args: Any) -> MalformedFrame:
    with pytest.raises(MalformedFrame) as info:
        decode(*args)
    return info.value


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(b"[1,2]", "Expected `object`, got `array`", id="batch"),
        pytest.param(
            b'{"jsonrpc":"2.0","id":1}', "Object missing required field `method`", id="no-method"
        ),
        pytest.param(
            b'{"method":"ping","id":1}', "Object missing required field `jsonrpc`", id="no-jsonrpc"
        ),
    ],
)
def test_request_that_is_not_json_rpc_is_an_invalid_request_at_the_root(
    frame: bytes, reason: str
) -> None:
    error = malformed(decode_request, frame)
    assert (error.code, error.reason, error.path) == (ErrorCode.INVALID_REQUEST, reason, "$")


@pytest.mark.parametrize(
    ("frame", "path"),
    [
        pytest.param(b'{"jsonrpc":"1.0","method":"ping"}', "$.jsonrpc", id="old-version"),
        pytest.param(b'{"jsonrpc":"2.0","method":"ping","id":true}', "$.id", id="boolean-id"),
        pytest.param(b'{"jsonrpc":"2.0","method":7}', "$.method", id="numeric-method"),
    ],
)
def test_request_with_a_bad_member_names_it(frame: bytes, path: str) -> None:
    error = malformed(decode_request, frame)
    assert (error.code, error.path) == (ErrorCode.INVALID_REQUEST, path)


def test_frame_that_is_not_json_is_a_parse_error() -> None:
    error = malformed(decode_request, b'{"jsonrpc":"2.0",')
    assert (error.code, error.path) == (ErrorCode.PARSE_ERROR, None)
    assert error.reason.startswith("invalid JSON: ")
    assert str(error) == error.reason


def dispatch(action: str) -> bytes:
    return b'{"channel":"ahp-chat:/t-1","clientSeq":4,"action":' + action.encode() + b"}"


BAD_PARAMS = [
    pytest.param(
        "dispatchAction",
        dispatch('{"type":"chat/delta","turnId":5,"partId":"p","content":"x"}'),
        "$.params.action.turnId",
        "Expected `str`, got `int`",
        id="action-field-type",
    ),
    pytest.param(
        "dispatchAction",
        dispatch('{"type":"chat/fromTheFuture"}'),
        "$.params.action.type",
        "Invalid value 'chat/fromTheFuture'",
        id="unknown-action-type",
    ),
    pytest.param(
        "dispatchAction",
        dispatch(
            '{"type":"chat/inputCompleted","requestId":"r","response":"accept",'
            '"answers":{"q":{"state":"draft","value":{"kind":"txt"}}}}'
        ),
        "$.params.action.answers[...].value.kind",
        "Invalid value 'txt'",
        id="answer-value-kind",
    ),
    pytest.param(
        "dispatchAction",
        dispatch('{"type":"chat/toolCallConfirmed","turnId":"t","toolCallId":"c","approved":true}'),
        "$.params.action",
        "an approval needs `confirmed`",
        id="approval-without-confirmed",
    ),
    pytest.param(
        "dispatchAction",
        b'{"channel":"ahp-chat:/t-1","clientSeq":"4","action":{"type":"chat/truncated"}}',
        "$.params.clientSeq",
        "Expected `int`, got `str`",
        id="client-seq-as-string",
    ),
    pytest.param(
        "subscribe",
        b'{"channel":"ahp-chat:/t-1","view":{"turns":1.5}}',
        "$.params.view.turns",
        "Expected `int | null`, got `float`",
        id="subscribe-view",
    ),
    pytest.param(
        "reconnect",
        b'{"channel":"ahp-root://","clientId":"c","cursors":[{"channel":"ahp-chat:/t-1"}]}',
        "$.params.cursors[0]",
        "Object missing required field `lastSeenServerSeq`",
        id="reconnect-cursor",
    ),
    pytest.param(
        "initialize",
        b'{"channel":"ahp-root://","clientId":"c"}',
        "$.params",
        "Object missing required field `protocolVersions`",
        id="initialize-missing-field",
    ),
]


@pytest.mark.parametrize(("method", "params", "path", "reason"), BAD_PARAMS)
def test_params_that_do_not_fit_name_the_bad_field(
    method: str, params: bytes, path: str, reason: str
) -> None:
    error = malformed(decode_params, method, msgspec.Raw(params))
    assert (error.code, error.path, error.reason) == (ErrorCode.INVALID_PARAMS, path, reason)
    assert str(error) == f"{reason} - at `{path}`"


def test_unknown_method_is_method_not_found() -> None:
    error = malformed(decode_params, "chat/deleteEverything", msgspec.Raw(b"{}"))
    assert (error.code, error.path) == (ErrorCode.METHOD_NOT_FOUND, None)
    assert error.reason == "unknown method 'chat/deleteEverything'"


def test_served_method_without_params_is_invalid_params() -> None:
    error = malformed(decode_params, "subscribe", NO_PARAMS)
    assert (error.code, error.reason, error.path) == (
        ErrorCode.INVALID_PARAMS,
        "missing params",
        "$.params",
    )


def test_host_serves_the_ahp_commands_and_its_own_under_huddle() -> None:
    assert {method for method in PARAMS if not method.startswith("huddle/")} == {
        "initialize",
        "ping",
        "subscribe",
        "unsubscribe",
        "dispatchAction",
        "reconnect",
        "createSession",
        "disposeSession",
        "createChat",
        "disposeChat",
        "listSessions",
        "fetchTurns",
    }
    assert {method for method in PARAMS if method.startswith("huddle/")} == {"huddle/expire"}


def test_action_that_does_not_fit_names_the_field_from_the_action() -> None:
    error = malformed(decode_action, b'{"type":"chat/truncated","turnId":1}')
    assert (error.code, error.path) == (ErrorCode.INVALID_PARAMS, "$.turnId")


def test_envelope_that_does_not_fit_names_the_field() -> None:
    frame = b'{"channel":"ahp-chat:/t-1","serverSeq":1,"action":{"type":"chat/delta"}}'
    error = malformed(decode_envelope, frame)
    assert (error.code, error.path) == (ErrorCode.INVALID_PARAMS, "$.action")
    assert error.reason == "Object missing required field `turnId`"


def test_response_that_is_not_json_rpc_is_an_invalid_request() -> None:
    error = malformed(decode_response, b'{"id":1}')
    assert (error.code, error.path) == (ErrorCode.INVALID_REQUEST, "$")


def test_state_of_a_bad_channel_names_the_resource() -> None:
    error = malformed(decode_state, "https://example.com", b"{}")
    assert (error.code, error.path) == (ErrorCode.INVALID_PARAMS, "$.resource")
    assert "not a channel URI: 'https://example.com'" in error.reason


def test_state_that_does_not_fit_its_channel_names_the_field_in_state() -> None:
    error = malformed(decode_state, "ahp-session:/acme", b'{"provider":"huddle","title":3}')
    assert (error.code, error.path) == (ErrorCode.INVALID_PARAMS, "$.state.title")


def test_convert_names_the_field_under_the_given_path() -> None:
    error = malformed(convert, {"text": "hi", "origin": {"kind": "robot"}}, Message, "$.draft")
    assert (error.code, error.path) == (ErrorCode.INVALID_PARAMS, "$.draft.origin.kind")


CHAT_SNAPSHOT: dict[str, Any] = {
    "resource": "ahp-chat:/t-1",
    "state": {
        "resource": "ahp-chat:/t-1",
        "title": "t",
        "status": 1,
        "modifiedAt": "z",
        "turns": [],
    },
    "fromSeq": 12,
}


@pytest.mark.parametrize(
    ("snapshot", "path", "reason"),
    [
        pytest.param([CHAT_SNAPSHOT], "$", "expected a snapshot", id="not-an-object"),
        pytest.param(
            {**CHAT_SNAPSHOT, "resource": 7}, "$", "expected a snapshot", id="no-resource"
        ),
        pytest.param(
            {**CHAT_SNAPSHOT, "resource": "ahp-chat:/"},
            "$.resource",
            "not a channel URI: 'ahp-chat:/' (expected ahp-root://, ahp-session:/<id> or "
            "ahp-chat:/<id>)",
            id="bad-resource",
        ),
        pytest.param(
            {**CHAT_SNAPSHOT, "fromSeq": True}, "$.fromSeq", "Expected `int`", id="bool-seq"
        ),
        pytest.param(
            {**CHAT_SNAPSHOT, "fromSeq": None}, "$.fromSeq", "Expected `int`", id="no-seq"
        ),
    ],
)
def test_snapshot_that_does_not_fit_names_the_field(snapshot: Any, path: str, reason: str) -> None:
    error = malformed(decode_snapshot, snapshot)
    assert (error.code, error.path, error.reason) == (ErrorCode.INVALID_PARAMS, path, reason)


def test_snapshot_with_a_bad_state_names_the_field_inside_state() -> None:
    error = malformed(
        decode_snapshot, {**CHAT_SNAPSHOT, "state": {**CHAT_SNAPSHOT["state"], "title": 3}}
    )
    assert error.path == "$.state.title"


def test_snapshot_decodes_its_state_by_the_channel_it_names() -> None:
    snapshot = decode_snapshot({"resource": ROOT_URI, "state": {"agents": []}, "fromSeq": 0})
    assert snapshot == Snapshot(resource=ROOT_URI, state=RootState(agents=[]), from_seq=0)


# ─── Channel URIs ────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("uri", "kind", "ident"),
    [
        pytest.param("ahp-root://", "root", "", id="root"),
        pytest.param("ahp-session:/acme-support", "session", "acme-support", id="session"),
        pytest.param("ahp-chat:/ticket-4821", "chat", "ticket-4821", id="chat"),
        pytest.param("ahp-chat:/T.4821_a~b", "chat", "T.4821_a~b", id="chat-unreserved-chars"),
        pytest.param("ahp-session:/" + "s" * 128, "session", "s" * 128, id="longest-id"),
    ],
)
def test_channel_uri_names_its_kind_and_id(uri: str, kind: str, ident: str) -> None:
    assert (channel_kind(uri), channel_id(uri)) == (kind, ident)


@pytest.mark.parametrize(
    "uri",
    [
        pytest.param("ahp-root:/", id="root-one-slash"),
        pytest.param("ahp-chat:/", id="empty-id"),
        pytest.param("ahp-chat://ticket", id="two-slashes"),
        pytest.param("ahp-chat:/-ticket", id="id-starts-with-dash"),
        pytest.param("ahp-chat:/ticket/4821", id="path-in-id"),
        pytest.param("ahp-session:/" + "s" * 129, id="id-too-long"),
        pytest.param("ahp-terminal:/t", id="terminal-out-of-scope"),
        pytest.param("copilot:/session", id="other-scheme"),
        pytest.param("", id="empty"),
    ],
)
def test_string_that_is_not_a_channel_uri_is_refused(uri: str) -> None:
    with pytest.raises(BadChannelUri) as info:
        channel_kind(uri)
    assert info.value.uri == uri
    assert str(info.value).startswith(f"not a channel URI: {uri!r}")


def test_channel_id_refuses_a_bad_uri() -> None:
    with pytest.raises(BadChannelUri):
        channel_id("ahp-chat:/bad id")


@given(ident=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}", fullmatch=True))
@settings(max_examples=50, deadline=None)
def test_session_and_chat_uris_round_trip_their_id(ident: str) -> None:
    assert (channel_kind(session_uri(ident)), channel_id(session_uri(ident))) == ("session", ident)
    assert (channel_kind(chat_uri(ident)), channel_id(chat_uri(ident))) == ("chat", ident)


# ─── Unknown response parts in stored state ──────────────────────────────────

POLL = {"kind": "huddle/poll", "id": "poll-1", "question": "Happy?", "votes": {"yes": 2}}
STORED_CHAT: dict[str, Any] = {
    "resource": "ahp-chat:/t-1",
    "title": "Order",
    "status": 8,
    "modifiedAt": "z",
    "turns": [
        {
            "id": "turn-1",
            "message": {"text": "hi", "origin": {"kind": "user"}},
            "responseParts": [POLL, {"kind": "markdown", "id": "m", "content": "ok"}],
            "state": "complete",
        }
    ],
    "activeTurn": {
        "id": "turn-2",
        "startedAt": "z",
        "message": {"text": "more", "origin": {"kind": "user"}},
        "responseParts": [
            {"id": "no-kind-at-all"},
            {"kind": "markdown", "id": "m2", "content": "a"},
        ],
    },
}


def test_stored_chat_keeps_parts_of_unknown_kinds() -> None:
    state = convert_state(STORED_CHAT, "chat")
    assert isinstance(state, ChatState)
    assert state.turns[0].response_parts[0] == UnknownPart(raw=AsRead(POLL))
    assert state.active_turn is not None
    assert state.active_turn.response_parts[0] == UnknownPart(raw=AsRead({"id": "no-kind-at-all"}))


def test_stored_chat_writes_unknown_parts_back_as_read() -> None:
    assert to_builtins(convert_state(STORED_CHAT, "chat")) == STORED_CHAT


def test_reducer_leaves_unknown_parts_alone() -> None:
    state = convert_state(STORED_CHAT, "chat")
    assert isinstance(state, ChatState)
    delta = ChatDelta(turn_id="turn-2", part_id="m2", content="b")
    written = to_builtins(reduce_chat(state, delta, 0))
    assert written["activeTurn"]["responseParts"][0] == {"id": "no-kind-at-all"}
    assert written["turns"] == STORED_CHAT["turns"]


def test_stored_chat_without_turns_or_active_turn_is_still_checked() -> None:
    error = malformed(convert_state, {"resource": "ahp-chat:/t-1"}, "chat")
    assert (error.code, error.reason) == (
        ErrorCode.INVALID_PARAMS,
        "Object missing required field `title`",
    )


def test_stored_chat_that_is_not_an_object_is_refused() -> None:
    error = malformed(convert_state, ["not", "a", "chat"], "chat")
    assert error.reason == "Expected `object`, got `array`"


def test_stored_chat_with_a_turn_that_is_not_an_object_names_it() -> None:
    error = malformed(convert_state, {**STORED_CHAT, "turns": ["turn-1"]}, "chat")
    assert error.path == "$.turns[0]"


def test_stored_session_state_is_never_searched_for_parts() -> None:
    stored = {
        "provider": "huddle",
        "title": "q",
        "status": 1,
        "lifecycle": "ready",
        "activeClients": [],
        "chats": [],
        "_meta": {"responseParts": [{"kind": "x"}]},
    }
    state = convert_state(stored, "session")
    assert to_builtins(state) == stored


def test_encoded_chat_state_writes_unknown_parts_as_read() -> None:
    state = convert_state(STORED_CHAT, "chat")
    assert json.loads(encode(state)) == STORED_CHAT


def test_inbound_action_cannot_carry_an_unknown_part() -> None:
    frame = b'{"type":"chat/responsePart","turnId":"t","part":{"kind":"huddle/unknown","raw":{}}}'
    with pytest.raises(MalformedFrame):
        decode_action(frame)


@pytest.mark.parametrize(
    "part",
    [
        pytest.param(POLL, id="as-read"),
        pytest.param({"kind": UNKNOWN_KIND, "raw": POLL}, id="wrapped"),
    ],
)
def test_inbound_loaded_turns_cannot_carry_an_unknown_part(part: dict[str, Any]) -> None:
    turn = {**STORED_CHAT["turns"][0], "responseParts": [part]}
    frame = json.dumps({"type": "chat/turnsLoaded", "turns": [turn]})
    with pytest.raises(MalformedFrame):
        decode_action(frame)


LOOK_ALIKE = {"kind": UNKNOWN_KIND, "raw": {"id": "x"}}
"""Somebody's JSON object shaped like the codec's wrapper of an unknown part."""


def test_encoding_does_not_depend_on_what_was_decoded_before() -> None:
    call = ChatToolCallStart(
        turn_id="turn-2",
        tool_call_id="call-1",
        tool_name="poll",
        display_name="Poll",
        meta=LOOK_ALIKE,
    )
    written = msgspec.json.encode(call)
    assert encode(call) == written
    convert_state(STORED_CHAT, "chat")  # a state with parts of unknown kinds
    assert encode(call) == written
    assert to_builtins(call) == json.loads(written)
    beside_a_part = {"call": call, "part": UnknownPart(raw=AsRead(POLL))}
    assert json.loads(encode(beside_a_part)) == {"call": json.loads(written), "part": POLL}


def test_unknown_part_is_written_as_the_part_it_holds_wherever_it_is() -> None:
    part = UnknownPart(raw=AsRead(POLL))
    assert encode(part) == msgspec.json.encode(POLL)
    assert json.loads(encode((part, [AsRead(POLL)], {"parts": [part]}))) == [
        POLL,
        [POLL],
        {"parts": [POLL]},
    ]


def test_values_holding_unknown_parts_are_written_whole() -> None:
    state = convert_state(STORED_CHAT, "chat")
    snapshot = Snapshot(resource="ahp-chat:/t-1", state=state, from_seq=4)
    result = Response(id=1, result={"snapshot": snapshot, "missing": [], "seq": 4})
    written = {"resource": "ahp-chat:/t-1", "state": STORED_CHAT, "fromSeq": 4}
    expected = {"jsonrpc": "2.0", "id": 1, "result": {"snapshot": written, "missing": [], "seq": 4}}
    assert json.loads(encode(result)) == expected
    assert to_builtins(result) == expected


def test_unknown_part_shows_and_compares_by_the_json_it_holds() -> None:
    assert repr(UnknownPart(raw=AsRead(POLL))) == f"UnknownPart(raw=AsRead({POLL!r}))"
    assert AsRead(POLL) == AsRead(dict(POLL))
    assert AsRead(POLL) != POLL


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"when": object()}, id="alone"),
        pytest.param({"part": UnknownPart(raw=AsRead(POLL)), "when": object()}, id="after-a-part"),
    ],
)
def test_encoder_still_refuses_a_type_it_does_not_know(value: object) -> None:
    with pytest.raises(TypeError, match="Encoding objects of type object is unsupported"):
        encode(value)


@STATE_ROUND_TRIP
@given(value=ANY.of(ChatState) | ANY.of(ActionEnvelope) | ANY.of(chat.Turn))
def test_builtins_are_what_the_encoder_writes(value: Wire) -> None:
    assert to_builtins(value) == json.loads(encode(value))


def test_decode_state_refuses_json_that_does_not_parse() -> None:
    error = malformed(decode_state, "ahp-chat:/c", b"{not json")
    assert error.code == ErrorCode.PARSE_ERROR


# ─── What a peer may send: depth and surrogates ──────────────────────────────


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [65, 1000, 100_000])
def test_a_frame_nested_too_deeply_is_a_parse_error(depth: int) -> None:
    frame = '{"jsonrpc":"2.0","method":"ping","id":1,"params":' + nested(depth) + "}"
    with pytest.raises(MalformedFrame) as error:
        decode_request(frame)
    assert error.value.code == ErrorCode.PARSE_ERROR
    assert str(error.value) == "JSON nested deeper than 64 levels"


def test_depth_counts_arrays_and_objects_but_not_brackets_in_strings() -> None:
    assert not nested_too_deep(nested(64))
    assert nested_too_deep(nested(65))
    assert nested_too_deep('{"a":' * 65 + "1" + "}" * 65)
    assert not nested_too_deep('["' + "[" * 500 + '"]')
    assert not nested_too_deep("[" * 100)  # unbalanced: malformed, not deep
    assert not nested_too_deep(("[" + nested(3) + "]").encode())


def test_many_shallow_brackets_are_not_deep() -> None:
    assert not nested_too_deep("[" + ",".join(["{}"] * 10_000) + "]")


DEEP_IN_STRINGS: list[Any] = [
    pytest.param('["\\"' + "[" * 100 + '"]', False, id="escaped-quote-then-brackets-in-a-string"),
    pytest.param('["\\\\", ' + nested(65) + "]", True, id="escaped-backslash-ends-the-string"),
    pytest.param('["\\\\\\"' + "{" * 70 + '"]', False, id="escaped-backslash-and-quote"),
    pytest.param('[{"a[": "]"}, ' + nested(63) + "]", False, id="keys-and-values-with-brackets"),
    pytest.param('[{"a[": "]"}, [' + nested(63) + "]]", True, id="deep-after-bracketed-strings"),
    pytest.param('[["a",' * 40 + '"' + "]" * 80, False, id="a-stray-quote-hides-the-rest"),
    pytest.param("[" * 65 + '"' + '\\"' * 1000, False, id="an-unterminated-string"),
    pytest.param("[" * 65 + "}" * 65, False, id="mismatched-brackets-are-malformed-not-deep"),
    pytest.param("[" * 70 + "]" * 71, False, id="one-closer-too-many"),
    pytest.param('{"a":' + nested(64) + "}", True, id="an-object-around-64-arrays"),
]


@pytest.mark.parametrize(("text", "deep"), DEEP_IN_STRINGS)
def test_depth_is_read_past_strings_whatever_they_hold(text: str, deep: bool) -> None:
    assert nested_too_deep(text) is deep
    assert nested_too_deep(text.encode()) is deep
    assert nested_too_deep(msgspec.Raw(text.encode())) is deep


@pytest.mark.parametrize(
    ("escape", "half"),
    [pytest.param("\\ud800", "d800", id="high"), pytest.param("\\udc00x", "dc00", id="low")],
)
def test_a_lone_surrogate_is_named_as_such(escape: str, half: str) -> None:
    frame = '{"jsonrpc":"2.0","method":"ping","id":1,"params":{"channel":"' + escape + '"}}'
    with pytest.raises(MalformedFrame) as error:
        decode_request(frame)
    assert error.value.code == ErrorCode.PARSE_ERROR
    assert str(error.value) == (
        f"invalid JSON: \\u{half} is half of a UTF-16 surrogate pair with no other half, "
        "so it is no character"
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('["\\ud800"]', id="high-at-the-end"),
        pytest.param('["' + "x" * 100_000 + '\\udc00"]', id="low-far-in"),
        pytest.param(b'["\\ud800", 1, 2]', id="high-then-more-as-bytes"),
    ],
)
def test_a_lone_surrogate_is_found_where_the_decoder_stopped(text: str | bytes) -> None:
    with pytest.raises(MalformedFrame) as error:
        decode_json(text)
    assert "is half of a UTF-16 surrogate pair" in str(error.value)


def test_other_malformed_json_is_said_as_the_decoder_says_it() -> None:
    with pytest.raises(MalformedFrame) as error:
        decode_json('{"a": "\\\\ud800", "b": 1,}')  # an escaped backslash, then a comma
    assert str(error.value) == "invalid JSON: JSON is malformed: trailing comma in object (byte 24)"


def test_a_surrogate_pair_and_an_escaped_backslash_are_fine() -> None:
    assert decode_json('{"a": "\\ud83d\\ude00", "b": "\\\\ud800"}') == {
        "a": "\U0001f600",
        "b": "\\ud800",
    }


def test_decode_json_refuses_what_peers_may_not_send() -> None:
    cases: list[tuple[str | bytes, str]] = [
        (nested(65), "JSON nested deeper than 64 levels"),
        (b"{not json", "invalid JSON: "),
    ]
    for text, why in cases:
        with pytest.raises(MalformedFrame) as error:
            decode_json(text)
        assert error.value.code == ErrorCode.PARSE_ERROR
        assert str(error.value).startswith(why)
