"""Exceptions of the MCP bridge: the ``McpBridgeError`` branch of the one
tree that :mod:`server.errors` draws whole, with what the MCP server or the
runner gets for each.

Errors of the MCP connection itself stay the SDK's (``MCPError``,
``InputRequiredRoundsExceededError``); a person's decline or dismissal of a
form is never an error: the MCP server gets ``decline`` or ``cancel``.
"""

from __future__ import annotations

from server.errors import HuddleError
from server.runner.errors import WaitExpired


class McpBridgeError(HuddleError):
    """Base of the MCP bridge's exceptions."""


class Unaskable(McpBridgeError):
    """An elicitation that cannot be put to people; ``reason`` says why
    (it names the property at fault, never a value)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"cannot ask this in a chat: {self.reason}"


class LinkRefused(McpBridgeError):
    """People did not agree to open a link the MCP server needs before it
    can answer (``action`` is ``decline`` or ``cancel``)."""

    def __init__(self, server: str, url: str, action: str) -> None:
        super().__init__(server, url, action)
        self.server, self.url, self.action = server, url, action

    def __str__(self) -> str:
        verb = "declined" if self.action == "decline" else "dismissed"
        return f"{self.server} needs {self.url} opened first, and people {verb} it"


class ElicitationExpired(McpBridgeError, WaitExpired):
    """Nobody answered an MCP server's question in time, and its expiry's
    policy is ``fail``: the MCP server gets error -32001 (request timeout)
    with ``message``, the call fails, and a runner's turn fails with it."""

    def __init__(self, chat: str, message: str) -> None:
        WaitExpired.__init__(self, message)
        self.chat = chat

    def __str__(self) -> str:
        return self.message


class McpToolFailed(McpBridgeError):
    """An MCP tool reported an error; ``text`` is what it said."""

    def __init__(self, tool: str, text: str) -> None:
        super().__init__(tool, text)
        self.tool, self.text = tool, text

    def __str__(self) -> str:
        return f"{self.tool} failed: {self.text}" if self.text else f"{self.tool} failed"
