"""The Redis turn store: durable turns shared by every server and worker,
on one Redis or a Redis Cluster (``server.store.redis_link`` has the URLs).

Keys, all under one hash tag (the prefix, ``{huddle:turn}`` by default)::

    {huddle:turn}:turn:<id>        hash    version, status, phase, lease_owner,
                                           lease_token, lease_until, cancel,
                                           payload (the Turn as JSON)
    {huddle:turn}:status:<STATUS>  set     the ids of the turns in STATUS
    {huddle:turn}:runnable         zset    turns to claim, scored by due time
    {huddle:turn}:leases           zset    held leases, scored by lease_until
    {huddle:turn}:wake             list    wake-up tokens for waiting workers
    {huddle:turn}:tokens           string  the last fencing token handed out

Every write is one Lua script, so it is atomic:

- ``create`` writes the hash at version 1 unless it exists;
- ``save``, given a lease, first compares its token with ``lease_token``
  (Fenced: a worker taken over must stop, not reload as a VersionConflict
  would tell it), then compares ``version`` (VersionConflict), then writes
  payload, status, phase and version + 1 and moves the id between status
  sets. It never touches ``cancel``, so no save clears a cancel request;
- ``claim`` takes the given turn, else the earliest due member of
  ``runnable`` that is not leased, else the turn whose lease expired first,
  under a new fencing token from ``tokens`` (tokens only grow and are never
  reused, so a worker id that is reused never inherits a lease: tokens
  decide, not owners);
- ``renew`` and ``release`` act only while the token is the current one.

A turn is leased while it is in ``leases`` with a score after now; the
hash's ``lease_owner`` and ``lease_until`` say the same for people reading
it. The store keeps no clock: every time is the caller's ``now``.

Redis Cluster: ``claim`` finds turn ids in the shared zsets and then writes
those turns' hashes, and ``save`` moves ids between status sets, so no key
layout could put one turn's keys in a slot of their own and keep the
scripts atomic. Every runner key therefore carries the same hash tag: the
scripts stay atomic on a cluster (they build the keys they discover from
the prefix, which Redis allows within the slot of their declared keys), at
the price that the whole turn store lives on one shard. Turns are written a
few times per model or tool step, far less often than chat channels, whose
keys are tagged per channel and spread over the cluster. Since every key
is in one slot, no step of this store spans slots; a failover of that
shard's primary makes the store unavailable until its replica is promoted,
and then it carries on by itself (the slot map is read again after a
failure).

Waking: ``make_runnable`` pushes a token on ``wake`` (keeping at most
``WAKE_TOKENS``) and ``wait_for_work`` pops one with BLPOP, on a client of
its own without a socket timeout (redis-py 8 defaults to 5 s). A token
outlives a worker that is not waiting, so no wake-up is lost between a
worker's empty claim and its wait; a burst wakes up to ``WAKE_TOKENS``
workers, one each; a stale token costs one empty claim. The zset is the
truth: workers still claim every ``at_most`` seconds without a wake-up.

Redis down: every call fails fast with StoreUnavailable (no retries inside,
short timeouts), except ``wait_for_work``, which cannot tell whether work
came and so waits out ``at_most`` as its contract allows (a worker loop
then neither dies nor spins).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgspec

from server.runner.errors import Fenced, TurnExists, TurnNotFound, VersionConflict
from server.runner.store import Lease, TurnStore
from server.runner.turn import Turn, TurnStatus
from server.store.redis_link import UNAVAILABLE, RedisLink, Script

log = logging.getLogger("huddle.runner.redis_store")

WAKE_TOKENS = 64
"""Wake-up tokens kept for workers that are not waiting yet."""


# KEYS: turn, its status set.  ARGV: payload, status, phase, id.
# Returns 1, or 0 if the turn exists.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'version', 1, 'status', ARGV[2], 'phase', ARGV[3],
  'lease_owner', '', 'lease_token', 0, 'lease_until', 0, 'cancel', 0, 'payload', ARGV[1])
redis.call('SADD', KEYS[2], ARGV[4])
return 1
"""

