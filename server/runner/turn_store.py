"""Turn stores: versioned turns, the runnable queue, leases.

The contract, as every store keeps it:

- ``save`` is a compare-and-set on ``turn.version``: it fails with
  VersionConflict when someone saved since the turn was loaded, so a newer
  snapshot is never overwritten; with a ``lease`` it first fails with Fenced
  unless that lease's fencing token is still the turn's current one (a
  worker whose lease was taken over can never save again, even under the
  same worker id, and is told to stop rather than to reload).
- ``request_cancel`` sets a flag that no save clears; ``cancel_requested``
  reads it alone.
- ``make_runnable`` queues a turn to be claimed at ``due_at``; ``claim``
  takes the earliest due turn (or a given one) whose lease is free or
  expired, under a new lease with a new fencing token; ``claim_turn`` does
  the same and loads the turn in the same step.

The fast path of a resume, one step each:

- ``save_runnable`` is ``save`` (no lease) and ``make_runnable`` now, as one
  step, and its compare-and-set also covers the cancel flag (a resume
  decided on a turn whose cancel was requested since must be decided
  again). When a worker is waiting (below) and nobody holds the turn's
  lease, the turn is not queued but handed to that worker: leased to it
  under a new fencing token, as ``claim`` would, and put in its inbox. The
  caller may give the turn as it would be once started (its RUN
  transition, made by the caller): a hand-over then saves that one, so the
  worker runs it without saving its start (``Claim.running``). A store
  may queue the turn instead and wake the waiting worker, which claims it
  (the Redis store on a cluster does, for turns outside the group its
  workers wait on);
- a worker waits as a :class:`Waiter`: ``claim_turn(..., waiter=w)`` first
  takes what was handed to ``w`` (and stops ``w`` waiting), and when there
  is nothing to claim registers ``w`` as waiting until ``w.until``;
  ``wait_for_work(at_most, w)`` then returns a turn handed to ``w`` the
  moment it is, as a :class:`Claim`, or None when woken otherwise (claim
  again). A waiter not back by ``w.until`` (its worker died) is handed
  nothing more; ``stop_waiting`` gives back what a stopping worker was
  handed. A turn handed to a worker that died before taking it is claimed
  by another once its lease expires, as after any crash (and, handed over
  started, counts as a failed attempt, as a takeover does).

A handed turn is fenced like a claimed one: its lease is the only one, and
a save under an older lease fails.

A record the store cannot decode (corrupt, or written by a newer version)
is never returned by ``claim_turn`` or ``wait_for_work``, nor claimed again
each lease period: the store parks it (out of the queue, the leases and
the recovery sweeps, its data kept for an operator), logs it once at error
level, and claims the next turn. The Redis store does (see
:mod:`server.runner.redis_turn_store`); the memory store holds only snapshots it
encoded itself, in this process, so it never holds such a record.
"""

from __future__ import annotations

import asyncio
import itertools
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field, replace

import msgspec

from server.runner.errors import Fenced as Fenced
from server.runner.errors import TurnExists as TurnExists
from server.runner.errors import TurnNotFound as TurnNotFound
from server.runner.errors import VersionConflict as VersionConflict
from server.runner.machine import as_stored
from server.runner.turn import Turn, TurnStatus, copy_turn
from server.store.base import Rider


@dataclass(frozen=True)
class Lease:
    """A turn's lease: held by ``owner`` until ``until`` while ``token`` is
    the turn's current one. ``freed``: the lease before it was given up
    (``give_up``: its worker stopped and handed the turn on), not lost to
    a crash or a stall, so a RUNNING turn it takes is no failed attempt."""

    turn_id: str
    owner: str
    token: int
    until: float
    freed: bool = False


@dataclass(frozen=True)
class Claim:
    """A lease and the turn as it was when the lease was taken. ``running``:
    the turn was handed over started (saved RUNNING under this lease)."""

    lease: Lease
    turn: Turn
    running: bool = False


