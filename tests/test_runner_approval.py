"""Approval: the policy lets a call run, asks a person first, or denies it.
A call runs only once it is allowed or approved, and then exactly once."""

from __future__ import annotations

import dataclasses

import pytest

from server.runner.agent import (
    ApprovalDecision,
    ApprovalPolicy,
    Tool,
    allow_all,
    require_approval_for,
)
from server.runner.events import EventType, RunnerEvent
from server.runner.runner import ResumeRejected, Runner
from server.runner.turn import ResumeCommand, SuspensionType, ToolCall, Turn, TurnStatus
from server.runner.turn_store import MemoryTurnStore
from tests.runner_kit import Clock, Model, Runs, agent, call, say, scripted, use

ASK_BEFORE_DEPLOYING = require_approval_for("deploy")


def deny_production(turn: Turn, call: ToolCall, tool: Tool) -> ApprovalDecision:
    return ApprovalDecision.deny(code="NO_PROD", message="Nobody deploys to prod from chat")


async def deploying(
    policy: ApprovalPolicy = ASK_BEFORE_DEPLOYING,
) -> tuple[Runner, Runs, Model, Turn]:
    """Turn ``t1``, whose call ``c1`` deploys to prod under ``policy``."""
    runs = Runs()
    model = scripted(use(call("c1", "deploy", env="prod")), say("Done."))
    helper = agent(model, runs.tool("deploy", result="deployed"), approval_policy=policy)
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    turn = await runner.run(helper, "Deploy it", turn_id="t1")
    return runner, runs, model, turn


async def test_a_call_that_needs_approval_suspends_with_the_call_as_correlation_id() -> None:
    _, runs, _, turn = await deploying()
    assert turn.status == TurnStatus.WAITING_FOR_APPROVAL
    assert turn.suspension is not None
    assert turn.suspension.type == SuspensionType.TOOL_APPROVAL
    assert turn.suspension.correlation_id == "c1"
    assert turn.suspension.metadata["code"] == "APPROVAL_REQUIRED"
    assert runs.count("deploy") == 0


async def test_an_approved_call_runs_once() -> None:
    runner, runs, model, _ = await deploying()
    done = await runner.resume("t1", ResumeCommand.approve_tool("c1"))
    assert done.status == TurnStatus.COMPLETED
    assert runs.count("deploy") == 1
    assert model.tool_results() == {"c1": "deployed"}


async def test_a_rejected_call_gets_a_structured_rejection_and_its_body_never_runs() -> None:
    runner, runs, model, _ = await deploying()
    done = await runner.resume("t1", ResumeCommand.reject_tool("c1", "not on a Friday"))
    assert done.status == TurnStatus.COMPLETED
    assert model.tool_results() == {"c1": {"status": "rejected", "reason": "not on a Friday"}}
    assert runs.count("deploy") == 0


async def test_a_denied_call_never_runs_and_the_model_is_told_why() -> None:
    _, runs, model, turn = await deploying(deny_production)
    assert turn.status == TurnStatus.COMPLETED
    assert model.tool_results() == {
        "c1": {
            "status": "denied",
            "code": "NO_PROD",
            "message": "Nobody deploys to prod from chat",
        }
    }
    assert runs.count("deploy") == 0


async def test_a_denied_call_is_reported_to_listeners() -> None:
    runs = Runs()
    model = scripted(use(call("c1", "deploy")), say("Done."))
    helper = agent(model, runs.tool("deploy"), approval_policy=deny_production)
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    seen: list[RunnerEvent] = []
    runner.listeners.append(seen.append)
    await runner.run(helper, "Deploy it", turn_id="t1")
    denied = [event for event in seen if event.type == EventType.TOOL_DENIED]
    assert [event.data for event in denied] == [{"call_id": "c1", "code": "NO_PROD"}]


async def test_edited_arguments_on_approval_are_what_the_tool_receives() -> None:
    runner, runs, _, _ = await deploying()
    command = ResumeCommand.approve_tool("c1", edited_arguments={"env": "staging"})
    await runner.resume("t1", command)
    assert [run.arguments for run in runs.runs] == [{"env": "staging"}]


@pytest.mark.parametrize(
    ("policy", "runs_expected"),
    [
        pytest.param(allow_all, 1, id="allow"),
        pytest.param(ASK_BEFORE_DEPLOYING, 0, id="require-approval"),
        pytest.param(deny_production, 0, id="deny"),
    ],
)
async def test_a_call_runs_at_once_only_when_the_policy_allows_it(
    policy: ApprovalPolicy, runs_expected: int
) -> None:
    _, runs, _, _ = await deploying(policy)
    assert runs.count("deploy") == runs_expected


async def test_nobody_is_asked_to_approve_a_call_beyond_the_tool_call_budget() -> None:
    # The budget was checked after the approval: a person approved a call
    # that then ended the turn without running.
    runs = Runs()
    model = scripted(use(call("c1", "look")), use(call("c2", "deploy", env="prod")), say("-"))
    helper = agent(
        model,
        runs.tool("look", result="fine"),
        runs.tool("deploy", result="deployed"),
        approval_policy=ASK_BEFORE_DEPLOYING,
        max_tool_calls=1,
    )
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())

    turn = await runner.run(helper, "Look, then deploy", turn_id="t1")

    assert turn.status == TurnStatus.BUDGET_EXCEEDED
    assert turn.suspension is None
    assert runs.count("deploy") == 0


async def test_arguments_edited_in_a_resume_made_in_code_are_trusted_as_given() -> None:
    # The host is the one authority for people's edited tool input (it
    # refuses `{"env": "moon"}` in a chat: tests/test_runner_chat_authority.py);
    # a resume made in code by the agent's own process is trusted code, like
    # calling the tool itself: the runner checks its kind and call id only.
    runs = Runs()
    deploy = dataclasses.replace(
        runs.tool("deploy", result="deployed"),
        input_schema={
            "type": "object",
            "properties": {"env": {"enum": ["staging", "prod"]}},
            "required": ["env"],
        },
    )
    model = scripted(use(call("c1", "deploy", env="prod")), say("Done."))
    helper = agent(model, deploy, approval_policy=ASK_BEFORE_DEPLOYING)
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    await runner.run(helper, "Deploy it", turn_id="t1")

    with pytest.raises(ResumeRejected, match="waits on 'c1', not 'c2'"):
        await runner.resume("t1", ResumeCommand.approve_tool("c2", edited_arguments={"env": "x"}))
    done = await runner.resume(
        "t1", ResumeCommand.approve_tool("c1", edited_arguments={"env": "moon"})
    )

    assert done.status == TurnStatus.COMPLETED
    assert [run.arguments for run in runs.runs] == [{"env": "moon"}]
