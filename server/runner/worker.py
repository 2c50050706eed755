"""Workers: claim runnable turns by lease and run them.

A worker takes the earliest due turn whose lease is free or expired, runs
it under a lease it renews, and gives the lease up when the turn is blocked
or done. A worker whose lease was taken over (it stalled past the lease) is
fenced: its next save fails and it drops the turn. A worker that died is
noticed by its lease expiring: another takes the turn over, which counts as
a failed attempt (bounded: see :mod:`server.runner.runner`). Now and then a worker
also wakes what a crash may have left asleep (Runner.recover, and the chat
bridge's reconcile).

A worker with nothing to do waits as a :class:`~server.runner.turn_store.Waiter`
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
moment a process may run one turn more than its workers), unless the lender
waits again first (questions in a row keep one spare). A wait that finds
every spare lent gets the first place that comes free. Spares run in a
context of their own, never the asking tool's.

A crew stops (:meth:`Crew.stop`) the way a rolling deploy needs: workers
without a turn at once, a turn running here once it reaches its next stop
or its grace is over; then it is handed on (its lease given up and the turn
queued in one step: ``TurnStore.give_up``), so another worker takes it
over at once rather than when its lease would have expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from server.errors import StoreError
from server.runner.context import lend_with
from server.runner.runner import Runner
from server.runner.turn_store import Claim, Fenced, VersionConflict, Waiter

log = logging.getLogger("huddle.runner.worker")

WARN_EVERY = 60.0
"""Seconds between warnings that every spare worker is lent."""


class Worker:
    def __init__(
        self,
        runner: Runner,
        *,
        idle_wait: float = 1.0,
        recover_every: float = 5.0,
        reconcile: Callable[[], Awaitable[int]] | None = None,
        crew: Crew | None = None,
        retire: asyncio.Event | None = None,
    ) -> None:
        self.runner = runner
        self.idle_wait = idle_wait
        self.recover_every = recover_every
        self.reconcile = reconcile
        self.crew = crew
        """Where this worker lends its place while its tools wait for
        people (None: nowhere; see :class:`Crew`)."""
        self.retire = retire
        """Set: this spare stops once it has no turn (None: a crew's own)."""
        self._waits = 0
        self.executed = 0
        self.busy = False
        """Whether it runs a turn now."""
        self.draining = False
        """Set by :meth:`Crew.stop`: take no more work, stop after this turn."""
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
        self.busy = True
        try:
            await self.runner.execute_claimed(lease, claim.turn, running=claim.running)
        except (Fenced, VersionConflict) as error:
            log.warning("dropped turn %s: %s", lease.turn_id, error)
        except Exception:
            log.exception("turn %s failed in the worker", lease.turn_id)
        finally:
            self.busy = False
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

    @property
    def waiting_for_people(self) -> bool:
        """Whether a tool of this worker's turn waits for people now."""
        return self._waits > 0

    @contextlib.contextmanager
    def _lend(self) -> Iterator[None]:
        """While a tool of this worker's turn waits for people: a spare in
        its place (one, however many waits the turn has, at once or in a
        row)."""
        self._waits += 1
        if self._waits == 1 and self.crew is not None:
            self.crew.lend(self)
        try:
            yield
        finally:
            self._waits -= 1
            if self._waits == 0 and self.crew is not None:
                self.crew.lent_back(self)

    async def run(self) -> None:
        """Work until cancelled (a spare: until retired, too)."""
        lend_with(self._lend)  # this task's own context: its turns' tools lend this worker
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        handed: Claim | None = None
        try:
            while True:
                _stop_if_cancelled()
                if self.draining:
                    return  # what it was handed goes back (below)
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
                    if self.draining:
                        handed = claim  # claimed as the stop began: it goes back
                        continue
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
                    await store.give_up(handed.lease, now)
                await store.stop_waiting(self._waiter(), now)


def _stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop: a cancel that
    lands while a Redis command is in flight can be lost by the client
    library (the command completes, the task is left "cancelling"), and a
    worker must stop all the same."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass
class _Spare:
    """A spare worker running in a lender's place: retired (it stops once
    it has no turn) when the lender's wait ends."""

    retire: asyncio.Event
    task: asyncio.Task[None]


class Crew:
    """The ``size`` workers of a process and the spares they lend their
    place to while their tools wait for people, at most ``spares`` at once
    (see the module docstring). ``options`` go to every worker.

    A lender has one spare at a time: a wait that begins while its last
    spare is still finishing keeps that one. A wait that finds every spare
    lent is queued, and the first place that comes free is its spare."""

    def __init__(self, runner: Runner, size: int, *, spares: int = 0, **options: Any) -> None:
        self.runner = runner
        self.spares = spares
        self._options = options
        self.workers = [Worker(runner, crew=self, **options) for _ in range(size)]
        self._lent: dict[Worker, _Spare] = {}
        """By lender: the spare in its place (retired or not, until it stops)."""
        self._wanting: deque[Worker] = deque()
        """Lenders whose wait found every spare lent, first come first."""
        self.exhausted = 0
        """Waits for people that found every spare lent."""
        self._warned = -WARN_EVERY
        self._running: dict[asyncio.Task[None], Worker] = {}
        """Every worker and spare running now, by its task."""
        self._stopping = False

    @property
    def lent(self) -> int:
        """Spares running now (lent a place, or finishing a turn)."""
        return len(self._lent)

    def start(self) -> None:
        for worker in self.workers:
            self._launch(worker)

    def _launch(self, worker: Worker) -> asyncio.Task[None]:
        # A context of its own: a spare started from a tool's wait must not
        # carry that tool's context (ToolContext.current(), the lender).
        run = worker.run()
        task = asyncio.get_running_loop().create_task(run, context=contextvars.Context())
        self._running[task] = worker
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)

    def lend(self, lender: Worker) -> None:
        """``lender``'s tool began to wait for people: a spare in its place."""
        spare = self._lent.get(lender)
        if spare is not None:
            spare.retire.clear()  # still finishing: it stays (if it has not stopped)
            return
        if self._stopping:
            return
        if len(self._lent) >= self.spares:
            self.exhausted += 1
            if lender not in self._wanting:
                self._wanting.append(lender)
            now = time.monotonic()
            if now - self._warned >= WARN_EVERY:
                self._warned = now
                log.warning(
                    "a tool waits for people and all %d spare workers are lent: other turns "
                    "wait until someone answers (--spare-workers)",
                    self.spares,
                )
            return
        self._start(lender)

    def lent_back(self, lender: Worker) -> None:
        """``lender``'s wait ended: its spare stops once it has no turn."""
        spare = self._lent.get(lender)
        if spare is not None:
            spare.retire.set()
        with contextlib.suppress(ValueError):
            self._wanting.remove(lender)

    def _start(self, lender: Worker) -> None:
        retire = asyncio.Event()
        task = self._launch(Worker(self.runner, crew=self, retire=retire, **self._options))
        self._lent[lender] = _Spare(retire, task)
        task.add_done_callback(functools.partial(self._returned, lender))

    def _returned(self, lender: Worker, task: asyncio.Task[None]) -> None:
        """A spare stopped: its place goes to a lender still waiting without
        one (its own lender first, if it waits again)."""
        spare = self._lent.get(lender)
        if spare is not None and spare.task is task:
            del self._lent[lender]
            if lender.waiting_for_people and lender not in self._wanting:
                self._wanting.appendleft(lender)  # un-retired too late
        while self._wanting and len(self._lent) < self.spares and not self._stopping:
            wanting = self._wanting.popleft()
            if wanting.waiting_for_people and wanting not in self._lent:
                self._start(wanting)

    async def stop(self, grace: float = 0.0) -> None:
        """Stop every worker and spare: those without a turn at once (their
        waits woken, not cancelled: a cancelled wait could lose a turn
        handed to it meanwhile; what each was handed goes back), those
        running one once it reaches its next stop (blocked, or done) or
        after ``grace`` seconds, whichever comes first. A turn still running
        then is handed on to whichever worker claims next
        (``Runner.execute_claimed``: at once, as after a crash), not left to
        wait out its lease. A turn whose tool waits for people (an MCP
        server's question) may wait long: it is handed on at once."""
        self._stopping = True
        running = dict(self._running)
        if not running:
            return
        store = self.runner.store
        for task, worker in running.items():
            worker.draining = True
            if worker.busy and worker.waiting_for_people:
                task.cancel()
            elif not worker.busy:
                with contextlib.suppress(StoreError):
                    await store.wake(worker._waiter())
        if grace > 0:
            await asyncio.wait(running, timeout=grace)
        for task, worker in running.items():
            if worker.busy:
                task.cancel()  # past its grace: handed on
        # Those left end within a wait (woken, they end at once) and a
        # hand-on; then they are cancelled whatever they do.
        await asyncio.wait(running, timeout=max(w.idle_wait for w in running.values()) + 1.0)
        for task in running:
            task.cancel()  # nothing when it has ended
        # Every one awaited, whatever one of them raised.
        for outcome in await asyncio.gather(*running, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error("a worker failed as it stopped", exc_info=outcome)
