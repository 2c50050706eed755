"""The JSON-RPC methods one AHP connection serves.

:class:`Rpc` handles each frame its :class:`~server.edge.connection.Connection`
hands it: it decodes the request, runs the method through the command layer
(:mod:`server.commands`) with the connection's grant, and answers. It holds
what AHP makes per-connection state: the client id, the extensions the
client asked for, the channels subscribed and, for a plain AHP client, the
connection's own ``serverSeq`` numbering (:mod:`server.edge.numbering`).

Plain AHP by default: a client that asks for nothing gets exactly AHP 0.7.
Huddle's extensions are asked for as ``initialize`` capabilities and
announced back in the result's ``_meta.huddle.extensions`` (see
:data:`EXTENSIONS`).

Errors, by whose fault they are (see :mod:`server.errors`):

- a malformed frame or bad params: a JSON-RPC error naming the field's path
  (``id: null`` when the frame had no usable id); but an action that does
  not decode comes back as a rejection envelope, as AHP requires;
- an action that is invalid now, not allowed for the token, or over the
  rate limit: echoed back as an envelope with ``rejectionReason``;
- a command that cannot be done: a JSON-RPC error with an AHP code;
- our bug: logged by the app with the traceback, the socket closed (1011).
"""

from __future__ import annotations

import contextlib
import functools
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from msgspec.structs import replace

from protocol.actions import ChatTurnsLoaded, SessionActiveClientRemoved, SessionActiveClientSet
from protocol.chat import ChatState
from protocol.codec import MalformedFrame, decode_params, decode_request, encode, unknown_method
from protocol.messages import (
    SUPPORTED_PROTOCOL_VERSIONS,
    ActionEnvelope,
    ActionOrigin,
    ChannelParams,
    CreateChatParams,
    CreateSessionParams,
    DispatchActionParams,
    EmptyResult,
    ErrorCode,
    ExpireParams,
    ExpireResult,
    FetchTurnsParams,
    FetchTurnsResult,
    Implementation,
    InitializeParams,
    InitializeResult,
    ListSessionsParams,
    ListSessionsResult,
    ReconnectParams,
    ReconnectReplay,
    ReconnectResult,
    ReconnectSnapshots,
    Request,
    Snapshot,
    SubscribeParams,
    SubscribeResult,
)
from protocol.rejections import Rejection, RejectionCode
from server.auth import Grant, Identity
from server.commands import PAGE_MARGIN, Commands, not_found
from server.config import Limits
from server.edge.connection import CLOSE_NORMAL, Connection
from server.edge.echoes import Echoes
from server.edge.numbering import Numbering, Retired
from server.edge.reconnect import reconnect
from server.errors import (
    ActionRejected,
    AlreadyApplied,
    ChannelGone,
    CommandError,
    StoreUnavailable,
    refused,
)
from server.frames import AnswerBudget, action_frame

CHANNEL_SEQS: Final = "huddle.channelSeqs"
TURN_WINDOWS: Final = "huddle.turnWindows"
TITLES: Final = "huddle.titles"
IDENTITY: Final = "huddle.identity"
PRESENT_PER_TOKEN: Final = 10
"""A person's connections one session lists among its active clients."""
PRESENT_PER_LINK: Final = 50
"""The same for the browsers of one shared link, together."""
EXPIRY: Final = "huddle.expiry"
RESEND: Final = "huddle.resend"
EXTENSIONS: Final = {
    RESEND: "clientSeq numbers a clientId's actions across its connections: an action "
    "sent again on a later connection with its first clientSeq is applied once",
    EXPIRY: "huddle/expire {channel, requestId | toolCallId, seconds, onExpiry}: an open "
    "wait's expiry (agent tokens)",
    IDENTITY: "{\"name\": ...}: the name a shared link's holder goes by; the result's "
    "_meta.huddle.identity says who the server takes the client for",
    CHANNEL_SEQS: "serverSeq per channel (gapless, as the store orders it) everywhere; "
    "reconnect with one cursor per channel; fetchTurns answers with the page",
    TURN_WINDOWS: "subscribe's view.turns keeps a tail window of that many turns",
    TITLES: "createSession and createChat take a title",
}
"""Huddle's extensions of AHP 0.7, by capability key."""
CLOSE_REPLACED = 4001
"""Close code for a connection whose clientId a newer one of its token took."""


