"""The Redis store: durable channels shared by many server processes.

Keys, hash-tagged by channel so that one channel's keys share a Redis Cluster
slot (``{ahp-chat:/abc}``)::

    huddle:{<uri>}:meta   hash    seq, epoch (the head and the log's life)
    huddle:{<uri>}:log    stream  one entry per seq, id "<seq>-0", field e
    huddle:{<uri>}:snap   hash    seq, state (JSON), written every K actions
    huddle:rec:<kind>     hash    small records by key (sessions, forms, ...)

One Lua script appends: it compares the caller's expected seq with the head,
increments it, adds the entry and publishes it on ``huddle:appends``, all
atomically. Concurrent appends are group-committed: whatever accumulated
while one pipeline was in flight goes out in the next, so a process is not
capped at one round trip per action.

Pub/sub only wakes other processes (it may drop messages); the log is the
truth, and hosts compare heads now and then. Trimming keeps ``retention``
entries and never one newer than the snapshot, so a snapshot always covers
what was trimmed.

A lost log is repaired when a load finds it, and the epoch changes:

- the stream flushed or shorter than the head says: the head moves one past
  the last seq handed out, the snapshot is re-stamped there and the stream
  starts afresh. No seq is reused, and every cursor from before (even one at
  the old head, whose state held entries the snapshot lacks) is behind the
  snapshot, so it gets the snapshot and never a replay;
- the meta hash gone while the snapshot survives: the head is read back
  from the stream's newest entry. A stream that still holds every entry
  after the snapshot loses nothing (its seqs keep their meaning, so cursors
  may replay it); one with a hole is repaired as above.

If the meta hash and the stream are both lost, nothing records how far the
head had gone: it restarts at the snapshot's seq and the seqs after it are
handed out again. Run Redis with ``maxmemory-policy noeviction`` so that
keys are never dropped one by one.

Redis down: every call fails fast with StoreUnavailable (no retries inside,
short timeouts); the pub/sub listener reconnects by itself and, when it does,
tells listeners to compare heads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import (
    NoScriptError,
    RedisError,
    ResponseError,
)

from server.errors import ChannelGone, SeqConflict, StoreError, StoreUnavailable
from server.store.base import ChannelStore, Listener, StoredChannel
from server.store.redis_link import UNAVAILABLE, Scripts, call, clients

log = logging.getLogger("huddle.store.redis")

APPENDS = "huddle:appends"
NOTICES = "huddle:notices"


# KEYS: meta, log.  ARGV: expected seq, entry, channel uri.
# Returns {1, seq} on success, {0, head} on a conflict, {-1} when gone.
# XADD goes first: a script that fails keeps its earlier writes, and a
# stream that refuses the id must not leave the head moved without an entry.
APPEND = """
local head = redis.call('HGET', KEYS[1], 'seq')
if not head then return {-1} end
head = tonumber(head)
if head ~= tonumber(ARGV[1]) then return {0, head} end
head = head + 1
redis.call('XADD', KEYS[2], head .. '-0', 'e', ARGV[2])
redis.call('HSET', KEYS[1], 'seq', head)
redis.call('PUBLISH', 'huddle:appends', ARGV[3] .. '\\n' .. head .. '\\n' .. ARGV[2])
return {1, head}
"""

# KEYS: meta, log, snap.  ARGV: state, new epoch.  Returns 1, or 0 if it exists.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[3], 'seq', 0, 'state', ARGV[1])
redis.call('HSET', KEYS[1], 'seq', 0, 'epoch', ARGV[2])
return 1
"""

# Repair a lost log (see the module docstring), then read the channel.
# KEYS: meta, log, snap.  ARGV: a fresh epoch, in case one is needed.
# Returns {epoch, snapshot seq, snapshot state, entry, entry, ...} or {} if gone.
LOAD = """
local snap_seq = redis.call('HGET', KEYS[3], 'seq')
if not snap_seq then return {} end
snap_seq = tonumber(snap_seq)
local head = redis.call('HGET', KEYS[1], 'seq')
if not head then
  head = snap_seq
  local newest = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)
  if #newest > 0 then
    head = math.max(head, tonumber(string.match(newest[1][1], '^(%d+)')))
  end
  redis.call('HSET', KEYS[1], 'seq', head, 'epoch', ARGV[1])
end
head = tonumber(head)
local entries = {}
if head > snap_seq then
  entries = redis.call('XRANGE', KEYS[2], (snap_seq + 1) .. '-0', '+')
  local complete = #entries == head - snap_seq
  if complete then
    complete = tonumber(string.match(entries[1][1], '^(%d+)')) == snap_seq + 1
  end
  if not complete then
    head = head + 1
    redis.call('HSET', KEYS[3], 'seq', head)
    redis.call('HSET', KEYS[1], 'seq', head, 'epoch', ARGV[1])
    redis.call('DEL', KEYS[2])
    snap_seq = head
    entries = {}
  end
end
local out = {redis.call('HGET', KEYS[1], 'epoch'), snap_seq, redis.call('HGET', KEYS[3], 'state')}
for i = 1, #entries do out[#out + 1] = entries[i][2][2] end
return out
"""

