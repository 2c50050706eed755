"""The events people are told of: a wait opened, settled or expired.

A wait is an input request (``requests``) or a tool call waiting for
approval (``toolCalls``) in a chat. :func:`event_of` reads the event an
action makes of a chat's state before and after it, purely: the outbox
(server.notify.outbox) calls it on the validated step ahead of the append
and again on the applied envelope, and gets the same event (the same id)
both times. Each event is ``{type, timestamp, data}`` as Standard Webhooks
payloads are; ``data`` names the session, the chat, the wait, its message,
who settled it (the server's identity of the sender, never a name a client
typed into the action) and the web client's link to the chat, which
carries no token.

========================  ====================================================
``input.requested``       ``chat/inputRequested``
``approval.requested``    ``chat/toolCallReady`` that needs a confirmation
``input.completed``       ``chat/inputCompleted`` by a person or an agent
``approval.decided``      ``chat/toolCallConfirmed`` by a person or an agent
``wait.expired``          either of the two, made by server.core.expiry
``input.escalated``       a wait still open ``escalateAfter`` seconds on
========================  ====================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from protocol.actions import (
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    StateAction,
)
from protocol.chat import ChatState, ToolCallPart, ToolCallPendingConfirmation
from protocol.messages import ChannelState
from protocol.uris import CHAT_SCHEME, SESSION_SCHEME
from reducers import notes
from reducers.chat import select_input_settlement, select_open_input_part, select_tool_call
from server.auth import Identity
from server.core.frozen_forms import chat_session
from server.core.policy import active_turn_stamp

EVENT_TYPES = (
    "input.requested",
    "approval.requested",
    "input.completed",
    "approval.decided",
    "wait.expired",
    "input.escalated",
)
REQUESTED = ("input.requested", "approval.requested")
"""The events that open a wait: what email and escalation follow."""
Family = Literal["requests", "toolCalls"]
WAIT_ACTIONS = (ChatInputRequested, ChatToolCallReady, ChatInputCompleted, ChatToolCallConfirmed)


@dataclass(frozen=True, slots=True)
class Event:
    """An event and the wait it is about (to check it against the chat)."""

    id: str
    """Its Standard Webhooks message id: the same wherever it is built."""
    type: str
    chat: str
    session: str
    family: Family
    key: str
    data: dict[str, Any]
    timestamp: str
    escalate_after: float | None = None
    """Seconds after which the wait, still open, escalates, as the request
    asks (``_meta.huddle.escalateAfter`` of a tool call; None: as each
    endpoint says)."""

    def payload(self) -> dict[str, Any]:
        return {"type": self.type, "timestamp": self.timestamp, "data": self.data}


def event_id(
    kind: str, chat: str, family: str, key: str, turn: str | None, part: int | None = None
) -> str:
    """The message id of the event ``kind`` of a wait: a later turn's wait
    of the same id (AHP lets a client reuse it) is another event, and so is
    a request asked again under a resolved one's id (AHP appends a new
    part: ``part`` is its place in the turn)."""
    digest = hashlib.sha256(f"{kind} {chat} {family} {key} {turn} {part}".encode()).hexdigest()
    return "msg_" + digest[:32]


def iso(now_ms: int) -> str:
    return datetime.fromtimestamp(now_ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def chat_link(base_url: str, session: str, chat: str) -> str:
    """The web client's link to ``chat`` (its ``#/s/<id>/c/<id>`` route)."""
    sid = quote(session.removeprefix(SESSION_SCHEME), safe="")
    cid = quote(chat.removeprefix(CHAT_SCHEME), safe="")
    return f"{base_url.rstrip('/')}/#/s/{sid}/c/{cid}"


