"""Channel URIs: ``ahp-root://``, ``ahp-session:/<id>`` and ``ahp-chat:/<id>``."""

from __future__ import annotations

import re
from typing import Literal

from protocol.wire import quoted

ROOT_URI = "ahp-root://"
SESSION_SCHEME = "ahp-session:/"
CHAT_SCHEME = "ahp-chat:/"

ChannelKind = Literal["root", "session", "chat"]

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,127}")


class BadChannelUri(ValueError):
    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.uri = uri

    def __str__(self) -> str:
        return (
            f"not a channel URI: {quoted(self.uri)} (expected ahp-root://, "
            "ahp-session:/<id> or ahp-chat:/<id>)"
        )


def session_uri(session_id: str) -> str:
    return SESSION_SCHEME + session_id


def chat_uri(chat_id: str) -> str:
    return CHAT_SCHEME + chat_id


def channel_kind(uri: str) -> ChannelKind:
    """The kind of channel ``uri`` names; raises :class:`BadChannelUri`."""
    if uri == ROOT_URI:
        return "root"
    if uri.startswith(SESSION_SCHEME) and _ID.fullmatch(uri[len(SESSION_SCHEME) :]):
        return "session"
    if uri.startswith(CHAT_SCHEME) and _ID.fullmatch(uri[len(CHAT_SCHEME) :]):
        return "chat"
    raise BadChannelUri(uri)


def channel_id(uri: str) -> str:
    """The id part of a session or chat URI (empty for the root channel)."""
    kind = channel_kind(uri)
    if kind == "session":
        return uri[len(SESSION_SCHEME) :]
    if kind == "chat":
        return uri[len(CHAT_SCHEME) :]
    return ""
