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
    {huddle:turn}:waiting          zset    waiting workers (Waiter.id), scored
                                           by the end of their wait
    {huddle:turn}:waiters          hash    Waiter.id -> "<lease seconds> <owner>"
    {huddle:turn}:inbox:<waiter>   list    turns handed to a waiter: a JSON
                                           header [id, token, version, cancel,
                                           lease until, running], a newline,
                                           the payload
    {huddle:turn}:parked           hash    turn id -> why its record does not
                                           decode (see Parked turns below)

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
  decide, not owners), and says whether the lease before was given up
  (``lease_owner`` empty: ``Lease.freed``) rather than left to expire;
- ``renew`` and ``release`` act only while the token is the current one,
  and so does ``give_up``, which releases the lease and queues the turn
  to be claimed at once, with a wake-up token (a stopping worker hands its
  turn on; ``stop_waiting`` gives back what a waiter was handed the same
  way);
- ``save_runnable`` is ``save`` without a lease (its compare-and-set also on
  ``cancel``) and then either a hand-over or ``make_runnable``: when a
  worker is waiting (the latest in ``waiting`` whose wait has not ended)
  and the turn's lease is free, the turn is leased to that worker under a
  new token exactly as ``claim`` leases it, and put with its payload in the
  worker's inbox, which that worker's BLPOP is waiting on: the worker runs
  it without a claim or a load. The caller sends the turn twice, resumed
  and started (both made by the runner's transitions): a hand-over saves
  the started one, RUNNING under the new lease, a queued turn the other. A
  wait that ended (a worker that died waiting) is dropped from ``waiting``
  here, and handed nothing;
- ``claim`` with a waiter (``claim_turn``) first takes the waiter out of
  ``waiting`` and pops its inbox (a turn handed to it, if its lease is
  still the current one), then claims as above and returns the payload
  too; when there is nothing, it registers the waiter in ``waiting``;
- ``wake`` puts an item without a header in a waiter's inbox: its wait
  returns at once with nothing (a worker stopping is told so; every reader
  of an inbox skips such an item);
- ``stop_waiting`` takes a waiter out and gives back what its inbox holds
  (lease released, queued again);
- ``runnable_rider`` is ``save_runnable`` as a rider on a chat's append
  (server.store.base.Rider): the same script, run by the chat store inside
  the append's once the entry landed, on a single Redis that holds both.

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
its own without a socket timeout (redis-py 8 defaults to 5 s), from the
waiter's inbox or ``wake``, whichever has something first. A token
outlives a worker that is not waiting, so no wake-up is lost between a
worker's empty claim and its wait; a burst wakes up to ``WAKE_TOKENS``
workers, one each; a stale token costs one empty claim. The zset is the
truth: workers still claim every ``at_most`` seconds without a wake-up. A
hand-over needs no wake token: the inbox is the wake-up, and an inbox item
outlives a worker that is between its claim and its BLPOP as a token does.

A hand-over to a worker that died while registered (at most one wait,
``at_most``, after its death) waits for that lease to expire, as a turn
whose worker died running it does; a worker that stops cleanly
(``stop_waiting``) gives back what it was handed.

Parked turns: a claimed record this version cannot decode (corrupt, or
written by a newer version whose Turn this one cannot read) would fail
every claim of it, its lease would expire and it would be claimed again
each lease period, for ever. ``claim_turn`` (and a hand-over that
``wait_for_work`` or ``claim_turn`` takes up) instead parks it, in one
script under the lease the claim just took: out of ``runnable``,
``leases`` and its status set (so no recovery sweep queues it again), its
lease given up, its id in ``parked`` with the decoder's error; it logs
that once, at error level, and claims the next turn. Nothing is deleted:
the hash keeps the record as it was. An operator reads ``parked`` (or
:meth:`RedisTurnStore.parked`), repairs or removes the record, and puts a
repaired one back with ``HDEL parked <id>``, ``SADD status:<STATUS> <id>``
and ``ZADD runnable <due> <id>``. A record made runnable again while
still undecodable is parked again (and logged again). A claim of one given
turn that parks it returns None. A hand-over whose header cannot be read
names no turn to park: it is logged and dropped, and its turn is claimed
again when its lease expires (and parked then if its record is what is
wrong). The memory store holds only what it encoded itself and has nothing
to park.

Redis down: every call fails fast with StoreUnavailable (no retries inside,
short timeouts), except ``wait_for_work``, which cannot tell whether work
came and so waits out ``at_most`` as its contract allows (a worker loop
then neither dies nor spins).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import msgspec

from server.errors import StoreUnavailable
from server.runner.errors import Fenced, TurnExists, TurnNotFound, VersionConflict
from server.runner.machine import as_stored
from server.runner.turn import Turn, TurnStatus
from server.runner.turn_store import Claim, Lease, TurnStore, Waiter
from server.store.base import Rider
from server.store.redis_link import RedisLink, Script

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

# KEYS: turn, runnable, wake, leases, tokens, waiting, waiters.  ARGV: status
# key prefix, id, expected version, payload, status, phase, now, tokens kept,
# inbox key prefix, the cancel flag the caller saw (0 or 1), and the turn as
# started (payload, status, phase; '' when not given).
# Returns {1, version, cancel, running (0 or 1)}, {0, current version} on a
# conflict (the version, or the cancel flag, changed), {} when there is no
# such turn.
SAVE_RUNNABLE = """
local held = redis.call('HMGET', KEYS[1], 'version', 'status', 'cancel')
if not held[1] then return {} end
local version = tonumber(held[1])
if version ~= tonumber(ARGV[3]) or tonumber(held[3]) ~= tonumber(ARGV[10]) then
  return {0, version}
end
local now = tonumber(ARGV[7])
local ended = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. ARGV[7])
for _, gone in ipairs(ended) do
  redis.call('ZREM', KEYS[6], gone)
  redis.call('HDEL', KEYS[7], gone)
end
local waiter, seconds, owner
local till = redis.call('ZSCORE', KEYS[4], ARGV[2])
if not (till and tonumber(till) > now) then
  local found = redis.call('ZREVRANGEBYSCORE', KEYS[6], '+inf', ARGV[7], 'LIMIT', 0, 1)[1]
  if found then
    local how = redis.call('HGET', KEYS[7], found)
    redis.call('ZREM', KEYS[6], found)
    redis.call('HDEL', KEYS[7], found)
    seconds, owner = string.match(how or '', '^(%S+) (.*)$')
    if seconds then waiter = found end
  end
end
local running = waiter ~= nil and ARGV[11] ~= ''
local payload, status, phase = ARGV[4], ARGV[5], ARGV[6]
if running then payload, status, phase = ARGV[11], ARGV[12], ARGV[13] end
version = version + 1
redis.call('HSET', KEYS[1], 'version', version, 'status', status, 'phase', phase,
  'payload', payload)
if held[2] ~= status then
  redis.call('SREM', ARGV[1] .. held[2], ARGV[2])
  redis.call('SADD', ARGV[1] .. status, ARGV[2])
end
local cancel = tonumber(held[3])
local flag = running and 1 or 0
if waiter then
  local token = redis.call('INCR', KEYS[5])
  local ends = string.format('%.17g', now + tonumber(seconds))
  redis.call('HSET', KEYS[1], 'lease_owner', owner, 'lease_token', token, 'lease_until', ends)
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZADD', KEYS[4], ends, ARGV[2])
  local header = cjson.encode({ARGV[2], token, version, cancel, ends, flag})
  local inbox = ARGV[9] .. waiter
  redis.call('RPUSH', inbox, header .. '\\n' .. payload)
  redis.call('EXPIRE', inbox, 86400)
  return {1, version, cancel, flag}
end
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[2])
redis.call('LPUSH', KEYS[3], 1)
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[8]) - 1)
return {1, version, cancel, 0}
"""

# What the scripts that read an inbox share: the turn id and token of a
# handed item, and whether its lease is still the current one.
_INBOX_ITEM = """
local function handed(item)
  local newline = string.find(item, '\\n', 1, true)
  if not newline then return nil, nil end
  local header = cjson.decode(string.sub(item, 1, newline - 1))
  return header[1], tonumber(header[2])
end
local function current(prefix, id, token)
  return id ~= nil and tonumber(redis.call('HGET', prefix .. id, 'lease_token')) == token
end
"""

# KEYS: runnable, leases, tokens, waiting, waiters.  ARGV: turn key prefix,
# owner, now, until, id or '', load (0 or 1), waiter or '', inbox key prefix,
# the waiter's wait end, the waiter's "<lease seconds> <owner>".
# Returns {'h', inbox item} for a turn handed to the waiter; {id, token,
# freed: 1 when the lease before was given up, not lost} (and with load:
# payload, version, cancel) for a claim; nil when nothing can be
# claimed (and then the waiter, if any, is registered).
CLAIM = (
    _INBOX_ITEM
    + """
local now = tonumber(ARGV[3])
if ARGV[7] ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[7])
  redis.call('HDEL', KEYS[5], ARGV[7])
  local inbox = ARGV[8] .. ARGV[7]
  while true do
    local item = redis.call('LPOP', inbox)
    if not item then break end
    local id, token = handed(item)
    if current(ARGV[1], id, token) then return {'h', item} end
  end
end
local function exists(id)
  return redis.call('EXISTS', ARGV[1] .. id) == 1
end
local function leased(id)
  local till = redis.call('ZSCORE', KEYS[2], id)
  return till and tonumber(till) > now
end
local function take(id)
  local key = ARGV[1] .. id
  local freed = (redis.call('HGET', key, 'lease_owner') or '') == '' and 1 or 0
  local token = redis.call('INCR', KEYS[3])
  redis.call('HSET', key, 'lease_owner', ARGV[2], 'lease_token', token, 'lease_until', ARGV[4])
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[4], id)
  if ARGV[6] == '1' then
    local held = redis.call('HMGET', key, 'payload', 'version', 'cancel')
    return {id, token, freed, held[1], held[2], held[3]}
  end
  return {id, token, freed}
end
local function nothing()
  if ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[4], ARGV[9], ARGV[7])
    redis.call('HSET', KEYS[5], ARGV[7], ARGV[10])
  end
  return false
end
if ARGV[5] ~= '' then
  if exists(ARGV[5]) and not leased(ARGV[5]) then return take(ARGV[5]) end
  return nothing()
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
  if #expired == 0 then return nothing() end
  if exists(expired[1]) then return take(expired[1]) end
  redis.call('ZREM', KEYS[2], expired[1])
end
"""
)

# What the scripts that give a lease up for another worker share: the
# turn (under the turn key prefix) is released and queued to be claimed at
# once, with a wake-up token, if ``token`` still holds its lease.
_GIVE_UP = """
local function give_up(prefix, id, token, runnable, leases, wake, now, kept)
  local key = prefix .. id
  if tonumber(redis.call('HGET', key, 'lease_token')) ~= tonumber(token) then return 0 end
  if not redis.call('ZSCORE', leases, id) then return 0 end
  redis.call('HSET', key, 'lease_owner', '', 'lease_until', 0)
  redis.call('ZREM', leases, id)
  redis.call('ZADD', runnable, now, id)
  redis.call('LPUSH', wake, 1)
  redis.call('LTRIM', wake, 0, tonumber(kept) - 1)
  return 1
end
"""

# KEYS: waiting, waiters, runnable, leases, wake.  ARGV: waiter, inbox key
# prefix, turn key prefix, now, tokens kept.  Returns how many handed turns
# it gave back.
STOP_WAITING = (
    _INBOX_ITEM
    + _GIVE_UP
    + """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
local given = 0
while true do
  local item = redis.call('LPOP', ARGV[2] .. ARGV[1])
  if not item then return given end
  local id, token = handed(item)
  if id ~= nil then
    given = given + give_up(ARGV[3], id, token, KEYS[3], KEYS[4], KEYS[5], ARGV[4], ARGV[5])
  end
end
"""
)

# KEYS: turn, runnable, leases, wake.  ARGV: turn key prefix, id, token,
# now, tokens kept.  Returns 1, or 0 when the lease is not held (released,
# or taken over).
GIVE_UP = (
    _GIVE_UP
    + """
return give_up(ARGV[1], ARGV[2], ARGV[3], KEYS[2], KEYS[3], KEYS[4], ARGV[4], ARGV[5])
"""
)

# KEYS: a waiter's inbox.  An item without a header wakes the waiter's
# wait with nothing (the readers of an inbox skip it); an inbox it alone
# makes goes within a minute if nobody pops it.
WAKE_WAITER = """
redis.call('RPUSH', KEYS[1], '')
if redis.call('TTL', KEYS[1]) < 0 then redis.call('EXPIRE', KEYS[1], 60) end
return 1
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

# KEYS: turn, runnable, leases, parked.  ARGV: status key prefix, id, lease
# token, why.  Returns 1, or 0 when the token is not the current one.
PARK = """
local held = redis.call('HMGET', KEYS[1], 'lease_token', 'status')
if tonumber(held[1]) ~= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'lease_owner', '', 'lease_until', 0)
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
if held[2] then redis.call('SREM', ARGV[1] .. held[2], ARGV[2]) end
redis.call('HSET', KEYS[4], ARGV[2], ARGV[4])
return 1
"""

_CREATE, _SAVE, _REQUEST_CANCEL = Script(CREATE), Script(SAVE), Script(REQUEST_CANCEL)
_MAKE_RUNNABLE, _CLAIM = Script(MAKE_RUNNABLE), Script(CLAIM)
_RENEW, _RELEASE = Script(RENEW), Script(RELEASE)
_SAVE_RUNNABLE, _STOP_WAITING = Script(SAVE_RUNNABLE), Script(STOP_WAITING)
_PARK, _GIVE_UP_LEASE, _WAKE_WAITER = Script(PARK), Script(GIVE_UP), Script(WAKE_WAITER)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Turn)
_header = msgspec.json.Decoder(tuple[str, int, int, int, str, int])

UNDECODABLE = (msgspec.DecodeError, TypeError, ValueError)
"""What reading a stored record raises when this version cannot decode it
(msgspec's errors; int() and float() of a field that is not a number)."""


class RedisTurnStore(TurnStore):
    """See the module docstring. ``url`` is a store URL of
    ``server.store.redis_link`` (one Redis or a cluster); ``timeout`` bounds
    every call but the blocking wait."""

    def __init__(self, url: str, *, prefix: str = "huddle:turn", timeout: float = 2.0) -> None:
        self.url = self.rides_on = url
        self.timeout = timeout
        tag = "{" + prefix + "}"
        self._turn_prefix = f"{tag}:turn:"
        self._status_prefix = f"{tag}:status:"
        self._runnable = f"{tag}:runnable"
        self._leases = f"{tag}:leases"
        self._wake = f"{tag}:wake"
        self._tokens = f"{tag}:tokens"
        self._waiting = f"{tag}:waiting"
        self._waiters = f"{tag}:waiters"
        self._inbox_prefix = f"{tag}:inbox:"
        self._parked = f"{tag}:parked"
        self.link = RedisLink(url, timeout)
        self.client = self.link.client

    def _turn_key(self, turn_id: str) -> str:
        return self._turn_prefix + turn_id

    def _status_key(self, status: TurnStatus) -> str:
        return self._status_prefix + status.value

    # ─── Turns ───────────────────────────────────────────────────────────

    async def create(self, turn: Turn) -> Turn:
        created = as_stored(turn, version=1, cancel_requested=False)
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
        return as_stored(turn, version=int(version), cancel_requested=cancel == b"1")

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        saved = as_stored(turn, version=turn.version + 1, cancel_requested=False)
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
        return as_stored(result, version=int(out[1]), cancel_requested=bool(out[2]))

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        call, payload, running = self._runnable_call(turn, now, started)
        out = await self.link.run(_SAVE_RUNNABLE, *call)
        return _runnable_saved(turn, out, payload, running)

    def runnable_rider(self, turn: Turn, now: float, *, started: Turn | None = None) -> Rider:
        (keys, args), _, _ = self._runnable_call(turn, now, started)
        return Rider(SAVE_RUNNABLE, keys, args, self.url)

    def rider_saved(self, rider: Rider, turn: Turn) -> Turn:
        assert rider.ran
        return _runnable_saved(turn, rider.reply, rider.args[3], rider.args[10])

    def _runnable_call(
        self, turn: Turn, now: float, started: Turn | None
    ) -> tuple[tuple[list[str], list[Any]], bytes, bytes]:
        """The SAVE_RUNNABLE script's keys and args, and the payloads."""
        saved = as_stored(turn, version=turn.version + 1, cancel_requested=False)
        payload = _encoder.encode(saved)
        running = b""
        if started is not None:
            running = _encoder.encode(
                as_stored(started, version=turn.version + 1, cancel_requested=False)
            )
        keys = [
            self._turn_key(turn.id),
            self._runnable,
            self._wake,
            self._leases,
            self._tokens,
            self._waiting,
            self._waiters,
        ]
        args: list[Any] = [
            self._status_prefix,
            turn.id,
            turn.version,
            payload,
            turn.status.value,
            turn.phase.value,
            repr(now),
            WAKE_TOKENS,
            self._inbox_prefix,
            int(turn.cancel_requested),
            running,
            "" if started is None else started.status.value,
            "" if started is None else started.phase.value,
        ]
        return (keys, args), payload, running

    async def request_cancel(self, turn_id: str) -> None:
        if not await self.link.run(_REQUEST_CANCEL, [self._turn_key(turn_id)], []):
            raise TurnNotFound(turn_id)

    async def cancel_requested(self, turn_id: str) -> bool:
        cancel = await self.link.call(self.client.hget(self._turn_key(turn_id), "cancel"))
        if cancel is None:
            raise TurnNotFound(turn_id)
        return bool(cancel == b"1")

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
        out = await self._claim(owner, now, lease_seconds, turn_id, None, load=False)
        if out is None:
            return None
        claimed, token, freed = out
        return Lease(claimed.decode(), owner, int(token), now + lease_seconds, freed == 1)

    async def claim_turn(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        turn_id: str | None = None,
        *,
        waiter: Waiter | None = None,
    ) -> Claim | None:
        while True:
            out = await self._claim(owner, now, lease_seconds, turn_id, waiter, load=True)
            if out is None:
                return None
            if out[0] == b"h":
                assert waiter is not None
                claim = await self._handed(out[1], waiter.owner)
            else:
                claimed, token, freed, payload, version, cancel = out
                lease = Lease(claimed.decode(), owner, int(token), now + lease_seconds, freed == 1)
                claim = await self._taken(lease, payload, version, cancel == b"1")
            # None: that record was parked (or its hand-over dropped); each
            # pass takes one out of the queue, so this ends.
            if claim is not None or turn_id is not None:
                return claim

    async def _handed(self, item: bytes, owner: str) -> Claim | None:
        """An inbox item (see the module docstring) as the claim it hands
        over; None when it cannot be read (then parked, or dropped)."""
        header, _, payload = item.partition(b"\n")
        try:
            turn_id, token, version, cancel, until, running = _header.decode(header)
            lease = Lease(turn_id, owner, token, float(until))
        except UNDECODABLE as error:
            log.error(
                "dropped a turn handed to %s: its header does not decode (%s); the turn is "
                "claimed again when its lease expires",
                owner,
                error,
            )
            return None
        return await self._taken(lease, payload, version, bool(cancel), running=bool(running))

    async def _taken(
        self, lease: Lease, payload: Any, version: Any, cancel: bool, *, running: bool = False
    ) -> Claim | None:
        """The claim of the record ``lease`` was just taken on, or None when
        this version cannot decode it: then it is parked."""
        try:
            if not isinstance(payload, bytes):
                raise TypeError("the record has no payload")
            turn = as_stored(
                _decoder.decode(payload), version=int(version), cancel_requested=cancel
            )
        except UNDECODABLE as error:
            await self._park(lease, str(error))
            return None
        return Claim(lease, turn, running=running)

    async def _park(self, lease: Lease, why: str) -> None:
        keys = [self._turn_key(lease.turn_id), self._runnable, self._leases, self._parked]
        args = [self._status_prefix, lease.turn_id, lease.token, why]
        if await self.link.run(_PARK, keys, args):
            log.error(
                "parked turn %s: its record does not decode (%s); it is claimed no more "
                "and waits in %s for an operator",
                lease.turn_id,
                why,
                self._parked,
            )

    async def parked(self) -> dict[str, str]:
        """The parked turns (see the module docstring): id -> why."""
        held: dict[Any, Any] = await self.link.call(self.client.hgetall(self._parked))
        return {key.decode(): value.decode() for key, value in held.items()}

    async def _claim(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        turn_id: str | None,
        waiter: Waiter | None,
        *,
        load: bool,
    ) -> Any:
        args = [
            self._turn_prefix,
            owner,
            repr(now),
            repr(now + lease_seconds),
            turn_id or "",
            int(load),
            "" if waiter is None else waiter.id,
            self._inbox_prefix,
            "" if waiter is None else repr(waiter.until),
            "" if waiter is None else f"{waiter.lease_seconds!r} {waiter.owner}",
        ]
        keys = [self._runnable, self._leases, self._tokens, self._waiting, self._waiters]
        return await self.link.run(_CLAIM, keys, args)

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        until = now + lease_seconds
        keys = [self._turn_key(lease.turn_id), self._leases]
        if not await self.link.run(_RENEW, keys, [lease.turn_id, lease.token, until]):
            return None
        return replace(lease, until=until)

    async def release(self, lease: Lease) -> None:
        keys = [self._turn_key(lease.turn_id), self._leases]
        await self.link.run(_RELEASE, keys, [lease.turn_id, lease.token])

    async def give_up(self, lease: Lease, now: float) -> None:
        keys = [self._turn_key(lease.turn_id), self._runnable, self._leases, self._wake]
        args = [self._turn_prefix, lease.turn_id, lease.token, repr(now), WAKE_TOKENS]
        await self.link.run(_GIVE_UP_LEASE, keys, args)

    async def wake(self, waiter: Waiter) -> None:
        await self.link.run(_WAKE_WAITER, [self._inbox_prefix + waiter.id], [], replicate=False)

    async def wait_for_work(self, at_most: float, waiter: Waiter | None = None) -> Claim | None:
        if at_most <= 0:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + at_most
        lists = [self._wake] if waiter is None else [self._inbox_prefix + waiter.id, self._wake]
        try:
            # The blocking client has no socket timeout; this bounds a Redis
            # that accepts the command and then stalls.
            async with asyncio.timeout(at_most + self.timeout):
                popped = await self.link.blpop(lists, at_most)
        except (StoreUnavailable, TimeoutError) as error:
            log.info("cannot wait for work on redis (%s); waiting out %.1fs", error, at_most)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            return None
        if popped is None or waiter is None:
            return None
        where, item = popped
        item = item if isinstance(item, bytes) else item.encode()
        if where in (self._wake, self._wake.encode()) or b"\n" not in item:
            return None  # a wake-up token, or a wake-up of this waiter (wake)
        return await self._handed(item, waiter.owner)

    async def stop_waiting(self, waiter: Waiter, now: float) -> None:
        keys = [self._waiting, self._waiters, self._runnable, self._leases, self._wake]
        args = [waiter.id, self._inbox_prefix, self._turn_prefix, repr(now), WAKE_TOKENS]
        await self.link.run(_STOP_WAITING, keys, args)

    async def close(self) -> None:
        await self.link.close()


def _runnable_saved(turn: Turn, out: Any, payload: bytes, running: bytes) -> Turn:
    """The turn a SAVE_RUNNABLE script's reply ``out`` says was saved:
    ``running`` (the started turn) when it was handed over, else
    ``payload``. Raises TurnNotFound and VersionConflict."""
    if not out:
        raise TurnNotFound(turn.id)
    if int(out[0]) == 0:
        raise VersionConflict(turn.id, turn.version, int(out[1]))
    result = _decoder.decode(running if int(out[3]) else payload)
    return as_stored(result, version=int(out[1]), cancel_requested=bool(out[2]))
