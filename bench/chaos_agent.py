"""The agent of the chaos run (``bench.chaos``), loaded by its ``huddle
serve`` and ``huddle worker`` processes (``HUDDLE_AGENT=bench.chaos_agent:deployer``).

Each turn the model calls ``deploy`` with the target the person named; the
call needs a person's approval (who may edit the target or deny it); the
approved tool first asks the release form (``FormRequired``), then, run
again with the people's answers, records its side effect in the ledger
``$HUDDLE_FAULTS_DIR/ledger``: one JSON line per run of the body, keyed by
the call's idempotency key, with the arguments it ran with and the answers
it was given. The checker reads the ledger from outside: a process killed
mid-run shares no memory with anyone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from server.runner.agent import Agent, FormDefinition, FormRequired, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.model import ModelReply, ScriptedModel
from server.runner.turn import ModelMessage, ToolCall

RELEASE_FORM = FormDefinition(
    key="release_notes",
    description="What goes out and who signs it off",
    schema={
        "type": "object",
        "properties": {
            "notes": {"type": "string", "title": "Release notes", "maxLength": 200},
            "signoff": {"type": "string", "title": "Signed off by", "maxLength": 40},
        },
        "required": ["notes", "signoff"],
    },
)


def ledger_path() -> Path:
    return Path(os.environ["HUDDLE_FAULTS_DIR"]) / "ledger"


def deploy(arguments: dict[str, Any]) -> str:
    """Ask the release form, then record the deploy (once per run of the
    body: the ledger's reader dedups by key, as a real tool's target would)."""
    context = ToolContext.current()
    if not context.submitted_form_data:
        raise FormRequired(RELEASE_FORM)
    line = json.dumps(
        {
            "key": context.idempotency_key,
            "arguments": arguments,
            "form": context.submitted_form_data,
        },
        sort_keys=True,
    )
    # One write of one line to a file opened for appending: whole lines,
    # whichever processes append at once.
    with ledger_path().open("a") as ledger:
        ledger.write(line + "\n")
    return f"deployed {arguments.get('target')}"


def _this_turn(messages: Sequence[ModelMessage]) -> Sequence[ModelMessage]:
    """The messages since the person's last one: a chat's earlier turns are
    in the conversation too."""
    starts = [i for i, m in enumerate(messages) if m.role == "user"]
    return messages[starts[-1] :] if starts else messages


def _deployer(messages: Sequence[ModelMessage]) -> ModelReply:
    turn = _this_turn(messages)
    results = [m for m in turn if m.role == "tool"]
    if not results:
        target = (turn[0].content or "staging") if turn else "staging"
        call = ToolCall(id="c1", name="deploy", arguments={"target": target})
        return ModelReply(text="Deploying.", tool_calls=[call])
    return ModelReply(text=f"Done: {results[-1].content}.")


deployer = Agent(
    name="deployer",
    instructions="Deploy what you are asked to.",
    model=ScriptedModel(_deployer),
    tools=(
        Tool(
            name="deploy",
            description="Deploy a target",
            input_schema={
                "type": "object",
                "properties": {"target": {"type": "string", "maxLength": 60}},
                "required": ["target"],
            },
            function=deploy,
        ),
    ),
    approval_policy=require_approval_for("deploy"),
)