# KEYS: meta, log.  ARGV: after seq, epoch.
# Returns {} when gone, {0} when the gap is not held, else {1, entry, ...}.
READ_LOG = """
local head = redis.call('HGET', KEYS[1], 'seq')
if not head then return {} end
head = tonumber(head)
local after = tonumber(ARGV[1])
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] or after > head then return {0} end
if after == head then return {1} end
local entries = redis.call('XRANGE', KEYS[2], (after + 1) .. '-0', '+')
if #entries ~= head - after then return {0} end
if tonumber(string.match(entries[1][1], '^(%d+)')) ~= after + 1 then return {0} end
local out = {1}
for i = 1, #entries do out[#out + 1] = entries[i][2][2] end
return out
"""

# KEYS: meta, log, snap.  ARGV: seq, state, retention.
SNAPSHOT = """
local head = redis.call('HGET', KEYS[1], 'seq')
if not head then return 0 end
head = tonumber(head)
local seq = tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', KEYS[3], 'seq') or '0')
if seq <= current or seq > head then return 0 end
redis.call('HSET', KEYS[3], 'seq', seq, 'state', ARGV[2])
local keep_from = math.min(seq, head - tonumber(ARGV[3])) + 1
if keep_from > 1 then redis.call('XTRIM', KEYS[2], 'MINID', keep_from .. '-0') end
return 1
"""


# KEYS: meta, log, snap.  ARGV: seq, state, new epoch.
# Returns 1 when the head was below seq and the channel now stands at seq.
RESTORE = """
local head = redis.call('HGET', KEYS[1], 'seq')
if not head or tonumber(head) >= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[3], 'seq', ARGV[1], 'state', ARGV[2])
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'epoch', ARGV[3])
return 1
"""


def _keys(channel: str) -> tuple[str, str, str]:
    tag = "{" + channel + "}"
    return f"huddle:{tag}:meta", f"huddle:{tag}:log", f"huddle:{tag}:snap"


@dataclass
class _Pending:
    channel: str
    expected: int
    entry: bytes
    future: asyncio.Future[None]


