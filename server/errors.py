"""Every exception Huddle raises, in one tree.

The classes live where they are raised (the module is named on the right),
and are drawn here whole: what each means, and who sees what. Imports point
down: this module imports nothing from ``server.runner`` or ``server.mcp``::

    HuddleError                     server.errors
    ├── ActionRejected              a well-formed action that is invalid now:
    │   │                           echoed to its sender with
    │   │                           ``rejectionReason``; state untouched,
    │   │                           connection kept
    │   └── RateLimited             server.ratelimit: over the token's
    │                               budget (``rate-limited``; over HTTP 429
    │                               with ``Retry-After``)
    ├── CommandError                a command that cannot be done (unknown
    │                               session, session exists, permission):
    │                               JSON-RPC error with an AHP code;
    │                               connection kept
    ├── InputAbandoned              an awaited input request or tool
    │                               confirmation will never be answered (turn
    │                               ended, cancelled, truncated, or the chat
    │                               is gone)
    ├── AuthError                   a token that is missing, forged, expired
    │   │                           or not allowed here: HTTP 401/403 before
    │   │                           accept
    │   └── AuthThrottled           server.ratelimit: too many failed
    │                               authentications from the client's
    │                               address: 429 with ``Retry-After``, the
    │                               token not looked at
    ├── BodyTooLarge                an HTTP API body over ``max_body_bytes``:
    │                               413, refused before it is read
    ├── ProtocolError               (client) the server answered a request
    │                               with a JSON-RPC error
    ├── Disconnected                (client) the connection is gone and the
    │                               client closed, or it was refused
    ├── StoreError                  the store failed
    │   ├── StoreUnavailable        unreachable (Redis down): fail fast,
    │   │                           retry later
    │   ├── SeqConflict             another writer appended first: catch up,
    │   │                           retry
    │   ├── ChannelGone             the channel does not exist (any more)
    │   ├── AlreadyApplied          an action re-sent with the clientId and
    │   │                           clientSeq of one the channel took: it gets
    │   │                           the first one's envelope, nothing twice
    │   ├── TurnNotFound            server.runner.errors: no such turn
    │   ├── TurnExists              server.runner.errors: ``create`` of an id
    │   │                           the turn store holds
    │   ├── VersionConflict         server.runner.errors: the turn was saved
    │   │                           since it was loaded: reload, decide again
    │   └── Fenced                  server.runner.errors: the lease was taken
    │                               over: stop working on the turn
    ├── RunnerError                 server.runner.errors
    │   ├── UnknownAgent            the runner has no agent of that name
    │   ├── AgentVersionGone        the runner no longer has the agent
    │   │                           version a turn started with: the turn is
    │   │                           not run with other code (bounded attempts,
    │   │                           then it fails with this message)
    │   ├── ResumeRejected          a late, duplicate or mismatched resume
    │   │                           (its kind or correlation id); nothing
    │   │                           changed
    │   ├── TurnBusy                another worker holds the turn's lease
    │   ├── FormRequired            raised by a tool before any side effect:
    │   │                           the turn waits for a form, then the tool
    │   │                           runs again with the data
    │   ├── WaitExpired             raised by a tool whose wait for people
    │   │   │                       expired with the ``fail`` policy: the
    │   │   │                       turn fails with its message
    │   │   └── ElicitationExpired  server.mcp.errors (an McpBridgeError too):
    │   │                           an MCP server's question; the server gets
    │   │                           -32001 and the call fails
    │   ├── TransientError          raised by a model or a tool: the turn is
    │   │   │                       retried later, with backoff
    │   │   └── ModelUnavailable    429, 408 or 5xx; a timeout; a connection
    │   │                           that failed or dropped; a stream that
    │   │                           stopped early or reported an error
    │   └── ModelError              not worth retrying: the turn fails
    │       ├── ModelRequestRejected  any answer but 2xx (400, 401, 404...),
    │       │                       with the API's own message
    │       ├── ModelReplyInvalid   a reply that breaks the API (a tool call
    │       │                       without a name or whose arguments are not
    │       │                       a JSON object, no event stream)
    │       └── ModelNotConfigured  ``OpenAIChatModel.from_env``: a variable
    │                               is not set
    └── McpBridgeError              server.mcp.errors: between an MCP server
        │                           and the chat
        ├── Unaskable               an elicitation Huddle cannot put to people
        │                           (a schema outside MCP's flat subset, a URL
        │                           that is not http(s)): the MCP server gets
        │                           a JSON-RPC error (-32602) naming the reason
        ├── LinkRefused             a URL elicitation that a call needs
        │                           (-32042) was declined or dismissed: the
        │                           call fails
        └── McpToolFailed           an MCP tool answered with ``isError``: the
                                    runner gives the model the tool's own text

    InternalError                   server.errors: our bug, never the peer's
    └── IllegalTransition           server.runner.errors: a turn asked for a
                                    status change its status does not allow

The pure layer cannot import this module, so its exceptions form roots of
their own::

    MalformedFrame                  protocol.codec: a frame that is not valid
                                    JSON-RPC or whose params do not fit: a
                                    JSON-RPC error (HTTP 400)
    ValueError
    ├── BadChannelUri               protocol.uris: not a channel URI
    ├── AuditBroken                 server.core.audit: an audit's hash chain is
    │                               broken (a record removed, altered or
    │                               out of place): ``huddle audit verify``
    │                               exits 1 naming the line
    └── FormError                   protocol.forms: a form problem
        ├── FormSchemaError         the schema is outside the flat subset
        └── FormDataError           answers or data do not fit the form

A wrong argument or setting at start-up (``huddle`` flags, an agent token
too short, ``--agent`` that names no agent) is a plain ``ValueError``.
Errors of the MCP connection itself stay the SDK's (``MCPError``,
``InputRequiredRoundsExceededError``); a person's decline or dismissal of a
form is never an error.

Three kinds, never mixed: a malformed or unauthorised frame is the peer's
fault (JSON-RPC error, or close 1008); an action that is invalid now is
:class:`ActionRejected`; anything else, :class:`InternalError` included, is
our bug: logged with its traceback, the socket closed with 1011, the peer
told nothing internal. Every class carries its facts as attributes and
builds its message in ``__str__``.
"""

