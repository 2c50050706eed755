"""What a connection hears of its own actions that were not applied.

AHP echoes an action only to the subscribers of its channel; one that was
rejected, or had been applied already (a re-send after a reconnect), comes
back to its sender alone (:class:`Echoes`): the first one's envelope, a
rejection carrying the action as it was sent, or for an action that does
not even decode the bytes it was sent as.
"""

from __future__ import annotations

import msgspec
from msgspec.structs import replace

from protocol.codec import MalformedFrame, encode
from protocol.messages import ActionEnvelope, ActionOrigin
from protocol.rejections import Rejection, RejectionCode
from server.auth import Grant
from server.commands import Commands
from server.edge.connection import Connection
from server.errors import AlreadyApplied, StoreUnavailable
from server.frames import action_frame


class Echoes:
    """Sends one connection's echoes of its actions not applied."""

    def __init__(self, connection: Connection, commands: Commands, grant: Grant) -> None:
        self.connection = connection
        self.commands = commands
        self.grant = grant

    def applied(self, applied: AlreadyApplied, *, numbered: bool) -> None:
        """An action re-sent after a reconnect gets the first one's outcome:
        its envelope, to its sender alone (a Huddle client's mirror holds it
        already, or will from the replay; the echo settles what it sent). A
        plain connection numbers what it gets, so there it is said in words."""
        envelope = applied.envelope
        assert isinstance(envelope, ActionEnvelope)
        if not numbered:
            frame = action_frame(encode(envelope), applied.channel, applied.seq)
        else:
            reason = Rejection(
                RejectionCode.DUPLICATE,
                f"clientSeq {envelope.origin.client_seq if envelope.origin else '?'} was "
                "applied already",
            ).reason
            echo = replace(envelope, rejection_reason=reason)
            frame = action_frame(encode(echo), applied.channel, applied.seq, rejected=True)
        self.connection.send_frame(frame)

    async def undecodable(
        self, params: bytes, client_id: str | None, error: MalformedFrame
    ) -> bool:
        """AHP: an invalid action comes back to its sender with a
        ``rejectionReason``: one that does not decode too, as it was sent.
        False when there is nothing to echo on (no channel or clientSeq)."""
        if client_id is None:
            return False
        try:
            loose = msgspec.json.decode(params, type=_LooseDispatch)
        except msgspec.DecodeError:
            return False
        origin = ActionOrigin(client_id=client_id, client_seq=loose.clientSeq)
        reason = Rejection(RejectionCode.INVALID_ACTION, f"the action does not decode: {error}")
        reason_text = reason.reason
        await self.rejection(loose.channel, bytes(loose.action), origin, reason_text)
        return True

    async def rejection(self, uri: str, action: bytes, origin: ActionOrigin, reason: str) -> None:
        """Echo the rejected action (its JSON) to its sender alone. Its
        serverSeq uses no number: the channel's current seq (0 where the token
        does not reach the channel or the store cannot say), or for a plain
        connection its current number. For a channel that does not exist
        (or that this token does not reach) nothing comes back."""
        try:
            seq = await self.commands.visible_seq(self.grant, uri)
        except StoreUnavailable:
            seq = 0
        if seq is None:
            return  # AHP: an action for a channel that does not exist is ignored
        echo = _Echo(
            channel=uri,
            action=msgspec.Raw(action),
            serverSeq=seq,
            origin=origin,
            rejectionReason=reason,
        )
        frame = action_frame(encode(echo), uri, seq, rejected=True)
        self.connection.send_frame(frame)


class _LooseDispatch(msgspec.Struct):
    """The params of a ``dispatchAction`` whose action did not decode."""

    channel: str
    clientSeq: int  # noqa: N815 (the wire name)
    action: msgspec.Raw


class _Echo(msgspec.Struct):
    """A rejection envelope carrying the action as it was sent."""

    channel: str
    action: msgspec.Raw
    serverSeq: int  # noqa: N815
    origin: ActionOrigin
    rejectionReason: str  # noqa: N815
