"""How much an action may put into a channel's state.

``limit_problem(state, action, limits, state_bytes)`` is ``None`` when the
action fits, else the rejection (``state_bytes``: about how many bytes of
JSON the channel's state takes now). Like the validation rules it is
pure; the host checks it before them, for every sender (an agent's bug must
not make a chat unloadable either). Sizes are the UTF-8 bytes of the value
as JSON, a string's without its quotes (an escaped character counts as its
escape, as every snapshot carries it: a title of 1,024 control characters
is 6,144 bytes); counts are of the entries a list in state would hold after
the action::

    what                                   limit (SizeLimits)  code
    -------------------------------------  ------------------  ---------
    an id or a timestamp, anywhere in the  id; a turn id:      too-large
      action (see below)                     turn_id
    a session's title                      title               too-large
    a working directory of a chat or       uri                 too-large
      session
    a message (turn start, pending         message             too-large
      message, draft), a streamed delta,
      a denied tool call's reason and
      suggestion
    one answer (inputAnswerChanged, each   answer              too-large
      answer an inputCompleted carries)
    tool data (input, edited input,        tool_data           too-large
      result, content, progress, a tool
      call's _meta, an active client's
      entry and tools)
    any action, whole                      action              too-large
    queued messages of a chat              queued_messages     too-many
      and their bytes together             queued_bytes        too-large
    active clients of a session            active_clients      too-many
      and their entries' bytes together    active_client_bytes too-large
    working directories of a chat or       working_directories too-many
      session
    chats of a session (its catalog,       chats               too-many
      which every snapshot of the session
      carries whole)
    a chat's whole state, for a new turn   chat_bytes          chat-full
      or pending message (once it holds
      this much, the rest still goes on)
    a session's notes (written by the      notes               (the oldest
      server alone: server.core.session_notes)                                are dropped)

Ids are found by name, at any depth of the action's Structs, so that a new
field is covered the day it is added: a field named ``id`` or ``<x>Id``
(``turnId``, ``requestId``, ``toolCallId``, ``questionId``, ``clientId``,
``selectedOptionId``...), each entry of a ``<x>Ids`` list, each key of a
map of Structs (the question ids of ``answers``) and, as short as ids, a
timestamp ``<x>At`` (``startedAt``). A turn id has the smaller limit
because the runner builds the ids of a turn's input requests and reply
parts on it (``<turnId>:input:<callId>``, ``<turnId>:md:<n>``), and those
must fit the id limit. What a client sends as JSON the host does not
interpret (``_meta``, tool input, config) is not searched for ids.

The sentence names what is too large or too many and the limit, never the
content; an id by where it is (``the request.questions[0].options[1].id``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import msgspec

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatPendingMessageSet,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatToolCallResultConfirmed,
    ChatToolCallStart,
    ChatTurnStarted,
    ChatWorkingDirectorySet,
    SessionActiveClientSet,
    SessionChatAdded,
    SessionTitleChanged,
    SessionWorkingDirectorySet,
    StateAction,
    action_type,
)
from protocol.chat import ChatState
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import SessionState
from protocol.wire import MAX_ID_BYTES

_encode = msgspec.json.Encoder().encode

TOOL_CALL_ACTIONS = (
    ChatToolCallStart,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatToolCallConfirmed,
    ChatToolCallComplete,
    ChatToolCallResultConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
)
"""The actions whose ``_meta`` the tool call keeps."""


class SizeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits of the module docstring (bytes of JSON, or entries)."""

    title: int = 1024
    message: int = 64 * 1024
    answer: int = 16 * 1024
    tool_data: int = 256 * 1024
    action: int = 512 * 1024
    queued_messages: int = 50
    queued_bytes: int = 512 << 10
    active_clients: int = 200
    active_client_bytes: int = 512 << 10
    working_directories: int = 50
    id: int = MAX_ID_BYTES
    """An id or a timestamp in an action; also a connection's clientId
    (checked where the client names it, at initialize and reconnect)."""
    turn_id: int = 128
    uri: int = 1024
    chat_bytes: int = 16 << 20
    chats: int = 1000
    notes: int = 64 << 10
    """The session's notes (``_meta.huddle.requests`` and ``toolCalls``,
    reducers.notes) together: the server drops the oldest beyond, as it
    writes them (they are the server's, so nothing is refused). AHP's
    ``session/metaChanged`` carries the whole ``_meta``, so every note sends
    them all to every watcher: kept small (about 120 settled requests)."""


