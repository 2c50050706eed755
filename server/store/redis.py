"""The Redis store: durable channels shared by many server processes, on
one Redis or a Redis Cluster (see ``server.store.redis_link`` for the URLs).

Keys, hash-tagged by channel so that one channel's keys, and its topic,
share a cluster slot (``{ahp-chat:/abc}``)::

    huddle:{<uri>}:meta   hash    seq, epoch (the head and the log's life)
    huddle:{<uri>}:log    stream  one entry per seq, id "<seq>-0", field e
    huddle:{<uri>}:snap   hash    seq, state (JSON), written every K actions
    huddle:{<uri>}:news   topic   sharded pub/sub: "a<seq>\n<entry>" for an
                                  append, "n<payload>" for a notice
    huddle:rec:<kind>     hash    small records by key (sessions, forms, ...)

One Lua script appends: it compares the caller's expected seq with the head,
increments it, adds the entry and publishes it on the channel's topic with
``SPUBLISH``, all atomically. Concurrent appends are group-committed:
whatever accumulated while one pipeline was in flight goes out in the next
(one pipeline per node on a cluster), so a process is not capped at one
round trip per action. An append that carries a rider (another store's
write that belongs with it: server.store.base.Rider, the turn a person's
answer resumes) runs both in one script, the rider only once the entry
landed and inside ``pcall`` (a rider that fails leaves the entry appended,
with what it wrote before it failed, and its owner writes on its own); it
goes out at once, not batched. A cluster carries a rider only when its
keys are in the channel's slot; otherwise its owner writes after the
append as before.

Pub/sub only wakes other processes (it may drop messages); the log is the
truth, and hosts compare heads now and then. A process hears the topics it
watches (:meth:`RedisStore.watch`) and nothing else: each is subscribed
with ``SSUBSCRIBE`` on the node that holds the channel (``redis_topics``),
so on a cluster a node's pub/sub traffic stays on that node. Sharded
pub/sub works the same on a single Redis (7.0 or later). Notices are
published on the topic of their ``topic`` (root notices on the root
channel's), and heard by the processes that watch it.

Redis Cluster: every script touches the keys of one channel, in one slot
(RIDING adds a rider's keys, and runs on a cluster only when they are in
the channel's slot: :meth:`RedisStore.carries`).
The steps that span channels are not atomic and need not be: ``heads``
reads each channel's head on its own (one pipeline per node) and the host
compares each with its own cache; the group commit sends each append on
its own; a record kind is one hash, one key per call, so it lives on one
node. Nothing needs two slots at one instant.

Trimming keeps ``retention`` entries and never one newer than the snapshot,
so a snapshot always covers what was trimmed.

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
short timeouts); the subscriptions come back by themselves (on a cluster,
on the node that serves each topic after a failover) and, when they do,
listeners are told to compare heads.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot
from redis.exceptions import RedisError

from server.errors import AlreadyApplied, ChannelGone, SeqConflict, StoreError, StoreUnavailable
from server.store.base import (
    AuditCharge,
    ChannelStore,
    ClientAction,
    Listener,
    Rider,
    StoredChannel,
)
from server.store.redis_link import RedisLink, Script
from server.store.redis_topics import Topics

log = logging.getLogger("huddle.store.redis")


# KEYS: meta, log, origins.  ARGV: expected seq, entry, the channel's topic,
# the action's origin name ('' for none), the retention, its digest.
# Returns {1, seq} on success, {0, head} on a conflict, {-1} when gone,
# {2, seq, same} when the origin was applied already (as seq; same: 1 when
# with this digest, 0 when with another or none known).
# An origin is two members of the same score: its name, and its name and
# digest (ORIGIN_DIGEST), so that one ZREMRANGEBYSCORE trims both.
# XADD goes first: a script that fails keeps its earlier writes, and a
# stream that refuses the id must not leave the head moved without an entry.
APPEND = """
local origin = ARGV[4] or ''
local digested = origin .. '\\n' .. (ARGV[6] or '')
if origin ~= '' then
  local seen = redis.call('ZSCORE', KEYS[3], origin)
  if seen then
    local same = redis.call('ZSCORE', KEYS[3], digested) and 1 or 0
    return {2, tonumber(seen), same}
  end
