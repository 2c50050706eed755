"""Submissions that count once over HTTP: ``Idempotency-Key``.

A ``POST /api/dispatch`` that carries ``Idempotency-Key: K`` is answered
once per token and key: the first request runs and its answer (status and
body) is kept in the store for ``ttl`` seconds; a retry with the same key
and the same body gets that answer again and applies nothing. The same key
with another body is 422; a retry while the first is still running is 409
(try again). Answers that mean "not done, try again" (429, 503) are not
kept, so a retry runs.

Room for an answer is booked before its request runs (as much as the
request's body and an envelope's fields: the answer carries the action),
so that nothing is ever applied twice for want of room to keep its answer;
once it has run, the booking becomes what is really kept (the stored
record), or nothing when no answer is kept, and the rest is given back.
What is booked counts for ``ttl``, in this process:

- per participant or observer token (a shared link's browsers count as
  the link), at most ``budget`` bytes; agent tokens are trusted and have
  no budget of their own;
- a store that keeps only so much (the memory store: ``remember_limit``)
  is never asked to keep more, whoever asks, since it would forget the
  oldest answers and their retries would run again; and of that room,
  participant and observer tokens together may take at most
  ``PEOPLE_SHARE``. The rest is the agents' reserve: people cannot crowd
  an agent out, however many tokens they hold, and an agent's request is
  refused for want of room only when agents' own answers leave it none in
  the reserve. (People may still crowd each other out of their share, each
  token at most by its budget, until their answers expire.) A store that
  bounds nothing itself (Redis: its ``maxmemory`` is the operator's) has
  only the tokens' budgets.

Beyond a bound a request with a key is refused with 429 before it runs
(retry later, or without a key), its ``Retry-After`` saying when the
oldest answers kept will have made room.

The WebSocket's counterpart is the store's ``(clientId, clientSeq)`` check
on every append (per connection for a plain AHP client; see
server.core.channels.origin_key).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import msgspec
from starlette.responses import Response

from server.auth import Grant
from server.cache import Lru
from server.edge.headers import retry_after
from server.store.base import ChannelStore

MAX_KEY: Final = 200
"""Characters of an ``Idempotency-Key``."""
RUNNING: Final = 10.0
"""Seconds a first request holds its key while it runs."""
UNKEPT: Final = frozenset({429, 503})
"""Answers that say "not done, try again": a retry runs."""
ANSWER_OVERHEAD: Final = 4096
"""Bytes an answer may take beyond its request's body (envelope fields)."""
BUDGET: Final = 16 << 20
"""Bytes of kept answers one token may have within the ttl (per process)."""
PEOPLE_SHARE: Final = 0.5
"""Of what a store keeps at most, the part that participant and observer
tokens' answers may take together; the rest is kept for agent tokens'."""


@dataclass(slots=True)
class _Booking:
    """Room booked in one ledger until ``until``; ``held`` until it expires."""

    until: float
    size: int
    held: bool = True


@dataclass
class _Ledger:
    """What was booked for answers kept, oldest first, and the sum."""

    kept: deque[_Booking] = field(default_factory=deque)
    total: int = 0

    def spent(self, now: float) -> int:
        while self.kept and self.kept[0].until <= now:
            booking = self.kept.popleft()
            booking.held = False
            self.total -= booking.size
        return self.total

    def room_at(self, now: float, most: int) -> float:
        """When what is booked will be at most ``most`` bytes (``now``
        when it is; bookings are given back oldest first, as :meth:`spent`
        does)."""
        over = self.spent(now) - most
        at = now
        for booking in self.kept:
            if over <= 0:
                break
            at = max(at, booking.until)
            over -= booking.size
        return at

    def book(self, until: float, size: int) -> _Booking:
        booking = _Booking(until, size)
        self.kept.append(booking)
        self.total += size
        return booking

    def rebook(self, booking: _Booking, until: float, size: int) -> None:
        """``booking`` becomes ``size`` bytes until ``until`` (not before
        when it was due: the order of expiry stays safe, room is given back
        late rather than early)."""
        if not booking.held:  # expired while its request ran
            if size > 0:
                self.book(until, size)
            return
        self.total += size - booking.size
        booking.size = size
        booking.until = max(booking.until, until)


@dataclass
class _Hold:
    """One request's room, in each ledger it counts in."""

    bookings: list[tuple[_Ledger, _Booking]]

    def settle(self, until: float, size: int) -> None:
        """Keep ``size`` bytes until ``until`` (0: give it all back)."""
        for ledger, booking in self.bookings:
            ledger.rebook(booking, until, size)


class _Kept(msgspec.Struct):
    fingerprint: str
    status: int
    body: bytes


