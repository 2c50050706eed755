"""Where an agent's questions and approvals go, whichever door it came by
(an MCP server behind the bridge, Huddle's MCP server, a framework
adapter): the people of one chat.

:class:`HostChat` asks through the server's own :class:`~server.core.host.Host`
(in process, in a turn that is already active, a runner's tool's: the
schema is frozen with the request, so the host refuses an accept whose data
fails it; an approval is shown, decided and completed as the server's own
actions). :class:`RemoteChat` asks through a
:class:`~server.client.HuddleClient` with an agent token (a bridge living
outside the server). Both raise :class:`~server.errors.InputAbandoned` when
nobody will answer: the chat has no active turn, the turn ended, the chat
was truncated or is gone; :class:`~server.mcp.errors.Unaskable` when the chat
refuses the request itself (too large for it, the chat full: the MCP
server gets an error naming why, not a ``cancel`` it would take for a
person's); and :class:`~server.mcp.errors.ElicitationExpired`
when the turn ended because nobody answered in time (an expiry whose
policy is ``fail``). With an expiry whose policy is ``cancel`` or
``decline``, nobody answering in time is that reply.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from protocol.actions import ChatInputCompleted, ChatToolCallConfirmed, StateAction
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    InputResponseKind,
    ToolCallCancelled,
    ToolCallRunning,
    ToolCallState,
    Turn,
)
from protocol.messages import ChannelState
from protocol.rejections import RejectionCode
from reducers import notes
from reducers.chat import select_input_settlement
from server.auth import Identity
from server.client import Completion, HuddleClient, Mirror, ProtocolError
from server.core.expiry import Expiry
from server.core.host import Host
from server.errors import ActionRejected, ChannelGone, HuddleError, InputAbandoned
from server.mcp.errors import ElicitationExpired, Unaskable
from server.mcp.remote_calls import (
    AskingTurn,
    approved,
    call_arguments,
    complete_approved,
    denial_reason,
    is_waiting,
    latest_call,
    settler,
    show_call,
    turn_holding_request,
)
from server.runner.context import Lend

UNASKABLE = frozenset(
    {
        RejectionCode.TOO_LARGE,
        RejectionCode.TOO_MANY,
        RejectionCode.CHAT_FULL,
        RejectionCode.INVALID_OPTIONS,
        RejectionCode.INVALID_ACTION,
    }
)
"""What a chat refusing a request says about the request itself (it cannot
be asked there: Unaskable), not about people who will not answer."""

_RESPONSES: dict[str, InputResponseKind] = {
    "accept": "accept",
    "decline": "decline",
    "cancel": "cancel",
}


@dataclass(frozen=True)
class Reply:
    """How people resolved a request: the response and the final answers
    (synced drafts overlaid by the completion's)."""

    response: InputResponseKind
    answers: dict[str, InputAnswer]
    answered_by: Identity | None = None
    """Who resolved it, as the server knows them (None: nobody did, it
    expired or was withdrawn)."""


def person(who: Identity | None) -> dict[str, Any] | None:
    """Who answered or decided, as every door tells the agent (the MCP
    server's ``answered_by``, the adapters'): the server's word, never a
    name the agent chose; ``token`` is the id of the token they used (not
    the token), ``declared`` whether the name is one they typed in on a
    shared link, ``email`` and ``issuer`` those of a person who signed in
    (else None). None: nobody did."""
    if who is None:
        return None
    return {
        "name": who.name,
        "role": who.role,
        "token": who.token,
        "declared": who.declared,
        "email": who.email,
        "issuer": who.issuer,
    }


DecisionKind = Literal["approved", "denied", "expired", "cancelled"]


@dataclass(frozen=True)
class Decision:
    """How people settled a tool call put to them for approval: ``arguments``
    are the ones to run with (edited by a person, else the asked ones), and
    ``reason`` a denial's reason."""

    decision: DecisionKind
    arguments: dict[str, Any]
    reason: str | None = None
    decided_by: Identity | None = None


class People(Protocol):
    """The people an elicitation is put to."""

    @property
    def chat(self) -> str:
        """The chat they are in."""

    @property
    def schema_enforced(self) -> bool:
        """Whether an accept that fails the frozen schema is refused before
        it resolves the request (else the bridge checks after)."""

    async def ask(
        self, request: InputRequest, schema: dict[str, Any] | None, expiry: Expiry | None = None
    ) -> Reply:
        """Open ``request`` in the chat (with ``expiry``, if given) and wait
        until it is resolved. Raises InputAbandoned when nobody will answer
        it, ElicitationExpired when its time ran out with ``fail``, and
        Unaskable when the chat refuses the request itself (too large, too
        many questions, the chat full)."""

    async def withdraw(self, request_id: str) -> None:
        """Resolve the request as ``cancel`` if it is still open (the MCP
        side gave up on it); a no-op when it is resolved already."""

    async def approve(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        reason: str | None = None,
        expiry: Expiry | None = None,
        call_id: str | None = None,
    ) -> Decision:
        """Show a call of ``tool`` with ``arguments`` in the chat, waiting
        for people's approval (``reason``: why the agent wants it), and wait
        until a person approves (maybe editing the arguments, checked by the
        host against the tool's input schema), denies it, or it expires.
        ``call_id`` names the call (the same id asks the same call again)."""


class HostChat:
    """The people of ``chat``, asked through the in-process ``host``."""

    schema_enforced = True

    def __init__(
        self,
        host: Host,
        chat: str,
        in_turn: Callable[[ActiveTurn], bool] | None = None,
        answering: Lend = contextlib.nullcontext,
    ) -> None:
        self.host = host
        self.chat = chat
        self.in_turn = in_turn
        """The chat turns it may ask in (None: the active one, whichever)."""
        self.answering = answering
        """Held while people answer (the asking tool's
        ``ToolContext.people_answering``: its worker lends its place)."""

    async def ask(
        self, request: InputRequest, schema: dict[str, Any] | None, expiry: Expiry | None = None
    ) -> Reply:
        try:
            with self.answering():
                outcome = await self.host.request_input(
                    self.chat, request, schema=schema, expiry=expiry, in_turn=self.in_turn
                )
        except ActionRejected as error:
            raise _not_asked(error) from None
        except ChannelGone as error:
            raise InputAbandoned(str(error)) from None
        except InputAbandoned:
            if expiry is not None and expiry.on_expiry == "fail":
                with contextlib.suppress(ChannelGone):
                    state = (await self.host.view(self.chat)).state
                    _raise_if_expired(self.chat, state, request.id)
            raise
        return Reply(outcome.response, outcome.answers)

    async def withdraw(self, request_id: str) -> None:
        action = ChatInputCompleted(request_id=request_id, response="cancel")
        # Rejected when resolved already, or the turn or chat is gone: nothing is open.
        with contextlib.suppress(ActionRejected, ChannelGone):
            await self.host.dispatch(self.chat, action)

    async def approve(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        reason: str | None = None,
        expiry: Expiry | None = None,
        call_id: str | None = None,
    ) -> Decision:
        call_id = call_id or f"approval-{secrets.token_hex(8)}"
        try:
            state = (await self.host.view(self.chat)).state
        except ChannelGone as error:
            raise InputAbandoned(str(error)) from None
        assert isinstance(state, ChatState)
        active = state.active_turn
        if active is None or (self.in_turn is not None and not self.in_turn(active)):
            raise InputAbandoned(f"{self.chat} has no turn to ask in")
        found = latest_call(state, call_id)
        if found is not None and not is_waiting(found[1]):
            # Asked before (a tool run again after a crash) and settled since.
            return decision_of(found[1], arguments, by=None, expired=False)
        waiter = await self.host.waiters.expect_tool_decision(self.chat, call_id, active.id)
        try:
            if found is None:
                await show_call(
                    self._send, self.chat, active.id, call_id, tool, arguments, reason, expiry
                )
            with self.answering():
                decided = await self.host.waiters.tool_decision(waiter)
            if decided.approved:
                await complete_approved(self._send, self.chat, active.id, call_id, tool)
            state = (await self.host.view(self.chat)).state
        except ActionRejected as error:
            raise _not_asked(error) from None
        except ChannelGone as error:
            raise InputAbandoned(str(error)) from None
        finally:
            self.host.waiters.discard(waiter)
        assert isinstance(state, ChatState)
        found = latest_call(state, call_id)
        if found is None:
            raise InputAbandoned(f"tool call {call_id}: the chat was truncated first")
        expired = notes.huddle_meta(decided.action.meta, "expired") is not None
        return decision_of(found[1], arguments, by=decided.by, expired=expired)

    async def _send(self, chat: str, action: StateAction) -> object:
        """Put ``action`` to the chat as the server (the host's own)."""
        return await self.host.dispatch(chat, action)


class RemoteChat:
    """The people of ``chat``, asked through ``client`` (an agent token).

    When the chat has no active turn to ask in, it opens one as the agent
    (``opening`` is its message) and ends it once nothing waits in it
    (server.mcp.remote_calls). A request asked again under its id (a
    process started again after a crash) is found again: an open one is
    waited on, a settled one returns its answer, never asked twice."""

    schema_enforced = False

    def __init__(
        self, client: HuddleClient, chat: str, *, opening: str = "An agent asks the people here"
    ) -> None:
        self.client = client
        self.chat = chat
        self.turn = AskingTurn(client, chat, opening)

    async def ask(
        self, request: InputRequest, schema: dict[str, Any] | None, expiry: Expiry | None = None
    ) -> Reply:
        try:
            async with self.turn.held() as mirror:
                completion = await self._asked(mirror, request, expiry)
        except ActionRejected as error:
            raise _not_asked(error) from None
        except ProtocolError as error:
            raise InputAbandoned(str(error)) from None
        except InputAbandoned:
            held = self.client.mirrors.get(self.chat)
            if expiry is not None and expiry.on_expiry == "fail" and held is not None:
                _raise_if_expired(self.chat, held.state, request.id)
            raise
        response = _RESPONSES.get(completion.response, "cancel")
        state = (await self.turn.mirror()).chat
        turn = turn_holding_request(state, request.id)
        who = await settler(self.turn, state, self.chat, "requests", request.id, turn)
        return Reply(response, completion.answers, answered_by=who.by)

    async def _asked(
        self, mirror: Mirror, request: InputRequest, expiry: Expiry | None
    ) -> Completion:
        """Ask ``request``, unless it is asked already (then wait for it)
        or answered already (then its answer)."""
        if select_input_settlement(mirror.chat, request.id).status == "gone":
            if expiry is None:
                return await self.client.request_input(self.chat, request)
            return await self.client.request_input(
                self.chat, request, expires_in=expiry.seconds, on_expiry=expiry.on_expiry
            )

        def settled(state: ChannelState) -> bool:
            assert isinstance(state, ChatState)
            return select_input_settlement(state, request.id).status != "open"

        state = await mirror.wait_for(settled)
        assert isinstance(state, ChatState)
        outcome = select_input_settlement(state, request.id)
        if outcome.status != "resolved" or outcome.part is None or outcome.part.response is None:
            raise InputAbandoned(f"request {request.id}: the turn ended first")
        return Completion(outcome.part.response, dict(outcome.part.request.answers or {}))

    async def withdraw(self, request_id: str) -> None:
        action = ChatInputCompleted(request_id=request_id, response="cancel")
        # Rejected when resolved already; a lost connection has nothing to withdraw.
        with contextlib.suppress(HuddleError):
            await self.client.dispatch_and_wait(self.chat, action)

    async def approve(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        reason: str | None = None,
        expiry: Expiry | None = None,
        call_id: str | None = None,
    ) -> Decision:
        call_id = call_id or f"approval-{secrets.token_hex(8)}"
        try:
            async with self.turn.held() as mirror:
                turn, call = await self._decided(mirror, tool, arguments, reason, expiry, call_id)
        except ActionRejected as error:
            raise _not_asked(error) from None
        except ProtocolError as error:
            raise InputAbandoned(str(error)) from None
        ended = getattr(turn, "error", None)
        if ended is not None and ended.error_type == "expired":
            raise ElicitationExpired(self.chat, ended.message)
        state = (await self.turn.mirror()).chat
        who = await settler(self.turn, state, self.chat, "toolCalls", call_id, turn)
        return decision_of(call, arguments, by=who.by, expired=who.expired)

    async def withdraw_call(self, call_id: str) -> None:
        """Settle the tool call ``call_id`` as skipped if nobody has decided
        it yet (the agent gave up waiting); a no-op otherwise."""
        mirror = self.client.mirrors.get(self.chat)
        found = latest_call(mirror.chat, call_id) if mirror is not None else None
        if found is None or not is_waiting(found[1]):
            return
        action = ChatToolCallConfirmed(
            turn_id=found[0].id,
            tool_call_id=call_id,
            approved=False,
            reason="skipped",
            reason_message="The agent stopped waiting for it",
        )
        # Decided meanwhile, or the connection lost: nothing to withdraw.
        with contextlib.suppress(HuddleError):
            await self.client.dispatch_and_wait(self.chat, action)

    async def _decided(
        self,
        mirror: Mirror,
        tool: str,
        arguments: dict[str, Any],
        reason: str | None,
        expiry: Expiry | None,
        call_id: str,
    ) -> tuple[ActiveTurn | Turn, ToolCallState]:
        """Show the call (unless it is shown already), wait until it is
        settled, complete it in the chat if approved; its turn and state."""
        if latest_call(mirror.chat, call_id) is None:
            active = mirror.chat.active_turn
            if active is None:
                raise InputAbandoned(f"{self.chat} has no active turn to ask in")
            await show_call(
                self.client.dispatch_and_wait,
                self.chat,
                active.id,
                call_id,
                tool,
                arguments,
                reason,
                expiry,
            )

        def settled(state: ChannelState) -> bool:
            assert isinstance(state, ChatState)
            found = latest_call(state, call_id)
            return found is None or not is_waiting(found[1])

        state = await mirror.wait_for(settled)
        assert isinstance(state, ChatState)
        found = latest_call(state, call_id)
        if found is None:
            raise InputAbandoned(f"tool call {call_id}: the chat was truncated first")
        turn, call = found
        active = state.active_turn
        ours = active is not None and active.id == turn.id
        if ours and isinstance(call, ToolCallRunning) and approved(call):
            send = self.client.dispatch_and_wait
            await complete_approved(send, self.chat, turn.id, call_id, tool)
        return turn, call


def decision_of(
    call: ToolCallState, arguments: dict[str, Any], *, by: Identity | None, expired: bool
) -> Decision:
    """People's decision on a settled ``call`` asked with ``arguments``
    (``by`` who decided, ``expired`` whether its expiry did): the arguments
    as people left them when approved, the reason when denied, cancelled
    when its turn ended with nobody deciding (a skip)."""
    if approved(call):
        return Decision("approved", call_arguments(call, arguments), decided_by=by)
    if isinstance(call, ToolCallCancelled):
        text = denial_reason(call)
        if expired:
            return Decision("expired", arguments, reason=text or "nobody approved it in time")
        if call.reason == "denied":
            return Decision("denied", arguments, reason=text, decided_by=by)
    return Decision("cancelled", arguments, decided_by=by)


def _not_asked(rejected: ActionRejected) -> Unaskable | InputAbandoned:
    """Why a chat refused to open a request: the request itself (too large,
    too many questions, the chat full), or nobody left to answer it."""
    if rejected.code in UNASKABLE:
        return Unaskable(rejected.reason)
    return InputAbandoned(str(rejected))


def _raise_if_expired(chat: str, state: object, request_id: str) -> None:
    """Raise ElicitationExpired if the turn that asked ``request_id`` ended
    because a wait expired with ``fail`` (server.core.expiry's ``chat/error``)."""
    if not isinstance(state, ChatState):
        return
    for turn in reversed(state.turns):
        asked = any(
            isinstance(part, InputRequestPart) and part.request.id == request_id
            for part in turn.response_parts
        )
        if asked:
            if turn.error is not None and turn.error.error_type == "expired":
                raise ElicitationExpired(chat, turn.error.message)
            return
