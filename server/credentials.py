"""Who is who: the client ids tokens claim, and the tokens an agent mints.

A client id is a connection's label, held by one token across every
process (:meth:`Credentials.claim_client`); a token is minted for a role on
some sessions, for a while (:meth:`Credentials.mint_token`). Both belong to
the command layer (server.commands), which holds one :class:`Credentials`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from protocol.codec import MalformedFrame
from protocol.messages import CLIENT_ID_PATH, ErrorCode
from protocol.wire import quoted
from server.auth import ROLES, Grant, Role, TokenAuthority
from server.core.host import Host
from server.core.policy import Command
from server.errors import ActionRejected, CommandError, refused
from server.ratelimit import NewClientIds

AGENT_CLAIM_TTL = 24 * 3600.0
"""How long a token with no expiry (the agent's) holds a client id after the
last of its sockets that used it closed: the window in which it may come
back as that client. The claim is renewed while any is open
(:meth:`Credentials.renew_claims`), so it never lapses under one; a token
with an expiry holds its ids for its lifetime. Once the window passed, the
id may go to another token: nothing is judged by it by then (a tool call's
executor is a token, :func:`server.core.policy.executor`), and Huddle's
clients start with a fresh id when theirs is taken (server.client)."""

log = logging.getLogger("huddle.credentials")


class Credentials:
    """Client ids claimed, tokens minted; ``allow`` is the command layer's
    permission check."""

    def __init__(
        self,
        host: Host,
        authority: TokenAuthority,
        allow: Callable[[Grant, Command], None],
        *,
        clock: Callable[[], float],
        default_ttl: float,
        max_ttl: float,
        client_ids: NewClientIds | None = None,
        claim_ttl: float = AGENT_CLAIM_TTL,
    ) -> None:
        self.host = host
        self.authority = authority
        self.allow = allow
        self.clock = clock
        self.default_ttl = default_ttl
        self.max_ttl = max_ttl
        self.client_ids = client_ids or NewClientIds()
        self.claim_ttl = claim_ttl
        """How long a claim of a token with no expiry lasts unrenewed."""

    def _claim_ttl(self, grant: Grant) -> float:
        """A claim lasts the token's lifetime, or ``claim_ttl`` for a token
        with none (renewed while one of its sockets uses it)."""
        if grant.expires_at is None:
            return self.claim_ttl
        return max(1.0, grant.expires_at - self.clock())

    async def renew_claims(self, held: Iterable[tuple[Grant, str]]) -> None:
        """Hold again each client id an open socket of its token uses, so
        that no claim lapses while the socket is open (an id in every
        envelope's ``origin`` must never pass to another token under it).
        Run every quarter of ``claim_ttl`` by the server (server.edge.app),
        each process for its own sockets."""
        for grant, client_id in held:
            holder = await self._claim(grant, client_id)
            if holder is not None:  # lapsed while the store was away, and taken
                log.warning("client id %s of an open socket is held by another token", client_id)

    async def holder_of(self, client_id: str) -> str | None:
        """The token id that holds ``client_id`` now, in any process, if any."""
        return await self.host.store.claimant(_claim_key(client_id), self.clock())

    async def _claim(self, grant: Grant, client_id: str) -> str | None:
        """Claim (or renew) ``client_id`` for ``grant``'s token, on the
        server's clock (tokens' lifetimes are on it); the holder otherwise."""
        ttl = self._claim_ttl(grant)
        return await self.host.store.claim(_claim_key(client_id), grant.token_id, ttl, self.clock())

    async def claim_client(self, grant: Grant, client_id: str) -> None:
        """Bind ``client_id`` to this token for as long as the token lives
        (a day at a time for the agent token), across every process: a
        client id is a connection's label, and two tokens never share one.
        Raises MalformedFrame for an id over the id limit (it is kept nowhere,
        and would ride in every envelope's ``origin``) or one with a control
        character (server.core.channels.origin_key separates with one), CommandError when
        another token holds it, or when a person's token started too many
        lately (server.ratelimit.NewClientIds: each is kept for the
        token's lifetime)."""
        size, limit = len(client_id.encode()), self.host.sizes.id
        if size > limit:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                f"the clientId is {size:,} bytes; the limit is {limit:,}",
                "$.clientId",
            )
        if (control := next((c for c in client_id if c < " " or c == "\x7f"), None)) is not None:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                f"the clientId holds the control character U+{ord(control):04X}: a clientId "
                "is a label, of printable characters",
                "$.clientId",
            )
        try:
            self.client_ids.claiming(grant, client_id)
        except ActionRejected as rejected:
            raise refused(rejected, "$.clientId") from None
        if await self._claim(grant, client_id) is not None:
            raise CommandError(
                ErrorCode.PERMISSION_DENIED,
                f"clientId {quoted(client_id)} belongs to another token: choose another",
                {"path": CLIENT_ID_PATH},
            )

    def mint_token(
        self,
        grant: Grant,
        role: Any,
        *,
        sessions: Any = None,
        name: Any = None,
        ttl: Any = None,
    ) -> str:
        """A token for ``role`` on ``sessions`` (all when None); arguments
        as they came (MalformedFrame names the one at fault)."""
        self.allow(grant, Command.MINT_TOKEN)
        if role not in ROLES:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, f"role must be one of {', '.join(ROLES)}", "$.role"
            )
        if sessions is not None and not (
            isinstance(sessions, list) and all(isinstance(s, str) for s in sessions)
        ):
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS, "sessions must be a list of URIs", "$.sessions"
            )
        ttl = self.default_ttl if ttl is None else ttl
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= self.max_ttl:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                f"ttl must be a number of seconds above 0 and at most {self.max_ttl:.0f}",
                "$.ttl",
            )
        chosen: Role = role
        return self.authority.mint(
            chosen,
            sessions=sessions,
            name=name if isinstance(name, str) else None,
            expires_at=self.clock() + float(ttl),
        )


def _claim_key(client_id: str) -> str:
    return f"client:{client_id}"
