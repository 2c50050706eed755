"""A session's audit: who did what, as a hash chain anyone can check.

Every accepted action a person or an agent made in a session's chats that
matters afterwards (a turn started, completed, cancelled, failed or
truncated away; a question asked, an answer drafted, a request completed;
a tool call waiting for approval, approved or denied (with its reason and
edited input), its result) becomes one record of the session's audit, and so does every
resume the runner took (its command and the metadata saying who resumed
it). Drafts are recorded when their author or state changes, not per
keystroke. A record, one JSON object (one line of an export)::

    {"n": 3, "at": "2026-12-01T10:00:00.000Z", "session": "ahp-session:/x",
     "chat": "ahp-chat:/x/1", "seq": 7, "what": "chat/inputCompleted",
     "who": {"role": "participant", "name": "Lee", "token": "t-1f0c"},
     "origin": {"clientId": "web-3", "clientSeq": 4},
     "action": {...the action as on the wire...},
     "asked": {...the request it completed...},
     "redacted": ["answers/password"], "bytes": 1234,
     "prev": "<hash of record 2>", "hash": "<this record's hash>"}

``who`` is the server's identity of the sender (the token's role, name and
id; ``declared`` for a name typed in with a shared link), ``{"role":
"server"}`` for the server's own actions (an embedded agent, the runner,
an expiry); ``origin`` is what the client said and proves nothing. A
runner's resume is ``"what": "runner/resumed"`` with ``turn`` and
``resume`` (``command``, ``correlationId``, ``metadata``).

The chain: ``n`` counts from 1; ``prev`` is the previous record's ``hash``
(64 zeros for the first); ``hash`` is the SHA-256 (hex) of the record
without ``hash``, as JSON with sorted keys and no spaces (UTF-8). A record
removed, altered or reordered breaks the chain; one cut off the end does
not, so compare the last hash with the one the export reported.

Redaction: an answer's value is kept unless its form field is marked
sensitive (``writeOnly: true`` or ``x-huddle-sensitive: true`` in the
request's frozen JSON Schema), or the server redacts every value
(``--audit-values redact``: answers and tool input); a redacted value reads
``"[redacted]"`` and its path is listed in ``redacted``.

Bounds: a string longer than ``FIELD_BYTES`` (a 64 KiB message, a tool's
input) is kept as ``{"sha256", "bytes", "head"}`` (the digest of its
UTF-8, its size, its first KiB), and a record still larger than
``RECORD_BYTES`` keeps each larger part of its action the same way (of the
part as canonical JSON, with ``"json": true``); their paths are listed in
``elided`` (``verify`` checks each leads to a digest, and counts them).
Each record says in ``bytes`` how many bytes of records came before it, so
the last one tells every process the audit's size. A session's audit holds
at most ``max_records`` and ``max_bytes``: the last record then says
``"what": "audit/full"`` and nothing more is recorded (the chain stays
whole). Its last tenth (of either) is a reserve, opened by a record
``"what": "audit/reserve"``: from there on only decisive records are
written (a request completed, a tool call decided, each with ``asked``:
what it decided on, as the chat showed it; the runner's resume; a
truncation, with ``removed``: the turns it took away), not what people can
make as often as they like (drafts, turns started or cancelled, and what
the agent does in each, its questions among them, which the decisions
carry), so that nobody can fill an audit to keep the answers out of it.

Shares: what a person makes of the decisive records (a request completed
or a tool call decided, two records each, their own and the runner's
resume it makes; a truncation, one) is charged to them before it is
accepted (:meth:`AuditTrail.charged`); the count is the store's, so every
process gives a person the same share. A payer is a token, a shared
link's browsers together. One takes at most a ``SENDER_SHARE``-th of the
reserve over the session's life, and people together never the reserve's
last ``HOUSE_SHARE``-th, the agent's and the server's own: past either, a
person's action is refused (``audit-share-used``, ``audit-full``), so one
person cannot fill the reserve to keep the others' decisions out of it,
and no decisive action is ever accepted without its record.

Records of one process are appended in the order it accepted the actions,
each before its action is shown to anyone here (the core's ``recorded``
phase): an acknowledged action is on the record. While the store refuses
a session's records, nothing more it would record is accepted
(:meth:`AuditTrail.caught_up`). The store's compare-and-set orders
processes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.actions import (
    ChatError,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    StateAction,
    action_type,
)
from protocol.chat import ChatState, ToolCallPendingConfirmation
from protocol.rejections import Rejection, RejectionCode
from reducers.chat import select_open_input_part, select_tool_call, select_truncated
from reducers.clock import iso_time
from server.auth import Identity
from server.cache import Lru
from server.core.audit_key import AuditKeys, SigningKey
from server.core.channels import Applied
from server.core.frozen_forms import FormRegistry, chat_session
from server.errors import ActionRejected, AlreadyApplied, SeqConflict, StoreError, StoreUnavailable
from server.store.base import ChannelStore

log = logging.getLogger("huddle.audit")

GENESIS: Final = "0" * 64
"""The ``prev`` of a session's first record."""
REDACTED: Final = "[redacted]"
SENSITIVE: Final = ("writeOnly", "x-huddle-sensitive")
"""Keywords of a form field whose answers the audit does not keep."""
PAGE: Final = 500
"""Records read from the store at a time."""
MAX_QUEUED: Final = 10_000
"""Records of one session waiting for the store, at most (more are
dropped, and logged: the store is down or far behind)."""
RETRY_AFTER: Final = 1.0
"""Seconds after the store refused a session's records before they are
tried again (when no other record of the session comes first)."""
MAX_ATTEMPTS: Final = 16
GONE_RECORDS: Final = "audit-of-gone"
RESERVED_SHARE: Final = 10
"""The last tenth of a session's audit is kept for decisive records."""
DRAFTS_PER_REQUEST: Final = 100
"""Draft records one request gets at most (in one process's lifetime): its
completion, and everything else, is recorded whatever drafting came first."""
MAX_BYTES: Final = 256 << 20
"""Bytes of records a session's audit holds at most (its last tenth, as of
its records, is the reserve)."""
SENDER_SHARE: Final = 10
"""A person's decisive records (and the resumes they make) take at most a
tenth of the reserve's records, wherever they land."""
HOUSE_SHARE: Final = 2
"""The reserve's last half is the agent's and the server's: people's
decisive actions are refused once the audit holds all but it."""
CHARGED: Final = 2
"""Records a person's decision is charged: its own, and the runner's
resume it makes (a truncation resumes nothing: one)."""
FIELD_BYTES: Final = 1024
"""A string of a record longer than this (UTF-8) is kept as its digest."""
RECORD_BYTES: Final = 16 << 10
"""A record larger than this keeps each larger part of its action as a
digest too."""
ELIDED: Final = "elided"
"""The key of a record listing the paths of the values kept as a digest."""
SIG: Final = "sig"
"""The key of a record's signature, ``{"key": id, "ed25519": base64}``:
outside what its hash covers, as ``hash`` is."""
ALGORITHM_FIELD: Final = "ed25519"
HEAD_SIGNED: Final = b"huddle-audit-head\n"
"""What a record's signature signs comes after this (then its hash, hex)."""
END_SIGNED: Final = b"huddle-audit-end\n"
"""What an export's end's signature signs comes after this (then the end
without ``sig``, as canonical JSON)."""
END: Final = "audit/end"
"""The ``what`` of an export's last line, its signed end (no ``hash``)."""