class LiveClients:
    """This process's connections by client id (bounded by the connections:
    each leaves when it closes), and the numberings of plain ones that
    closed lately (for their reconnect)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Rpc] = {}
        self.retired = Retired()

    def bind(self, client_id: str, rpc: Rpc) -> Rpc | None:
        """Make ``rpc`` the connection of ``client_id``; the one it replaces."""
        older = self._by_id.get(client_id)
        self._by_id[client_id] = rpc
        return older if older is not rpc else None

    def live(self, client_id: str) -> Rpc | None:
        """The open connection of ``client_id`` in this process, if any."""
        return self._by_id.get(client_id)

    def unbind(self, client_id: str, rpc: Rpc) -> None:
        if self._by_id.get(client_id) is rpc:
            del self._by_id[client_id]
            if rpc.connection.numbering is not None:
                self.retired.retire(client_id, rpc.connection.numbering)

    def present_in(self, session: str, budget_key: str) -> int:
        """How many connections of a token (or a shared link's browsers) put
        themselves in ``session``'s active clients."""
        return sum(
            1
            for rpc in self._by_id.values()
            if rpc.grant.budget_key == budget_key and session in rpc.present
        )

    def numbering_of(self, client_id: str) -> Numbering | None:
        """The numbering a plain client left behind (live or lately closed)."""
        live = self._by_id.get(client_id)
        if live is not None and live.connection.numbering is not None:
            return live.connection.numbering
        return self.retired.take(client_id)

    def __len__(self) -> int:
        return len(self._by_id)


def _asked_name(capability: Any) -> str | None:
    """The name a ``huddle.identity`` capability asks to go by, if any."""
    named = capability.get("name") if isinstance(capability, dict) else None
    return named if isinstance(named, str) else None


class Rpc:
    """The methods of one connection; see the module docstring."""

    __slots__ = (
        "client_id",
        "clients",
        "commands",
        "connection",
        "echoes",
        "extensions",
        "grant",
        "identity",
        "present",
        "seq_scope",
        "server_info",
        "subscriptions",
    )

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
        self.grant = grant
        self.server_info = server_info
        self.client_id: str | None = None
        self.identity = grant.identity
        """Who this connection's actions are credited to."""
        self.extensions: frozenset[str] = frozenset()
        self.seq_scope: str | None = secrets.token_hex(6)
        """What this connection's clientSeqs are numbered within beyond its
        clientId: the connection itself for a plain AHP client (AHP numbers
        each connection anew), None for one that asked huddle.resend."""
        self.subscriptions: set[str] = set()
        self.present: set[str] = set()
        """The sessions where this connection put itself in the active
        clients (taken out again when it goes: server.core.presence)."""
        self.echoes = Echoes(connection, commands, grant)
        connection.handler = self.receive_frame
        connection.may_see = functools.partial(commands.reaches, grant)

    @property
    def limits(self) -> Limits:
        return self.connection.limits

    @property
    def numbering(self) -> Numbering | None:
        """This connection's own serverSeq numbering (None: per channel)."""
        return self.connection.numbering

    # ─── Frames ──────────────────────────────────────────────────────────

    async def receive_frame(self, text: str) -> None:
        """Handle one incoming frame; malformed ones count toward closing a
        flooder (:meth:`Connection.count_frame`), by number and size."""
        try:
            request = decode_request(text)
        except MalformedFrame as error:
            self._malformed(None, error)
            self.connection.count_frame(len(text))
            return
        try:
            if not await self._handle(request):
                self.connection.count_frame(len(text))
                return
        except MalformedFrame as error:
            self._malformed(request.id, error)
            self.connection.count_frame(len(text))
            return
        except CommandError as error:
            self.connection.error(request.id, error.code, error.message, error.data)
            if error.code == ErrorCode.UNSUPPORTED_PROTOCOL_VERSION:
                self.connection.shut(CLOSE_NORMAL, "no protocol version in common")
        except StoreUnavailable as error:
            # Fail fast and say so; the socket stays open for when it is back.
            self.connection.error(request.id, ErrorCode.INTERNAL_ERROR, str(error))
        self.connection.count_frame(None)

    def _malformed(self, request_id: Any, error: MalformedFrame) -> None:
        data = {"path": error.path} if error.path else None
        self.connection.error(request_id, error.code, str(error), data)

    async def _handle(self, request: Request) -> bool:
        """Serve ``request``; False when it was malformed all the same (an
        action that does not decode, answered by its echo)."""
        method = request.method
        if request.id is None:
            notification = _NOTIFICATIONS.get(method)
            if notification is None:
                if method in _REQUESTS:
                    raise MalformedFrame(
                        ErrorCode.INVALID_REQUEST, f"{method} is a request: give it an id"
                    )
                raise unknown_method(method)
            try:
                params = decode_params(method, request.params)
            except MalformedFrame as error:
                if method != "dispatchAction" or not await self.echoes.undecodable(
                    request.params, self.client_id, error
                ):
                    raise
                return False
            with _arguments_under_params():
                await notification(self, params)
            return True
        handler = _REQUESTS.get(method)
        if handler is None:
            if method in _NOTIFICATIONS:
                raise MalformedFrame(
                    ErrorCode.INVALID_REQUEST, f"{method} is a notification: no id"
                )
            raise unknown_method(method)
        params = decode_params(method, request.params)
        if self.client_id is None and method not in ("initialize", "ping", "reconnect"):
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        try:
            with _arguments_under_params():
                result = await handler(self, params)
            self.connection.respond(request.id, self._numbered(result))
        except ActionRejected as rejected:  # a command refused as an action is (over budget)
            raise refused(rejected, "$") from None
        finally:
            self.connection.release_parked()
        return True

    def _numbered(self, result: Any) -> Any:
        """``result`` in this connection's numbering, as it goes out now:
        a snapshot's ``fromSeq`` is the current number, a replayed envelope
        takes the next one."""
        numbering = self.numbering
        if numbering is None:
            return result

        def mark(snapshot: Snapshot) -> Snapshot:
            number = numbering.mark(snapshot.resource, snapshot.from_seq)
            return replace(snapshot, from_seq=number)

        match result:
            case InitializeResult():
                snapshots = [mark(s) for s in result.snapshots]
                return replace(result, snapshots=snapshots, server_seq=numbering.counter)
            case SubscribeResult(snapshot=Snapshot() as snapshot):
                return replace(result, snapshot=mark(snapshot))
            case ReconnectSnapshots():
                return replace(result, snapshots=[mark(s) for s in result.snapshots])
            case ReconnectReplay():
                actions = [
                    replace(e, server_seq=numbering.sent(e.channel, e.server_seq))
                    for e in result.actions
                ]
                return replace(result, actions=actions)
        return result

    # ─── Connecting ──────────────────────────────────────────────────────

    async def _initialize(self, params: InitializeParams) -> InitializeResult:
        if self.client_id is not None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "already initialized")
        version = next(
            (v for v in params.protocol_versions if v in SUPPORTED_PROTOCOL_VERSIONS), None
        )
        if version is None:
            supported = ", ".join(SUPPORTED_PROTOCOL_VERSIONS)
            raise CommandError(
                ErrorCode.UNSUPPORTED_PROTOCOL_VERSION,
                f"no protocol version in common; this server speaks {supported}",
                {"supportedVersions": list(SUPPORTED_PROTOCOL_VERSIONS)},
            )
        await self.commands.out_of_debt(self.grant)
        capabilities = params.capabilities or {}
        asked = frozenset(capabilities.keys()) & EXTENSIONS.keys()
        identity = self.identity
        if IDENTITY in asked:  # a name it refuses fails initialize before anything is claimed
            identity = self.grant.identity_as(_asked_name(capabilities[IDENTITY]))
        await self.commands.credentials.claim_client(self.grant, params.client_id)
        self._set_extensions(asked, self.clients.numbering_of(params.client_id))
        self.identity = identity
        # Beyond the limit, or once the answer is full, the rest is left out
        # unread (a frame may name 40,000 channels).
        wanted = list(dict.fromkeys(params.initial_subscriptions or []))
        wanted = wanted[: self.limits.max_subscriptions]
        snapshots: list[Snapshot] = []
        room = AnswerBudget(self.answer_budget)
        try:
            for uri in wanted:
                with contextlib.suppress(CommandError):  # gone or not ours: no snapshot
                    snapshot = await self.subscribe_to(uri, share=len(wanted))
                    if room.takes(snapshot):
                        snapshots.append(snapshot)
                    else:
                        await self._unsubscribe(ChannelParams(channel=uri))
                        self.connection.unpark(uri)
                        break
        except BaseException:
            # A failed initialize changes nothing: the client may try again.
            for uri in list(self.subscriptions):
                await self._unsubscribe(ChannelParams(channel=uri))
            raise
        # Each snapshot is a read too, charged (its next requests wait it out).
        self.commands.charge_snapshots(self.grant, room.count, room.read)
        self.label(params.client_id)
        extensions = (
            {"huddle": _announced(asked, self.identity, shared=self.grant.shared)}
            if asked
            else None
        )
        return InitializeResult(
            protocol_version=version,
            server_seq=await self.commands.root_seq(),
            server_info=self.server_info,
            snapshots=snapshots,
            meta=extensions,
        )

    def _set_extensions(self, asked: frozenset[str], left: Numbering | None) -> None:
        """Use ``asked``: without per-channel seqs, the connection numbers
        what it sends itself, on from where this client's last one left;
        without huddle.resend, a clientSeq names an action of this
        connection only."""
        self.extensions = asked
        if RESEND in asked:
            self.seq_scope = None
        if CHANNEL_SEQS in asked:
            self.connection.numbering = None
        else:
            self.connection.numbering = Numbering(start=left.counter if left else 0)

    def retired_numbering(self, client_id: str) -> Numbering | None:
        """The numbering plain client ``client_id`` left behind (its live
        connection's, or one that closed lately): a reconnect continues it."""
        return self.clients.numbering_of(client_id)

    def label(self, client_id: str) -> None:
        """Make ``client_id`` (claimed for this token) this connection's
        label; an older connection of the same id here is closed: this one
        takes its place."""
        older = self.clients.bind(client_id, self)
        if older is not None:
            # Its entries in sessions' active clients are this one's now:
            # counted against the token, taken out when this one goes.
            self.present |= older.present
            older.connection.shut(CLOSE_REPLACED, "another connection took this clientId")
        self.client_id = client_id

    async def _ping(self, params: ChannelParams) -> None:
        return None

    async def _reconnect(
        self, params: ReconnectParams
    ) -> ReconnectResult | ReconnectReplay | ReconnectSnapshots:
        return await reconnect(self, params)

    # ─── Subscriptions ───────────────────────────────────────────────────

    async def _subscribe(self, params: SubscribeParams) -> SubscribeResult:
        await self.commands.pay(self.grant, "subscribe")
        view = params.view if TURN_WINDOWS in self.extensions else None
        turns = view.turns if view is not None else None
        snapshot = await self.subscribe_to(params.channel, turns)
        # Half an action spent up front, what it took as a debt.
        self.commands.charge_snapshots(self.grant, 0, len(encode(snapshot)))
        return SubscribeResult(snapshot=snapshot)

    @property
    def answer_budget(self) -> int:
        """The bytes an answer naming several channels may take (their
        snapshots each windowed to a share of :attr:`frame_budget`, though
        one that cannot be windowed, a streaming turn's parts, may take
        more): short of what the client may leave unread, so that the answer
        never cuts its own connection off. A snapshot that does not fit in
        what is left is left out."""
        return self.limits.send_buffer - PAGE_MARGIN

    @property
    def frame_budget(self) -> int:
        """The bytes one answer may take (``Limits.answer_budget``)."""
        return self.limits.answer_budget

    async def subscribe_to(self, uri: str, turns: int | None = None, share: int = 1) -> Snapshot:
        """Subscribe and return the snapshot, a chat's windowed to fit its
        ``share`` of one answer's budget. Raises CommandError (not found)."""
        await self.commands.reach(self.grant, uri)
        self.count_subscription(uri)
        try:
            self.connection.park(uri)
            snapshot = await self.commands.subscribe(uri, self.connection)
        except ChannelGone:
            raise not_found(uri) from None
        self.add_subscription(uri)
        return self.fitted(snapshot, turns, share)

    def fitted(self, snapshot: Snapshot, turns: int | None = None, share: int = 1) -> Snapshot:
        """``snapshot`` windowed to its ``share`` of the frame budget."""
        if not isinstance(snapshot.state, ChatState):
            return snapshot
        state = self.commands.window(snapshot.state, turns, self.frame_budget // max(1, share))
        if state is snapshot.state:
            return snapshot
        return Snapshot(resource=snapshot.resource, state=state, from_seq=snapshot.from_seq)

    def count_subscription(self, uri: str) -> None:
        """CommandError when one more subscription would be too many."""
        self.count_subscriptions(0 if uri in self.subscriptions else 1)

    def count_subscriptions(self, more: int) -> None:
        """CommandError when ``more`` subscriptions besides this connection's
        would be too many (checked before any is made: reconnect)."""
        if more > 0 and len(self.subscriptions) + more > self.limits.max_subscriptions:
            raise CommandError(
                ErrorCode.PERMISSION_DENIED,
                f"at most {self.limits.max_subscriptions} subscriptions per connection",
            )

    def add_subscription(self, uri: str) -> None:
        if uri not in self.subscriptions:
            self.subscriptions.add(uri)
            self.connection.metrics.subscribed(1)

    async def _unsubscribe(self, params: ChannelParams) -> None:
        if params.channel in self.subscriptions:
            self.subscriptions.discard(params.channel)
            self.connection.metrics.subscribed(-1)
            self.commands.unsubscribe(params.channel, self.connection)
            if self.numbering is not None:
                self.numbering.forget(params.channel)

    def closed(self) -> None:
        """Forget every subscription and the client id (the socket is gone)."""
        if self.client_id is not None:
            client_id = self.client_id

            def back() -> bool:
                return self.clients.live(client_id) not in (None, self)

            # Back already: its entries are another connection's, counted so.
            payer = None if back() else self.grant
            for session in self.present:
                self.commands.leave(session, client_id, back, payer)
        self.present.clear()
        for uri in self.subscriptions:
            self.commands.unsubscribe(uri, self.connection)
        self.connection.metrics.subscribed(-len(self.subscriptions))
        self.subscriptions.clear()
        if self.client_id is not None:
            self.clients.unbind(self.client_id, self)

    # ─── Commands ────────────────────────────────────────────────────────

    async def _create_session(self, params: CreateSessionParams) -> None:
        if params.fork is not None:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                "forking a session is not supported: leave fork out",
                "$.params.fork",
            )
        joining = params.active_client
        if joining is not None:
            if joining.client_id != self.client_id:
                raise MalformedFrame(
                    ErrorCode.INVALID_PARAMS,
                    "activeClient.clientId must be the clientId of initialize",
                    "$.params.activeClient.clientId",
                )
            try:
                await _may_be_present(self, params.channel)
            except ActionRejected as rejected:
                raise refused(rejected, "$.activeClient") from None
        joined = False
        try:
            await self.commands.create_session(
                self.grant,
                params.channel,
                provider=params.provider,
                title=params.title if TITLES in self.extensions else None,
                working_directories=params.working_directories,
                active_client=joining,
                client_id=self.client_id,
                sender=self.identity,
            )
            joined = joining is not None
        finally:
            if joining is not None:
                _present(self, params.channel, joined)

    async def _dispose_session(self, params: ChannelParams) -> None:
        await self.commands.dispose_session(self.grant, params.channel)

    async def _create_chat(self, params: CreateChatParams) -> None:
        if params.source is not None:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                "a chat's source (fork, sideChat) is not supported: the agents do not "
                "advertise multipleChats.fork or sideChat",
                "$.params.source",
            )
        await self.commands.create_chat(
            self.grant,
            params.channel,
            params.chat,
            title=params.title if TITLES in self.extensions else None,
            initial_message=params.initial_message,
            working_directories=params.working_directories,
            client_id=self.client_id,
            sender=self.identity,
        )

    async def _dispose_chat(self, params: ChannelParams) -> None:
        await self.commands.dispose_chat(self.grant, params.channel)

    async def _list_sessions(self, params: ListSessionsParams) -> ListSessionsResult:
        await self.commands.pay(self.grant, "listSessions")
        page = await self.commands.list_sessions(
            self.grant, params.cursor, params.limit, budget=self.frame_budget
        )
        return ListSessionsResult(items=page.items, next_cursor=page.next_cursor)

    async def _fetch_turns(self, params: FetchTurnsParams) -> FetchTurnsResult | EmptyResult:
        await self.commands.pay(self.grant, "fetchTurns")
        if CHANNEL_SEQS in self.extensions:
            turns, cursor = await self.commands.fetch_turns(
                self.grant, params.channel, params.cursor, params.limit, self.frame_budget
            )
            return FetchTurnsResult(turns=turns, turns_next_cursor=cursor)
        numbering = self.numbering
        assert numbering is not None
        if params.cursor is None:
            # No cursor: the client holds every turn; nothing older to load.
            await self.commands.reach(self.grant, params.channel)
            turns, cursor = [], None
        else:
            turns, cursor = await self.commands.fetch_turns(
                self.grant, params.channel, params.cursor, None, self.frame_budget
            )
        # AHP: chat/turnsLoaded before the answer. The window is this
        # connection's (Huddle's chat state holds every turn), so the action
        # goes to this connection, numbered in its own sequence.
        loaded = ChatTurnsLoaded(turns=turns, turns_next_cursor=cursor)
        seq = numbering.cursor(params.channel, numbering.counter) or 0
        envelope = ActionEnvelope(channel=params.channel, action=loaded, server_seq=seq)
        self.connection.send_frame(action_frame(encode(envelope), params.channel, seq))
        return EmptyResult()

    async def _expire(self, params: ExpireParams) -> ExpireResult:
        if EXPIRY not in self.extensions:  # plain AHP has no such method
            raise MalformedFrame(ErrorCode.METHOD_NOT_FOUND, "unknown method 'huddle/expire'")
        await self.commands.pay(self.grant, "expire")
        return ExpireResult(expires_at=await self.commands.expire(self.grant, params))

    # ─── Actions ─────────────────────────────────────────────────────────

    async def _dispatch(self, params: DispatchActionParams) -> None:
        if self.client_id is None:
            raise MalformedFrame(ErrorCode.INVALID_REQUEST, "initialize first")
        origin = ActionOrigin(client_id=self.client_id, client_seq=params.client_seq)
        uri, action = params.channel, params.action
        joining = isinstance(action, SessionActiveClientSet) and uri not in self.present
        try:
            if joining:
                await _may_be_present(self, uri)
            try:
                await self.commands.dispatch(
                    self.grant,
                    uri,
                    action,
                    origin=origin,
                    seq_scope=self.seq_scope,
                    client_id=self.client_id,
                    sender=self.identity,
                )
            except BaseException:
                if joining:
                    _present(self, uri, False)
                raise
            if joining:
                _present(self, uri, True)
            elif isinstance(action, SessionActiveClientRemoved) and uri in self.present:
                self.present.discard(uri)
                _present(self, uri, False)  # its count given back
        except ChannelGone:
            pass  # AHP: an action for a channel that does not exist is ignored
        except AlreadyApplied as applied:
            self.echoes.applied(applied, numbered=self.numbering is not None)
        except ActionRejected as rejected:
            # A flooder is closed before its last echo goes out.
            self.connection.count_action(limited=rejected.code == RejectionCode.RATE_LIMITED)
            await self.echoes.rejection(uri, encode(action), origin, rejected.reason)
            return
        except StoreUnavailable as error:
            reason = Rejection(RejectionCode.STORE_UNAVAILABLE, f"{error}; try again").reason
            await self.echoes.rejection(uri, encode(action), origin, reason)
        self.connection.count_action(limited=False)


