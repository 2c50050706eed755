"""One AHP connection: JSON-RPC 2.0 over a WebSocket, one message a frame.

Frames are handled one at a time, in the order they arrive, so a client's
``dispatchAction`` notifications are applied in its ``clientSeq`` order.
Outgoing frames go through a bounded queue drained by a writer task; a
client that lets the queue fill up is closed (1013, "try again later"; with
no close frame at all when its socket takes no more bytes) and resumes with
``reconnect``; it never slows anyone else down.

Errors, by whose fault they are (see :mod:`server.errors`):

- a malformed frame or bad params: a JSON-RPC error naming the field's path
  (``id: null`` when the frame had no usable id, as for a notification);
- an action that is invalid now, not allowed for the role, or over the rate
  limit: echoed back as an envelope with ``rejectionReason``;
- a command that cannot be done: a JSON-RPC error with an AHP code;
- our bug: logged with the traceback, the socket closed with 1011.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from protocol.actions import StateAction, action_type, is_client_dispatchable
from protocol.chat import ChatState
from protocol.codec import MalformedFrame, decode_params, decode_request, encode
from protocol.messages import (
    SUPPORTED_PROTOCOL_VERSIONS,
    ActionEnvelope,
    ActionOrigin,
    ChannelParams,
    CreateChatParams,
    CreateSessionParams,
    DispatchActionParams,
    ErrorCode,
    ErrorResponse,
    FetchTurnsParams,
    FetchTurnsResult,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    ListSessionsResult,
    MissingResume,
    ReconnectParams,
    ReconnectResult,
    Request,
    RequestId,
    Response,
    Resume,
    RpcError,
    Snapshot,
    SubscribeParams,
    SubscribeResult,
)
from protocol.uris import ROOT_URI, BadChannelUri, channel_kind
from reducers.validation import client_action_problem
from server.auth import Grant
from server.errors import ActionRejected, ChannelGone, CommandError, StoreUnavailable
from server.frames import OVERLOADED, OutFrame
from server.host import Host, Identity, action_frame

log = logging.getLogger("huddle.connection")

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED = 1003
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_RESYNC = 1012
CLOSE_TRY_AGAIN = 1013

RATE_LIMITED = -32029
"""Huddle's JSON-RPC error code for a request over the per-connection limit."""


@dataclass(frozen=True)
class Limits:
    """Per-connection limits (see ``huddle serve --help``)."""

    actions_per_second: float = 50.0
    action_burst: int = 100
    max_subscriptions: int = 100
    send_buffer: int = 4 << 20
    """Bytes a client may leave unread before it is cut off."""
    flood_close_after: int = 1000
    """Consecutive rate-limited actions after which the client is closed."""


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Metrics:
    """What a connection reports; the app wires it to Prometheus."""

    def subscribed(self, delta: int) -> None:
        pass

    def rejected(self, type_: str) -> None:
        pass

    def queue_overflow(self) -> None:
        pass


Send = Callable[[str], Awaitable[None]]
Close = Callable[[int, str], Awaitable[None]]


class DirectWrite(Protocol):
    """The server's non-blocking frame writer (see server.serve)."""

    def write(self, frame: bytes, limit: int) -> int: ...

    def abort(self) -> None: ...


