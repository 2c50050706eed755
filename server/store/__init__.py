"""Stores: the channel log and the small records the host keeps.

:class:`ChannelStore` is the contract; :class:`MemoryStore` is the embedded
default and the Redis store (``server.store.redis``) implements the same
contract for durable, multi-process deployments, on one Redis or a Redis
Cluster. :func:`open_channel_store` opens the store a ``--store`` value
names (``server.build.turn_store_at`` the runner's beside it).
"""

from __future__ import annotations

from server.store.base import ChannelStore, Listener, StoredChannel
from server.store.memory import MemoryStore

__all__ = [
    "ChannelStore",
    "Listener",
    "MemoryStore",
    "StoredChannel",
    "open_channel_store",
]

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")
"""The URLs of the Redis stores (see ``server.store.redis_link``)."""


def open_channel_store(
    url: str, *, retention: int = 1000, retention_bytes: int = 8 << 20
) -> ChannelStore:
    """The channel store ``url`` names: ``memory``, a Redis URL or a Redis
    Cluster URL (``redis+cluster://host:port[,host:port...]``); ValueError
    for anything else. ``retention`` is the replay window per channel (and
    ``retention_bytes`` its size, for the memory store; Redis trims by
    count)."""
    if url == "memory":
        return MemoryStore(retention=retention, retention_bytes=retention_bytes)
    if url.startswith(REDIS_SCHEMES):
        from server.store.redis import RedisStore

        return RedisStore(url, retention=retention)
    raise ValueError(f"unknown store {url!r} (use memory, redis://... or redis+cluster://...)")
