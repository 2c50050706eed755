"""Session and chat lifecycle: create, dispose, list, page through turns.

A session is created with its default chat (``Main``); its entry joins the
sessions list once both exist and the session is ready, and the root
channel hears ``root/sessionAdded``. A session holds at most
``SizeLimits.chats`` chats (its catalog goes whole into every snapshot of
it, without the chats' working directories: :mod:`reducers.aggregate`): one
more is refused with ``too-many`` before anything is created, and checked
again as the catalog takes it, under the session's lock. A chat works in
some of its session's working directories, or in all when it names none.
Disposing a session removes its chats, abandons whoever waits on them, and
the root channel hears ``root/sessionRemoved``.
"""

from __future__ import annotations

import base64
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Final

from msgspec.structs import replace

from protocol.actions import (
    RootActiveSessionsChanged,
    SessionChatAdded,
    SessionChatRemoved,
    SessionDefaultChatChanged,
    SessionReady,
    StateAction,
)
from protocol.chat import ChatState, Turn, UserOrigin
from protocol.codec import encode
from protocol.messages import ErrorCode, SessionAddedParams, SessionRemovedParams
from protocol.rejections import Rejection
from protocol.session import AgentInfo, RootState, SessionState
from protocol.status import SessionStatus
from protocol.uris import ROOT_URI, chat_uri
from protocol.wire import JsonObject
from reducers.aggregate import chat_summary, session_summary
from reducers.clock import iso_time
from reducers.limits import SizeLimits, limit_problem
from server.core.channels import ChannelCore, ChannelView
from server.core.frozen_forms import HUDDLE_META
from server.core.rollup import SessionAggregate
from server.core.waiters import Waiters
from server.errors import ActionRejected, ChannelGone, CommandError

Dispatch = Callable[[str, StateAction], Awaitable[object]]


CAPABILITIES: Final[JsonObject] = {"multipleChats": {}, "multipleWorkingDirectories": {}}
"""What every agent Huddle serves can do (AHP's ``AgentCapabilities``, in
the root's ``agents``): more chats than the default one per session
(``createChat``; no forks or side chats), and a set of working directories
per session and chat that clients may change. Without them AHP forbids a
client ``createChat`` and any change to the directories."""