class Idempotency:
    """See the module docstring."""

    def __init__(
        self,
        store: ChannelStore,
        ttl: float,
        *,
        budget: int = BUDGET,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.budget = budget
        self.clock = clock
        self._ledgers: Lru[str, _Ledger] = Lru(10_000)
        self._all = _Ledger()
        """Everything kept, for a store that keeps only so much."""
        self._people = _Ledger()
        """What participant and observer tokens keep, together."""

    async def once(
        self, grant: Grant, key: str, body: bytes, run: Callable[[], Awaitable[Response]]
    ) -> Response:
        """The answer to the request ``body`` under ``key`` for ``grant``."""
        if not key or len(key) > MAX_KEY or not key.isprintable():
            return _problem(400, f"an Idempotency-Key is 1 to {MAX_KEY} printable characters")
        name = f"idempotency:{grant.token_id}:{key}"
        fingerprint = hashlib.sha256(body).hexdigest()
        kept = await self._kept(name)
        running, mine = name + ":running", secrets.token_hex(8)
        if kept is None and await self.store.claim(running, mine, RUNNING):
            kept = await self._kept(name)
            if kept is None:
                return _problem(409, "a request with this Idempotency-Key is still running; retry")
        if kept is not None:
            if kept.fingerprint != fingerprint:
                return _problem(422, "this Idempotency-Key went with another body")
            return Response(kept.body, status_code=kept.status, media_type="application/json")
        # What keeping its answer may take, booked before it runs (the
        # answer, an envelope, is about the size of the action it carries).
        size = len(name) + len(body) + ANSWER_OVERHEAD
        now = self.clock()
        refusal = self._refusal(grant, now, size)
        if refusal is not None:
            await self.store.claim(running, mine, 0)
            reason, room_at = refusal
            return retry_after(_problem(429, reason), room_at - now)
        ledgers = self._ledgers_of(grant)
        hold = _Hold([(ledger, ledger.book(now + self.ttl, size)) for ledger in ledgers])
        keeping = 0
        try:
            answer = await run()
            if answer.status_code in UNKEPT:
                await self.store.claim(running, mine, 0)  # given up: a retry may run
            else:
                # MessagePack: the answer's bytes as they are (JSON would
                # base64 them, a third more to keep).
                record = msgspec.msgpack.encode(
                    _Kept(fingerprint, answer.status_code, bytes(answer.body))
                )
                await self.store.remember(name, record, self.ttl)
                keeping = len(name) + len(record)
        finally:
            # What is really kept, for as long as the store keeps it: a
            # small answer to a large body (a rejection) keeps little.
            hold.settle(self.clock() + self.ttl, keeping)
        return answer

    def _refusal(self, grant: Grant, now: float, size: int) -> tuple[str, float] | None:
        """Why there is no room for ``size`` more bytes of ``grant``'s, and
        when there will be (None: there is)."""
        person = grant.role != "agent"
        if person:
            room_at = self._ledger(grant).room_at(now, self.budget - size)
            if room_at > now:
                return (
                    f"this token has {self.budget >> 20} MiB of Idempotency-Key answers kept "
                    "already: retry later, or without a key",
                    room_at,
                )
        limit = self.store.remember_limit
        if limit is None:
            return None
        if person:
            room_at = self._people.room_at(now, int(limit * PEOPLE_SHARE) - size)
            if room_at > now:
                return (
                    "the server keeps no more Idempotency-Key answers of participants now: "
                    "retry later, or without a key",
                    room_at,
                )
        room_at = self._all.room_at(now, limit - size)
        if room_at > now:
            # The store keeps no more without forgetting others' answers
            # (whose retries would then run again): nobody gets more room.
            return (
                "the server keeps no more Idempotency-Key answers now: "
                "retry later, or without a key",
                room_at,
            )
        return None

    def _ledgers_of(self, grant: Grant) -> list[_Ledger]:
        """The ledgers ``grant``'s answers count in: a participant's or
        observer's own (an agent has none); for a store that keeps only so
        much, also people's together (not an agent's) and the whole store's."""
        if grant.role == "agent":
            shared = [self._all]
            return shared if self.store.remember_limit is not None else []
        mine = self._ledger(grant)
        if self.store.remember_limit is None:
            return [mine]
        return [mine, self._people, self._all]

    def _ledger(self, grant: Grant) -> _Ledger:
        """The token's account of what it had kept."""
        ledger = self._ledgers.get(grant.budget_key)
        if ledger is None:
            ledger = _Ledger()
            self._ledgers.put(grant.budget_key, ledger)
        return ledger

    async def _kept(self, name: str) -> _Kept | None:
        raw = await self.store.recall(name)
        if raw is None:
            return None
        try:
            return msgspec.msgpack.decode(raw, type=_Kept)
        except msgspec.DecodeError:  # kept by an earlier version, as JSON
            return msgspec.json.decode(raw, type=_Kept)


def _problem(status: int, message: str) -> Response:
    return Response(msgspec.json.encode({"error": message}), status, media_type="application/json")
