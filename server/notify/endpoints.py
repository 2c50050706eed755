"""Webhook endpoints and the people invited by email: records in the store.

An endpoint is added by an agent token (``POST /api/webhooks``, ``huddle
webhook add``) and kept as a record of :data:`ENDPOINTS` by its id. Its
secret (``whsec_`` and 32 random bytes in base64, Standard Webhooks') is
answered once, when it is added, and never listed. Bounded: at most
:data:`MAX_PER_TOKEN` endpoints per token and :data:`MAX_ENDPOINTS` in
all, counted under a claim so that two processes adding at once cannot
both pass the count.

URLs: only ``http`` and ``https``, and none that points at the server
itself (its public URL, or the address the request came in on, or a
loopback name for its port): a webhook the server sends to itself would
let an agent make the server call its own API. Anything else is the
operator's network to guard (docs/security.md).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import Iterable
from typing import TypeVar
from urllib.parse import urlsplit

import msgspec

from protocol.codec import MalformedFrame
from protocol.messages import ErrorCode
from server.errors import CommandError
from server.notify.events import EVENT_TYPES
from server.notify.events import MAX_ESCALATE_AFTER as MAX_AFTER
from server.store.base import ChannelStore

ENDPOINTS = "webhooks"
INVITES = "email-invites"
MAX_ENDPOINTS = 100
MAX_PER_TOKEN = 10
MAX_INVITES = 1000
MAX_URL = 2048
FORMATS = ("standard", "slack")
LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", "::", "[::1]"})
ROTATION_OVERLAP = 24 * 3600.0
"""Seconds a replaced secret still signs, beside the new one."""


class Endpoint(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A webhook target as the store keeps it (lenient: new fields get
    defaults)."""

    id: str
    url: str
    secrets: list[str]
    """The secrets that sign, the newest first (more than one during a
    rotation: each signs, space-separated)."""
    owner: str
    """The id of the token that added it."""
    created: float
    events: list[str] | None = None
    format: str = "standard"
    sessions: list[str] | None = None
    escalate_after: float | None = None
    previous_until: float | None = None
    """Until when the older secrets still sign."""
    disabled: str | None = None
    """Why it no longer gets deliveries (410 Gone, days of failures)."""
    failing_since: float | None = None

    def wants(self, event_type: str, session: str) -> bool:
        if self.disabled is not None:
            return False
        if self.sessions is not None and session not in self.sessions:
            return False
        if event_type == "input.escalated" and self.escalate_after is not None:
            return True
        return self.events is None or event_type in self.events

    def signing(self, now: float) -> list[str]:
        """The secrets that sign now."""
        if self.previous_until is not None and now < self.previous_until:
            return self.secrets
        return self.secrets[:1]

    def listed(self) -> dict[str, object]:
        """As ``GET /api/webhooks`` shows it: without its secrets."""
        shown: dict[str, object] = msgspec.to_builtins(self)
        del shown["secrets"]
        return shown