end
local head = redis.call('HGET', KEYS[1], 'seq')
if not head then return {-1} end
head = tonumber(head)
if head ~= tonumber(ARGV[1]) then return {0, head} end
head = head + 1
redis.call('XADD', KEYS[2], head .. '-0', 'e', ARGV[2])
redis.call('HSET', KEYS[1], 'seq', head)
if origin ~= '' then
  redis.call('ZADD', KEYS[3], head, origin, head, digested)
  if head % 64 == 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', head - tonumber(ARGV[5]))
  end
end
redis.call('SPUBLISH', ARGV[3], 'a' .. head .. '\\n' .. ARGV[2])
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


# KEYS: the claim.  ARGV: owner, ttl (ms), the caller's now and the claim's
# end on the caller's clock (ms; both '' when it passed none).  Returns nil
# when it is the owner's now (renewed), else the owner that holds it.  A
# claim with an end on the caller's clock is held as "<owner> <end>".
CLAIM = """
local held = redis.call('GET', KEYS[1])
if held then
  local owner, ends = string.match(held, '^(.*) (%d+)$')
  if not owner then owner = held end
  local lapsed = ends and ARGV[3] ~= '' and tonumber(ends) <= tonumber(ARGV[3])
  if owner ~= ARGV[1] and not lapsed then return owner end
end
if tonumber(ARGV[2]) <= 0 then
  redis.call('DEL', KEYS[1])
elseif ARGV[4] ~= '' then
  redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[4], 'PX', ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return false
"""

# KEYS: the records' hash.  ARGV: key, value.  Returns the value the key
# holds (``value`` when it held none).
KEEP = """
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
"""

# KEYS: the count.  ARGV: size, most, ttl (ms).  Returns 0 when added, else
# the milliseconds until the count is reset (server.store.base.tally).
TALLY = """
local count = tonumber(redis.call('GET', KEYS[1]) or '0')
local size = tonumber(ARGV[1])
if size > 0 and count + size > tonumber(ARGV[2]) then
  local left = redis.call('PTTL', KEYS[1])
  if left <= 0 then return tonumber(ARGV[3]) end
  return left
end
if count + size <= 0 then
  redis.call('DEL', KEYS[1])
  return 0
end
redis.call('INCRBY', KEYS[1], size)
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 0
"""

# KEYS: the bucket.  ARGV: rate, burst, want, now (s).  Returns what it took
# (server.store.base.draw), as a string (Lua would cut a number to an integer).
DRAW = """
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, now = tonumber(ARGV[3]), tonumber(ARGV[4])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens, stamp = tonumber(held[1]), tonumber(held[2])
if not tokens or not stamp then tokens, stamp = burst, now end
if now > stamp then
  tokens = math.min(burst, tokens + (now - stamp) * rate)
  stamp = now
end
local took = math.min(want, math.max(tokens, 0))
tokens = tokens - took
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'stamp', string.format('%.17g', stamp))
local full = 86400
if rate > 0 then full = math.min(full, math.ceil((burst - tokens) / rate) + 1) end
redis.call('EXPIRE', KEYS[1], math.max(1, full))
return string.format('%.17g', took)
"""

# KEYS: the audit list.  ARGV: n, record.  Returns -1 when appended, else
# how many records the audit holds.
AUDIT = """
local held = redis.call('LLEN', KEYS[1])
if held ~= tonumber(ARGV[1]) - 1 then return held end
redis.call('RPUSH', KEYS[1], ARGV[2])
return -1
"""

# KEYS: the audit list, its charges (a hash, by payer).  ARGV: payer, records,
# share, room.  Returns 0 when charged, 1 past the payer's share, 2 past the
# audit's room (server.store.base.ChannelStore.charge_audit).
CHARGE = """
local records = tonumber(ARGV[2])
local held = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if records > 0 then
  if held + records > tonumber(ARGV[3]) then return 1 end
  if redis.call('LLEN', KEYS[1]) + records > tonumber(ARGV[4]) then return 2 end
end
if held + records > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], held + records)
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 0
"""

