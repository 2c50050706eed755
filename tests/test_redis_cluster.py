"""Fan-out per channel and Redis Cluster, with real redis-servers.

A process hears the channels it watches and nothing else, on a single Redis
and on a cluster (sharded pub/sub in both); a watch that returned does not
miss an append made while the process loads the channel; subscriptions
come back by themselves after Redis restarts or a primary fails over, and
with ``replicas=1`` nothing acknowledged is lost in the failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from server.build import turn_store_at
from server.errors import StoreUnavailable
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.turn import Turn
from server.runner.turn_store import TurnStore
from server.store import ChannelStore, open_channel_store
from server.store.memory import MemoryStore
from server.store.redis import APPEND, RedisStore, topic_of
from server.store.redis_link import Script, parse_target
from tests.conftest import UNIT
from tests.redis_server import (
    ClusterNodeProcess,
    Deployment,
    RedisServer,
    RunningCluster,
    deployed,
    shared_cluster,
)
from tests.test_store_contract import Heard

pytestmark = pytest.mark.redis

ROOT = "ahp-root://"


class Listener(Heard):
    """Heard, with reconnects and seqs a test can await."""

    def __init__(self) -> None:
        super().__init__()
        self.back = asyncio.Event()

    def store_reconnected(self) -> None:
        super().store_reconnected()
        self.back.set()

    def seqs(self, channel: str) -> list[int]:
        return [seq for heard, seq, _ in self.appends if heard == channel]

    async def until_seq(self, channel: str, seq: int) -> None:
        async with asyncio.timeout(5 * UNIT):
            while seq not in self.seqs(channel):
                self.changed.clear()
                await self.changed.wait()


# ─── Deployments ─────────────────────────────────────────────────────────────


@pytest.fixture(params=["redis", "cluster"])
async def deployment(request: pytest.FixtureRequest) -> AsyncIterator[Deployment]:
    async with deployed(request.param, 10 * UNIT) as made:
        yield made


@contextlib.asynccontextmanager
async def opened(*stores: ChannelStore | TurnStore) -> AsyncIterator[None]:
    try:
        yield
    finally:
        for store in stores:
            await store.close()


# ─── Who hears what ──────────────────────────────────────────────────────────


async def test_a_process_hears_the_channels_it_watches_and_no_other(
    deployment: Deployment,
) -> None:
    reader, writer = deployment.stores()
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        watched = "ahp-chat:/watched"
        other = deployment.beside(watched, "other")
        last = deployment.beside(watched, "last")
        for channel in (watched, other, last):
            await writer.create(channel, b"{}")
        await reader.watch(watched)
        await reader.watch(last)
        await reader.watch(last)  # idempotent
        await writer.append(watched, 0, b"w1")
        await writer.append(other, 0, b"o1")
        await writer.append(last, 0, b"l1")
        await heard.until(2)
        # "other" was published before "last", on the same node: had it
        # reached the reader, it would have come first.
        assert heard.appends == [(watched, 1, b"w1"), (last, 1, b"l1")]
        assert await deployment.subscribers(other) == 0
        assert await deployment.subscribers(watched) == 1
        assert await deployment.subscribers(last) == 1


async def test_watched_channels_are_heard_wherever_they_live(deployment: Deployment) -> None:
    reader, writer = deployment.stores()
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        channels: dict[str, str] = {}
        for n in range(200):
            channels.setdefault(deployment.node_of(f"ahp-chat:/c{n}"), f"ahp-chat:/c{n}")
        if isinstance(deployment.raw, RedisCluster):
            assert len(channels) == 3, "one channel on each primary"
        for channel in channels.values():
            await writer.create(channel, b"{}")
            await reader.watch(channel)
        await asyncio.gather(*(writer.append(c, 0, c.encode()) for c in channels.values()))
        await heard.until(len(channels))
        assert sorted(heard.appends) == sorted((c, 1, c.encode()) for c in channels.values())


async def test_unwatch_stops_hints_and_the_subscription(deployment: Deployment) -> None:
    reader, writer = deployment.stores()
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        chat = "ahp-chat:/left"
        last = deployment.beside(chat, "last")
        for channel in (chat, last):
            await writer.create(channel, b"{}")
        await reader.watch(chat)
        await writer.append(chat, 0, b"before")
        await heard.until(1)
        await reader.unwatch(chat)
        await reader.unwatch(chat)  # no error when not watched
        await writer.append(chat, 1, b"after")
        await writer.publish(chat, b"notice after")
        await reader.watch(last)
        await writer.append(last, 0, b"l1")
        await heard.until(2)
        assert heard.appends == [(chat, 1, b"before"), (last, 1, b"l1")]
        assert heard.notices == []
        assert await deployment.subscribers(chat) == 0
        # Watched again, it is heard again.
        await reader.watch(chat)
        await writer.append(chat, 2, b"again")
        await heard.until_seq(chat, 3)


async def test_notices_reach_the_processes_that_watch_their_topic(
    deployment: Deployment,
) -> None:
    listening, deaf = deployment.stores()
    writer = RedisStore(deployment.url)
    async with opened(listening, deaf, writer):
        heard, unheard = Listener(), Listener()
        listening.add_listener(heard)
        deaf.add_listener(unheard)
        last = deployment.beside(ROOT, "last")
        await writer.create(last, b"{}")
        await listening.watch(ROOT)
        await deaf.watch(last)
        await writer.publish(ROOT, b"session added")
        await writer.append(last, 0, b"l1")
        await heard.until(1)
        await unheard.until(1)
        assert heard.notices == [(ROOT, b"session added")]
        assert unheard.notices == []
        assert unheard.appends == [(last, 1, b"l1")]


@dataclass
class Appender:
    """Another process, appending to ``chat`` as fast as it can until its
    head reaches ``until``."""

    store: RedisStore
    chat: str
    head: int = 0
    until: int | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        while self.until is None or self.head < self.until:
            await self.store.append(self.chat, self.head, b"e%d" % (self.head + 1))
            self.head += 1
            if self.head == 3:
                self.started.set()


async def test_a_watch_that_returned_misses_no_append_made_while_loading(
    deployment: Deployment,
) -> None:
    """What the host relies on: watch, then load; every append after the
    loaded seq is heard, even while another process keeps appending."""
    reader, writer = deployment.stores()
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        for round_ in range(5):
            appender = Appender(writer, f"ahp-chat:/race-{round_}")
            await writer.create(appender.chat, b"{}")
            writing = asyncio.create_task(appender.run())
            async with asyncio.timeout(5 * UNIT):
                await appender.started.wait()
            await reader.watch(appender.chat)
            loaded = await reader.load(appender.chat)
            appender.until = loaded.seq + 10
            async with asyncio.timeout(5 * UNIT):
                await writing
            await heard.until_seq(appender.chat, appender.head)
            assert set(range(loaded.seq + 1, appender.head + 1)) <= set(heard.seqs(appender.chat))


# ─── Faults ──────────────────────────────────────────────────────────────────


async def test_subscriptions_come_back_after_redis_restarts(redis_server: RedisServer) -> None:
    reader, writer = RedisStore(redis_server.url), RedisStore(redis_server.url)
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        chat = "ahp-chat:/restarted"
        await writer.create(chat, b"{}")
        await reader.watch(chat)
        await redis_server.stop()
        with pytest.raises(StoreUnavailable):
            await reader.watch("ahp-chat:/while-down")
        async with asyncio.timeout(10 * UNIT):
            await redis_server.start()
            await heard.back.wait()
        assert heard.reconnected == 1
        await writer.append(chat, 0, b"after the restart")
        await heard.until(1)
        assert heard.appends == [(chat, 1, b"after the restart")]
        assert "ahp-chat:/while-down" not in {c for c, _, _ in heard.appends}


class Logged(logging.Handler):
    """Sets ``seen`` when a record containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.seen.set()


