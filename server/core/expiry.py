"""Waits that expire: a question or a tool approval nobody answers in time
does not hold its turn for ever.

Whoever opens a wait may give it an :class:`Expiry`: seconds, and the
policy that applies when they pass (``cancel``: the request is withdrawn,
as if dismissed, a tool call skipped; ``decline``: declined, a tool call
denied; ``fail``: the turn ends with an error saying what nobody answered).
The in-process APIs take one (``Host.request_input``, ``Host.ask``,
``Host.expire``), and so does the wire: a ``chat/toolCallReady`` whose
``_meta.huddle.expiry`` is ``{"seconds": N, "onExpiry": P}``, and for an
input request the ``huddle/expire`` command (``huddle.expiry`` extension)
or ``POST /api/expiry``.

An expiry is kept in the store (a record per wait, and the session's notes,
``expiresAt``/``onExpiry``, which clients show as time left), not in a
timer: every process sweeps the records every ``check_interval`` seconds
and fires those due, each once across processes (a claim in the store), so
a restart or a crash loses none. Firing is a server action on the chat
built from its current state: nothing happens to a wait settled meanwhile.
Then the note says ``expired``, and the validation rules refuse an answer
to it with ``expired`` (from its ``expiresAt`` on, before the sweep too).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from protocol.actions import (
    ChatError,
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatTruncated,
    StateAction,
)
from protocol.chat import ChatState, ToolCallPendingConfirmation
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.wire import ErrorInfo, quoted
from reducers import notes
from reducers.chat import select_open_input_part, select_tool_call, select_truncated, select_waits
from reducers.clock import iso_ms
from server.core.channels import Applied, ChannelCore
from server.core.frozen_forms import chat_session
from server.core.policy import active_turn_stamp, turn_stamp
from server.core.session_notes import SessionNotes
from server.errors import ActionRejected, ChannelGone, StoreError
from server.periodic import Periodic
from server.store.base import ChannelStore

log = logging.getLogger("huddle.expiry")

EXPIRY_RECORDS: Final = "expiry"
MAX_SECONDS: Final = 30 * 24 * 3600.0
"""The longest a wait may be given."""
CLAIM_SECONDS: Final = 60.0
"""How long a process that fires an expiry holds it: another fires it
after that only if the first did not get to the end (a crash)."""

Family = Literal["requests", "toolCalls"]
Policy = Literal["cancel", "decline", "fail"]


@dataclass(frozen=True)
class Expiry:
    """A wait's time limit and what then applies."""

    seconds: float
    on_expiry: Policy = "cancel"

    def __post_init__(self) -> None:
        if not 0 < self.seconds <= MAX_SECONDS:
            raise ValueError(f"an expiry is above 0 and at most {MAX_SECONDS:.0f} seconds")
        if self.on_expiry not in notes.EXPIRY_POLICIES:
            raise ValueError(f"onExpiry is one of {', '.join(notes.EXPIRY_POLICIES)}")

    def left_after(self, waited: float) -> Expiry:
        """This expiry for a wait asked again ``waited`` seconds after it
        opened (its first asking lost in a crash): only the time left, so
        that asking again never extends a deadline; a wait past it gets a
        millisecond (it expires at the next sweep, its policy applied)."""
        return Expiry(max(0.001, min(self.seconds, self.seconds - waited)), self.on_expiry)

    @classmethod
    def of(cls, raw: object) -> Expiry:
        """From its JSON form ``{"seconds": N, "onExpiry": P}``; ValueError."""
        if not isinstance(raw, dict):
            raise ValueError('an expiry is {"seconds": N, "onExpiry": "cancel|decline|fail"}')
        seconds, policy = raw.get("seconds"), raw.get("onExpiry", "cancel")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError("an expiry's seconds is a number")
        if policy not in notes.EXPIRY_POLICIES:
            raise ValueError(f"onExpiry is one of {', '.join(notes.EXPIRY_POLICIES)}")
        return cls(float(seconds), policy)


def _asked_expiry(action: StateAction) -> object:
    """The ``_meta.huddle.expiry`` a tool call asks for, if any."""
    if not isinstance(action, ChatToolCallReady):
        return None
    return notes.huddle_meta(action.meta, "expiry")


