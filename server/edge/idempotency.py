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
What is booked counts for ``ttl``:

- per participant or observer token (a shared link's browsers count as
  the link), at most ``1/TOKEN_PARTS`` of the people's pool (and never
  more than ``budget``), and per session (a token's sessions, as its grant
  names them) at most ``1/SESSION_PARTS`` of it, whichever tokens of it
  book: so one token, or one session's tokens together, never fill what
  the others of other sessions may keep. These counts are kept in the
  store (server.store.base.ChannelStore.tally), so every process of a
  cluster counts the same bytes; agent tokens are trusted and have no
  budget of their own. The people's pool is ``pool`` when given, else
  ``PEOPLE_SHARE`` of what the store keeps at most, else ``POOL``;
- a store that keeps only so much (the memory store: ``remember_limit``)
  is never asked to keep more, whoever asks, since it would forget the
  oldest answers and their retries would run again; and of that room,
  participant and observer tokens together may take at most
  ``PEOPLE_SHARE``. The rest is the agents' reserve: people cannot crowd
  an agent out, however many tokens they hold, and an agent's request is
  refused for want of room only when agents' own answers leave it none in
  the reserve. A store that bounds nothing itself (Redis: its
  ``maxmemory`` is the operator's) has only the tokens' and sessions'
  budgets.

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
from typing import Final, Protocol

import msgspec
from starlette.responses import Response

from server.auth import Grant
from server.edge.headers import retry_after

MAX_KEY: Final = 200
"""Characters of an ``Idempotency-Key``."""
RUNNING: Final = 10.0
"""Seconds a first request holds its key while it runs."""
UNKEPT: Final = frozenset({429, 503})
"""Answers that say "not done, try again": a retry runs."""
ANSWER_OVERHEAD: Final = 4096
"""Bytes an answer may take beyond its request's body (envelope fields)."""
BUDGET: Final = 16 << 20
"""Bytes of kept answers one token may have within the ttl, at most."""
POOL: Final = 256 << 20
"""The people's pool for a store that bounds nothing itself (Redis)."""
TOKEN_PARTS: Final = 16
"""One token may keep at most this part of the people's pool."""
SESSION_PARTS: Final = 4
"""One session's tokens together may keep at most this part of it."""
PEOPLE_SHARE: Final = 0.5
"""Of what a store keeps at most, the part that participant and observer
tokens' answers may take together; the rest is kept for agent tokens'."""


class Memory(Protocol):
    """Where the ledger keeps its records, shared by every process: the
    channel store's (server.store.base.ChannelStore)."""

    @property
    def remember_limit(self) -> int | None: ...

    async def claim(self, key: str, owner: str, ttl: float) -> str | None: ...

    async def remember(self, key: str, value: bytes, ttl: float) -> None: ...

    async def recall(self, key: str) -> bytes | None: ...

    async def tally(self, key: str, size: int, most: int, ttl: float) -> float: ...


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
        store: Memory,
        ttl: float,
        *,
        budget: int = BUDGET,
        pool: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.budget = budget
        self.pool = pool
        """The people's pool (None: from the store's bound, else POOL)."""
        self.clock = clock
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
        counts = await self._book_counts(grant, size)
        if isinstance(counts, tuple):
            await self.store.claim(running, mine, 0)
            reason, wait = counts
            return retry_after(_problem(429, reason), wait)
        now = self.clock()
        refusal = self._refusal(grant, now, size)
        if refusal is not None:
            await self._give_back(counts, size)
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
            await self._give_back(counts, size - keeping)
        return answer

    @property
    def people_pool(self) -> int:
        """Bytes that participant and observer tokens may keep together."""
        if self.pool is not None:
            return self.pool
        limit = self.store.remember_limit
        return POOL if limit is None else int(limit * PEOPLE_SHARE)

    def _counts_of(self, grant: Grant) -> list[tuple[str, int, str]]:
        """The store's counts ``grant``'s answers are booked in, with their
        bounds and the refusal's words (an agent's: none)."""
        if grant.role == "agent":
            return []
        pool = self.people_pool
        token = min(self.budget, pool // TOKEN_PARTS)
        scope = "*" if grant.sessions is None else "\n".join(sorted(grant.sessions))
        return [
            (
                f"idempotency-token:{grant.budget_key}",
                token,
                f"this token has {token >> 10} KiB of Idempotency-Key answers kept already",
            ),
            (
                f"idempotency-session:{hashlib.sha256(scope.encode()).hexdigest()[:32]}",
                pool // SESSION_PARTS,
                "this session's tokens have their part of Idempotency-Key answers kept already",
            ),
        ]

    async def _book_counts(self, grant: Grant, size: int) -> list[str] | tuple[str, float]:
        """Book ``size`` bytes in each of ``grant``'s counts: the keys booked,
        or why not and for how long (then nothing stays booked)."""
        booked: list[str] = []
        for key, most, reason in self._counts_of(grant):
            wait = await self.store.tally(key, size, most, self.ttl)
            if wait > 0:
                await self._give_back(booked, size)
                return f"{reason}: retry later, or without a key", wait
            booked.append(key)
        return booked

    async def _give_back(self, keys: list[str], size: int) -> None:
        if size > 0:
            for key in keys:
                await self.store.tally(key, -size, 0, self.ttl)

    def _refusal(self, grant: Grant, now: float, size: int) -> tuple[str, float] | None:
        """Why there is no room for ``size`` more bytes of ``grant``'s, and
        when there will be (None: there is)."""
        person = grant.role != "agent"
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
        """The ledgers of this process ``grant``'s answers count in, for a
        store that keeps only so much (one process's memory): people's
        together (not an agent's) and the whole store's."""
        if self.store.remember_limit is None:
            return []
        return [self._all] if grant.role == "agent" else [self._people, self._all]

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
