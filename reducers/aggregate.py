"""What a host derives from a chat for its session and from a session for the
sessions list: pure functions of state, used by the host after each action.

AHP asks hosts to keep three aggregates current:

- the session's ``inputNeeded`` queue mirrors every open input request and
  every tool call waiting on a person, across the session's chats
  (:func:`derive_session_actions` emits ``session/inputNeededSet`` and
  ``session/inputNeededRemoved``);
- the session's ``chats`` catalog mirrors each chat's summary fields
  (``session/chatUpdated``);
- the sessions list shows a summary whose status, activity and modifiedAt
  are aggregated over the session's chats (:func:`session_summary`).

Decision: an ``inputNeeded`` entry's id is its chat's URI, its kind and
the request's or tool call's id (:func:`input_entry_id`). AHP asks for an
id unique within the session and lets the host derive it; request and tool
call ids are unique per chat only (a model chooses call ids, the built-in
runner derives request ids from the chat's turn id, and a client that
numbers its turns uses the same ids in every chat), so two chats asking
alike would share one entry, and the first answer would take both away.

Decision where AHP is silent: the mirrored input request leaves out
``answers``. Drafts change on every keystroke batch; the queue only says
that a request is open, and the chat holds the answers.

Decision: the catalog leaves out a chat's ``workingDirectories`` (optional
in AHP's ``ChatSummary``), in ``session/chatAdded`` and in every
``session/chatUpdated``. It never carries them, so AHP's reducer (which
merges what an update names) keeps every client's copy equal to the
server's. The session's snapshot carries its whole catalog, unwindowed: at
1,000 chats (``SizeLimits.chats``) with the largest titles, and the
session's own 50 working directories of 1 KiB, it takes 1.3 MB of JSON;
the same 50 directories in each chat's entry would add 51 KB a chat, 53 MB
at the cap, 25 times what a subscriber may receive (half the 4 MiB send
buffer), and 16 such chats already pass that. A chat's own state holds its
subset (absent: the session's whole set, as AHP says): read it there. The
catalog's entry, which lacks it, reads as "the session's set" to a client
that takes the summary for the chat.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec.structs import replace

from protocol.actions import (
    SessionAction,
    SessionChatUpdated,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    ChatSummary,
    ChatSummaryChanges,
    InputRequestPart,
    ToolCallAuthRequired,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallPendingResultConfirmation,
    Turn,
)
from protocol.session import (
    ChatInputNeeded,
    SessionInputRequest,
    SessionState,
    SessionSummary,
    ToolAuthenticationNeeded,
    ToolConfirmationNeeded,
)
from protocol.status import ACTIVITY_MASK, SessionStatus
from reducers.chat import select_waits

SUMMARY_FIELDS = tuple(
    f for f in ChatSummary.__struct_fields__ if f not in ("resource", "working_directories")
)
"""The chat's fields its catalog entry mirrors (see the module docstring)."""


def input_entry_id(chat: str, kind: str, key: str) -> str:
    """The id of chat ``chat``'s ``inputNeeded`` entry for its open block
    ``key``: a request's id (``kind`` ``input``) or a tool call's (``tool``).
    Opaque to clients (AHP), unique within the session."""
    return f"{chat}#{kind}/{key}"


def select_input_needed(chat: ChatState) -> dict[str, SessionInputRequest]:
    """Every open block of the chat's active turn, by entry id
    (:func:`input_entry_id`)."""
    turn = chat.active_turn
    if turn is None:
        return {}
    uri = chat.resource
    found: dict[str, SessionInputRequest] = {}
    for part in turn.response_parts:
        if type(part) is InputRequestPart:
            if part.response is None:
                request = replace(part.request, answers=None)
                entry_id = input_entry_id(uri, "input", request.id)
                found[entry_id] = ChatInputNeeded(id=entry_id, chat=uri, request=request)
        elif type(part) is ToolCallPart:
            call = part.tool_call
            if isinstance(call, ToolCallPendingConfirmation | ToolCallPendingResultConfirmation):
                entry_id = input_entry_id(uri, "tool", call.tool_call_id)
                found[entry_id] = ToolConfirmationNeeded(
                    id=entry_id, chat=uri, turn_id=turn.id, tool_call=call
                )
            elif isinstance(call, ToolCallAuthRequired):
                entry_id = input_entry_id(uri, "tool", call.tool_call_id)
                found[entry_id] = ToolAuthenticationNeeded(
                    id=entry_id, chat=uri, turn_id=turn.id, tool_call=call
                )
    return found


