"""Budgets: what a token may spend a second, what one client address may
fail to authenticate, how many client ids it may start, and how many long
polls and sockets a token may hold at once.

One budget per token, shared by every connection and the HTTP API (a
participant opening ten sockets does not get ten times the budget; a shared
link's browsers spend the link's), and by every process of one store
(:class:`Budgets` draws it from the store). Its unit is one action: an HTTP request
costs what its route says (:mod:`server.edge.app`). Agent tokens have a budget of
their own, larger by default: an agent streaming ``chat/delta`` into twenty
chats over one socket is normal. A cost is paid up front, or, for what is
known only once done (the size of an answer), charged afterwards as a debt
that the next requests wait out; no single cost is more than the burst, so
everything fits a full budget.

Failed authentications are counted per client address
(:class:`FailedAuthentications`; which failures count, the edge decides:
guesses, :func:`server.edge.app.verify_token`): an address that spent its
allowance is refused before its token is looked at, until it has room
again; other addresses are untouched.

New client ids are counted per participant or observer token
(:class:`NewClientIds`): each is kept in the store for the token's lifetime,
so a token may start only so many (coming back with one costs nothing).

Every map here stays bounded however many tokens or addresses come: at most
``max_tokens`` buckets (the least recently used goes first), and long poll
counts only for tokens that hold one.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from protocol.rejections import RejectionCode
from server.auth import Grant
from server.cache import Lru
from server.errors import ActionRejected, AuthError, StoreError


@dataclass(frozen=True)
class Budget:
    """``rate`` actions a second, at most ``burst`` saved up."""

    rate: float
    burst: int


FAILED_AUTHENTICATIONS: Final = Budget(rate=1.0, burst=20)
"""Failed authentications one client address may make: 20 in a row, then
one a second (a browser retrying with an expired token stays well within)."""
LONG_POLLS: Final = 8
"""``/api/input/wait`` polls one participant or observer token (a shared
link: all its browsers) may hold open at once."""
AGENT_LONG_POLLS: Final = 1000
"""The same for an agent token (trusted, but bounded all the same)."""


NEW_CLIENT_IDS: Final = Budget(rate=1 / 60, burst=30)
"""Client ids one participant or observer token (a shared link: each of its
browsers) may start using: 30 at once, then one a minute. Each is kept in the
store for the token's lifetime (no other token may take it), so they must
not come as fast as actions do; a client coming back with its own id again
spends nothing."""


SOCKETS: Final = 32
"""WebSocket connections one participant or observer token may hold open at
once (each may hold up to ``--send-buffer`` unread)."""
LINK_SOCKETS: Final = 256
"""The same for all the browsers of one shared link together."""
AGENT_SOCKETS: Final = 1000
"""The same for an agent token."""


class RateLimited(ActionRejected):
    """A token over its budget: ``rate-limited``; ``retry_after`` seconds
    until what it asked for fits."""

    def __init__(self, rate: float, retry_after: float) -> None:
        super().__init__(RejectionCode.RATE_LIMITED, f"at most {rate:g} actions a second per token")
        self.rate = rate
        self.retry_after = retry_after


class AuthThrottled(AuthError):
    """Too many failed authentications from one client address lately: 429,
    answered before the token is looked at; ``retry_after`` seconds until the
    address may try again."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(429, "too many failed authentications from this address: retry later")
        self.retry_after = retry_after


