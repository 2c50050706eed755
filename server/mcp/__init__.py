"""The MCP elicitation bridge: MCP servers that ask for input reach the
people of a chat; and Huddle as an MCP server, whose tools MCP clients call
to ask them (:mod:`server.mcp.door`, served at ``/mcp`` by the edge).

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
  streamable HTTP or in process) as a source of runner tools; with
  ``mode="auto"`` it falls back to 2025-11-25 for a server that will not
  ask in 2026-07-28.
- :mod:`server.mcp.sampling`: :class:`ChatSampling`, sampling requests
  approved (and edited) by the chat's people and answered by the agent's
  model; off unless ``McpServerConfig(sampling=True)``.
"""

from server.mcp.calls import call_tool
from server.mcp.elicitation import ChatElicitation, UrlCompletions
from server.mcp.errors import (
    ElicitationExpired,
    LinkRefused,
    McpBridgeError,
    McpToolFailed,
    Unaskable,
)
from server.mcp.people import HostChat, People, RemoteChat, Reply
from server.mcp.sampling import ChatSampling
from server.mcp.tools import McpServerConfig, McpToolSource

__all__ = [
    "ChatElicitation",
    "ChatSampling",
    "ElicitationExpired",
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