class Sessions:
    """Creates, disposes and lists sessions and chats; ``dispatch`` writes
    the server's own actions."""

    def __init__(
        self,
        core: ChannelCore,
        aggregate: SessionAggregate,
        waiters: Waiters,
        dispatch: Dispatch,
        agents: list[AgentInfo],
        sizes: SizeLimits | None = None,
    ) -> None:
        self.core = core
        self.aggregate = aggregate
        self.waiters = waiters
        self.dispatch = dispatch
        self.agents = agents
        self.sizes = sizes or SizeLimits()

    async def create_session(
        self,
        uri: str,
        *,
        provider: str | None = None,
        title: str | None = None,
        working_directories: list[str] | None = None,
    ) -> str:
        """Create session ``uri`` with its default chat, working in
        ``working_directories`` (once each, in their order); returns the
        chat URI.

        Raises CommandError (-32003) when the URI is taken, (-32002) for an
        unknown provider.
        """
        state = new_session(self.agent(provider).provider, title, working_directories)
        now = self.core.now_ms()
        if not await self.core.create(uri, state):
            raise CommandError(ErrorCode.SESSION_ALREADY_EXISTS, f"session {uri} already exists")
        chat = chat_uri(secrets.token_hex(8))
        await self.create_chat(uri, chat, title="Main")
        await self.dispatch(uri, SessionDefaultChatChanged(default_chat=chat))
        await self.dispatch(uri, SessionReady())
        view = await self.core.view(uri)
        assert isinstance(view.state, SessionState)
        summary = session_summary(uri, view.state, iso_time(now))
        await self.aggregate.add(uri, summary)
        await self._count_sessions()
        params = SessionAddedParams(channel=ROOT_URI, summary=summary)
        await self.core.publish_notice("root/sessionAdded", params)
        return chat

    def agent(self, provider: str | None) -> AgentInfo:
        """The agent ``provider`` names (None: the first); CommandError
        (-32002) when there is none."""
        for agent in self.agents:
            if provider is None or agent.provider == provider:
                return agent
        raise CommandError(ErrorCode.PROVIDER_NOT_FOUND, f"no agent provider {provider!r}")

    async def create_chat(
        self,
        session: str,
        chat: str,
        *,
        title: str | None = None,
        working_directories: list[str] | None = None,
        cap: Callable[[SessionState], Rejection | None] | None = None,
        creator: str | None = None,
    ) -> None:
        """Create chat ``chat`` in ``session`` and add it to the catalog, as
        the person whose token id is ``creator`` (None: the agent); it
        works in ``working_directories`` (None: the session's, as AHP says),
        which the caller checked are the session's
        (:func:`reducers.validation.working_directories_problem`). ``cap``
        is the creator's own bound, if any: why the session as it is may not
        take one more chat from them (asked with the catalog's, under the
        session's lock: creators racing cannot pass it).

        Raises CommandError (-32010) when the URI is taken, ActionRejected
        (``too-many``) when the session holds as many chats as it may (no
        chat is left behind)."""

        def refusal(view: ChannelView, action: StateAction) -> Rejection | None:
            assert isinstance(view.state, SessionState)
            full = limit_problem(view.state, action, self.sizes)
            return full or (cap(view.state) if cap is not None else None)

        view = await self.core.view(session)
        assert isinstance(view.state, SessionState)
        number = len(view.state.chats) + 1
        state = new_chat(
            session,
            chat,
            title or f"Chat {number}",
            iso_time(self.core.now_ms()),
            working_directories,
            creator,
        )
        added = SessionChatAdded(summary=chat_summary(state))
        if (refused := refusal(view, added)) is not None:
            raise ActionRejected.of(refused)
        if not await self.core.create(chat, state):
            # Chat URIs are one namespace for every session: whoever holds
            # it, the answer is the same and says nothing about its chat.
            raise CommandError(
                ErrorCode.ALREADY_EXISTS,
                f"the chat URI {chat} is taken: choose another (ahp-chat:/<uuid>)",
            )
        try:
            await self.core.write(session, added, validate=refusal)
        except ActionRejected:
            await self._drop(chat, "the session holds as many chats as it may")
            raise

    async def dispose_session(self, session: str) -> None:
        """Remove the session and its chats; subscribers hear no more."""
        view = await self.core.view(session)
        assert isinstance(view.state, SessionState)
        await self.aggregate.remove(session)
        for summary in view.state.chats:
            await self._drop(summary.resource, "the session was disposed")
            with contextlib.suppress(ChannelGone):
                await self.dispatch(session, SessionChatRemoved(chat=summary.resource))
        await self._drop(session, "the session was disposed")
        await self._count_sessions()
        params = SessionRemovedParams(channel=ROOT_URI, session=session)
        await self.core.publish_notice("root/sessionRemoved", params)

    async def dispose_chat(self, session: str, chat: str) -> None:
        """Remove ``chat`` from ``session``: its subscribers hear no more, the
        session's catalog loses it (``session/chatRemoved``). Raises
        CommandError (-32011) for the session's default chat: dispose the
        session instead."""
        view = await self.core.view(session)
        assert isinstance(view.state, SessionState)
        if view.state.default_chat == chat:
            raise CommandError(
                ErrorCode.CONFLICT,
                f"{chat} is the default chat of {session}: dispose the session instead",
            )
        await self._drop(chat, "the chat was disposed")
        with contextlib.suppress(ChannelGone):
            await self.dispatch(session, SessionChatRemoved(chat=chat))

    async def _drop(self, uri: str, why: str) -> None:
        self.waiters.abandon(uri, why)
        self.aggregate.forget(uri)
        await self.core.drop(uri)

    async def _count_sessions(self) -> None:
        count = await self.aggregate.count()
        root = (await self.core.view(ROOT_URI)).state
        if isinstance(root, RootState) and root.active_sessions == count:
            return  # nothing changed: nothing to store
        await self.dispatch(ROOT_URI, RootActiveSessionsChanged(active_sessions=count))

    # ─── Turn history ────────────────────────────────────────────────────

    async def older_turns(
        self, chat: str, cursor: str | None, limit: int
    ) -> tuple[list[Turn], str | None]:
        """A page of completed turns older than ``cursor`` (None: the
        newest), oldest first, and the cursor for the page before it.
        Raises CommandError (InvalidParams) for a cursor that names no turn."""
        view = await self.core.view(chat)
        assert isinstance(view.state, ChatState)
        turns = view.state.turns
        end = len(turns)
        if cursor is not None:
            end = _decode_cursor(cursor, [t.id for t in turns])
        start = max(0, end - limit)
        next_cursor = _encode_cursor(turns[start].id) if start > 0 else None
        return turns[start:end], next_cursor


