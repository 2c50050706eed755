"""Server settings, from ``huddle serve`` flags and ``HUDDLE_*`` variables.

A flag wins over its variable (``--max-subscriptions`` over
``HUDDLE_MAX_SUBSCRIPTIONS``), which wins over the default.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from reducers.limits import SizeLimits


@dataclass(frozen=True)
class Limits:
    """Limits on what clients send (see ``huddle serve --help``)."""

    actions_per_second: float = 50.0
    """Per participant or observer token, over all its connections and HTTP."""
    action_burst: int = 100
    agent_actions_per_second: float = 2000.0
    """Per agent token: agents stream into many chats at once."""
    agent_action_burst: int = 4000
    max_subscriptions: int = 100
    send_buffer: int = 4 << 20
    """Bytes a client may leave unread before it is cut off."""
    flood_close_after: int = 1000
    """Consecutive rate-limited actions after which the client is closed."""
    max_sessions: int = 10_000
    """Sessions the server holds at most (server.core.policy.cap_refusal:
    a participant token creates them only below nine tenths of it)."""

    @property
    def answer_budget(self) -> int:
        """The bytes one answer may take, over the socket or HTTP: half of
        what a client may leave unread, so that an answer never cuts its own
        connection off."""
        return self.send_buffer // 2


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    store: str = "memory"
    """``memory`` (embedded, the default) or ``redis://host:port/db``."""
    token: str | None = None
    """The agent token; generated and printed when not given."""
    origins: tuple[str, ...] = ()
    """Browser origins allowed besides the server's own."""
    agent: str = "server.runner.demo:agent"
    """``module:attribute`` naming the agent (the demo by default), or ``none``."""
    workers: int = 1
    """Worker tasks running the agent's turns in this process."""
    spare_workers: int = 8
    """Workers more, at most, while tools wait for people (an MCP server's
    question put to a chat holds its worker until answered; a spare runs the
    other turns meanwhile)."""
    lease_seconds: float = 30.0
    """How long a worker holds a turn without renewing its lease: after a
    worker dies, another takes its turn over that much later."""
    drain_seconds: float = 10.0
    """At a stop, how long turns running in this process may go on to their
    next stop (blocked or done); then they are handed on, and another worker
    takes them over at once."""
    max_frame_bytes: int = 1 << 20
    max_body_bytes: int = 1 << 20
    """The largest HTTP API body (413 beyond, refused before it is read)."""
    limits: Limits = field(default_factory=Limits)
    sizes: SizeLimits = field(default_factory=SizeLimits)
    """How much one action may put into state (reducers.limits)."""
    metrics_token: str | None = None
    """A token for ``/metrics`` alone (the agent token works too)."""
    allowed_hosts: tuple[str, ...] = ()
    """``Host`` header values accepted (against DNS rebinding); by default
    the loopback names when listening on loopback, any otherwise."""
    replay_window: int = 1000
    """Envelopes the store keeps per channel for ``reconnect``."""
    replay_window_bytes: int = 8 << 20
    """Bytes of envelopes the memory store keeps per channel at most."""
    snapshot_every: int = 100
    """Actions between two stored snapshots of a channel."""
    idle_check_interval: float = 2.0
    """Seconds between two comparisons of the served channels' heads with
    the store's (how late an append whose pub/sub hint was lost arrives)."""
    participant_ttl: float = 7 * 24 * 3600.0
    """Lifetime of the participant token in the printed link (seconds), and
    of minted tokens that ask for none."""
    idempotency_ttl: float = 24 * 3600.0
    """How long a dispatch's answer is kept for retries with its
    ``Idempotency-Key`` (seconds)."""
    idempotency_pool: int = 0
    """Bytes of ``Idempotency-Key`` answers participant and observer tokens
    may keep together; a token keeps at most 1/16 of it, a session's tokens
    1/4 (server.edge.idempotency). 0: half of what the memory store keeps,
    256 MiB on Redis."""
    max_token_ttl: float = 90 * 24 * 3600.0
    """The longest lifetime a minted token may ask for (seconds)."""
    client_claim_ttl: float = 24 * 3600.0
    """How long a token with no expiry (the agent's) keeps a client id after
    its last socket using it closed (seconds); renewed every quarter of it
    while one is open."""
    audit_values: Literal["keep", "redact"] = "keep"
    """Whether the audit keeps answer values and tool input (fields a form
    marks sensitive are redacted either way)."""
    audit_max_records: int = 100_000
    """Records a session's audit holds at most."""
    audit_max_bytes: int = 256 << 20
    """Bytes of records a session's audit holds at most."""
    audit_key: str | None = None
    """A PEM file holding the Ed25519 private key that signs the audit;
    None: one the store keeps, generated once (server.core.audit_key)."""
    expiry_check_interval: float = 1.0
    """Seconds between two sweeps for waits whose expiry passed."""
    mcp_progress_interval: float = 15.0
    """Seconds between two progress notifications to an MCP client waiting
    on a tool of Huddle's MCP server (server.mcp.door); at most 30 keeps
    clients that time out after a quiet minute waiting."""
    retention: float | None = None
    """Seconds a finished session (and a disposed one's audit) is kept;
    None: for ever (server.core.retention)."""
    audit_dir: str | None = None
    """Where a session's audit is exported before retention removes it."""
    open_browser: bool = False
    oidc_issuer: str | None = None
    """The OpenID provider people sign in with (server.edge.signin); None:
    no sign-in, token links only."""
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = None
    oidc_role_claim: str = "groups"
    """The ID token's claim that lists a person's groups."""
    oidc_roles: tuple[str, ...] = ()
    """``role=group`` rules (server.auth.RoleMap), first match wins; none:
    every signed-in person is a participant."""
    auth_proxy_header: str | None = None
    """The header a trusted auth proxy names the person in
    (``X-Forwarded-Email``); None: no proxy is trusted."""
    auth_proxy_trusted: tuple[str, ...] = ()
    """The networks (CIDR) whose requests' proxy header is believed."""
    public_url: str | None = None
    """The address people reach the server at (``https://huddle.example``),
    for the links notifications carry; None: ``http://localhost:<port>``."""
    smtp_url: str | None = None
    """``smtp://[user:password@]host:port`` (or ``smtps://``) to email the
    people invited with ``huddle invite --email``; None: no email."""
    smtp_from: str = "huddle@localhost"
    notify_interval: float = 1.0
    """Seconds between two sweeps of the notifications' outbox."""

    @property
    def base_url(self) -> str:
        """The web client's address (server.notify: the links of events)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "localhost" if self.host in ("127.0.0.1", "0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


ENV_PREFIX = "HUDDLE_"


class _Source:
    def __init__(self, flags: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self.flags, self.env = flags, env

    def raw(self, name: str) -> Any:
        flag = self.flags.get(name)
        if flag is not None and flag != [] and flag != ():
            return flag
        return self.env.get(ENV_PREFIX + name.upper())

    def text(self, name: str, default: str) -> str:
        value = self.raw(name)
        return default if value is None else str(value)

    def integer(self, name: str, default: int) -> int:
        value = self.raw(name)
        return default if value is None else int(value)

    def count(self, name: str, default: int) -> int:
        """:meth:`integer`, refused below 0 (a number of things)."""
        value = self.integer(name, default)
        if value < 0:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is a count: 0 or more, not {value}")
        return value

    def number(self, name: str, default: float) -> float:
        value = self.raw(name)
        return default if value is None else float(value)

    def seconds(self, name: str, default: float) -> float:
        """:meth:`number`, refused below 0 (a time to wait)."""
        value = self.number(name, default)
        if not value >= 0:  # NaN too
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is a number of seconds: 0 or more, not {value}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None:
            return default
        if isinstance(value, bool):
            return value
        return str(value).lower() in ("1", "true", "yes", "on")

    def items(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if value is None:
            return ()
        if isinstance(value, str):
            value = value.split(",")
        return tuple(str(v).strip() for v in value if str(v).strip())


def settings_from(flags: Mapping[str, Any], env: Mapping[str, str]) -> Settings:
    """Settings from parsed flags (None = not given) and the environment."""
    src, base, limits, sizes = _Source(flags, env), Settings(), Limits(), SizeLimits()
    token = src.raw("token")
    return Settings(
        host=src.text("host", base.host),
        port=src.integer("port", base.port),
        store=src.text("store", base.store),
        token=None if token is None else str(token),
        origins=src.items("origins"),
        agent=src.text("agent", base.agent),
        workers=src.count("workers", base.workers),
        spare_workers=src.count("spare_workers", base.spare_workers),
        lease_seconds=src.number("lease_seconds", base.lease_seconds),
        drain_seconds=src.seconds("drain_seconds", base.drain_seconds),
        max_frame_bytes=src.integer("max_frame_bytes", base.max_frame_bytes),
        max_body_bytes=src.integer("max_body_bytes", base.max_body_bytes),
        sizes=SizeLimits(
            title=src.integer("max_title_bytes", sizes.title),
            message=src.integer("max_message_bytes", sizes.message),
            answer=src.integer("max_answer_bytes", sizes.answer),
            tool_data=src.integer("max_tool_data_bytes", sizes.tool_data),
            action=src.integer("max_action_bytes", sizes.action),
            chat_bytes=src.integer("max_chat_bytes", sizes.chat_bytes),
            chats=src.integer("max_chats", sizes.chats),
            notes=src.integer("max_notes_bytes", sizes.notes),
        ),
        metrics_token=None if src.raw("metrics_token") is None else str(src.raw("metrics_token")),
        allowed_hosts=src.items("allowed_hosts"),
        limits=Limits(
            actions_per_second=src.number("actions_per_second", limits.actions_per_second),
            action_burst=src.integer("action_burst", limits.action_burst),
            max_subscriptions=src.integer("max_subscriptions", limits.max_subscriptions),
            send_buffer=src.integer("send_buffer", limits.send_buffer),
            flood_close_after=src.integer("flood_close_after", limits.flood_close_after),
            agent_actions_per_second=src.number(
                "agent_actions_per_second", limits.agent_actions_per_second
            ),
            agent_action_burst=src.integer("agent_action_burst", limits.agent_action_burst),
            max_sessions=src.integer("max_sessions", limits.max_sessions),
        ),
        replay_window=src.integer("replay_window", base.replay_window),
        replay_window_bytes=src.integer("replay_window_bytes", base.replay_window_bytes),
        snapshot_every=src.integer("snapshot_every", base.snapshot_every),
        idle_check_interval=src.number("idle_check_interval", base.idle_check_interval),
        participant_ttl=src.number("participant_ttl", base.participant_ttl),
        max_token_ttl=src.number("max_token_ttl", base.max_token_ttl),
        client_claim_ttl=src.number("client_claim_ttl", base.client_claim_ttl),
        idempotency_ttl=src.number("idempotency_ttl", base.idempotency_ttl),
        idempotency_pool=src.count("idempotency_pool", base.idempotency_pool),
        audit_values=_audit_values(src.text("audit_values", base.audit_values)),
        audit_max_records=src.integer("audit_max_records", base.audit_max_records),
        audit_max_bytes=src.integer("audit_max_bytes", base.audit_max_bytes),
        audit_key=_path(src.raw("audit_key")),
        expiry_check_interval=src.number("expiry_check_interval", base.expiry_check_interval),
        mcp_progress_interval=src.number("mcp_progress_interval", base.mcp_progress_interval),
        retention=_duration(src.raw("retention")),
        audit_dir=src.raw("audit_dir"),
        open_browser=src.flag("open_browser", base.open_browser),
        oidc_issuer=_path(src.raw("oidc_issuer")),
        oidc_client_id=_path(src.raw("oidc_client_id")),
        oidc_client_secret=_path(src.raw("oidc_client_secret")),
        oidc_role_claim=src.text("oidc_role_claim", base.oidc_role_claim),
        oidc_roles=src.items("oidc_roles"),
        auth_proxy_header=_path(src.raw("auth_proxy_header")),
        auth_proxy_trusted=src.items("auth_proxy_trusted"),
        public_url=_path(src.raw("public_url")),
        smtp_url=_path(src.raw("smtp_url")),
        smtp_from=src.text("smtp_from", base.smtp_from),
        notify_interval=src.seconds("notify_interval", base.notify_interval),
    )


def _audit_values(value: str) -> Literal["keep", "redact"]:
    if value not in ("keep", "redact"):
        raise ValueError(f"audit values are keep or redact, not {value!r}")
    return "keep" if value == "keep" else "redact"


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h`` or ``30d`` as seconds; ValueError."""
    match = _DURATION.fullmatch(text.strip().lower())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"a duration is a positive number with s, m, h or d, not {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _path(value: object) -> str | None:
    return None if value is None or value == "" else str(value)


def _duration(value: object) -> float | None:
    return None if value is None or value == "" else parse_duration(str(value))
