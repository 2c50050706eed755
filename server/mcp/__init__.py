"""The MCP elicitation bridge: MCP servers that ask for input reach the
people of a chat.

- :mod:`server.mcp.elicitation`: :class:`ChatElicitation`, the elicitation
  callback for the ``mcp`` SDK's ``Client`` / ``ClientSession`` (form and URL
  elicitations become input requests; the people's answers become the
  spec's ``ElicitResult``), and :class:`UrlCompletions`.
- :mod:`server.mcp.people`: where the questions go: :class:`HostChat` (the
  server's own host) or :class:`RemoteChat` (a ``HuddleClient``).
- :mod:`server.mcp.calls`: :func:`call_tool`, which drives the 2026-07-28
  ``input_required`` rounds, calls again when a ``requestState`` expired
  while people answered, and handles -32042.
- :mod:`server.mcp.tools`: :class:`McpToolSource`, an MCP server (stdio,
  streamable HTTP or in process) as a source of runner tools.
"""

from server.mcp.calls import call_tool
from server.mcp.elicitation import ChatElicitation, UrlCompletions
from server.mcp.errors import LinkRefused, McpBridgeError, McpToolFailed, Unaskable
from server.mcp.people import HostChat, People, RemoteChat, Reply
from server.mcp.tools import McpServerConfig, McpToolSource

__all__ = [
    "ChatElicitation",
    "HostChat",
    "LinkRefused",
    "McpBridgeError",
    "McpServerConfig",
    "McpToolSource",
    "McpToolFailed",
    "People",
    "RemoteChat",
    "Reply",
    "Unaskable",
    "UrlCompletions",
    "call_tool",
]
