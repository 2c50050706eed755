"""Which code runs a turn: agents by name and version.

A turn records the name and version of the agent it started with, and is
resumed with exactly that version, whichever worker continues it and
however often the agent was redeployed meanwhile (Agents-Flex's agent
loader: never fall back to another version, whose tools and prompts would
not fit the turn's saved state). New turns get the active version.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from server.runner.agent import Agent
from server.runner.errors import AgentVersionGone, UnknownAgent


class AgentLoader(Protocol):
    def load(self, name: str, version: str) -> Agent | None:
        """Exactly version ``version`` of agent ``name``, or None."""

    def load_active(self, name: str) -> Agent | None:
        """The version new turns of agent ``name`` get, or None."""


class AgentCatalog:
    """The agents given, their ``older_versions`` and the agents their tools
    delegate to (transitively), by name and version. The first agent given
    for a name is its active version."""

    def __init__(self, agents: Iterable[Agent]) -> None:
        self._active: dict[str, Agent] = {}
        self._versions: dict[tuple[str, str], Agent] = {}
        waiting = list(agents)
        while waiting:
            agent = waiting.pop(0)
            key = (agent.name, agent.version)
            if key in self._versions:
                continue  # seen already, or another definition of it came first
            self._versions[key] = agent
            self._active.setdefault(agent.name, agent)
            waiting.extend(tool.child for tool in agent.tools if tool.child is not None)
            waiting.extend(agent.older_versions)

    def load(self, name: str, version: str) -> Agent | None:
        return self._versions.get((name, version))

    def load_active(self, name: str) -> Agent | None:
        return self._active.get(name)

    def active(self) -> dict[str, Agent]:
        """The active version of every agent, by name."""
        return dict(self._active)


def load_for_turn(loader: AgentLoader, name: str, version: str) -> Agent:
    """The agent a turn of ``name`` at ``version`` runs. Raises UnknownAgent
    (no such agent) or AgentVersionGone (not that version)."""
    found = loader.load(name, version)
    if found is not None:
        return found
    active = loader.load_active(name)
    if active is None:
        raise UnknownAgent(name)
    raise AgentVersionGone(name, version, active.version)
