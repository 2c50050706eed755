"""Real redis-servers for tests: one in its own directory on a unix socket,
or a Redis Cluster on loopback ports; AOF on."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from server.store.redis import RedisStore, topic_of

READY = b"ready to accept connections"


class RedisServer:
    """One redis-server process that can be stopped, killed and restarted
    on the same data directory."""

    def __init__(self, directory: Path, *, appendfsync: str = "always") -> None:
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.appendfsync = appendfsync
        self.process: asyncio.subprocess.Process | None = None
        self._drainer: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> None:
        """Start and wait until it accepts connections (bound it with
        ``asyncio.timeout``)."""
        self.process = await asyncio.create_subprocess_exec(
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        seen = b""
        while READY not in seen.lower():
            line = await self.process.stdout.readline()
            if not line:
                raise RuntimeError("redis-server exited:\n" + seen.decode(errors="replace"))
            seen += line
        # Keep draining its output so that it never blocks on a full pipe.
        self._drainer = asyncio.get_running_loop().create_task(self._drain(self.process))

    @staticmethod
    async def _drain(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while await process.stdout.readline():
            pass

    async def stop(self) -> None:
        """SHUTDOWN as an operator would (SIGTERM): AOF is flushed."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await self.process.wait()

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def running_redis(start_timeout: float) -> AsyncIterator[RedisServer]:
    """A started redis-server in a fresh short directory (unix socket paths
    are limited to 107 bytes), killed and removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="huddle-redis-", dir="/tmp"))
    server = RedisServer(directory)
    try:
        async with asyncio.timeout(start_timeout):
            await server.start()
        yield server
    finally:
        await server.kill()
        shutil.rmtree(directory, ignore_errors=True)


# ─── Redis Cluster ───────────────────────────────────────────────────────────


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


ATTEMPTS = 5
"""Starts a cluster node makes with fresh ports (see ClusterNodeProcess.start)."""


class ClusterNodeProcess:
    """One redis-server of a cluster, on loopback ports of its own (client
    and cluster bus), AOF on with ``appendfsync always`` (unless told
    otherwise). Its output is read on a thread, so that a test can wait for
    a line it logs (``wait_for``) from sync code or, through
    ``asyncio.to_thread``, from async code."""

    def __init__(
        self, directory: Path, *, node_timeout_ms: int, appendfsync: str = "always"
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.bus_port = free_port()
        self.node_timeout_ms = node_timeout_ms
        self.appendfsync = appendfsync
        self.process: subprocess.Popen[bytes] | None = None
        self.started = False
        self._reader: threading.Thread | None = None
        self.lines: list[str] = []
        self._seen = threading.Condition()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float) -> None:
        """Start (again, on the same data and cluster config) and wait until
        it accepts connections. The first start takes fresh ports while
        another process took one between probing and binding (the ports of
        a node that has started are its own: a restart keeps them)."""
        for _ in range(ATTEMPTS - 1):
            if self.started:
                break
            try:
                self._start(timeout)
                return
            except RuntimeError as error:
                if "Address already in use" not in str(error):
                    raise
                self.port, self.bus_port = free_port(), free_port()
                if self._reader is not None:
                    self._reader.join()
                if self.process is not None:
                    # Reaped: a Popen dropped unwaited warns when collected,
                    # which failed a later test as an unraisable exception.
                    self.process.wait()
                with self._seen:  # the attempt that failed says nothing of the next
                    self.lines.clear()
        self._start(timeout)

    def _start(self, timeout: float) -> None:
        self.directory.mkdir(exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--cluster-port",
                str(self.bus_port),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                self.appendfsync,
                "--save",
                "",
                # A replica syncs at once (the default waits 5 s for others).
                "--repl-diskless-sync-delay",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        mark = len(self.lines)
        self._reader = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._reader.start()
        self.wait_for(READY.decode(), timeout, since=mark)
        self.started = True

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with process.stdout:
            for raw in process.stdout:
                with self._seen:
                    self.lines.append(raw.decode(errors="replace"))
                    self._seen.notify_all()
        with self._seen:
            self.lines.append("<exited>\n")
            self._seen.notify_all()

    def wait_for(self, text: str, timeout: float, *, since: int = 0) -> int:
        """Block until a line after line ``since`` contains ``text``
        (case-insensitive); returns the index after it."""

        def found() -> int | None:
            for index in range(since, len(self.lines)):
                line = self.lines[index].lower()
                if text.lower() in line:
                    return index + 1
                if line == "<exited>\n":
                    raise RuntimeError(f"redis-server exited:\n{''.join(self.lines)}")
            return None

        with self._seen:
            if not self._seen.wait_for(lambda: found() is not None, timeout):
                raise TimeoutError(f"no {text!r} from {self.address}:\n{''.join(self.lines)}")
            index = found()
            assert index is not None
            return index

    def kill(self) -> None:
        """kill -9: no AOF flush, no goodbye to the cluster."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self._reader is not None:
            self._reader.join()  # it closes the pipe when the output ends