def limit_problem(
    state: ChannelState, action: StateAction, limits: SizeLimits, state_bytes: int = 0
) -> Rejection | None:
    """Why ``action`` would put too much into ``state`` (whose JSON takes
    about ``state_bytes``), or None."""
    for found in _ids(action, ()):
        limit = limits.turn_id if found.path[-1] == "turnId" else limits.id
        size = json_bytes(found.value)
        if size > limit:  # where it is is put in words only for a rejection
            return _over(found.what, size, limit)
    for what, value, limit in _measured(action, limits):
        if (rejection := _too_large(what, value, limit)) is not None:
            return rejection
    size = json_bytes(action)
    rejection = _over(f"the {action_type(action)} action", size, limits.action)
    return (
        rejection
        or _count_problem(state, action, limits)
        or _full_problem(state, action, limits, state_bytes)
    )


def _too_large(what: str, value: Any, limit: int) -> Rejection | None:
    return _over(what, json_bytes(value), limit)


def _over(what: str, size: int, limit: int) -> Rejection | None:
    if size <= limit:
        return None
    return Rejection(RejectionCode.TOO_LARGE, f"{what} is {size:,} bytes; the limit is {limit:,}")


def json_bytes(value: Any) -> int:
    """The size of ``value`` as the limits measure it: its JSON's UTF-8
    bytes, a string's without the two quotes."""
    size = len(_encode(value))
    return size - 2 if isinstance(value, str) else size


def _full_problem(
    state: ChannelState, action: StateAction, limits: SizeLimits, state_bytes: int
) -> Rejection | None:
    """A full chat takes no new turn or message: its people start a new
    chat (what is under way in it still ends as it would)."""
    if (
        isinstance(state, ChatState)
        and isinstance(action, ChatTurnStarted | ChatPendingMessageSet)
        and state_bytes >= limits.chat_bytes
    ):
        return Rejection(
            RejectionCode.CHAT_FULL,
            f"the chat holds about {state_bytes:,} bytes; the limit is {limits.chat_bytes:,}: "
            "start a new chat",
        )
    return None


class _Id(NamedTuple):
    """An id found in an action: where (wire names and list indices), the
    id, and whether it is a key of a map there."""

    path: tuple[str | int, ...]
    value: str
    key: bool = False

    @property
    def what(self) -> str:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in self.path)
        return f"a key of {where[1:]}" if self.key else f"the {where[1:]}"


_AN_ID, _ID_LIST, _OTHER = "id", "ids", "other"
_FIELDS: dict[type, tuple[tuple[str, str, str], ...]] = {}
"""Per Struct type, each field's name, wire name and what its name makes
it (an id, a list of ids, or neither): read once per type, not once per
field of every action (the types are the protocol's, a bounded set)."""


def _fields(struct: type[msgspec.Struct]) -> tuple[tuple[str, str, str], ...]:
    found = _FIELDS.get(struct)
    if found is None:
        found = _FIELDS[struct] = tuple(
            (name, wire, _kind(name))
            for name, wire in zip(
                struct.__struct_fields__, struct.__struct_encode_fields__, strict=True
            )
        )
    return found


def _kind(name: str) -> str:
    if name == "id" or name.endswith(("_id", "_at")):
        return _AN_ID
    return _ID_LIST if name.endswith("_ids") else _OTHER


