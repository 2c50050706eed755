"""What both Redis stores share: one Redis or a Redis Cluster, reached by
clients that fail fast, Lua scripts run by their hash, and Redis's failures
mapped to StoreUnavailable.

A store URL names the deployment::

    redis://[user:password@]host:port[/db]        one Redis (also rediss://,
    unix:///path/to/redis.sock                    and unix sockets)
    redis+cluster://[user:password@]host:port[,host:port...]
                                                  a Redis Cluster: any of its
    rediss+cluster://...                          nodes (the rest are found),
                                                  over TLS with rediss

Either may end in ``?replicas=N``: a write is acknowledged only once N
replicas of its node have it (``WAIT N``), so that a failover to one of them
cannot lose it; the write fails with StoreUnavailable when they do not
confirm in time (it may then have happened or not, as after any timeout).
Other query options of a single Redis's URL go to redis-py.

No retries inside and short timeouts: a dispatch while Redis is away must
fail at once with a clear error, not hang; a command is never sent twice by
the client library, so a failed append never lands twice. Blocking reads
(BLPOP) get a client of their own without a socket timeout: redis-py 8
would otherwise end them after 5 s. On a single Redis, scripts and blocking
reads go on connections of the link's own (:class:`Lane`), which skip
redis-py's pool: the pool's bookkeeping is most of a command's cost in
this process after a pause, and a resume's path holds two or three.

On a cluster every command goes to the primary of its keys' slot, and a
batch is sent as one pipeline per primary, so a node that fails fails only
the calls that went to it. After a failure the slot map is read again in
the background (a failover moved the slots to a promoted replica), so the
next call goes to the new primary. Scripts run by their SHA1; a node that
does not know one (a restart, a replica promoted, a node added) answers
NOSCRIPT and the call is sent again with the script's source, which that
node then keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from server.errors import StoreUnavailable

log = logging.getLogger("huddle.store.redis")

T = TypeVar("T")

UNAVAILABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    BusyLoadingError,
    ReadOnlyError,
    OutOfMemoryError,
    ClusterDownError,
    TryAgainError,
    ClusterError,
    SlotNotCoveredError,
    OSError,
)
"""Failures that mean "Redis cannot serve now", as opposed to our bugs."""

CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
"""Cluster URL schemes, and whether they use TLS."""


class Script:
    """A Lua script, run by its SHA1 (computed here: no round trip)."""

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


@dataclass(frozen=True)
class Target:
    """A store URL, parsed: one Redis (``url``) or a cluster (``nodes``)."""

    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    replicas: int = 0

    @property
    def is_cluster(self) -> bool:
        return bool(self.nodes)


def parse_target(url: str) -> Target:
    """Parse a store URL (see the module docstring); ValueError if malformed."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    replicas = 0
    rest: list[tuple[str, str]] = []
    for name, value in query:
        if name == "replicas":
            replicas = int(value)
            if replicas < 0:
                raise ValueError(f"replicas must be 0 or more, not {value}")
        else:
            rest.append((name, value))
    if parts.scheme not in CLUSTER_SCHEMES:
        # The URL as written, less our own option: rebuilding it from its
        # parts would turn ``unix:///path`` into ``unix:/path``, which
        # redis-py (8.2 on) refuses.
        base = url.partition("?")[0]
        plain = f"{base}?{urlencode(rest)}" if rest else base
        return Target(url=plain, replicas=replicas)
    if rest:
        raise ValueError(f"unknown cluster URL option {rest[0][0]!r} (only replicas=N)")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    nodes = tuple(_host_port(item) for item in hosts.split(",") if item)
    if not nodes:
        raise ValueError(f"{url!r} names no cluster node")
    return Target(
        url=url,
        nodes=nodes,
        tls=CLUSTER_SCHEMES[parts.scheme],
        username=unquote(username) or None,
        password=unquote(password) or None,
        replicas=replicas,
    )


def _host_port(item: str) -> tuple[str, int]:
    host, sep, port = item.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"cluster node {item!r} is not host:port")
    return host.strip("[]"), int(port)


