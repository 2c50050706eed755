"""The durable outbox: every event delivered at least once, by one process.

Writing. An event (server.notify.events) is written to the store ahead of
the append that makes it: the channel core asks :meth:`Notifier.ahead`
with the chat's lock held, once the action is validated
(server.core.channels.Ahead), and the append waits for the record. So a
process killed right after the append leaves the event behind, never loses
it. The record is ``ahead`` until the envelope is applied here (the hook
turns it ``ready``, with its targets, and sends it at once); one whose hook
never ran (the process died, the append's answer was lost) is checked
against the chat after :data:`AHEAD_GRACE` by any process's sweep: sent
when the chat shows its action landed, dropped when it did not. Nothing is
written when no endpoint or invite could want it (the targets are read
from the store at most once a :data:`REFRESH`), so a server without
webhooks pays nothing.

Sending. Each record holds one delivery per target (an endpoint, an email
address), each with its tries. A process sends a record's due deliveries
only under the store's claim of it (server.store.base.ChannelStore.claim),
re-read once claimed, so that with several processes each event is sent
once; a process that dies mid-try leaves the claim to expire and the try
to be made again (at least once). The tries: at once, then after
:data:`RETRIES`; 15 s each (server.notify.sending); ``410 Gone`` disables
the endpoint, and so do :data:`FAILING_DISABLES` of failures. All sending
runs in the background: a slow or dead endpoint never slows a chat, only
its own deliveries.

Bounded: at most :data:`MAX_OUTBOX` records waiting (an event beyond it
is logged and dropped, counted in the store so across processes); a record
whose every delivery is over moves to :data:`DONE`, which the sweeps do not
read, kept for ``GET /api/webhooks/deliveries`` up to :data:`KEEP_DONE`
and :data:`MAX_DONE` records (the oldest go first); at most
:data:`MAX_ATTEMPTS` tries kept per delivery.

Escalation: an endpoint with ``escalateAfter`` gets, for each wait opened
that it wants, a record due that many seconds later; when due, it is sent
(``input.escalated``) if the wait is still open, else dropped: once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal
from urllib.parse import quote

import httpx
import msgspec

from protocol.chat import ChatState
from server.auth import Identity
from server.core.channels import Applied, Step
from server.core.frozen_forms import chat_session
from server.core.host import Host
from server.errors import ChannelGone, StoreError
from server.notify.endpoints import Endpoint, Endpoints, Invite, decoded, url_problem
from server.notify.events import REQUESTED, Event, escalation_of, event_of, landed, wait_open
from server.notify.sending import Smtp, Tried, email_text, post
from server.periodic import Periodic

log = logging.getLogger("huddle.notify")

OUTBOX = "outbox"
DONE = "outbox-done"
MAX_OUTBOX = 10_000
MAX_DONE = 10_000
RETRIES = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
"""Seconds before each try after the first (which is at once): 5 s, 5 min,
30 min, 2 h, 5 h, 10 h, 10 h; eight tries in all."""
AHEAD_GRACE = 30.0
"""Seconds after which an event written ahead and never confirmed is
checked against its chat."""
CLAIM_SECONDS = 60.0
"""How long a process holds a record it sends (its tries run at once, 15 s
each at most)."""
FAILING_DISABLES = 5 * 86400.0
KEEP_DONE = 7 * 86400.0
MAX_ATTEMPTS = 20
REFRESH = 1.0
"""Seconds the endpoints and invites read from the store are used for."""
SENDING = 16
"""Records sent at once by one process."""

Stage = Literal["ahead", "ready", "escalation"]
Outcome = Literal["pending", "delivered", "failed", "disabled", "dropped"]


class Attempt(msgspec.Struct, frozen=True, omit_defaults=True):
    at: float
    status: int | None = None
    error: str | None = None


class Delivery(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    target: str
    """``wh:<endpoint id>`` or ``email:<address>``."""
    outcome: Outcome = "pending"
    next_at: float | None = None
    attempts: list[Attempt] = msgspec.field(default_factory=list)


class Outgoing(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One event's record in the outbox (lenient: new fields get defaults)."""

    id: str
    type: str
    chat: str
    session: str
    family: str
    key: str
    payload: dict[str, Any]
    stage: Stage
    created: float
    due: float
    """When an ``ahead`` record is checked, an ``escalation`` one sent."""
    deliveries: list[Delivery] = msgspec.field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.stage == "ready" and all(d.outcome != "pending" for d in self.deliveries)


