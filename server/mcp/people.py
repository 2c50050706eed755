"""Where an MCP server's questions go: the people of one chat.

:class:`HostChat` asks through the server's own :class:`~server.core.host.Host`
(in process: the schema is frozen with the request, so the host refuses an
accept whose data fails it). :class:`RemoteChat` asks through a
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from protocol.actions import ChatInputCompleted
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    InputResponseKind,
)
from protocol.rejections import RejectionCode
from server.auth import Identity
from server.client import HuddleClient, ProtocolError
from server.core.expiry import Expiry
from server.core.host import Host
from server.errors import ActionRejected, ChannelGone, HuddleError, InputAbandoned
from server.mcp.errors import ElicitationExpired, Unaskable
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
        raise NotImplementedError("approvals through the host: being built (issue 40)")


class RemoteChat:
    """The people of ``chat``, asked through ``client`` (an agent token)."""

    schema_enforced = False

    def __init__(self, client: HuddleClient, chat: str) -> None:
        self.client = client
        self.chat = chat

    async def ask(
        self, request: InputRequest, schema: dict[str, Any] | None, expiry: Expiry | None = None
    ) -> Reply:
        try:
            if expiry is None:
                completion = await self.client.request_input(self.chat, request)
            else:
                completion = await self.client.request_input(
                    self.chat, request, expires_in=expiry.seconds, on_expiry=expiry.on_expiry
                )
        except ActionRejected as error:
            raise _not_asked(error) from None
        except ProtocolError as error:
            raise InputAbandoned(str(error)) from None
        except InputAbandoned:
            mirror = self.client.mirrors.get(self.chat)
            if expiry is not None and expiry.on_expiry == "fail" and mirror is not None:
                _raise_if_expired(self.chat, mirror.state, request.id)
            raise
        response = _RESPONSES.get(completion.response, "cancel")
        return Reply(response, completion.answers)

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
        raise NotImplementedError("approvals through a client: being built (issue 40)")


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
