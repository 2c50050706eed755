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

A process's workers are a :class:`Crew`. A turn whose tool waits for people
(an MCP server's question put to the chat: the tool cannot suspend the turn
as an approval or a form does) keeps its worker for as long as nobody
answers; meanwhile the worker lends its place (``ToolContext.people_answering``)
and the crew runs a spare worker in it, so that one unanswered question does
not stall every other chat's turns. Spares are bounded per process; one
whose lender's wait has ended finishes the turn it has and stops (so for a
moment a process may run one turn more than its workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from server.errors import StoreError
from server.runner.context import lend_with
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
        spare: Callable[[], asyncio.Event | None] | None = None,
        retire: asyncio.Event | None = None,
    ) -> None:
        self.runner = runner
        self.idle_wait = idle_wait
        self.recover_every = recover_every
        self.reconcile = reconcile
        self.spare = spare
        """Starts a spare worker in this one's place and returns what
        retires it (None: no spare to be had; see :class:`Crew`)."""
        self.retire = retire
        """Set: this spare stops once it has no turn (None: a crew's own)."""
        self._waits = 0
        self._retire_spare: asyncio.Event | None = None
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

    @contextlib.contextmanager
    def _lend(self) -> Iterator[None]:
        """While a tool of this worker's turn waits for people: a spare in
        its place (one, however many waits the turn has at once)."""
        self._waits += 1
        if self._waits == 1 and self.spare is not None:
            self._retire_spare = self.spare()
        try:
            yield
        finally:
            self._waits -= 1
            if self._waits == 0 and self._retire_spare is not None:
                self._retire_spare.set()
                self._retire_spare = None

    async def run(self) -> None:
        """Work until cancelled (a spare: until retired, too)."""
        lend_with(self._lend)  # this task's own context: its turns' tools lend this worker
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        handed: Claim | None = None
        try:
            while True:
                _stop_if_cancelled()
                if self.retire is not None:
                    if self.retire.is_set() and handed is None:
                        return
                    next_sweep = loop.time() + self.recover_every  # sweeps are the crew's
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


class Crew:
    """The ``size`` workers of a process and the spares they lend their
    place to while their tools wait for people, at most ``spares`` at once
    (see the module docstring). ``options`` go to every worker."""

    def __init__(self, runner: Runner, size: int, *, spares: int = 0, **options: Any) -> None:
        self.runner = runner
        self.spares = spares
        self._options = options
        self.workers = [Worker(runner, spare=self._spare, **options) for _ in range(size)]
        self._lent = 0
        self.exhausted = 0
        """Waits for people that found every spare lent."""
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def lent(self) -> int:
        """Spares running now (lent a place, or finishing a turn)."""
        return self._lent

    def start(self) -> None:
        for worker in self.workers:
            self._launch(worker)

    def _launch(self, worker: Worker) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(worker.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _spare(self) -> asyncio.Event | None:
        if self._lent >= self.spares:
            self.exhausted += 1
            log.warning(
                "a tool waits for people and all %d spare workers are lent: other turns "
                "wait until someone answers (--spare-workers)",
                self.spares,
            )
            return None
        self._lent += 1  # until the spare stops: a retired one may still finish a turn
        retire = asyncio.Event()
        spare = Worker(self.runner, spare=self._spare, retire=retire, **self._options)
        self._launch(spare).add_done_callback(self._returned)
        return retire

    def _returned(self, _: asyncio.Task[None]) -> None:
        self._lent -= 1

    async def stop(self) -> None:
        """Stop every worker and spare (what each was handed goes back)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
