"""Approval of tool calls: what the agent's policy says of a call, how a call
that needs a person waits for one, and what their answer does to it.

- ALLOW: the call runs. The policy is asked once for a call: not again for
  one a person approved, nor for one that runs again with the form data it
  asked for (:func:`decide`).
- DENY: the call never runs; the model is told the decision's code and
  message (:func:`denied_result`).
- REQUIRE_APPROVAL: the turn waits (TOOL_APPROVAL, correlated by the call
  id; :func:`approval_suspension`), and the chat shows the AHP tool call
  ``pending-confirmation`` with approve and deny options. A decision with no
  expiry of its own gets the agent's ``approval_expiry``.
- The answer (:func:`answered`): approved, the call runs, with the arguments
  as the approver may have edited them (whether edited input fits the
  tool's input schema is the host's word on ``editedToolInput``, given
  before the answer reached the turn; a resume made in code is trusted
  code); denied, or skipped (its approval expired with ``cancel``; with
  ``decline`` it is denied), its body never runs and the model gets a
  structured rejection. An approval that expires
  with ``fail`` fails the turn, as any wait's failure does (the runner
  applies ``ResumeCommand.fail``).

Pure rules: the runner saves the wait, tells the listeners and shows it in
the chat.
"""

from __future__ import annotations

import dataclasses

import msgspec

from server.runner.agent import ALLOW, Agent, ApprovalDecision, Outcome, Tool
from server.runner.turn import (
    PendingCall,
    Phase,
    ResumeCommand,
    Suspension,
    SuspensionType,
    ToolCall,
    Turn,
    result_text,
)


def decide(agent: Agent, turn: Turn, pending: PendingCall, tool: Tool) -> ApprovalDecision:
    """The policy's word on ``pending`` (ALLOW when it was decided before),
    with the agent's ``approval_expiry`` when an approval it requires has no
    expiry of its own."""
    if pending.approved or pending.form_data is not None:
        return ALLOW
    decision = agent.approval_policy(turn, pending.call, tool)
    asks = decision.outcome == Outcome.REQUIRE_APPROVAL
    if asks and decision.expiry is None and agent.approval_expiry is not None:
        decision = dataclasses.replace(decision, expiry=agent.approval_expiry)
    return decision


def approval_suspension(call: ToolCall, tool: Tool, decision: ApprovalDecision) -> Suspension:
    """What a turn waits on while ``call`` waits for a person's approval."""
    return Suspension(
        type=SuspensionType.TOOL_APPROVAL,
        correlation_id=call.id,
        message=decision.message or f"Allow {tool.title}?",
        resume_phase=Phase.TOOLS,
        metadata={"code": decision.code, "reason": decision.reason, **decision.metadata},
        expiry=decision.expiry,
    )


def denied_result(decision: ApprovalDecision) -> str:
    """The tool message the model gets for a call the policy denied."""
    return result_text({"status": "denied", "code": decision.code, "message": decision.message})


def answered(pending: PendingCall, command: ResumeCommand) -> PendingCall:
    """``pending`` as a person's answer (a TOOL_APPROVAL resume) leaves it:
    approved, to run with the arguments as they may have been edited; else
    finished with a rejection (``skipped`` when it was skipped)."""
    if command.approved:
        call = pending.call
        if command.edited_arguments is not None:
            call = msgspec.structs.replace(call, arguments=command.edited_arguments)
        return msgspec.structs.replace(pending, call=call, approved=True)
    status = "skipped" if command.skipped else "rejected"
    return pending.with_result({"status": status, "reason": command.reason or "denied by a person"})
