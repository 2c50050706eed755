"""Workers: claim runnable turns by lease and run them.

A worker takes the earliest due turn whose lease is free or expired, runs
it under a lease it renews, and gives the lease up when the turn is blocked
or done. A worker whose lease was taken over (it stalled past the lease) is
fenced: its next save fails and it drops the turn. A worker that died is
noticed by its lease expiring: another takes the turn over, which counts as
a failed attempt (bounded: see :mod:`server.runner.runner`). Now and then a worker
also wakes what a crash may have left asleep (Runner.recover, and the chat
bridge's reconcile).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from server.runner.runner import Runner
from server.runner.store import Fenced, VersionConflict

log = logging.getLogger("huddle.runner.worker")


class Worker:
    def __init__(
        self,
        runner: Runner,
        *,
        idle_wait: float = 1.0,
        recover_every: float = 5.0,
        reconcile: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.runner = runner
        self.idle_wait = idle_wait
        self.recover_every = recover_every
        self.reconcile = reconcile
        self.executed = 0

    async def step(self) -> bool:
        """Claim and run one due turn; False when there was none."""
        runner = self.runner
        lease = await runner.store.claim(runner.owner, runner.clock(), runner.lease_seconds)
        if lease is None:
            return False
        try:
            await runner.execute_claimed(lease)
        except (Fenced, VersionConflict) as error:
            log.warning("dropped turn %s: %s", lease.turn_id, error)
        except Exception:
            log.exception("turn %s failed in the worker", lease.turn_id)
        self.executed += 1
        return True

    async def recover(self) -> None:
        try:
            await self.runner.recover()
            if self.reconcile is not None:
                await self.reconcile()
        except Exception:
            log.exception("recovery sweep failed")

    async def run(self) -> None:
        """Work until cancelled."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        while True:
            if loop.time() >= next_sweep:
                await self.recover()
                next_sweep = loop.time() + self.recover_every
            try:
                worked = await self.step()
            except Exception:
                log.exception("claiming failed")
                worked = False
            if not worked:
                await self.runner.store.wait_for_work(self.idle_wait)
