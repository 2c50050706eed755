"""What the runner tests share: a clock the test moves, scripted models that
remember what they were given, tools that count their runs, and memory
stores that crash or hold on purpose (real MemoryTurnStore subclasses).

Time never passes by itself here: leases, backoffs and due times move only
when a test calls ``Clock.advance``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from server.runner.agent import Agent, FormDefinition, Tool
from server.runner.context import ToolContext
from server.runner.machine import Started, advance
from server.runner.model import ModelReply, ScriptedModel, TextSink, ToolSpec
from server.runner.turn import ModelMessage, ToolCall, Turn
from server.runner.turn_store import Lease, MemoryTurnStore
from tests.conftest import UNIT

WITHIN = 10 * UNIT
"""How long a test waits for something that must happen (it never should)."""


@dataclass
class Clock:
    """The runner's clock, moved only by the test."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ─── Models ──────────────────────────────────────────────────────────────────


def call(call_id: str, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def say(text: str) -> ModelReply:
    return ModelReply(text=text)


def use(*calls: ToolCall) -> ModelReply:
    return ModelReply(tool_calls=list(calls))


class Model(ScriptedModel):
    """A scripted model that keeps every conversation and tool list it was
    given, so a test can see what the model saw."""

    def __init__(
        self, script: Callable[[Sequence[ModelMessage]], ModelReply], *, failures: int = 0
    ) -> None:
        super().__init__(script, failures=failures)
        self.conversations: list[list[ModelMessage]] = []
        self.tool_lists: list[list[ToolSpec]] = []

    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        self.conversations.append(list(messages))
        self.tool_lists.append(list(tools))
        return await super().complete(messages, tools, on_text)

    def tool_results(self) -> dict[str, Any]:
        """The tool messages of the latest conversation, by call id, decoded
        from JSON where they are JSON."""
        results: dict[str, Any] = {}
        for message in self.conversations[-1]:
            if message.role == "tool" and message.tool_call_id is not None:
                results[message.tool_call_id] = _decoded(message.content or "")
        return results


def scripted(*replies: ModelReply, failures: int = 0) -> Model:
    """A model whose n-th reply is the one for a conversation holding n-1
    assistant messages (the last reply repeats): the same point of a turn
    gets the same reply however often it is asked (replays, retries)."""

    def script(messages: Sequence[ModelMessage]) -> ModelReply:
        step = sum(1 for m in messages if m.role == "assistant")
        return replies[min(step, len(replies) - 1)]

    return Model(script, failures=failures)


def _decoded(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


# ─── Tools ───────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Run:
    """One run of a tool body, as the body saw it."""

    tool: str
    arguments: dict[str, Any]
    idempotency_key: str
    submitted_form_data: dict[str, Any]


@dataclass
class Runs:
    """Every run of the tool bodies a test made with :meth:`tool`."""

    runs: list[Run] = field(default_factory=list)

    def tool(self, name: str, result: Any = "done") -> Tool:
        def function(arguments: dict[str, Any]) -> Any:
            self.record(name, arguments)
            return result

        return Tool(name=name, description=f"The {name} tool", function=function)

    def record(self, name: str, arguments: dict[str, Any]) -> None:
        context = ToolContext.current()
        self.runs.append(
            Run(name, arguments, context.idempotency_key, dict(context.submitted_form_data))
        )

    def count(self, name: str) -> int:
        return sum(1 for run in self.runs if run.tool == name)


def agent(model: Model, *tools: Tool, name: str = "helper", **options: Any) -> Agent:
    """An agent of ``tools`` played by ``model``; ``options`` are Agent's."""
    return Agent(name=name, instructions="Help.", model=model, tools=tools, **options)


# ─── Forms ───────────────────────────────────────────────────────────────────

DETAILS = FormDefinition(
    key="ticket_details",
    description="What is broken and for whom, when it is missing",
    schema={
        "type": "object",
        "properties": {
            "affected_system": {
                "type": "string",
                "title": "Affected system",
                "minLength": 2,
                "maxLength": 20,
            },
            "impact_scope": {"type": "string", "enum": ["one_user", "team", "everyone"]},
        },
        "required": ["affected_system", "impact_scope"],
    },
)

GOOD_DETAILS: dict[str, Any] = {"affected_system": "SSO", "impact_scope": "everyone"}


# ─── Stores ──────────────────────────────────────────────────────────────────


class Crash(BaseException):
    """A process dying in the middle of a save (nothing of it is written). A
    BaseException, as a death is: no handler of the runner's catches it, so
    nothing after it runs (not even the record of a failed attempt)."""


class CrashingStore(MemoryTurnStore):
    """Crashes once, on the first save ``crash_when`` matches."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_when: Callable[[Turn], bool] | None = None

    async def save(self, turn: Turn, *, lease: Lease | None = None) -> Turn:
        if self.crash_when is not None and self.crash_when(turn):
            self.crash_when = None
            raise Crash(turn.id)
        return await super().save(turn, lease=lease)


class RendezvousStore(MemoryTurnStore):
    """Once armed, the next ``parties`` loads wait for each other: that many
    callers all read the same version before any of them can save."""

    def __init__(self) -> None:
        super().__init__()
        self._barrier: asyncio.Barrier | None = None

    def arm(self, parties: int) -> None:
        self._barrier = asyncio.Barrier(parties)

    async def load(self, turn_id: str) -> Turn:
        turn = await super().load(turn_id)
        barrier = self._barrier
        if barrier is not None:
            async with asyncio.timeout(WITHIN):
                await barrier.wait()
            self._barrier = None
        return turn


class RenewalCountingStore(MemoryTurnStore):
    """Counts lease renewals, so a test can wait for the lease keeper."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals = 0
        self._renewed = asyncio.Event()

    async def renew(self, lease: Lease, now: float, lease_seconds: float) -> Lease | None:
        renewed = await super().renew(lease, now, lease_seconds)
        self.renewals += 1
        self._renewed.set()
        return renewed

    async def wait_for_renewals(self, count: int) -> None:
        target = self.renewals + count
        async with asyncio.timeout(WITHIN):
            while self.renewals < target:
                self._renewed.clear()
                await self._renewed.wait()


def started(turn: Turn) -> Turn:
    """``turn`` as a runner takes it up (RUNNING), at the time it was last
    updated (so that nothing but the start changes)."""
    running, _ = advance(turn, Started(at=turn.updated_at))
    return running
