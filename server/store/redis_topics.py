"""Sharded pub/sub: the topics this process watches, and nothing else.

Each watched topic is ``SSUBSCRIBE``d on the node that serves its slot (on a
single Redis, the one node), over one connection per node kept for that
alone, so a node's pub/sub traffic stays on that node and a process hears
only what it asked for. redis-py's own cluster pub/sub polls its node
connections in turn; this keeps one reader per node instead, and says when
a subscription is confirmed, which :meth:`Topics.watch` waits for: from
then on, every message published on the topic reaches this process.

A node connection that fails (the node died, a failover, a network cut, an
error reply such as MOVED after a slot moved) is dropped, and so is a topic
that its node unsubscribes by itself (its slot moved away). A single repair
task then reads the slot map again, subscribes every such topic on the node
that serves it now, retrying with backoff, and once every watched topic is
confirmed again calls ``resubscribed``: messages may have been lost in
between, so the caller compares with the store. A node connection that
stays silent is pinged after ``PING_EVERY`` seconds of quiet and dropped
when the answer does not come within the timeout (a node that hangs, or a
network that drops packets without closing the connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import RedisError

from server.errors import StoreUnavailable
from server.store.redis_link import UNAVAILABLE, RedisLink

log = logging.getLogger("huddle.store.redis")

PING_EVERY = 5.0
"""Seconds of quiet on a node connection before it is pinged."""


@dataclass(eq=False)
class _Want:
    """A watched topic: the node it was sent to, and whether it is confirmed."""

    node: _Node | None = None
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Node:
    """One connection to one node, subscribed to the topics it serves."""

    name: str
    connection: AbstractConnection
    topics: set[str] = field(default_factory=set)
    joining: Counter[str] = field(default_factory=Counter)
    """SSUBSCRIBEs sent and not yet confirmed, by topic."""
    leaving: Counter[str] = field(default_factory=Counter)
    """SUNSUBSCRIBEs sent and not yet confirmed, by topic."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    heard_at: float = 0.0
    lost: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class Topics:
    """See the module docstring. ``on_message(topic, data)`` is called for
    every message on a watched topic, ``resubscribed()`` after a repair."""

    def __init__(
        self,
        link: RedisLink,
        on_message: Callable[[str, bytes], None],
        resubscribed: Callable[[], None],
    ) -> None:
        self.link = link
        self.timeout = link.timeout
        self.ping_every = PING_EVERY
        self.on_message = on_message
        self.resubscribed = resubscribed
        self._wanted: dict[str, _Want] = {}
        self._nodes: dict[str, _Node] = {}
        self._connecting = asyncio.Lock()
        self._repair: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def watch(self, topic: str) -> None:
        """Subscribe to ``topic`` and return once Redis confirmed it
        (at once when it already is). Raises StoreUnavailable when that
        does not happen within the timeout; a topic this call added is then
        not watched."""
        want = self._wanted.get(topic)
        fresh = want is None
        if want is None:
            want = self._wanted[topic] = _Want()
        try:
            if want.node is None:
                await self._assign(topic, want)
            async with asyncio.timeout(self.timeout):
                await want.confirmed.wait()
            if self._wanted.get(topic) is not want:
                raise StoreUnavailable(f"redis: {topic} was given up meanwhile")
        except (StoreUnavailable, TimeoutError) as error:
            if fresh and self._wanted.get(topic) is want:
                await self.unwatch(topic)
            if isinstance(error, StoreUnavailable):
                raise
            raise StoreUnavailable(f"redis: no subscription to {topic} yet") from None

    async def unwatch(self, topic: str) -> None:
        """Stop hearing ``topic`` (at once: later messages are dropped)."""
        want = self._wanted.pop(topic, None)
        if want is None:
            return
        want.confirmed.set()  # wakes a watch() waiting on it
        node = want.node
        if node is not None and not node.lost:
            node.topics.discard(topic)
            node.leaving[topic] += 1
            await self._send(node, "SUNSUBSCRIBE", topic)

    @property
    def _repairing(self) -> bool:
        return self._repair is not None and not self._repair.done()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ─── Subscribing ─────────────────────────────────────────────────────

    async def _assign(self, topic: str, want: _Want) -> None:
        """Send SSUBSCRIBE for ``topic`` to the node that serves it."""
        name, connect = await self.link.node_for(topic)
        node = await self._node(name, connect)
        if want.node is not None or self._wanted.get(topic) is not want:
            return  # done meanwhile (by the repair), or unwatched
        want.node = node
        node.topics.add(topic)
        node.joining[topic] += 1
        await self._send(node, "SSUBSCRIBE", topic)
        if node.lost and want.node is node:
            # Lost before we sent (a loss while sending hands the topic to
            # the repair): this attempt failed.
            want.node = None
            raise StoreUnavailable(f"redis: the connection to {node.name} was lost")

    async def _node(self, name: str, connect: Callable[[], AbstractConnection]) -> _Node:
        async with self._connecting:
            node = self._nodes.get(name)
            if node is not None and not node.lost:
                return node
            connection = connect()
            try:
                await connection.connect()  # type: ignore[no-untyped-call]
            except (*UNAVAILABLE, RedisError) as error:
                with contextlib.suppress(Exception):
                    await connection.disconnect()
                raise StoreUnavailable(f"redis: {error}") from None
            node = _Node(name, connection, heard_at=asyncio.get_running_loop().time())
            node.tasks = [
                asyncio.create_task(self._read(node)),
                asyncio.create_task(self._ping(node)),
            ]
            self._nodes[name] = node
            return node

    async def _send(self, node: _Node, *args: Any) -> None:
        """Send a command on ``node``; a failure drops the node (and its
        topics go to the repair)."""
        try:
            if not node.connection.is_connected:
                # Never reconnect under the reader's feet: start over instead.
                raise ConnectionError("the connection was closed")
            async with node.lock:
                await node.connection.send_command(*args)
        except (*UNAVAILABLE, RedisError) as error:
            log.info("pub/sub on %s lost (%s)", node.name, error)
            self._drop(node)

    # ─── Reading ─────────────────────────────────────────────────────────

    async def _read(self, node: _Node) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                reply = await node.connection.read_response(timeout=math.inf)
                node.heard_at = loop.time()
                try:
                    self._receive(node, reply)
                except Exception:
                    # One bad message or listener must not end the
                    # subscription for the whole process.
                    log.exception("pub/sub message not delivered")
        except (*UNAVAILABLE, RedisError) as error:
            # An error reply too (MOVED: the slot is elsewhere now): which
            # command it answers is not said, so start this node over.
            log.info("pub/sub on %s lost (%s)", node.name, error)
        finally:
            self._drop(node)

    def _receive(self, node: _Node, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return  # PONG
        kind, raw_topic, data = reply[0], reply[1], reply[2]
        topic = raw_topic.decode() if isinstance(raw_topic, bytes) else str(raw_topic)
        want = self._wanted.get(topic)
        if kind == b"smessage":
            if want is not None:
                self.on_message(topic, data)
        elif kind == b"ssubscribe":
            if node.joining[topic] > 1:
                node.joining[topic] -= 1
                return  # a later SSUBSCRIBE of it is still on its way
            node.joining.pop(topic, None)
            if want is not None and want.node is node:
                want.confirmed.set()
            elif topic not in node.topics and not node.leaving[topic]:
                # Unwatched while on its way, and not left since: leave it.
                node.leaving[topic] += 1
                self._spawn(self._send(node, "SUNSUBSCRIBE", topic))
        elif kind == b"sunsubscribe":
            if node.leaving[topic] > 1:
                node.leaving[topic] -= 1
                return
            if node.leaving.pop(topic, 0):
                return  # the answer to our own SUNSUBSCRIBE
            if want is not None and want.node is node:
                # The node let go by itself: the topic's slot moved away.
                node.topics.discard(topic)
                want.node = None
                want.confirmed.clear()
                self._start_repair()

    async def _ping(self, node: _Node) -> None:
        """Drop ``node`` when it stays silent past a ping."""
        loop = asyncio.get_running_loop()
        while not node.lost:
            await asyncio.sleep(max(0.0, node.heard_at + self.ping_every - loop.time()))
            if loop.time() - node.heard_at < self.ping_every * 0.99:
                continue  # heard from meanwhile
            sent = loop.time()
            await self._send(node, "PING")
            await asyncio.sleep(self.timeout)
            if node.heard_at < sent:
                log.info("pub/sub on %s silent past a ping; reconnecting", node.name)
                self._drop(node)

    # ─── Repair ──────────────────────────────────────────────────────────

    def _drop(self, node: _Node) -> None:
        """Forget ``node``: its topics go to the repair."""
        if node.lost:
            return
        node.lost = True
        if self._nodes.get(node.name) is node:
            del self._nodes[node.name]
        current = asyncio.current_task()
        for task in node.tasks:
            if task is not current:
                task.cancel()
        self._spawn(_close(node.connection))
        orphaned = False
        for topic in node.topics:
            want = self._wanted.get(topic)
            if want is not None and want.node is node:
                want.node = None
                want.confirmed.clear()
                orphaned = True
        if orphaned:
            self._start_repair()

    def _start_repair(self) -> None:
        if not self._closed and not self._repairing:
            self._repair = asyncio.get_running_loop().create_task(self._repair_all())

    async def _repair_all(self) -> None:
        """Subscribe every watched topic that has no node, until all are
        confirmed; then tell the caller."""
        delay = 0.05
        while True:
            try:
                await self.link.read_slots_now()
                for topic, want in list(self._wanted.items()):
                    if want.node is None and self._wanted.get(topic) is want:
                        await self._assign(topic, want)
                sent = [w.confirmed.wait() for w in self._wanted.values() if w.node is not None]
                async with asyncio.timeout(self.timeout):
                    await asyncio.gather(*sent)
                if all(w.node is not None and w.confirmed.is_set() for w in self._wanted.values()):
                    break
            except (StoreUnavailable, TimeoutError) as error:
                log.info("pub/sub not back yet (%s); retrying", error)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        log.info("pub/sub back: %d topic(s) subscribed", len(self._wanted))
        self.resubscribed()

    async def close(self) -> None:
        self._closed = True
        if self._repair is not None:
            self._repair.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._repair
        for node in list(self._nodes.values()):
            node.lost = True
            for task in node.tasks:
                task.cancel()
            for task in node.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await _close(node.connection)
        self._nodes.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


async def _close(connection: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await connection.disconnect()
