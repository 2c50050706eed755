"""Chat models: what the runner asks and what it gets back.

A model is given the conversation and the tools it may call, streams text
through ``on_text`` as it goes, and returns the whole reply. Transient
failures (rate limits, timeouts, 5xx) raise :class:`TransientError` so the
turn is retried later instead of failing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from server.runner.errors import TransientError
from server.runner.turn import ModelMessage, ToolCall

TextSink = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model sees it: name, description, JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ModelReply:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChatModel(Protocol):
    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply: ...


Script = Callable[[Sequence[ModelMessage]], ModelReply]


class ScriptedModel:
    """A model that replies by a function of the conversation: for tests and
    the offline demo. Text is streamed in ``chunk``-sized pieces.

    ``failures`` makes the next N calls raise TransientError (retry tests).
    """

    def __init__(self, script: Script, *, chunk: int = 12, failures: int = 0) -> None:
        self.script = script
        self.chunk = chunk
        self.failures = failures
        self.calls = 0

    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise TransientError("the scripted model is busy (a scripted failure)")
        reply = self.script(messages)
        if on_text is not None:
            for start in range(0, len(reply.text), self.chunk):
                await on_text(reply.text[start : start + self.chunk])
        return reply


def last_tool_result(messages: Sequence[ModelMessage], name: str) -> str | None:
    """The content of the latest tool message answering a call to ``name``."""
    calls = {
        c.id: c.name
        for m in messages
        if m.role == "assistant" and m.tool_calls
        for c in m.tool_calls
    }
    for message in reversed(messages):
        if message.role == "tool" and calls.get(message.tool_call_id or "") == name:
            return message.content
    return None
