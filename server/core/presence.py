"""Who is here: the people connected to a session, in its active clients.

AHP's clients put themselves in a session's ``activeClients``
(``session/activeClientSet``; Huddle's web client does when it opens a
session) and take themselves out. The server's part: the entry carries the
name the server knows its holder by (server.commands), and when a
connection goes without taking its entry out, the server does (:func:`leave`),
so the list says who is here now (unless the client is back on another
connection of this process by then). An entry a crashed process left
behind stays until that client id connects and goes again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from protocol.actions import SessionActiveClientRemoved, StateAction
from protocol.messages import ChannelState
from protocol.session import SessionState
from server.core.host import Host
from server.errors import ChannelGone, StoreError


async def leave(
    host: Host, session: str, client_id: str, back: Callable[[], bool] = lambda: False
) -> None:
    """``client_id`` is no longer here, unless it is ``back`` (connected
    again) by the time its entry would be taken out."""

    def change(state: ChannelState) -> StateAction | None:
        if back():
            return None
        if isinstance(state, SessionState) and any(
            c.client_id == client_id for c in state.active_clients
        ):
            return SessionActiveClientRemoved(client_id=client_id)
        return None

    with contextlib.suppress(ChannelGone, StoreError):
        await host.core.update(session, change)
