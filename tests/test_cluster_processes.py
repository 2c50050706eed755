"""The demo story on a Redis Cluster, across processes: two ``huddle serve``
and a ``huddle worker`` given a ``redis+cluster://`` store (the command line
opens every store URL the store package takes).

And the same story through failovers: once the form is open, the primary
that holds the chat and the one that holds the turns are killed with
SIGKILL, one after the other, and their replicas promoted; the people go on
answering and approving, and every process carries on by itself (no
restart): the turn completes and the ticket is created exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ClusterDownError

from protocol.actions import StateAction
from protocol.rejections import RejectionCode
from server.build import open_store, open_turn_store
from server.client import HuddleClient
from server.config import Settings
from server.errors import ActionRejected
from server.runner.redis_turn_store import RedisTurnStore
from server.store.memory import MemoryStore
from server.store.redis import RedisStore
from tests.conftest import UNIT
from tests.redis_server import ClusterNodeProcess, RunningCluster, shared_cluster
from tests.test_runner_processes import play_the_story, processes_on

pytestmark = pytest.mark.redis

TURNS = "huddle:turn"
"""The hash tag of every key of the turn store (they share one slot)."""


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0",
        "rediss://127.0.0.1:1/0",
        "unix:///tmp/nowhere.sock",
        "redis+cluster://127.0.0.1:1,127.0.0.1:2",
        "rediss+cluster://127.0.0.1:1?replicas=1",
    ],
)
async def test_the_command_line_takes_every_redis_url(url: str) -> None:
    settings = Settings(store=url, replay_window=7)
    channels, turns = open_store(settings), open_turn_store(settings)
    try:
        assert isinstance(channels, RedisStore)
        assert channels.retention == 7
        assert isinstance(turns, RedisTurnStore)
    finally:
        await channels.close()
        await turns.close()


def test_the_command_line_refuses_an_unknown_store() -> None:
    with pytest.raises(ValueError, match="unknown store"):
        open_store(Settings(store="mysql://localhost"))
    memory = open_store(Settings(replay_window=3, replay_window_bytes=100))
    assert isinstance(memory, MemoryStore)
    assert (memory.retention, memory.retention_bytes) == (3, 100)


async def test_the_story_runs_on_a_cluster() -> None:
    cluster = shared_cluster(10 * UNIT)
    cluster.flush()
    async with processes_on(cluster.url()) as processes:
        await play_the_story(processes)
        assert all(process.returncode is None for process in processes.processes)


@pytest.fixture
def replicated_cluster() -> Iterator[RunningCluster]:
    """Three primaries with a replica each, of this test's own."""
    cluster = RunningCluster.start(replicas=1, timeout=20 * UNIT)
    try:
        yield cluster
    finally:
        cluster.destroy()


async def replicated(primary: ClusterNodeProcess, tag: str) -> None:
    """Return once ``primary``'s replica has every write made so far: a write
    of our own in the slot of hash tag ``tag``, then WAIT (the replication stream is in
    order, so the writes before ours are there too). Right after another
    failover the node may still call the cluster down: then try again."""
    client = aioredis.Redis(port=primary.port)
    probe = "huddle:{" + tag + "}:probe"
    try:
        async with asyncio.timeout(20 * UNIT):
            while True:
                try:
                    await client.set(probe, 1)
                    break
                except ClusterDownError:
                    await asyncio.sleep(0.1 * UNIT)  # a retry's pause
        await client.delete(probe)
        assert await client.wait(1, int(10_000 * UNIT)) == 1
    finally:
        await client.aclose()


async def until_accepted(client: HuddleClient, chat: str, action: StateAction) -> object:
    """Dispatch ``action`` again while the server says the store cannot
    serve (it finds the promoted primary by itself, within moments)."""
    async with asyncio.timeout(20 * UNIT):
        while True:
            try:
                return await client.dispatch_and_wait(chat, action)
            except ActionRejected as rejected:
                if rejected.code != RejectionCode.STORE_UNAVAILABLE:
                    raise
            await asyncio.sleep(0.1 * UNIT)  # a retry's pause, nothing to await


async def test_the_story_carries_on_when_primaries_are_killed(
    replicated_cluster: RunningCluster,
) -> None:
    cluster = replicated_cluster

    async def kill_the_primaries(chat: str) -> None:
        # The chat's primary, then the turns' (when another): one failover
        # at a time, so that a majority of primaries is always there to
        # elect a replica.
        victims: dict[str, tuple[ClusterNodeProcess, str]] = {}
        for tag in (chat, TURNS):
            primary = cluster.primary_of("{" + tag + "}")
            victims.setdefault(primary.address, (primary, tag))
        for primary, tag in victims.values():
            replica = cluster.replica_of(primary)
            await replicated(primary, tag)
            mark = len(replica.lines)
            primary.kill()
            won = "Failover election won"
            await asyncio.to_thread(replica.wait_for, won, 20 * UNIT, since=mark)

    async with processes_on(cluster.url()) as processes:
        await play_the_story(
            processes,
            when_the_form_is_open=kill_the_primaries,
            dispatch=until_accepted,
            # A resume the server could not submit meanwhile (the turns'
            # primary was away) waits for a worker's reconcile sweep.
            patience=30 * UNIT,
        )
        assert all(process.returncode is None for process in processes.processes)
