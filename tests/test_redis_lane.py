"""The lane: commands to a single Redis on connections of its own, one in
flight on each, never reused once a reply may be left unread."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from server.errors import StoreUnavailable
from server.store.redis_link import IDLE_LANE_CONNECTIONS, Lane, RedisLink, Script
from tests.conftest import UNIT
from tests.redis_server import RedisServer, free_port


@contextlib.asynccontextmanager
async def lane_on(url: str, bound: float | None) -> AsyncIterator[tuple[aioredis.Redis, Lane]]:
    """A lane on ``url``'s pool, and a client of its own to look at Redis with."""
    client = aioredis.Redis.from_url(url)
    lane = Lane(client.connection_pool, bound)
    try:
        yield client, lane
    finally:
        await lane.close()
        await client.aclose()


async def blocked(client: aioredis.Redis, count: int) -> None:
    """Wait until Redis holds ``count`` clients in a blocking command (Redis
    tells no one when a client blocks: asked until it says so)."""
    async with asyncio.timeout(5 * UNIT):
        while (await client.info("clients"))["blocked_clients"] != count:  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_a_command_left_without_its_reply_never_answers_the_next(
    redis_server: RedisServer,
) -> None:
    async with lane_on(redis_server.url, 0.05 * UNIT) as (client, lane):
        with pytest.raises(RedisTimeoutError):
            await lane.execute("BLPOP", "lane:a", 30)
        assert lane.connections == 0
        # Had that connection been kept, its BLPOP would now be answered
        # with this item, and that answer read as the next command's.
        await client.rpush("lane:a", "late")
        assert await lane.execute("GET", "lane:b") is None
        cancelled = asyncio.create_task(lane.execute("BLPOP", "lane:c", 30))
        await blocked(client, 1)  # Redis holds the BLPOP: its reply is to come
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await client.rpush("lane:c", "late")
        assert await lane.execute("GET", "lane:b") is None
        assert await lane.execute("SET", "lane:d", "1") == b"OK"


async def test_an_error_reply_is_raised_and_keeps_the_connection(
    redis_server: RedisServer,
) -> None:
    async with lane_on(redis_server.url, 2 * UNIT) as (_, lane):
        with pytest.raises(NoScriptError):
            await lane.execute("EVALSHA", "0" * 40, 0)
        assert await lane.execute("PING") == b"PONG"
        assert lane.connections == 1
        link = RedisLink(redis_server.url, 2 * UNIT)
        try:
            # Not loaded yet: NOSCRIPT, then the source, on the lane.
            script = Script("return redis.call('INCR', KEYS[1])")
            assert await link.run(script, ["lane:n"], []) == 1
            assert await link.run(script, ["lane:n"], []) == 2
        finally:
            await link.close()


async def test_commands_in_flight_together_each_get_a_connection_and_few_stay(
    redis_server: RedisServer,
) -> None:
    many = IDLE_LANE_CONNECTIONS + 8
    async with lane_on(redis_server.url, None) as (client, lane):
        waits = [asyncio.create_task(lane.execute("BLPOP", f"lane:w{i}", 30)) for i in range(many)]
        for i in range(many):
            await client.rpush(f"lane:w{i}", str(i))
        replies = await asyncio.gather(*waits)
        assert replies == [[f"lane:w{i}".encode(), str(i).encode()] for i in range(many)]
        assert lane.connections == IDLE_LANE_CONNECTIONS
    assert lane.connections == 0


async def test_a_store_call_to_a_redis_that_is_gone_fails_fast(redis_server: RedisServer) -> None:
    link = RedisLink(redis_server.url, 2 * UNIT)
    try:
        script = Script("return 1")
        assert await link.run(script, ["lane:k"], []) == 1
        await redis_server.kill()
        with pytest.raises(StoreUnavailable):
            await link.run(script, ["lane:k"], [])
        with pytest.raises(StoreUnavailable):
            await link.blpop(["lane:k"], 0.01)
    finally:
        await link.close()


async def test_a_connection_redis_closed_while_idle_is_not_used_again(
    redis_server: RedisServer,
) -> None:
    async with lane_on(redis_server.url, 2 * UNIT) as (_, lane):
        assert await lane.execute("SET", "lane:r", "1") == b"OK"
        await redis_server.stop()
        async with asyncio.timeout(10 * UNIT):
            await redis_server.start()
        # The first command after Redis came back goes on a new connection.
        assert await lane.execute("GET", "lane:r") == b"1"
        assert lane.connections == 1


