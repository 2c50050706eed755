"""The Redis turn store: durable turns shared by every server and worker,
on one Redis or a Redis Cluster (``server.store.redis_link`` has the URLs).

Keys, in groups (below); a group's keys all carry its hash tag, here the
first group's, ``{huddle:turn}`` (the prefix, by default)::

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
  the append's once the entry landed, where one script reaches both
  (see Groups below).

A turn is leased while it is in ``leases`` with a score after now; the
hash's ``lease_owner`` and ``lease_until`` say the same for people reading
it. The store keeps no clock: every time is the caller's ``now``.

Groups: every script keeps to one slot, so no key layout can put one
turn's keys in a slot of their own (``claim`` finds ids in a queue and
then writes their hashes; ``save`` moves ids between status sets). The
turns are spread instead over groups, each a whole layout as above under
its own hash tag, each turn in the group :func:`group_index` picks from
its id. On one Redis there is one group (``{huddle:turn}``, the layout of
earlier versions); on a cluster ``CLUSTER_GROUPS``, tagged so that their
slots are spread evenly (:func:`turn_groups`), so the turns and the work
on them are spread over every primary. A step on one turn is one script
in its group, as on one Redis, fenced the same way (each group hands out
its own fencing tokens: a token is compared only with its turn's).

The first group is the desk: workers register as waiting there, and wait
on its ``wake`` list and their inbox there (a BLPOP keeps to one slot too).
So a turn of the desk is handed over as described above; a turn of another
group is queued in its group, and a wake-up token then put on the desk's
``wake`` (a second command, after the queue was written: it only wakes).
A claim of no given turn reads, in one pipeline per node, what each group
would give first (``DUE``: a hand-over in the desk's inbox, then the
earliest due turn, then the earliest expired lease) and claims in that
order, so a claim takes the earliest due turn across groups as within
one, and no group waits behind another; only when nothing is left anywhere
does its last claim, on the desk, register the waiter. A resume rides on
a chat's append (``runnable_rider``) only for a turn of the desk, and on
a cluster only where the chat's slot is the desk's
(:meth:`server.store.redis.RedisStore.carries`); else it is saved after
the append. A failover of one primary makes the turns of its groups
unavailable until its replica is promoted; the others carry on.

Turns written by a version that kept every turn under ``{huddle:turn}`` on
a cluster are read only if their id falls in the first group: drain the
runner (no turn waiting or running) before upgrading a cluster, as
docs/redis.md says. On one Redis nothing moves.

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
and ``ZADD runnable <due> <id>``, all under the hash tag of the turn's group
(``RedisTurnStore.group_of``). A record made runnable again while
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
import functools
import itertools
import logging
import zlib
from dataclasses import dataclass, replace
from typing import Any

import msgspec
from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

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
# the waiter's wait end ('': do not register it), the waiter's "<lease
# seconds> <owner>".
# Returns {'h', inbox item} for a turn handed to the waiter; {id, token,
# freed: 1 when the lease before was given up, not lost} (and with load:
# payload, version, cancel) for a claim; nil when nothing can be claimed
# (and then the waiter, if any and given a wait end, is registered).
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
  if ARGV[7] ~= '' and ARGV[9] ~= '' then
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

# KEYS: runnable, leases.  ARGV: now, a waiter's inbox or ''.  Returns what
# a claim of the group would take first, as {rank, at}: {0, ''} when the
# inbox holds something, {1, due time} for a due runnable turn, {2, lease
# end} for an expired lease (the order CLAIM takes them in); nil for none.
DUE = """
if ARGV[2] ~= '' and redis.call('LLEN', ARGV[2]) > 0 then return {0, ''} end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, 1)
if due[2] then return {1, due[2]} end
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, 1)
if expired[2] then return {2, expired[2]} end
return nil
"""

# KEYS: wake.  ARGV: tokens kept.  A wake-up token alone (a turn queued in
# another group: see the module docstring).
WAKE = """
redis.call('LPUSH', KEYS[1], 1)
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
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
_WAKE, _DUE = Script(WAKE), Script(DUE)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Turn)
_header = msgspec.json.Decoder(tuple[str, int, int, int, str, int])

UNDECODABLE = (msgspec.DecodeError, TypeError, ValueError)
"""What reading a stored record raises when this version cannot decode it
(msgspec's errors; int() and float() of a field that is not a number)."""


