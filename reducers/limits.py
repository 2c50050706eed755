"""How much an action may put into a channel's state.

``limit_problem(state, action, limits, state_bytes)`` is ``None`` when the
action fits, else the rejection (``state_bytes``: about how many bytes of
JSON the channel's state takes now). Like the validation rules it is pure; the host checks
it before them, for every sender (an agent's bug must not make a chat
unloadable either). Sizes are the UTF-8 bytes of the value as JSON; counts
are of the entries a list in state would hold after the action::

    what                                   limit (SizeLimits)  code
    -------------------------------------  ------------------  ---------
    a session's title                      title               too-large
    a message (turn start, pending         message             too-large
      message, draft), a streamed delta
    one answer (inputAnswerChanged, each   answer              too-large
      answer an inputCompleted carries)
    tool data (input, edited input,        tool_data           too-large
      result, content, progress, an
      active client's entry and tools)
    any action, whole                      action              too-large
    queued messages of a chat              queued_messages     too-many
    active clients of a session            active_clients      too-many
    working directories of a chat or       working_directories too-many
      session
    a chat's whole state, for a new turn   chat_bytes          chat-full
      or pending message (once it holds
      this much, the rest still goes on)

The sentence names what is too large or too many and the limit, never the
content.
"""

from __future__ import annotations

from typing import Any

import msgspec

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatPendingMessageSet,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatTurnStarted,
    ChatWorkingDirectorySet,
    SessionActiveClientSet,
    SessionTitleChanged,
    SessionWorkingDirectorySet,
    StateAction,
    action_type,
)
from protocol.chat import ChatState
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import SessionState

_encode = msgspec.json.Encoder().encode


class SizeLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The limits of the module docstring (bytes of JSON, or entries)."""

    title: int = 1024
    message: int = 64 * 1024
    answer: int = 16 * 1024
    tool_data: int = 256 * 1024
    action: int = 512 * 1024
    queued_messages: int = 50
    active_clients: int = 200
    working_directories: int = 50
    chat_bytes: int = 16 << 20


def limit_problem(
    state: ChannelState, action: StateAction, limits: SizeLimits, state_bytes: int = 0
) -> Rejection | None:
    """Why ``action`` would put too much into ``state`` (whose JSON takes
    about ``state_bytes``), or None."""
    for what, value, limit in _measured(action, limits):
        size = len(value.encode()) if isinstance(value, str) else len(_encode(value))
        if size > limit:
            return Rejection(
                RejectionCode.TOO_LARGE, f"{what} is {size:,} bytes; the limit is {limit:,}"
            )
    size = len(_encode(action))
    if size > limits.action:
        return Rejection(
            RejectionCode.TOO_LARGE,
            f"the {action_type(action)} action is {size:,} bytes; the limit is {limits.action:,}",
        )
    return _count_problem(state, action, limits) or _full_problem(
        state, action, limits, state_bytes
    )


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


def _measured(action: StateAction, limits: SizeLimits) -> list[tuple[str, Any, int]]:
    """The parts of ``action`` that have a limit of their own."""
    match action:
        case SessionTitleChanged():
            return [("the title", action.title, limits.title)]
        case ChatTurnStarted() | ChatPendingMessageSet():
            return [("the message", action.message, limits.message)]
        case ChatDraftChanged() if action.draft is not None:
            return [("the draft", action.draft, limits.message)]
        case ChatDelta():
            return [("the delta", action.content, limits.message)]
        case ChatInputAnswerChanged() if action.answer is not None:
            return [(f"the answer to '{action.question_id}'", action.answer, limits.answer)]
        case ChatInputCompleted():
            answers = action.answers or {}
            return [(f"the answer to '{q}'", a, limits.answer) for q, a in answers.items()]
        case ChatToolCallReady() if action.tool_input is not None:
            return [("the tool input", action.tool_input, limits.tool_data)]
        case ChatToolCallConfirmed() if action.edited_tool_input is not None:
            return [("the edited tool input", action.edited_tool_input, limits.tool_data)]
        case ChatToolCallComplete():
            return [("the tool result", action.result, limits.tool_data)]
        case ChatToolCallContentChanged():
            return [("the tool call's content", action.content, limits.tool_data)]
        case ChatToolCallDelta():
            return [("the tool input delta", action.content, limits.tool_data)]
        case SessionActiveClientSet():
            return [("the active client's entry", action.active_client, limits.tool_data)]
    return []


def _count_problem(
    state: ChannelState, action: StateAction, limits: SizeLimits
) -> Rejection | None:
    match action:
        case ChatPendingMessageSet(kind="queued") if isinstance(state, ChatState):
            queued = state.queued_messages or []
            if len(queued) >= limits.queued_messages and all(m.id != action.id for m in queued):
                return _too_many(
                    f"the chat has {len(queued)} queued messages", limits.queued_messages
                )
        case SessionActiveClientSet() if isinstance(state, SessionState):
            clients = state.active_clients
            new = all(c.client_id != action.active_client.client_id for c in clients)
            if new and len(clients) >= limits.active_clients:
                return _too_many(
                    f"the session has {len(clients)} active clients", limits.active_clients
                )
        case SessionWorkingDirectorySet() | ChatWorkingDirectorySet() if isinstance(
            state, SessionState | ChatState
        ):
            held = state.working_directories or []
            if action.directory not in held and len(held) >= limits.working_directories:
                return _too_many(
                    f"there are {len(held)} working directories", limits.working_directories
                )
    return None


def _too_many(what: str, limit: int) -> Rejection:
    return Rejection(RejectionCode.TOO_MANY, f"{what}; the limit is {limit:,}")
