"""The commands of the server, one layer for every edge.

JSON-RPC over the WebSocket (:mod:`server.edge.rpc`) and the HTTP API
(:mod:`server.edge.app`) both call these, with the caller's grant: each command
asks the policy (:mod:`server.core.policy`), then the host. A command raises

- :class:`~protocol.codec.MalformedFrame` for a bad argument (a channel URI
  that does not parse, a cursor that names nothing), its path relative to
  the command's arguments (``$.channel``; the WebSocket edge puts it under
  ``$.params``);
- :class:`~server.errors.CommandError` when it cannot be done (not found,
  permission, already exists), with an AHP error code;
- :class:`~server.errors.ActionRejected` for an action refused by the
  policy or the validation rules (:meth:`Commands.dispatch`);

and each edge answers them in its own transport's shape.

Creating a session or a chat spends one action of the token's rate budget
(:meth:`Commands.admit`, the budget dispatches spend), on every edge; a
refusal on the way (the budget, the caps, the initial message's rules) is
a command's error (:func:`refused`). A chat's initial message is the
``chat/turnStarted`` it becomes: checked by the policy and the rules as
that dispatch is, before the chat is created, then dispatched as the
caller's own. Its ``workingDirectories`` must each be one of the session's
(AHP: the server MUST reject any that is not), checked before that.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgspec
from msgspec.structs import replace

from protocol.actions import (
    ChatDraftChanged,
    ChatPendingMessageSet,
    ChatToolCallConfirmed,
    ChatToolCallStart,
    ChatTurnStarted,
    SessionActiveClientSet,
    SessionWorkingDirectorySet,
    StateAction,
    action_type,
)
from protocol.chat import ChatState, ClientContributor, Message, Turn
from protocol.codec import MalformedFrame, decode_json
from protocol.messages import (
    ActionEnvelope,
    ActionOrigin,
    ChannelState,
    ErrorCode,
    ExpireParams,
    Resume,
    Snapshot,
)
from protocol.rejections import Rejection, RejectionCode
from protocol.session import ActiveClient, RootState, SessionState, SessionSummary
from protocol.uris import ROOT_URI, SESSION_SCHEME, BadChannelUri, channel_kind
from reducers.clock import iso_time
from reducers.limits import json_bytes
from reducers.notes import HUDDLE
from reducers.validation import working_directories_problem
from server.auth import Grant, Identity, TokenAuthority
from server.core import presence
from server.core.channels import ChannelView, Subscriber
from server.core.expiry import Expiry, Family
from server.core.host import Host
from server.core.policy import Command as Command
from server.core.policy import (
    admission_refusal,
    cap_refusal,
    chat_disposal_refusal,
    command_refusal,
    dispatch_refusal,
    keeping_executor,
    new_turn_stamp,
    reaches,
    stamped,
)
from server.core.sessions import new_chat, new_session, windowed
from server.core.waiters import InputOutcome
from server.credentials import AGENT_CLAIM_TTL, Credentials
from server.errors import ActionRejected, ChannelGone, CommandError, StoreUnavailable, refused
from server.metrics import Metrics
from server.notify.endpoints import Invite, session_uris
from server.notify.outbox import Notifier
from server.ratelimit import Budgets, NewClientIds

PAGE_SIZE = 100
"""Sessions in a page of ``listSessions`` that does not ask for a size."""
MAX_PAGE = 500
"""The largest page of ``listSessions`` (and no more than fit in what one
answer may take: ``Rpc.frame_budget``)."""
ACTION_COST = 1.0
"""What one action costs of its token's budget (the unit of every cost)."""
READ_COST = 0.5
"""A read (a snapshot, a page of turns, a long poll): half an action."""
BYTES_PER_COST = 64 << 10
"""A snapshot costs one action more per whole 64 KiB of it (as a debt)."""
COSTS: Final[dict[str, float]] = {
    "snapshot": READ_COST,
    "subscribe": READ_COST,
    "fetchTurns": READ_COST,
    "listSessions": READ_COST,
    "audit": READ_COST,
    "auditKey": READ_COST,
    "waitInput": READ_COST,
    "metrics": READ_COST,
    "expire": ACTION_COST,
    "mintToken": ACTION_COST,
    "mcp": READ_COST,
    "webhooks": ACTION_COST,
}
"""What each command costs of its token's budget up front, in actions
(server.ratelimit), the same over HTTP and the socket, paid before any of
the request is read (:meth:`Commands.pay`): reads are cheaper than writes.
An answer's size is charged after it (:meth:`Commands.charge_snapshots`,
an audit's records in :meth:`Commands.export_audit`); an action and a
session or chat created pay ACTION_COST in :meth:`Commands.admit`, after
the permission check."""
AUDIT_RECORDS_PER_COST = 100
"""An audit export costs one action more per whole 100 records or per whole
64 KiB of it, whichever is more (as a debt, however large:
:meth:`Commands.export_audit`)."""
PAGE_MARGIN = 1024
"""Bytes kept, in a page of turns or sessions, for what wraps them (the JSON-RPC
answer, a chat/turnsLoaded envelope, the HTTP answer's resource and
cursor)."""


