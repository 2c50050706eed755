"""Stores: the channel log and the small records the host keeps.

:class:`ChannelStore` is the contract; :class:`MemoryStore` is the embedded
default and the Redis store (``server.store.redis``) implements the same
contract for durable, multi-process deployments.
"""

from __future__ import annotations

from server.store.base import ChannelStore, Listener, StoredChannel
from server.store.memory import MemoryStore

__all__ = ["ChannelStore", "Listener", "MemoryStore", "StoredChannel"]