def expiry_problem(action: StateAction) -> Rejection | None:
    """The rejection of a ``chat/toolCallReady`` whose ``_meta.huddle.expiry``
    is not an expiry: its sender must not believe a deadline was set."""
    raw = _asked_expiry(action)
    if raw is None:
        return None
    try:
        Expiry.of(raw)
    except ValueError as error:
        return Rejection(RejectionCode.INVALID_ACTION, f"_meta.huddle.expiry: {error}")
    return None


class Due(msgspec.Struct, frozen=True):
    """A stored expiry: the wait and when its policy applies (ms)."""

    session: str
    chat: str
    family: Family
    key: str
    at: int
    policy: Policy
    turn: str | None = None
    """The stamp of the wait's turn (server.core.policy.turn_stamp): a turn that
    uses the wait's id again after a truncation is not the wait's."""


_decode_due = msgspec.json.Decoder(Due)


class Expiries:
    """See the module docstring."""

    def __init__(
        self,
        core: ChannelCore,
        store: ChannelStore,
        session_notes: SessionNotes,
        *,
        check_interval: float = 1.0,
    ) -> None:
        self.core = core
        self.store = store
        self.notes = session_notes
        self._owner = secrets.token_hex(8)
        self._periodic = Periodic(
            self.sweep, check_interval, log=log, what="sweeping expiries", expected=(StoreError,)
        )

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def expire(self, chat: str, family: Family, key: str, expiry: Expiry) -> int:
        """Give the open wait ``key`` of ``chat`` (an input request, or a
        tool call waiting for approval) ``expiry``; returns when it expires
        (ms). Raises ActionRejected when there is no such open wait,
        ChannelGone when there is no such chat."""
        state = (await self.core.view(chat)).state
        assert isinstance(state, ChatState)
        session = chat_session(state)
        if session is None or _open(state, family, key) is None:
            code = (
                RejectionCode.NO_OPEN_INPUT_REQUEST
                if family == "requests"
                else RejectionCode.TOOL_CALL_NOT_PENDING
            )
            raise ActionRejected(code, f"{chat} has no open wait {quoted(key)} to give an expiry")
        now = self.core.now_ms()
        turn = active_turn_stamp(state)
        session_state = (await self.core.view(session)).state
        earlier = notes.expiry_of(getattr(session_state, "meta", None), family, chat, key, turn)
        if earlier is not None and earlier[0] <= now:
            # Its time is up (the sweep is on its way): too late to extend.
            raise ActionRejected(RejectionCode.EXPIRED, f"the wait {quoted(key)} in {chat} expired")
        at = now + int(expiry.seconds * 1000)
        due = Due(session, chat, family, key, at, expiry.on_expiry, turn)
        await self.store.put_record(EXPIRY_RECORDS, _name(due), msgspec.json.encode(due))
        policy = expiry.on_expiry
        expiring = lambda m: notes.expiring(m, family, chat, key, at, policy, turn=turn)  # noqa: E731
        await self.notes.note(session, chat, self.notes.of_turn(chat, turn, expiring))
        return at

    def hook(self, event: Applied) -> Awaitable[None] | None:
        """A tool call made ready with ``_meta.huddle.expiry`` gets it (one
        that is not an expiry was refused: expiry_problem); the waits of
        turns truncated away expire no more (a later turn may use their
        ids again)."""
        action = event.action
        if not event.local:
            return None
        if isinstance(action, ChatTruncated) and isinstance(event.before, ChatState):
            names: list[str] = []
            for away in select_truncated(event.before, action):
                requests, calls = select_waits([away])
                stamp = turn_stamp(away.message)
                for one in {stamp, None}:  # and as records were named before stamps
                    names += [_record(event.uri, "requests", key, one) for key in requests]
                    names += [_record(event.uri, "toolCalls", key, one) for key in calls]
            return self._forget(names) if names else None
        if not isinstance(action, ChatToolCallReady):
            return None
        raw = _asked_expiry(action)
        if raw is None or action.confirmed is not None:
            return None
        try:
            expiry = Expiry.of(raw)
        except ValueError as error:  # dispatched without validation (else refused)
            log.warning("%s: tool call %s: %s", event.uri, action.tool_call_id, error)
            return None
        return self._expire_quietly(event.uri, action.tool_call_id, expiry)

    async def _forget(self, names: list[str]) -> None:
        for name in names:
            await self.store.delete_record(EXPIRY_RECORDS, name)

    async def _expire_quietly(self, chat: str, key: str, expiry: Expiry) -> None:
        with contextlib.suppress(ActionRejected, ChannelGone):
            await self.expire(chat, "toolCalls", key, expiry)

    # ─── Firing ──────────────────────────────────────────────────────────

    async def sweep(self) -> int:
        """Fire every expiry that is due; returns how many this process fired."""
        now = self.core.now_ms()
        fired = 0
        for name, raw in (await self.store.records(EXPIRY_RECORDS)).items():
            try:
                due = _decode_due.decode(raw)
            except msgspec.DecodeError:
                await self.store.delete_record(EXPIRY_RECORDS, name)
                continue
            if due.at <= now and await self._fire(name, due):
                fired += 1
        return fired

    async def _fire(self, name: str, due: Due) -> bool:
        """Apply ``due``'s policy, unless another process does (or did)."""
        if await self.store.claim("expiring:" + name, self._owner, CLAIM_SECONDS) is not None:
            return False
        applied = None
        with contextlib.suppress(ChannelGone):
            applied = await self.core.update(due.chat, _policy(due, self.core.now_ms))
        if applied is not None:
            family, chat, key, turn = due.family, due.chat, due.key, due.turn
            expired = lambda m: notes.expired(m, family, chat, key, turn=turn)  # noqa: E731
            await self.notes.note(due.session, chat, self.notes.of_turn(chat, turn, expired))
        await self.store.delete_record(EXPIRY_RECORDS, name)
        return applied is not None