def select_settled_entries(chat: ChatState, listed: list[str]) -> list[str]:
    """The entry ids among ``listed`` (the chat's ``inputNeeded`` entries, as
    a session lists them) whose block the chat holds settled: a request or
    tool call of one of its turns that is open no more. An entry of a block
    the chat does not hold (another process may have opened it since this
    state) is not among them."""
    found = select_input_needed(chat)
    candidates = [entry_id for entry_id in listed if entry_id not in found]
    if not candidates:
        return []
    turns: list[ActiveTurn | Turn] = [*chat.turns]
    if chat.active_turn is not None:
        turns.append(chat.active_turn)
    requests, calls = select_waits(turns)
    uri = chat.resource
    held = {input_entry_id(uri, "input", r) for r in requests}
    held |= {input_entry_id(uri, "tool", c) for c in calls}
    return [entry_id for entry_id in candidates if entry_id in held]


def catalog_changes(entry: ChatSummary, chat: ChatState) -> dict[str, Any]:
    """The summary fields in which a session's catalog ``entry`` differs
    from the chat's state ``chat`` (a ``session/chatUpdated``'s changes,
    modifiedAt with them); none when they differ in modifiedAt alone (hosts
    throttle those)."""
    changes = {
        field: new
        for field in SUMMARY_FIELDS
        if (new := getattr(chat, field)) != getattr(entry, field)
    }
    if changes.keys() <= {"modified_at"}:
        return {}
    changes["modified_at"] = chat.modified_at
    return changes


def chat_summary(chat: ChatState) -> ChatSummary:
    """The catalog entry of a chat: its denormalized summary fields, without
    its working directories (see the module docstring)."""
    return ChatSummary(
        resource=chat.resource,
        title=chat.title,
        status=chat.status,
        activity=chat.activity,
        modified_at=chat.modified_at,
        origin=chat.origin,
        interactivity=chat.interactivity,
    )


def summary_changes(before: ChatState, after: ChatState) -> dict[str, Any]:
    """The summary fields that differ between two states of one chat."""
    return {
        field: new
        for field in SUMMARY_FIELDS
        if (new := getattr(after, field)) != getattr(before, field)
    }


def derive_session_actions(
    before: ChatState, after: ChatState, *, include_modified_at: bool = True
) -> list[SessionAction]:
    """The session actions that keep the session in step with a chat change:
    ``inputNeeded`` entries opened, changed or closed, then a
    ``session/chatUpdated`` with the changed summary fields. With
    ``include_modified_at`` False a change of ``modifiedAt`` alone is left
    for later (hosts throttle those)."""
    if before is after:
        return []
    actions: list[SessionAction] = []
    old, new = select_input_needed(before), select_input_needed(after)
    for entry_id, entry in new.items():
        if old.get(entry_id) != entry:
            actions.append(SessionInputNeededSet(request=entry))
    for entry_id in old.keys() - new.keys():
        actions.append(SessionInputNeededRemoved(id=entry_id))
    changes = summary_changes(before, after)
    if changes and (include_modified_at or changes.keys() != {"modified_at"}):
        if changes.keys() != {"modified_at"}:
            changes["modified_at"] = after.modified_at
        actions.append(
            SessionChatUpdated(chat=after.resource, changes=ChatSummaryChanges(**changes))
        )
    return actions


def _activity(status: int) -> int:
    return status & ACTIVITY_MASK


def session_summary(uri: str, session: SessionState, created_at: str) -> SessionSummary:
    """The session as the sessions list shows it, by AHP's aggregation rules:
    activity bits and text from the default chat (else the most recently
    modified one), promoted to InputNeeded, else Error, when any chat is so;
    IsRead/IsArchived from the session, modifiedAt the latest of the chats."""
    chats = session.chats
    leader = next((c for c in chats if c.resource == session.default_chat), None)
    if leader is None and chats:
        leader = max(chats, key=lambda c: c.modified_at)
    activity = _activity(leader.status) if leader else _activity(session.status)
    activity_text = leader.activity if leader else session.activity
    for promoted in (SessionStatus.INPUT_NEEDED, SessionStatus.ERROR):
        winner = next((c for c in chats if _activity(c.status) == promoted), None)
        if winner is not None:
            activity, activity_text = promoted, winner.activity
            break
    if session.input_needed:
        activity = SessionStatus.INPUT_NEEDED
    flags = session.status & ~ACTIVITY_MASK
    modified = max((c.modified_at for c in chats), default=created_at)
    return SessionSummary(
        resource=uri,
        provider=session.provider,
        title=session.title,
        status=flags | (activity or SessionStatus.IDLE),
        activity=activity_text,
        project=session.project,
        working_directories=session.working_directories,
        annotations=session.annotations,
        created_at=created_at,
        modified_at=max(modified, created_at),
    )


def summary_diff(before: SessionSummary, after: SessionSummary) -> dict[str, Any]:
    """The changed fields of a session summary as AHP's
    ``root/sessionSummaryChanged`` carries them (wire names; ``null`` for a
    field that became absent); identity fields never change."""
    old = msgspec.to_builtins(before)
    new = msgspec.to_builtins(after)
    changed: dict[str, Any] = {}
    for key in old.keys() | new.keys():
        if key in ("resource", "provider", "createdAt"):
            continue
        if old.get(key) != new.get(key):
            changed[key] = new.get(key)
    return changed
