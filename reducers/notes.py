"""Huddle's notes on a session's requests: who wrote each answer, who
submitted, and when a wait expires.

AHP has no place for an answer's author or a request's deadline on the
request itself, so Huddle keeps them in the session's ``_meta.huddle``,
which the server alone changes (``session/metaChanged``, server-only in
AHP): every client, plain AHP ones included, reduces the same state, and
Huddle's own clients read the notes to show "Dana is typing", "answered by
Lee" and the time left. The shape, under ``_meta.huddle``::

    requests:  {<chat>: {<request id>: {
                   "answers":   {<question id>: {"by": <who>, "state": "draft"}},
                   "completed": {"by": <who>, "response": "accept"},
                   "expiresAt": <ms>, "onExpiry": "cancel" | "decline" | "fail",
                   "expired": true}}}
    toolCalls: {<chat>: {<tool call id>: {
                   "decided":   {"by": <who>, "approved": true},
                   "expiresAt": <ms>, "onExpiry": ..., "expired": true}}}

``<who>`` is ``{"name", "role", "token"}`` (plus ``"declared": true`` for a
name its holder typed in, from a shared link): the server's identity of the
sender, never what a client said. At most :data:`KEPT` entries per chat are
kept; the oldest go first.

Each function returns the new ``_meta`` or None when nothing changes (so
that nothing needs to be dispatched). Pure: the caller passes the time.
"""

from __future__ import annotations

import copy
from typing import Any, Final, Literal, TypeAlias

from protocol.actions import ChatInputAnswerChanged, ChatInputCompleted, ChatToolCallConfirmed
from protocol.rejections import Rejection, RejectionCode
from reducers.clock import iso_time

HUDDLE: Final = "huddle"
KEPT: Final = 100
"""Entries kept per chat under ``requests`` and ``toolCalls`` each."""

Who: TypeAlias = dict[str, Any]
"""``{"name", "role", "token", "declared"?}``."""
ExpiryPolicy: TypeAlias = Literal["cancel", "decline", "fail"]
EXPIRY_POLICIES: Final = ("cancel", "decline", "fail")
Meta: TypeAlias = dict[str, Any]


def huddle_meta(meta: Meta | None, key: str) -> Any:
    """``_meta.huddle.<key>`` of a state or an action, if it is there."""
    huddle = (meta or {}).get(HUDDLE)
    return huddle.get(key) if isinstance(huddle, dict) else None


def note_of(meta: Meta | None, family: str, chat: str, key: str) -> dict[str, Any] | None:
    """The note on ``key`` (a request or tool call id) of ``chat``, if any."""
    notes = huddle_meta(meta, family) or {}
    entry = (notes.get(chat) or {}).get(key)
    return entry if isinstance(entry, dict) else None


def answered(
    meta: Meta | None, chat: str, request_id: str, question_id: str, who: Who, state: str
) -> Meta | None:
    """``who`` wrote the answer to ``question_id`` (now in ``state``)."""
    note = {"by": who, "state": state}
    return _changed(meta, "requests", chat, request_id, ("answers", question_id), note)


def unanswered(meta: Meta | None, chat: str, request_id: str, question_id: str) -> Meta | None:
    """The answer to ``question_id`` was cleared."""
    return _changed(meta, "requests", chat, request_id, ("answers", question_id), None)


def completed(
    meta: Meta | None, chat: str, request_id: str, who: Who, response: str
) -> Meta | None:
    """``who`` completed the request with ``response``."""
    note = {"by": who, "response": response}
    return _changed(meta, "requests", chat, request_id, ("completed",), note)


def decided(
    meta: Meta | None, chat: str, tool_call_id: str, who: Who, approved: bool
) -> Meta | None:
    """``who`` approved or denied the tool call."""
    note = {"by": who, "approved": approved}
    return _changed(meta, "toolCalls", chat, tool_call_id, ("decided",), note)


def expiring(
    meta: Meta | None,
    family: Literal["requests", "toolCalls"],
    chat: str,
    key: str,
    at_ms: int,
    policy: ExpiryPolicy,
) -> Meta | None:
    """The wait on ``key`` expires at ``at_ms``, then ``policy`` applies."""
    first = _changed(meta, family, chat, key, ("expiresAt",), at_ms)
    second = _changed(first or meta, family, chat, key, ("onExpiry",), policy)
    return second or first


def expired(
    meta: Meta | None, family: Literal["requests", "toolCalls"], chat: str, key: str
) -> Meta | None:
    """The wait on ``key`` expired: its policy was applied."""
    return _changed(meta, family, chat, key, ("expired",), True)


def expired_wait(meta: Meta | None, chat: str, action: object, now_ms: int) -> Rejection | None:
    """Why ``action`` (an answer, a completion, a tool decision) comes too
    late for its wait: its expiry passed (applied already or about to be).
    None when it is in time or its wait does not expire."""
    match action:
        case ChatInputAnswerChanged() | ChatInputCompleted():
            family, key, what = "requests", action.request_id, "input request"
        case ChatToolCallConfirmed():
            family, key, what = "toolCalls", action.tool_call_id, "tool call"
        case _:
            return None
    note = note_of(meta, family, chat, key)
    if note is None:
        return None
    at = note.get("expiresAt")
    if note.get("expired") is not True and not (isinstance(at, int) and at <= now_ms):
        return None
    when = f" at {iso_time(at)}" if isinstance(at, int) else ""
    return Rejection(
        RejectionCode.EXPIRED,
        f"the {what} {key!r} expired{when} and takes no answer any more",
    )


def expiry_of(meta: Meta | None, family: str, chat: str, key: str) -> tuple[int, str] | None:
    """When the wait on ``key`` expires and what then applies, if it does."""
    note = note_of(meta, family, chat, key)
    if note is None or not isinstance(note.get("expiresAt"), int):
        return None
    return note["expiresAt"], str(note.get("onExpiry", "cancel"))


def _changed(
    meta: Meta | None,
    family: str,
    chat: str,
    key: str,
    path: tuple[str, ...],
    value: Any,
) -> Meta | None:
    """``meta`` with ``value`` at ``huddle.<family>.<chat>.<key>.<path>``
    (removed when None), or None when it is there already."""
    entry = note_of(meta, family, chat, key) or {}
    holder: Any = entry
    for part in path[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    current = holder.get(path[-1]) if isinstance(holder, dict) else None
    if current == value:
        return None
    new = copy.deepcopy(meta) if meta else {}
    huddle = new.setdefault(HUDDLE, {})
    notes = huddle.setdefault(family, {})
    chat_notes = notes.setdefault(chat, {})
    target = chat_notes.setdefault(key, {})
    for part in path[:-1]:
        target = target.setdefault(part, {})
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    chat_notes[key] = chat_notes.pop(key)  # the newest last
    while len(chat_notes) > KEPT:
        del chat_notes[next(iter(chat_notes))]
    return new