class TokenBucket:
    """A token bucket for one :class:`Budget`; ``now`` comes from its owner's
    clock (so that a test may move it)."""

    def __init__(self, budget: Budget, now: float) -> None:
        self.budget = budget
        self.tokens = float(budget.burst)
        self.stamp = now

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self.stamp)
        self.tokens = min(self.budget.burst, self.tokens + elapsed * self.budget.rate)
        self.stamp = now

    def wait(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` fits (0: now); takes nothing."""
        self._refill(now)
        missing = min(cost, self.budget.burst) - self.tokens
        if missing <= 0:
            return 0.0
        return missing / self.budget.rate if self.budget.rate > 0 else math.inf

    def spend(self, cost: float, now: float) -> float:
        """Take ``cost`` (at most the burst) if it fits and return 0; else
        take nothing and return the seconds until it fits."""
        wait = self.wait(cost, now)
        if wait == 0:
            self.tokens -= min(cost, self.budget.burst)
        return wait

    def charge(self, cost: float, now: float) -> None:
        """Take ``cost`` (at most the burst) whether or not it fits: a debt
        the next requests wait out."""
        self._refill(now)
        self.tokens -= min(cost, self.budget.burst)


Draw = Callable[[str, float, int, float, float], Awaitable[float]]
"""``ChannelStore.draw``: take up to ``want`` from the shared bucket ``key``
(``rate``, ``burst``) at wall-clock time ``now``; what it took."""

DRAWN_SHARE: Final = 8
"""What a process draws from a token's shared bucket at a time: a
``DRAWN_SHARE``-th of the burst (or the cost at hand, if more). Spent
here without asking the store again, so an action costs a round trip only
once in that many; N processes hold at most N such draws unspent, all the
excess a token can get by spreading over processes."""


class Budgets:
    """The budgets of every token seen lately. With ``draw`` (the store's,
    shared by every process), a token's budget is one bucket in the store:
    each process draws a share of it at a time (:data:`DRAWN_SHARE`) and
    spends that, so ten processes give a token what one gives it, but for
    at most one unspent draw each. Without it, or while the store fails,
    each process keeps its own bucket per token (the same budget per
    process)."""

    def __init__(
        self,
        participant: Budget,
        agent: Budget,
        *,
        clock: Callable[[], float] = time.monotonic,
        draw: Draw | None = None,
        wall: Callable[[], float] = time.time,
        max_tokens: int = 10_000,
    ) -> None:
        self.participant = participant
        self.agent = agent
        self.clock = clock
        self.draw = draw
        self.wall = wall
        """The clock draws are made on: one every process shares."""
        self._buckets: Lru[str, TokenBucket] = Lru(max_tokens)
        self._held: Lru[str, float] = Lru(max_tokens)
        """Per token: what it drew and has not spent (below 0: a debt)."""

    def budget_of(self, grant: Grant) -> Budget:
        return self.agent if grant.role == "agent" else self.participant

    def _bucket(self, grant: Grant) -> TokenBucket:
        bucket = self._buckets.get(grant.budget_key)
        if bucket is None:
            bucket = TokenBucket(self.budget_of(grant), self.clock())
            self._buckets.put(grant.budget_key, bucket)
        return bucket

    async def _drawn(self, grant: Grant, cost: float) -> float | None:
        """What ``grant``'s token holds here once it has drawn enough for
        ``cost`` (as much as the shared bucket had); None without a store
        to draw from, or when it fails (then the process's own bucket
        decides)."""
        if self.draw is None:
            return None
        held = self._held.get(grant.budget_key) or 0.0
        if held < cost:
            budget = self.budget_of(grant)
            want = max(budget.burst / DRAWN_SHARE, cost - held)
            try:
                took = await self.draw(
                    "rate:" + grant.budget_key, budget.rate, budget.burst, want, self.wall()
                )
            except StoreError:
                return None
            # Another spend of this token may have spent or drawn meanwhile.
            held = (self._held.get(grant.budget_key) or 0.0) + took
            self._held.put(grant.budget_key, held)
        return held

    def _limited(self, grant: Grant, missing: float) -> RateLimited:
        budget = self.budget_of(grant)
        wait = missing / budget.rate if budget.rate > 0 else math.inf
        return RateLimited(budget.rate, wait)

    async def spend(self, grant: Grant, cost: float = 1.0) -> None:
        """Take ``cost`` from ``grant``'s budget; RateLimited (nothing taken)
        when it does not fit now."""
        cost = min(cost, self.budget_of(grant).burst)
        held = await self._drawn(grant, cost)
        if held is None:
            wait = self._bucket(grant).spend(cost, self.clock())
            if wait > 0:
                raise RateLimited(self.budget_of(grant).rate, wait)
            return
        if held < cost:
            raise self._limited(grant, cost - held)
        self._held.put(grant.budget_key, held - cost)

    def charge(self, grant: Grant, cost: float) -> None:
        """Take ``cost`` from ``grant``'s budget even into debt (for what was
        known only once done): the next spends draw to pay it first."""
        cost = min(cost, self.budget_of(grant).burst)
        self._bucket(grant).charge(cost, self.clock())
        if self.draw is not None:
            self._held.put(grant.budget_key, (self._held.get(grant.budget_key) or 0.0) - cost)

    async def out_of_debt(self, grant: Grant) -> None:
        """RateLimited while ``grant``'s budget is in debt (nothing taken):
        for what costs nothing up front but may run up a debt."""
        held = await self._drawn(grant, 0.0)
        if held is None:
            wait = self._bucket(grant).wait(0, self.clock())
            if wait > 0:
                raise RateLimited(self.budget_of(grant).rate, wait)
            return
        if held < 0:
            raise self._limited(grant, -held)


class NewClientIds:
    """Which client ids people's tokens used lately here, and each token's
    budget (NEW_CLIENT_IDS) for ids it did not: ask :meth:`claiming` before
    a client id is claimed. Agent tokens are not counted. Per process (a
    token's ids on another process count there) and bounded: ``max_ids``
    ids remembered, ``max_tokens`` buckets."""

    def __init__(
        self,
        budget: Budget = NEW_CLIENT_IDS,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_ids: int = 100_000,
        max_tokens: int = 10_000,
    ) -> None:
        self.budget = budget
        self.clock = clock
        self._known: Lru[bytes, None] = Lru(max_ids)
        self._buckets: Lru[str, TokenBucket] = Lru(max_tokens)

    def claiming(self, grant: Grant, client_id: str) -> None:
        """ActionRejected (``rate-limited``) when ``client_id`` is new for
        ``grant``'s token and it has started too many lately."""
        if grant.role == "agent":
            return
        key = hashlib.blake2b(f"{grant.token_id}\0{client_id}".encode(), digest_size=16).digest()
        if key in self._known:
            self._known.put(key, None)
            return
        bucket = self._buckets.get(grant.budget_key)
        if bucket is None:
            bucket = TokenBucket(self.budget, self.clock())
            self._buckets.put(grant.budget_key, bucket)
        wait = bucket.spend(1, self.clock())
        if wait > 0:
            raise ActionRejected(
                RejectionCode.RATE_LIMITED,
                f"this token started {self.budget.burst} client ids lately; one more in "
                f"{math.ceil(wait)} s, or come back with one of them",
            )
        self._known.put(key, None)


def address_key(host: str | None) -> str:
    """Whose failures a client address counts as: an IPv4 address itself,
    an IPv6 address its /64 (one host's usual share: cycling through it buys
    nothing)."""
    if host is None:
        return ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailedAuthentications:
    """Failed authentications per client address (see the module docstring):
    ask :meth:`check` before verifying a token, tell :meth:`failed` after a
    token failed to verify."""

    def __init__(
        self,
        budget: Budget = FAILED_AUTHENTICATIONS,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = 10_000,
    ) -> None:
        self.budget = budget
        self.clock = clock
        self._buckets: Lru[str, TokenBucket] = Lru(max_addresses)

    def check(self, host: str | None) -> None:
        """AuthThrottled when the address of ``host`` has no failure left to
        make now."""
        bucket = self._buckets.get(address_key(host))
        if bucket is not None and (wait := bucket.wait(1, self.clock())) > 0:
            raise AuthThrottled(wait)

    def failed(self, host: str | None) -> None:
        key = address_key(host)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self.budget, self.clock())
            self._buckets.put(key, bucket)
        bucket.charge(1, self.clock())


class Slots:
    """What tokens hold open at once, per token (its budget key: a shared
    link's browsers together): at most ``limit``, ``agent_limit`` for an
    agent, ``link_limit`` for a shared link. Only tokens holding one are in
    the map. Per process."""

    def __init__(
        self,
        limit: int = LONG_POLLS,
        agent_limit: int = AGENT_LONG_POLLS,
        link_limit: int | None = None,
    ) -> None:
        self.limit = limit
        self.agent_limit = agent_limit
        self.link_limit = limit if link_limit is None else link_limit
        self._held: dict[str, int] = {}

    def limit_of(self, grant: Grant) -> int:
        if grant.role == "agent":
            return self.agent_limit
        return self.link_limit if grant.shared else self.limit

    def held(self, grant: Grant) -> int:
        return self._held.get(grant.budget_key, 0)

    def open(self, grant: Grant) -> bool:
        """Take a slot for one more of ``grant``'s; False when it holds
        its limit already. Every True must be followed by :meth:`close`."""
        held = self.held(grant)
        if held >= self.limit_of(grant):
            return False
        self._held[grant.budget_key] = held + 1
        return True

    def close(self, grant: Grant) -> None:
        held = self.held(grant) - 1
        if held > 0:
            self._held[grant.budget_key] = held
        else:
            self._held.pop(grant.budget_key, None)