AUDITED: Final = (
    ChatTurnStarted,
    ChatTurnComplete,
    ChatTurnCancelled,
    ChatError,
    ChatInputRequested,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallReady,
    ChatToolCallConfirmed,
    ChatToolCallComplete,
    ChatTruncated,
)
AuditValues = Literal["keep", "redact"]

_canonical = msgspec.json.Encoder(order="sorted")
Record = dict[str, Any]


def canonical(record: Record) -> bytes:
    """The bytes a record's hash covers (and an export's line)."""
    return _canonical.encode(record)


def seal(body: Record, n: int, prev: str, key: SigningKey | None = None) -> tuple[bytes, str]:
    """``body`` as record ``n`` after ``prev``: its line and its hash, the
    hash signed with ``key`` (``sig``; None: unsigned, as records were
    before the audit had a key)."""
    record = {**body, "n": n, "prev": prev}
    digest = hashlib.sha256(canonical(record)).hexdigest()
    record["hash"] = digest
    if key is not None:
        record[SIG] = {"key": key.id, ALGORITHM_FIELD: key.sign(head_message(digest))}
    return canonical(record), digest


def head_message(digest: str) -> bytes:
    """What a record's signature signs: the chain's head after it."""
    return HEAD_SIGNED + digest.encode()


def end_message(end: Record) -> bytes:
    """What an export's end's signature signs: the end without ``sig``."""
    return END_SIGNED + canonical({k: v for k, v in end.items() if k != SIG})


def end_line(session: str, records: int, head: str, at: str, key: SigningKey) -> bytes:
    """An export's last line: the session, how many records it holds and
    the last one's hash, when it was exported, signed with ``key``."""
    end: Record = {"what": END, "session": session, "records": records, "head": head, "at": at}
    end[SIG] = {"key": key.id, ALGORITHM_FIELD: key.sign(end_message(end))}
    return canonical(end)


