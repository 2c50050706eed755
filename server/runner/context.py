"""The context a tool runs in: who it is, which call, and what it may do.

It lives for one tool call only (a context variable set around the call)
and is never saved: what must survive is on the turn (the submitted form
data, by call id).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from server.core.expiry import Expiry
from server.runner.agent import Tool
from server.runner.ids import idempotency_key
from server.runner.model import ChatModel
from server.runner.port import ChatPort
from server.runner.turn import ToolCall

ProgressSink = Callable[[str, dict[str, Any]], None]
Lend = Callable[[], contextlib.AbstractContextManager[None]]
"""What lends a worker's place while its tool waits for people (see
:meth:`ToolContext.people_answering`)."""

_current: contextvars.ContextVar[ToolContext] = contextvars.ContextVar("huddle_tool_context")
_lender: contextvars.ContextVar[Lend | None] = contextvars.ContextVar(
    "huddle_worker_lender", default=None
)


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
    """That AHP turn's stamp (server.core.policy.turn_stamp), if it has one."""
    port: ChatPort | None = None
    """Where the turn shows itself (in a server: its chat bridge, whose host
    lets a tool ask the chat's people, as MCP tools do for elicitations)."""
    model: ChatModel | None = None
    """The chat model of the turn's agent (MCP sampling asks it)."""
    input_expiry: Expiry | None = None
    """The agent's default expiry for questions (MCP elicitations use it)."""
    _progress: ProgressSink | None = None
    _cancelled: Callable[[], bool] = lambda: False
    _lend: Lend = contextlib.nullcontext

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

    def people_answering(self) -> contextlib.AbstractContextManager[None]:
        """Wrap a wait for people inside the tool in this (an MCP server's
        question put to the chat does): the worker running the turn lends its
        place meanwhile, and a spare worker runs other turns until the wait
        ends (:class:`~server.runner.worker.Crew`). Usable from any task;
        outside a worker it does nothing."""
        return self._lend()

    def emit_progress(self, message: str, **data: Any) -> None:
        """Report progress (shown on the tool call); never changes the result."""
        if self._progress is not None:
            self._progress(message, data)

    @staticmethod
    def current() -> ToolContext:
        """The context of the tool call running now; LookupError outside one."""
        return _current.get()


def lender() -> Lend:
    """What lends the place of the worker running this task (nothing lends
    outside a worker): the runner gives it to the tool's context."""
    return _lender.get() or contextlib.nullcontext


def lend_with(lend: Lend) -> None:
    """Make ``lend`` what the tools run in this task (a worker's own) lend
    its place with."""
    _lender.set(lend)


def enter(context: ToolContext) -> contextvars.Token[ToolContext]:
    return _current.set(context)


def leave(token: contextvars.Token[ToolContext]) -> None:
    _current.reset(token)