def _name(due: Due) -> str:
    return _record(due.chat, due.family, due.key, due.turn)


def _record(chat: str, family: Family, key: str, turn: str | None) -> str:
    """The name of the expiry record of wait ``key`` of ``chat`` in the turn
    stamped ``turn``: a late record of a turn truncated away must not take
    the place of the next turn's wait of the same id."""
    name = f"{chat} {family} {key}"
    return name if turn is None else f"{name} {turn}"


def _open(state: ChatState, family: Family, key: str) -> Any:
    """The open wait ``key`` of the active turn, if it is open."""
    turn = state.active_turn
    if turn is None:
        return None
    if family == "requests":
        return select_open_input_part(turn.response_parts, key)
    call = select_tool_call(state, key)
    return call if isinstance(call, ToolCallPendingConfirmation) else None


def _policy(due: Due, now_ms: Callable[[], int]) -> Callable[[ChannelState], StateAction | None]:
    """The action that applies ``due``'s policy to the chat as it is now
    (None: the wait is settled already)."""

    def change(state: ChannelState) -> StateAction | None:
        if not isinstance(state, ChatState) or _open(state, due.family, due.key) is None:
            return None
        if due.turn is not None and active_turn_stamp(state) != due.turn:
            return None  # another turn's wait of the same id
        turn = state.active_turn
        assert turn is not None
        what = "input request" if due.family == "requests" else "tool call"
        # Whoever owns the wait (the runner's chat bridge) tells these from
        # people's answers by this note.
        expired = {notes.HUDDLE: {"expired": {"family": due.family, "id": due.key}}}
        if due.policy == "fail":
            now = now_ms()
            return ChatError(
                turn_id=turn.id,
                duration=max(0, now - iso_ms(turn.started_at, now)),
                error=ErrorInfo(
                    error_type="expired",
                    message=f"Nobody answered the {what} {due.key!r} in time.",
                ),
                meta=expired,
            )
        if due.family == "requests":
            response: Literal["cancel", "decline"] = (
                "cancel" if due.policy == "cancel" else "decline"
            )
            return ChatInputCompleted(request_id=due.key, response=response)
        return ChatToolCallConfirmed(
            turn_id=turn.id,
            tool_call_id=due.key,
            approved=False,
            reason="skipped" if due.policy == "cancel" else "denied",
            reason_message="Nobody approved it in time.",
            meta=expired,
        )

    return change
