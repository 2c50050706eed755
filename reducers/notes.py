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
                   "expiresAt": <ms>, "onExpiry": "cancel" | "decline" | "fail"}}}
    toolCalls: {<chat>: {<tool call id>: {
                   "decided":   {"by": <who>, "approved": true},
                   "expiresAt": <ms>, "onExpiry": ...}}}

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

HUDDLE: Final = "huddle"
KEPT: Final = 100
"""Entries kept per chat under ``requests`` and ``toolCalls`` each."""

Who: TypeAlias = dict[str, Any]
"""``{"name", "role", "token", "declared"?}``."""
ExpiryPolicy: TypeAlias = Literal["cancel", "decline", "fail"]
EXPIRY_POLICIES: Final = ("cancel", "decline", "fail")
Meta: TypeAlias = dict[str, Any]


def note_of(meta: Meta | None, family: str, chat: str, key: str) -> dict[str, Any] | None:
    """The note on ``key`` (a request or tool call id) of ``chat``, if any."""
    notes = ((meta or {}).get(HUDDLE) or {}).get(family) or {}
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