@dataclass(frozen=True)
class Page:
    """A page of the sessions list and the cursor of the next one."""

    items: list[SessionSummary]
    next_cursor: str | None


class Commands:
    """See the module docstring."""

    def __init__(
        self,
        host: Host,
        authority: TokenAuthority,
        *,
        metrics: Metrics,
        budgets: Budgets,
        clock: Callable[[], float],
        default_ttl: float,
        max_ttl: float,
        max_sessions: int = 10_000,
        client_ids: NewClientIds | None = None,
        client_claim_ttl: float = AGENT_CLAIM_TTL,
        notifier: Notifier | None = None,
    ) -> None:
        self.host = host
        self.audit = AuditCommands(self)
        self.webhooks = WebhookCommands(self, notifier)
        self.credentials = Credentials(
            host,
            authority,
            self.allow,
            clock=lambda: self.clock(),  # one clock: tokens are verified by this one
            default_ttl=default_ttl,
            max_ttl=max_ttl,
            client_ids=client_ids,
            claim_ttl=client_claim_ttl,
        )
        """Client ids claimed and tokens minted (server.credentials)."""
        self.metrics = metrics
        self.budgets = budgets
        self.clock = clock
        self.max_sessions = max_sessions

    # ─── Reaching channels ───────────────────────────────────────────────

    async def reach(self, grant: Grant, uri: str, path: str = "$.channel") -> str | None:
        """The session of channel ``uri``, if this token reaches it. Raises
        MalformedFrame for a URI that does not parse, CommandError (not
        found) when the channel does not exist or the token does not reach
        it: the caller cannot tell the two apart."""
        try:
            return await self._reachable(grant, uri, path)
        except ChannelGone:
            raise not_found(uri) from None

    async def _reachable(self, grant: Grant, uri: str, path: str) -> str | None:
        """As :meth:`reach`, raising ChannelGone for both."""
        try:
            session = await self.host.session_of(uri)
        except BadChannelUri as error:
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), path) from None
        if not reaches(grant, session):
            raise ChannelGone(uri)
        return session

    def allow(self, grant: Grant, command: Command) -> None:
        """CommandError (permission denied) unless ``grant`` may run
        ``command``: asked before anything else of the request is read."""
        refusal = command_refusal(grant, command)
        if refusal is not None:
            raise CommandError(ErrorCode.PERMISSION_DENIED, refusal)

    async def admit(self, grant: Grant) -> None:
        """ActionRejected unless ``grant`` may send an action now (not an
        observer; RateLimited beyond its token's rate limit): asked before
        the action is read."""
        refusal = admission_refusal(grant)
        if refusal is not None:
            raise ActionRejected.of(refusal)
        await self.spend(grant, ACTION_COST)

    async def spend(self, grant: Grant, cost: float) -> None:
        """Take ``cost`` (in actions) from the budget of ``grant``'s token
        (a shared link's browsers: the link's); RateLimited, nothing taken,
        when it does not fit now. Asked before the work it pays for."""
        await self.budgets.spend(grant, cost)

    def charge(self, grant: Grant, cost: float) -> None:
        """Take ``cost`` from the token's budget even into debt: for what
        is known only once done (an answer's size); the token's next
        requests wait it out."""
        self.budgets.charge(grant, cost)

    def charge_snapshots(self, grant: Grant, count: int, size: int) -> None:
        """Charge ``count`` snapshots that took ``size`` bytes together, as a
        debt: a read each, and one action more per whole 64 KiB."""
        self.charge(grant, READ_COST * count + size // BYTES_PER_COST)

    async def visible_seq(self, grant: Grant, uri: str) -> int | None:
        """The seq of ``uri`` if this token reaches it, else None (a rejection
        echo must not tell an outsider what a channel's seq is)."""
        try:
            await self._reachable(grant, uri, "$.channel")
            return (await self.host.view(uri)).seq
        except (ChannelGone, MalformedFrame):
            return None

    def _check_title(self, title: str | None) -> None:
        limit = self.host.sizes.title
        if title is not None and (size := json_bytes(title)) > limit:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                f"the title is {size:,} bytes; the limit is {limit:,}",
                "$.title",
            )

    async def snapshot(self, grant: Grant, uri: str) -> ChannelView:
        await self.reach(grant, uri)
        try:
            view = await self.host.view(uri)
        except ChannelGone:
            raise not_found(uri) from None
        if isinstance(view.state, SessionState):  # read, as a subscribe reads it
            self.host.aggregate.check_listing(uri, view.state)
        return view

    def reaches(self, grant: Grant, session: str | None) -> bool:
        """Whether ``grant``'s token reaches ``session`` (server.core.policy)."""
        return reaches(grant, session)

    # ─── Subscriptions ───────────────────────────────────────────────────

    async def subscribe(self, uri: str, subscriber: Subscriber) -> Snapshot:
        """Subscribe ``subscriber`` to ``uri`` (reached already: :meth:`reach`)
        and return the snapshot it starts from; raises ChannelGone. A
        session read so has its listing checked, as :meth:`snapshot` does."""
        snapshot = await self.host.core.subscribe(uri, subscriber)
        if isinstance(snapshot.state, SessionState):
            self.host.aggregate.check_listing(uri, snapshot.state)
        return snapshot

    async def resume(
        self, uri: str, last_seen: int, subscriber: Subscriber, max_bytes: int | None = None
    ) -> Resume:
        """Subscribe ``subscriber`` to ``uri`` again after a drop: the
        envelopes after ``last_seen`` (at most ``max_bytes``) or a snapshot
        (server.core.channels.ChannelCore.resume)."""
        return await self.host.core.resume(uri, last_seen, subscriber, max_bytes=max_bytes)

    def unsubscribe(self, uri: str, subscriber: Subscriber) -> None:
        self.host.core.unsubscribe(uri, subscriber)

    def leave(
        self, session: str, client_id: str, back: Callable[[], bool], grant: Grant | None
    ) -> None:
        """``client_id``'s entry in ``session`` went (server.core.presence):
        taken out unless ``back``, given back to ``grant``'s count (None: not)."""
        payer = None if grant is None or grant.role == "agent" else grant.budget_key
        self.host.core.spawn(presence.leave(self.host, session, client_id, back, payer))

    async def arrive(self, grant: Grant, session: str, limit: int) -> bool:
        """server.core.presence.arrive for ``grant``'s token; StoreError."""
        return await presence.arrive(self.host, session, grant.budget_key, limit)

    @staticmethod
    def window(state: ChatState, turns: int | None, max_bytes: int) -> ChatState:
        """Chat ``state`` as an answer shows it: its newest ``turns`` turns
        that fit in ``max_bytes`` (server.core.sessions.windowed)."""
        return windowed(state, turns, max_bytes)

    async def root_seq(self) -> int:
        """The root channel's seq now (what ``initialize`` answers)."""
        return (await self.host.view(ROOT_URI)).seq

    # ─── Sessions and chats ──────────────────────────────────────────────

    async def create_session(
        self,
        grant: Grant,
        uri: str,
        *,
        provider: str | None = None,
        title: str | None = None,
        working_directories: list[str] | None = None,
        active_client: ActiveClient | None = None,
        client_id: str | None = None,
        sender: Identity | None = None,
        path: str = "$.channel",
        admitted: bool = False,
    ) -> str:
        """Create session ``uri``, working in ``working_directories``, with
        ``active_client`` (the caller's own, from ``client_id``) among its
        active clients as ``sender`` sets it (AHP: as a
        ``session/activeClientSet`` right after creation); returns its
        default chat. Spends one action of the token's budget (:meth:`admit`
        first, unless the caller did); CommandError (-32011) when the server
        holds as many sessions as this token may create
        (server.core.policy.cap_refusal). The directories and the entry
        are checked by the policy and the rules as those actions are, before
        anything is created (MalformedFrame naming the field)."""
        self.allow(grant, Command.CREATE_SESSION)
        expect_kind(uri, "session", path)
        self._check_title(title)
        if not admitted:
            await self._spend(grant)
        root = (await self.host.view(ROOT_URI)).state
        held = (root.active_sessions if isinstance(root, RootState) else None) or 0
        if (refusal := cap_refusal(grant, held, self.max_sessions)) is not None:
            raise CommandError(ErrorCode.CONFLICT, refusal)
        blank = new_session(self.host.sessions.agent(provider).provider, title)
        for directory in dict.fromkeys(working_directories or []):
            added = SessionWorkingDirectorySet(directory=directory)
            if (problem := await self.host.check(uri, added, blank)) is not None:
                raise refused(ActionRejected.of(problem), "$.workingDirectories")
            dirs = [*(blank.working_directories or []), directory]
            blank = replace(blank, working_directories=dirs)
        joined = None
        if active_client is not None:
            joined = SessionActiveClientSet(active_client=active_client)
            await self._would_take(grant, uri, joined, blank, client_id, "$.activeClient")
        chat = await self.host.create_session(
            uri, provider=provider, title=title, working_directories=working_directories
        )
        if joined is not None:
            await self._as_callers(grant, uri, joined, client_id, sender, "$.activeClient")
        return chat

    async def _would_take(
        self,
        grant: Grant,
        uri: str,
        action: StateAction,
        blank: ChannelState,
        client_id: str | None,
        path: str,
    ) -> None:
        """Refused (:func:`refused`, at ``path``) unless the policy and the
        rules take ``action`` from ``grant`` on ``uri`` in ``blank``, the
        state it will have when created: asked before anything is, of the
        action as it will be recorded (stamped: its size is what counts)."""
        refusal = dispatch_refusal(grant, uri, action, blank, client_id)
        recorded = _as_sent_by(grant, grant.identity, action)
        refusal = refusal or await self.host.check(uri, recorded, blank)
        if refusal is not None:
            raise refused(ActionRejected.of(refusal), path)

    async def _as_callers(
        self,
        grant: Grant,
        uri: str,
        action: StateAction,
        client_id: str | None,
        sender: Identity | None,
        path: str,
    ) -> None:
        """Dispatch ``action`` (already admitted) as the caller's own, just
        after its channel was created; refused as a command is, at ``path``."""
        try:
            await self.dispatch(
                grant, uri, action, client_id=client_id, sender=sender, admitted=True
            )
        except ActionRejected as rejected:
            raise refused(rejected, path) from None
        except ChannelGone as gone:
            raise not_found(gone.channel) from None

    async def dispose_session(self, grant: Grant, uri: str) -> None:
        self.allow(grant, Command.DISPOSE_SESSION)
        expect_kind(uri, "session")
        await self.reach(grant, uri)
        try:
            await self.host.dispose_session(uri)
        except ChannelGone:
            raise not_found(uri) from None

    async def create_chat(
        self,
        grant: Grant,
        session: str,
        chat: str,
        *,
        title: str | None = None,
        initial_message: Message | None = None,
        working_directories: list[str] | None = None,
        client_id: str | None = None,
        sender: Identity | None = None,
    ) -> None:
        """Create chat ``chat`` in ``session``, working in
        ``working_directories`` (None: the session's), its first turn started
        by ``initial_message`` as ``sender`` (the token's identity when None)
        dispatches it from ``client_id``. Spends one action of the token's
        budget. Raises CommandError or MalformedFrame (:func:`refused`) for
        a budget spent, a session full of chats (its last tenth is the
        agent's: server.core.policy.cap_refusal), a chat URI that is taken
        (AlreadyExists: the same answer whichever session holds it, seen by
        this token or not), a working directory the session does not have
        (AHP: MUST reject), an initial message the policy or the rules
        refuse: then no chat is created."""
        self.allow(grant, Command.CREATE_CHAT)
        expect_kind(session, "session")
        expect_kind(chat, "chat", "$.chat")
        self._check_title(title)
        await self._spend(grant)
        await self.reach(grant, session)
        if working_directories is not None:
            try:
                held = (await self.host.view(session)).state
            except ChannelGone as gone:
                raise not_found(gone.channel) from None
            assert isinstance(held, SessionState)
            refusal = working_directories_problem(held, working_directories)
            if refusal is not None:
                raise refused(ActionRejected.of(refusal), "$.workingDirectories")
        started = None
        if initial_message is not None:
            now = iso_time(self.host.now_ms())
            started = ChatTurnStarted(
                turn_id=secrets.token_hex(8), started_at=now, message=initial_message
            )
            blank = new_chat(session, chat, title or "", now, working_directories)
            await self._would_take(grant, chat, started, blank, client_id, "$.initialMessage")

        def cap(state: SessionState) -> Rejection | None:
            most = self.host.sizes.chats
            full = cap_refusal(grant, len(state.chats), most, holder="the session", what="chats")
            return None if full is None else Rejection(RejectionCode.TOO_MANY, full)

        try:
            await self.host.sessions.create_chat(
                session,
                chat,
                title=title,
                working_directories=working_directories,
                cap=cap,
                creator=None if grant.role == "agent" else grant.token_id,
            )
        except ActionRejected as rejected:
            raise refused(rejected, "$.initialMessage") from None
        except ChannelGone as gone:
            raise not_found(gone.channel) from None
        if started is not None:
            await self._as_callers(grant, chat, started, client_id, sender, "$.initialMessage")

    async def _spend(self, grant: Grant) -> None:
        """:meth:`admit`, refused as a command is (:func:`refused`)."""
        try:
            await self.admit(grant)
        except ActionRejected as rejected:
            raise refused(rejected, "$") from None

    async def dispose_chat(self, grant: Grant, chat: str) -> None:
        """Dispose chat ``chat`` (not its session's default chat; a
        person's token only a chat it created, with no turn running:
        server.core.policy.chat_disposal_refusal, CommandError permission
        denied or conflict)."""
        self.allow(grant, Command.DISPOSE_CHAT)
        expect_kind(chat, "chat")
        session = await self.reach(grant, chat)
        if session is None:
            raise not_found(chat)
        try:
            state = (await self.host.view(chat)).state
        except ChannelGone:
            raise not_found(chat) from None
        assert isinstance(state, ChatState)
        refusal = chat_disposal_refusal(grant, state)
        if refusal is not None:
            forbidden = refusal.code == RejectionCode.FORBIDDEN
            code = ErrorCode.PERMISSION_DENIED if forbidden else ErrorCode.CONFLICT
            raise CommandError(code, refusal.sentence)
        await self.host.sessions.dispose_chat(session, chat)

    async def list_sessions(
        self, grant: Grant, cursor: str | None, limit: int | None, budget: int | None = None
    ) -> Page:
        """The sessions this token reaches, most recent first, a page of at
        most ``limit`` (PAGE_SIZE when None; never more than MAX_PAGE) at a
        time, and no more than fit in ``budget`` bytes of JSON (at least one:
        a summary is bounded by the limits)."""
        items = [s for s in await self.host.aggregate.summaries() if reaches(grant, s.resource)]
        start = _offset(cursor)
        size = min(MAX_PAGE, limit) if limit and limit > 0 else PAGE_SIZE
        page = items[start : start + size]
        if budget is not None:
            page = page[: _fitting(page, budget)]
        self.host.aggregate.check_listed(page)  # as a session read is checked
        end = start + len(page)
        return Page(page, _cursor(end) if end < len(items) else None)

    async def fetch_turns(
        self,
        grant: Grant,
        chat: str,
        cursor: str | None,
        limit: int | None,
        budget: int | None = None,
    ) -> tuple[list[Turn], str | None]:
        """A page of ``chat``'s completed turns before ``cursor`` (None: the
        newest), oldest first, and the cursor before them: at most ``limit``
        (50 when None), and no more of the newest than fit in ``budget``
        bytes of JSON (at least one; what wraps them is the caller's
        margin: PAGE_MARGIN)."""
        expect_kind(chat, "chat")
        await self.reach(grant, chat)
        size = limit if limit and limit > 0 else 50
        page, older = await self.host.sessions.older_turns(chat, cursor, size)
        if budget is None:
            return page, older
        fit = _fitting(page[::-1], budget)
        if fit < len(page):  # the newest of the page, and the cursor before them
            page, older = await self.host.sessions.older_turns(chat, cursor, fit)
        return page, older

    async def out_of_debt(self, grant: Grant) -> None:
        """Refused as a command is (-32011) while the token's budget is in
        debt: for a request that costs nothing up front but answers reads
        charged afterwards (initialize, reconnect)."""
        try:
            await self.budgets.out_of_debt(grant)
        except ActionRejected as rejected:
            raise refused(rejected, "$") from None

    async def pay(self, grant: Grant, command: str) -> None:
        """Spend what ``command`` costs up front (:data:`COSTS`); RateLimited,
        nothing spent, when it does not fit now (each edge answers it its
        way: 429 with ``Retry-After``, or the JSON-RPC conflict)."""
        await self.spend(grant, COSTS[command])

    async def expire(self, grant: Grant, params: ExpireParams) -> int:
        """Give an open wait an expiry (server.core.expiry); when it expires (ms).
        Agent tokens only. CommandError (conflict) when the wait is not open."""
        self.allow(grant, Command.SET_EXPIRY)
        expect_kind(params.channel, "chat")
        if (params.request_id is None) == (params.tool_call_id is None):
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "give requestId or toolCallId (one)", "$.params"
            )
        try:
            expiry = Expiry(float(params.seconds), params.on_expiry)
        except ValueError as error:
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.params.seconds") from None
        await self.reach(grant, params.channel)
        family: Family = "requests" if params.request_id is not None else "toolCalls"
        key = params.request_id or params.tool_call_id or ""
        try:
            return await self.host.expire(params.channel, family, key, expiry)
        except ActionRejected as rejected:
            raise CommandError(ErrorCode.CONFLICT, rejected.reason) from None
        except ChannelGone:
            raise not_found(params.channel) from None

    # ─── Actions ─────────────────────────────────────────────────────────

    async def dispatch(
        self,
        grant: Grant,
        uri: str,
        action: StateAction,
        *,
        origin: ActionOrigin | None = None,
        seq_scope: str | None = None,
        client_id: str | None = None,
        sender: Identity | None = None,
        admitted: bool = False,
    ) -> ActionEnvelope:
        """Dispatch ``action`` for ``grant`` (:meth:`admit` first, unless the
        caller did); returns the accepted envelope. ``seq_scope``: what
        ``origin``'s clientSeq is numbered within beyond its clientId (a
        plain AHP connection's id; see server.core.channels.origin_key). Raises ActionRejected
        (not admitted, refused by the policy or the rules), ChannelGone (also
        for a channel the token does not reach), StoreUnavailable,
        MalformedFrame for a bad URI."""
        try:
            if not admitted:
                await self.admit(grant)
            await self._reachable(grant, uri, "$.channel")
            state = (await self.host.view(uri)).state
            refusal = dispatch_refusal(grant, uri, action, state, client_id)
            if refusal is not None:
                raise ActionRejected.of(refusal)
            who = sender or grant.identity
            holder = await self._executor_of(action)
            action = keeping_executor(_as_sent_by(grant, who, action), state, holder)
            payer = None if grant.role == "agent" else grant.budget_key
            return await self.host.dispatch(
                uri, action, origin=origin, seq_scope=seq_scope, sender=who, payer=payer
            )
        except (ActionRejected, StoreUnavailable):
            self.metrics.rejected(action_type(action))
            raise

    async def _executor_of(self, action: StateAction) -> str | None:
        """For a ``chat/toolCallStart`` of a client's tool, the token that
        holds that client id now: the call's executor (server.core.policy)."""
        if isinstance(action, ChatToolCallStart) and isinstance(
            action.contributor, ClientContributor
        ):
            return await self.credentials.holder_of(action.contributor.client_id)
        return None

    async def wait_input(self, grant: Grant, chat: str, request_id: str) -> InputOutcome:
        """Wait for an input request's outcome (bound it with a timeout)."""
        expect_kind(chat, "chat", "$.chat")
        await self.reach(grant, chat, "$.chat")
        return await self.host.wait_input(chat, request_id)


