"""A session's audit: who did what, as a hash chain anyone can check.

Every accepted action a person or an agent made in a session's chats that
matters afterwards (a turn started, completed, cancelled or failed; a
question asked, an answer drafted, a request completed; a tool call waiting
for approval, approved or denied (with its reason and edited input), its
result) becomes one record of the session's audit, and so does every
resume the runner took (its command and the metadata saying who resumed
it). Drafts are recorded when their author or state changes, not per
keystroke. A record, one JSON object (one line of an export)::

    {"n": 3, "at": "2026-12-01T10:00:00.000Z", "session": "ahp-session:/x",
     "chat": "ahp-chat:/x/1", "seq": 7, "what": "chat/inputCompleted",
     "who": {"role": "participant", "name": "Lee", "token": "t-1f0c"},
     "origin": {"clientId": "web-3", "clientSeq": 4},
     "action": {...the action as on the wire...},
     "redacted": ["answers/password"],
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

A session's audit holds at most ``max_records``: the last one then says
``"what": "audit/full"`` and nothing more is recorded (the chain stays
whole). Its last tenth is a reserve, opened by a record ``"what":
"audit/reserve"``: from there on only decisive records are written (a
request completed, a tool call decided, the runner's resume), not what
people can make as often as they like (drafts, turns started or
cancelled, and what the agent does in each), so that nobody can fill an
audit to keep the answers out of it.

Records of one process are appended in the order it accepted the actions;
the store's compare-and-set orders processes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from protocol.actions import (
    ChatError,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    StateAction,
    action_type,
)
from protocol.chat import ChatState
from reducers.clock import iso_time
from server.auth import Identity
from server.cache import Lru
from server.channels import Applied
from server.errors import SeqConflict, StoreError, StoreUnavailable
from server.forms import FormRegistry, chat_session
from server.runner.events import EventType, RunnerEvent
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
MAX_ATTEMPTS: Final = 16
GONE_RECORDS: Final = "audit-of-gone"
RESERVED_SHARE: Final = 10
"""The last tenth of a session's audit is kept for decisive records."""
DRAFTS_PER_REQUEST: Final = 100
"""Draft records one request gets at most (in one process's lifetime): its
completion, and everything else, is recorded whatever drafting came first."""
"""The audits whose session was disposed, and when (ms): server.retention
removes them once they are old enough."""

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
)
AuditValues = Literal["keep", "redact"]

_canonical = msgspec.json.Encoder(order="sorted")
Record = dict[str, Any]


def canonical(record: Record) -> bytes:
    """The bytes a record's hash covers (and an export's line)."""
    return _canonical.encode(record)


def seal(body: Record, n: int, prev: str) -> tuple[bytes, str]:
    """``body`` as record ``n`` after ``prev``: its line and its hash."""
    record = {**body, "n": n, "prev": prev}
    digest = hashlib.sha256(canonical(record)).hexdigest()
    record["hash"] = digest
    return canonical(record), digest


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


def verify(lines: Iterable[bytes | str]) -> Verified:
    """Check a session's records, in order; raises AuditBroken."""
    prev, n, session = GENESIS, 0, None
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError as error:
            raise AuditBroken(line_no, f"not JSON ({error})") from None
        if not isinstance(record, dict):
            raise AuditBroken(line_no, "not a JSON object")
        claimed = record.pop("hash", None)
        if not isinstance(claimed, str):
            raise AuditBroken(line_no, "no hash")
        if hashlib.sha256(canonical(record)).hexdigest() != claimed:
            raise AuditBroken(line_no, "the hash does not match the record: it was altered")
        written = line.encode() if isinstance(line, str) else line
        if canonical({**record, "hash": claimed}) != written.strip() and _twice(written):
            # What a reader sees must be what was sealed: with a key given
            # twice, one parser shows the first and the hash covers the last.
            raise AuditBroken(line_no, "a key is given twice: the line is not as it was sealed")
        if record.get("prev") != prev:
            raise AuditBroken(line_no, "prev is not the previous record's hash: one is missing")
        if record.get("n") != n + 1:
            raise AuditBroken(line_no, f"record {record.get('n')!r} where {n + 1} belongs")
        if session is None:
            session = record.get("session")
        elif record.get("session") != session:
            raise AuditBroken(line_no, "a record of another session")
        prev, n = claimed, n + 1
    return Verified(records=n, head=prev, session=session)


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


# ─── Recording ───────────────────────────────────────────────────────────


