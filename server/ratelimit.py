"""Action budgets per token: how many actions a token may send a second.

One budget per token, shared by every connection and the HTTP API (a
participant opening ten sockets does not get ten times the budget). Agent
tokens have a budget of their own, larger by default: an agent streaming
``chat/delta`` into twenty chats over one socket is normal. Budgets of
tokens that go quiet are forgotten once they are full again; at most
``max_tokens`` are kept (the least recently used goes first), so the map
stays bounded however many tokens come.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from server.auth import Grant
from server.cache import Lru


@dataclass(frozen=True)
class Budget:
    """``rate`` actions a second, at most ``burst`` saved up."""

    rate: float
    burst: int


class TokenBucket:
    """A token bucket for one :class:`Budget`."""

    def __init__(self, budget: Budget, clock: Callable[[], float]) -> None:
        self.budget, self.clock = budget, clock
        self.tokens = float(budget.burst)
        self.stamp = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.budget.burst, self.tokens + (now - self.stamp) * self.budget.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Budgets:
    """The buckets of every token seen lately."""

    def __init__(
        self,
        participant: Budget,
        agent: Budget,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tokens: int = 10_000,
    ) -> None:
        self.participant = participant
        self.agent = agent
        self.clock = clock
        self._buckets: Lru[str, TokenBucket] = Lru(max_tokens)

    def budget_of(self, grant: Grant) -> Budget:
        return self.agent if grant.role == "agent" else self.participant

    def take(self, grant: Grant) -> bool:
        """Whether ``grant``'s token may send one more action now."""
        bucket = self._buckets.get(grant.budget_key)
        if bucket is None:
            bucket = TokenBucket(self.budget_of(grant), self.clock)
            self._buckets.put(grant.budget_key, bucket)
        return bucket.take()