class Invite(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A person invited by email (``huddle invite --email``)."""

    email: str
    name: str
    role: str = "participant"
    sessions: list[str] | None = None
    expires_at: float

    def wants(self, session: str, now: float) -> bool:
        return now < self.expires_at and (self.sessions is None or session in self.sessions)


_endpoint = msgspec.json.Decoder(Endpoint)
_invite = msgspec.json.Decoder(Invite)


T = TypeVar("T")


def decoded(records: dict[str, bytes], decoder: msgspec.json.Decoder[T]) -> dict[str, T]:
    """The records that decode, by key (one of another version that does
    not is left out, never a failure)."""
    found: dict[str, T] = {}
    for key, raw in records.items():
        try:
            found[key] = decoder.decode(raw)
        except msgspec.DecodeError:
            continue
    return found


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def url_problem(url: object, own: Iterable[str]) -> str | None:
    """Why ``url`` may not be a webhook target, or None; ``own`` are the
    server's own base URLs (its public URL, the one a request came in on)."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        return f"url must be a string of at most {MAX_URL} characters"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "url must be an http:// or https:// URL with a host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "url has a port that is not a number"
    host = parts.hostname.lower()
    for base in own:
        mine = urlsplit(base)
        if not mine.hostname:
            continue
        mine_port = mine.port or (443 if mine.scheme == "https" else 80)
        same_host = host == mine.hostname.lower() or (
            host in LOOPBACK and mine.hostname.lower() in LOOPBACK
        )
        if same_host and port == mine_port:
            return "url points at this server itself"
    return None


class Endpoints:
    """The endpoints and invites in ``store``; see the module docstring."""

    def __init__(self, store: ChannelStore) -> None:
        self.store = store

    async def add(
        self,
        owner: str,
        url: object,
        *,
        own: Iterable[str],
        now: float,
        events: object = None,
        format: object = None,
        sessions: object = None,
        escalate_after: object = None,
    ) -> tuple[Endpoint, str]:
        """Add an endpoint for token ``owner``; returns it and its secret.
        CommandError for a bad argument or beyond the bounds."""
        if (problem := url_problem(url, own)) is not None:
            raise _invalid(problem, "$.url")
        assert isinstance(url, str)
        endpoint = Endpoint(
            id="wh_" + secrets.token_hex(8),
            url=url,
            secrets=[new_secret()],
            owner=owner,
            created=now,
            events=_events(events),
            format=_format(format),
            sessions=session_uris(sessions),
            escalate_after=_seconds(escalate_after),
        )
        lock = "webhooks-adding"
        for _ in range(100):
            if await self.store.claim(lock, endpoint.id, 5.0) is None:
                break
            await asyncio.sleep(0.01)
        else:
            raise _full("endpoints are being added elsewhere: try again")
        try:
            current = await self.all()
            if len(current) >= MAX_ENDPOINTS:
                raise _full(f"the server has {MAX_ENDPOINTS} endpoints: remove one first")
            if sum(1 for e in current if e.owner == owner) >= MAX_PER_TOKEN:
                raise _full(f"a token adds at most {MAX_PER_TOKEN} endpoints")
            await self.store.put_record(ENDPOINTS, endpoint.id, msgspec.json.encode(endpoint))
        finally:
            await self.store.claim(lock, endpoint.id, 0)
        return endpoint, endpoint.secrets[0]

    async def all(self) -> list[Endpoint]:
        found = decoded(await self.store.records(ENDPOINTS), _endpoint)
        return sorted(found.values(), key=lambda e: e.created)

    async def get(self, endpoint_id: str) -> Endpoint | None:
        raw = await self.store.get_record(ENDPOINTS, endpoint_id)
        return None if raw is None else _endpoint.decode(raw)

    async def save(self, endpoint: Endpoint) -> None:
        await self.store.put_record(ENDPOINTS, endpoint.id, msgspec.json.encode(endpoint))

    async def remove(self, endpoint_id: str) -> bool:
        if await self.store.get_record(ENDPOINTS, endpoint_id) is None:
            return False
        await self.store.delete_record(ENDPOINTS, endpoint_id)
        return True

    async def rotate(self, endpoint_id: str, now: float) -> str | None:
        """A new secret for the endpoint (None: no such endpoint); the old
        one signs beside it for ROTATION_OVERLAP."""
        endpoint = await self.get(endpoint_id)
        if endpoint is None:
            return None
        secret = new_secret()
        rotated = msgspec.structs.replace(
            endpoint, secrets=[secret, endpoint.secrets[0]], previous_until=now + ROTATION_OVERLAP
        )
        await self.save(rotated)
        return secret

    # ─── Invites by email ────────────────────────────────────────────────

    async def invite(self, invite: Invite) -> None:
        if "@" not in invite.email or len(invite.email) > 320 or "\n" in invite.email:
            raise _invalid("email must be an address")
        known = await self.store.get_record(INVITES, invite.email) is not None
        if not known and await self.store.count_records(INVITES) >= MAX_INVITES:
            raise _full(f"the server keeps at most {MAX_INVITES} email invites")
        await self.store.put_record(INVITES, invite.email, msgspec.json.encode(invite))

    async def invites(self) -> list[Invite]:
        return list(decoded(await self.store.records(INVITES), _invite).values())


def _invalid(message: str, path: str = "$") -> MalformedFrame:
    """A bad argument (400)."""
    return MalformedFrame(ErrorCode.INVALID_PARAMS, message, path)


def _full(message: str) -> CommandError:
    """Beyond a bound (409)."""
    return CommandError(ErrorCode.INVALID_PARAMS, message)


def _events(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(v in EVENT_TYPES for v in value):
        raise _invalid(f"events must be a list of {', '.join(EVENT_TYPES)}")
    return sorted(set(value))


def _format(value: object) -> str:
    if value is None:
        return "standard"
    if value not in FORMATS:
        raise _invalid("format must be standard or slack")
    return str(value)


def session_uris(value: object) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise _invalid("sessions must be a list of session ids or URIs")
    if len(value) > 100:
        raise _invalid("an endpoint names at most 100 sessions")
    return [v if v.startswith("ahp-session:/") else "ahp-session:/" + v for v in value]


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= MAX_AFTER:
        raise _invalid("escalateAfter must be seconds above 0, at most 7 days")
    return float(value)
