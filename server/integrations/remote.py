"""The people of a chat reached from an agent's own process: over the
WebSocket, with an agent token."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from server.client import HuddleClient
from server.mcp.people import RemoteChat


@contextlib.asynccontextmanager
async def people_of(url: str, token: str, chat: str) -> AsyncIterator[RemoteChat]:
    """The people of ``chat`` (an AHP chat URI) on the Huddle server at
    ``url`` (its WebSocket), asked with the agent ``token``; connected while
    this is held, closed after. Raises Disconnected when the server refuses."""
    client = await HuddleClient.connect(url, token)
    try:
        yield RemoteChat(client, chat)
    finally:
        await client.close()
