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
                   "expired": true,
                   "turn":      <stamp>}}}
    toolCalls: {<chat>: {<tool call id>: {
                   "decided":   {"by": <who>, "approved": true},
                   "expiresAt": <ms>, "onExpiry": ..., "expired": true,
                   "turn":      <stamp>}}}

``<who>`` is ``{"name", "role", "token"}`` (plus ``"declared": true`` for a
name its holder typed in, from a shared link): the server's identity of the
sender, never what a client said. ``turn`` is the server's stamp of the
turn that holds the request or tool call (``_meta.huddle.turn`` of its
message; absent for an unstamped turn): ids are unique within a turn only,
and a turn truncated away may be followed by one that uses its ids again,
so a note is of the wait of its turn alone. A note of another turn is
replaced, not added to, and readers (:func:`note_for`) pass it over, so
that a note of a truncated wait written late (another process's, batched)
gives the new wait no deadline and no authors; a note that names no turn
is any turn's. At most :data:`KEPT` entries per chat are
kept; the oldest go first. A chat noted anew goes last in both families and
its note last in its chat, so that the order of the dicts is the order of
use. :func:`bounded` keeps the notes of a session within a number of bytes
(``SizeLimits.notes``): the notes of what waits no more (completed, decided,
expired) go before those of what still waits (a draft, a deadline); each
time the chats noted least recently lose theirs first, each chat its oldest
entries first (requests and tool calls in turn); the newest entry of each
family in the chat just noted always stays.

Each function returns the new ``_meta`` or None when nothing changes (so
that nothing needs to be dispatched). Pure: the caller passes the time.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterator
from itertools import zip_longest
from typing import Any, Final, Literal, TypeAlias

import msgspec

from protocol.actions import ChatInputAnswerChanged, ChatInputCompleted, ChatToolCallConfirmed
from protocol.rejections import Rejection, RejectionCode
from reducers.clock import iso_time

HUDDLE: Final = "huddle"
KEPT: Final = 100
"""Entries kept per chat under ``requests`` and ``toolCalls`` each."""
FAMILIES: Final = ("requests", "toolCalls")

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
    """The note on ``key`` (a request or tool call id) of ``chat``, if any,
    whichever turn it is of."""
    notes = huddle_meta(meta, family) or {}
    entry = (notes.get(chat) or {}).get(key)
    return entry if isinstance(entry, dict) else None


def note_for(
    meta: Meta | None, family: str, chat: str, key: str, turn: str | None
) -> dict[str, Any] | None:
    """The note on ``key`` of ``chat`` if it is of the turn stamped ``turn``
    (None: an unstamped turn), else None. A note that names no turn (of an
    unstamped turn, or written before notes named them) is any turn's."""
    note = note_of(meta, family, chat, key)
    return note if note is not None and _of_turn(note, turn) else None


def _of_turn(note: dict[str, Any], turn: str | None) -> bool:
    return note.get("turn") in (None, turn)


def answered(
    meta: Meta | None,
    chat: str,
    request_id: str,
    question_id: str,
    who: Who,
    state: str,
    *,
    turn: str | None = None,
) -> Meta | None:
    """``who`` wrote the answer to ``question_id`` (now in ``state``) of
    the request of the turn stamped ``turn`` (see the module docstring; the
    same for every note)."""
    note = {"by": who, "state": state}
    return _changed(meta, "requests", chat, request_id, ("answers", question_id), note, turn)


def unanswered(
    meta: Meta | None, chat: str, request_id: str, question_id: str, *, turn: str | None = None
) -> Meta | None:
    """The answer to ``question_id`` was cleared."""
    return _changed(meta, "requests", chat, request_id, ("answers", question_id), None, turn)


def completed(
    meta: Meta | None,
    chat: str,
    request_id: str,
    who: Who,
    response: str,
    *,
    turn: str | None = None,
) -> Meta | None:
    """``who`` completed the request with ``response``."""
    note = {"by": who, "response": response}
    return _changed(meta, "requests", chat, request_id, ("completed",), note, turn)


def decided(
    meta: Meta | None,
    chat: str,
    tool_call_id: str,
    who: Who,
    approved: bool,
    *,
    turn: str | None = None,
) -> Meta | None:
    """``who`` approved or denied the tool call."""
    note = {"by": who, "approved": approved}
    return _changed(meta, "toolCalls", chat, tool_call_id, ("decided",), note, turn)


def expiring(
    meta: Meta | None,
    family: Literal["requests", "toolCalls"],
    chat: str,
    key: str,
    at_ms: int,
    policy: ExpiryPolicy,
    *,
    turn: str | None = None,
) -> Meta | None:
    """The wait on ``key`` expires at ``at_ms``, then ``policy`` applies."""
    first = _changed(meta, family, chat, key, ("expiresAt",), at_ms, turn)
    second = _changed(first or meta, family, chat, key, ("onExpiry",), policy, turn)
    return second or first


def expired(
    meta: Meta | None,
    family: Literal["requests", "toolCalls"],
    chat: str,
    key: str,
    *,
    turn: str | None = None,
) -> Meta | None:
    """The wait on ``key`` expired: its policy was applied."""
    return _changed(meta, family, chat, key, ("expired",), True, turn)


def expired_wait(
    meta: Meta | None, chat: str, action: object, now_ms: int, *, turn: str | None
) -> Rejection | None:
    """Why ``action`` (an answer, a completion, a tool decision) comes too
    late for its wait in the chat's active turn (stamped ``turn``): its
    expiry passed (applied already or about to be). None when it is in time
    or its wait does not expire."""
    match action:
        case ChatInputAnswerChanged() | ChatInputCompleted():
            family, key, what = "requests", action.request_id, "input request"
        case ChatToolCallConfirmed():
            family, key, what = "toolCalls", action.tool_call_id, "tool call"
        case _:
            return None
    note = note_for(meta, family, chat, key, turn)
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


def expiry_of(
    meta: Meta | None, family: str, chat: str, key: str, turn: str | None
) -> tuple[int, str] | None:
    """When the wait on ``key`` of the turn stamped ``turn`` expires and what
    then applies, if it does."""
    note = note_for(meta, family, chat, key, turn)
    if note is None or not isinstance(note.get("expiresAt"), int):
        return None
    return note["expiresAt"], str(note.get("onExpiry", "cancel"))


def forgotten(
    meta: Meta | None,
    chat: str,
    requests: list[str],
    calls: list[str],
    turns: Collection[str | None] | None = None,
) -> Meta | None:
    """The notes of ``chat``'s ``requests`` and tool ``calls`` dropped (their
    turns were truncated away: a later turn may use their ids again, and
    must not inherit their answers' authors or their expiries), or None
    when there are none. With ``turns`` (the stamps of the turns truncated
    away, None for an unstamped one), only the notes of those turns and
    those that name none: a kept turn that used one of the ids keeps its
    note."""
    ours = dict(_mapping((meta or {}).get(HUDDLE)))
    dropped = False
    for family, keys in zip(FAMILIES, (requests, calls), strict=True):
        chats = dict(_mapping(ours.get(family)))
        chat_notes = dict(_mapping(chats.get(chat)))
        for key in keys:
            note = chat_notes.get(key)
            stamp = _mapping(note).get("turn")
            if note is None or (turns is not None and stamp is not None and stamp not in turns):
                continue
            del chat_notes[key]
            dropped = True
        if chat_notes:
            chats[chat] = chat_notes
        else:
            chats.pop(chat, None)
        if chats:
            ours[family] = chats
        else:
            ours.pop(family, None)
    if not dropped:
        return None
    return {**(meta or {}), HUDDLE: ours}


def _changed(
    meta: Meta | None,
    family: str,
    chat: str,
    key: str,
    path: tuple[str, ...],
    value: Any,
    turn: str | None,
) -> Meta | None:
    """``meta`` with ``value`` at ``huddle.<family>.<chat>.<key>.<path>``
    (removed when None) in the note of the turn stamped ``turn``, which
    replaces a note of another turn; None when it is there already. Copies
    only the dicts on the way there (the rest is shared with ``meta``,
    which is never changed): a note costs the size of its chat, not of the
    session."""
    entry = note_of(meta, family, chat, key) or {}
    anew = bool(entry) and not _of_turn(entry, turn)
    if anew:
        if value is None:
            return None  # nothing of this turn's to clear
        entry = {}
    holder: Any = entry
    for part in path[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    current = holder.get(path[-1]) if isinstance(holder, dict) else None
    if current == value:
        return None
    new = dict(meta) if meta else {}
    huddle = dict(_mapping(new.get(HUDDLE)))
    new[HUDDLE] = huddle
    for name in FAMILIES:
        chats = _mapping(huddle.get(name))
        if name == family or chat in chats:
            # The chat noted last goes last in both families (bounded()
            # reads the order of use from them).
            moved = {c: notes for c, notes in chats.items() if c != chat}
            moved[chat] = dict(_mapping(chats.get(chat)))
            huddle[name] = moved
    chat_notes = huddle[family][chat]
    old = chat_notes.pop(key, None)
    target = {} if anew else copy.deepcopy(_mapping(old))
    if turn is not None:
        target["turn"] = turn
    chat_notes[key] = target  # the newest last
    for part in path[:-1]:
        inner = _mapping(target.get(part))
        target[part] = inner
        target = inner
    if value is None:
        target.pop(path[-1], None)
    else:
        target[path[-1]] = value
    while len(chat_notes) > KEPT:
        del chat_notes[next(iter(chat_notes))]
    return new


def _mapping(value: Any) -> dict[str, Any]:
    """``value`` if it is a dict, else an empty one (what an agent wrote
    there that is not a note is not kept)."""
    return value if isinstance(value, dict) else {}


# ─── The bound ───────────────────────────────────────────────────────────────

_encode = msgspec.json.Encoder().encode


def notes_bytes(meta: Meta | None) -> int:
    """The bytes of JSON the notes of ``meta`` take (``requests`` and
    ``toolCalls`` together)."""
    huddle = _mapping((meta or {}).get(HUDDLE))
    return sum(len(_encode(huddle[name])) for name in FAMILIES if name in huddle)


def other_bytes(meta: Meta | None) -> int:
    """The bytes of JSON of the rest of ``meta``: all but the notes."""
    if not meta:
        return 0
    rest = {k: v for k, v in meta.items() if k != HUDDLE}
    huddle = meta.get(HUDDLE)
    if isinstance(huddle, dict):
        rest[HUDDLE] = {k: v for k, v in huddle.items() if k not in FAMILIES}
    elif huddle is not None:
        rest[HUDDLE] = huddle
    return len(_encode(rest))


def bounded(meta: Meta | None, budget: int, newest: str) -> Meta | None:
    """``meta`` with notes of at most ``budget`` bytes (``meta`` itself
    when they fit), the oldest dropped first (see the module docstring);
    the newest note of each family in the chat ``newest`` (the one just
    noted) is never dropped. None when even those do not fit on their own."""
    size = notes_bytes(meta)
    if size <= budget:
        return meta
    assert meta is not None  # notes take bytes
    new = dict(meta)
    huddle = dict(_mapping(new.get(HUDDLE)))
    new[HUDDLE] = huddle
    families = {name: dict(_mapping(huddle.get(name))) for name in FAMILIES}
    huddle.update((name, chats) for name, chats in families.items() if name in huddle)
    copied: set[tuple[str, str]] = set()
    dropping = _drop_order(families, newest)
    while size > budget:
        over = size - budget
        for name, chat, key in dropping:
            if (name, chat) not in copied:
                families[name][chat] = dict(families[name][chat])
                copied.add((name, chat))
            chat_notes = families[name][chat]
            over -= len(_encode(key)) + len(_encode(chat_notes.pop(key))) + 2
            if not chat_notes:
                del families[name][chat]
                over -= len(_encode(chat)) + 4
            if over <= 0:
                break
        else:
            return None  # nothing left to drop
        size = notes_bytes(new)  # the estimate errs by a byte a dict
    return new


def _drop_order(families: dict[str, dict[str, Any]], newest: str) -> Iterator[tuple[str, str, str]]:
    """The notes in the order :func:`bounded` drops them, as (family, chat,
    key): first those of settled requests and tool calls (completed,
    decided or expired), then those still open (a draft, a deadline); each
    time the chats noted least recently first, a chat's oldest first."""
    requests, tool_calls = (list(families[name]) for name in FAMILIES)
    chats = [c for c in _merged(requests, tool_calls) if c != newest]
    chats.append(newest)
    kept = {
        (name, newest, key)
        for name in FAMILIES
        for key in list(_mapping(families[name].get(newest)))[-1:]
    }
    for settled in (True, False):
        for chat in chats:
            keys = [
                [
                    (name, chat, key)
                    for key, note in _mapping(families[name].get(chat)).items()
                    if _settled(note) is settled and (name, chat, key) not in kept
                ]
                for name in FAMILIES
            ]
            for pair in zip_longest(*keys):
                yield from (one for one in pair if one is not None)


def _settled(note: Any) -> bool:
    """Whether ``note`` is on a request or tool call that waits no more."""
    return isinstance(note, dict) and (
        "completed" in note or "decided" in note or note.get("expired") is True
    )


def _merged(first: list[str], second: list[str]) -> list[str]:
    """The chats of two families least recently noted first: both lists are
    in that order (a chat noted goes last in both), so a chat of ``second``
    alone goes before the next chat that both hold, as ``second`` has it."""
    both = set(first) & set(second)
    out: list[str] = []
    seen: set[str] = set()
    rest = iter(second)
    for chat in first:
        if chat in both:
            for other in rest:
                if other == chat:
                    break
                if other not in both and other not in seen:
                    out.append(other)
                    seen.add(other)
        if chat not in seen:
            out.append(chat)
            seen.add(chat)
    out.extend(c for c in rest if c not in seen)
    return out