async def test_one_connection_serves_one_command_after_another(redis_server: RedisServer) -> None:
    # What the lane is for: no connection opened, no pool bookkeeping, per
    # command. (Should redis-py rename the stream the idle check reads,
    # every command would open a connection of its own: this fails.)
    async with lane_on(redis_server.url, 2 * UNIT) as (_, lane):
        first = await lane.execute("CLIENT", "ID")
        assert [await lane.execute("CLIENT", "ID") for _ in range(3)] == [first] * 3
        with pytest.raises(DataError):  # refused before anything is sent: the connection stays
            await lane.execute("SET", "lane:x", {"not": "a value"})
        assert await lane.execute("CLIENT", "ID") == first
        assert lane.connections == 1


async def test_commands_beyond_the_pools_bound_wait_for_a_connection(
    redis_server: RedisServer,
) -> None:
    # The client's own commands take one of its pool's three; the lane's
    # are bounded apart from them, by the same number.
    async with lane_on(f"{redis_server.url}?max_connections=3", None) as (client, lane):
        waits = [asyncio.create_task(lane.execute("BLPOP", f"lane:b{i}", 30)) for i in range(8)]
        await blocked(client, 3)
        assert lane.connections == 3  # the other five wait for one of these
        for i in range(8):
            await client.rpush(f"lane:b{i}", str(i))
        replies = await asyncio.gather(*waits)
        assert replies == [[f"lane:b{i}".encode(), str(i).encode()] for i in range(8)]
        assert lane.connections == 3


async def test_a_closed_lane_keeps_no_connection_open(redis_server: RedisServer) -> None:
    async with lane_on(redis_server.url, None) as (client, lane):
        waiting = asyncio.create_task(lane.execute("BLPOP", "lane:z", 30))
        await blocked(client, 1)
        await lane.close()
        with pytest.raises(RedisConnectionError):  # its connection was closed under it
            await waiting
        assert lane.connections == 0
        # A command after the close is served, and its connection closed.
        assert await lane.execute("PING") == b"PONG"
        assert lane.connections == 0


async def _tcp_redis(directory: Path, port: int, *more: str) -> asyncio.subprocess.Process:
    (directory / str(port)).mkdir()
    process = await asyncio.create_subprocess_exec(
        "redis-server",
        "--port",
        str(port),
        "--dir",
        str(directory / str(port)),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        *more,
        stdout=asyncio.subprocess.DEVNULL,
    )
    client = aioredis.Redis(port=port)
    try:
        async with asyncio.timeout(10 * UNIT):
            while True:
                try:
                    await client.ping()
                    return process
                except RedisConnectionError:
                    await asyncio.sleep(0.01)  # asked until it listens
    finally:
        await client.aclose()


async def test_a_batch_waits_for_the_replicas_the_url_asks_for(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    # No replica: the writes ran, but nothing acknowledged them as copied.
    link = RedisLink(f"{redis_server.url}?replicas=1", 0.5 * UNIT)
    script = Script("return redis.call('INCR', KEYS[1])")
    try:
        results = await link.run_batch(script, [(["lane:q"], []), (["lane:q"], [])])
        assert all(isinstance(r, StoreUnavailable) for r in results)
        assert "reached 0 of 1 replica(s)" in str(results[0])
    finally:
        await link.close()
    primary_port, replica_port = free_port(), free_port()
    primary = await _tcp_redis(tmp_path, primary_port)
    replica = await _tcp_redis(
        tmp_path, replica_port, "--replicaof", "127.0.0.1", str(primary_port)
    )
    link = RedisLink(f"redis://127.0.0.1:{primary_port}?replicas=1", 5 * UNIT)
    try:
        async with asyncio.timeout(10 * UNIT):
            while (await link.client.info("replication"))["connected_slaves"] != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)  # asked until the replica is linked
        assert await link.run_batch(script, [(["lane:q"], []), (["lane:q"], [])]) == [1, 2]
        assert await link.run(script, ["lane:q"], []) == 3
    finally:
        await link.close()
        for process in (primary, replica):
            process.kill()
            await process.wait()
