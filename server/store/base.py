"""The store contract every store implements.

A channel is a gapless log of entries (``serverSeq`` 1, 2, ...; each the
host's encoded envelope with its writer's clock, opaque to the store) plus a
snapshot of its state at some seq, written by the host every K
actions so that the log can be trimmed. ``append`` is a compare-and-set on
the channel's seq: it succeeds only when the caller's ``expected_seq`` is
the channel's current seq, which makes the store the one place that orders a
channel's actions even when many processes write.

``epoch`` names one life of a channel's log. It changes when the log is lost
(a flushed or failed-over Redis), which tells every process and every client
that seqs from before are meaningless and a fresh snapshot is needed.

Other processes' appends reach a process through the listener it registers:
a hint to read, never the truth (the log is), and only for the channels the
process watches (``watch``), so that a process pays for the channels it
serves and not for the others. Notices are ephemeral messages between
processes (root notifications), not logged, heard by the processes that
watch their topic. A store may deliver more than was watched (the memory
store delivers everything), never less.

A :class:`Rider` is another store's write that belongs with an append (the
turn a person's answer resumes, saved with the answer's entry): a store
that :meth:`ChannelStore.carries` it runs both in one atomic step, the
rider only once the entry landed, and saves the crossing a second call
costs. A store that carries none (the memory store: nothing to cross)
leaves its owner to write it after the append, as without one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from protocol.codec import decode_envelope
from protocol.messages import ActionEnvelope
from server.auth import Identity
from server.errors import AlreadyApplied


class LogEntry(msgspec.Struct, frozen=True, gc=False):
    """What the store keeps per seq: the envelope as sent (``e``), the
    writer's clock (``t``, ms), so that every process reduces it to the same
    state (``modifiedAt`` comes from the caller's clock), and who sent it
    (``w``, the server's identity of the sender; absent for the server's
    own actions)."""

    t: int
    e: msgspec.Raw
    w: Identity | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """A decoded log entry: time, envelope, its bytes and its sender."""

    time: int
    envelope: ActionEnvelope
    data: bytes
    sender: Identity | None


_read_entry = msgspec.json.Decoder(LogEntry)
_encode = msgspec.json.Encoder()


def encode_entry(now_ms: int, envelope: bytes, sender: Identity | None = None) -> bytes:
    """The log entry for an encoded envelope written at ``now_ms``."""
    if sender is None:
        return b'{"t":%d,"e":%b}' % (now_ms, envelope)
    return b'{"t":%d,"w":%b,"e":%b}' % (now_ms, _encode.encode(sender), envelope)


def decode_entry(raw: bytes) -> Entry:
    entry = _read_entry.decode(raw)
    data = bytes(entry.e)
    return Entry(entry.t, decode_envelope(data), data, entry.w)


@dataclass(frozen=True, slots=True)
class ClientAction:
    """How the store knows a client's action: ``name``, its ``(clientId,
    clientSeq)`` (server.core.channels.origin_key), and ``digest``, what the
    action was (server.core.channels.action_digest), so that another action
    sent under a name the channel took is told apart from a re-send."""

    name: str
    digest: str


@dataclass(frozen=True)
class StoredChannel:
    """A channel as loaded: its snapshot and every envelope after it."""

    epoch: str
    snapshot_seq: int
    snapshot: bytes
    log: list[bytes]

    @property
    def seq(self) -> int:
        """The seq of the last envelope (the channel's current seq)."""
        return self.snapshot_seq + len(self.log)


class Listener(ABC):
    """What a process wants to hear about other processes' writes."""

    @abstractmethod
    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        """``envelope`` was appended to ``channel`` at ``seq`` (a hint: it may
        arrive late, twice, or not at all; the log is the truth)."""

    @abstractmethod
    def notice(self, topic: str, payload: bytes) -> None:
        """A notice was published on ``topic``."""

    @abstractmethod
    def store_reconnected(self) -> None:
        """The store's link to other processes is back: hints may have been
        lost meanwhile, so compare with the store now."""


AuditCharge = Literal["charged", "share", "full"]
"""What :meth:`ChannelStore.charge_audit` made of a charge: added, refused
for the payer's share, refused for the audit's room."""


@dataclass(eq=False, slots=True)
class Rider:
    """A write that rides on an append (see the module docstring): a Lua
    script's ``source`` with its own ``keys`` and ``args`` (its KEYS and
    ARGV), for the Redis at ``store`` (a store URL). The store that carries
    it records what became of it: ``ran`` with the script's ``reply`` when
    the entry landed and the rider did not fail (an error raised or
    returned: then ``reply`` is the error, and what the rider wrote before
    it stays written, as in any script: check before writing), ``unknown``
    when the append's answer was lost (the entry, and so the rider, may
    have landed or not)."""

    source: str
    keys: list[str]
    args: list[Any]
    store: str
    ran: bool = False
    reply: Any = None
    unknown: bool = False


class ChannelStore(ABC):
    """Channel logs, snapshots and records; see the module docstring."""

    remember_limit: int | None = None
    """Bytes :meth:`remember` keeps before it forgets the oldest (None: it
    forgets nothing before its time)."""

    @abstractmethod
    async def create(self, channel: str, state: bytes) -> bool:
        """Create ``channel`` at seq 0 with ``state``; False if it exists."""

    @abstractmethod
    async def load(self, channel: str) -> StoredChannel:
        """The latest snapshot and the log after it; raises ChannelGone."""

    @abstractmethod
    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        """Append ``envelope`` as seq ``expected_seq + 1``. ``origin`` is the
        client's action it records: when the channel took one of that name
        within its replay window, raises AlreadyApplied (before anything
        else is compared; ``same_action`` False when that one's digest was
        another, or is not known). Raises SeqConflict when the channel is
        elsewhere, ChannelGone, or StoreUnavailable."""

    def carries(self, store: str, channel: str | None = None, keys: Sequence[str] = ()) -> bool:
        """Whether :meth:`append_riding` runs a :class:`Rider` for the store
        at URL ``store`` (with ``keys``, on ``channel``'s append; without
        them: whether it may carry some) with the append, atomically (this
        one does not)."""
        return False

    async def append_riding(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None,
        rider: Rider,
    ) -> None:
        """:meth:`append`, and ``rider`` in the same atomic step once the
        entry landed (its outcome recorded in it). Only for a rider this
        store :meth:`carries`."""
        raise NotImplementedError(f"{type(self).__name__} carries no rider")

    @abstractmethod
    async def applied(self, channel: str, origin: ClientAction) -> AlreadyApplied | None:
        """What :meth:`append` of ``origin`` would raise as AlreadyApplied
        (its seq, and whether it was the same action), while ``channel``'s
        replay window remembers that name; None when it does not."""

    @abstractmethod
    async def read_log(self, channel: str, after_seq: int, epoch: str) -> list[bytes] | None:
        """The envelopes after ``after_seq`` of the log life ``epoch``, or
        None when the store no longer holds them all (trimmed, or the epoch
        changed). Raises ChannelGone."""

    @abstractmethod
    async def restore(self, channel: str, seq: int, state: bytes) -> str | None:
        """The store lost appends this process had seen (its head is below
        ``seq``: a crash before they reached the disk, or a failover to a
        replica that had not got them): make ``state`` the channel's state at
        ``seq``, under a new epoch, so that no seq is handed out twice and
        every reader starts over. Returns the new epoch, or None when the
        head is not below ``seq`` (nothing was lost)."""

    @abstractmethod
    async def heads(self, channels: list[str]) -> dict[str, tuple[str, int]]:
        """The (epoch, seq) of each existing channel of ``channels``, read in
        one go: how a process notices appends whose hint it missed."""

    @abstractmethod
    async def save_snapshot(self, channel: str, seq: int, state: bytes) -> None:
        """Record ``state`` as the channel's state at ``seq``; the log up to
        ``seq`` may then be trimmed."""

    @abstractmethod
    async def delete(self, channel: str) -> None:
        """Remove the channel and its log (no error if absent)."""

    @abstractmethod
    async def put_record(self, kind: str, key: str, value: bytes) -> None:
        """Set a small record (session summaries, chat ownership)."""

    @abstractmethod
    async def get_record(self, kind: str, key: str) -> bytes | None: ...

    @abstractmethod
    async def keep_record(self, kind: str, key: str, value: bytes) -> bytes:
        """Set a small record unless it is set, atomically across processes;
        the value it holds (``value`` or the one set first): processes that
        start together agree on one (the audit's key)."""

    @abstractmethod
    async def delete_record(self, kind: str, key: str) -> None: ...

    @abstractmethod
    async def records(self, kind: str) -> dict[str, bytes]:
        """Every record of ``kind`` by key."""

    @abstractmethod
    async def count_records(self, kind: str) -> int:
        """How many records of ``kind`` there are (without reading them)."""

    @abstractmethod
    async def claim(self, key: str, owner: str, ttl: float, now: float | None = None) -> str | None:
        """Claim ``key`` for ``owner`` for ``ttl`` seconds, atomically across
        processes: None when it is ``owner``'s now (it was free, expired, or
        already ``owner``'s; the claim is renewed), else the owner that holds
        it. Claims expire by themselves, so they stay bounded; a ``ttl`` of
        0 gives ``owner``'s claim up at once. ``now`` is the caller's clock
        when its time is the one that counts (a token's lifetime is on the
        server's clock): the claim then lapses as well once that clock
        passes ``now + ttl``, and every caller of the key passes one."""

    @abstractmethod
    async def claimant(self, key: str, now: float | None = None) -> str | None:
        """The owner that holds ``key`` (judged as :meth:`claim` judges it,
        ``now`` being the caller's clock), or None when nobody does."""

    @abstractmethod
    async def remember(self, key: str, value: bytes, ttl: float) -> None:
        """Keep ``value`` under ``key`` for ``ttl`` seconds (shared by every
        process; expires by itself)."""

    @abstractmethod
    async def recall(self, key: str) -> bytes | None:
        """What :meth:`remember` keeps under ``key``, while it lasts."""

    @abstractmethod
    async def tally(self, key: str, size: int, most: int, ttl: float) -> float:
        """Add ``size`` to the count under ``key``, atomically across
        processes, unless that makes it more than ``most``: 0 when added,
        else the seconds until the count is reset. A count lasts ``ttl``
        seconds from its first addition, then starts again from 0; a
        negative ``size`` (room given back) is always added."""

    @abstractmethod
    async def draw(self, key: str, rate: float, burst: int, want: float, now: float) -> float:
        """Take up to ``want`` from the token bucket under ``key``,
        atomically across processes, and return what was taken (0 when it
        is empty; never more than it holds, so it never goes into debt
        here). The bucket holds ``burst`` when new and refills at ``rate``
        a second, on the callers' wall clock ``now`` (a clock behind the
        last one seen refills nothing); it is forgotten once full again,
        so buckets stay bounded by the keys drawing lately."""

    # ─── Audit ───────────────────────────────────────────────────────────

    @abstractmethod
    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        """Append ``record`` as record ``n`` (1, 2, ...) of the session's
        audit: a compare-and-set, like :meth:`append`; raises SeqConflict
        (its ``current``: how many records there are) when the audit does
        not hold ``n - 1`` records. The audit is never trimmed."""

    @abstractmethod
    async def charge_audit(
        self, session: str, payer: str, records: int, share: int, room: int
    ) -> AuditCharge:
        """Charge ``records`` records of the session's audit to ``payer``,
        atomically across processes: ``charged`` (added to the payer's
        count) when that count stays at most ``share`` and the audit, with
        them, holds at most ``room`` records; else ``share`` or ``full``
        (nothing added). A negative ``records`` (a charge given back) is
        always added. The counts go with the audit (:meth:`delete_audit`)."""

    @abstractmethod
    async def read_audit(self, session: str, after: int, limit: int) -> list[bytes]:
        """At most ``limit`` records of the session's audit from record
        ``after + 1`` on, in order ([] past the end, or for none)."""

    @abstractmethod
    async def last_audit(self, session: str) -> bytes | None:
        """The session's latest audit record (None: none yet)."""

    @abstractmethod
    async def delete_audit(self, session: str) -> None:
        """Remove the session's audit and its charges (no error if absent)."""

    # ─── Other processes ─────────────────────────────────────────────────

    @abstractmethod
    async def publish(self, topic: str, payload: bytes) -> None:
        """Send a notice to the listeners of every process that watches
        ``topic`` (this one's included)."""

    @abstractmethod
    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Register ``listener``; returns a function that removes it."""

    @abstractmethod
    async def watch(self, channel: str) -> None:
        """From when this returns, this process's listeners hear the appends
        to ``channel`` and the notices on topic ``channel`` (call it before
        loading a channel to serve it, so that no append falls between the
        load and the first hint). Idempotent. Raises StoreUnavailable."""

    @abstractmethod
    async def unwatch(self, channel: str) -> None:
        """Stop hearing ``channel`` (no error if it was not watched)."""

    @abstractmethod
    async def ready(self) -> bool:
        """Whether the store can serve now (for ``/readyz``)."""

    @abstractmethod
    async def close(self) -> None: ...