from __future__ import annotations

from typing import Any

from protocol.codec import MalformedFrame
from protocol.messages import ErrorCode
from protocol.rejections import Rejection, RejectionCode


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
    """A command failed; ``code`` is the JSON-RPC/AHP error code, ``data``
    what AHP puts beside it for that code (or None)."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.data = data

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


class AlreadyApplied(StoreError):
    """The channel took this client's action already, as seq ``seq``;
    ``envelope`` is that envelope once the host knows it. ``same_action``:
    the store knows it was this very action (its digest matched); False
    when it was another under the same name, or the store cannot tell."""

    def __init__(
        self, channel: str, seq: int, envelope: object = None, *, same_action: bool = True
    ) -> None:
        super().__init__(channel, seq)
        self.channel = channel
        self.seq = seq
        self.envelope = envelope
        self.same_action = same_action

    def __str__(self) -> str:
        return f"{self.channel}: that action was applied already as seq {self.seq}"


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


class BodyTooLarge(HuddleError):
    """An HTTP body larger than ``limit`` bytes (refused unread)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit

    def __str__(self) -> str:
        return f"the body is larger than {self.limit:,} bytes"


class ProtocolError(HuddleError):
    """The server answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(code, message, data)
        self.code, self.message, self.data = code, message, data

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


class Disconnected(HuddleError):
    """The connection is gone and the client is closed (or was refused)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"disconnected: {self.reason}"


class InternalError(Exception):
    """Base of the errors that are our bug: a broken invariant. Nothing
    catches them on purpose; they are logged with their traceback."""


def refused(rejected: ActionRejected, path: str) -> CommandError | MalformedFrame:
    """A command refused as an action would be, as a command's error that
    keeps the rejection's code in its message: ``forbidden`` is permission
    denied (-32009); a budget spent or a cap reached (``rate-limited``,
    ``too-many``) a conflict (-32011: the same request may do later); what
    else the rules refuse is a bad argument at ``path`` (-32602)."""
    if rejected.code == RejectionCode.FORBIDDEN:
        return CommandError(ErrorCode.PERMISSION_DENIED, rejected.reason)
    if rejected.code in (RejectionCode.RATE_LIMITED, RejectionCode.TOO_MANY):
        return CommandError(ErrorCode.CONFLICT, rejected.reason)
    return MalformedFrame(ErrorCode.INVALID_PARAMS, rejected.reason, path)
