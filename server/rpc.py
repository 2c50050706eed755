"""The JSON-RPC methods one AHP connection serves.

:class:`Rpc` handles each frame its :class:`~server.connection.Connection`
hands it: it decodes the request, runs the method through the command layer
(:mod:`server.commands`) with the connection's grant, and answers. It holds
what AHP makes per-connection state: the client id given at ``initialize``
and the channels subscribed.

Errors, by whose fault they are (see :mod:`server.errors`):

- a malformed frame or bad params: a JSON-RPC error naming the field's path
  (``id: null`` when the frame had no usable id, as for a notification);
- an action that is invalid now, not allowed for the token, or over the
  rate limit: echoed back as an envelope with ``rejectionReason``;
- a command that cannot be done: a JSON-RPC error with an AHP code;
- our bug: logged by the app with the traceback, the socket closed (1011).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from protocol.actions import StateAction
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
    Resume,
    Snapshot,
    SnapshotResume,
    SubscribeParams,
    SubscribeResult,
)
from protocol.rejections import Rejection, RejectionCode
from protocol.uris import ROOT_URI
from server.auth import Grant
from server.commands import Commands, not_found
from server.config import Limits
from server.connection import Connection
from server.errors import ActionRejected, ChannelGone, CommandError, StoreUnavailable
from server.frames import action_frame
from server.policy import reaches
from server.sessions import windowed

CLOSE_REPLACED = 4001
"""Close code for a connection whose clientId a newer one of its token took."""


class LiveClients:
    """This process's connections by client id (bounded by the connections:
    each leaves when it closes)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Rpc] = {}

    def bind(self, client_id: str, rpc: Rpc) -> Rpc | None:
        """Make ``rpc`` the connection of ``client_id``; the one it replaces."""
        older = self._by_id.get(client_id)
        self._by_id[client_id] = rpc
        return older if older is not rpc else None

    def unbind(self, client_id: str, rpc: Rpc) -> None:
        if self._by_id.get(client_id) is rpc:
            del self._by_id[client_id]

    def __len__(self) -> int:
        return len(self._by_id)