class Connection:
    """The server side of one AHP client connection."""

    def __init__(
        self,
        host: Host,
        grant: Grant,
        *,
        send: Send,
        close: Close,
        direct: DirectWrite | None = None,
        limits: Limits = Limits(),
        metrics: Metrics | None = None,
        server_info: Implementation | None = None,
    ) -> None:
        self.host = host
        self.grant = grant
        self._send = send
        self._close = close
        self._direct = direct
        self.limits = limits
        self.metrics = metrics or Metrics()
        self.server_info = server_info
        self.client_id: str | None = None
        self.subscriptions: set[str] = set()
        self.queue: asyncio.Queue[OutFrame | None] = asyncio.Queue()
        self._parked: dict[str, list[OutFrame]] = {}
        self.queued_bytes = 0
        self.closing: tuple[int, str] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._sending = False
        self._abandoned = False
        self.bucket = TokenBucket(limits.actions_per_second, limits.action_burst, time.monotonic)
        self.limited_in_a_row = 0
        self._handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "initialize": self._initialize,
            "ping": self._ping,
            "subscribe": self._subscribe,
            "reconnect": self._reconnect,
            "createSession": self._create_session,
            "disposeSession": self._dispose_session,
            "createChat": self._create_chat,
            "listSessions": self._list_sessions,
            "fetchTurns": self._fetch_turns,
        }

    # ─── Output ──────────────────────────────────────────────────────────

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        """Send a frame without blocking. With the server's direct writer the
        frame goes straight to the socket's buffer; otherwise it is queued
        for the writer task. A client with more than ``send_buffer`` bytes
        unread is cut off (1013). ``session`` scopes a sessions-list notice:
        a token that does not reach that session never sees it. An envelope
        of a ``channel`` whose subscribe (or reconnect) is being answered
        waits until that answer is sent: the client must get the snapshot
        before the envelopes that follow it."""
        if self.closing is not None:
            return
        if session is not None and not self.grant.may_touch(session):
            return
        if channel is not None and channel in self._parked:
            self._parked[channel].append(frame)
            return
        if self._direct is not None:
            if self._direct.write(frame.wire, self.limits.send_buffer) == OVERLOADED:
                self._overflow()
            return
        self.queued_bytes += len(frame)
        if self.queued_bytes > self.limits.send_buffer:
            self._overflow()
            return
        self.queue.put_nowait(frame)

    def _park(self, channel: str) -> None:
        """Hold ``channel``'s envelopes until the current request is answered."""
        self._parked.setdefault(channel, [])

    def _release_parked(self) -> None:
        parked, self._parked = self._parked, {}
        for frames in parked.values():
            for frame in frames:
                self.send_frame(frame)

    def _overflow(self) -> None:
        self.metrics.queue_overflow()
        self.shut(CLOSE_TRY_AGAIN, "send buffer full: reconnect to resume")

    def resync(self, channel: str) -> None:
        self.subscriptions.discard(channel)
        self.shut(CLOSE_RESYNC, f"{channel} lost its log: reconnect for a snapshot")

    def shut(self, code: int, reason: str) -> None:
        """Close after the frames already sent. A client cut off for not
        reading is dropped at once: it would not read a close frame either."""
        if self.closing is not None:
            return
        self.closing = (code, reason)
        if code == CLOSE_TRY_AGAIN:
            while not self.queue.empty():
                self.queue.get_nowait()
            if self._direct is not None:
                self._direct.abort()
            elif self._sending and self._writer is not None:
                # The writer is stuck in a send: give up on the socket now
                # instead of holding the connection for as long as the peer
                # likes.
                self._abandoned = True
                self._writer.cancel()
        self.queue.put_nowait(None)

    def start_writer(self) -> asyncio.Task[None]:
        """Start :meth:`writer` as a task; it ends when the connection is
        closed (or given up after its send buffer overflowed)."""
        self._writer = asyncio.create_task(self.writer())
        return self._writer

    async def writer(self) -> None:
        """Send queued frames (only without a direct writer), then close."""
        try:
            while True:
                frame = await self.queue.get()
                if frame is None:
                    break
                self.queued_bytes -= len(frame)
                self._sending = True
                try:
                    await self._send(frame.text)
                finally:
                    self._sending = False
        except asyncio.CancelledError:
            if not self._abandoned:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return
        code, reason = self.closing or (CLOSE_NORMAL, "")
        await self._close(code, reason)

    def _respond(self, request_id: RequestId, result: Any) -> None:
        self.send_frame(OutFrame(encode(Response(id=request_id, result=result))))

    def _error(
        self, request_id: RequestId | None, code: int, message: str, data: Any = None
    ) -> None:
        error = RpcError(code=code, message=message, data=data)
        self.send_frame(OutFrame(encode(ErrorResponse(id=request_id, error=error))))

    # ─── Input ───────────────────────────────────────────────────────────

    async def receive_frame(self, text: str) -> None:
        """Handle one incoming frame."""
        try:
            request = decode_request(text)
        except MalformedFrame as error:
            self._error(None, error.code, str(error), {"path": error.path} if error.path else None)
            return
        try:
            await self._handle(request)
        except MalformedFrame as error:
            data = {"path": error.path} if error.path else None
            self._error(request.id, error.code, str(error), data)
        except CommandError as error:
            self._error(request.id, error.code, error.message)
        except StoreUnavailable as error:
            # Fail fast and say so; the socket stays open for when it is back.
            self._error(request.id, ErrorCode.INTERNAL_ERROR, str(error))

    async def _handle(self, request: Request) -> None:
        method = request.method
        if request.id is None:
            if method == "dispatchAction":
                await self._dispatch(decode_params(method, request.params))
            elif method == "unsubscribe":
                self._unsubscribe(decode_params(method, request.params))
            elif method in self._handlers:
                raise MalformedFrame(
                    ErrorCode.INVALID_REQUEST, f"{method} is a request: give it an id"
                )
            else:
                raise MalformedFrame(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}")
            return
        handler = self._handlers.get(method)
        if handler is None:
            if method in ("dispatchAction", "unsubscribe"):
                raise MalformedFrame(
                    ErrorCode.INVALID_REQUEST, f"{method} is a notification: no id"
                )
            raise MalformedFrame(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}")
        params = decode_params(method, request.params)
        if self.client_id is None and method not in ("initialize", "ping"):
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        try:
            self._respond(request.id, await handler(params))
        finally:
            self._release_parked()

    # ─── Authorisation ───────────────────────────────────────────────────

    async def _session_of(self, uri: str) -> str | None:
        try:
            return await self.host.session_of(uri)
        except BadChannelUri as error:
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.params.channel") from None

    async def _require_access(self, uri: str) -> None:
        """CommandError unless this token reaches ``uri`` (which must exist)."""
        try:
            session = await self._session_of(uri)
        except ChannelGone:
            raise _not_found(uri) from None
        if not self.grant.may_touch(session):
            raise CommandError(ErrorCode.PERMISSION_DENIED, f"this token does not reach {uri}")

    def _require_agent(self, what: str) -> None:
        if self.grant.role != "agent":
            raise CommandError(ErrorCode.PERMISSION_DENIED, f"only an agent token may {what}")

    # ─── Commands ────────────────────────────────────────────────────────

    async def _initialize(self, params: InitializeParams) -> InitializeResult:
        if self.client_id is not None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "already initialized")
        version = next(
            (v for v in params.protocol_versions if v in SUPPORTED_PROTOCOL_VERSIONS), None
        )
        if version is None:
            raise _UnsupportedVersion()
        try:
            snapshots = [
                await self._subscribe_to(uri) for uri in params.initial_subscriptions or []
            ]
        except BaseException:
            # A failed initialize changes nothing: the client may try again.
            for uri in list(self.subscriptions):
                self._unsubscribe(ChannelParams(channel=uri))
            raise
        self.client_id = params.client_id
        await self.host.register_client(
            params.client_id, Identity(self.grant.name, self.grant.role)
        )
        root = await self.host.channel(ROOT_URI)
        return InitializeResult(
            protocol_version=version,
            server_seq=root.seq,
            server_info=self.server_info,
            snapshots=snapshots,
        )

    async def _ping(self, params: ChannelParams) -> None:
        return None

    async def _subscribe(self, params: SubscribeParams) -> SubscribeResult:
        turns = params.view.turns if params.view is not None else None
        return SubscribeResult(snapshot=await self._subscribe_to(params.channel, turns))

    async def _subscribe_to(self, uri: str, turns: int | None = None) -> Snapshot:
        await self._require_access(uri)
        if (
            uri not in self.subscriptions
            and len(self.subscriptions) >= self.limits.max_subscriptions
        ):
            raise _too_many_subscriptions(self.limits)
        try:
            self._park(uri)
            snapshot = await self.host.subscribe(uri, self)
        except ChannelGone:
            raise _not_found(uri) from None
        if uri not in self.subscriptions:
            self.subscriptions.add(uri)
            self.metrics.subscribed(1)
        if turns is not None and isinstance(snapshot.state, ChatState):
            state = self.host.windowed(snapshot.state, max(0, turns))
            snapshot = Snapshot(resource=uri, state=state, from_seq=snapshot.from_seq)
        return snapshot

    def _unsubscribe(self, params: ChannelParams) -> None:
        if params.channel in self.subscriptions:
            self.subscriptions.discard(params.channel)
            self.metrics.subscribed(-1)
            self.host.unsubscribe(params.channel, self)

    async def _reconnect(self, params: ReconnectParams) -> ReconnectResult:
        if params.client_id != self.client_id:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "clientId differs from initialize", "$.params.clientId"
            )
        resumes: list[Resume] = []
        for index, cursor in enumerate(params.cursors):
            uri = cursor.channel
            channel_kind_or_error(uri, f"$.params.cursors[{index}].channel")
            try:
                await self._require_access(uri)
            except CommandError as error:
                if error.code not in (ErrorCode.SESSION_NOT_FOUND, ErrorCode.NOT_FOUND):
                    raise
                resumes.append(MissingResume(channel=uri))
                continue
            if uri not in self.subscriptions:
                if len(self.subscriptions) >= self.limits.max_subscriptions:
                    raise _too_many_subscriptions(self.limits)
                self.subscriptions.add(uri)
                self.metrics.subscribed(1)
            self._park(uri)
            resumes.append(await self.host.resume(uri, cursor.last_seen_server_seq, self))
        return ReconnectResult(channels=resumes)

    async def _create_session(self, params: CreateSessionParams) -> None:
        if self.grant.role == "observer" or self.grant.sessions is not None:
            raise CommandError(
                ErrorCode.PERMISSION_DENIED, "creating sessions needs an agent or unscoped token"
            )
        if channel_kind_or_error(params.channel) != "session":
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "expected a session URI", "$.params.channel"
            )
        await self.host.create_session(params.channel, provider=params.provider, title=params.title)

    async def _dispose_session(self, params: ChannelParams) -> None:
        self._require_agent("dispose sessions")
        if channel_kind_or_error(params.channel) != "session":
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "expected a session URI", "$.params.channel"
            )
        await self._require_access(params.channel)
        try:
            await self.host.dispose_session(params.channel)
        except ChannelGone:
            raise _not_found(params.channel) from None

    async def _create_chat(self, params: CreateChatParams) -> None:
        if self.grant.role == "observer":
            raise CommandError(ErrorCode.PERMISSION_DENIED, "observers may not create chats")
        if channel_kind_or_error(params.channel) != "session":
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "expected a session URI", "$.params.channel"
            )
        if channel_kind_or_error(params.chat, "$.params.chat") != "chat":
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, "expected a chat URI", "$.params.chat")
        await self._require_access(params.channel)
        await self.host.create_chat(
            params.channel, params.chat, title=params.title, initial_message=params.initial_message
        )

    async def _list_sessions(self, params: ListSessionsParams) -> ListSessionsResult:
        items = [s for s in await self.host.list_sessions() if self.grant.may_touch(s.resource)]
        start = _offset(params.cursor)
        limit = params.limit if params.limit and params.limit > 0 else len(items)
        page = items[start : start + limit]
        more = start + limit < len(items)
        return ListSessionsResult(items=page, next_cursor=_cursor(start + limit) if more else None)

    async def _fetch_turns(self, params: FetchTurnsParams) -> FetchTurnsResult:
        if channel_kind_or_error(params.channel) != "chat":
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "expected a chat URI", "$.params.channel"
            )
        await self._require_access(params.channel)
        limit = params.limit if params.limit and params.limit > 0 else 50
        turns, cursor = await self.host.older_turns(params.channel, params.cursor, limit)
        return FetchTurnsResult(turns=turns, turns_next_cursor=cursor)

    # ─── Actions ─────────────────────────────────────────────────────────

    async def _dispatch(self, params: DispatchActionParams) -> None:
        if self.client_id is None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        origin = ActionOrigin(client_id=self.client_id, client_seq=params.client_seq)
        uri, action = params.channel, params.action
        try:
            reason = await self._forbidden(uri, action)
        except ChannelGone:
            return  # AHP: an action for a channel that does not exist is ignored
        except StoreUnavailable as error:
            reason = f"store-unavailable: {error}; try again"
            self.metrics.rejected(action_type(action))
            await self._echo_rejection(uri, action, origin, reason)
            return
        if reason is None:
            if self.bucket.take():
                self.limited_in_a_row = 0
                try:
                    await self.host.dispatch(uri, action, origin=origin)
                except ChannelGone:
                    return
                except ActionRejected as rejected:
                    reason = rejected.reason
                except StoreUnavailable as error:
                    reason = f"store-unavailable: {error}; try again"
                else:
                    return
            else:
                self.limited_in_a_row += 1
                if self.limited_in_a_row >= self.limits.flood_close_after:
                    self.shut(CLOSE_POLICY, "too many actions: flood")
                reason = (
                    f"rate-limited: at most {self.limits.actions_per_second:g} actions a second"
                )
        self.metrics.rejected(action_type(action))
        await self._echo_rejection(uri, action, origin, reason)

    async def _forbidden(self, uri: str, action: StateAction) -> str | None:
        """Why this token may not dispatch ``action`` on ``uri``, or None.
        Raises ChannelGone when the channel does not exist."""
        kind = channel_kind_or_error(uri)
        session = await self.host.session_of(uri)
        family = action_type(action).split("/", 1)[0]
        if family != kind:
            return f"wrong-channel: a {family} action cannot go to a {kind} channel"
        if not self.grant.may_dispatch:
            return "forbidden: observers may not dispatch actions"
        if not self.grant.may_touch(session):
            return f"forbidden: this token does not reach {uri}"
        if self.grant.role != "agent" and not is_client_dispatchable(action):
            return f"forbidden: {action_type(action)} is dispatched only by the server"
        if self.grant.role != "agent":
            state = (await self.host.channel(uri)).state
            problem = client_action_problem(state, action, self.client_id)
            return None if problem is None else problem.reason
        return None

    async def _echo_rejection(
        self, uri: str, action: StateAction, origin: ActionOrigin, reason: str
    ) -> None:
        try:
            seq = (await self.host.channel(uri)).seq
        except ChannelGone:
            return
        except StoreUnavailable:
            seq = 0  # the channel's seq is out of reach: the reason says why
        envelope = ActionEnvelope(
            channel=uri, action=action, server_seq=seq, origin=origin, rejection_reason=reason
        )
        self.send_frame(OutFrame(action_frame(encode(envelope))))

    # ─── Teardown ────────────────────────────────────────────────────────

    def closed(self) -> None:
        """Forget every subscription (the socket is gone)."""
        for uri in self.subscriptions:
            self.host.unsubscribe(uri, self)
        self.metrics.subscribed(-len(self.subscriptions))
        self.subscriptions.clear()


class _UnsupportedVersion(CommandError):
    def __init__(self) -> None:
        supported = ", ".join(SUPPORTED_PROTOCOL_VERSIONS)
        super().__init__(
            ErrorCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"no protocol version in common; this server speaks {supported}",
        )


def channel_kind_or_error(uri: str, path: str = "$.params.channel") -> str:
    try:
        return channel_kind(uri)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), path) from None


def _too_many_subscriptions(limits: Limits) -> CommandError:
    return CommandError(
        ErrorCode.PERMISSION_DENIED,
        f"at most {limits.max_subscriptions} subscriptions per connection",
    )


def _not_found(uri: str) -> CommandError:
    if channel_kind(uri) == "session":
        return CommandError(ErrorCode.SESSION_NOT_FOUND, f"no session {uri}")
    return CommandError(ErrorCode.NOT_FOUND, f"no channel {uri}")


def _cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode()


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    try:
        prefix, _, number = base64.urlsafe_b64decode(cursor.encode()).decode().partition(":")
        if prefix == "offset" and number.isdigit():
            return int(number)
    except (ValueError, UnicodeDecodeError):
        pass
    raise MalformedFrame(ErrorCode.INVALID_PARAMS, "unknown cursor", "$.params.cursor")
