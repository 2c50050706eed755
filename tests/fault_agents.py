"""Agents for the fault tests, loaded by real ``huddle serve`` and ``huddle
worker`` processes (``--agent tests.fault_agents:NAME``).

They talk to the test through files in ``$HUDDLE_FAULTS_DIR``, since a
worker process that is killed shares no memory with anyone:

- ``runs``: one line per run of a tool body, ``<tool> <idempotency key>``;
- ``release``: a tool body that must wait (``slow_export``) waits until this
  file exists (the test creates it when the right worker may finish);
- ``streamed``: the first model call to find it missing creates it, streams
  half a reply and never finishes (the test kills that worker).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.mcp import McpServerConfig, McpToolSource
from server.runner.agent import Agent, Tool
from server.runner.context import ToolContext
from server.runner.model import ModelReply, ScriptedModel, TextSink, ToolSpec, last_tool_result
from server.runner.turn import ModelMessage, ToolCall

POLL = 0.02
"""Seconds between two looks at the release file (a process of its own:
there is nothing to await across processes)."""


def faults_dir() -> Path:
    return Path(os.environ["HUDDLE_FAULTS_DIR"])


def record_run(tool: str) -> None:
    with (faults_dir() / "runs").open("a") as runs:
        runs.write(f"{tool} {ToolContext.current().idempotency_key}\n")


def runs(directory: Path) -> list[tuple[str, str]]:
    """The tool runs recorded in ``directory``, in order."""
    path = directory / "runs"
    if not path.exists():
        return []
    return [tuple(line.split(" ", 1)) for line in path.read_text().splitlines()]  # type: ignore[misc]


# ─── A tool a worker dies in ─────────────────────────────────────────────────


async def slow_export(arguments: dict[str, Any]) -> str:
    record_run("slow_export")
    release = faults_dir() / "release"
    while not release.exists():  # noqa: ASYNC110 - another process creates it
        await asyncio.sleep(POLL)
    return f"exported {arguments.get('what', 'everything')}"


def _exporter(messages: Sequence[ModelMessage]) -> ModelReply:
    result = last_tool_result(messages, "slow_export")
    if result is None:
        call = ToolCall(id="c1", name="slow_export", arguments={"what": "the ledger"})
        return ModelReply(text="Exporting.", tool_calls=[call])
    return ModelReply(text=f"Done: {result}.")


exporter = Agent(
    name="exporter",
    instructions="Export what you are asked to.",
    model=ScriptedModel(_exporter),
    tools=(Tool(name="slow_export", description="Export, slowly", function=slow_export),),
)


# ─── A model a worker dies in, mid-stream ────────────────────────────────────


class HalfThenWhole(ScriptedModel):
    """The first call anywhere streams half a reply and hangs (its worker is
    killed then); every later call streams the whole reply."""

    def __init__(self) -> None:
        super().__init__(lambda messages: ModelReply(text="The whole answer."))

    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        marker = faults_dir() / "streamed"
        if not marker.exists():
            marker.touch()
            if on_text is not None:
                await on_text("The first half")
            await asyncio.Event().wait()  # hangs until the process is killed
        return await super().complete(messages, tools, on_text)


talker = Agent(name="talker", instructions="Answer.", model=HalfThenWhole())


# ─── An MCP tool a worker dies in, while its server asks the people ─────────


def _booker(messages: Sequence[ModelMessage]) -> ModelReply:
    result = last_tool_result(messages, "book_table")
    if result is None:
        call = ToolCall(id="c1", name="book_table", arguments={"restaurant": "Chez Huddle"})
        return ModelReply(tool_calls=[call])
    return ModelReply(text=f"All set. {result}")


def booker() -> Agent:
    """The concierge of the MCP tests, its bookings server over stdio."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = McpServerConfig.stdio(
        "bookings", sys.executable, "-m", "tests.mcp_kit", "bookings", cwd=root
    )
    source = McpToolSource(config)
    return Agent(
        name="booker",
        instructions="Book tables.",
        model=ScriptedModel(_booker),
        tools=source.list_tools_sync(),
    )
