"""The channel core's background work: follow-ups, catch-ups, snapshots.

:class:`Background` runs what a core starts without awaiting it, logs what
fails, and at a stop waits for it (:meth:`Background.wait`) or cancels it
(:meth:`Background.stop`). :meth:`Background.follow_ups` runs the hooks'
follow-ups of one write in order, in a task of its own: a caller cancelled
meanwhile leaves them running.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable

log = logging.getLogger("huddle.channels")

FollowUps = list[Awaitable[None]]
"""The work hooks returned for the envelopes of one write, in hook order."""


class Background:
    """The tasks one channel core runs in the background."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()
        self._stopped = False

    def __len__(self) -> int:
        return len(self._tasks)

    def start(self) -> None:
        self._stopped = False

    def spawn(self, coro: Awaitable[None]) -> asyncio.Future[None] | None:
        """Run ``coro`` in the background; its failure is logged. Once
        stopped, nothing more starts (what a cancelled task hands on is
        dropped): None then."""
        if self._stopped:
            if inspect.iscoroutine(coro):
                coro.close()
            return None
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("background task failed", exc_info=error)

    async def follow_ups(self, follow_ups: FollowUps, what: str) -> None:
        """Await hooks' follow-ups in order; one that fails is logged and the
        others still run. They run in a task of their own, which the caller
        awaits shielded: a caller cancelled meanwhile (a task cancelled at a
        stop, uvicorn's graceful timeout) leaves them running (the audit's
        record and the session's telling of an action applied are not the
        caller's to drop), and :meth:`wait` waits for them."""
        if not follow_ups:
            return
        running = self.spawn(_run_in_order(follow_ups, what))
        if running is None:  # stopped: nothing runs in the background any more
            await _run_in_order(follow_ups, what)
            return
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            return  # the caller is being cancelled: they run on without it
        await asyncio.shield(running)

    async def wait(self, until: float) -> None:
        """Wait for what runs, up to ``until`` (``time.monotonic()``); what
        still runs then is logged."""
        while self._tasks:
            left = until - time.monotonic()
            if left <= 0:
                log.error("%d follow-ups and catch-ups still run at the stop", len(self._tasks))
                return
            await asyncio.wait(list(self._tasks), timeout=left)

    def stop(self) -> None:
        """Start nothing more, and cancel what runs."""
        self._stopped = True
        for task in list(self._tasks):
            task.cancel()


async def _run_in_order(follow_ups: FollowUps, what: str) -> None:
    for follow_up in follow_ups:
        try:
            await follow_up
        except Exception:
            log.exception("side effect of %s failed", what)