CLUSTER_GROUPS = 16
"""How many groups a store on a Redis Cluster spreads its turns over (see
the module docstring). Part of the key layout: every process of a
deployment must use the same number, and changing it strands turns."""


@dataclass(frozen=True, slots=True)
class TurnGroup:
    """The keys of one group of turns, all under the hash tag ``tag`` (one
    cluster slot): the layout of the module docstring."""

    tag: str

    @property
    def turn_prefix(self) -> str:
        return f"{self.tag}:turn:"

    @property
    def status_prefix(self) -> str:
        return f"{self.tag}:status:"

    @property
    def runnable(self) -> str:
        return f"{self.tag}:runnable"

    @property
    def leases(self) -> str:
        return f"{self.tag}:leases"

    @property
    def wake(self) -> str:
        return f"{self.tag}:wake"

    @property
    def tokens(self) -> str:
        return f"{self.tag}:tokens"

    @property
    def waiting(self) -> str:
        return f"{self.tag}:waiting"

    @property
    def waiters(self) -> str:
        return f"{self.tag}:waiters"

    @property
    def inbox_prefix(self) -> str:
        return f"{self.tag}:inbox:"

    @property
    def parked(self) -> str:
        return f"{self.tag}:parked"

    def turn(self, turn_id: str) -> str:
        return self.turn_prefix + turn_id

    def status(self, status: TurnStatus) -> str:
        return self.status_prefix + status.value


def turn_groups(prefix: str, count: int) -> list[TurnGroup]:
    """The ``count`` groups of a store whose prefix is ``prefix``. The first
    is tagged ``{prefix}`` itself (the layout of a store of one group, as
    on one Redis); group ``g`` of the others is tagged ``{prefix:g.i}``
    with the first ``i`` whose slot is in the ``g``-th of ``count`` equal
    ranges of the cluster's slots, so the groups spread over the primaries
    of a cluster whose slots are split in ranges (as ``redis-cli --cluster
    create`` and rebalancing split them)."""
    groups = [TurnGroup("{" + prefix + "}")]
    for group in range(1, count):
        label = next(
            f"{prefix}:{group}.{i}"
            for i in itertools.count()
            if key_slot(f"{prefix}:{group}.{i}".encode()) * count // SLOTS == group
        )
        groups.append(TurnGroup("{" + label + "}"))
    return groups


def group_index(turn_id: str, count: int) -> int:
    """Which of ``count`` groups turn ``turn_id`` is in (stable: a pure
    function of the id)."""
    return zlib.crc32(turn_id.encode()) % count if count > 1 else 0


