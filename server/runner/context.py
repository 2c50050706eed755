"""The context a tool runs in: who it is, which call, and what it may do.

It lives for one tool call only (a context variable set around the call)
and is never saved: what must survive is on the turn (the submitted form
data, by call id).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from server.expiry import Expiry
from server.runner.agent import Tool
from server.runner.ids import idempotency_key
from server.runner.model import ChatModel
from server.runner.port import ChatPort
from server.runner.turn import ToolCall

ProgressSink = Callable[[str, dict[str, Any]], None]

_current: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("huddle_tool_context")


@dataclass(frozen=True)
class ToolContext:
    turn_id: str
    root_turn_id: str
    parent_turn_id: str | None
    agent_id: str
    agent_version: str
    tool: Tool
    tool_call: ToolCall
    submitted_form_data: dict[str, Any] = field(default_factory=dict)
    """What people submitted for this call's form, after a FormRequired."""
    form_submitted: bool = False
    """Whether people submitted this call's form (after a FormRequired),
    even with nothing filled in: ask this, not whether the data is empty."""
    chat: str | None = None
    """The AHP chat the turn shows in (None: a turn without a chat)."""
    chat_turn: str | None = None
    """The AHP turn of ``chat`` the turn shows."""
    chat_turn_stamp: str | None = None
    """That AHP turn's stamp (server.policy.turn_stamp), if it has one."""
    port: ChatPort | None = None
    """Where the turn shows itself (in a server: its chat bridge, whose host
    lets a tool ask the chat's people, as MCP tools do for elicitations)."""
    model: ChatModel | None = None
    """The chat model of the turn's agent (MCP sampling asks it)."""
    input_expiry: Expiry | None = None
    """The agent's default expiry for questions (MCP elicitations use it)."""
    _progress: ProgressSink | None = None
    _cancelled: Callable[[], bool] = lambda: False

    @property
    def idempotency_key(self) -> str:
        """``<turnId>:<toolCallId>``: the same every time this call runs (a
        retry, a replay after a form, another worker taking over), so an
        external side effect keyed on it happens once."""
        return idempotency_key(self.turn_id, self.tool_call.id)

    @property
    def tool_call_id(self) -> str:
        return self.tool_call.id

    @property
    def cancellation_requested(self) -> bool:
        """True once someone asked to cancel the turn: check it at safe
        points (between pages, polls, batches); the runner cannot interrupt
        a tool."""
        return self._cancelled()

    def emit_progress(self, message: str, **data: Any) -> None:
        """Report progress (shown on the tool call); never changes the result."""
        if self._progress is not None:
            self._progress(message, data)

    @staticmethod
    def current() -> ToolContext:
        """The context of the tool call running now; LookupError outside one."""
        return _current.get()


def enter(context: ToolContext) -> contextvars.Token[ToolContext]:
    return _current.set(context)


def leave(token: contextvars.Token[ToolContext]) -> None:
    _current.reset(token)