@dataclass(eq=False)
class _Pending:
    body: Record
    form: tuple[str, str] | None
    """(chat, request id) whose frozen form says what to redact."""
    done: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


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
        now_ms: Callable[[], int],
        session_of: Callable[[str], str | None],
        values: AuditValues = "keep",
        max_records: int = 100_000,
    ) -> None:
        self.store = store
        self.forms = forms
        self.now_ms = now_ms
        self.session_of = session_of
        """The session of a chat this process holds (None: unknown)."""
        self.values = values
        self.max_records = max_records
        self._chains: dict[str, _Chain] = {}
        self._heads: Lru[str, tuple[int, str]] = Lru(1024)
        self._drafts: Lru[tuple[str, str, str], tuple[object, ...]] = Lru(4096)
        self._drafted: Lru[tuple[str, str], int] = Lru(4096)
        self.drafts_per_request = DRAFTS_PER_REQUEST
        self._tasks: set[asyncio.Task[None]] = set()

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
        return self.record(session, body, _form_of(event.uri, action))

    def runner_listener(self, event: RunnerEvent) -> None:
        """A runner listener: a resume the runner took is recorded (in the
        background: listeners do not wait)."""
        chat = event.data.get("chat")
        if event.type != EventType.TURN_RESUMED or not isinstance(chat, str):
            return
        session = self.session_of(chat)
        if session is None:
            return
        body: Record = {
            "at": iso_time(self.now_ms()),
            "session": session,
            "chat": chat,
            "what": "runner/resumed",
            "who": _who(None),
            "turn": event.turn_id,
            "resume": msgspec.to_builtins(event.data.get("resume")),
        }
        task = asyncio.get_running_loop().create_task(self._logged(self.record(session, body)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Write every record queued so far (those the store refuses now
        stay queued, logged)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for session, chain in list(self._chains.items()):
            if chain.queue:
                try:
                    await self._write_through(session, chain, chain.queue[-1])
                except StoreError as error:
                    log.error("audit of %s: %d records wait: %s", session, len(chain.queue), error)

    async def _logged(self, write: Awaitable[None]) -> None:
        try:
            await write
        except Exception:
            log.exception("an audit record could not be written yet")

    def record(
        self, session: str, body: Record, form: tuple[str, str] | None = None
    ) -> Awaitable[None]:
        """Queue ``body`` as the session's next record (now, in this order);
        the awaitable ends once it is in the store."""
        chain = self._chains.setdefault(session, _Chain())
        pending = _Pending(body, form)
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
                    raise  # it stays first in line: the next write tries again
                except Exception:
                    log.exception("audit of %s: a record that cannot be written", session)
                chain.queue.popleft()
                pending.done.set_result(None)
            if not chain.queue and self._chains.get(session) is chain:
                del self._chains[session]
        await mine.done

    async def _append(self, session: str, pending: _Pending) -> None:
        body = await self._redacted(pending)
        head = self._heads.get(session)
        for _ in range(MAX_ATTEMPTS):
            if head is None:
                head = _head_of(await self.store.last_audit(session))
            n, prev = head
            reserved = self.max_records - self.max_records // RESERVED_SHARE
            if n >= self.max_records or (n >= reserved and not _decisive(body)):
                return  # full (said so), or in the reserve, which is not for this
            written = body
            if n + 1 == self.max_records:
                written = _marker(body, session, "audit/full")
            elif n + 1 == reserved:
                written = _marker(body, session, "audit/reserve")
            line, digest = seal(written, n + 1, prev)
            try:
                await self.store.append_audit(session, n + 1, line)
            except SeqConflict:
                head = None  # another process appended: read its head
                continue
            head = (n + 1, digest)
            self._heads.put(session, head)
            if written is body or not _decisive(body) or written["what"] == "audit/full":
                return
            # The reserve's marker took its place: the record itself follows.
        raise StoreUnavailable(f"the audit of {session} is too busy to write now")

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


DECISIVE: Final = frozenset({"chat/inputCompleted", "chat/toolCallConfirmed", "runner/resumed"})
"""What the reserve is kept for: a request completed, a tool call decided,
and the resume they made."""


def _decisive(body: Record) -> bool:
    """Whether a record is one the reserve is kept for (DECISIVE), not one
    people can make as often as they like, directly (drafts, turns started
    and cancelled) or through the agent (each turn a person starts makes
    the agent and the server act)."""
    return body.get("what") in DECISIVE


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


def _head_of(record: bytes | None) -> tuple[int, str]:
    if record is None:
        return 0, GENESIS
    parsed = msgspec.json.decode(record)
    return int(parsed["n"]), str(parsed["hash"])


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
