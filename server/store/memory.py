"""The embedded store: everything in this process's memory.

It keeps the last ``retention`` envelopes of each channel for replay (at
most ``retention_bytes`` of them), and never drops one newer than the
channel's latest snapshot, so that a channel
can always be loaded. Listeners hear every append and notice, watched or
not, so several hosts in one process (as tests run them) behave like
several processes.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from server.errors import AlreadyApplied, ChannelGone, SeqConflict
from server.store.base import AuditCharge, ChannelStore, ClientAction, Listener, StoredChannel

KEPT_BYTES = 32 << 20
"""What :meth:`MemoryStore.remember` keeps at most, all keys together: the
oldest go first beyond it."""


@dataclass
class _Channel:
    epoch: str
    seq: int
    snapshot_seq: int
    snapshot: bytes
    log: deque[bytes] = field(default_factory=deque)  # seqs seq-len(log)+1 .. seq
    log_bytes: int = 0
    origins: dict[str, tuple[int, str]] = field(default_factory=dict)
    """The replay window's client actions: name -> (seq, digest)."""
    """The clients' actions of the replay window, by origin: their seqs."""

    @property
    def first_seq(self) -> int:
        return self.seq - len(self.log) + 1


class MemoryStore(ChannelStore):
    remember_limit = KEPT_BYTES

    def __init__(self, retention: int = 1000, retention_bytes: int = 8 << 20) -> None:
        self.retention = retention
        self.retention_bytes = retention_bytes
        self._channels: dict[str, _Channel] = {}
        self._records: dict[str, dict[str, bytes]] = {}
        self._listeners: list[Listener] = []
        self._claims: dict[str, tuple[str, float, float | None]] = {}
        """Per key: the owner, until when (the monotonic clock's), and
        until when on the caller's clock (None: it passed none)."""
        self._tallies: dict[str, tuple[int, float]] = {}
        self._buckets: dict[str, tuple[float, float, float, int]] = {}
        """Per key: a :meth:`draw` bucket's tokens, when they were counted,
        its rate and its burst."""
        self._claims_seen = 1024
        """Expired claims are swept when the map doubles past this."""
        self._kept: dict[str, tuple[bytes, float]] = {}
        self._audits: dict[str, list[bytes]] = {}
        self._charges: dict[str, dict[str, int]] = {}
        self._kept_bytes = 0

    def _get(self, channel: str) -> _Channel:
        found = self._channels.get(channel)
        if found is None:
            raise ChannelGone(channel)
        return found

    async def create(self, channel: str, state: bytes) -> bool:
        if channel in self._channels:
            return False
        self._channels[channel] = _Channel(
            epoch=secrets.token_hex(8), seq=0, snapshot_seq=0, snapshot=state
        )
        return True

    async def load(self, channel: str) -> StoredChannel:
        ch = self._get(channel)
        skip = ch.snapshot_seq - ch.first_seq + 1
        return StoredChannel(
            epoch=ch.epoch,
            snapshot_seq=ch.snapshot_seq,
            snapshot=ch.snapshot,
            log=list(ch.log)[skip:],
        )

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        ch = self._get(channel)
        if origin is not None and (applied := await self.applied(channel, origin)) is not None:
            raise applied
        if ch.seq != expected_seq:
            raise SeqConflict(channel, expected_seq, ch.seq)
        ch.seq += 1
        ch.log.append(envelope)
        ch.log_bytes += len(envelope)
        if origin is not None:
            ch.origins[origin.name] = (ch.seq, origin.digest)
            while len(ch.origins) > self.retention:
                del ch.origins[next(iter(ch.origins))]
        self._trim(ch)
        for listener in list(self._listeners):
            listener.envelope_appended(channel, ch.seq, envelope)

    async def applied(self, channel: str, origin: ClientAction) -> AlreadyApplied | None:
        seen = self._get(channel).origins.get(origin.name)
        if seen is None:
            return None
        seq, digest = seen
        return AlreadyApplied(channel, seq, same_action=digest == origin.digest)

    def _trim(self, ch: _Channel) -> None:
        # Keep `retention` envelopes and `retention_bytes`, and always
        # everything after the snapshot.
        while (
            len(ch.log) > self.retention or ch.log_bytes > self.retention_bytes
        ) and ch.first_seq <= ch.snapshot_seq:
            ch.log_bytes -= len(ch.log.popleft())

    async def read_log(self, channel: str, after_seq: int, epoch: str) -> list[bytes] | None:
        ch = self._get(channel)
        if epoch != ch.epoch or after_seq + 1 < ch.first_seq or after_seq > ch.seq:
            return None
        return list(ch.log)[after_seq + 1 - ch.first_seq :]

    async def restore(self, channel: str, seq: int, state: bytes) -> str | None:
        ch = self._get(channel)
        if ch.seq >= seq:
            return None
        ch.epoch, ch.seq, ch.snapshot_seq, ch.snapshot = secrets.token_hex(8), seq, seq, state
        ch.log.clear()
        ch.log_bytes = 0
        return ch.epoch

    async def heads(self, channels: list[str]) -> dict[str, tuple[str, int]]:
        return {c: (ch.epoch, ch.seq) for c in channels if (ch := self._channels.get(c))}

    async def save_snapshot(self, channel: str, seq: int, state: bytes) -> None:
        ch = self._get(channel)
        if ch.snapshot_seq < seq <= ch.seq:
            ch.snapshot_seq, ch.snapshot = seq, state
            self._trim(ch)

    async def delete(self, channel: str) -> None:
        self._channels.pop(channel, None)

    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        self._records.setdefault(kind, {})[key] = value

    async def get_record(self, kind: str, key: str) -> bytes | None:
        return self._records.get(kind, {}).get(key)

    async def keep_record(self, kind: str, key: str, value: bytes) -> bytes:
        return self._records.setdefault(kind, {}).setdefault(key, value)

    async def delete_record(self, kind: str, key: str) -> None:
        self._records.get(kind, {}).pop(key, None)

    async def records(self, kind: str) -> dict[str, bytes]:
        return dict(self._records.get(kind, {}))

    async def count_records(self, kind: str) -> int:
        return len(self._records.get(kind, {}))

    async def claim(self, key: str, owner: str, ttl: float, now: float | None = None) -> str | None:
        holder = await self.claimant(key, now)
        if holder is not None and holder != owner:
            return holder
        if ttl <= 0:
            self._claims.pop(key, None)
            return None
        monotonic = time.monotonic()
        self._claims[key] = (owner, monotonic + ttl, None if now is None else now + ttl)
        if len(self._claims) > 2 * self._claims_seen:
            self._claims = {k: v for k, v in self._claims.items() if v[1] > monotonic}
            self._claims_seen = max(1024, len(self._claims))
        return None

    async def claimant(self, key: str, now: float | None = None) -> str | None:
        held = self._claims.get(key)
        if held is None:
            return None
        owner, until, deadline = held
        lapsed = now is not None and deadline is not None and deadline <= now
        if lapsed or until <= time.monotonic():
            return None
        return owner

    async def tally(self, key: str, size: int, most: int, ttl: float) -> float:
        now = time.monotonic()
        count, until = self._tallies.get(key, (0, now + ttl))
        if until <= now:
            count, until = 0, now + ttl
        if size > 0 and count + size > most:
            return until - now
        if count + size <= 0:
            self._tallies.pop(key, None)
        else:
            self._tallies[key] = (count + size, until)
        if len(self._tallies) > 2 * self._claims_seen:
            self._tallies = {k: v for k, v in self._tallies.items() if v[1] > now}
        return 0.0

    async def draw(self, key: str, rate: float, burst: int, want: float, now: float) -> float:
        tokens, stamp, _, _ = self._buckets.get(key, (float(burst), now, rate, burst))
        if now > stamp:
            tokens, stamp = min(float(burst), tokens + (now - stamp) * rate), now
        took = min(want, max(tokens, 0.0))
        self._buckets[key] = (tokens - took, stamp, rate, burst)
        if len(self._buckets) > 2 * self._claims_seen:
            # Those full again by now hold nothing a new bucket would not.
            self._buckets = {
                k: held
                for k, held in self._buckets.items()
                if held[2] <= 0 or held[0] + (now - held[1]) * held[2] < held[3]
            }
        return took

    async def remember(self, key: str, value: bytes, ttl: float) -> None:
        now = time.monotonic()
        self._forget(key)
        self._kept[key] = (value, now + ttl)
        self._kept_bytes += len(key) + len(value)
        # Oldest first (insertion order): the expired, then beyond the bound.
        while self._kept:
            oldest, (_, until) = next(iter(self._kept.items()))
            if until > now and self._kept_bytes <= KEPT_BYTES:
                break
            self._forget(oldest)

    def _forget(self, key: str) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._kept_bytes -= len(key) + len(kept[0])

    async def recall(self, key: str) -> bytes | None:
        kept = self._kept.get(key)
        return kept[0] if kept is not None and kept[1] > time.monotonic() else None

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        records = self._audits.setdefault(session, [])
        if len(records) != n - 1:
            raise SeqConflict(session, n - 1, len(records))
        records.append(record)

    async def charge_audit(
        self, session: str, payer: str, records: int, share: int, room: int
    ) -> AuditCharge:
        charges = self._charges.setdefault(session, {})
        held = charges.get(payer, 0)
        if records > 0:
            if held + records > share:
                return "share"
            if len(self._audits.get(session, [])) + records > room:
                return "full"
        if held + records > 0:
            charges[payer] = held + records
        else:
            charges.pop(payer, None)
        return "charged"

    async def read_audit(self, session: str, after: int, limit: int) -> list[bytes]:
        return self._audits.get(session, [])[max(0, after) : max(0, after) + limit]

    async def last_audit(self, session: str) -> bytes | None:
        records = self._audits.get(session)
        return records[-1] if records else None

    async def delete_audit(self, session: str) -> None:
        self._audits.pop(session, None)
        self._charges.pop(session, None)

    async def publish(self, topic: str, payload: bytes) -> None:
        for listener in list(self._listeners):
            listener.notice(topic, payload)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        self._listeners.append(listener)

        def remove() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return remove

    async def watch(self, channel: str) -> None:
        return None  # every listener hears everything

    async def unwatch(self, channel: str) -> None:
        return None

    async def ready(self) -> bool:
        return True

    async def close(self) -> None:
        self._listeners.clear()
