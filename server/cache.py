"""Bounded bookkeeping by key: a map whose least recently used entry goes
first, and locks kept only while in use."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``size`` entries; reading or writing one makes it the newest."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: K) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, default: V | None = None) -> V | None:
        if key not in self._items:
            return default
        self._items.move_to_end(key)
        return self._items[key]

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: K) -> V | None:
        return self._items.pop(key, None)


@dataclass(slots=True)
class _Held:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    """Callers holding or waiting for the lock."""


class KeyedLocks(Generic[K]):
    """One lock per key, kept only while a caller holds it or waits for it:
    as many as there are callers, and never one dropped while in use (an
    evicted lock let a second holder in beside the first)."""

    def __init__(self) -> None:
        self._held: dict[K, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def locked(self, key: K) -> bool:
        held = self._held.get(key)
        return held is not None and held.lock.locked()

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        """Hold ``key``'s lock for the block."""
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held()
        held.users += 1
        try:
            async with held.lock:
                yield
        finally:
            held.users -= 1
            if not held.users:
                del self._held[key]