_decode = msgspec.json.Decoder(Outgoing)


class Notifier:
    """The outbox of one process; see the module docstring. :meth:`attach`
    it to the host, then :meth:`start` and :meth:`stop` it."""

    def __init__(
        self,
        host: Host,
        *,
        base_url: str,
        smtp: Smtp | None = None,
        mint: Callable[[Invite], str] | None = None,
        clock: Callable[[], float] = time.time,
        interval: float = 1.0,
    ) -> None:
        self.host = host
        self.store = host.store
        self.endpoints = Endpoints(host.store)
        self.base_url = base_url
        """The web client's address, for the links events carry."""
        self.smtp = smtp
        self.mint = mint
        """A token in an invited person's name (None: emails carry the
        chat's link only)."""
        self.clock = clock
        self.max_outbox = MAX_OUTBOX
        self._owner = secrets.token_hex(8)
        self._periodic = Periodic(
            self.sweep, interval, log=log, what="sending notifications", expected=(StoreError,)
        )
        self._read_at = -REFRESH
        self._pruned_at = time.monotonic()
        self._stopped = False
        self._targets: tuple[list[Endpoint], list[Invite]] = ([], [])
        self._client = httpx.AsyncClient(follow_redirects=False, trust_env=False)
        self._sending = asyncio.Semaphore(SENDING)
        self._tasks: set[asyncio.Task[None]] = set()

    def attach(self) -> None:
        self.host.add_ahead_of_append(self.ahead)
        self.host.add_hook(self.hook)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        """Stop sending; tries under way are cut off (their claims expire,
        and another process, or this one's next life, tries again)."""
        self._stopped = True
        await self._periodic.stop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.aclose()

    # ─── Writing ─────────────────────────────────────────────────────────

    def _event(self, uri: str, applied: Step | Applied, sender: Identity | None) -> Event | None:
        if isinstance(applied, Step):
            action, after = applied.envelope.action, applied.after
            held = self.host.core.cached(uri)
            before = held.state if held is not None else None
        else:
            action, after, before = applied.action, applied.view.state, applied.before
        if before is None:
            return None
        session = chat_session(after) if isinstance(after, ChatState) else None
        held_session = self.host.core.cached(session) if session is not None else None
        meta = getattr(held_session.state, "meta", None) if held_session is not None else None
        now = self._now_ms()
        return event_of(uri, action, before, after, sender, now, self.base_url, meta)

    def ahead(self, uri: str, step: Step, sender: Identity | None) -> Awaitable[None] | None:
        """The core's write ahead (server.core.channels.Ahead)."""
        event = self._event(uri, step, sender)
        return None if event is None else self._write_ahead(event)

    async def _write_ahead(self, event: Event) -> None:
        endpoints, invites = await self._read_targets()
        if not self._deliveries(event, endpoints, invites):
            return
        if await self.store.count_records(OUTBOX) >= self.max_outbox:
            log.warning("the outbox is full (%d events): %s not sent", self.max_outbox, event.type)
            return
        now = self.clock()
        record = _outgoing(event, "ahead", now, now + AHEAD_GRACE, [])
        await self.store.keep_record(OUTBOX, event.id, msgspec.json.encode(record))
        if event.type in REQUESTED:
            await self._write_escalations(event, endpoints, now)

    async def _write_escalations(self, event: Event, endpoints: list[Endpoint], now: float) -> None:
        """Ahead too: an ``input.escalated`` record per endpoint that wants
        one, due the request's ``escalateAfter`` on (else the endpoint's);
        one whose append did not land finds no open wait when due, and is
        dropped."""
        escalation = escalation_of(event, self._now_ms())
        for endpoint in endpoints:
            after = event.escalate_after or endpoint.escalate_after
            if after is None or not endpoint.wants(escalation.type, event.session):
                continue
            due = now + after
            target = [Delivery(target="wh:" + endpoint.id, next_at=due)]
            later = _outgoing(escalation, "escalation", now, due, target)
            name = f"{escalation.id}.{endpoint.id}"
            await self.store.keep_record(OUTBOX, name, msgspec.json.encode(later))

    def hook(self, event: Applied) -> None:
        """The host's hook: an event of an append of this process is
        confirmed (with its targets) and sent, in the background."""
        if not event.local:
            return
        found = self._event(event.uri, event, event.sender)
        if found is not None:
            self._spawn(self._confirm(found))

    async def _confirm(self, event: Event) -> None:
        try:
            await self._send(event.id, confirmed=event)
        except StoreError as error:  # the sweep checks it after the grace
            log.warning("could not confirm %s %s: %s", event.type, event.id, error)

    async def _make_ready(self, key: str, event: Event) -> Outgoing:
        endpoints, invites = await self._read_targets()
        now = self.clock()
        deliveries = self._deliveries(event, endpoints, invites)
        record = _outgoing(event, "ready", now, now, deliveries)
        await self.store.put_record(OUTBOX, key, msgspec.json.encode(record))
        return record

    def _deliveries(
        self, event: Event, endpoints: list[Endpoint], invites: list[Invite]
    ) -> list[Delivery]:
        now = self.clock()
        found = [
            Delivery(target="wh:" + e.id, next_at=now)
            for e in endpoints
            if e.wants(event.type, event.session)
        ]
        if self.smtp is not None and event.type in REQUESTED:
            found += [
                Delivery(target="email:" + i.email, next_at=now)
                for i in invites
                if i.wants(event.session, now)
            ]
        return found

    async def _read_targets(self) -> tuple[list[Endpoint], list[Invite]]:
        now = time.monotonic()
        if now - self._read_at >= REFRESH:
            self._targets = (await self.endpoints.all(), await self.endpoints.invites())
            self._read_at = now
        return self._targets

    def targets_changed(self) -> None:
        """An endpoint or invite was added or removed here: read them again."""
        self._read_at = -REFRESH

    # ─── Sending ─────────────────────────────────────────────────────────

    async def sweep(self) -> int:
        """Check what was written ahead, escalate, send what is due, drop
        what is old; returns how many records were sent to."""
        now = self.clock()
        records = await self.store.records(OUTBOX)
        due: list[str] = []
        for key, raw in records.items():
            try:
                record = _decode.decode(raw)
            except msgspec.DecodeError:
                await self.store.delete_record(OUTBOX, key)
                continue
            if record.stage != "ready":
                if record.due <= now:
                    due.append(key)  # to check (ahead) or to escalate
            elif record.finished:
                await self._finish(key, record)
            elif any(_is_due(d, now) for d in record.deliveries):
                due.append(key)
        await asyncio.gather(*(self._send(key) for key in due))
        await self._prune(now)
        return len(due)

    async def _finish(self, key: str, record: Outgoing) -> None:
        """Move a record whose deliveries are all over out of the outbox."""
        await self.store.put_record(DONE, key, msgspec.json.encode(record))
        await self.store.delete_record(OUTBOX, key)

    async def _prune(self, now: float) -> None:
        """Drop finished records beyond MAX_DONE (the oldest), and those
        older than KEEP_DONE (looked for once an hour)."""
        over = await self.store.count_records(DONE) > MAX_DONE
        if not over and time.monotonic() - self._pruned_at < 3600:
            return
        self._pruned_at = time.monotonic()
        done = decoded(await self.store.records(DONE), _decode)
        kept = sorted((record.created, key) for key, record in done.items())
        drop = max(0, len(kept) - MAX_DONE * 9 // 10)
        for n, (created, key) in enumerate(kept):
            if n < drop or now - created >= KEEP_DONE:
                await self.store.delete_record(DONE, key)

    async def _readied(
        self, key: str, record: Outgoing, confirmed: Event | None, now: float
    ) -> Outgoing | None:
        """The record ready to send (the claim held), or None: an event
        written ahead, confirmed by its hook (``confirmed``) or, once due,
        when the chat shows its action landed; an escalation once due, when
        its wait is still open. One that no longer holds is dropped."""
        if record.stage == "ready":
            return record
        if record.stage == "ahead" and confirmed is not None:
            return await self._make_ready(key, confirmed)
        if record.due > now:
            return None
        try:
            state = (await self.host.core.view(record.chat)).state
        except ChannelGone:
            state = None
        if record.stage == "ahead":
            holds = state is not None and landed(state, record.type, record.family, record.key)
        else:
            holds = state is not None and wait_open(state, record.family, record.key)
        if not holds:
            await self.store.delete_record(OUTBOX, key)
            return None
        if record.stage == "ahead":
            return await self._make_ready(key, _event_of_record(record))
        ready = msgspec.structs.replace(record, stage="ready")
        await self.store.put_record(OUTBOX, key, msgspec.json.encode(ready))
        return ready

    async def _send(self, key: str, confirmed: Event | None = None) -> None:
        """Send the record's due deliveries, under its claim: every change of
        a record's stage is made under it too, so that two processes never
        both make one ready (the second would send it again)."""
        async with self._sending:
            claim = "outbox:" + key
            # An owner per send: two sends of one process exclude each other too.
            owner = f"{self._owner}.{secrets.token_hex(4)}"
            if await self.store.claim(claim, owner, CLAIM_SECONDS) is not None:
                return  # another send has it
            try:
                raw = await self.store.get_record(OUTBOX, key)
                if raw is None:
                    return  # not written (no targets, full), or finished
                record = await self._readied(key, _decode.decode(raw), confirmed, self.clock())
                if record is None:
                    return
                now = self.clock()  # after: a record just made ready is due now
                tried = await asyncio.gather(
                    *(
                        self._try(record, d, now) if _is_due(d, now) else _same(d)
                        for d in record.deliveries
                    )
                )
                if tried != record.deliveries:
                    done = msgspec.structs.replace(record, deliveries=list(tried))
                    if done.finished:
                        await self._finish(key, done)
                    else:
                        await self.store.put_record(OUTBOX, key, msgspec.json.encode(done))
            finally:
                await self.store.claim(claim, owner, 0)

    async def _try(self, record: Outgoing, delivery: Delivery, now: float) -> Delivery:
        kind, _, name = delivery.target.partition(":")
        if kind == "wh":
            endpoint = await self.endpoints.get(name)
            if endpoint is None:
                return msgspec.structs.replace(delivery, outcome="dropped", next_at=None)
            if endpoint.disabled is not None:
                return msgspec.structs.replace(delivery, outcome="disabled", next_at=None)
            if (problem := url_problem(endpoint.url, [self.base_url])) is not None:
                # Written to the store before --public-url named this server.
                refused = Tried(None, problem)
                return _after(delivery, refused, now, disabled=True)
            tried = await post(
                self._client,
                endpoint.url,
                record.id,
                record.payload,
                secrets=endpoint.signing(now),
                slack=endpoint.format == "slack",
            )
            disabled = await self._note_endpoint(endpoint, tried, now)
            return _after(delivery, tried, now, disabled=disabled)
        invite = next((i for i in (await self.endpoints.invites()) if i.email == name), None)
        if invite is None or self.smtp is None:
            return msgspec.structs.replace(delivery, outcome="dropped", next_at=None)
        subject, text = email_text(record.payload, self._sign_in(invite, record))
        return _after(delivery, await self.smtp.send(invite.email, subject, text), now)

    def _sign_in(self, invite: Invite, record: Outgoing) -> str | None:
        """The link that signs ``invite``'s person in and opens the chat."""
        if self.mint is None:
            return None
        link = str(record.payload["data"]["link"])
        base, _, route = link.partition("#")
        return f"{base.rstrip('/')}/?token={quote(self.mint(invite), safe='')}#{route}"

    async def _note_endpoint(self, endpoint: Endpoint, tried: Tried, now: float) -> bool:
        """Record what a try says of its endpoint; True when it is disabled
        now (410 Gone, or failing for FAILING_DISABLES)."""
        replace = msgspec.structs.replace
        if tried.ok:
            if endpoint.failing_since is not None:
                await self.endpoints.save(replace(endpoint, failing_since=None))
            return False
        why = None
        if tried.status == 410:
            why = "410 Gone"
        elif (
            endpoint.failing_since is not None and now - endpoint.failing_since >= FAILING_DISABLES
        ):
            why = f"failing for {FAILING_DISABLES / 86400:g} days"
        if why is not None:
            log.warning("webhook %s disabled: %s", endpoint.id, why)
            await self.endpoints.save(replace(endpoint, disabled=why))
            return True
        if endpoint.failing_since is None:
            await self.endpoints.save(replace(endpoint, failing_since=now))
        return False

    # ─── Reading and sending again ───────────────────────────────────────

    async def deliveries(
        self, endpoint: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The latest deliveries (of ``endpoint``, an id), newest first."""
        target = None if endpoint is None else "wh:" + endpoint
        shown: list[dict[str, Any]] = []
        held = {**(await self.store.records(DONE)), **(await self.store.records(OUTBOX))}
        for key, record in decoded(held, _decode).items():
            for d in record.deliveries:
                if target is None or d.target == target:
                    shown.append(_shown(key, record, d))
        shown.sort(key=lambda d: d["created"], reverse=True)
        return shown[:limit]

    async def resend(self, key: str, target: str | None = None) -> bool:
        """Send a delivery again now (every one of the record without
        ``target``); False when there is no such record."""
        claim, owner = "outbox:" + key, f"{self._owner}.{secrets.token_hex(4)}"
        if await self.store.claim(claim, owner, CLAIM_SECONDS) is not None:
            return True  # being sent right now
        try:
            raw = await self.store.get_record(OUTBOX, key) or await self.store.get_record(DONE, key)
            if raw is None or (record := _decode.decode(raw)).stage != "ready":
                return False
            now = self.clock()
            again = [
                msgspec.structs.replace(d, outcome="pending", next_at=now)
                if target is None or d.target == target
                else d
                for d in record.deliveries
            ]
            ready = msgspec.structs.replace(record, deliveries=again)
            await self.store.put_record(OUTBOX, key, msgspec.json.encode(ready))
            await self.store.delete_record(DONE, key)
        finally:
            await self.store.claim(claim, owner, 0)
        self._spawn(self._send(key))
        return True

    # ─── Helpers ─────────────────────────────────────────────────────────

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background (nothing once stopped: what it
        would send, the sweeps of the next process do)."""
        if self._stopped:
            work.close()
            return

        async def run() -> None:
            try:
                await work
            except StoreError as error:
                log.warning("notifications: %s", error)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """Wait for the sending started in the background (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _outgoing(
    event: Event, stage: Stage, created: float, due: float, deliveries: list[Delivery]
) -> Outgoing:
    return Outgoing(
        id=event.id,
        type=event.type,
        chat=event.chat,
        session=event.session,
        family=event.family,
        key=event.key,
        payload=event.payload(),
        stage=stage,
        created=created,
        due=due,
        deliveries=deliveries,
    )


def _event_of_record(record: Outgoing) -> Event:
    payload = record.payload
    family: Any = record.family
    return Event(
        record.id,
        record.type,
        record.chat,
        record.session,
        family,
        record.key,
        payload["data"],
        payload["timestamp"],
    )


def _is_due(delivery: Delivery, now: float) -> bool:
    return (
        delivery.outcome == "pending" and delivery.next_at is not None and delivery.next_at <= now
    )


async def _same(delivery: Delivery) -> Delivery:
    return delivery


def _after(delivery: Delivery, tried: Tried, now: float, *, disabled: bool = False) -> Delivery:
    """The delivery after a try: delivered, or the next try, or given up."""
    attempts = [*delivery.attempts, Attempt(now, tried.status, tried.error)][-MAX_ATTEMPTS:]
    replace = msgspec.structs.replace
    if tried.ok:
        return replace(delivery, outcome="delivered", next_at=None, attempts=attempts)
    if disabled:
        return replace(delivery, outcome="disabled", next_at=None, attempts=attempts)
    failures = sum(1 for a in attempts if not (a.status is not None and 200 <= a.status < 300))
    if failures > len(RETRIES):
        return replace(delivery, outcome="failed", next_at=None, attempts=attempts)
    wait = RETRIES[failures - 1]
    return replace(delivery, next_at=now + wait, attempts=attempts)


def _shown(key: str, record: Outgoing, delivery: Delivery) -> dict[str, Any]:
    """A delivery as ``GET /api/webhooks/deliveries`` shows it."""
    target = delivery.target
    shown: dict[str, Any] = {
        "id": key,
        "eventId": record.id,
        "type": record.type,
        "session": record.session,
        "chat": record.chat,
        "created": record.created,
        "outcome": "scheduled" if record.stage != "ready" else delivery.outcome,
        "nextTry": delivery.next_at,
        "attempts": [msgspec.to_builtins(a) for a in delivery.attempts],
    }
    if target.startswith("wh:"):
        shown["webhook"] = target[3:]
    else:
        shown["email"] = target.partition(":")[2]
    return shown