def new_session(
    provider: str, title: str | None, working_directories: list[str] | None = None
) -> SessionState:
    """The state a session starts with (before its default chat);
    ``working_directories`` once each, in their order (None or empty: absent)."""
    return SessionState(
        provider=provider,
        title=title or "New session",
        status=SessionStatus.IDLE,
        lifecycle="creating",
        working_directories=(
            list(dict.fromkeys(working_directories)) if working_directories else None
        ),
        active_clients=[],
        chats=[],
    )


def new_chat(
    session: str,
    chat: str,
    title: str,
    modified_at: str,
    working_directories: list[str] | None = None,
    creator: str | None = None,
) -> ChatState:
    """The state a chat of ``session`` starts with; ``working_directories``
    once each, in their order (None: absent, the session's whole set);
    ``_meta.huddle.creator`` the token id of the person who created it
    (server.core.policy.chat_disposal_refusal), None for the agent's."""
    huddle: dict[str, Any] = {"session": session}
    if creator is not None:
        huddle["creator"] = creator
    return ChatState(
        resource=chat,
        title=title,
        status=SessionStatus.IDLE,
        modified_at=modified_at,
        origin=UserOrigin(),
        working_directories=(
            None if working_directories is None else list(dict.fromkeys(working_directories))
        ),
        turns=[],
        meta={HUDDLE_META: huddle},
    )


def windowed(state: ChatState, turns: int | None, max_bytes: int) -> ChatState:
    """The chat as a snapshot shows it: the newest ``turns`` completed turns
    (all when None), and of those only as many of the newest as fit in
    ``max_bytes`` of JSON with the rest of the state, so that a frame the
    server sends is never larger than its client can receive. A window
    carries ``turnsNextCursor`` naming the turn before it."""
    count = len(state.turns)
    keep = count if turns is None else max(0, min(turns, count))
    # Only the newest turns are ever encoded, as many as could fit: a chat
    # may hold far more than any client receives, and encoding all of it
    # would hold the event loop for as long.
    sizes: list[int] = []  # the newest turns' JSON sizes, newest first

    def size_of(back: int) -> int:
        while len(sizes) <= back:
            sizes.append(len(encode(state.turns[count - 1 - len(sizes)])))
        return sizes[back]

    if keep == count:
        # The whole state's JSON: the state without turns, and each turn
        # with a comma between.
        whole = len(encode(replace(state, turns=[])))
        for back in range(count):
            whole += size_of(back) + (1 if back else 0)
            if whole > max_bytes:
                break
        if whole <= max_bytes:
            return state
    room = max_bytes - len(encode(replace(state, turns=[], turns_next_cursor="x" * 64)))
    start = count
    while start > count - keep:
        size = size_of(count - start) + 1
        if size > room:
            break
        room -= size
        start -= 1
    if start == 0:
        return replace(state, turns_next_cursor=None)
    kept = state.turns[start:]
    cursor = _encode_cursor(kept[0].id) if kept else _encode_cursor(END_OF_TURNS)
    return replace(state, turns=kept, turns_next_cursor=cursor)


END_OF_TURNS = ""
"""The cursor of a window that holds no completed turn: every turn is older."""


def _encode_cursor(turn_id: str) -> str:
    return base64.urlsafe_b64encode(f"before:{turn_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, turn_ids: list[str]) -> int:
    """The index of the turn a cursor names; CommandError if it names none."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        text = ""
    prefix, _, turn_id = text.partition(":")
    if prefix == "before" and turn_id == END_OF_TURNS:
        return len(turn_ids)
    if prefix == "before" and turn_id in turn_ids:
        return turn_ids.index(turn_id)
    raise CommandError(ErrorCode.INVALID_PARAMS, "unknown turns cursor")
