"""The demo agent: the support-ticket story, played offline.

Someone asks for a high-priority ticket about login failures. The agent
asks for the ``support_ticket_details`` form (``affectedSystem``,
``impactScope``: ``ONE_USER``, ``PARTIAL_USERS`` or ``ALL_USERS``),
then calls ``create_support_ticket``, which needs a person's approval, and
finally reports the ticket id. A scripted model plays the agent, so the demo
needs no network and behaves the same every time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from server.runner.agent import Agent, FormDefinition, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.model import ModelReply, ScriptedModel, last_tool_result
from server.runner.turn import ModelMessage, ToolCall

IMPACT_SCOPES = ("ONE_USER", "PARTIAL_USERS", "ALL_USERS")

TICKET_FORM = FormDefinition(
    key="support_ticket_details",
    description="Use when the affected system or the impact scope of an outage ticket is missing",
    schema={
        "type": "object",
        "title": "Outage details",
        "properties": {
            "affectedSystem": {"type": "string", "title": "Affected system"},
            "impactScope": {
                "type": "string",
                "title": "Impact scope",
                "oneOf": [
                    {"const": "ONE_USER", "title": "One user"},
                    {"const": "PARTIAL_USERS", "title": "Some users"},
                    {"const": "ALL_USERS", "title": "All users"},
                ],
            },
        },
        "required": ["affectedSystem", "impactScope"],
    },
)
"""The form of the Agents-Flex support-ticket story (its form-input guide):
the affected system and one of the three impact scopes, both required."""

TICKETS: dict[str, dict[str, Any]] = {}
"""Tickets created by this process, by idempotency key: a replayed call
finds its ticket instead of opening a second one."""


def create_support_ticket(arguments: dict[str, Any]) -> dict[str, Any]:
    """Open a ticket (once per tool call, however often the call runs)."""
    key = ToolContext.current().idempotency_key
    existing = TICKETS.get(key)
    if existing is not None:
        return existing
    number = int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) % 9000 + 1000
    ticket = {"ticketId": f"HUD-{number}", "priority": arguments.get("priority", "high")}
    TICKETS[key] = ticket
    return ticket


TICKET_TOOL = Tool(
    name="create_support_ticket",
    description="Open a support ticket in the helpdesk",
    input_schema={
        "type": "object",
        "properties": {
            "priority": {"type": "string", "enum": ["low", "normal", "high"]},
            "summary": {"type": "string", "maxLength": 200},
            "affectedSystem": {"type": "string"},
            "impactScope": {"type": "string", "enum": list(IMPACT_SCOPES)},
        },
        "required": ["priority", "summary", "affectedSystem", "impactScope"],
    },
    function=create_support_ticket,
    display_name="Create support ticket",
)

HELP = (
    "I'm the Huddle demo agent. Ask me to open a support ticket, for example: "
    "*Open a high-priority ticket: users cannot log in.*"
)


def _wants_ticket(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in ("ticket", "log in", "login", "sign in"))


def _summary(messages: Sequence[ModelMessage]) -> str:
    first = next((m.content for m in messages if m.role == "user"), "") or ""
    return first.strip()[:200] or "Login failures"


def script(messages: Sequence[ModelMessage]) -> ModelReply:
    """The demo's model: the next step of the story for this conversation."""
    ticket = last_tool_result(messages, TICKET_TOOL.name)
    if ticket is not None:
        result = json.loads(ticket)
        if "ticketId" in result:
            return ModelReply(
                text=f"Done: ticket **{result['ticketId']}** is open with "
                f"{result.get('priority', 'high')} priority. The support team has it now."
            )
        reason = result.get("reason") or result.get("message") or result.get("status")
        return ModelReply(text=f"The ticket was not created ({reason}). Tell me how to proceed.")
    form = last_tool_result(messages, "request_user_input")
    if form is not None:
        answer = json.loads(form)
        if answer.get("status") != "submitted":
            return ModelReply(
                text="Understood: without those details I won't open a ticket. "
                "Ask again whenever you are ready."
            )
        data = answer.get("data", {})
        return ModelReply(
            text="Thanks. I'll create the ticket now; it needs your approval.",
            tool_calls=[
                ToolCall(
                    id=f"call-ticket-{len(messages)}",
                    name=TICKET_TOOL.name,
                    arguments={
                        "priority": "high",
                        "summary": _summary(messages),
                        "affectedSystem": data.get("affectedSystem", ""),
                        "impactScope": data.get("impactScope", ""),
                    },
                )
            ],
        )
    last_user = next((m.content for m in reversed(messages) if m.role == "user"), "") or ""
    if not _wants_ticket(last_user):
        return ModelReply(text=HELP)
    return ModelReply(
        text="I'll open a high-priority ticket. First I need a few details.",
        tool_calls=[
            ToolCall(
                id=f"call-form-{len(messages)}",
                name="request_user_input",
                arguments={
                    "formKey": TICKET_FORM.key,
                    "message": "Which system fails, and who is affected?",
                },
            )
        ],
    )


agent = Agent(
    name="support-agent",
    instructions="Open support tickets. When details are missing call request_user_input; "
    "never guess them. Creating a ticket needs a person's approval.",
    model=ScriptedModel(script),
    tools=(TICKET_TOOL,),
    forms=(TICKET_FORM,),
    approval_policy=require_approval_for(
        TICKET_TOOL.name, message="Create this support ticket in the helpdesk?"
    ),
)
"""The default agent of ``huddle serve``."""


def openai_agent() -> Agent:
    """The same agent with a real model: ``huddle serve --agent
    server.runner.demo:openai_agent`` with ``HUDDLE_MODEL_BASE_URL``,
    ``HUDDLE_MODEL_API_KEY`` and ``HUDDLE_MODEL_NAME`` set."""
    from server.runner.openai import OpenAIChatModel

    return Agent(
        name=agent.name,
        instructions=agent.instructions,
        model=OpenAIChatModel.from_env(),
        tools=agent.tools,
        forms=agent.forms,
        approval_policy=agent.approval_policy,
    )