def _ids(value: object, path: tuple[str | int, ...]) -> Iterator[_Id]:
    """Every id in ``value`` (a Struct, or a list of them) at ``path``; see
    the module docstring for what counts as one."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _ids(item, (*path, index))
        return
    if not isinstance(value, msgspec.Struct):
        return
    for name, wire, kind in _fields(type(value)):
        field = getattr(value, name)
        if kind is _AN_ID:
            if isinstance(field, str):
                yield _Id((*path, wire), field)
            continue
        if field is None or isinstance(field, (str, int, float)):
            continue  # most fields: nothing to look into
        at = (*path, wire)
        if kind is _ID_LIST and isinstance(field, list):
            yield from (_Id((*at, i), item) for i, item in enumerate(field))
        elif isinstance(field, dict):
            for key, item in field.items():
                if isinstance(item, msgspec.Struct):
                    yield _Id(at, key, key=True)
                    yield from _ids(item, (*at, key))
        else:
            yield from _ids(field, at)


def _measured(action: StateAction, limits: SizeLimits) -> list[tuple[str, Any, int]]:
    """The parts of ``action`` that have a limit of their own (None: absent)."""
    return [m for m in _parts(action, limits) if m[1] is not None]


def _parts(action: StateAction, limits: SizeLimits) -> list[tuple[str, Any, int]]:
    parts: list[tuple[str, Any, int]] = []
    if isinstance(action, TOOL_CALL_ACTIONS):
        parts.append(("the tool call's _meta", action.meta, limits.tool_data))
    match action:
        case SessionTitleChanged():
            parts.append(("the title", action.title, limits.title))
        case SessionWorkingDirectorySet() | ChatWorkingDirectorySet():
            parts.append(("the working directory", action.directory, limits.uri))
        case ChatTurnStarted() | ChatPendingMessageSet():
            parts.append(("the message", action.message, limits.message))
        case ChatDraftChanged():
            parts.append(("the draft", action.draft, limits.message))
        case ChatDelta():
            parts.append(("the delta", action.content, limits.message))
        case ChatInputAnswerChanged():
            parts.append((f"the answer to '{action.question_id}'", action.answer, limits.answer))
        case ChatInputCompleted():
            answers = action.answers or {}
            parts.extend((f"the answer to '{q}'", a, limits.answer) for q, a in answers.items())
        case ChatToolCallReady():
            parts.append(("the tool input", action.tool_input, limits.tool_data))
        case ChatToolCallConfirmed():
            parts.append(("the edited tool input", action.edited_tool_input, limits.tool_data))
            parts.append(("the reason", action.reason_message, limits.message))
            parts.append(("the suggestion", action.user_suggestion, limits.message))
        case ChatToolCallComplete():
            parts.append(("the tool result", action.result, limits.tool_data))
        case ChatToolCallContentChanged():
            parts.append(("the tool call's content", action.content, limits.tool_data))
        case ChatToolCallDelta():
            parts.append(("the tool input delta", action.content, limits.tool_data))
        case SessionActiveClientSet():
            parts.append(("the active client's entry", action.active_client, limits.tool_data))
    return parts


def _count_problem(
    state: ChannelState, action: StateAction, limits: SizeLimits
) -> Rejection | None:
    match action:
        case ChatPendingMessageSet(kind="queued") if isinstance(state, ChatState):
            queued = state.queued_messages or []
            others = [m for m in queued if m.id != action.id]
            if len(others) == len(queued) and len(queued) >= limits.queued_messages:
                return _too_many(
                    f"the chat has {len(queued)} queued messages", limits.queued_messages
                )
            together = json_bytes(others) + json_bytes(action.message)
            return _over("the chat's queued messages together", together, limits.queued_bytes)
        case SessionActiveClientSet() if isinstance(state, SessionState):
            clients = state.active_clients
            entry = action.active_client
            present = [c for c in clients if c.client_id != entry.client_id]
            if len(present) == len(clients) and len(clients) >= limits.active_clients:
                return _too_many(
                    f"the session has {len(clients)} active clients", limits.active_clients
                )
            together = json_bytes(present) + json_bytes(entry)
            return _over(
                "the session's active clients together", together, limits.active_client_bytes
            )
        case SessionWorkingDirectorySet() | ChatWorkingDirectorySet() if isinstance(
            state, SessionState | ChatState
        ):
            held = state.working_directories or []
            if action.directory not in held and len(held) >= limits.working_directories:
                return _too_many(
                    f"there are {len(held)} working directories", limits.working_directories
                )
        case SessionChatAdded() if isinstance(state, SessionState):
            chats = state.chats
            new = all(c.resource != action.summary.resource for c in chats)
            if new and len(chats) >= limits.chats:
                return _too_many(f"the session has {len(chats):,} chats", limits.chats)
    return None


def _too_many(what: str, limit: int) -> Rejection:
    return Rejection(RejectionCode.TOO_MANY, f"{what}; the limit is {limit:,}")
