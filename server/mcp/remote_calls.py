"""What :class:`~server.mcp.people.RemoteChat` needs to put requests to a
chat through a :class:`~server.client.HuddleClient` (an agent token): a turn
to ask in, a tool call shown for approval, and who settled either.

- **A turn to ask in.** AHP shows requests only in the active turn. When the
  chat has none, :class:`AskingTurn` opens one as the agent (its message's
  origin ``agent``, its id ``asks-<hex>``: the server's runner does not take
  such a turn for the session's agent) and ends it once nobody asks in it and
  nothing in it still waits (an open request, a call pending confirmation),
  also one a process that died before left open. A turn people or the
  runner opened is only asked in, never ended.
- **A call for approval** shows as the runner shows one
  (``chat/toolCallStart``, then ``chat/toolCallReady`` with approve and deny
  options, editable, the expiry in ``_meta.huddle.expiry``); it is settled
  when it left ``streaming`` and ``pending-confirmation`` (the same rule as
  server.runner.resume). An approved call is then completed in the chat
  (the agent's framework runs it), so that ending the turn does not mark it
  skipped: a settled call reads the same after a restart.
- **Who settled it** is the server's word: the session's notes
  (reducers.notes, written by the server alone) name who completed a
  request or decided a call; a settlement the server made (an expiry) names
  nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

from protocol.actions import (
    ChatToolCallComplete,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTurnComplete,
    ChatTurnStarted,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    ConfirmationOption,
    InputRequestPart,
    Message,
    MessageOrigin,
    ToolCallCancelled,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallResult,
    ToolCallState,
    ToolCallStreaming,
    Turn,
)
from protocol.messages import ChannelState
from protocol.status import SessionStatus
from protocol.wire import Markdown
from reducers import notes
from reducers.chat import select_activity
from reducers.clock import iso_ms, iso_time
from server.auth import ROLES, Identity
from server.client import HuddleClient, Mirror
from server.core.expiry import Expiry
from server.core.policy import turn_stamp
from server.errors import HuddleError

ASKING_TURN_PREFIX: Final = "asks-"
"""The id prefix of the turns a RemoteChat opens to ask in."""
NOTE_WAIT: Final = 5.0
"""Seconds to wait for the session's note on who settled a request (the
server batches notes a quarter second); past it, nobody is named."""
APPROVE: Final = ConfirmationOption(id="approve", label="Approve", kind="approve")
DENY: Final = ConfirmationOption(id="deny", label="Deny", kind="deny")
CONFIRMED_BY_SOMEONE: Final = frozenset({"user-action", "setting"})


def _now_ms() -> int:
    return int(time.time() * 1000)


class AskingTurn:
    """The active turn of ``chat`` to ask in, opened when there is none
    (see the module docstring). One per RemoteChat: its users are counted,
    so that concurrent requests share the turn it opened."""

    def __init__(self, client: HuddleClient, chat: str, opening: str) -> None:
        self.client = client
        self.chat = chat
        self.opening = opening
        self._lock = asyncio.Lock()
        self._subscribing = asyncio.Lock()
        self._users = 0

    async def mirror(self) -> Mirror:
        """The chat's live mirror (subscribed once, under the lock: two
        subscribes at once would leave one caller a mirror nobody updates)."""
        async with self._subscribing:
            return self.client.mirrors.get(self.chat) or await self.client.subscribe(self.chat)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Mirror]:
        """The chat's mirror, with an active turn to ask in for as long as
        this is held (unless people end it). Raises ActionRejected when
        the chat refuses the turn."""
        mirror = await self.mirror()
        async with self._lock:
            self._users += 1
            try:
                if mirror.chat.active_turn is None:
                    await self._open()
            except BaseException:
                self._users -= 1
                raise
        try:
            yield mirror
        finally:
            async with self._lock:
                self._users -= 1
                if self._users == 0:
                    await self._end_if_done(mirror)

    async def _open(self) -> None:
        started = ChatTurnStarted(
            turn_id=f"{ASKING_TURN_PREFIX}{secrets.token_hex(8)}",
            started_at=iso_time(_now_ms()),
            message=Message(text=self.opening, origin=MessageOrigin(kind="agent")),
        )
        await self.client.dispatch_and_wait(self.chat, started)

    async def _end_if_done(self, mirror: Mirror) -> None:
        state = mirror.chat
        active = state.active_turn
        if active is None or not active.id.startswith(ASKING_TURN_PREFIX):
            return
        if select_activity(state) == SessionStatus.INPUT_NEEDED:
            return  # another process's request still waits in it
        now = _now_ms()
        started = iso_ms(active.started_at, now)
        done = ChatTurnComplete(turn_id=active.id, duration=max(0, now - started))
        # Ended by people meanwhile, or the connection lost: nothing to end.
        with contextlib.suppress(HuddleError):
            await self.client.dispatch_and_wait(self.chat, done)


# ─── Tool calls for approval ─────────────────────────────────────────────────


def latest_call(state: ChatState, call_id: str) -> tuple[ActiveTurn | Turn, ToolCallState] | None:
    """The newest tool call ``call_id`` of the chat, with its turn: in the
    active turn, else in the newest ended turn that has one."""
    turns: list[ActiveTurn | Turn] = [state.active_turn] if state.active_turn else []
    turns.extend(reversed(state.turns))
    for turn in turns:
        for part in reversed(turn.response_parts):
            if type(part) is ToolCallPart and part.tool_call.tool_call_id == call_id:
                return turn, part.tool_call
    return None


def is_waiting(call: ToolCallState) -> bool:
    """Whether nobody has decided ``call`` yet."""
    return isinstance(call, ToolCallStreaming | ToolCallPendingConfirmation)


Send = Callable[[str, StateAction], Awaitable[object]]
"""How a door puts an action to a chat: a HuddleClient's ``dispatch_and_wait``
(RemoteChat), the host's ``dispatch`` (HostChat)."""