class RedisStore(ChannelStore):
    """See the module docstring. ``url`` is a redis:// or unix:// URL."""

    def __init__(
        self,
        url: str,
        *,
        retention: int = 1000,
        timeout: float = 2.0,
        max_batch: int = 256,
    ) -> None:
        self.url = url
        self.retention = retention
        self.max_batch = max_batch
        self.client, self._pubsub_client = clients(url, timeout)
        self._scripts = Scripts(self.client)
        self._shas = self._scripts.shas
        self._listeners: list[Listener] = []
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._subscriber: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        """Set while the pub/sub listener is subscribed (tests await it)."""

    # ─── Calls ───────────────────────────────────────────────────────────

    async def _script(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        return await self._scripts.run(name, source, keys, args)

    async def _call(self, coro: Awaitable[Any]) -> Any:
        return await call(coro)

    # ─── Channels ────────────────────────────────────────────────────────

    async def create(self, channel: str, state: bytes) -> bool:
        created = await self._script(
            "create", CREATE, list(_keys(channel)), [state, secrets.token_hex(8)]
        )
        return bool(created)

    async def load(self, channel: str) -> StoredChannel:
        out = await self._script("load", LOAD, list(_keys(channel)), [secrets.token_hex(8)])
        if not out:
            raise ChannelGone(channel)
        epoch, snap_seq, state, *entries = out
        return StoredChannel(
            epoch=_text(epoch), snapshot_seq=int(snap_seq), snapshot=state, log=list(entries)
        )

    async def append(self, channel: str, expected_seq: int, envelope: bytes) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(channel, expected_seq, envelope, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        """Send every pending append, pipelined, until none is left. Every
        append taken into a batch is answered, whatever fails: its caller
        holds the channel's lock while it waits."""
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            try:
                results = await self._append_batch(batch)
                for item, result in zip(batch, results, strict=True):
                    _answer(item, result)
            except BaseException as error:
                if not isinstance(error, StoreUnavailable | asyncio.CancelledError):
                    log.error("append batch failed", exc_info=error)
                failure = (
                    error
                    if isinstance(error, StoreError)
                    else StoreUnavailable(f"redis: {error!r}")
                )
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(failure)
                if not isinstance(error, Exception):
                    raise

    async def _append_batch(self, batch: list[_Pending]) -> list[Any]:
        for attempt in range(2):
            if "append" not in self._shas:
                self._shas["append"] = await self._call(self.client.script_load(APPEND))
            sha = self._shas["append"]
            pipe = self.client.pipeline(transaction=False)
            for item in batch:
                meta, log_key, _ = _keys(item.channel)
                pipe.evalsha(sha, 2, meta, log_key, item.expected, item.entry, item.channel)
            results: list[Any] = await self._call(pipe.execute(raise_on_error=False))
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                # Redis restarted and forgot the script: nothing ran; load and resend.
                self._shas.pop("append", None)
                continue
            return [
                StoreUnavailable(f"redis: {r}") if isinstance(r, ResponseError) else r
                for r in results
            ]
        raise StoreUnavailable("redis keeps forgetting the append script")

    async def read_log(self, channel: str, after_seq: int, epoch: str) -> list[bytes] | None:
        out = await self._script("read_log", READ_LOG, list(_keys(channel))[:2], [after_seq, epoch])
        if not out:
            raise ChannelGone(channel)
        if int(out[0]) == 0:
            return None
        return list(out[1:])

    async def restore(self, channel: str, seq: int, state: bytes) -> str | None:
        epoch = secrets.token_hex(8)
        restored = await self._script("restore", RESTORE, list(_keys(channel)), [seq, state, epoch])
        return epoch if restored else None

    async def heads(self, channels: list[str]) -> dict[str, tuple[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        for channel in channels:
            pipe.hmget(_keys(channel)[0], "epoch", "seq")
        results = await self._call(pipe.execute())
        return {
            channel: (_text(epoch), int(seq))
            for channel, (epoch, seq) in zip(channels, results, strict=True)
            if epoch is not None and seq is not None
        }

    async def save_snapshot(self, channel: str, seq: int, state: bytes) -> None:
        await self._script("snapshot", SNAPSHOT, list(_keys(channel)), [seq, state, self.retention])

    async def delete(self, channel: str) -> None:
        await self._call(self.client.delete(*_keys(channel)))

    # ─── Records ─────────────────────────────────────────────────────────

    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        await self._call(self.client.hset(f"huddle:rec:{kind}", key, value))

    async def get_record(self, kind: str, key: str) -> bytes | None:
        value: bytes | None = await self._call(self.client.hget(f"huddle:rec:{kind}", key))
        return value

    async def delete_record(self, kind: str, key: str) -> None:
        await self._call(self.client.hdel(f"huddle:rec:{kind}", key))

    async def records(self, kind: str) -> dict[str, bytes]:
        raw = await self._call(self.client.hgetall(f"huddle:rec:{kind}"))
        return {_text(k): v for k, v in raw.items()}

    # ─── Other processes ─────────────────────────────────────────────────

    async def publish(self, topic: str, payload: bytes) -> None:
        await self._call(self.client.publish(NOTICES, topic.encode() + b"\n" + payload))

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)
        if self._subscriber is None:
            self._subscriber = asyncio.create_task(self._listen())

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def _listen(self) -> None:
        """Stay subscribed to appends and notices, reconnecting as needed."""
        delay = 0.05
        while True:
            pubsub = self._pubsub_client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(APPENDS, NOTICES)
                self.connected.set()
                delay = 0.05
                for listener in list(self._listeners):
                    listener.store_reconnected()
                async for message in pubsub.listen():
                    try:
                        self._deliver(message)
                    except Exception:
                        # One bad message or listener must not end the
                        # subscription for the whole process.
                        log.exception("pub/sub message not delivered")
            except (*UNAVAILABLE, RedisError) as error:
                log.info("pub/sub lost (%s); retrying", error)
            finally:
                self.connected.clear()
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay)  # backoff before resubscribing
            delay = min(delay * 2, 1.0)

    def _deliver(self, message: dict[str, Any]) -> None:
        data: bytes = message["data"]
        channel = _text(message["channel"])
        if channel == APPENDS:
            uri, seq, entry = data.split(b"\n", 2)
            for listener in list(self._listeners):
                listener.envelope_appended(uri.decode(), int(seq), entry)
        elif channel == NOTICES:
            topic, payload = data.split(b"\n", 1)
            for listener in list(self._listeners):
                listener.notice(topic.decode(), payload)

    # ─── Health ──────────────────────────────────────────────────────────

    async def ready(self) -> bool:
        try:
            return bool(await self.client.ping())
        except UNAVAILABLE:
            return False

    async def close(self) -> None:
        if self._subscriber is not None:
            self._subscriber.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._subscriber
        if self._flusher is not None:
            with contextlib.suppress(Exception):
                await self._flusher
        await self.client.aclose()
        await self._pubsub_client.aclose()


def _answer(item: _Pending, result: Any) -> None:
    """Settle one append with its result from the APPEND script."""
    if item.future.done():
        return
    if isinstance(result, BaseException):
        item.future.set_exception(result)
    elif int(result[0]) == 1:
        item.future.set_result(None)
    elif int(result[0]) == 0:
        item.future.set_exception(SeqConflict(item.channel, item.expected, int(result[1])))
    else:
        item.future.set_exception(ChannelGone(item.channel))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