# KEYS: turn.  ARGV: status key prefix, id, expected version, lease token or
# '', payload, status, phase.
# Returns {1, version, cancel}, {0, current version} on a conflict, {-1} when
# fenced, {} when there is no such turn.
SAVE = """
local held = redis.call('HMGET', KEYS[1], 'version', 'lease_token', 'status', 'cancel')
if not held[1] then return {} end
local version = tonumber(held[1])
if ARGV[4] ~= '' and tonumber(held[2]) ~= tonumber(ARGV[4]) then return {-1} end
if version ~= tonumber(ARGV[3]) then return {0, version} end
version = version + 1
redis.call('HSET', KEYS[1], 'version', version, 'status', ARGV[6], 'phase', ARGV[7],
  'payload', ARGV[5])
if held[3] ~= ARGV[6] then
  redis.call('SREM', ARGV[1] .. held[3], ARGV[2])
  redis.call('SADD', ARGV[1] .. ARGV[6], ARGV[2])
end
return {1, version, tonumber(held[4])}
"""

# KEYS: turn.  Returns 1, or 0 when there is no such turn.
REQUEST_CANCEL = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'cancel', 1)
return 1
"""

# KEYS: turn, runnable, wake.  ARGV: id, due at, tokens kept.
# Returns 1, or 0 when there is no such turn.
MAKE_RUNNABLE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('LPUSH', KEYS[3], 1)
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[3]) - 1)
return 1
"""

# KEYS: runnable, leases, tokens.  ARGV: turn key prefix, owner, now, until, id or ''.
# Returns {id, token}, or nil when nothing can be claimed.
CLAIM = """
local now = tonumber(ARGV[3])
local function exists(id)
  return redis.call('EXISTS', ARGV[1] .. id) == 1
end
local function leased(id)
  local till = redis.call('ZSCORE', KEYS[2], id)
  return till and tonumber(till) > now
end
local function take(id)
  local key = ARGV[1] .. id
  local token = redis.call('INCR', KEYS[3])
  redis.call('HSET', key, 'lease_owner', ARGV[2], 'lease_token', token, 'lease_until', ARGV[4])
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  return {id, token}
end
if ARGV[5] ~= '' then
  if exists(ARGV[5]) and not leased(ARGV[5]) then return take(ARGV[5]) end
  return false
end
local offset = 0
while true do
  local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[3], 'LIMIT', offset, 64)
  if #due == 0 then break end
  for _, id in ipairs(due) do
    if exists(id) and not leased(id) then return take(id) end
  end
  offset = offset + #due
end
while true do
  local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[3], 'LIMIT', 0, 1)
  if #expired == 0 then return false end
  if exists(expired[1]) then return take(expired[1]) end
  redis.call('ZREM', KEYS[2], expired[1])
end
"""