# APPEND, and a rider (server.store.base.Rider) once the entry landed, as one
# script: KEYS and ARGV are APPEND's three and six, then the rider's. Each
# body runs as a function of its own KEYS and ARGV. Returns {APPEND's reply}
# when it did not append, {APPEND's reply, 1, the rider's reply (false for
# none)} when it did, and {APPEND's reply, 0, the error} when the rider
# raised or returned an error (pcall: the entry stays appended, and so does
# what the rider wrote before it failed: a script is not rolled back).
RIDING = """
local function append(KEYS, ARGV)
%(append)s
end
local function rider(KEYS, ARGV)
%(rider)s
end
local own, theirs, own_args, their_args = {}, {}, {}, {}
for i = 1, #KEYS do
  if i <= 3 then own[i] = KEYS[i] else theirs[i - 3] = KEYS[i] end
end
for i = 1, #ARGV do
  if i <= 6 then own_args[i] = ARGV[i] else their_args[i - 6] = ARGV[i] end
end
local appended = append(own, own_args)
if appended[1] ~= 1 then return {appended} end
local ok, reply = pcall(rider, theirs, their_args)
if not ok or (type(reply) == 'table' and reply.err) then
  if type(reply) == 'table' then reply = reply.err end
  return {appended, 0, tostring(reply)}
end
if reply == nil then reply = false end
return {appended, 1, reply}
"""

_CREATE, _LOAD, _APPEND = Script(CREATE), Script(LOAD), Script(APPEND)
_CLAIM, _AUDIT, _TALLY, _KEEP = Script(CLAIM), Script(AUDIT), Script(TALLY), Script(KEEP)
_DRAW = Script(DRAW)
_CHARGE = Script(CHARGE)
_READ_LOG, _SNAPSHOT, _RESTORE = Script(READ_LOG), Script(SNAPSHOT), Script(RESTORE)


def _claim_key(key: str) -> str:
    return "huddle:claim:{" + key + "}"


def _keys(channel: str) -> tuple[str, str, str]:
    tag = "{" + channel + "}"
    return f"huddle:{tag}:meta", f"huddle:{tag}:log", f"huddle:{tag}:snap"


def _origins(channel: str) -> str:
    """The clients' actions of the replay window: a sorted set, by seq, of
    each one's name and its :func:`_digested` name."""
    return "huddle:{" + channel + "}:origins"


def _digested(origin: ClientAction) -> str:
    """The member of :func:`_origins` that says what ``origin`` was (APPEND
    builds the same)."""
    return f"{origin.name}\n{origin.digest}"


def _audit(session: str) -> str:
    """The session's audit: a list of records, never trimmed."""
    return "huddle:audit:{" + session + "}"


def _charges(session: str) -> str:
    """What each payer's records took of the session's audit: a hash, by
    payer, in the audit's slot."""
    return _audit(session) + ":charges"


_CHARGED: tuple[AuditCharge, ...] = ("charged", "share", "full")
"""CHARGE's replies, in order."""

_TOPIC_HEAD, _TOPIC_TAIL = "huddle:{", "}:news"


def topic_of(channel: str) -> str:
    """The sharded pub/sub channel of ``channel`` (in the channel's slot)."""
    return _TOPIC_HEAD + channel + _TOPIC_TAIL


def _channel_of(topic: str) -> str:
    return topic[len(_TOPIC_HEAD) : -len(_TOPIC_TAIL)]


@dataclass
class _Pending:
    channel: str
    expected: int
    entry: bytes
    future: asyncio.Future[None]
    origin: ClientAction | None = None