class RedisTurnStore(TurnStore):
    """See the module docstring. ``url`` is a store URL of
    ``server.store.redis_link`` (one Redis or a cluster); ``timeout`` bounds
    every call but the blocking wait; ``groups`` is how many groups the
    turns spread over (default: one on a single Redis, ``CLUSTER_GROUPS``
    on a cluster)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "huddle:turn",
        timeout: float = 2.0,
        groups: int | None = None,
    ) -> None:
        self.url = self.rides_on = url
        self.timeout = timeout
        self.link = RedisLink(url, timeout)
        self.client = self.link.client
        if groups is None:
            groups = CLUSTER_GROUPS if self.link.cluster is not None else 1
        self.groups = turn_groups(prefix, groups)
        self.desk = self.groups[0]
        """The group workers wait on: its waiters, inboxes and wake list."""
        self._next = 0
        """Where the next claim starts among the other groups (fairness)."""

    def group_of(self, turn_id: str) -> TurnGroup:
        """The group that holds turn ``turn_id``'s keys."""
        return self.groups[group_index(turn_id, len(self.groups))]

    # ─── Turns ───────────────────────────────────────────────────────────

    async def create(self, turn: Turn) -> Turn:
        created = as_stored(turn, version=1, cancel_requested=False)
        payload = _encoder.encode(created)
        group = self.group_of(turn.id)
        keys = [group.turn(turn.id), group.status(turn.status)]
        args = [payload, turn.status.value, turn.phase.value, turn.id]
        if not await self.link.run(_CREATE, keys, args):
            raise TurnExists(turn.id)
        return _decoder.decode(payload)

    async def load(self, turn_id: str) -> Turn:
        held: list[Any] = await self.link.call(
            self.client.hmget(self.group_of(turn_id).turn(turn_id), "payload", "version", "cancel")
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
        group = self.group_of(turn.id)
        args = [
            group.status_prefix,
            turn.id,
            turn.version,
            token,
            payload,
            turn.status.value,
            turn.phase.value,
        ]
        out = await self.link.run(_SAVE, [group.turn(turn.id)], args)
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
        saved = _runnable_saved(turn, out, payload, running)
        await self._wake_desk(turn.id)
        return saved

    def runnable_rider(
        self, turn: Turn, now: float, *, started: Turn | None = None
    ) -> Rider | None:
        if self.group_of(turn.id) is not self.desk:
            return None  # its wake-up is a second write, on the desk's slot
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
        group = self.group_of(turn.id)
        keys = [
            group.turn(turn.id),
            group.runnable,
            group.wake,
            group.leases,
            group.tokens,
            group.waiting,
            group.waiters,
        ]
        args: list[Any] = [
            group.status_prefix,
            turn.id,
            turn.version,
            payload,
            turn.status.value,
            turn.phase.value,
            repr(now),
            WAKE_TOKENS,
            group.inbox_prefix,
            int(turn.cancel_requested),
            running,
            "" if started is None else started.status.value,
            "" if started is None else started.phase.value,
        ]
        return (keys, args), payload, running

    async def _wake_desk(self, turn_id: str) -> None:
        """After turn ``turn_id`` was queued in a group other than the desk:
        a wake-up token on the desk's list, which workers wait on (the
        group's own script could not reach it: another slot). Only wakes:
        the queue was written first."""
        if self.group_of(turn_id) is not self.desk:
            await self.link.run(_WAKE, [self.desk.wake], [WAKE_TOKENS])

    async def request_cancel(self, turn_id: str) -> None:
        key = self.group_of(turn_id).turn(turn_id)
        if not await self.link.run(_REQUEST_CANCEL, [key], []):
            raise TurnNotFound(turn_id)

    async def cancel_requested(self, turn_id: str) -> bool:
        key = self.group_of(turn_id).turn(turn_id)
        cancel = await self.link.call(self.client.hget(key, "cancel"))
        if cancel is None:
            raise TurnNotFound(turn_id)
        return bool(cancel == b"1")

    async def by_status(self, status: TurnStatus) -> list[str]:
        found: set[str] = set()
        for group in self.groups:
            members: set[Any] = await self.link.call(self.client.smembers(group.status(status)))
            found.update(member.decode() for member in members)
        return sorted(found)

    # ─── Runnable turns and leases ───────────────────────────────────────

    async def make_runnable(self, turn_id: str, due_at: float) -> None:
        group = self.group_of(turn_id)
        keys = [group.turn(turn_id), group.runnable, group.wake]
        if not await self.link.run(_MAKE_RUNNABLE, keys, [turn_id, due_at, WAKE_TOKENS]):
            raise TurnNotFound(turn_id)
        await self._wake_desk(turn_id)

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
        group = self.group_of(lease.turn_id)
        keys = [group.turn(lease.turn_id), group.runnable, group.leases, group.parked]
        args = [group.status_prefix, lease.turn_id, lease.token, why]
        if await self.link.run(_PARK, keys, args):
            log.error(
                "parked turn %s: its record does not decode (%s); it is claimed no more "
                "and waits in %s for an operator",
                lease.turn_id,
                why,
                group.parked,
            )

    async def parked(self) -> dict[str, str]:
        """The parked turns (see the module docstring): id -> why."""
        found: dict[str, str] = {}
        for group in self.groups:
            held: dict[Any, Any] = await self.link.call(self.client.hgetall(group.parked))
            found.update((key.decode(), value.decode()) for key, value in held.items())
        return found

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
        """One claim pass (see the module docstring): the CLAIM script's
        reply in the group that gave a turn, or None."""
        claim = functools.partial(self._claim_in, owner, now, lease_seconds, load=load)
        if turn_id is not None:
            group = self.group_of(turn_id)
            if group is self.desk or waiter is None:
                return await claim(group, turn_id, waiter)
            # The waiter is the desk's: what was handed to it first, then
            # the turn, then the waiter registered (the desk has no such
            # turn to claim: its calls only read the inbox and register).
            for where, register in ((self.desk, False), (group, False), (self.desk, True)):
                out = await claim(
                    where, turn_id, waiter if where is self.desk else None, register=register
                )
                if out is not None:
                    return out
            return None
        if len(self.groups) > 1:
            # The groups whose earliest work is due first go first (the
            # desk's at once when the waiter was handed something), so a
            # claim takes the earliest due turn across groups as it does
            # within one; the waiter is registered by the last call only,
            # on the desk, when nothing was left anywhere.
            for group in await self._due_groups(now, waiter):
                out = await claim(group, None, waiter, register=False)
                if out is not None:
                    return out
        return await claim(self.desk, None, waiter)

    async def _due_groups(self, now: float, waiter: Waiter | None) -> list[TurnGroup]:
        """The groups that have a turn to claim, by the time its work fell
        due (read in one pipeline per node: a hint the claims decide on)."""
        inbox = "" if waiter is None else self.desk.inbox_prefix + waiter.id
        calls = [
            ([group.runnable, group.leases], [repr(now), inbox if group is self.desk else ""])
            for group in self.groups
        ]
        dues = await self.link.run_batch(_DUE, calls)
        for due in dues:
            if isinstance(due, BaseException):
                raise due
        found = [
            (int(due[0]), float(due[1] or 0), index)
            for index, due in enumerate(dues)
            if due is not None
        ]
        return [self.groups[index] for *_, index in sorted(found)]

    async def _claim_in(
        self,
        owner: str,
        now: float,
        lease_seconds: float,
        group: TurnGroup,
        turn_id: str | None,
        waiter: Waiter | None,
        *,
        load: bool,
        register: bool = True,
    ) -> Any:
        """The CLAIM script in ``group``."""
        args = [
            group.turn_prefix,
            owner,
            repr(now),
            repr(now + lease_seconds),
            turn_id or "",
            int(load),
            "" if waiter is None else waiter.id,
            group.inbox_prefix,
            "" if waiter is None or not register else repr(waiter.until),
            "" if waiter is None else f"{waiter.lease_seconds!r} {waiter.owner}",
        ]
        keys = [group.runnable, group.leases, group.tokens, group.waiting, group.waiters]
        return await self.link.run(_CLAIM, keys, args)

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        until = now + lease_seconds
        group = self.group_of(lease.turn_id)
        keys = [group.turn(lease.turn_id), group.leases]
        if not await self.link.run(_RENEW, keys, [lease.turn_id, lease.token, until]):
            return None
        return replace(lease, until=until)

    async def release(self, lease: Lease) -> None:
        group = self.group_of(lease.turn_id)
        keys = [group.turn(lease.turn_id), group.leases]
        await self.link.run(_RELEASE, keys, [lease.turn_id, lease.token])

    async def give_up(self, lease: Lease, now: float) -> None:
        group = self.group_of(lease.turn_id)
        keys = [group.turn(lease.turn_id), group.runnable, group.leases, group.wake]
        args = [group.turn_prefix, lease.turn_id, lease.token, repr(now), WAKE_TOKENS]
        if await self.link.run(_GIVE_UP_LEASE, keys, args):
            await self._wake_desk(lease.turn_id)

    async def wake(self, waiter: Waiter) -> None:
        inbox = self.desk.inbox_prefix + waiter.id
        await self.link.run(_WAKE_WAITER, [inbox], [], replicate=False)

    async def wait_for_work(self, at_most: float, waiter: Waiter | None = None) -> Claim | None:
        if at_most <= 0:
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + at_most
        desk = self.desk
        lists = [desk.wake] if waiter is None else [desk.inbox_prefix + waiter.id, desk.wake]
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
        if where in (desk.wake, desk.wake.encode()) or b"\n" not in item:
            return None  # a wake-up token, or a wake-up of this waiter (wake)
        return await self._handed(item, waiter.owner)

    async def stop_waiting(self, waiter: Waiter, now: float) -> None:
        desk = self.desk
        keys = [desk.waiting, desk.waiters, desk.runnable, desk.leases, desk.wake]
        args = [waiter.id, desk.inbox_prefix, desk.turn_prefix, repr(now), WAKE_TOKENS]
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