def _fitting(items: Sequence[Any], budget: int) -> int:
    """How many of ``items``, from the first, fit as a JSON list in
    ``budget`` bytes less PAGE_MARGIN (at least one: a page always moves on)."""
    room, fit = budget - PAGE_MARGIN, 0
    for item in items:
        room -= json_bytes(item) + 1
        if room < 0 and fit > 0:
            break
        fit += 1
    return fit


_Struct = TypeVar("_Struct", bound=msgspec.Struct)


def _as_sent_by(grant: Grant, who: Identity, action: StateAction) -> StateAction:
    """``action`` as the server records it from ``who``: a person's entry in
    the session's active clients carries the name the server knows them by,
    never one they chose; a person's message says which token sent it, and
    a turn's (the agent's too) which of the turns its id ever named it is
    (server.core.policy.stamped)."""
    if grant.role == "agent":
        if isinstance(action, ChatTurnStarted):
            return replace(action, message=stamped(action.message, None, turn=new_turn_stamp()))
        return action
    action = _without_huddle_meta(action)
    if isinstance(action, SessionActiveClientSet):
        entry = replace(action.active_client, display_name=who.display)
        return replace(action, active_client=entry)
    if isinstance(action, ChatDraftChanged) and action.draft is not None:
        return replace(action, draft=_without_huddle_meta(action.draft))
    if isinstance(action, ChatToolCallConfirmed) and action.user_suggestion is not None:
        return replace(action, user_suggestion=_without_huddle_meta(action.user_suggestion))
    if isinstance(action, ChatTurnStarted):
        message = _without_huddle_meta(action.message)
        return replace(action, message=stamped(message, grant, turn=new_turn_stamp()))
    if isinstance(action, ChatPendingMessageSet):
        return replace(action, message=stamped(_without_huddle_meta(action.message), grant))
    return action


