"""What both Redis stores share: clients that fail fast, Lua scripts run by
their hash, and Redis's failures mapped to StoreUnavailable.

No retries inside and short timeouts: a dispatch while Redis is away must
fail at once with a clear error, not hang. Blocking reads (pub/sub, BLPOP)
get a client of their own without a socket timeout: redis-py 8 would
otherwise end them after 5 s.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    BusyLoadingError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from server.errors import StoreUnavailable

T = TypeVar("T")

UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    OutOfMemoryError,
    OSError,
)
"""Failures that mean "Redis cannot serve now", as opposed to our bugs."""


def clients(url: str, timeout: float) -> tuple[aioredis.Redis, aioredis.Redis]:
    """A client for ordinary commands and one for blocking reads."""
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    fast = aioredis.Redis.from_url(url, **options)
    blocking = aioredis.Redis.from_url(url, **{**options, "socket_timeout": None})
    return fast, blocking


async def call(awaitable: Awaitable[T]) -> T:
    """Await a Redis command; StoreUnavailable when Redis cannot serve."""
    try:
        return await awaitable
    except UNAVAILABLE as error:
        raise StoreUnavailable(f"redis: {error}") from None


class Scripts:
    """Runs Lua scripts by their SHA, loading one when Redis does not know
    it (first use, or after a restart)."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.shas: dict[str, str] = {}

    async def run(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        try:
            sha = self.shas.get(name)
            if sha is not None:
                try:
                    return await self.client.evalsha(sha, len(keys), *keys, *args)
                except NoScriptError:
                    pass
            self.shas[name] = await self.client.script_load(source)
            return await self.client.evalsha(self.shas[name], len(keys), *keys, *args)
        except UNAVAILABLE as error:
            raise StoreUnavailable(f"redis: {error}") from None
