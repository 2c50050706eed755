"""Turn stores: versioned turns, the runnable queue, leases.

The contract, as every store keeps it:

- ``save`` is a compare-and-set on ``turn.version``: it fails with
  VersionConflict when someone saved since the turn was loaded, so a newer
  snapshot is never overwritten; with a ``lease`` it first fails with Fenced
  unless that lease's fencing token is still the turn's current one (a
  worker whose lease was taken over can never save again, even under the
  same worker id, and is told to stop rather than to reload).
- ``request_cancel`` sets a flag that no save clears.
- ``make_runnable`` queues a turn to be claimed at ``due_at``; ``claim``
  takes the earliest due turn (or a given one) whose lease is free or
  expired, under a new lease with a new fencing token.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass

import msgspec

from server.runner.errors import Fenced as Fenced
from server.runner.errors import TurnExists as TurnExists
from server.runner.errors import TurnNotFound as TurnNotFound
from server.runner.errors import VersionConflict as VersionConflict
from server.runner.turn import Turn, TurnStatus, copy_turn


@dataclass(frozen=True)
class Lease:
    turn_id: str
    owner: str
    token: int
    until: float


class TurnStore(ABC):
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
    async def request_cancel(self, turn_id: str) -> None: ...

    @abstractmethod
    async def make_runnable(self, turn_id: str, due_at: float) -> None: ...

    @abstractmethod
    async def claim(
        self, owner: str, now: float, lease_seconds: float, turn_id: str | None = None
    ) -> Lease | None:
        """Take a due runnable turn (or ``turn_id``, due or not) whose lease
        is free or expired; None when there is none."""

    @abstractmethod
    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        """Extend the lease; None when it was taken over."""

    @abstractmethod
    async def release(self, lease: Lease) -> None:
        """Give the lease up (no-op when it was taken over)."""

    @abstractmethod
    async def by_status(self, status: TurnStatus) -> list[str]:
        """The ids of the turns in ``status`` (for recovery sweeps)."""

    async def wait_for_work(self, at_most: float) -> None:
        """Return when a turn may have become runnable, or after ``at_most``
        seconds (workers call it between claims)."""
        await asyncio.sleep(at_most)

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


class MemoryTurnStore(TurnStore):
    """Turns in this process's memory, stored as encoded snapshots so that
    a loaded turn never aliases the saved one."""

    def __init__(self) -> None:
        self._turns: dict[str, _Held] = {}
        self._runnable: dict[str, float] = {}
        self._tokens = itertools.count(1)
        self._work = asyncio.Event()

    def _held(self, turn_id: str) -> _Held:
        held = self._turns.get(turn_id)
        if held is None:
            raise TurnNotFound(turn_id)
        return held

    async def create(self, turn: Turn) -> Turn:
        if turn.id in self._turns:
            raise TurnExists(turn.id)
        turn = copy_turn(turn)
        turn.version = 1
        self._turns[turn.id] = _Held(msgspec.json.encode(turn), 1, turn.status)
        return turn

    async def load(self, turn_id: str) -> Turn:
        held = self._held(turn_id)
        turn = msgspec.json.decode(held.data, type=Turn)
        turn.version, turn.cancel_requested = held.version, held.cancel
        return turn

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        held = self._held(turn.id)
        # Fencing first: a worker whose lease was taken over must stop, not
        # reload and decide again as a VersionConflict would tell it to.
        if lease is not None and lease.token != held.lease_token:
            raise Fenced(turn.id, lease.token)
        if held.version != turn.version:
            raise VersionConflict(turn.id, turn.version, held.version)
        saved = copy_turn(turn)
        saved.version = held.version + 1
        held.data, held.version, held.status = (
            msgspec.json.encode(saved),
            saved.version,
            turn.status,
        )
        saved.cancel_requested = held.cancel
        return saved

    async def request_cancel(self, turn_id: str) -> None:
        self._held(turn_id).cancel = True

    async def make_runnable(self, turn_id: str, due_at: float) -> None:
        self._held(turn_id)
        self._runnable[turn_id] = due_at
        self._work.set()

    async def wait_for_work(self, at_most: float) -> None:
        # Cleared after waking, not before: a turn made runnable between a
        # worker's empty claim and this wait must still wake it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self._work.wait()
        self._work.clear()

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
            held.lease_owner, held.lease_token = owner, next(self._tokens)
            held.lease_until = now + lease_seconds
            self._runnable.pop(candidate, None)
            return Lease(candidate, owner, held.lease_token, held.lease_until)
        return None

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        held = self._turns.get(lease.turn_id)
        if held is None or held.lease_token != lease.token or held.lease_owner is None:
            return None
        held.lease_until = now + lease_seconds
        return Lease(lease.turn_id, lease.owner, lease.token, held.lease_until)

    async def release(self, lease: Lease) -> None:
        held = self._turns.get(lease.turn_id)
        if held is not None and held.lease_token == lease.token:
            held.lease_owner, held.lease_until = None, 0.0

    async def by_status(self, status: TurnStatus) -> list[str]:
        return [tid for tid, h in self._turns.items() if h.status == status]