def _without_huddle_meta(value: _Struct) -> _Struct:
    """``value`` (a person's action, or a message in one) without
    ``_meta.huddle``: what is there is the server's word (who sent it, an
    expiry that made it), which a person's client may not say. The messages
    of turns and pending messages are then stamped (server.core.policy.stamped),
    with the server's keys only."""
    meta = getattr(value, "meta", None)
    if not meta or HUDDLE not in meta:
        return value
    rest = {key: item for key, item in meta.items() if key != HUDDLE}
    return replace(value, meta=rest or None)


def expect_kind(uri: str, kind: str, path: str = "$.channel") -> None:
    """MalformedFrame unless ``uri`` is a channel URI of ``kind``."""
    try:
        found = channel_kind(uri)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), path) from None
    if found != kind:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, f"expected a {kind} URI", path)


def not_found(uri: str) -> CommandError:
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
    raise MalformedFrame(ErrorCode.INVALID_PARAMS, "unknown cursor", "$.cursor")


def _camel(value: dict[str, Any]) -> dict[str, Any]:
    """An endpoint as the HTTP API shows it (camelCase keys)."""
    return {
        k.split("_")[0] + "".join(w.title() for w in k.split("_")[1:]): v for k, v in value.items()
    }


class AuditCommands:
    """The session audits' commands (server.core.audit): exports and the
    public keys they are signed with; ``commands.audit``."""

    def __init__(self, commands: Commands) -> None:
        self.commands = commands

    async def export(self, grant: Grant, uri: str) -> AsyncIterator[bytes]:
        """Session ``uri``'s audit, its records as JSON lines
        (server.core.audit.export), once their cost is charged to the token
        (a debt). Unlike any other answer its cost is not capped at the
        burst: an export's bytes are whatever the session holds (up to
        ``--audit-max-bytes``), so a token that exports a large audit waits
        its size out before its next request (the last record says the
        audit's bytes before it: server.core.audit). One action more per
        whole :data:`AUDIT_RECORDS_PER_COST` records or per whole 64 KiB of
        it, whichever is more."""
        self.commands.allow(grant, Command.READ_AUDIT)
        if not uri.startswith(SESSION_SCHEME):
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "expected ahp-session:/<id>", "$.session"
            )
        await self.commands.reach(grant, uri, "$.session")  # a malformed id: 400
        store = self.commands.host.store
        last = await store.last_audit(uri)
        if last is None:
            await self.commands.snapshot(grant, uri)  # 404 when there is no such session
        else:
            head = decode_json(last)
            records = int(head["n"])  # records are numbered from 1
            before = head.get("bytes")
            size = len(last) + records + (before if isinstance(before, int) else 0)
            cost = max(records // AUDIT_RECORDS_PER_COST, size // BYTES_PER_COST)
            burst = self.commands.budgets.budget_of(grant).burst
            while cost > 0:  # each charge is capped at the burst: the debt is not
                self.commands.charge(grant, min(cost, burst))
                cost -= burst
        return self.commands.host.audit.export(uri)

    async def key(self, grant: Grant) -> dict[str, Any]:
        """The public keys the audit is signed with (server.core.audit_key:
        AuditKeys.published). Any token may read them, an observer's too: a
        public key is not a secret, and whoever checks an export needs it."""
        self.commands.allow(grant, Command.READ)
        return await self.commands.host.audit.keys.published()


class WebhookCommands:
    """The notifications' commands (server.notify: webhook endpoints, their
    deliveries, people invited by email), for agent tokens;
    ``commands.webhooks``."""

    def __init__(self, commands: Commands, notifier: Notifier | None) -> None:
        self.commands = commands
        self.notifier = notifier

    def _notifier(self, grant: Grant) -> Notifier:
        self.commands.allow(grant, Command.MANAGE_WEBHOOKS)
        if self.notifier is None:
            raise CommandError(ErrorCode.NOT_FOUND, "this server sends no notifications")
        return self.notifier

    async def add(self, grant: Grant, body: dict[str, Any], own: Sequence[str]) -> dict[str, Any]:
        """Add a webhook endpoint (server.notify.endpoints) for ``grant``'s
        token; ``own`` the server's own base URLs, which it may not point at.
        Answers its id and its secret, which is never shown again."""
        notifier = self._notifier(grant)
        endpoint, secret = await notifier.endpoints.add(
            grant.token_id,
            body.get("url"),
            own=[notifier.base_url, *own],
            now=self.commands.clock(),
            events=body.get("events"),
            format=body.get("format"),
            sessions=body.get("sessions"),
            escalate_after=body.get("escalateAfter"),
        )
        notifier.targets_changed()
        return {**_camel(endpoint.listed()), "secret": secret}

    async def listed(self, grant: Grant) -> list[dict[str, Any]]:
        notifier = self._notifier(grant)
        return [_camel(e.listed()) for e in await notifier.endpoints.all()]

    async def remove(self, grant: Grant, endpoint_id: str) -> None:
        notifier = self._notifier(grant)
        if not await notifier.endpoints.remove(endpoint_id):
            raise CommandError(ErrorCode.NOT_FOUND, f"no webhook {endpoint_id!r}")
        notifier.targets_changed()

    async def rotate_secret(self, grant: Grant, endpoint_id: str) -> dict[str, Any]:
        """A new secret; the old one signs beside it for a day."""
        secret = await self._notifier(grant).endpoints.rotate(endpoint_id, self.commands.clock())
        if secret is None:
            raise CommandError(ErrorCode.NOT_FOUND, f"no webhook {endpoint_id!r}")
        return {"id": endpoint_id, "secret": secret}

    async def deliveries(self, grant: Grant, endpoint: str | None) -> list[dict[str, Any]]:
        return await self._notifier(grant).deliveries(endpoint)

    async def resend(self, grant: Grant, delivery: str, target: str | None) -> None:
        if not await self._notifier(grant).resend(delivery, target):
            raise CommandError(ErrorCode.NOT_FOUND, f"no delivery {delivery!r} to send again")

    async def invite_by_email(self, grant: Grant, body: dict[str, Any]) -> None:
        """Remember a person invited by email (``huddle invite --email``):
        each request opened in their sessions is emailed to them with a
        sign-in link (server.notify.outbox)."""
        notifier = self._notifier(grant)
        ttl = body.get("ttl")
        ttl = self.commands.credentials.default_ttl if ttl is None else ttl
        if not isinstance(ttl, int | float) or not 0 < ttl <= self.commands.credentials.max_ttl:
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, "ttl out of range", "$.ttl")
        email, name, role = body.get("email"), body.get("name"), body.get("role", "participant")
        sessions = body.get("sessions")
        if not isinstance(email, str) or not isinstance(name, str) or not name:
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, "email and name are strings", "$")
        if role not in ("participant", "observer"):
            raise MalformedFrame(ErrorCode.INVALID_PARAMS, "participant or observer", "$.role")
        invite = Invite(
            email=email,
            name=name,
            role=role,
            sessions=session_uris(sessions),
            expires_at=self.commands.clock() + ttl,
        )
        await notifier.endpoints.invite(invite)
        notifier.targets_changed()
