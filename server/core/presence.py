"""Who is here: the people connected to a session, in its active clients.

AHP's clients put themselves in a session's ``activeClients``
(``session/activeClientSet``; Huddle's web client does when it opens a
session) and take themselves out. The server's part: the entry carries the
name the server knows its holder by (server.commands), and when a
connection goes without taking its entry out, the server does (:func:`leave`),
so the list says who is here now (unless the client is back on another
connection of this process by then). An entry a crashed process left
behind stays until that client id connects and goes again.

How many entries one token (a shared link's browsers together) holds in a
session is counted in the store (:func:`arrive`, :func:`depart`), so the
bound holds over every process. The count lasts ``COUNTED`` from its
first entry and then starts again: what a crash left counted heals by
then (and meanwhile it only holds that token back).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Final

from protocol.actions import SessionActiveClientRemoved, StateAction
from protocol.messages import ChannelState
from protocol.session import SessionState
from server.core.host import Host
from server.errors import ChannelGone, StoreError


async def leave(
    host: Host,
    session: str,
    client_id: str,
    back: Callable[[], bool] = lambda: False,
    payer: str | None = None,
) -> None:
    """``client_id`` is no longer here, unless it is ``back`` (connected
    again) by the time its entry would be taken out. ``payer``: the token
    (budget key) whose count (:func:`arrive`) the entry is given back to,
    first, so that once the entry is seen gone the token may come back."""
    if payer is not None:
        await depart(host, session, payer)

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


COUNTED: Final = 24 * 3600.0
"""How long a token's count of entries in a session lasts (see above)."""


def _count_of(session: str, payer: str) -> str:
    return f"present:{session}:{payer}"


async def arrive(host: Host, session: str, payer: str, limit: int) -> bool:
    """Count one more entry of ``payer`` (a token's budget key) in
    ``session``'s active clients, over every process; False (nothing
    counted) when it holds ``limit`` already. Every True is followed by a
    :func:`depart` once that entry goes (or was not taken). Raises
    StoreError."""
    return await host.store.tally(_count_of(session, payer), 1, limit, COUNTED) == 0


async def depart(host: Host, session: str, payer: str) -> None:
    """One entry of ``payer`` in ``session`` went (see :func:`arrive`)."""
    with contextlib.suppress(StoreError):
        await host.store.tally(_count_of(session, payer), -1, 0, COUNTED)