class RedisStore(ChannelStore):
    """See the module docstring. ``url`` is a store URL of
    ``server.store.redis_link``: one Redis or a cluster."""

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
        self.link = RedisLink(url, timeout)
        self.client = self.link.client
        self.topics = Topics(self.link, self._deliver, self._resubscribed)
        self._listeners: list[Listener] = []
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self._sending: list[_Pending] = []
        """The batch of appends the flusher has on its way."""
        self._riding: dict[str, Script] = {}
        """The RIDING script of each rider's source."""

    # ─── Channels ────────────────────────────────────────────────────────

    async def create(self, channel: str, state: bytes) -> bool:
        created = await self.link.run(_CREATE, _keys(channel), [state, secrets.token_hex(8)])
        return bool(created)

    async def load(self, channel: str) -> StoredChannel:
        # A repair of a lost log that is itself lost (a failover) is harmless:
        # the next load finds the log lost again and repairs it again.
        out = await self.link.run(_LOAD, _keys(channel), [secrets.token_hex(8)], replicate=False)
        if not out:
            raise ChannelGone(channel)
        epoch, snap_seq, state, *entries = out
        return StoredChannel(
            epoch=_text(epoch), snapshot_seq=int(snap_seq), snapshot=state, log=list(entries)
        )

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(channel, expected_seq, envelope, future, origin))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        await future

    def carries(self, store: str, channel: str | None = None, keys: Sequence[str] = ()) -> bool:
        # One script must reach both stores' keys: the same Redis and, on a
        # cluster, the channel's slot (a rider of another slot falls back).
        if store != self.url:
            return False
        if self.link.cluster is None or channel is None:
            return True
        slot = key_slot(_keys(channel)[0].encode())
        return all(key_slot(key.encode()) == slot for key in keys)

    async def append_riding(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None,
        rider: Rider,
    ) -> None:
        # Not group-committed: the caller holds the channel's lock, so this
        # is the channel's one append in flight, and it goes out at once.
        assert self.carries(rider.store, channel, rider.keys), "a rider for another store"
        script = self._riding.get(rider.source)
        if script is None:
            if len(self._riding) >= 16:
                self._riding.clear()  # riders come from code, a few kinds
            source = RIDING % {"append": APPEND, "rider": rider.source}
            script = self._riding[rider.source] = Script(source)
        keys = [*_keys(channel)[:2], _origins(channel), *rider.keys]
        args = [expected_seq, envelope, topic_of(channel), *_origin_args(origin, self.retention)]
        try:
            out = await self.link.run(script, keys, [*args, *rider.args])
        except (StoreUnavailable, RedisError) as error:
            rider.unknown = True  # the entry, and so the rider, may have landed
            if isinstance(error, StoreUnavailable):
                raise
            raise StoreUnavailable(f"redis: {error}") from None
        appended, *rode = out
        failed = _outcome(channel, expected_seq, appended)
        if failed is not None:
            raise failed
        rider.ran = int(rode[0]) == 1
        rider.reply = rode[1]
        if not rider.ran:
            log.error("a rider on %s failed in its script: %s", channel, _text(rode[1]))

    async def _flush(self) -> None:
        """Send every pending append, pipelined, until none is left. Every
        append taken into a batch is answered, whatever fails: its caller
        holds the channel's lock while it waits."""
        while self._pending:
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            self._sending = batch
            try:
                calls = [
                    (
                        (*_keys(item.channel)[:2], _origins(item.channel)),
                        (
                            item.expected,
                            item.entry,
                            topic_of(item.channel),
                            *_origin_args(item.origin, self.retention),
                        ),
                    )
                    for item in batch
                ]
                results = await self.link.run_batch(_APPEND, calls)
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

    async def applied(self, channel: str, origin: ClientAction) -> AlreadyApplied | None:
        pipe = self.client.pipeline(transaction=False)
        pipe.zscore(_origins(channel), origin.name)
        pipe.zscore(_origins(channel), _digested(origin))
        seen, same = await self.link.call(pipe.execute())
        if seen is None:
            return None
        return AlreadyApplied(channel, int(seen), same_action=same is not None)

    async def read_log(self, channel: str, after_seq: int, epoch: str) -> list[bytes] | None:
        out = await self.link.run(
            _READ_LOG, _keys(channel)[:2], [after_seq, epoch], replicate=False
        )
        if not out:
            raise ChannelGone(channel)
        if int(out[0]) == 0:
            return None
        return list(out[1:])

    async def restore(self, channel: str, seq: int, state: bytes) -> str | None:
        epoch = secrets.token_hex(8)
        restored = await self.link.run(_RESTORE, _keys(channel), [seq, state, epoch])
        return epoch if restored else None

    async def heads(self, channels: list[str]) -> dict[str, tuple[str, int]]:
        pipe = self.client.pipeline(transaction=False)
        for channel in channels:
            pipe.hmget(_keys(channel)[0], "epoch", "seq")
        results = await self.link.call(pipe.execute())
        return {
            channel: (_text(epoch), int(seq))
            for channel, (epoch, seq) in zip(channels, results, strict=True)
            if epoch is not None and seq is not None
        }

    async def save_snapshot(self, channel: str, seq: int, state: bytes) -> None:
        # A snapshot lost in a failover took its trimming with it: harmless.
        args = [seq, state, self.retention]
        await self.link.run(_SNAPSHOT, _keys(channel), args, replicate=False)

    async def delete(self, channel: str) -> None:
        keys = (*_keys(channel), _origins(channel))
        await self.link.write(keys[0], lambda pipe: pipe.execute_command("DEL", *keys))

    # ─── Records ─────────────────────────────────────────────────────────

    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        name = f"huddle:rec:{kind}"
        await self.link.write(name, lambda pipe: pipe.hset(name, key, value))

    async def get_record(self, kind: str, key: str) -> bytes | None:
        value: Any = await self.link.call(self.client.hget(f"huddle:rec:{kind}", key))
        return None if value is None else bytes(value)

    async def keep_record(self, kind: str, key: str, value: bytes) -> bytes:
        return bytes(await self.link.run(_KEEP, [f"huddle:rec:{kind}"], [key, value]))

    async def delete_record(self, kind: str, key: str) -> None:
        name = f"huddle:rec:{kind}"
        await self.link.write(name, lambda pipe: pipe.hdel(name, key))

    async def remember(self, key: str, value: bytes, ttl: float) -> None:
        name = "huddle:kept:{" + key + "}"
        milliseconds = max(1, int(ttl * 1000))
        await self.link.write(name, lambda pipe: pipe.set(name, value, px=milliseconds))

    async def recall(self, key: str) -> bytes | None:
        value: Any = await self.link.call(self.client.get("huddle:kept:{" + key + "}"))
        return None if value is None else bytes(value)

    async def tally(self, key: str, size: int, most: int, ttl: float) -> float:
        name = "huddle:tally:{" + key + "}"
        left = await self.link.run(_TALLY, [name], [size, most, max(1, int(ttl * 1000))])
        return int(left) / 1000

    async def draw(self, key: str, rate: float, burst: int, want: float, now: float) -> float:
        name = "huddle:bucket:{" + key + "}"
        took = await self.link.run(_DRAW, [name], [repr(rate), burst, repr(want), repr(now)])
        return float(took)

    async def claim(self, key: str, owner: str, ttl: float, now: float | None = None) -> str | None:
        milliseconds = max(1, int(ttl * 1000)) if ttl > 0 else 0
        on_clock = ("", "") if now is None else (int(now * 1000), int((now + ttl) * 1000))
        held = await self.link.run(_CLAIM, [_claim_key(key)], [owner, milliseconds, *on_clock])
        return None if held is None else _text(held)

    async def claimant(self, key: str, now: float | None = None) -> str | None:
        held: Any = await self.link.call(self.client.get(_claim_key(key)))
        if held is None:
            return None
        owner, _, ends = _text(held).rpartition(" ")
        if not owner or not ends.isdigit():
            return _text(held)
        return None if now is not None and int(ends) <= int(now * 1000) else owner

    async def records(self, kind: str) -> dict[str, bytes]:
        raw: dict[Any, Any] = await self.link.call(self.client.hgetall(f"huddle:rec:{kind}"))
        return {_text(k): v for k, v in raw.items()}

    async def count_records(self, kind: str) -> int:
        return int(await self.link.call(self.client.hlen(f"huddle:rec:{kind}")))

    # ─── Audit ───────────────────────────────────────────────────────────

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        held = int(await self.link.run(_AUDIT, [_audit(session)], [n, record]))
        if held >= 0:
            raise SeqConflict(session, n - 1, held)

    async def charge_audit(
        self, session: str, payer: str, records: int, share: int, room: int
    ) -> AuditCharge:
        keys = [_audit(session), _charges(session)]
        refused = int(await self.link.run(_CHARGE, keys, [payer, records, share, room]))
        return _CHARGED[refused]

    async def read_audit(self, session: str, after: int, limit: int) -> list[bytes]:
        start = max(0, after)
        out: list[Any] = await self.link.call(
            self.client.lrange(_audit(session), start, start + limit - 1)
        )
        return [bytes(record) for record in out]

    async def last_audit(self, session: str) -> bytes | None:
        record: Any = await self.link.call(self.client.lindex(_audit(session), -1))
        return None if record is None else bytes(record)

    async def delete_audit(self, session: str) -> None:
        name = _audit(session)
        await self.link.write(name, lambda pipe: pipe.delete(name, _charges(session)))

    # ─── Other processes ─────────────────────────────────────────────────

    async def publish(self, topic: str, payload: bytes) -> None:
        await self.link.call(self.client.spublish(topic_of(topic), b"n" + payload))

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def watch(self, channel: str) -> None:
        await self.topics.watch(topic_of(channel))

    async def unwatch(self, channel: str) -> None:
        await self.topics.unwatch(topic_of(channel))

    def _deliver(self, topic: str, data: bytes) -> None:
        channel, kind, body = _channel_of(topic), data[:1], data[1:]
        if kind == b"a":
            seq, entry = body.split(b"\n", 1)
            for listener in list(self._listeners):
                listener.envelope_appended(channel, int(seq), entry)
        elif kind == b"n":
            for listener in list(self._listeners):
                listener.notice(channel, body)
        else:
            raise ValueError(f"not an announcement on {topic}: {data[:20]!r}")

    def _resubscribed(self) -> None:
        for listener in list(self._listeners):
            listener.store_reconnected()

    # ─── Health ──────────────────────────────────────────────────────────

    async def ready(self) -> bool:
        return await self.link.ping()

    async def close(self) -> None:
        """Close the connections. An append still on its way is answered
        StoreUnavailable (it may have landed, as after any timeout), not
        waited for: whoever wanted its answer stopped before the store is
        closed, and a Redis that hangs would hold the close for a store
        timeout."""
        await self.topics.close()
        closed = StoreUnavailable("redis: the store was closed before Redis answered")
        for item in (*self._sending, *self._pending):
            if not item.future.done():
                item.future.set_exception(closed)
        self._pending.clear()
        # Closing the connections ends the flusher's read at once. It is not
        # cancelled: a cancel can be lost inside redis-py on Python 3.11
        # (asyncio.wait_for drops one that meets a finished write), and the
        # read then runs to the store timeout.
        await self.link.close()
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)


def _answer(item: _Pending, result: Any) -> None:
    """Settle one append with its result from the APPEND script."""
    if item.future.done():
        return
    if isinstance(result, BaseException):
        item.future.set_exception(result)
    elif (error := _outcome(item.channel, item.expected, result)) is not None:
        item.future.set_exception(error)
    else:
        item.future.set_result(None)


def _outcome(channel: str, expected: int, result: Any) -> StoreError | None:
    """What the APPEND script's ``result`` says went wrong (None: appended)."""
    if int(result[0]) == 1:
        return None
    if int(result[0]) == 0:
        return SeqConflict(channel, expected, int(result[1]))
    if int(result[0]) == 2:
        return AlreadyApplied(channel, int(result[1]), same_action=int(result[2]) == 1)
    return ChannelGone(channel)


def _origin_args(origin: ClientAction | None, retention: int) -> tuple[str, int, str]:
    """APPEND's ARGV 4 to 6 for ``origin``."""
    if origin is None:
        return "", retention, ""
    return origin.name, retention, origin.digest


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
