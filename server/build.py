"""One place that builds a server's parts from its settings.

``huddle serve`` (through :func:`server.edge.app.create_app`) and ``huddle
worker`` both call :func:`build`: the channel store ``--store`` names, the
host over it, and, with an agent, the turn store beside it and the service
that runs the agent's turns. Tests pass stores of their own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from protocol.session import AgentInfo
from server.auth import Grant, Role, TokenAuthority
from server.client import HuddleClient
from server.config import Settings
from server.core.audit import AuditTrail
from server.core.host import STOP_PATIENCE, Host
from server.core.retention import Retention
from server.core.sessions import CAPABILITIES
from server.mcp.door import Askers, McpDoor
from server.notify.endpoints import Invite
from server.notify.outbox import Notifier
from server.notify.sending import Smtp
from server.runner.agent import Agent
from server.runner.events import EventType, RunnerEvent
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.service import AgentService, agent_info
from server.runner.turn_store import MemoryTurnStore, TurnStore
from server.store import REDIS_SCHEMES, open_channel_store
from server.store.base import ChannelStore


@dataclass
class Parts:
    """What one server process runs: the stores, the host, the agent."""

    settings: Settings
    store: ChannelStore
    host: Host
    service: AgentService | None
    clock: Callable[[], float]
    notifier: Notifier
    retention: Retention | None = None

    async def start(self) -> None:
        await self.host.start()
        self.notifier.start()
        if self.service is not None:
            await self.service.start()
        if self.retention is not None:
            self.retention.start()

    async def stop(self) -> None:
        """Stop, in the order that lets what was begun finish: the turns
        running here (for up to ``drain_seconds``: AgentService.drain), then,
        for up to STOP_PATIENCE in all while the store refuses, the actions'
        follow-ups while the runner still takes resumes, then the runner's
        own, then the audit's records."""
        if self.service is not None:
            await self.service.drain()
        until = time.monotonic() + STOP_PATIENCE
        if self.retention is not None:
            await self.retention.stop()
        await self.host.quiesce(until)
        if self.service is not None:
            await self.service.stop(until=until)
        await self.notifier.stop()
        await self.host.stop(until=until)
        await self.store.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Parts]:
        await self.start()
        try:
            yield self
        finally:
            await self.stop()


def default_agents() -> list[AgentInfo]:
    """The root channel's agents when the server runs none of its own."""
    return [
        AgentInfo(
            provider="huddle",
            display_name="Huddle",
            description="Agents that ask people for input through Huddle",
            models=[],
            capabilities=CAPABILITIES,
        )
    ]


def open_store(settings: Settings) -> ChannelStore:
    """The store ``--store`` names: every URL :func:`server.store.open_channel_store`
    takes (``memory``, one Redis, a Redis Cluster); ValueError otherwise."""
    return open_channel_store(
        settings.store,
        retention=settings.replay_window,
        retention_bytes=settings.replay_window_bytes,
    )


def open_turn_store(settings: Settings) -> TurnStore:
    """The turn store that goes with ``--store``."""
    return turn_store_at(settings.store)


def turn_store_at(url: str) -> TurnStore:
    """The turn store that goes with the channel store of ``url``
    (:func:`server.store.open_channel_store`); ValueError for anything else."""
    if url == "memory":
        return MemoryTurnStore()
    if url.startswith(REDIS_SCHEMES):
        return RedisTurnStore(url)
    raise ValueError(f"unknown store {url!r} (use memory, redis://... or redis+cluster://...)")


def build(
    settings: Settings,
    *,
    agent: Agent | None = None,
    store: ChannelStore | None = None,
    turn_store: TurnStore | None = None,
    workers: int | None = None,
    clock: Callable[[], float] = time.time,
    authority: TokenAuthority | None = None,
) -> Parts:
    """The parts of a server for ``settings``: ``store`` (else the one
    ``settings.store`` names), a host over it, and with ``agent`` its
    service running ``workers`` (else ``settings.workers``) worker tasks on
    ``turn_store`` (else the one that goes with the store); the
    notifications' outbox, whose emails sign people in with tokens
    ``authority`` mints (None: the one of ``settings.token``, if any)."""
    store = store if store is not None else open_store(settings)
    host = Host(
        store,
        agents=[agent_info(agent)] if agent else default_agents(),
        clock=clock,
        snapshot_every=settings.snapshot_every,
        idle_check_interval=settings.idle_check_interval,
        sizes=settings.sizes,
        audit_values=settings.audit_values,
        audit_max_records=settings.audit_max_records,
        audit_max_bytes=settings.audit_max_bytes,
        audit_key=settings.audit_key,
        expiry_check_interval=settings.expiry_check_interval,
    )
    service = None
    if agent is not None:
        service = AgentService(
            host,
            agent,
            turn_store if turn_store is not None else open_turn_store(settings),
            workers=settings.workers if workers is None else workers,
            spare_workers=settings.spare_workers,
            clock=clock,
            lease_seconds=settings.lease_seconds,
            drain_seconds=settings.drain_seconds,
        )
        service.runner.listeners.append(audited_resumes(host.audit))
    retention = None
    if settings.retention is not None:
        retention = Retention(host, settings.retention, audit_dir=settings.audit_dir)
    return Parts(
        settings=settings,
        store=store,
        host=host,
        service=service,
        clock=clock,
        notifier=notifier(settings, host, authority, clock),
        retention=retention,
    )


def mcp_door(parts: Parts, connect: Callable[[Grant], Awaitable[HuddleClient]]) -> McpDoor:
    """Huddle's MCP server (server.mcp.door) for ``parts``: it speaks for
    each token through the connection ``connect`` opens for its grant."""
    return McpDoor(
        Askers(connect),
        parts.host.forms,
        progress_every=parts.settings.mcp_progress_interval,
        max_body_bytes=parts.settings.max_body_bytes,
    )


def notifier(
    settings: Settings, host: Host, authority: TokenAuthority | None, clock: Callable[[], float]
) -> Notifier:
    """The outbox (server.notify.outbox), attached to ``host``."""
    if authority is None and settings.token:
        authority = TokenAuthority(settings.token)
    mint: Callable[[Invite], str] | None = None
    if authority is not None:
        signer = authority

        def mint(invite: Invite) -> str:
            role: Role = "observer" if invite.role == "observer" else "participant"
            return signer.mint(
                role, sessions=invite.sessions, name=invite.name, expires_at=invite.expires_at
            )

    smtp = Smtp.of(settings.smtp_url, settings.smtp_from) if settings.smtp_url else None
    made = Notifier(
        host,
        base_url=settings.base_url,
        smtp=smtp,
        mint=mint,
        clock=clock,
        interval=settings.notify_interval,
    )
    made.attach()
    return made


def audited_resumes(audit: AuditTrail) -> Callable[[RunnerEvent], None]:
    """A runner listener that records each resume the runner took in the
    audit of the chat its turn shows."""

    def listen(event: RunnerEvent) -> None:
        chat = event.data.get("chat")
        if event.type == EventType.TURN_RESUMED and isinstance(chat, str):
            audit.runner_resumed(chat, event.turn_id, event.data.get("resume"))

    return listen
