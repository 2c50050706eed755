"""Submissions that count once over HTTP: ``Idempotency-Key``.

A ``POST /api/dispatch`` that carries ``Idempotency-Key: K`` is answered
once per token and key: the first request runs and its answer (status and
body) is kept in the store for ``ttl`` seconds; a retry with the same key
and the same body gets that answer again and applies nothing. The same key
with another body is 422; a retry while the first is still running is 409
(try again). Answers that mean "not done, try again" (429, 503) are not
kept, so a retry runs.

What is kept is bounded per participant or observer token (a shared
link's browsers count as the link): at most ``budget`` bytes of answers
within ``ttl`` in this process; beyond, a request with a key is refused
with 429 before it runs (retry later, or without a key), so nothing is
ever applied twice for want of room. Agent tokens are trusted. A store
that keeps only so much (the memory store: ``remember_limit``) is never
asked to keep more, whoever asks, since it would forget the oldest answers
and their retries would run again.

The WebSocket's counterpart is the store's ``(clientId, clientSeq)`` check
on every append.
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


@dataclass
class _Ledger:
    """What one token has had kept: (until, bytes) in order, and the sum."""

    kept: deque[tuple[float, int]] = field(default_factory=deque)
    total: int = 0

    def spent(self, now: float) -> int:
        while self.kept and self.kept[0][0] <= now:
            self.total -= self.kept.popleft()[1]
        return self.total

    def add(self, until: float, size: int) -> None:
        self.kept.append((until, size))
        self.total += size


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
        # What keeping its answer will take, booked before it runs (the
        # answer, an envelope, is about the size of the action it carries).
        size = len(name) + len(body) + ANSWER_OVERHEAD
        now = self.clock()
        ledger = self._ledger(grant)
        limit = self.store.remember_limit
        if ledger is not None and ledger.spent(now) + size > self.budget:
            await self.store.claim(running, mine, 0)
            return _problem(
                429,
                f"this token has {self.budget >> 20} MiB of Idempotency-Key answers kept "
                "already: retry later, or without a key",
            )
        if limit is not None and self._all.spent(now) + size > limit:
            # The store keeps no more without forgetting others' answers
            # (whose retries would then run again): nobody gets more room.
            await self.store.claim(running, mine, 0)
            return _problem(
                429,
                "the server keeps no more Idempotency-Key answers now: "
                "retry later, or without a key",
            )
        until = now + self.ttl
        self._book(ledger, until, size)
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
            if (more := len(name) + len(record) - size) > 0:
                self._book(ledger, until, more)
        return answer

    def _book(self, ledger: _Ledger | None, until: float, size: int) -> None:
        self._all.add(until, size)
        if ledger is not None:
            ledger.add(until, size)

    def _ledger(self, grant: Grant) -> _Ledger | None:
        """The token's account of what it had kept (None: an agent's)."""
        if grant.role == "agent":
            return None
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