# ─── Checking ────────────────────────────────────────────────────────────


class AuditBroken(ValueError):
    """The chain is broken at ``line`` (1-based), for ``reason``."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class Verified:
    records: int
    head: str
    """The last record's hash (GENESIS for an empty audit)."""
    session: str | None
    elided: int = 0
    """Values kept only as their digest (a record's ``elided`` paths)."""
    signed: int = 0
    """Records that carry a signature (checked when keys were given)."""
    ended: Record | None = None
    """The export's end (``audit/end``), if it has one (checked when keys
    were given, and then required)."""
    keys: frozenset[str] = frozenset()
    """The ids of the keys that signed (when keys were given)."""


PublicKeys = Mapping[str, Ed25519PublicKey]
"""Public keys by id (server.core.audit_key.read_public_keys)."""


def verify(lines: Iterable[bytes | str], keys: PublicKeys | None = None) -> Verified:
    """Check a session's records, in order; raises AuditBroken. With
    ``keys``, each record's signature too, by the key its ``sig`` names,
    and the export's signed end, which must come last and count every
    record (so that none was cut off the end). Records written before the
    audit was signed carry no signature: they may only come first, and
    the first signature after them (a record's, else the end's) covers
    them through the chain."""
    prev, n, session, elided, signed = GENESIS, 0, None, 0, 0
    ended: tuple[int, Record] | None = None
    used: set[str] = set()
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError as error:
            raise AuditBroken(line_no, f"not JSON ({error})") from None
        if not isinstance(record, dict):
            raise AuditBroken(line_no, "not a JSON object")
        written = line.encode() if isinstance(line, str) else line
        if ended is not None:
            raise AuditBroken(line_no, "a line after the export's end")
        if record.get("what") == END and "hash" not in record:
            _as_sealed(line_no, record, written)
            ended = (line_no, record)
            continue
        whole = dict(record)
        claimed = record.pop("hash", None)
        sig = record.pop(SIG, None)
        if not isinstance(claimed, str):
            raise AuditBroken(line_no, "no hash")
        if hashlib.sha256(canonical(record)).hexdigest() != claimed:
            raise AuditBroken(line_no, "the hash does not match the record: it was altered")
        _as_sealed(line_no, whole, written)
        if record.get("prev") != prev:
            raise AuditBroken(line_no, "prev is not the previous record's hash: one is missing")
        if record.get("n") != n + 1:
            raise AuditBroken(line_no, f"record {record.get('n')!r} where {n + 1} belongs")
        if session is None:
            session = record.get("session")
        elif record.get("session") != session:
            raise AuditBroken(line_no, "a record of another session")
        elided += _elided(line_no, record)
        if sig is not None:
            if keys is not None:
                what = f"record {n + 1}" + (
                    f" (and the unsigned {n} before it)" if not signed and n else ""
                )
                used.add(_signed(line_no, keys, sig, head_message(claimed), what))
            signed += 1
        elif keys is not None and signed:
            raise AuditBroken(line_no, f"record {n + 1} is not signed, after signed records")
        prev, n = claimed, n + 1
    end = None if ended is None else ended[1]
    if keys is not None:
        if ended is None:
            raise AuditBroken(
                n + 1, f"no signed end after record {n}: records may have been cut off the end"
            )
        end_no, end = ended
        used.add(_signed(end_no, keys, end.get(SIG), end_message(end), "the export's end"))
        _ends(end_no, end, n, prev, session)
    return Verified(
        records=n,
        head=prev,
        session=session,
        elided=elided,
        signed=signed,
        ended=end,
        keys=frozenset(used),
    )


def _as_sealed(line_no: int, record: Record, written: bytes) -> None:
    """What a reader sees must be what was sealed: with a key given twice,
    one parser shows the first and the hash (or signature) covers the
    last. A line written otherwise, spaces and all, is still the record."""
    if canonical(record) != written.strip() and _twice(written):
        raise AuditBroken(line_no, "a key is given twice: the line is not as it was sealed")