@dataclass(frozen=True)
class Waiter:
    """A worker waiting for work: ``id`` names its wait (one per worker
    task, unique), ``owner`` and ``lease_seconds`` are what a turn handed to
    it is leased with, ``until`` is when its wait ends (the caller's clock,
    as every time a store gets)."""

    id: str
    owner: str
    lease_seconds: float
    until: float


class TurnStore(ABC):
    rides_on: str | None = None
    """The store URL of the Redis a chat store must be on to carry this
    store's riders (:meth:`runnable_rider`); None: it makes none."""

    @abstractmethod
    async def create(self, turn: Turn) -> Turn:
        """Save a new turn at version 1; raises TurnExists if the id exists."""

    @abstractmethod
    async def load(self, turn_id: str) -> Turn:
        """The latest saved turn (a copy), with its version and cancel flag."""

    @abstractmethod
    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        """Save ``turn`` if it is still at ``turn.version``; returns it at
        the next version. Raises VersionConflict or Fenced."""

    @abstractmethod
    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        """Save ``turn`` (no lease) if it is still at ``turn.version`` and
        its cancel flag is still ``turn.cancel_requested``, and make it
        runnable now: handed to a waiting worker if there is one and the
        turn's lease is free (as ``started``, the same turn after its RUN
        transition, when given), else queued. Returns what it saved, at the
        next version. Raises VersionConflict (reload and decide again)."""

    def runnable_rider(
        self, turn: Turn, now: float, *, started: Turn | None = None
    ) -> Rider | None:
        """:meth:`save_runnable` as a write that rides on a chat's append
        (server.store.base.Rider), for a chat store that carries it; None
        when this store has none (this one)."""
        return None

    def rider_saved(self, rider: Rider, turn: Turn) -> Turn:
        """What :meth:`save_runnable` would have returned, for a rider from
        :meth:`runnable_rider` of the same arguments that ran. Raises
        VersionConflict and TurnNotFound as that does."""
        raise NotImplementedError(f"{type(self).__name__} makes no rider")

    @abstractmethod
    async def request_cancel(self, turn_id: str) -> None: ...

    async def cancel_requested(self, turn_id: str) -> bool:
        """Whether a cancel was requested, without loading the turn."""
        return (await self.load(turn_id)).cancel_requested

    @abstractmethod
    async def make_runnable(self, turn_id: str, due_at: float) -> None: ...

    @abstractmethod
    async def claim(
        self, owner: str, now: float, lease_seconds: float, turn_id: str | None = None
    ) -> Lease | None:
        """Take a due runnable turn (or ``turn_id``, due or not) whose lease
        is free or expired; None when there is none."""

    @abstractmethod
    async def claim_turn(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        turn_id: str | None = None,
        *,
        waiter: Waiter | None = None,
    ) -> Claim | None:
        """``claim`` and ``load`` in one step. With ``waiter``: first a turn
        handed to it, and when there is nothing to claim ``waiter`` is
        registered as waiting (see the module docstring). A record that does
        not decode is parked, not returned (None when it was ``turn_id``)."""

    @abstractmethod
    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        """Extend the lease; None when it was taken over."""

    @abstractmethod
    async def release(self, lease: Lease) -> None:
        """Give the lease up (no-op when it was taken over)."""

    @abstractmethod
    async def give_up(self, lease: Lease, now: float) -> None:
        """Give the lease up and queue its turn to be claimed at ``now``, as
        one step (a stopping worker hands its turn on: the next claim takes
        it over at once, not once the lease has expired); nothing when the
        lease is no longer held (released, or taken over)."""

    @abstractmethod
    async def by_status(self, status: TurnStatus) -> list[str]:
        """The ids of the turns in ``status`` (for recovery sweeps)."""

    async def wait_for_work(self, at_most: float, waiter: Waiter | None = None) -> Claim | None:
        """Return when a turn may have become runnable (None: claim it), or
        at once with the turn handed to ``waiter`` (registered by
        ``claim_turn``), or with None after ``at_most`` seconds (workers call
        it between claims)."""
        await asyncio.sleep(at_most)
        return None

    async def wake(self, waiter: Waiter) -> None:
        """End ``waiter``'s wait now, if it waits (``wait_for_work`` returns
        what was handed to it, or None): a worker that is stopping is told
        so without cancelling a wait, which could lose a turn handed to it
        in the meantime. Nothing else changes."""
        del waiter  # this default wait is a sleep: it ends on its own

    @abstractmethod
    async def stop_waiting(self, waiter: Waiter, now: float) -> None:
        """``waiter`` waits no more: what was handed to it and not taken is
        queued again, its lease given up."""

    async def close(self) -> None:
        return None


