"""Prometheus metrics of one server (a registry of its own, so that many
servers in one test process do not collide)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from protocol.actions import action_type
from server.core.channels import Applied


class Metrics:
    """What the edge reports (no-ops here; :class:`ServerMetrics` counts)."""

    def subscribed(self, delta: int) -> None:
        pass

    def rejected(self, type_: str) -> None:
        pass

    def queue_overflow(self) -> None:
        pass


class ServerMetrics(Metrics):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge(
            "huddle_connections", "Open WebSocket connections", registry=self.registry
        )
        self.subscriptions = Gauge(
            "huddle_subscriptions", "Channel subscriptions", registry=self.registry
        )
        self.accepted = Counter(
            "huddle_actions_accepted", "Actions accepted", ["type"], registry=self.registry
        )
        self.rejections = Counter(
            "huddle_actions_rejected", "Actions rejected", ["type"], registry=self.registry
        )
        self.latency = Histogram(
            "huddle_dispatch_to_broadcast_seconds",
            "From accepting an action to queueing it for every subscriber",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
        )
        self._accepted: dict[str, Any] = {}
        """``accepted``'s child by action type: ``labels()`` takes a lock
        and checks the labels on every call, for each accepted action."""
        self.queue_drops = Counter(
            "huddle_send_queue_drops",
            "Clients closed because their send queue was full",
            registry=self.registry,
        )

    def subscribed(self, delta: int) -> None:
        self.subscriptions.inc(delta)

    def rejected(self, type_: str) -> None:
        self.rejections.labels(type=type_).inc()

    def queue_overflow(self) -> None:
        self.queue_drops.inc()

    def hook(self, event: Applied) -> Awaitable[None] | None:
        """The channel core's hook: count what this process accepted."""
        if event.local:
            type_ = action_type(event.action)
            counter = self._accepted.get(type_)
            if counter is None:
                counter = self._accepted[type_] = self.accepted.labels(type=type_)
            counter.inc()
            self.latency.observe(event.latency)
        return None

    def render(self) -> bytes:
        return generate_latest(self.registry)
