"""An agent served by a Huddle process: its runner, its chat bridge and its
workers, started and stopped together (by ``huddle serve`` and by
``huddle worker``)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable

from protocol.session import AgentInfo
from server.core.host import Host
from server.core.sessions import CAPABILITIES
from server.runner.agent import Agent
from server.runner.bridge import ChatBridge
from server.runner.metrics import RunnerMetrics
from server.runner.runner import Runner
from server.runner.turn_store import TurnStore
from server.runner.worker import Crew


def load_agent(spec: str) -> Agent | None:
    """The agent ``module:attribute`` names (None for ``none``)."""
    if spec in ("", "none"):
        return None
    module_name, _, attribute = spec.partition(":")
    if not attribute:
        raise ValueError(f"--agent wants module:attribute or none, not {spec!r}")
    found = getattr(importlib.import_module(module_name), attribute)
    if callable(found) and not isinstance(found, Agent):
        found = found()
    if not isinstance(found, Agent):
        raise ValueError(f"{spec} is not an Agent")
    return found


def agent_info(agent: Agent) -> AgentInfo:
    """The agent as the root channel lists it (its name is the provider)."""
    return AgentInfo(
        provider=agent.name,
        display_name=agent.name.replace("-", " ").title(),
        description=agent.instructions.split(".")[0][:200],
        models=[],
        capabilities=CAPABILITIES,
    )


class AgentService:
    """Runs ``agent``'s turns for ``host``: people's chat actions start and
    resume turns (in this process), and ``workers`` tasks execute them, with
    up to ``spare_workers`` more while tools wait for people (a
    :class:`~server.runner.worker.Crew`)."""

    def __init__(
        self,
        host: Host,
        agent: Agent,
        store: TurnStore,
        *,
        workers: int = 1,
        spare_workers: int = 8,
        clock: Callable[[], float] = time.time,
        idle_wait: float = 1.0,
        lease_seconds: float = 30.0,
        drain_seconds: float = 0.0,
    ) -> None:
        self.host = host
        self.store = store
        self.drain_seconds = drain_seconds
        """At :meth:`stop`, how long running turns may go on (Crew.stop)."""
        self.runner = Runner(store, [agent], clock=clock, lease_seconds=lease_seconds)
        self.bridge = ChatBridge(host, agent, self.runner)
        self.crew = Crew(
            self.runner,
            workers,
            spares=spare_workers if workers else 0,
            reconcile=self.bridge.reconcile,
            idle_wait=idle_wait,
        )
        self.metrics = RunnerMetrics(self.crew)
        """The runner's counters (a Prometheus collector)."""
        self.runner.listeners.append(self.metrics)

    async def start(self) -> None:
        self.crew.start()

    async def drain(self) -> None:
        """Stop the workers: those running a turn after up to
        ``drain_seconds`` (Crew.stop). :meth:`stop` does it too, if not
        done before."""
        await self.crew.stop(self.drain_seconds)

    async def stop(self, *, until: float | None = None) -> None:
        """Stop the workers (those running a turn after up to
        ``drain_seconds``: Crew.stop); a resume whose save's answer was lost
        is read back up to ``until`` (``time.monotonic()``; default: no
        waiting)."""
        await self.crew.stop(self.drain_seconds)
        await self.runner.settled(time.monotonic() if until is None else until)
        await self.store.close()
