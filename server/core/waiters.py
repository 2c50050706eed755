"""Callers waiting for people: an input request's outcome, a tool call's
confirmation.

A waiter is registered on a chat and resolved by the channel core's hook
when the envelope it waits for is applied, whichever process accepted it.
It is abandoned (:class:`InputAbandoned`) when the turn it belongs to ends,
is cancelled or the chat is truncated first, and when the chat is disposed
or the server stops. While anyone waits on a chat, the core keeps the chat
current here (it is pinned), so an answer given through another process is
heard.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from protocol.actions import (
    ChatError,
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    StateAction,
    action_type,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequestPart,
    InputResponseKind,
    ToolCallPendingConfirmation,
)
from protocol.messages import ActionOrigin
from reducers.chat import select_input_settlement, select_tool_call
from server.auth import Identity
from server.core.channels import Applied, ChannelCore
from server.core.frozen_forms import FormRegistry
from server.errors import InputAbandoned


@dataclass(frozen=True)
class InputOutcome:
    """How an input request was resolved.

    ``answers`` are the final answers (synced drafts overlaid by the
    completion's); ``data`` is the form data with the schema's types when the
    request was made from a JSON Schema form and accepted (else None);
    ``origin`` and ``by`` say who completed it (None when it was already
    resolved before the wait began).
    """

    response: InputResponseKind
    answers: dict[str, InputAnswer]
    data: dict[str, Any] | None
    origin: ActionOrigin | None
    by: Identity | None


@dataclass(frozen=True)
class ToolDecision:
    """How a person answered a tool call's confirmation."""

    approved: bool
    action: ChatToolCallConfirmed
    origin: ActionOrigin | None
    by: Identity | None

    @property
    def edited_input(self) -> str | None:
        return self.action.edited_tool_input

    @property
    def reason(self) -> str | None:
        return self.action.reason


Match = Callable[[StateAction, ChatState], Any]
"""Returns the result a waiter waits for, raises InputAbandoned, or returns
None to keep waiting."""


@dataclass
class Waiter:
    chat: str
    match: Match
    future: asyncio.Future[tuple[Any, Applied]]


class Waiters:
    """The callers waiting on chats of this process; :meth:`hook` is the
    channel core's hook that resolves them."""

    def __init__(self, core: ChannelCore, forms: FormRegistry) -> None:
        self.core = core
        self.forms = forms
        self._waiting: dict[str, list[Waiter]] = {}

    # ─── Input requests ──────────────────────────────────────────────────

    async def expect_input(self, chat: str, request_id: str, turn_id: str) -> Waiter:
        """Start waiting for request ``request_id`` of turn ``turn_id`` (it
        may be opened after this): then :meth:`input_outcome`."""

        def match(action: StateAction, state: ChatState) -> Any:
            if isinstance(action, ChatInputCompleted) and action.request_id == request_id:
                settled = select_input_settlement(state, request_id)
                assert settled.part is not None
                return settled.part
            _check_turn_alive(action, turn_id, f"request {request_id}")
            return None

        return await self._add(chat, match)

    async def input_outcome(self, waiter: Waiter) -> InputOutcome:
        """The outcome an :meth:`expect_input` waiter waits for."""
        part, event = await self._result(waiter)
        assert isinstance(part, InputRequestPart)
        return await self._outcome(waiter.chat, part, event.envelope.origin, event.sender)

    async def wait_input(self, chat: str, request_id: str) -> InputOutcome:
        """Wait for the open request ``request_id`` of ``chat`` to be
        completed. Returns at once if it already was (the latest part with
        that id). Raises InputAbandoned; bound it with ``asyncio.timeout``."""
        view = await self.core.view(chat)
        state = view.state
        assert isinstance(state, ChatState)
        settled = select_input_settlement(state, request_id)
        if settled.status != "gone":  # a request never asked costs no cache entry
            await self.forms.load(chat, request_id)
        if settled.status == "open":
            assert state.active_turn is not None
            waiter = await self.expect_input(chat, request_id, state.active_turn.id)
            return await self.input_outcome(waiter)
        if settled.status == "gone" or settled.part is None:
            raise InputAbandoned(f"request {request_id} is not open in {chat}")
        return await self._outcome(chat, settled.part, None, None)

    async def _outcome(
        self,
        chat: str,
        part: InputRequestPart,
        origin: ActionOrigin | None,
        by: Identity | None,
    ) -> InputOutcome:
        assert part.response is not None
        answers = dict(part.request.answers or {})
        data = None
        if part.response == "accept":
            data = await self.forms.data(chat, part.request.id, answers)
        return InputOutcome(part.response, answers, data, origin, by)

    # ─── Tool confirmations ──────────────────────────────────────────────

    async def wait_tool_confirmation(
        self, chat: str, turn_id: str, tool_call_id: str
    ) -> ToolDecision:
        """Wait for a person to approve or deny the tool call, which must be
        pending confirmation now. Raises InputAbandoned when the turn ends."""
        view = await self.core.view(chat)
        assert isinstance(view.state, ChatState)
        call = select_tool_call(view.state, tool_call_id)
        if not isinstance(call, ToolCallPendingConfirmation):
            raise InputAbandoned(f"tool call {tool_call_id} is not waiting for confirmation")
        waiter = await self.expect_tool_decision(chat, tool_call_id, turn_id)
        return await self.tool_decision(waiter)

    async def expect_tool_decision(self, chat: str, tool_call_id: str, turn_id: str) -> Waiter:
        """Start waiting for the confirmation of tool call ``tool_call_id``
        of turn ``turn_id`` (it may be shown after this): then
        :meth:`tool_decision`."""

        def match(action: StateAction, state: ChatState) -> Any:
            if isinstance(action, ChatToolCallConfirmed) and action.tool_call_id == tool_call_id:
                return action
            _check_turn_alive(action, turn_id, f"tool call {tool_call_id}")
            return None

        return await self._add(chat, match)

    async def tool_decision(self, waiter: Waiter) -> ToolDecision:
        """The decision an :meth:`expect_tool_decision` waiter waits for."""
        action, event = await self._result(waiter)
        assert isinstance(action, ChatToolCallConfirmed)
        return ToolDecision(action.approved, action, event.envelope.origin, event.sender)

    # ─── Bookkeeping ─────────────────────────────────────────────────────

    async def _add(self, chat: str, match: Match) -> Waiter:
        await self.core.pin(chat)
        future: asyncio.Future[tuple[Any, Applied]] = asyncio.get_running_loop().create_future()
        waiter = Waiter(chat, match, future)
        self._waiting.setdefault(chat, []).append(waiter)
        return waiter

    async def _result(self, waiter: Waiter) -> tuple[Any, Applied]:
        try:
            return await asyncio.shield(waiter.future)
        finally:
            self.discard(waiter)

    def discard(self, waiter: Waiter) -> None:
        """Stop waiting (the result, if any, is dropped)."""
        waiting = self._waiting.get(waiter.chat, [])
        with contextlib.suppress(ValueError):
            waiting.remove(waiter)
            self.core.unpin(waiter.chat)
        if not waiting:
            self._waiting.pop(waiter.chat, None)

    def waiting_on(self, chat: str) -> int:
        """How many callers wait on ``chat`` here now."""
        return len(self._waiting.get(chat, []))

    def abandon(self, chat: str, why: str) -> None:
        """Every waiter on ``chat`` gets InputAbandoned(``why``)."""
        for waiter in list(self._waiting.get(chat, [])):
            if not waiter.future.done():
                waiter.future.set_exception(InputAbandoned(why))

    def abandon_all(self, why: str) -> None:
        for chat in list(self._waiting):
            self.abandon(chat, why)

    def hook(self, event: Applied) -> Awaitable[None] | None:
        """Resolve the waiters of the event's chat that it answers."""
        waiting = self._waiting.get(event.uri)
        if not waiting or not isinstance(event.view.state, ChatState):
            return None
        for waiter in list(waiting):
            if waiter.future.done():
                continue
            try:
                result = waiter.match(event.action, event.view.state)
            except InputAbandoned as error:
                waiter.future.set_exception(error)
                continue
            if result is not None:
                waiter.future.set_result((result, event))
        return None


def _check_turn_alive(action: StateAction, turn_id: str, what: str) -> None:
    """Raise InputAbandoned when ``action`` ends or truncates ``turn_id``."""
    if isinstance(action, ChatTurnComplete | ChatTurnCancelled | ChatError):
        if action.turn_id != turn_id:
            return
        if isinstance(action, ChatError) and action.error.error_type == "expired":
            raise InputAbandoned(f"{what}: the turn failed: {action.error.message}")
        raise InputAbandoned(f"{what}: the turn ended ({action_type(action)})")
    if isinstance(action, ChatTruncated):
        raise InputAbandoned(f"{what}: the chat was truncated")