async def test_a_redis_gone_silent_is_noticed_by_a_ping(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis that hangs (here: SIGSTOP) keeps its connections open; the
    ping notices, and the subscription is made again once it answers."""
    reader = RedisStore(redis_server.url, timeout=0.5 * UNIT)
    reader.topics.ping_every = 0.2 * UNIT
    writer = RedisStore(redis_server.url)
    caplog.set_level(logging.INFO, logger="huddle.store.redis")
    logger = logging.getLogger("huddle.store.redis")
    silent = Logged("silent past a ping")
    logger.addHandler(silent)
    async with opened(reader, writer):
        heard = Listener()
        reader.add_listener(heard)
        chat = "ahp-chat:/hung"
        await writer.create(chat, b"{}")
        await reader.watch(chat)
        assert redis_server.process is not None
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            async with asyncio.timeout(5 * UNIT):
                await silent.seen.wait()
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
            logger.removeHandler(silent)
        async with asyncio.timeout(5 * UNIT):
            await heard.back.wait()
        await writer.append(chat, 0, b"awake")
        await heard.until(1)
        assert heard.appends == [(chat, 1, b"awake")]


async def test_a_close_does_not_wait_on_an_append_a_hung_redis_holds(
    redis_server: RedisServer,
) -> None:
    """A stop with Redis hung ended by closing the store, which waited out
    the store timeout for the append still on its way, though nobody was
    left to hear its answer."""
    store = RedisStore(redis_server.url, timeout=10 * UNIT)
    chat = "ahp-chat:/closing"
    await store.create(chat, b"{}")
    assert redis_server.process is not None
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        first = asyncio.create_task(store.append(chat, 0, b"sent"))
        await asyncio.sleep(0)  # the batch is on its way
        second = asyncio.create_task(store.append(chat, 1, b"queued"))
        await asyncio.sleep(0)
        async with asyncio.timeout(2 * UNIT):
            await store.close()
            outcomes = await asyncio.gather(first, second, return_exceptions=True)
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert [type(outcome) for outcome in outcomes] == [StoreUnavailable, StoreUnavailable]


@pytest.fixture
def replicated_cluster() -> Iterator[RunningCluster]:
    """Three primaries with a replica each, of this test's own."""
    cluster = RunningCluster.start(replicas=1, timeout=20 * UNIT)
    try:
        yield cluster
    finally:
        cluster.destroy()


async def test_turns_spread_over_every_primary_and_every_one_is_claimed(
    replicated_cluster: RunningCluster,
) -> None:
    cluster = replicated_cluster
    turns = RedisTurnStore(cluster.url(replicas=1))
    ids = [f"spread-{n}" for n in range(48)]
    async with opened(turns):
        for turn_id in ids:
            await turns.make_runnable((await turns.create(Turn(id=turn_id, agent="echo"))).id, 0.0)
        held: dict[str, set[str]] = {}
        for node in cluster.primaries():
            client = aioredis.Redis(port=node.port)
            try:
                found = [key.decode() async for key in client.scan_iter(match="*:turn:spread-*")]
            finally:
                await client.aclose()
            held[node.address] = {key.rpartition(":turn:")[2] for key in found}
        assert all(held.values()), f"a primary holds no turn: {held}"
        assert sorted(turn for on_node in held.values() for turn in on_node) == sorted(ids)
        # One worker, claiming again and again, takes every turn on every
        # node, and each once.
        claimed = [await turns.claim("worker-a", 1.0, 10.0) for _ in range(len(ids) + 1)]
        assert claimed[-1] is None
        assert sorted(lease.turn_id for lease in claimed if lease is not None) == sorted(ids)


async def script_known(node: ClusterNodeProcess, script: Script) -> bool:
    client = aioredis.Redis(port=node.port)
    try:
        [known] = await client.script_exists(script.sha)
        return bool(known)
    finally:
        await client.aclose()


async def test_a_primary_killed_fails_over_and_nothing_acknowledged_is_lost(
    replicated_cluster: RunningCluster,
) -> None:
    cluster = replicated_cluster
    url = cluster.url(replicas=1)
    store, turns = RedisStore(url), RedisTurnStore(url)
    turn_key = turns.group_of("t1").turn("t1")
    primary = cluster.primary_of(turn_key)
    replica = cluster.replica_of(primary)
    chat = next(
        f"ahp-chat:/failover-{n}"
        for n in range(10_000)
        if cluster.primary_of(topic_of(f"ahp-chat:/failover-{n}")) is primary
    )
    async with opened(store, turns):
        heard = Listener()
        store.add_listener(heard)
        await store.create(chat, b"{}")
        await store.watch(chat)
        for seq in range(20):
            await store.append(chat, seq, b"e%d" % (seq + 1))
        turn = await turns.save(await turns.create(Turn(id="t1", agent="echo")))
        # Replicas do not get the scripts, only their effects: the promoted
        # one will answer NOSCRIPT first.
        assert not await script_known(replica, Script(APPEND))

        mark = len(replica.lines)
        primary.kill()
        with pytest.raises(StoreUnavailable):
            await store.append(chat, 20, b"while the primary is dead")
        with pytest.raises(StoreUnavailable):
            await turns.load("t1")
        await asyncio.to_thread(replica.wait_for, "Failover election won", 20 * UNIT, since=mark)

        # Both stores find the promoted replica by themselves.
        async with asyncio.timeout(10 * UNIT):
            await heard.back.wait()
            await turns.link.healthy.wait()
        # Every acknowledged write is there: WAIT put it on the replica first.
        loaded = await store.load(chat)
        assert loaded.log == [b"e%d" % (seq + 1) for seq in range(20)]
        assert (await turns.load("t1")).version == turn.version
        # The new primary has no replica yet: writes are not acknowledged
        # (they ran, but no replica has them) until the old primary is back.
        with pytest.raises(StoreUnavailable):
            await store.append(chat, 20, b"e21")

        mark = len(primary.lines)
        await asyncio.to_thread(primary.start, 10 * UNIT)
        synced = "MASTER <-> REPLICA sync: Finished with success"
        await asyncio.to_thread(primary.wait_for, synced, 20 * UNIT, since=mark)
        assert cluster.primary_of(turn_key) is replica
        _, head = (await store.heads([chat]))[chat]
        await store.append(chat, head, b"after")
        await heard.until_seq(chat, head + 1)
        saved = await turns.save(await turns.load("t1"))
        assert saved.version == turn.version + 1
        assert await script_known(replica, Script(APPEND))


# ─── Opening a store by URL ──────────────────────────────────────────────────


async def test_a_store_url_picks_memory_redis_or_cluster(redis_server: RedisServer) -> None:
    cluster = shared_cluster(10 * UNIT)
    assert isinstance(open_channel_store("memory", retention=5), MemoryStore)
    for url in (redis_server.url, cluster.url(), cluster.url(replicas=0)):
        channels, turns = open_channel_store(url, retention=5), turn_store_at(url)
        async with opened(channels, turns):
            assert isinstance(channels, RedisStore)
            assert channels.retention == 5
            assert await channels.ready()
            assert isinstance(turns, RedisTurnStore)
    with pytest.raises(ValueError, match="unknown store"):
        open_channel_store("mysql://x")


@pytest.mark.parametrize(
    ("url", "nodes", "replicas", "password"),
    [
        ("redis+cluster://10.0.0.1:7000", (("10.0.0.1", 7000),), 0, None),
        (
            "redis+cluster://u:p%40ss@a:7000,b:7001,[::1]:7002?replicas=1",
            (("a", 7000), ("b", 7001), ("::1", 7002)),
            1,
            "p@ss",
        ),
    ],
    ids=["one node", "three nodes, a password and replicas"],
)
def test_a_cluster_url_names_its_nodes(
    url: str, nodes: tuple[tuple[str, int], ...], replicas: int, password: str | None
) -> None:
    target = parse_target(url)
    assert (target.nodes, target.replicas, target.password) == (nodes, replicas, password)


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://", "redis+cluster://a", "redis+cluster://a:1?db=2", "redis://a?replicas=-1"],
)
def test_a_malformed_store_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each has its own sentence)
        parse_target(url)


@pytest.mark.parametrize(
    ("url", "plain", "replicas"),
    [
        (
            "redis://localhost:6379/2?replicas=1&socket_keepalive=true",
            "redis://localhost:6379/2?socket_keepalive=true",
            1,
        ),
        ("unix:///tmp/r.sock", "unix:///tmp/r.sock", 0),
        ("unix:///tmp/r.sock?replicas=2&db=3", "unix:///tmp/r.sock?db=3", 2),
        ("rediss://u:p@host:6380/0?replicas=1", "rediss://u:p@host:6380/0", 1),
    ],
    ids=["options", "unix socket", "unix socket with options", "tls, nothing else"],
)
def test_a_single_redis_url_keeps_its_own_options(url: str, plain: str, replicas: int) -> None:
    target = parse_target(url)
    assert (target.url, target.replicas, target.is_cluster) == (plain, replicas, False)
