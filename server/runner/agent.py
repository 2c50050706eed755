"""How an agent is defined: instructions, a chat model, tools, forms, an
approval policy and limits. Definitions live in code, never in a turn: a
turn records the agent's name and version and, for a form it asked, the
schema as it was then.

``FormDefinition``, ``FormRequired`` and ``TransientError`` are at home in
``server.runner.form_definitions`` and ``server.runner.errors``; they are importable
from here, next to what they are used with.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from server.core.expiry import Expiry
from server.runner.errors import FormRequired as FormRequired
from server.runner.errors import TransientError as TransientError
from server.runner.form_definitions import FormDefinition as FormDefinition
from server.runner.model import ChatModel
from server.runner.turn import ToolCall, Turn

ToolFunction: TypeAlias = Callable[[dict[str, Any]], Any | Awaitable[Any]]
"""Takes the call's arguments; returns (or awaits) the result: a string, or
anything JSON-encodable, given to the model as the tool message."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call. ``input_schema`` (JSON Schema) is what
    the model is told; people approving the call may edit the input within
    it. ``child`` makes the tool delegate to another agent: calling it runs a
    child turn in a chat of its own, and the parent waits for it."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    function: ToolFunction | None = None
    display_name: str | None = None
    child: Agent | None = None

    @property
    def title(self) -> str:
        return self.display_name or self.name.replace("_", " ").capitalize()


class Outcome(enum.StrEnum):
    ALLOW = "ALLOW"
    REQUIRE_APPROVAL = "REQUIRE_APPROVAL"
    DENY = "DENY"


@dataclass(frozen=True)
class ApprovalDecision:
    """What the policy says of one tool call. ``code`` is stable for
    programs, ``message`` is shown to the approver, ``reason`` is for the
    audit; ``metadata`` must not carry secrets. ``expiry`` is how long people
    have to decide (default: the agent's ``approval_expiry``): then the
    call is skipped (``cancel``), denied (``decline``) or the turn fails."""

    outcome: Outcome
    code: str | None = None
    message: str | None = None
    reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    expiry: Expiry | None = None

    @classmethod
    def require_approval(
        cls,
        *,
        code: str | None = None,
        message: str | None = None,
        reason: str | None = None,
        expiry: Expiry | None = None,
        **metadata: Any,
    ) -> ApprovalDecision:
        return cls(Outcome.REQUIRE_APPROVAL, code, message, reason, metadata, expiry)

    @classmethod
    def deny(
        cls, *, code: str | None = None, message: str | None = None, reason: str | None = None
    ) -> ApprovalDecision:
        return cls(Outcome.DENY, code, message, reason)


ALLOW = ApprovalDecision(Outcome.ALLOW)

ApprovalPolicy: TypeAlias = Callable[[Turn, ToolCall, Tool], ApprovalDecision]
"""Decides, deterministically and without side effects, whether a call may
run; the default allows everything."""


def allow_all(turn: Turn, call: ToolCall, tool: Tool) -> ApprovalDecision:
    return ALLOW


def require_approval_for(*names: str, message: str | None = None) -> ApprovalPolicy:
    """A policy that asks a person before any of the named tools runs."""

    def policy(turn: Turn, call: ToolCall, tool: Tool) -> ApprovalDecision:
        if tool.name in names:
            return ApprovalDecision.require_approval(
                code="APPROVAL_REQUIRED", message=message or f"Allow {tool.title}?"
            )
        return ALLOW

    return policy


@dataclass(frozen=True)
class Agent:
    """An agent definition. ``forms`` are offered to the model through the
    ``request_user_input`` control tool (keys and descriptions only).

    ``input_expiry`` and ``approval_expiry`` are the defaults for how long
    people have to answer the agent's questions (forms, plain-text
    questions, its MCP servers' elicitations) and to decide on its tool
    calls; None: as long as they like. A form, a ``FormRequired``, a
    ``Suspension.user_input`` or an ``ApprovalDecision`` may give its own.
    """

    name: str
    instructions: str
    model: ChatModel
    tools: tuple[Tool, ...] = ()
    forms: tuple[FormDefinition, ...] = ()
    approval_policy: ApprovalPolicy = allow_all
    version: str = "1"
    max_iterations: int = 20
    max_tool_calls: int = 50
    max_retries: int = 5
    retry_backoff: float = 1.0
    """Seconds before the first retry; doubled at each attempt (or longer
    when the model's API said ``Retry-After``)."""
    older_versions: tuple[Agent, ...] = ()
    """Earlier versions of this agent (same name) that waiting turns may
    still need: a turn always runs the version it started with."""
    input_expiry: Expiry | None = None
    approval_expiry: Expiry | None = None

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def form(self, key: str) -> FormDefinition | None:
        return next((f for f in self.forms if f.key == key), None)