def event_of(
    uri: str,
    action: StateAction,
    before: ChannelState,
    after: ChannelState,
    sender: Identity | None,
    now_ms: int,
    base_url: str,
    session_meta: dict[str, Any] | None = None,
) -> Event | None:
    """The event ``action`` makes on chat ``uri`` (``before`` and ``after``
    it), sent by ``sender`` (None: the server), or None. ``session_meta``
    is the session's notes: a settlement of the server's own is an expiry's
    only when they say the wait's time is up (the server also withdraws
    requests, and that is no expiry). Asked of every
    append: anything but the four actions of waits is turned away first."""
    if not isinstance(action, WAIT_ACTIONS):
        return None
    if not isinstance(after, ChatState) or not isinstance(before, ChatState):
        return None
    session = chat_session(after)
    if session is None:
        return None
    turn = active_turn_stamp(before) or active_turn_stamp(after)
    by = None if sender is None else sender.who()

    def expired(family: str, key: str) -> bool:
        due = notes.expiry_of(session_meta, family, uri, key, turn)
        return sender is None and due is not None and due[0] <= now_ms

    family: Family
    part: int | None = None
    escalate: float | None = None
    match action:
        case ChatInputRequested(request=request):
            part = _open_part(after, request.id)
            kind, family, key, message = "input.requested", "requests", request.id, request.message
            extra: dict[str, Any] = {"requestId": key, "url": request.url}
        case ChatToolCallReady(confirmed=None) if _pending(after, action.tool_call_id):
            kind, family, key = "approval.requested", "toolCalls", action.tool_call_id
            escalate = _seconds(notes.huddle_meta(action.meta, "escalateAfter"))
            message = _text(action.confirmation_title) or _text(action.invocation_message)
            extra = {"toolCallId": key, "turnId": action.turn_id}
        case ChatInputCompleted(request_id=key):
            if select_input_settlement(before, key).status != "open":
                return None
            part = _open_part(before, key)
            asked = select_input_settlement(before, key).part
            message = asked.request.message if asked is not None else None
            # Only the server settles a wait by its expiry; a person's
            # _meta saying so proves nothing.
            kind = "wait.expired" if expired("requests", key) else "input.completed"
            family = "requests"
            extra = {"requestId": key, "response": action.response}
        case ChatToolCallConfirmed(tool_call_id=key):
            call = select_tool_call(before, key)
            if not isinstance(call, ToolCallPendingConfirmation):
                return None
            message = _text(call.confirmation_title) or _text(call.invocation_message)
            kind = "wait.expired" if expired("toolCalls", key) else "approval.decided"
            family = "toolCalls"
            extra = {"toolCallId": key, "approved": action.approved}
        case _:
            return None
    data = {
        "session": session,
        "chat": uri,
        **{k: v for k, v in extra.items() if v is not None},
        "message": message,
        "settledBy": by if kind in ("input.completed", "approval.decided") else None,
        "link": chat_link(base_url, session, uri),
    }
    if kind == "wait.expired":
        data["family"] = family
    return Event(
        event_id(kind, uri, family, key, turn, part),
        kind,
        uri,
        session,
        family,
        key,
        data,
        iso(now_ms),
        escalate,
    )


def escalation_of(event: Event, now_ms: int) -> Event:
    """The ``input.escalated`` event of the wait ``event`` opened."""
    data = {**event.data, "requested": event.type}
    kind = "input.escalated"
    return Event(
        "msg_esc" + event.id.removeprefix("msg_")[:29],
        kind,
        event.chat,
        event.session,
        event.family,
        event.key,
        data,
        iso(now_ms),
    )


def wait_open(state: ChannelState, family: str, key: str) -> bool:
    """Whether the wait is open in ``state`` (the chat now)."""
    if not isinstance(state, ChatState):
        return False
    if family == "requests":
        return select_input_settlement(state, key).status == "open"
    return isinstance(select_tool_call(state, key), ToolCallPendingConfirmation)


def landed(state: ChannelState, event_type: str, family: str, key: str) -> bool:
    """Whether the action of an event written ahead of its append landed,
    as the chat now shows: a wait it opened is there (open or settled), a
    wait it settled is no longer open."""
    if not isinstance(state, ChatState):
        return False
    if event_type not in REQUESTED:
        return not wait_open(state, family, key)
    if family == "requests":
        return select_input_settlement(state, key).part is not None
    parts = [part for turn in state.turns for part in turn.response_parts]
    if state.active_turn is not None:
        parts += state.active_turn.response_parts
    return any(type(p) is ToolCallPart and p.tool_call.tool_call_id == key for p in parts)


def _open_part(state: ChatState, request_id: str) -> int | None:
    """Where the open request ``request_id`` is in the active turn."""
    active = state.active_turn
    found = select_open_input_part(active.response_parts, request_id) if active else None
    return None if found is None else found[0]


MAX_ESCALATE_AFTER = 7 * 86400.0


def _seconds(value: object) -> float | None:
    """A request's own ``escalateAfter``, if it is a number of seconds in
    (0, MAX_ESCALATE_AFTER]; anything else is no escalation of its own."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value <= MAX_ESCALATE_AFTER else None


def _pending(state: ChatState, tool_call_id: str) -> bool:
    return isinstance(select_tool_call(state, tool_call_id), ToolCallPendingConfirmation)


def _text(value: object) -> str | None:
    """A StringOrMarkdown as text."""
    if value is None or isinstance(value, str):
        return value
    markdown = getattr(value, "markdown", None)
    return markdown if isinstance(markdown, str) else None
