"""Exceptions of the server.

The tree, and who sees what::

    HuddleError
    ├── ActionRejected        a well-formed action that is invalid now: echoed
    │                         to its sender with ``rejectionReason``; state
    │                         untouched, connection kept
    ├── CommandError          a command that cannot be done (unknown session,
    │                         session exists, permission): JSON-RPC error with
    │                         an AHP code; connection kept
    ├── InputAbandoned        an awaited input request or tool confirmation
    │                         will never be answered (turn ended, cancelled,
    │                         truncated, or the chat is gone)
    ├── StoreError            the store failed
    │   ├── StoreUnavailable  unreachable (Redis down): fail fast, retry later
    │   ├── SeqConflict       another writer appended first: catch up, retry
    │   └── ChannelGone       the channel does not exist (any more)
    └── AuthError             a token that is missing, forged, expired or
                              not allowed here: HTTP 401/403 before accept

A malformed frame is :class:`protocol.codec.MalformedFrame` (the peer's
fault: a JSON-RPC error). Anything else is our bug: logged with its
traceback, the socket closed with 1011, the peer told nothing internal.
"""

from __future__ import annotations

from protocol.rejections import Rejection


class HuddleError(Exception):
    """Base of the server's exceptions."""


class ActionRejected(HuddleError):
    """The host refused an action: ``code`` (stable) and ``sentence``;
    ``reason`` is the ``rejectionReason`` they make."""

    def __init__(self, code: str, sentence: str) -> None:
        super().__init__(code, sentence)
        self.code = code
        self.sentence = sentence

    @classmethod
    def of(cls, rejection: Rejection) -> ActionRejected:
        return cls(rejection.code, rejection.sentence)

    @classmethod
    def parse(cls, reason: str) -> ActionRejected:
        """The rejection a ``rejectionReason`` received from a server says
        (a reason without a code has an empty one)."""
        code, colon, sentence = reason.partition(": ")
        return cls(code, sentence) if colon else cls("", reason)

    @property
    def reason(self) -> str:
        return f"{self.code}: {self.sentence}" if self.code else self.sentence

    def __str__(self) -> str:
        return f"action rejected: {self.reason}"


class CommandError(HuddleError):
    """A command failed; ``code`` is the JSON-RPC/AHP error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class InputAbandoned(HuddleError):
    """The awaited request will not be answered; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"input abandoned: {self.reason}"


class StoreError(HuddleError):
    """The store failed."""


class StoreUnavailable(StoreError):
    """The store cannot be reached now."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def __str__(self) -> str:
        return f"store unavailable: {self.detail}"


class SeqConflict(StoreError):
    """An append expected ``expected`` but the channel is at ``current``."""

    def __init__(self, channel: str, expected: int, current: int) -> None:
        super().__init__(channel, expected, current)
        self.channel = channel
        self.expected = expected
        self.current = current

    def __str__(self) -> str:
        return f"{self.channel}: expected seq {self.expected}, store is at {self.current}"


class ChannelGone(StoreError):
    """The channel does not exist."""

    def __init__(self, channel: str) -> None:
        super().__init__(channel)
        self.channel = channel

    def __str__(self) -> str:
        return f"no such channel: {self.channel}"


class AuthError(HuddleError):
    """Authentication or authorisation failed; ``status`` is 401 or 403."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.status}: {self.reason}"
