"""Bounded bookkeeping by key (server.cache)."""

from __future__ import annotations

import asyncio

from server.cache import KeyedLocks


async def test_a_held_lock_stays_however_many_other_keys_come_and_go() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    async with locks.hold("chat-1"):
        for n in range(10_000):
            async with locks.hold(f"chat-other-{n}"):
                pass
        assert locks.locked("chat-1")
        second = asyncio.create_task(_hold(locks, "chat-1"))
        await asyncio.sleep(0)  # let it reach the lock: it must wait there
        assert not second.done()
    await second
    assert len(locks) == 0  # nothing kept once nobody holds or waits


async def test_a_caller_cancelled_while_waiting_leaves_nothing_behind() -> None:
    locks: KeyedLocks[str] = KeyedLocks()
    async with locks.hold("chat-1"):
        waiting = asyncio.create_task(_hold(locks, "chat-1"))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert len(locks) == 1
    assert len(locks) == 0


async def _hold(locks: KeyedLocks[str], key: str) -> None:
    async with locks.hold(key):
        pass
