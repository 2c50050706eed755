"""Workers: claim runnable turns by lease and run them.

A worker takes the earliest due turn whose lease is free or expired, runs
it under a lease it renews, and gives the lease up when the turn is blocked
or done. A worker whose lease was taken over (it stalled past the lease) is
fenced: its next save fails and it drops the turn. A worker that died is
noticed by its lease expiring: another takes the turn over, which counts as
a failed attempt (bounded: see :mod:`server.runner.runner`). Now and then a worker
also wakes what a crash may have left asleep (Runner.recover, and the chat
bridge's reconcile).

A worker with nothing to do waits as a :class:`~server.runner.store.Waiter`
of its own: a resume saved meanwhile (``Runner.submit_resume``) is handed
to it directly, leased and loaded, and it runs the turn without claiming
it. It stops waiting when it stops (what it was handed goes back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable

from server.errors import StoreError
from server.runner.runner import Runner
from server.runner.store import Claim, Fenced, VersionConflict, Waiter

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
        self.waiter_id = f"{runner.owner}:{secrets.token_hex(4)}"
        """Names this worker's waits (one worker task of a runner among
        others: the owner alone does not)."""

    async def step(self) -> bool:
        """Claim and run one due turn; False when there was none."""
        return await self._step(await self._claim(None))

    async def _claim(self, waiter: Waiter | None) -> Claim | None:
        runner = self.runner
        return await runner.store.claim_turn(
            runner.owner, runner.clock(), runner.lease_seconds, waiter=waiter
        )

    async def _step(self, claim: Claim | None) -> bool:
        """Run ``claim``'s turn; False when there is none."""
        if claim is None:
            return False
        lease = claim.lease
        try:
            await self.runner.execute_claimed(lease, claim.turn, running=claim.running)
        except (Fenced, VersionConflict) as error:
            log.warning("dropped turn %s: %s", lease.turn_id, error)
        except Exception:
            log.exception("turn %s failed in the worker", lease.turn_id)
        self.executed += 1
        return True

    def _waiter(self) -> Waiter:
        """This worker as it waits now: until ``idle_wait`` from now."""
        runner = self.runner
        return Waiter(
            self.waiter_id, runner.owner, runner.lease_seconds, runner.clock() + self.idle_wait
        )

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
        handed: Claim | None = None
        try:
            while True:
                _stop_if_cancelled()
                if handed is None and loop.time() >= next_sweep:
                    await self.recover()
                    next_sweep = loop.time() + self.recover_every
                try:
                    claim = handed or await self._claim(self._waiter())
                    handed = None
                    worked = await self._step(claim)
                except Exception:
                    log.exception("claiming failed")
                    worked = False
                if not worked:
                    handed = await self.runner.store.wait_for_work(self.idle_wait, self._waiter())
        finally:
            store, now = self.runner.store, self.runner.clock()
            with contextlib.suppress(StoreError):
                if handed is not None:  # stopped before it ran: give it back
                    await store.release(handed.lease)
                    await store.make_runnable(handed.lease.turn_id, now)
                await store.stop_waiting(self._waiter(), now)


def _stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop: a cancel that
    lands while a Redis command is in flight can be lost by the client
    library (the command completes, the task is left "cancelling"), and a
    worker must stop all the same."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