def _signed(line_no: int, keys: PublicKeys, sig: object, message: bytes, what: str) -> str:
    """Check that ``sig`` (``{"key": id, "ed25519": base64}``) signs
    ``message`` with one of ``keys``: the key's id; raises AuditBroken."""
    if not isinstance(sig, dict) or not isinstance(sig.get("key"), str):
        raise AuditBroken(line_no, f"{what}: no signature")
    key = keys.get(sig["key"])
    if key is None:
        raise AuditBroken(
            line_no,
            f"{what} is signed by key {sig['key']!r}, which is not one given: "
            "a forged signature, or a key to add with --public-key",
        )
    try:
        key.verify(base64.b64decode(str(sig.get(ALGORITHM_FIELD)), validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        raise AuditBroken(
            line_no,
            f"{what}: the signature is not key {sig['key']!r}'s of it: it was altered "
            "and rehashed, moved, or its signature forged",
        ) from None
    return str(sig["key"])


def _ends(line_no: int, end: Record, n: int, head: str, session: str | None) -> None:
    """Check that the export's (signed) end is this chain's: its session,
    its count and its last hash; raises AuditBroken."""
    said = end.get("records")
    if session is not None and end.get("session") != session:
        raise AuditBroken(line_no, "the export's end is another session's")
    if isinstance(said, int) and said > n:
        raise AuditBroken(
            line_no,
            f"record {n + 1} is missing: the export's end says {said} records, "
            f"{said - n} were cut off the end",
        )
    if said != n or end.get("head") != head:
        raise AuditBroken(line_no, f"the export's end is not of these {n} records")


def _elided(line_no: int, record: Record) -> int:
    """How many values ``record`` keeps as a digest (its ``elided`` paths,
    each of which must lead to one); raises AuditBroken."""
    paths = record.get(ELIDED, [])
    if not isinstance(paths, list):
        raise AuditBroken(line_no, "elided is not a list of paths")
    for path in paths:
        value: Any = record
        for step in str(path).split("/"):
            if isinstance(value, list) and step.isdigit() and int(step) < len(value):
                value = value[int(step)]
            elif isinstance(value, dict) and step in value:
                value = value[step]
            else:
                raise AuditBroken(line_no, f"elided names {path!r}, which it does not hold")
        if not (isinstance(value, dict) and isinstance(value.get("sha256"), str)):
            raise AuditBroken(line_no, f"elided names {path!r}, which is not a digest")
    return len(paths)


def _twice(line: bytes) -> bool:
    """Whether some object of ``line`` (JSON) gives a key twice (a line
    written otherwise than sealed, spaces and all, is still the record)."""
    found = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal found
        found = found or len({key for key, _ in items}) < len(items)
        return dict(items)

    json.loads(line, object_pairs_hook=pairs)
    return found


async def export(store: ChannelStore, session: str) -> AsyncIterator[bytes]:
    """The session's records, in order, each a line without its newline."""
    after = 0
    while True:
        page = await store.read_audit(session, after, PAGE)
        for record in page:
            yield record
        if len(page) < PAGE:
            return
        after += len(page)


async def signed_export(
    store: ChannelStore, session: str, key: SigningKey, at: str
) -> AsyncIterator[bytes]:
    """:func:`export`, then the export's end (:func:`end_line`), exported
    ``at``: what ``verify`` with keys requires, so that records cut off
    the end are caught."""
    records, last = 0, None
    async for record in export(store, session):
        yield record
        records, last = records + 1, record
    head = GENESIS if last is None else str(msgspec.json.decode(last).get("hash"))
    yield end_line(session, records, head, at, key)


# ─── Recording ───────────────────────────────────────────────────────────


@dataclass(eq=False)
class _Pending:
    body: Record
    form: tuple[str, str] | None
    """(chat, request id) whose frozen form says what to redact."""
    decisive: bool
    """Whether the reserve is kept for it (see DECISIVE)."""
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    tried: tuple[int, bytes, bool] | None = None
    """The record number and line last sent for it, and whether that line
    was all of it (not the reserve's marker before it), until answered: a
    try whose answer was lost may have landed all the same."""


@dataclass(eq=False)
class _Chain:
    queue: deque[_Pending] = field(default_factory=deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class AuditTrail:
    """Records a session's actions as they are accepted (a channel-core
    hook, and a runner listener); see the module docstring."""

    def __init__(
        self,
        store: ChannelStore,
        forms: FormRegistry,
        *,
        keys: AuditKeys,
        now_ms: Callable[[], int],
        session_of: Callable[[str], str | None],
        values: AuditValues = "keep",
        max_records: int = 100_000,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        self.store = store
        self.forms = forms
        self.keys = keys
        """The key every record's head is signed with (server.core.audit_key)."""
        self.now_ms = now_ms
        self.session_of = session_of
        """The session of a chat this process holds (None: unknown)."""
        self.values = values
        self.max_records = max_records
        self._chains: dict[str, _Chain] = {}
        self._heads: Lru[str, _Head] = Lru(1024)
        self._drafts: Lru[tuple[str, str, str], tuple[object, ...]] = Lru(4096)
        self._drafted: Lru[tuple[str, str], int] = Lru(4096)
        self.drafts_per_request = DRAFTS_PER_REQUEST
        self.max_bytes = max_bytes
        self._tasks: set[asyncio.Task[None]] = set()
        self._retrying: dict[str, asyncio.Task[None]] = {}
        """Each session whose queue the store refused: its retry."""

    def hook(self, event: Applied) -> Awaitable[None] | None:
        action = event.action
        if not event.local or not isinstance(action, AUDITED):
            return None
        if not isinstance(event.view.state, ChatState):
            return None
        session = chat_session(event.view.state)
        if session is None or not self._worth_it(event.uri, action, event.sender):
            return None
        body: Record = {
            "at": iso_time(self.now_ms()),
            "session": session,
            "chat": event.uri,
            "seq": event.envelope.server_seq,
            "what": action_type(action),
            "who": _who(event.sender),
            "action": msgspec.to_builtins(action),
        }
        if event.envelope.origin is not None:
            body["origin"] = msgspec.to_builtins(event.envelope.origin)
        if isinstance(event.before, ChatState):
            body.update(_context(event.before, action))
        return self.record(session, body, _form_of(event.uri, action))

    async def export(self, session: str) -> AsyncIterator[bytes]:
        """The session's records and the export's signed end, exported now
        (:func:`signed_export`); raises StoreError."""
        key = await self.keys.signing()
        async for line in signed_export(self.store, session, key, iso_time(self.now_ms())):
            yield line

    @contextlib.asynccontextmanager
    async def charged(
        self, session: str | None, payer: str | None, action: StateAction
    ) -> AsyncIterator[Rejection | None]:
        """Around accepting ``action`` of ``payer`` (a person: their token,
        or their shared link's; None for the agent and the server) in
        ``session``: a decisive one is charged first (see the module
        docstring and :func:`charge_of`), and given back should it not be accepted
        (rejected, or applied already). Yields the rejection it gets when
        the payer's share is used up or the audit has no room left for
        people (None: charged, or nothing to charge), for the caller to
        check with the rules under the channel's lock: a copy re-sent of
        an action applied already is said to be applied, and an invalid
        one gets the rule it breaks. Raises StoreError."""
        records = charge_of(action)
        if session is None or payer is None or not records:
            yield None
            return
        reserve = self.max_records // RESERVED_SHARE
        share = reserve // SENDER_SHARE
        room = self.max_records - reserve // HOUSE_SHARE
        charge = await self.store.charge_audit(session, payer, records, share, room)
        if charge == "share":
            yield Rejection(
                RejectionCode.AUDIT_SHARE_USED,
                f"your share of this session's audit is used up: a token's decisions and "
                f"truncations take at most {share} of its records; the others' still land",
            )
            return
        if charge == "full":
            yield Rejection(
                RejectionCode.AUDIT_FULL,
                "this session's audit has no room left for people's decisions: none is "
                "accepted without its record",
            )
            return
        try:
            yield None
        except (ActionRejected, AlreadyApplied):
            try:
                await self.store.charge_audit(session, payer, -records, share, room)
            except StoreError as error:  # what it took stays taken: bounded all the same
                log.warning("audit of %s: a charge could not be given back: %s", session, error)
            raise

    def waiting(self) -> bool:
        """Whether some session's audit has records the store refused
        waiting here (cheap: asked before every action)."""
        return bool(self._retrying)

    async def caught_up(self, session: str) -> None:
        """Before an action ``session``'s audit would record is accepted:
        what the store refused of it is written first, or StoreUnavailable
        (the action is refused as if the store were down for it too), so
        that records never pile up in memory, where a crash loses them,
        while actions go on being accepted. Bounded so: at most the records
        of the actions accepted before the refusal was seen."""
        chain = self._chains.get(session)
        if chain is None or not chain.queue or session not in self._retrying:
            return
        try:
            await self._write_through(session, chain, chain.queue[-1])
        except StoreError as error:
            raise StoreUnavailable(
                f"the audit of {session} cannot be written now ({error}): nothing it "
                "would record is accepted until it is"
            ) from None

    def runner_resumed(self, chat: str, turn_id: str, resume: object) -> None:
        """Record that the runner took ``resume`` for turn ``turn_id``, shown
        in ``chat`` (in the background: the runner's listeners do not wait;
        ``server.build`` hears the runner's TURN_RESUMED events for it)."""
        session = self.session_of(chat)
        if session is None:
            return
        body: Record = {
            "at": iso_time(self.now_ms()),
            "session": session,
            "chat": chat,
            "what": "runner/resumed",
            "who": _who(None),
            "turn": turn_id,
            "resume": msgspec.to_builtins(resume),
        }
        task = asyncio.get_running_loop().create_task(self._logged(self.record(session, body)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self, *, until: float = 0.0) -> None:
        """Write every record queued so far, trying again while the store
        refuses up to ``until`` (``time.monotonic()``; at a stop: what is
        still queued then is lost with the process, logged)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for retry in list(self._retrying.values()):
            retry.cancel()  # the rounds below take over
        await asyncio.gather(*self._retrying.values(), return_exceptions=True)
        pause = 0.05
        while True:
            # The sessions at once: a round costs one store timeout, not one
            # per session (a stop with Redis hung would take minutes).
            chains = [(session, chain) for session, chain in self._chains.items() if chain.queue]
            tries = [
                self._write_through(session, chain, chain.queue[-1]) for session, chain in chains
            ]
            outcomes = await asyncio.gather(*tries, return_exceptions=True)
            last = time.monotonic() + pause >= until
            waiting = 0
            for (session, chain), outcome in zip(chains, outcomes, strict=True):
                if isinstance(outcome, StoreError):
                    waiting += 1
                    if last:
                        log.error(
                            "audit of %s: %d records wait: %s", session, len(chain.queue), outcome
                        )
                elif isinstance(outcome, BaseException):
                    log.error("audit of %s could not be written", session, exc_info=outcome)
            if not waiting or last:
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    def stop(self) -> None:
        """No more retries (after the stop's :meth:`settled`)."""
        for retry in self._retrying.values():
            retry.cancel()

    def unwritten(self) -> int:
        """How many records are queued and not written (at the end of a
        stop: lost with the process)."""
        return sum(len(chain.queue) for chain in self._chains.values())

    async def _logged(self, write: Awaitable[None]) -> None:
        try:
            await write
        except Exception:
            log.exception("an audit record could not be written yet")

    def record(
        self, session: str, body: Record, form: tuple[str, str] | None = None
    ) -> Awaitable[None]:
        """Queue ``body`` as the session's next record (now, in this order);
        the awaitable ends once it is in the store. The reserve is kept for
        it by its ``what`` (DECISIVE)."""
        chain = self._chains.setdefault(session, _Chain())
        pending = _Pending(body, form, _decisive(body))
        if len(chain.queue) >= MAX_QUEUED:
            log.error("audit of %s: a record was dropped, the store is not keeping up", session)
            pending.done.set_result(None)
        else:
            chain.queue.append(pending)
        return self._write_through(session, chain, pending)

    async def _write_through(self, session: str, chain: _Chain, mine: _Pending) -> None:
        async with chain.lock:
            while not mine.done.done():
                pending = chain.queue[0]
                try:
                    await self._append(session, pending)
                except StoreError:
                    # It stays first in line: the next write tries again, or,
                    # when none comes, a retry a moment later.
                    self._retry_later(session)
                    raise
                except Exception:
                    log.exception("audit of %s: a record that cannot be written", session)
                chain.queue.popleft()
                pending.done.set_result(None)
            if not chain.queue and self._chains.get(session) is chain:
                del self._chains[session]
        await mine.done

    def _retry_later(self, session: str) -> None:
        if session not in self._retrying:
            self._retrying[session] = asyncio.get_running_loop().create_task(self._retry(session))

    async def _retry(self, session: str) -> None:
        """Write the session's queue once the store takes it again, asked
        RETRY_AFTER seconds after a refusal, then less often (every 10 s at
        most), for as long as the process runs; a stop takes over."""
        pause = RETRY_AFTER
        try:
            while (chain := self._chains.get(session)) is not None and chain.queue:
                await asyncio.sleep(pause)
                try:
                    await self._write_through(session, chain, chain.queue[-1])
                except StoreError:
                    pause = min(pause * 2, 10.0)
        finally:
            if self._retrying.get(session) is asyncio.current_task():
                del self._retrying[session]

    async def _append(self, session: str, pending: _Pending) -> None:
        body = bounded(await self._redacted(pending))
        decisive = pending.decisive
        head = self._heads.get(session)
        if pending.tried is not None:
            n, tried, whole = pending.tried
            if await self.store.read_audit(session, n - 1, 1) == [tried]:
                # It landed, its answer lost on the way: not written twice.
                pending.tried, head = None, None
                self._heads.pop(session)
                if whole:
                    return
        for _ in range(MAX_ATTEMPTS):
            if head is None:
                head = _head_of(await self.store.last_audit(session))
            if head.full or head.n >= self.max_records:
                return  # full, and said so
            written = body
            reserved = self._reserved(head.n, head.total)
            opened = self._reserved(head.n - 1, head.before)  # and said so
            if reserved and opened and not decisive:
                return  # in the reserve, which is not for this
            if head.n + 1 >= self.max_records or head.total >= self.max_bytes:
                written = _marker(body, session, FULL)
            elif reserved and not opened:
                written = _marker(body, session, "audit/reserve")
            key = await self.keys.signing()
            line, digest = seal({**written, "bytes": head.total}, head.n + 1, head.prev, key)
            what = written["what"]
            whole = written is body or not decisive or what == FULL
            pending.tried = (head.n + 1, line, whole)
            try:
                await self.store.append_audit(session, head.n + 1, line)
            except SeqConflict:
                head = None  # another process appended: read its head
                continue
            pending.tried = None
            head = _Head(head.n + 1, digest, head.total + len(line), head.total, what == FULL)
            self._heads.put(session, head)
            if whole:
                return
            # The reserve's marker took its place: the record itself follows.
        raise StoreUnavailable(f"the audit of {session} is too busy to write now")

    def _reserved(self, n: int, total: int) -> bool:
        """Whether an audit of ``n`` records (``total`` bytes) keeps the rest
        for decisive records: the record after it would be past nine tenths
        of the records, or it holds nine tenths of the bytes."""
        if n < 0:
            return False
        records = self.max_records - self.max_records // RESERVED_SHARE
        return n + 1 >= records or total >= self.max_bytes - self.max_bytes // RESERVED_SHARE

    async def _redacted(self, pending: _Pending) -> Record:
        body = pending.body
        sensitive: frozenset[str] | None = None  # None: every value
        if self.values == "keep":
            sensitive = frozenset()
            if pending.form is not None:
                form = await self.forms.load(*pending.form)
                if form is not None:
                    sensitive = sensitive_fields(form.schema)
        action = body.get("action")
        paths = _redact(action, sensitive) if isinstance(action, dict) else []
        asked = body.get("asked")
        if sensitive is None and isinstance(asked, dict) and "toolInput" in asked:
            asked["toolInput"] = REDACTED
            paths.append("asked/toolInput")
        if not paths:
            return body
        return {**body, "redacted": paths}

    def _worth_it(self, chat: str, action: StateAction, sender: Identity | None) -> bool:
        """A draft is worth a record when its author or state changed, and
        while its request has had fewer than ``drafts_per_request``. A cleared
        answer is not: what counts is what was written, and the completion
        records every answer as submitted (toggling an answer on and off
        must not fill the audit up)."""
        if not isinstance(action, ChatInputAnswerChanged):
            return True
        if action.answer is None:
            return False
        key = (chat, action.request_id, action.question_id)
        who = None if sender is None else (sender.token, sender.name)
        now = (who, action.answer.state)
        drafted = self._drafted.get((chat, action.request_id)) or 0
        if self._drafts.get(key) == now or drafted >= self.drafts_per_request:
            return False
        self._drafts.put(key, now)
        self._drafted.put((chat, action.request_id), drafted + 1)
        return True


DECISIVE: Final = frozenset(
    {"chat/inputCompleted", "chat/toolCallConfirmed", "runner/resumed", "chat/truncated"}
)
"""What the reserve is kept for: a request completed, a tool call decided
(each carrying what it decided on, ``asked``), the resume they made, and
turns truncated away (a person's each charged to their share: see
:func:`charge_of`)."""


def charge_of(action: StateAction) -> int:
    """The records a person's ``action`` is charged of their share of the
    audit (the decisive ones it makes): a decision CHARGED, a truncation
    one, anything else none (what people can make as often as they like,
    which the reserve does not take)."""
    match action:
        case ChatInputCompleted() | ChatToolCallConfirmed():
            return CHARGED
        case ChatTruncated():
            return 1
    return 0


FULL: Final = "audit/full"


def _decisive(body: Record) -> bool:
    """Whether a record is one the reserve is kept for (DECISIVE), not one
    people can make as often as they like, directly (drafts, turns started
    and cancelled) or through the agent (each turn a person starts makes
    the agent and the server act)."""
    return body.get("what") in DECISIVE


def _context(before: ChatState, action: StateAction) -> Record:
    """What a decision decided on, as the chat showed it just before
    (``asked``: the request without its drafts, the tool call waiting for
    confirmation), and what a truncation removed (``removed``: the turns'
    ids, and the active turn's): so that a decision is never on record
    without its subject, even once the request's own record was left out."""
    active = before.active_turn
    match action:
        case ChatInputCompleted() if active is not None:
            found = select_open_input_part(active.response_parts, action.request_id)
            if found is not None:
                asked = msgspec.to_builtins(found[1].request)
                asked.pop("answers", None)
                return {"asked": asked}
        case ChatToolCallConfirmed():
            call = select_tool_call(before, action.tool_call_id)
            if isinstance(call, ToolCallPendingConfirmation):
                return {"asked": msgspec.to_builtins(call)}
        case ChatTruncated():
            away = select_truncated(before, action)
            removed: Record = {"turns": [turn.id for turn in away if turn is not active]}
            if active is not None and away and away[-1] is active:
                removed["activeTurn"] = active.id
            return {"removed": removed}
    return {}


def bounded(body: Record) -> Record:
    """``body`` with every string longer than FIELD_BYTES kept as its
    digest, and, if it is still larger than RECORD_BYTES, every part of its
    action or ``asked`` larger than FIELD_BYTES as well; the paths are
    listed in ``elided``. A digest reads ``{"sha256": hex, "bytes": N,
    "head": the first KiB}``, of the string's UTF-8, or of the part as JSON
    with sorted keys and no spaces (then with ``"json": true``)."""
    paths: list[str] = []

    def strings(value: Any, path: str) -> Any:
        if isinstance(value, str) and len(raw := value.encode()) > FIELD_BYTES:
            paths.append(path)
            return _digest(raw)
        if isinstance(value, dict):
            return {k: strings(v, f"{path}/{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [strings(v, f"{path}/{i}") for i, v in enumerate(value)]
        return value

    parts = [key for key in ("action", "asked", "removed", "resume") if key in body]
    out: Record = {**body, **{key: strings(body[key], key) for key in parts}}
    if len(canonical(out)) > RECORD_BYTES:
        for key in parts:
            value = out[key]
            if not isinstance(value, dict):
                continue
            for name, part in list(value.items()):
                raw = canonical(part)
                if name != "type" and len(raw) > FIELD_BYTES:
                    value[name] = {**_digest(raw), "json": True}
                    paths[:] = [p for p in paths if not p.startswith(f"{key}/{name}/")]
                    paths.append(f"{key}/{name}")
    if paths:
        out[ELIDED] = paths
    return out


def _digest(raw: bytes) -> Record:
    head = raw[:FIELD_BYTES].decode("utf-8", "ignore")
    return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw), "head": head}


def _marker(body: Record, session: str, what: str) -> Record:
    return {"at": body["at"], "session": session, "what": what, "who": _who(None)}


def sensitive_fields(schema: dict[str, Any]) -> frozenset[str]:
    """The properties of a form whose values the audit does not keep."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return frozenset()
    return frozenset(
        name
        for name, prop in properties.items()
        if isinstance(prop, dict) and any(prop.get(keyword) is True for keyword in SENSITIVE)
    )


def _who(sender: Identity | None) -> Record:
    return {"role": "server"} if sender is None else dict(sender.who())


def _form_of(chat: str, action: StateAction) -> tuple[str, str] | None:
    match action:
        case ChatInputAnswerChanged() | ChatInputCompleted():
            return chat, action.request_id
        case ChatInputRequested():
            return chat, action.request.id
    return None


@dataclass(frozen=True, slots=True)
class _Head:
    """A chain's last record: its ``n`` and hash, the bytes of the audit
    with it (``total``) and before it, and whether it says the audit is
    full. Read from the record itself, so every process agrees."""

    n: int
    prev: str
    total: int
    before: int
    full: bool


def _head_of(record: bytes | None) -> _Head:
    if record is None:
        return _Head(0, GENESIS, 0, -1, False)
    parsed = msgspec.json.decode(record)
    # A record written before records carried ``bytes`` counts from 0.
    before = parsed.get("bytes")
    before = before if isinstance(before, int) else 0
    return _Head(
        int(parsed["n"]),
        str(parsed["hash"]),
        before + len(record),
        before,
        parsed.get("what") == FULL,
    )


def _redact(action: Record, sensitive: frozenset[str] | None) -> list[str]:
    """Blank the sensitive values in ``action`` (in place); their paths.
    ``sensitive`` None: every answer value and tool input."""

    def hide(answer: Any, question: str) -> bool:
        if not isinstance(answer, dict) or (sensitive is not None and question not in sensitive):
            return False
        hidden = False
        for key in ("value", "freeformValues"):
            if key in answer:
                answer[key] = REDACTED
                hidden = True
        return hidden

    paths: list[str] = []
    match action.get("type"):
        case "chat/inputAnswerChanged":
            if hide(action.get("answer"), action.get("questionId", "")):
                paths.append("answer")
        case "chat/inputCompleted":
            answers = action.get("answers") or {}
            paths.extend(f"answers/{q}" for q, answer in answers.items() if hide(answer, q))
        case "chat/inputRequested":
            answers = (action.get("request") or {}).get("answers") or {}
            paths.extend(f"request/answers/{q}" for q, a in answers.items() if hide(a, q))
        case "chat/toolCallConfirmed" | "chat/toolCallReady" if sensitive is None:
            for key in ("editedToolInput", "toolInput"):
                if key in action:
                    action[key] = REDACTED
                    paths.append(key)
    return paths