async def show_call(
    send: Send,
    chat: str,
    turn_id: str,
    call_id: str,
    tool: str,
    arguments: dict[str, Any],
    reason: str | None,
    expiry: Expiry | None,
) -> None:
    """Show a call of ``tool`` waiting for people's approval in the turn."""
    await send(
        chat,
        ChatToolCallStart(turn_id=turn_id, tool_call_id=call_id, tool_name=tool, display_name=tool),
    )
    meta = None
    if expiry is not None:
        meta = {notes.HUDDLE: {"expiry": {"seconds": expiry.seconds, "onExpiry": expiry.on_expiry}}}
    shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    await send(
        chat,
        ChatToolCallReady(
            turn_id=turn_id,
            tool_call_id=call_id,
            invocation_message=f"{tool} ({shown})",
            tool_input=json.dumps(arguments),
            confirmation_title=reason or f"Allow {tool}?",
            editable=True,
            options=[APPROVE, DENY],
            meta=meta,
        ),
    )


def approved(call: ToolCallState) -> bool:
    """Whether a settled ``call`` was approved by a person (or a setting)."""
    confirmed = getattr(call, "confirmed", None)
    return not isinstance(call, ToolCallCancelled) and confirmed in CONFIRMED_BY_SOMEONE


def call_arguments(call: ToolCallState, asked: dict[str, Any]) -> dict[str, Any]:
    """The arguments a settled call runs with: its input as people left it
    (edited or not), else the asked ones."""
    text = getattr(call, "tool_input", None)
    if isinstance(text, str):
        with contextlib.suppress(ValueError):
            value = json.loads(text)
            if isinstance(value, dict):
                return value
    return asked


def denial_reason(call: ToolCallCancelled) -> str | None:
    """A denied call's reason, as the person (or the expiry) wrote it."""
    reason = call.reason_message
    if isinstance(reason, Markdown):
        return reason.markdown
    return reason


async def complete_approved(send: Send, chat: str, turn_id: str, call_id: str, tool: str) -> None:
    """Complete an approved call in the chat: the agent runs it."""
    result = ToolCallResult(success=True, past_tense_message=f"Approved {tool}; the agent runs it")
    action = ChatToolCallComplete(turn_id=turn_id, tool_call_id=call_id, result=result)
    # The turn ended meanwhile, or the connection dropped: the decision stands.
    with contextlib.suppress(HuddleError):
        await send(chat, action)


# ─── Who settled it ──────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Settler:
    """Who settled a request, as the session's notes say."""

    by: Identity | None
    expired: bool


def turn_holding_request(state: ChatState, request_id: str) -> ActiveTurn | Turn | None:
    turns: list[ActiveTurn | Turn] = [state.active_turn] if state.active_turn else []
    turns.extend(reversed(state.turns))
    for turn in turns:
        for part in turn.response_parts:
            if type(part) is InputRequestPart and part.request.id == request_id:
                return turn
    return None


async def settler(
    turns: AskingTurn,
    chat: ChatState,
    chat_uri: str,
    family: Literal["requests", "toolCalls"],
    key: str,
    turn: ActiveTurn | Turn | None,
) -> Settler:
    """Who settled ``key`` (a request or a tool call id) of ``turn``, from
    the notes of the chat's session: waits up to NOTE_WAIT for the note."""
    session = notes.huddle_meta(chat.meta, "session")
    if not isinstance(session, str) or turn is None:
        return Settler(None, expired=False)
    stamp = turn_stamp(turn.message)
    field = "completed" if family == "requests" else "decided"
    client = turns.client
    try:
        async with turns._subscribing:
            mirror = client.mirrors.get(session) or await client.subscribe(session)
    except HuddleError:
        return Settler(None, expired=False)

    def noted(state: ChannelState) -> bool:
        note = notes.note_for(getattr(state, "meta", None), family, chat_uri, key, stamp)
        return note is not None and (field in note or note.get("expired") is True)

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(NOTE_WAIT):
            await mirror.wait_for(noted)
    note = notes.note_for(getattr(mirror.state, "meta", None), family, chat_uri, key, stamp)
    if note is None:
        return Settler(None, expired=False)
    if note.get("expired") is True:
        return Settler(None, expired=True)
    entry = note.get(field)
    who = entry.get("by") if isinstance(entry, dict) else None
    return Settler(identity_of(who), expired=False)


def identity_of(who: Any) -> Identity | None:
    """A note's ``{"name", "role", "token", "declared"?, "email"?, "issuer"?}``
    as an Identity."""
    if not isinstance(who, dict):
        return None
    role, name, token = who.get("role"), who.get("name"), who.get("token")
    if role not in ROLES or not isinstance(name, str) or not isinstance(token, str):
        return None
    for known in ROLES:
        if known == role:
            declared = who.get("declared") is True
            email, issuer = who.get("email"), who.get("issuer")
            return Identity(
                role=known,
                name=name,
                token=token,
                declared=declared,
                email=email if isinstance(email, str) else None,
                issuer=issuer if isinstance(issuer, str) else None,
            )
    return None
