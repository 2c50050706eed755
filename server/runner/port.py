"""Where a turn shows itself: the chat port.

The runner calls a port at each step people should see (streamed text, a
tool call's lifecycle, a request for input or approval, the end of the
turn). :class:`NullPort` shows nothing (turns with no chat);
:mod:`server.runner.bridge` shows them in an AHP chat.
"""

from __future__ import annotations

from typing import Any, Protocol

from server.runner.agent import ApprovalDecision, Tool
from server.runner.turn import Suspension, ToolCall, Turn


class ChatPort(Protocol):
    async def turn_started(self, turn: Turn) -> None:
        """The turn starts or resumes executing."""

    async def turn_taken_over(self, turn: Turn) -> None:
        """The turn's previous worker stopped mid-step and this one carries
        on (after ``turn_started``): withdraw what the dead worker left
        waiting for people (an MCP server's question), show the results it
        saved but did not show, and mark the text it streamed as cut off."""

    async def text(self, turn: Turn, delta: str) -> None:
        """Model text, as it streams, for the turn's current iteration and
        attempt (``turn.iterations``, ``turn.attempts + turn.retry_attempts``)."""

    async def tool_started(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        """The call runs now (no approval needed, or approval given)."""

    async def approval_requested(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        """The call waits for a person to approve or deny it."""

    async def tool_denied(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        """The policy denied the call: it never runs."""

    async def tool_progress(
        self, turn: Turn, call: ToolCall, message: str, data: dict[str, Any]
    ) -> None: ...

    async def tool_finished(self, turn: Turn, call: ToolCall, result: str, success: bool) -> None:
        """The call ran (or failed); ``result`` is what the model gets."""

    async def input_requested(self, turn: Turn, suspension: Suspension) -> None:
        """The turn waits for people to fill in a form or answer a question."""

    async def child_chat(self, turn: Turn, call: ToolCall, child: str) -> str | None:
        """A chat for a child turn spawned by ``call`` (None: no chat)."""

    async def turn_finished(self, turn: Turn) -> None:
        """The turn is terminal (completed, failed, cancelled, out of budget)."""


class NullPort:
    """A port that shows nothing."""

    async def turn_started(self, turn: Turn) -> None:
        return None

    async def turn_taken_over(self, turn: Turn) -> None:
        return None

    async def text(self, turn: Turn, delta: str) -> None:
        return None

    async def tool_started(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        return None

    async def approval_requested(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        return None

    async def tool_denied(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        return None

    async def tool_progress(
        self, turn: Turn, call: ToolCall, message: str, data: dict[str, Any]
    ) -> None:
        return None

    async def tool_finished(self, turn: Turn, call: ToolCall, result: str, success: bool) -> None:
        return None

    async def input_requested(self, turn: Turn, suspension: Suspension) -> None:
        return None

    async def child_chat(self, turn: Turn, call: ToolCall, child: str) -> str | None:
        return None

    async def turn_finished(self, turn: Turn) -> None:
        return None