class Rpc:
    """The methods of one connection; see the module docstring."""

    def __init__(
        self,
        connection: Connection,
        commands: Commands,
        grant: Grant,
        *,
        clients: LiveClients | None = None,
        server_info: Implementation | None = None,
    ) -> None:
        self.connection = connection
        self.commands = commands
        self.clients = clients if clients is not None else LiveClients()
        self.host = commands.host
        self.grant = grant
        self.server_info = server_info
        self.client_id: str | None = None
        self.subscriptions: set[str] = set()
        self._requests: dict[str, Callable[[Any], Awaitable[Any]]] = {
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
        self._notifications: dict[str, Callable[[Any], Awaitable[None]]] = {
            "dispatchAction": self._dispatch,
            "unsubscribe": self._unsubscribe,
        }
        connection.handler = self.receive_frame
        connection.may_see = lambda session: reaches(grant, session)

    @property
    def limits(self) -> Limits:
        return self.connection.limits

    # ─── Frames ──────────────────────────────────────────────────────────

    async def receive_frame(self, text: str) -> None:
        """Handle one incoming frame."""
        try:
            request = decode_request(text)
        except MalformedFrame as error:
            self._malformed(None, error)
            return
        try:
            await self._handle(request)
        except MalformedFrame as error:
            self._malformed(request.id, error)
        except CommandError as error:
            self.connection.error(request.id, error.code, error.message)
        except StoreUnavailable as error:
            # Fail fast and say so; the socket stays open for when it is back.
            self.connection.error(request.id, ErrorCode.INTERNAL_ERROR, str(error))

    def _malformed(self, request_id: Any, error: MalformedFrame) -> None:
        data = {"path": error.path} if error.path else None
        self.connection.error(request_id, error.code, str(error), data)

    async def _handle(self, request: Request) -> None:
        method = request.method
        if request.id is None:
            notification = self._notifications.get(method)
            if notification is not None:
                params = decode_params(method, request.params)
                with _arguments_under_params():
                    await notification(params)
            elif method in self._requests:
                raise MalformedFrame(
                    ErrorCode.INVALID_REQUEST, f"{method} is a request: give it an id"
                )
            else:
                raise MalformedFrame(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}")
            return
        handler = self._requests.get(method)
        if handler is None:
            if method in self._notifications:
                raise MalformedFrame(
                    ErrorCode.INVALID_REQUEST, f"{method} is a notification: no id"
                )
            raise MalformedFrame(ErrorCode.METHOD_NOT_FOUND, f"unknown method {method!r}")
        params = decode_params(method, request.params)
        if self.client_id is None and method not in ("initialize", "ping"):
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        try:
            with _arguments_under_params():
                result = await handler(params)
            self.connection.respond(request.id, result)
        finally:
            self.connection.release_parked()

    # ─── Connecting ──────────────────────────────────────────────────────

    async def _initialize(self, params: InitializeParams) -> InitializeResult:
        if self.client_id is not None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "already initialized")
        version = next(
            (v for v in params.protocol_versions if v in SUPPORTED_PROTOCOL_VERSIONS), None
        )
        if version is None:
            raise _UnsupportedVersion()
        await self.commands.claim_client(self.grant, params.client_id)
        try:
            snapshots = [
                await self._subscribe_to(uri, share=len(params.initial_subscriptions or []))
                for uri in params.initial_subscriptions or []
            ]
        except BaseException:
            # A failed initialize changes nothing: the client may try again.
            for uri in list(self.subscriptions):
                await self._unsubscribe(ChannelParams(channel=uri))
            raise
        self._label(params.client_id)
        root = await self.host.view(ROOT_URI)
        return InitializeResult(
            protocol_version=version,
            server_seq=root.seq,
            server_info=self.server_info,
            snapshots=snapshots,
        )

    def _label(self, client_id: str) -> None:
        """Make ``client_id`` (claimed for this token) this connection's
        label; an older connection of the same id here is closed: this one
        takes its place."""
        older = self.clients.bind(client_id, self)
        if older is not None:
            older.connection.shut(CLOSE_REPLACED, "another connection took this clientId")
        self.client_id = client_id

    async def _ping(self, params: ChannelParams) -> None:
        return None

    # ─── Subscriptions ───────────────────────────────────────────────────

    async def _subscribe(self, params: SubscribeParams) -> SubscribeResult:
        turns = params.view.turns if params.view is not None else None
        return SubscribeResult(snapshot=await self._subscribe_to(params.channel, turns))

    @property
    def _frame_budget(self) -> int:
        """The bytes one answer may take: half of what the client may leave
        unread, so that an answer never cuts its own connection off."""
        return self.limits.send_buffer // 2

    async def _subscribe_to(self, uri: str, turns: int | None = None, share: int = 1) -> Snapshot:
        """Subscribe and return the snapshot, a chat's windowed to fit its
        ``share`` of one answer's budget."""
        await self.commands.reach(self.grant, uri)
        self._count_subscription(uri)
        try:
            self.connection.park(uri)
            snapshot = await self.host.core.subscribe(uri, self.connection)
        except ChannelGone:
            raise not_found(uri) from None
        self._add_subscription(uri)
        return self._fitted(snapshot, turns, share)

    def _fitted(self, snapshot: Snapshot, turns: int | None = None, share: int = 1) -> Snapshot:
        if not isinstance(snapshot.state, ChatState):
            return snapshot
        state = windowed(snapshot.state, turns, self._frame_budget // max(1, share))
        if state is snapshot.state:
            return snapshot
        return Snapshot(resource=snapshot.resource, state=state, from_seq=snapshot.from_seq)

    def _count_subscription(self, uri: str) -> None:
        """CommandError when one more subscription would be too many."""
        if (
            uri not in self.subscriptions
            and len(self.subscriptions) >= self.limits.max_subscriptions
        ):
            raise CommandError(
                ErrorCode.PERMISSION_DENIED,
                f"at most {self.limits.max_subscriptions} subscriptions per connection",
            )

    def _add_subscription(self, uri: str) -> None:
        if uri not in self.subscriptions:
            self.subscriptions.add(uri)
            self.connection.metrics.subscribed(1)

    async def _unsubscribe(self, params: ChannelParams) -> None:
        if params.channel in self.subscriptions:
            self.subscriptions.discard(params.channel)
            self.connection.metrics.subscribed(-1)
            self.host.core.unsubscribe(params.channel, self.connection)

    async def _reconnect(self, params: ReconnectParams) -> ReconnectResult:
        if params.client_id != self.client_id:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "clientId differs from initialize", "$.params.clientId"
            )
        resumes: list[Resume] = []
        for index, cursor in enumerate(params.cursors):
            uri = cursor.channel
            try:
                await self.commands.reach(self.grant, uri, f"$.cursors[{index}].channel")
            except CommandError as error:
                if error.code not in (ErrorCode.SESSION_NOT_FOUND, ErrorCode.NOT_FOUND):
                    raise
                resumes.append(MissingResume(channel=uri))
                continue
            self._count_subscription(uri)
            self._add_subscription(uri)
            self.connection.park(uri)
            share = self._frame_budget // max(1, len(params.cursors))
            resume = await self.host.core.resume(
                uri, cursor.last_seen_server_seq, self.connection, max_bytes=share
            )
            if isinstance(resume, SnapshotResume):
                resume = SnapshotResume(
                    channel=uri, snapshot=self._fitted(resume.snapshot, share=len(params.cursors))
                )
            resumes.append(resume)
        return ReconnectResult(channels=resumes)

    def closed(self) -> None:
        """Forget every subscription and the client id (the socket is gone)."""
        if self.client_id is not None:
            self.clients.unbind(self.client_id, self)
        for uri in self.subscriptions:
            self.host.core.unsubscribe(uri, self.connection)
        self.connection.metrics.subscribed(-len(self.subscriptions))
        self.subscriptions.clear()

    # ─── Commands ────────────────────────────────────────────────────────

    async def _create_session(self, params: CreateSessionParams) -> None:
        await self.commands.create_session(
            self.grant, params.channel, provider=params.provider, title=params.title
        )

    async def _dispose_session(self, params: ChannelParams) -> None:
        await self.commands.dispose_session(self.grant, params.channel)

    async def _create_chat(self, params: CreateChatParams) -> None:
        await self.commands.create_chat(
            self.grant,
            params.channel,
            params.chat,
            title=params.title,
            initial_message=params.initial_message,
        )

    async def _list_sessions(self, params: ListSessionsParams) -> ListSessionsResult:
        page = await self.commands.list_sessions(self.grant, params.cursor, params.limit)
        return ListSessionsResult(items=page.items, next_cursor=page.next_cursor)

    async def _fetch_turns(self, params: FetchTurnsParams) -> FetchTurnsResult:
        turns, cursor = await self.commands.fetch_turns(
            self.grant, params.channel, params.cursor, params.limit
        )
        return FetchTurnsResult(turns=turns, turns_next_cursor=cursor)

    # ─── Actions ─────────────────────────────────────────────────────────

    async def _dispatch(self, params: DispatchActionParams) -> None:
        if self.client_id is None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        origin = ActionOrigin(client_id=self.client_id, client_seq=params.client_seq)
        uri, action = params.channel, params.action
        try:
            await self.commands.dispatch(
                self.grant, uri, action, origin=origin, client_id=self.client_id
            )
        except ChannelGone:
            pass  # AHP: an action for a channel that does not exist is ignored
        except ActionRejected as rejected:
            # A flooder is closed before its last echo goes out.
            self.connection.count_action(limited=rejected.code == RejectionCode.RATE_LIMITED)
            await self._echo_rejection(uri, action, origin, rejected.reason)
            return
        except StoreUnavailable as error:
            reason = Rejection(RejectionCode.STORE_UNAVAILABLE, f"{error}; try again").reason
            await self._echo_rejection(uri, action, origin, reason)
        self.connection.count_action(limited=False)

    async def _echo_rejection(
        self, uri: str, action: StateAction, origin: ActionOrigin, reason: str
    ) -> None:
        """Echo the rejected action to its sender alone. Its serverSeq is the
        channel's current one (no seq is used); 0 where the token does not
        reach the channel or the store cannot say."""
        try:
            seq = await self.commands.visible_seq(self.grant, uri) or 0
        except StoreUnavailable:
            seq = 0
        envelope = ActionEnvelope(
            channel=uri, action=action, server_seq=seq, origin=origin, rejection_reason=reason
        )
        self.connection.send_frame(action_frame(encode(envelope)))


@contextlib.contextmanager
def _arguments_under_params() -> Iterator[None]:
    """A command's bad argument (``$.channel``) is under ``params`` here."""
    try:
        yield
    except MalformedFrame as error:
        path = error.path
        if path is None or not path.startswith("$.") or path.startswith("$.params"):
            raise
        raise MalformedFrame(error.code, error.reason, "$.params." + path[2:]) from None


class _UnsupportedVersion(CommandError):
    def __init__(self) -> None:
        supported = ", ".join(SUPPORTED_PROTOCOL_VERSIONS)
        super().__init__(
            ErrorCode.UNSUPPORTED_PROTOCOL_VERSION,
            f"no protocol version in common; this server speaks {supported}",
        )
