"""A person's turn start re-sent after a drop is the one the log holds, not
another action, though each copy sent is stamped anew (server.policy.stamped)."""

from __future__ import annotations

from server.client import HuddleClient
from tests.conftest import RunningServer, new_session_chat
from tests.edge import Peer
from tests.test_once import again
from tests.test_trust import TURN

SESSION = "ahp-session:/stamped-again"


async def test_a_turn_start_sent_again_after_a_drop_gets_the_first_envelope(
    huddle: RunningServer,
) -> None:
    # Each turn start a person's token sends is stamped anew (a random
    # _meta.huddle.turn), so the copy re-sent after a reconnect differs from
    # the one the log holds under its (clientId, clientSeq): it was refused
    # as "client-seq-reused" instead of answered with the first envelope.
    agent: HuddleClient = await huddle.client("agent", name="agent")
    chat = await new_session_chat(agent, SESSION)
    token = huddle.token(name="Lee")
    first_peer = await Peer.ready(huddle.ws, token, "lee-browser")
    await first_peer.subscribe(chat)
    await first_peer.send(again(chat, 1, TURN))
    first = await first_peer.envelope()
    await first_peer.close()

    peer = await Peer.ready(huddle.ws, token, "lee-browser")  # its reconnect
    await peer.subscribe(chat)
    await peer.send(again(chat, 1, TURN))
    echo = await peer.envelope()
    await peer.close()

    assert "rejectionReason" not in first
    assert echo == first
