"""A sweep that runs every so often in the background, for as long as its
owner runs: expiries (server.core.expiry) and retention (server.core.retention).

A sweep that fails with one of the expected errors (the store away, a disk
full) is logged and the next one runs on time; any other error is a bug
and ends the loop loudly (asyncio logs the task's exception).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """Run ``sweep`` every ``interval`` seconds between :meth:`start` and
    :meth:`stop`."""

    def __init__(
        self,
        sweep: Callable[[], Awaitable[object]],
        interval: float,
        *,
        log: logging.Logger,
        what: str,
        expected: tuple[type[Exception], ...],
    ) -> None:
        self.sweep = sweep
        self.interval = interval
        self.log = log
        self.what = what
        self.expected = expected
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._running())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _running(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.sweep()
            except self.expected as error:
                self.log.warning("%s failed: %s", self.what, error)
