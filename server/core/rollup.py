"""The session aggregate: a chat's requests and summary reflected on its
session, and a session's summary on the sessions list.

One hook of the channel core, acting on the actions this process accepted
(the process that accepts an action keeps the aggregates for it):

- after a chat action, the session's ``inputNeeded`` queue and chat catalog
  are brought up to date by diffing what the session last heard of the chat
  (its shadow) against the chat's state after the action
  (:func:`reducers.aggregate.derive_session_actions`). The diff is taken
  in the hook, in seq order, and sent by one sender per chat at a time, so
  neither their order nor another process's later envelopes can lose a
  change (the shadow moving past an answer before it was told left the
  answered request listed for good); an entry already settled in the chat
  by the time it is sent is not listed; a summary's ``modifiedAt`` alone reaches the
  catalog at most once per ``modified_at_interval``; ``inputNeeded`` holds
  at most INPUT_NEEDED_BYTES (an entry beyond is not listed, its chat
  still holds it);
- news in a chat (a turn, a question, a tool waiting) makes its session
  unread again;
- after a session action, the session's entry in the sessions list is
  re-derived and what changed is announced on the root channel.

Another process's chat envelopes move the shadow: the process that
accepted them told the session. But what two processes tell one session
lands in no set order (an answer unlisted before its asker listed it, a
turn's end overtaken by an older "in progress"), so a process that told a
chat's session something within RECHECK_FOR seconds checks the session
against the chat when it hears another's change, after what it is still
telling, and corrects what the chat shows is out of date: whichever process
tells last, the one that told the older state hears the newer one and sets
it right. It only ever unlists what the chat holds settled, and corrects
only while it has the chat's latest state (the store's head says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from msgspec.structs import replace

from protocol.actions import (
    ChatInputRequested,
    ChatToolCallReady,
    ChatTurnStarted,
    SessionAction,
    SessionChatUpdated,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
    SessionIsReadChanged,
    StateAction,
)
from protocol.chat import ChatState, ChatSummaryChanges
from protocol.codec import encode
from protocol.messages import SessionSummaryChangedParams
from protocol.session import SessionState, SessionSummary
from protocol.status import SessionStatus
from protocol.uris import ROOT_URI
from reducers.aggregate import (
    catalog_changes,
    derive_session_actions,
    select_input_needed,
    select_settled_entries,
    session_summary,
    summary_diff,
)
from reducers.limits import json_bytes
from server.cache import KeyedLocks, Lru
from server.core.channels import Applied, ChannelCore
from server.core.frozen_forms import chat_session
from server.errors import ChannelGone, StoreError

log = logging.getLogger("huddle.aggregate")

NEWS = (ChatTurnStarted, ChatInputRequested, ChatToolCallReady)
"""Chat actions that make the session unread again."""
SESSION_RECORDS = "session"
CACHED = 4096
"""Chats and sessions whose aggregate bookkeeping is kept in memory."""
INPUT_NEEDED_BYTES = 256 << 10
"""Bytes a session's ``inputNeeded`` may take: it mirrors every open
request and pending tool call of every chat in full (AHP), so an agent or
an MCP server asking large questions in many chats made the session too
large to load. Beyond, an entry is not listed there (its chat holds it)."""
RETELL_AFTER = 1.0
"""Seconds after which a change the store refused to tell is told again."""
RETELL_FOR = 60.0
"""Seconds a change is told again while the store refuses; then dropped."""
RECHECK_FOR = 10.0
"""Seconds after this process last told a chat's session something during
which another process's change of the chat makes it check the session
(:meth:`SessionAggregate._check_later`)."""
LISTED_FOR = 1.0
"""Seconds the sessions list, as read from the store, serves pages."""


@dataclass(frozen=True, slots=True)
class _Told:
    """Session actions derived from one change of a chat, to be sent:
    ``anew`` when the process had no shadow of the chat (see
    :meth:`SessionAggregate._listed_anew`)."""

    session: str
    state: ChatState
    actions: list[SessionAction]
    anew: bool
    check: bool = False
    """Not a change of this process's: the session checked against the chat
    (:meth:`SessionAggregate._corrections`)."""
    failed_at: float | None = None
    """When telling it first failed on the store (``time.monotonic()``)."""


class SessionAggregate:
    """See the module docstring. ``dispatch`` writes the derived actions
    (the server's own, unvalidated)."""

    def __init__(
        self,
        core: ChannelCore,
        dispatch: Callable[[str, StateAction], Awaitable[object]],
        *,
        clock: Callable[[], float],
        modified_at_interval: float = 1.0,
    ) -> None:
        self.core = core
        self.dispatch = dispatch
        self.clock = clock
        self.modified_at_interval = modified_at_interval
        self._shadows: Lru[str, ChatState] = Lru(CACHED)
        """The chat state the session last heard about, per chat."""
        self._last_push: Lru[str, float] = Lru(CACHED)
        self._summaries: Lru[str, SessionSummary] = Lru(CACHED)
        self._flushes: dict[str, asyncio.TimerHandle] = {}
        self._syncing: KeyedLocks[str] = KeyedLocks()
        """One sender per chat (and one announcer per session) at a time."""
        self._pending: dict[str, list[_Told]] = {}
        """What each chat's session is yet to hear, in order."""
        self._told: Lru[str, float] = Lru(CACHED)
        """When this process last had something to tell a chat's session
        (monotonic)."""
        self._checking: set[str] = set()
        """Chats whose session has a check queued."""
        self._retelling: set[str] = set()
        """Chats whose queue waits to be told again (the store refused it)."""
        self._verified: Lru[str, bool] = Lru(CACHED)
        """Chats checked against their session when it was subscribed or read,
        and sessions checked when they were listed."""
        self._listed: tuple[float, list[SessionSummary]] | None = None
        """The sessions list as last read, and until when it is served."""
        self._listing = asyncio.Lock()
        self._changes = 0

    def hook(self, event: Applied) -> Awaitable[None] | None:
        state = event.view.state
        if isinstance(state, ChatState):
            if not event.local:
                self._shadows.put(event.uri, state)
                self._check_later(event.uri, state)
                return None
            assert isinstance(event.before, ChatState)
            derived = self._derive(event.uri, state, event.before)
            news = isinstance(event.action, NEWS)
            if not derived and not news:
                return None
            return self._chat_changed(event.uri, state, news=news)
        if isinstance(state, SessionState) and event.local:
            return self.announce(event.uri)
        return None

    def stop(self) -> None:
        for handle in self._flushes.values():
            handle.cancel()
        self._flushes.clear()

    def forget(self, uri: str) -> None:
        """Drop the bookkeeping of a chat or session that is gone."""
        for cache in (self._shadows, self._last_push, self._summaries):
            cache.pop(uri)
        self._pending.pop(uri, None)
        self._told.pop(uri)
        self._checking.discard(uri)
        self._cancel_flush(uri)

    # ─── Chats -> their session ──────────────────────────────────────────

    async def _chat_changed(self, chat: str, state: ChatState, *, news: bool) -> None:
        await self._send(chat)
        if news:
            await self._mark_unread(state)

    def _derive(self, chat: str, current: ChatState, before: ChatState) -> bool:
        """Queue what the session must hear of this process's change of the
        chat to ``current`` (True when there is some). Called from the hook,
        in seq order, so the shadow cannot have moved past a change of ours
        on another process's envelopes before the change is told."""
        session = chat_session(current)
        if session is None:
            return False
        heard = self._shadows.get(chat)
        shadow = heard or before
        self._shadows.put(chat, current)
        now = self.clock()
        eager = now - (self._last_push.get(chat) or 0.0) >= self.modified_at_interval
        actions = derive_session_actions(shadow, current, include_modified_at=eager)
        if any(getattr(a, "changes", None) is not None for a in actions):
            self._last_push.put(chat, now)
            self._cancel_flush(chat)
        elif shadow.modified_at != current.modified_at:
            # The summary's modifiedAt lags by at most one interval.
            self._schedule_flush(chat)
            self._shadows.put(chat, replace(current, modified_at=shadow.modified_at))
        if not actions and heard is not None:
            return False
        told = _Told(session, current, actions, anew=heard is None)
        self._pending.setdefault(chat, []).append(told)
        self._told.put(chat, time.monotonic())  # from now: what is told may land late
        return True

    async def _send(self, chat: str) -> None:
        """Dispatch what is queued for the chat's session, in order (one
        sender per chat at a time: a later change's follow-up may send an
        earlier one's actions, never before them). When the chat moved on
        while this process's own changes were being told (another process's
        envelopes came in), a check follows: what was just told may be older
        than what the other process told first."""
        async with self._syncing.hold(chat):
            last: _Told | None = None
            while queue := self._pending.get(chat):
                # Taken off the queue once told (or failed): a caller that
                # gives up meanwhile leaves it, and those after it, queued
                # for a sender of their own.
                last = queue[0]
                try:
                    await self._tell(chat, last)
                except asyncio.CancelledError:
                    self.core.spawn(self._send(chat))
                    raise
                except StoreError as error:
                    # Redis away: told again, in order, once it may be back
                    # (dropped, an answered request stayed listed for good).
                    if self._retell_later(chat, last, error):
                        return
                except Exception:
                    log.exception("%s: its session was not told of a change", chat)
                queue.pop(0)
                if not queue and self._pending.get(chat) is queue:
                    del self._pending[chat]
            view = self.core.cached(chat)
            if last and not last.check and view is not None and view.state is not last.state:
                await self._tell(chat, _Told(last.session, last.state, [], False, check=True))

    def _retell_later(self, chat: str, told: _Told, error: StoreError) -> bool:
        """Keep ``told``, the first of the chat's queue, to be told again in
        RETELL_AFTER seconds (True), as the chat's entries brought in line
        with the session's (a part of it may have landed); after RETELL_FOR
        seconds of failures it is dropped (False), logged."""
        now = time.monotonic()
        failed_at = told.failed_at if told.failed_at is not None else now
        if now - failed_at >= RETELL_FOR:
            log.error("%s: its session was not told of a change: %s", chat, error)
            return False
        queue = self._pending.get(chat)
        if queue and queue[0] is told:
            queue[0] = dataclasses.replace(told, anew=not told.check, failed_at=failed_at)
        if chat not in self._retelling:
            self._retelling.add(chat)
            self.core.spawn(self._retell(chat))
        return True

    async def _retell(self, chat: str) -> None:
        try:
            await asyncio.sleep(RETELL_AFTER)
        finally:
            self._retelling.discard(chat)
        await self._send(chat)

    async def _tell(self, chat: str, told: _Told) -> None:
        actions = told.actions
        if told.check:
            self._checking.discard(chat)
            actions = await self._checked(told.session, chat)
        elif told.anew:
            actions = await self._listed_anew(told.session, chat, told.state, actions)
        for action in actions:
            if isinstance(action, SessionInputNeededSet) and not self._listable(
                told.session, chat, action
            ):
                continue
            self._told.put(chat, time.monotonic())
            with contextlib.suppress(ChannelGone):
                await self.dispatch(told.session, action)

    def check_listing(self, session: str, state: SessionState) -> None:
        """Someone subscribed to ``session`` or read it: each chat its
        ``inputNeeded`` lists or its catalog shows at work, that this
        process does not follow (it started since), is checked against the
        session once, in the background (:meth:`_corrections`). A stop with
        the store down left an answered request listed (its unlisting
        untold), or an open one unlisted, until the chat changed again."""
        active = {c.resource for c in state.chats if c.status & SessionStatus.IN_PROGRESS}
        for chat in active | {entry.chat for entry in state.input_needed or []}:
            if self._shadows.get(chat) is None and self._verified.get(chat) is None:
                self._verified.put(chat, True)
                self.core.spawn(self._verify(session, chat))

    def check_listed(self, summaries: list[SessionSummary]) -> None:
        """Someone listed ``summaries`` (a page of ``listSessions``): each
        session among them that shows work or a request, and that this
        process has not checked yet, is read and checked as a subscribe
        checks it (:meth:`check_listing`), and its entry derived again from
        it (:meth:`announce`), in the background. Otherwise the list went on
        saying what a stop with the store down left it saying until someone
        opened the session. ``_verified`` holds the sessions checked as well
        as the chats (their URIs never meet)."""
        for summary in summaries:
            uri = summary.resource
            if summary.status & SessionStatus.IN_PROGRESS and self._verified.get(uri) is None:
                self._verified.put(uri, True)
                self.core.spawn(self._verify_session(uri))

    async def _verify_session(self, session: str) -> None:
        try:
            state = (await self.core.view(session)).state
            if isinstance(state, SessionState):
                self.check_listing(session, state)
                await self.announce(session)
        except (ChannelGone, StoreError):
            return

    async def _verify(self, session: str, chat: str) -> None:
        try:
            state = (await self.core.view(chat)).state
        except (ChannelGone, StoreError):
            return
        if isinstance(state, ChatState) and chat not in self._checking:
            self._queue_check(session, chat, state)
            await self._send(chat)

    def _queue_check(self, session: str, chat: str, state: ChatState) -> None:
        """Queue a check of ``session`` against ``chat`` (:meth:`_checked`)
        after what is still to be told of the chat."""
        self._checking.add(chat)
        self._pending.setdefault(chat, []).append(_Told(session, state, [], False, check=True))

    def _check_later(self, chat: str, state: ChatState) -> None:
        """After another process's change of a chat whose session this
        process told something within RECHECK_FOR seconds, queue a check of
        the session against the chat. What two processes tell a session
        lands in no set order: a request answered the moment it opened was
        unlisted by the answering process before the asking one listed it,
        and a turn's end told by the worker was overtaken by the approving
        process's older "in progress"; each stayed for good. The check runs
        after what this process is still telling, so whichever process
        tells last, the one that told an older state corrects it once it
        hears the newer one."""
        told = self._told.get(chat)
        if told is None or chat in self._checking or time.monotonic() - told > RECHECK_FOR:
            return
        session = chat_session(state)
        if session is None:
            return
        self._queue_check(session, chat, state)
        self.core.spawn(self._send(chat))

    async def _checked(self, session: str, chat: str) -> list[SessionAction]:
        """:meth:`_corrections`, when this process has the chat's latest
        state (a look at the store's head, only when there is something to
        correct): one behind would take back what a newer state told. It
        hears the rest, and checks again then."""
        if not self._corrections(session, chat):
            return []
        try:
            head = (await self.core.store.heads([chat])).get(chat)
        except StoreError:
            return []
        view = self.core.cached(chat)
        if head is None or view is None or view.seq < head[1]:
            return []
        return self._corrections(session, chat)

    def _corrections(self, session: str, chat: str) -> list[SessionAction]:
        """What the session, as this process has it, lists or says of the
        chat that the chat, as this process has it, shows is out of date:
        entries of requests and tool calls settled (never one the chat does
        not hold: another process may have just opened it), entries of open
        ones missing (their listing was lost: a stop with the store down),
        and summary fields that differ."""
        chat_view, session_view = self.core.cached(chat), self.core.cached(session)
        if chat_view is None or session_view is None:
            return []
        latest, state = chat_view.state, session_view.state
        if not isinstance(latest, ChatState) or not isinstance(state, SessionState):
            return []
        listed = [e.id for e in state.input_needed or [] if e.chat == chat]
        actions: list[SessionAction] = [
            SessionInputNeededRemoved(id=entry_id)
            for entry_id in select_settled_entries(latest, listed)
        ]
        actions += [
            SessionInputNeededSet(request=entry)
            for entry_id, entry in select_input_needed(latest).items()
            if entry_id not in listed
        ]
        entry = next((c for c in state.chats if c.resource == chat), None)
        changes = catalog_changes(entry, latest) if entry is not None else {}
        if changes:
            actions.append(SessionChatUpdated(chat=chat, changes=ChatSummaryChanges(**changes)))
        return actions

    def _listable(self, session: str, chat: str, action: SessionInputNeededSet) -> bool:
        """Whether ``action``'s entry is still to be listed: still open in
        the chat as this process now has it (another process may have
        settled it since, and told the session first), and within
        INPUT_NEEDED_BYTES."""
        view = self.core.cached(chat)
        latest = view.state if view is not None else None
        if isinstance(latest, ChatState) and action.request.id not in select_input_needed(latest):
            return False
        if self._room_for(session, action):
            return True
        log.warning(
            "%s: %s is not listed in the session's inputNeeded: they take %d bytes",
            session,
            action.request.id,
            INPUT_NEEDED_BYTES,
        )
        return False

    async def _listed_anew(
        self, session: str, chat: str, current: ChatState, actions: list[SessionAction]
    ) -> list[SessionAction]:
        """``actions`` with the chat's ``inputNeeded`` entries brought in line
        with what the session lists, when this process has no shadow of the
        chat (it started since, or forgot it): the action's ``before`` may
        already miss a request another follow-up settled, so an entry left
        listed would stay for good, as would one an earlier Huddle listed
        under another id."""
        try:
            state = (await self.core.view(session)).state
        except ChannelGone:
            return actions
        if not isinstance(state, SessionState):
            return actions
        listed = {e.id: e for e in state.input_needed or [] if e.chat == chat}
        wanted = select_input_needed(current)
        fresh: list[SessionAction] = [
            SessionInputNeededSet(request=entry)
            for entry_id, entry in wanted.items()
            if listed.get(entry_id) != entry
        ]
        fresh += [SessionInputNeededRemoved(id=entry_id) for entry_id in listed.keys() - wanted]
        others = [
            a
            for a in actions
            if not isinstance(a, SessionInputNeededSet | SessionInputNeededRemoved)
        ]
        return fresh + others

    def _room_for(self, session: str, action: SessionInputNeededSet) -> bool:
        """Whether the session's ``inputNeeded`` stays within
        INPUT_NEEDED_BYTES with ``action``'s entry in it."""
        view = self.core.cached(session)
        if view is None or not isinstance(view.state, SessionState):
            return True  # not here: the store's compare-and-set decides, as for any write
        entry = action.request
        others = [e for e in view.state.input_needed or [] if e.id != entry.id]
        return json_bytes(others) + json_bytes(entry) <= INPUT_NEEDED_BYTES

    def _schedule_flush(self, chat: str) -> None:
        if chat in self._flushes:
            return
        loop = asyncio.get_running_loop()
        self._flushes[chat] = loop.call_later(
            self.modified_at_interval, lambda: self.core.spawn(self._flush(chat))
        )

    def _cancel_flush(self, chat: str) -> None:
        handle = self._flushes.pop(chat, None)
        if handle is not None:
            handle.cancel()

    async def _flush(self, chat: str) -> None:
        self._flushes.pop(chat, None)
        view = self.core.cached(chat)
        if view is None or not isinstance(view.state, ChatState):
            return
        self._last_push.put(chat, 0.0)
        if self._derive(chat, view.state, view.state):
            await self._send(chat)

    async def _mark_unread(self, chat: ChatState) -> None:
        """News in a chat makes its session unread again for everyone."""
        session = chat_session(chat)
        if session is None:
            return
        with contextlib.suppress(ChannelGone):
            state = (await self.core.view(session)).state
            if isinstance(state, SessionState) and state.status & SessionStatus.IS_READ:
                await self.dispatch(session, SessionIsReadChanged(is_read=False))

    # ─── Sessions -> the sessions list ───────────────────────────────────

    async def add(self, session: str, summary: SessionSummary) -> None:
        """Put a new session's entry on the list (its creation is done)."""
        self._summaries.put(session, summary)
        await self.core.store.put_record(SESSION_RECORDS, session, encode(summary))
        self._changed()

    async def remove(self, session: str) -> None:
        """Take a disposed session's entry off the list."""
        await self.core.store.delete_record(SESSION_RECORDS, session)
        self._changed()
        self.forget(session)

    async def announce(self, session: str) -> None:
        """Re-derive the session's list entry; announce what changed.
        Sessions still being created have no entry yet."""
        async with self._syncing.hold(session):
            view = self.core.cached(session)
            if view is None or not isinstance(view.state, SessionState):
                return
            old = self._summaries.get(session) or await self._read_summary(session)
            if old is None:
                return
            new = session_summary(session, view.state, old.created_at)
            changes = summary_diff(old, new)
            if not changes:
                return
            self._summaries.put(session, new)
            await self.core.store.put_record(SESSION_RECORDS, session, encode(new))
            self._changed()
            params = SessionSummaryChangedParams(channel=ROOT_URI, session=session, changes=changes)
            await self.core.publish_notice("root/sessionSummaryChanged", params)

    async def _read_summary(self, session: str) -> SessionSummary | None:
        raw = await self.core.store.get_record(SESSION_RECORDS, session)
        if raw is None:
            return None
        summary = msgspec.json.decode(raw, type=SessionSummary)
        self._summaries.put(session, summary)
        return summary

    async def summaries(self) -> list[SessionSummary]:
        """Every session's list entry, most recently modified first (do not
        change the list: callers share it). Read from the store at most once
        every LISTED_FOR seconds however many ask (pages of ``listSessions``
        read it all), and again after this process changed one; another
        process's change shows within LISTED_FOR (root notices tell of it
        at once)."""
        async with self._listing:
            listed = self._listed
            if listed is not None and time.monotonic() < listed[0]:
                return listed[1]
            changes = self._changes
            records = await self.core.store.records(SESSION_RECORDS)
            items = [msgspec.json.decode(raw, type=SessionSummary) for raw in records.values()]
            items.sort(key=lambda s: (s.modified_at, s.resource), reverse=True)
            if changes == self._changes:  # nothing changed here while it was read
                self._listed = (time.monotonic() + LISTED_FOR, items)
            return items

    def _changed(self) -> None:
        """This process changed the list: read it again when next asked."""
        self._changes += 1
        self._listed = None

    async def count(self) -> int:
        return await self.core.store.count_records(SESSION_RECORDS)