async def _may_be_present(rpc: Rpc, session: str) -> None:
    """A person's token is in a session's active clients with at most
    PRESENT_PER_TOKEN connections (of every process: counted in the store,
    Commands.arrive; a shared link's browsers PRESENT_PER_LINK
    together): one token opening many sockets must not crowd everyone else
    out of the list. Counted once it returns: :func:`_present` says how it
    went."""
    grant = rpc.grant
    if grant.role == "agent" or session in rpc.present:
        return
    limit = PRESENT_PER_LINK if grant.shared else PRESENT_PER_TOKEN
    if not await rpc.commands.arrive(grant, session, limit):
        raise ActionRejected(
            RejectionCode.TOO_MANY,
            f"a token may be among a session's active clients {limit} times",
        )


def _present(rpc: Rpc, session: str, joined: bool) -> None:
    """After :func:`_may_be_present` counted ``session``: it is ``rpc``'s
    now, or the count is given back (in the background)."""
    if joined:
        rpc.present.add(session)
    elif rpc.client_id is not None:  # given back, the entry left as it is
        rpc.commands.leave(session, rpc.client_id, lambda: True, rpc.grant)


_REQUESTS: Final[dict[str, Callable[[Rpc, Any], Awaitable[Any]]]] = {
    "initialize": Rpc._initialize,
    "ping": Rpc._ping,
    "subscribe": Rpc._subscribe,
    "reconnect": Rpc._reconnect,
    "createSession": Rpc._create_session,
    "disposeSession": Rpc._dispose_session,
    "createChat": Rpc._create_chat,
    "disposeChat": Rpc._dispose_chat,
    "listSessions": Rpc._list_sessions,
    "fetchTurns": Rpc._fetch_turns,
    "huddle/expire": Rpc._expire,
}
"""The JSON-RPC requests, by method; one table for every connection."""
_NOTIFICATIONS: Final[dict[str, Callable[[Rpc, Any], Awaitable[None]]]] = {
    "dispatchAction": Rpc._dispatch,
    "unsubscribe": Rpc._unsubscribe,
}


def _announced(asked: frozenset[str], identity: Identity, *, shared: bool) -> dict[str, Any]:
    """What ``initialize``'s ``_meta.huddle`` tells a client that asked
    for ``asked``, on a connection whose actions are ``identity``'s (a
    ``shared`` link's token or not)."""
    announced: dict[str, Any] = {"extensions": sorted(asked)}
    if IDENTITY in asked:
        announced["identity"] = {**identity.who(), "display": identity.display, "shared": shared}
    return announced


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