class RunningCluster:
    """A Redis Cluster of ``primaries`` primaries, each with ``replicas``
    replicas, created with ``redis-cli --cluster create`` and awaited until
    every node says ``cluster_state:ok`` and every replica is in sync."""

    def __init__(self, nodes: list[ClusterNodeProcess], root: Path) -> None:
        self.nodes = nodes
        self.root = root

    @classmethod
    def start(
        cls,
        *,
        primaries: int = 3,
        replicas: int = 0,
        timeout: float,
        node_timeout_ms: int = 1000,
        appendfsync: str = "always",
    ) -> RunningCluster:
        root = Path(tempfile.mkdtemp(prefix="huddle-cluster-", dir="/tmp"))
        nodes = [
            ClusterNodeProcess(
                root / f"node{index}", node_timeout_ms=node_timeout_ms, appendfsync=appendfsync
            )
            for index in range(primaries * (1 + replicas))
        ]
        cluster = cls(nodes, root)
        try:
            for node in nodes:
                node.start(timeout)
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *(node.address for node in nodes),
                    "--cluster-replicas",
                    str(replicas),
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
            for node in nodes:
                node.wait_for("Cluster state changed: ok", timeout)
            for node in cluster.replicas():
                node.wait_for("MASTER <-> REPLICA sync: Finished with success", timeout)
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def url(self, **query: object) -> str:
        hosts = ",".join(node.address for node in self.nodes)
        suffix = "?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else ""
        return f"redis+cluster://{hosts}{suffix}"

    def _roles(self) -> dict[str, tuple[str, str]]:
        """Each running node's role and the address of its primary (itself
        for a primary), by address, as each node says of itself (``ROLE``)."""
        roles: dict[str, tuple[str, str]] = {}
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            client = redis.Redis(port=node.port, socket_timeout=5)
            try:
                role: list[Any] = client.execute_command("ROLE")  # type: ignore[no-untyped-call]
            finally:
                client.close()
            if role[0] == b"master":
                roles[node.address] = ("primary", node.address)
            else:
                roles[node.address] = ("replica", f"{role[1].decode()}:{role[2]}")
        return roles

    def node(self, address: str) -> ClusterNodeProcess:
        return next(node for node in self.nodes if node.address == address)

    def primaries(self) -> list[ClusterNodeProcess]:
        return [self.node(a) for a, (role, _) in self._roles().items() if role == "primary"]

    def replicas(self) -> list[ClusterNodeProcess]:
        return [self.node(a) for a, (role, _) in self._roles().items() if role == "replica"]

    def replica_of(self, primary: ClusterNodeProcess) -> ClusterNodeProcess:
        return next(
            self.node(a)
            for a, (role, of) in self._roles().items()
            if role == "replica" and of == primary.address
        )

    def primary_of(self, key: str) -> ClusterNodeProcess:
        """The node that serves ``key``'s slot now."""
        slot = key_slot(key.encode())
        for node in self.primaries():
            client = redis.Redis(port=node.port, socket_timeout=5)
            try:
                ranges = client.execute_command("CLUSTER SLOTS")  # type: ignore[no-untyped-call]
            finally:
                client.close()
            for start, end, primary, *_ in ranges:
                if start <= slot <= end:
                    return self.node(f"127.0.0.1:{primary[1]}")
        raise RuntimeError(f"no node serves {key!r}")

    def flush(self) -> None:
        """Empty every primary (their replicas follow)."""
        for node in self.primaries():
            client = redis.Redis(port=node.port, socket_timeout=5)
            try:
                client.flushall()
            finally:
                client.close()

    def destroy(self) -> None:
        for node in self.nodes:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


_shared: RunningCluster | None = None


def shared_cluster(timeout: float) -> RunningCluster:
    """Three primaries without replicas, started on first use and shared by
    every test of the process (each flushes it first: see ``flush``);
    killed when the process exits."""
    global _shared
    if _shared is None:
        _shared = RunningCluster.start(timeout=timeout)
        atexit.register(_shared.destroy)
    return _shared


# ─── Either ──────────────────────────────────────────────────────────────────


@dataclass
class Deployment:
    """A single Redis or the shared cluster, and a raw client to look inside."""

    url: str
    raw: aioredis.Redis | RedisCluster

    async def subscribers(self, channel: str) -> int:
        """How many connections SSUBSCRIBEd ``channel``'s topic (on its node)."""
        topic = topic_of(channel)
        if isinstance(self.raw, RedisCluster):
            node = self.raw.get_node_from_key(topic)
            counts = await self.raw.pubsub_shardnumsub(topic, target_nodes=node)
        else:
            counts = await self.raw.pubsub_shardnumsub(topic)
        return int(dict(counts)[topic.encode()])

    def node_of(self, channel: str) -> str:
        if isinstance(self.raw, RedisCluster):
            node = self.raw.get_node_from_key(topic_of(channel))
            assert node is not None
            return node.name
        return "redis"

    def beside(self, channel: str, name: str) -> str:
        """A channel named after ``name`` on ``channel``'s node: messages of
        the two reach a process in the order they were published."""
        for n in range(10_000):
            candidate = f"ahp-chat:/{name}-{n}"
            if self.node_of(candidate) == self.node_of(channel):
                return candidate
        raise AssertionError("no channel on that node")

    def stores(self) -> tuple[RedisStore, RedisStore]:
        return RedisStore(self.url), RedisStore(self.url)

    async def on_every_primary(self, *command: str) -> None:
        """Send ``command`` to every primary (to the one Redis)."""
        if isinstance(self.raw, RedisCluster):
            for node in self.raw.get_primaries():
                await self.raw.execute_command(*command, target_nodes=node)
        else:
            await self.raw.execute_command(*command)  # type: ignore[no-untyped-call]


@contextlib.asynccontextmanager
async def deployed(kind: str, start_timeout: float) -> AsyncIterator[Deployment]:
    """``kind`` "redis": a redis-server of its own; "cluster": the shared
    cluster, flushed."""
    async with contextlib.AsyncExitStack() as stack:
        raw: aioredis.Redis | RedisCluster
        if kind == "redis":
            server = await stack.enter_async_context(running_redis(start_timeout))
            url = server.url
            raw = aioredis.Redis.from_url(url)
        else:
            cluster = shared_cluster(start_timeout)
            cluster.flush()
            url = cluster.url()
            raw = RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", cluster.nodes[0].port)])
            await raw.initialize()
        stack.push_async_callback(raw.aclose)
        yield Deployment(url, raw)
