"""The light parts of Huddle's WebSocket protocol: the receive inbox and the
writable gate keep the semantics of the asyncio.Queue and asyncio.Event
they replace (every WebSocket test runs through them too)."""

from __future__ import annotations

import asyncio

import pytest

from server.edge.serve import Gate, Inbox
from tests.conftest import UNIT


async def test_the_inbox_hands_out_events_in_order_and_waits_when_empty() -> None:
    inbox = Inbox()
    assert inbox.empty()
    inbox.put_nowait("a")
    inbox.put_nowait("b")
    assert not inbox.empty()
    assert await inbox.get() == "a"
    assert await inbox.get() == "b"
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    inbox.put_nowait("c")
    async with asyncio.timeout(UNIT):
        assert await waiting == "c"
    assert inbox.empty()


async def test_an_inbox_reader_cancelled_while_waiting_loses_nothing() -> None:
    inbox = Inbox()
    waiting = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    inbox.put_nowait("kept")
    assert await inbox.get() == "kept"


async def test_the_inbox_has_one_reader() -> None:
    inbox = Inbox()
    first = asyncio.create_task(inbox.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one reader"):
        await inbox.get()
    inbox.put_nowait("x")
    assert await first == "x"


async def test_the_gate_is_open_until_cleared_and_releases_every_waiter() -> None:
    gate = Gate()
    assert gate.is_set()
    assert await gate.wait()
    gate.clear()
    waiters = [asyncio.create_task(gate.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(waiter.done() for waiter in waiters)
    gate.set()
    async with asyncio.timeout(UNIT):
        assert await asyncio.gather(*waiters) == [True, True, True]


async def test_a_gate_waiter_cancelled_is_forgotten() -> None:
    gate = Gate()
    gate.clear()
    waiting = asyncio.create_task(gate.wait())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    assert gate.is_set()