# KEYS: turn, leases.  ARGV: id, token, until.  Returns 1, or 0 if not held.
RENEW = """
if tonumber(redis.call('HGET', KEYS[1], 'lease_token')) ~= tonumber(ARGV[2]) then return 0 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""

# KEYS: turn, leases.  ARGV: id, token.  Returns 1, or 0 if not current.
RELEASE = """
if tonumber(redis.call('HGET', KEYS[1], 'lease_token')) ~= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_until', 0)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
"""

_CREATE, _SAVE, _REQUEST_CANCEL = Script(CREATE), Script(SAVE), Script(REQUEST_CANCEL)
_MAKE_RUNNABLE, _CLAIM = Script(MAKE_RUNNABLE), Script(CLAIM)
_RENEW, _RELEASE = Script(RENEW), Script(RELEASE)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Turn)


class RedisTurnStore(TurnStore):
    """See the module docstring. ``url`` is a store URL of
    ``server.store.redis_link`` (one Redis or a cluster); ``timeout`` bounds
    every call but the blocking wait."""

    def __init__(self, url: str, *, prefix: str = "huddle:turn", timeout: float = 2.0) -> None:
        self.url = url
        self.timeout = timeout
        tag = "{" + prefix + "}"
        self._turn_prefix = f"{tag}:turn:"
        self._status_prefix = f"{tag}:status:"
        self._runnable = f"{tag}:runnable"
        self._leases = f"{tag}:leases"
        self._wake = f"{tag}:wake"
        self._tokens = f"{tag}:tokens"
        self.link = RedisLink(url, timeout)
        self.client = self.link.client

    def _turn_key(self, turn_id: str) -> str:
        return self._turn_prefix + turn_id

    def _status_key(self, status: TurnStatus) -> str:
        return self._status_prefix + status.value

    # ─── Turns ───────────────────────────────────────────────────────────

    async def create(self, turn: Turn) -> Turn:
        created = msgspec.structs.replace(turn, version=1, cancel_requested=False)
        payload = _encoder.encode(created)
        keys = [self._turn_key(turn.id), self._status_key(turn.status)]
        args = [payload, turn.status.value, turn.phase.value, turn.id]
        if not await self.link.run(_CREATE, keys, args):
            raise TurnExists(turn.id)
        return _decoder.decode(payload)

    async def load(self, turn_id: str) -> Turn:
        held: list[Any] = await self.link.call(
            self.client.hmget(self._turn_key(turn_id), "payload", "version", "cancel")
        )
        payload, version, cancel = held
        if payload is None:
            raise TurnNotFound(turn_id)
        turn = _decoder.decode(payload)
        turn.version, turn.cancel_requested = int(version), cancel == b"1"
        return turn

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        saved = msgspec.structs.replace(turn, version=turn.version + 1, cancel_requested=False)
        payload = _encoder.encode(saved)
        token = "" if lease is None else lease.token
        args = [
            self._status_prefix,
            turn.id,
            turn.version,
            token,
            payload,
            turn.status.value,
            turn.phase.value,
        ]
        out = await self.link.run(_SAVE, [self._turn_key(turn.id)], args)
        if not out:
            raise TurnNotFound(turn.id)
        if int(out[0]) == 0:
            raise VersionConflict(turn.id, turn.version, int(out[1]))
        if int(out[0]) == -1:
            assert lease is not None
            raise Fenced(turn.id, lease.token)
        result = _decoder.decode(payload)
        result.version, result.cancel_requested = int(out[1]), bool(out[2])
        return result

    async def request_cancel(self, turn_id: str) -> None:
        if not await self.link.run(_REQUEST_CANCEL, [self._turn_key(turn_id)], []):
            raise TurnNotFound(turn_id)

    async def by_status(self, status: TurnStatus) -> list[str]:
        members: set[Any] = await self.link.call(self.client.smembers(self._status_key(status)))
        return sorted(member.decode() for member in members)

    # ─── Runnable turns and leases ───────────────────────────────────────

    async def make_runnable(self, turn_id: str, due_at: float) -> None:
        keys = [self._turn_key(turn_id), self._runnable, self._wake]
        if not await self.link.run(_MAKE_RUNNABLE, keys, [turn_id, due_at, WAKE_TOKENS]):
            raise TurnNotFound(turn_id)

    async def claim(
        self, owner: str, now: float, lease_seconds: float, turn_id: str | None = None
    ) -> Lease | None:
        until = now + lease_seconds
        args = [self._turn_prefix, owner, now, until, turn_id or ""]
        keys = [self._runnable, self._leases, self._tokens]
        out = await self.link.run(_CLAIM, keys, args)
        if out is None:
            return None
        claimed, token = out
        return Lease(claimed.decode(), owner, int(token), until)

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        until = now + lease_seconds
        keys = [self._turn_key(lease.turn_id), self._leases]
        if not await self.link.run(_RENEW, keys, [lease.turn_id, lease.token, until]):
            return None
        return Lease(lease.turn_id, lease.owner, lease.token, until)

    async def release(self, lease: Lease) -> None:
        keys = [self._turn_key(lease.turn_id), self._leases]
        await self.link.run(_RELEASE, keys, [lease.turn_id, lease.token])

    async def wait_for_work(self, at_most: float) -> None:
        if at_most <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + at_most
        try:
            # The blocking client has no socket timeout; this bounds a Redis
            # that accepts the command and then stalls.
            async with asyncio.timeout(at_most + self.timeout):
                await self.link.blocking.blpop([self._wake], timeout=at_most)
        except (*UNAVAILABLE, TimeoutError) as error:
            log.info("cannot wait for work on redis (%s); waiting out %.1fs", error, at_most)
            await asyncio.sleep(max(0.0, deadline - loop.time()))

    async def close(self) -> None:
        await self.link.close()