@dataclass
class _Held:
    data: bytes
    version: int
    status: TurnStatus
    cancel: bool = False
    lease_owner: str | None = None
    lease_token: int = 0
    lease_until: float = 0.0


@dataclass
class _Inbox:
    """What was handed to one waiter, and its wait while it waits (resolved
    to wake it: the waiting task runs on the next turn of the loop)."""

    claims: deque[Claim] = field(default_factory=deque)
    wait: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.wait is not None and not self.wait.done():
            self.wait.set_result(None)


class MemoryTurnStore(TurnStore):
    """Turns in this process's memory, stored as encoded snapshots so that
    a loaded turn never aliases the saved one."""

    def __init__(self) -> None:
        self._turns: dict[str, _Held] = {}
        self._runnable: dict[str, float] = {}
        self._tokens = itertools.count(1)
        self._work = False
        """A turn became runnable since a worker last waited."""
        self._waiting: dict[str, Waiter] = {}
        """Registered waiters, oldest first."""
        self._inboxes: dict[str, _Inbox] = {}

    def _held(self, turn_id: str) -> _Held:
        held = self._turns.get(turn_id)
        if held is None:
            raise TurnNotFound(turn_id)
        return held

    def _decoded(self, held: _Held) -> Turn:
        turn = msgspec.json.decode(held.data, type=Turn)
        return as_stored(turn, version=held.version, cancel_requested=held.cancel)

    async def create(self, turn: Turn) -> Turn:
        if turn.id in self._turns:
            raise TurnExists(turn.id)
        turn = as_stored(copy_turn(turn), version=1, cancel_requested=turn.cancel_requested)
        self._turns[turn.id] = _Held(msgspec.json.encode(turn), 1, turn.status)
        return turn

    async def load(self, turn_id: str) -> Turn:
        return self._decoded(self._held(turn_id))

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        held = self._held(turn.id)
        # Fencing first: a worker whose lease was taken over must stop, not
        # reload and decide again as a VersionConflict would tell it to.
        if lease is not None and lease.token != held.lease_token:
            raise Fenced(turn.id, lease.token)
        if held.version != turn.version:
            raise VersionConflict(turn.id, turn.version, held.version)
        saved = as_stored(
            copy_turn(turn), version=held.version + 1, cancel_requested=turn.cancel_requested
        )
        held.data, held.version, held.status = (
            msgspec.json.encode(saved),
            saved.version,
            turn.status,
        )
        return as_stored(saved, version=saved.version, cancel_requested=held.cancel)

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        held = self._held(turn.id)
        if held.cancel != turn.cancel_requested:
            raise VersionConflict(turn.id, turn.version, held.version)
        waiter = self._waiter_for(held, now)
        # Through save: a subclass's save (one that crashes) applies here too.
        saved = await self.save(started if waiter is not None and started is not None else turn)
        if waiter is None:
            await self.make_runnable(turn.id, now)
            return saved
        del self._waiting[waiter.id]
        lease = self._lease(turn.id, held, waiter.owner, now + waiter.lease_seconds)
        inbox = self._inboxes.setdefault(waiter.id, _Inbox())
        inbox.claims.append(Claim(lease, self._decoded(held), running=started is not None))
        inbox.wake()
        return saved

    def _waiter_for(self, held: _Held, now: float) -> Waiter | None:
        """The waiter a turn is handed to: the one that registered last and
        still waits, if the turn's lease is free."""
        if held.lease_owner is not None and held.lease_until > now:
            return None
        for waiter in reversed(list(self._waiting.values())):
            if waiter.until >= now:
                return waiter
            del self._waiting[waiter.id]  # its wait is over: claiming again, or gone
        return None

    def _lease(self, turn_id: str, held: _Held, owner: str, until: float) -> Lease:
        freed = held.lease_owner is None
        held.lease_owner, held.lease_token, held.lease_until = owner, next(self._tokens), until
        self._runnable.pop(turn_id, None)
        return Lease(turn_id, owner, held.lease_token, until, freed)

    async def request_cancel(self, turn_id: str) -> None:
        self._held(turn_id).cancel = True

    async def cancel_requested(self, turn_id: str) -> bool:
        return self._held(turn_id).cancel

    async def make_runnable(self, turn_id: str, due_at: float) -> None:
        self._held(turn_id)
        self._runnable[turn_id] = due_at
        self._work = True
        for inbox in self._inboxes.values():
            inbox.wake()

    async def wait_for_work(self, at_most: float, waiter: Waiter | None = None) -> Claim | None:
        # Each wait has an inbox (a waiter's own, or one for this wait only).
        key = waiter.id if waiter is not None else f"anonymous:{id(asyncio.current_task())}"
        inbox = self._inboxes.setdefault(key, _Inbox())
        # A turn made runnable between a worker's empty claim and this wait
        # must still wake it: the flag is cleared by the wait it wakes.
        if not inbox.claims and not self._work:
            inbox.wait = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(at_most):
                    await inbox.wait
            except TimeoutError:
                pass
            finally:
                inbox.wait = None
                if waiter is None:
                    del self._inboxes[key]
        self._work = False
        return inbox.claims.popleft() if inbox.claims else None

    async def wake(self, waiter: Waiter) -> None:
        inbox = self._inboxes.get(waiter.id)
        if inbox is not None:
            inbox.wake()

    async def stop_waiting(self, waiter: Waiter, now: float) -> None:
        self._waiting.pop(waiter.id, None)
        inbox = self._inboxes.pop(waiter.id, None)
        for claim in inbox.claims if inbox is not None else ():
            await self.give_up(claim.lease, now)

    async def claim(
        self, owner: str, now: float, lease_seconds: float, turn_id: str | None = None
    ) -> Lease | None:
        if turn_id is None:
            due = sorted((at, tid) for tid, at in self._runnable.items() if at <= now)
            expired = [
                tid
                for tid, h in self._turns.items()
                if h.lease_owner is not None and h.lease_until <= now
            ]
            candidates = [tid for _, tid in due] + expired
        else:
            candidates = [turn_id]
        for candidate in candidates:
            held = self._turns.get(candidate)
            if held is None or (held.lease_owner is not None and held.lease_until > now):
                continue
            return self._lease(candidate, held, owner, now + lease_seconds)
        return None

    async def claim_turn(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        turn_id: str | None = None,
        *,
        waiter: Waiter | None = None,
    ) -> Claim | None:
        if waiter is not None:
            self._waiting.pop(waiter.id, None)
            inbox = self._inboxes.get(waiter.id)
            if inbox is not None and inbox.claims:
                return inbox.claims.popleft()
        lease = await self.claim(owner, now, lease_seconds, turn_id)
        if lease is not None:
            return Claim(lease, await self.load(lease.turn_id))
        if waiter is not None:
            self._waiting[waiter.id] = waiter
        return None

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        held = self._turns.get(lease.turn_id)
        if held is None or held.lease_token != lease.token or held.lease_owner is None:
            return None
        held.lease_until = now + lease_seconds
        return replace(lease, until=held.lease_until)

    async def release(self, lease: Lease) -> None:
        held = self._turns.get(lease.turn_id)
        if held is not None and held.lease_token == lease.token:
            held.lease_owner, held.lease_until = None, 0.0

    async def give_up(self, lease: Lease, now: float) -> None:
        held = self._turns.get(lease.turn_id)
        if held is None or held.lease_token != lease.token or held.lease_owner is None:
            return
        held.lease_owner, held.lease_until = None, 0.0
        await self.make_runnable(lease.turn_id, now)

    async def by_status(self, status: TurnStatus) -> list[str]:
        return [tid for tid, h in self._turns.items() if h.status == status]
