"""Submissions that count once over HTTP: ``Idempotency-Key``.

A ``POST /api/dispatch`` that carries ``Idempotency-Key: K`` is answered
once per token and key: the first request runs and its answer (status and
body) is kept in the store for ``ttl`` seconds; a retry with the same key
and the same body gets that answer again and applies nothing. The same key
with another body is 422; a retry while the first is still running is 409
(try again). Answers that mean "not done, try again" (429, 503) are not
kept, so a retry runs. The WebSocket's counterpart is the store's
``(clientId, clientSeq)`` check on every append.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Awaitable, Callable
from typing import Final

import msgspec
from starlette.responses import Response

from server.auth import Grant
from server.store.base import ChannelStore

MAX_KEY: Final = 200
"""Characters of an ``Idempotency-Key``."""
RUNNING: Final = 10.0
"""Seconds a first request holds its key while it runs."""
UNKEPT: Final = frozenset({429, 503})
"""Answers that say "not done, try again": a retry runs."""


class _Kept(msgspec.Struct):
    fingerprint: str
    status: int
    body: bytes


class Idempotency:
    """See the module docstring."""

    def __init__(self, store: ChannelStore, ttl: float) -> None:
        self.store = store
        self.ttl = ttl

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
        answer = await run()
        if answer.status_code in UNKEPT:
            await self.store.claim(running, mine, 0)  # given up: a retry may run
        else:
            record = _Kept(fingerprint, answer.status_code, bytes(answer.body))
            await self.store.remember(name, msgspec.json.encode(record), self.ttl)
        return answer

    async def _kept(self, name: str) -> _Kept | None:
        raw = await self.store.recall(name)
        return None if raw is None else msgspec.json.decode(raw, type=_Kept)


def _problem(status: int, message: str) -> Response:
    return Response(msgspec.json.encode({"error": message}), status, media_type="application/json")