Call = tuple[Sequence[str], Sequence[Any]]
"""A script's keys and arguments."""

IDLE_LANE_CONNECTIONS = 16
"""Connections a :class:`Lane` keeps open between commands (more are opened
while more commands are in flight, up to the pool's ``max_connections``, and
closed after them)."""


class Lane:
    """Commands to a single Redis on connections of its own, one command in
    flight on each: redis-py's connection (its handshake, encoding and reply
    parsing) without its pool. After a pause, as a person's answer comes,
    redis-py 8's pool costs about 130 us more per command than this (a lock
    at get and at release, a read to check the connection, metrics records,
    a task at each release and at each send with a socket timeout), and a
    resume makes two or three such commands on its path.

    ``timeout`` bounds a command's send and reply together (None: only the
    caller's own bound, as for a blocking read). Nothing is retried. A
    connection whose reply was not read whole (a timeout, a cancel, a lost
    socket) is closed, never used again: the late reply would answer the
    next command."""

    def __init__(self, pool: ConnectionPool, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._idle: list[AbstractConnection] = []
        self._open: set[AbstractConnection] = set()
        # As many in flight as the pool would open (its max_connections,
        # 100 unless the URL says): more wait for one, within the timeout.
        self._slots = asyncio.Semaphore(pool.max_connections)
        self._closed = False

    async def execute(self, *args: Any) -> Any:
        """Send one command and return its reply (a ResponseError raised)."""
        [reply] = await self.execute_many([args])
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def execute_many(self, commands: Sequence[Sequence[Any]]) -> list[Any]:
        """Send ``commands`` in one write on one connection and read their
        replies, in order (a pipeline); an error reply is its command's
        result, as a pipeline's with ``raise_on_error=False``."""
        try:
            async with asyncio.timeout(self._timeout), self._slots:
                connection = await self._connection()
                try:
                    if len(commands) == 1:
                        packed = connection.pack_command(*commands[0])
                    else:
                        packed = connection.pack_commands(commands)
                except BaseException:
                    await self._put_back(connection)  # nothing was sent on it
                    raise
                try:
                    await connection.connect()  # type: ignore[no-untyped-call]  # at once when connected
                    await connection.send_packed_command(packed, check_health=False)
                    replies: list[Any] = []
                    for _ in commands:
                        try:
                            replies.append(await connection.read_response())
                        except ResponseError as error:  # read whole: the connection is sound
                            replies.append(error)
                except BaseException:
                    await self._drop(connection)
                    raise
                await self._put_back(connection)
        except TimeoutError:
            raise RedisTimeoutError(f"no reply within {self._timeout}s") from None
        return replies

    async def _connection(self) -> AbstractConnection:
        """An idle connection that Redis has not closed meanwhile (a
        restart; its end was read by the event loop as the connection
        idled: nothing sent on it would arrive), or a new one."""
        while self._idle:
            connection = self._idle.pop()
            # redis-py's stream (tests.test_redis_lane checks that it is
            # there: without it, every command would open a connection).
            reader = getattr(connection, "_reader", None)
            if reader is not None and not reader.at_eof() and reader.exception() is None:
                return connection
            await self._drop(connection)
        options = {**self._pool.connection_kwargs, "socket_timeout": None}
        connection = self._pool.connection_class(**options)
        self._open.add(connection)
        return connection

    async def _put_back(self, connection: AbstractConnection) -> None:
        if not self._closed and len(self._idle) < IDLE_LANE_CONNECTIONS:
            self._idle.append(connection)
        else:
            await self._drop(connection)

    async def _drop(self, connection: AbstractConnection) -> None:
        """Close ``connection`` without waiting for the close (the caller
        has its reply, or an error of its own to raise)."""
        self._open.discard(connection)
        with contextlib.suppress(Exception):
            await connection.disconnect(nowait=True)

    @property
    def connections(self) -> int:
        """Connections open now (idle, or with a command in flight)."""
        return len(self._open)

    async def close(self) -> None:
        """Close every connection; one a command still in flight opens
        is closed as that command ends."""
        self._closed = True
        self._idle.clear()
        while self._open:
            await self._drop(next(iter(self._open)))


class RedisLink:
    """The clients of one deployment (a Redis or a cluster), as a store uses
    them: ``client`` for ordinary commands, ``blocking`` for blocking reads,
    scripts run with :meth:`run` and :meth:`run_batch`, and for pub/sub a
    connection to the node that serves a key (:meth:`node_for`)."""

    def __init__(self, url: str, timeout: float) -> None:
        self.target = parse_target(url)
        self.timeout = timeout
        self.replicas = self.target.replicas
        self.cluster: RedisCluster | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self.healthy = asyncio.Event()
        """Clear while a cluster's slot map is being read again after a
        failure (see :meth:`refresh_slots`); set otherwise."""
        self.healthy.set()
        options: dict[str, Any] = {
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        if self.target.is_cluster:
            self.cluster = self._cluster(options)
            self.client: aioredis.Redis | RedisCluster = self.cluster
            self.blocking: aioredis.Redis | RedisCluster = self._cluster(
                {**options, "socket_timeout": None}
            )
            self._pool: ConnectionPool | None = None
            self._lane: Lane | None = None
            self._blocking_lane: Lane | None = None
        else:
            plain = self.target.url
            client = aioredis.Redis.from_url(plain, **options)
            blocking = aioredis.Redis.from_url(plain, **{**options, "socket_timeout": None})
            self.client, self.blocking = client, blocking
            self._lane = Lane(client.connection_pool, timeout)
            self._blocking_lane = Lane(blocking.connection_pool, None)
            # Pub/sub connections speak RESP2: its replies come back as plain
            # arrays, not as RESP3 pushes that redis-py would hand elsewhere.
            self._pool = ConnectionPool.from_url(plain, **{**options, "protocol": 2})

    def _cluster(self, options: dict[str, Any]) -> RedisCluster:
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in self.target.nodes],
            ssl=self.target.tls,
            username=self.target.username,
            password=self.target.password,
            **options,
        )

    # ─── Calls ───────────────────────────────────────────────────────────

    async def call(self, awaitable: Awaitable[T]) -> T:
        """Await a command; StoreUnavailable when Redis cannot serve (and on
        a cluster, the slot map is read again meanwhile)."""
        try:
            return await awaitable
        except UNAVAILABLE as error:
            self.refresh_slots()
            raise StoreUnavailable(f"redis: {error}") from None

    async def run(
        self, script: Script, keys: Sequence[str], args: Sequence[Any], *, replicate: bool = True
    ) -> Any:
        """Run ``script``. With ``replicate`` (a write whose loss in a
        failover would lose something acknowledged) it waits for the
        ``replicas`` the URL asks for; reads, and writes that are harmless
        to lose, pass False."""
        if replicate and self.replicas:
            [result] = await self.run_batch(script, [(keys, args)])
            if isinstance(result, BaseException):
                raise result
            return result
        lane = self._lane
        try:
            if lane is None:
                return await self.call(self.client.evalsha(script.sha, len(keys), *keys, *args))
            return await self.call(lane.execute("EVALSHA", script.sha, len(keys), *keys, *args))
        except NoScriptError:
            if lane is None:
                return await self.call(self.client.eval(script.source, len(keys), *keys, *args))
            return await self.call(lane.execute("EVAL", script.source, len(keys), *keys, *args))

    async def blpop(self, keys: Sequence[str], seconds: float) -> Any:
        """BLPOP ``keys`` for up to ``seconds``: ``[key, item]`` or
        None. No bound of its own: the caller's (the blocking client has no
        socket timeout)."""
        if self._blocking_lane is None:
            return await self.call(self.blocking.blpop(keys, timeout=seconds))
        return await self.call(self._blocking_lane.execute("BLPOP", *keys, seconds))

    async def run_batch(self, script: Script, calls: Sequence[Call]) -> list[Any]:
        """Run ``script`` once per call (writes: they wait for ``replicas``),
        pipelined, one pipeline per node. Each result is the script's reply
        or a StoreUnavailable (for the calls of a node that failed; the
        others are unaffected)."""
        if len(calls) == 1 and self.cluster is None and not self.replicas:
            return [await self._one(script, calls[0])]
        results: list[Any] = [None] * len(calls)
        groups: dict[str, list[int]] = {}
        nodes: dict[str, ClusterNode | None] = {}
        for index, (keys, _) in enumerate(calls):
            try:
                node = await self._node_of(keys[0])
            except StoreUnavailable as error:
                results[index] = error
                continue
            name = "" if node is None else node.name
            nodes[name] = node
            groups.setdefault(name, []).append(index)

        async def one(name: str, indices: list[int]) -> None:
            try:
                out = await self._pipeline(script, [calls[i] for i in indices], nodes[name])
            except StoreUnavailable as error:
                out = [error] * len(indices)
            for index, result in zip(indices, out, strict=True):
                results[index] = result

        if len(groups) == 1:  # one node (a single Redis, always): no task of its own
            [(name, indices)] = groups.items()
            await one(name, indices)
        else:
            await asyncio.gather(*(one(name, indices) for name, indices in groups.items()))
        return results

    async def _one(self, script: Script, call: Call) -> Any:
        """A batch of one on a single Redis with no replicas to wait for:
        the command alone, as :meth:`run` sends it, answered as a batch's
        call is (its error as its result). A pipeline of one costs redis-py
        a third more CPU than the command (about 35 us an append here)."""
        keys, args = call
        try:
            return await self.run(script, keys, args)
        except StoreUnavailable as error:
            return error
        except RedisError as error:
            return StoreUnavailable(f"redis: {error}")

    async def write(self, key: str, build: Callable[[Any], None]) -> list[Any]:
        """Send the commands ``build`` adds to a pipeline, all on ``key``'s
        node, and wait for ``replicas``; raises StoreUnavailable."""
        node = await self._node_of(key)
        pipe = self.client.pipeline(transaction=False)
        build(pipe)
        out = await self._execute(pipe, node, redirect=False)
        for result in out:
            if isinstance(result, MovedError):
                self.refresh_slots()
            if isinstance(result, (MovedError, *UNAVAILABLE)):
                raise StoreUnavailable(f"redis: {result}")
            if isinstance(result, BaseException):
                raise result
        return out

    async def _node_of(self, key: str) -> ClusterNode | None:
        if self.cluster is None:
            return None
        await self.call(self.cluster.initialize())
        try:
            return self.cluster.get_node_from_key(key)
        except SlotNotCoveredError as error:
            self.refresh_slots()
            raise StoreUnavailable(f"redis: {error}") from None

    async def _pipeline(
        self, script: Script, calls: list[Call], node: ClusterNode | None
    ) -> list[Any]:
        results = await self._send(script, calls, node, by_source=False)
        unknown = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if unknown:
            # This node lost the script (a restart, a promoted replica):
            # nothing of those calls ran; send their source, which it keeps.
            again = await self._send(script, [calls[i] for i in unknown], node, by_source=True)
            for index, result in zip(unknown, again, strict=True):
                results[index] = result
        if any(isinstance(result, MovedError) for result in results):
            self.refresh_slots()  # the slot moved; nothing of those calls ran
        return [
            StoreUnavailable(f"redis: {result}") if isinstance(result, RedisError) else result
            for result in results
        ]

    async def _send(
        self, script: Script, calls: list[Call], node: ClusterNode | None, *, by_source: bool
    ) -> list[Any]:
        command, body = ("EVAL", script.source) if by_source else ("EVALSHA", script.sha)
        if self._lane is not None:
            commands = [(command, body, len(keys), *keys, *args) for keys, args in calls]
            if self.replicas:
                commands.append(("WAIT", self.replicas, self._wait_ms))  # on the same connection
            return self._acked(await self.call(self._lane.execute_many(commands)))
        pipe = self.client.pipeline(transaction=False)
        # By name: the cluster pipeline refuses its evalsha() method, though
        # it routes the command by its keys like any other.
        for keys, args in calls:
            pipe.execute_command(command, body, len(keys), *keys, *args)
        # No redirects: a redirected command would go on another connection,
        # which the WAIT below does not cover.
        return await self._execute(pipe, node, redirect=False)

    @property
    def _wait_ms(self) -> int:
        return max(1, int(self.timeout * 500))  # half the socket timeout

    async def _execute(self, pipe: Any, node: ClusterNode | None, *, redirect: bool) -> list[Any]:
        """Execute ``pipe`` (every error as a result) and WAIT for
        ``replicas`` after it (see :meth:`_acked`)."""
        if self.replicas:
            # WAIT counts this connection's writes: it goes to the same node,
            # which a pipeline sends on one connection, in order.
            where = {} if node is None else {"target_nodes": node}
            pipe.execute_command("WAIT", self.replicas, self._wait_ms, **where)
        if isinstance(pipe, Pipeline):
            out: list[Any] = await self.call(pipe.execute(raise_on_error=False))
        else:
            out = await self.call(pipe.execute(raise_on_error=False, allow_redirections=redirect))
        return self._acked(out)

    def _acked(self, out: list[Any]) -> list[Any]:
        """``out`` without its last reply, a WAIT's when ``replicas`` are
        asked for: a failed WAIT turns each result into a StoreUnavailable."""
        if not self.replicas:
            return out
        acked = out.pop()
        if isinstance(acked, BaseException) or int(acked) < self.replicas:
            reached = f"{acked} of {self.replicas} replica(s) in {self._wait_ms} ms"
            failure = StoreUnavailable(f"redis: a write reached {reached}")
            out = [r if isinstance(r, BaseException) else failure for r in out]
        return out

    # ─── The cluster's shape ─────────────────────────────────────────────

    def refresh_slots(self) -> None:
        """After a failure on a cluster: read the slot map again, in the
        background, until every primary in it answers (a failover moves
        slots to a promoted replica; the old primary may not answer until
        then). ``healthy`` is clear meanwhile."""
        if self.cluster is None:
            return
        self.healthy.clear()
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    async def _refresh(self) -> None:
        assert self.cluster is not None
        delay = 0.05
        while True:
            with contextlib.suppress(*UNAVAILABLE, RedisError, RedisClusterException):
                await self.cluster.nodes_manager.initialize()
                if await self.cluster.ping(target_nodes=RedisCluster.PRIMARIES):
                    self.healthy.set()
                    return
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def node_for(self, key: str) -> tuple[str, Callable[[], AbstractConnection]]:
        """The name of the node that serves ``key`` (the primary of its
        slot), and how to open a connection of one's own to it (RESP2, for
        pub/sub). Raises StoreUnavailable."""
        if self.cluster is None:
            assert self._pool is not None
            return "redis", self._pool.make_connection
        node = await self._node_of(key)
        assert node is not None
        options = {**node.connection_kwargs, "protocol": 2, "retry": Retry(NoBackoff(), 0)}
        return node.name, lambda: node.connection_class(**options)

    async def read_slots_now(self) -> None:
        """Read the cluster's slot map again and wait for it (a no-op on a
        single Redis); raises StoreUnavailable when no node answers."""
        if self.cluster is None:
            return
        try:
            await self.cluster.nodes_manager.initialize()
        except (*UNAVAILABLE, RedisError, RedisClusterException) as error:
            raise StoreUnavailable(f"redis: {error}") from None

    # ─── Health ──────────────────────────────────────────────────────────

    async def ping(self) -> bool:
        """Whether every primary answers."""
        try:
            if self.cluster is not None:
                await self.cluster.initialize()
                return bool(await self.cluster.ping(target_nodes=RedisCluster.PRIMARIES))
            return bool(await self.client.ping())
        except (*UNAVAILABLE, RedisClusterException):
            self.refresh_slots()
            return False

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refreshing
        for lane in (self._lane, self._blocking_lane):
            if lane is not None:
                await lane.close()
        await self.client.aclose()
        await self.blocking.aclose()
        if self._pool is not None:
            await self._pool.disconnect()
