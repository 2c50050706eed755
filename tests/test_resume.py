"""What a chat's state says resumes a waiting turn (server.runner.resume):
an approval resumes only from a settled confirmation, never from a call
that is still being shown or waiting for people."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.chat import (
    ActiveTurn,
    ChatState,
    McpAuthRequirement,
    ToolCallAuthRequired,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallPendingResultConfirmation,
    ToolCallRunning,
    ToolCallState,
    ToolCallStreaming,
)
from protocol.wire import Markdown
from server.runner.resume import EXPIRED_APPROVAL, resume_for
from server.runner.turn import ResumeCommand, Suspension, SuspensionType, Turn, TurnStatus
from tests.conftest import user_message

CALL = "c1"
INPUT = '{"env": "prod"}'
COMMON: dict[str, Any] = {"tool_call_id": CALL, "tool_name": "deploy", "display_name": "Deploy"}
DONE: dict[str, Any] = {"invocation_message": "Deploy", "tool_input": INPUT}
RESULT: dict[str, Any] = {"success": True, "past_tense_message": "Deployed"}


def waiting_turn() -> Turn:
    suspension = Suspension(type=SuspensionType.TOOL_APPROVAL, correlation_id=CALL)
    return Turn(
        id="run-1",
        agent="deployer",
        chat="ahp-chat:/x",
        chat_turn="t1",
        status=TurnStatus.WAITING_FOR_APPROVAL,
        suspension=suspension,
    )


def chat_with(call: ToolCallState | None) -> ChatState:
    parts: list[Any] = [] if call is None else [ToolCallPart(tool_call=call)]
    active = ActiveTurn(
        id="t1",
        started_at="2027-01-10T10:00:00.000Z",
        message=user_message("Deploy"),
        response_parts=parts,
    )
    return ChatState(
        resource="ahp-chat:/x",
        title="x",
        status=0,
        modified_at="2027-01-10T10:00:00.000Z",
        turns=[],
        active_turn=active,
    )


def decided(kind: str, confirmed: Any) -> ToolCallState:
    """The call people (or a setting, or nobody) let run, in state ``kind``."""
    match kind:
        case "running":
            return ToolCallRunning(**COMMON, **DONE, confirmed=confirmed)
        case "auth-required":
            auth = McpAuthRequirement(
                reason="required", resource={"resource": "https://a.example/"}
            )
            return ToolCallAuthRequired(**COMMON, **DONE, confirmed=confirmed, auth=auth)
        case "pending-result-confirmation":
            return ToolCallPendingResultConfirmation(
                **COMMON, **DONE, **RESULT, confirmed=confirmed
            )
        case _:
            return ToolCallCompleted(**COMMON, **DONE, **RESULT, confirmed=confirmed)


UNDECIDED: list[ToolCallState | None] = [
    None,
    ToolCallStreaming(**COMMON),
    ToolCallStreaming(**COMMON, partial_input='{"env"'),
    ToolCallPendingConfirmation(**COMMON, invocation_message="Deploy?", tool_input=INPUT),
]
DECIDED_STATES = ["running", "auth-required", "pending-result-confirmation", "completed"]


@pytest.mark.parametrize("call", UNDECIDED, ids=["absent", "streaming", "partial", "pending"])
@pytest.mark.parametrize("expired", [False, True], ids=["live", "expired"])
def test_an_undecided_call_resumes_nothing(call: ToolCallState | None, expired: bool) -> None:
    assert resume_for(waiting_turn(), chat_with(call), expired=expired) is None


@pytest.mark.parametrize("kind", DECIDED_STATES)
def test_a_call_readied_as_not_needed_is_nobodys_approval(kind: str) -> None:
    assert resume_for(waiting_turn(), chat_with(decided(kind, "not-needed"))) is None


@pytest.mark.parametrize("confirmed", ["user-action", "setting"])
@pytest.mark.parametrize("kind", DECIDED_STATES)
def test_a_confirmed_call_approves_with_its_input(kind: str, confirmed: str) -> None:
    command = resume_for(waiting_turn(), chat_with(decided(kind, confirmed)))
    assert command == ResumeCommand.approve_tool(CALL, edited_arguments={"env": "prod"})


@pytest.mark.parametrize("reason", ["denied", "skipped", "result-denied"])
def test_a_cancelled_call_denies(reason: Any) -> None:
    cancelled = ToolCallCancelled(**COMMON, **DONE, reason=reason)
    assert resume_for(waiting_turn(), chat_with(cancelled)) == ResumeCommand.reject_tool(
        CALL, reason
    )
    expired = resume_for(waiting_turn(), chat_with(cancelled), expired=True)
    skipped = reason == "skipped"
    assert expired == ResumeCommand.reject_tool(CALL, EXPIRED_APPROVAL, skipped=skipped)


@pytest.mark.parametrize(
    "message", ["Not in prod on a Friday", Markdown(markdown="Not in **prod**")]
)
def test_a_denial_gives_the_persons_reason(message: Any) -> None:
    cancelled = ToolCallCancelled(**COMMON, **DONE, reason="denied", reason_message=message)
    text = message.markdown if isinstance(message, Markdown) else message
    command = resume_for(waiting_turn(), chat_with(cancelled))
    assert command == ResumeCommand.reject_tool(CALL, text)


def test_another_calls_decision_resumes_nothing() -> None:
    other = ToolCallRunning(**{**COMMON, "tool_call_id": "c2"}, **DONE, confirmed="user-action")
    assert resume_for(waiting_turn(), chat_with(other)) is None


def test_a_turn_not_waiting_for_people_resumes_from_nothing() -> None:
    turn = msgspec.structs.replace(waiting_turn(), suspension=None, status=TurnStatus.RUNNING)
    approved = decided("running", "user-action")
    assert resume_for(turn, chat_with(approved)) is None


CONFIRMATIONS = st.sampled_from(["not-needed", "user-action", "setting"])
CALL_STATES = st.one_of(
    st.sampled_from(UNDECIDED),
    st.builds(decided, st.sampled_from(DECIDED_STATES), CONFIRMATIONS),
    st.builds(
        lambda reason: ToolCallCancelled(**COMMON, **DONE, reason=reason),
        st.sampled_from(["denied", "skipped", "result-denied"]),
    ),
)


@given(call=CALL_STATES, expired=st.booleans())
def test_an_approval_is_resumed_only_by_a_settled_decision(
    call: ToolCallState | None, expired: bool
) -> None:
    command = resume_for(waiting_turn(), chat_with(call), expired=expired)
    settled_by_someone = isinstance(call, ToolCallCancelled) or (
        call is not None
        and not isinstance(call, ToolCallStreaming | ToolCallPendingConfirmation)
        and getattr(call, "confirmed", None) in ("user-action", "setting")
    )
    assert (command is not None) == settled_by_someone
    if command is not None:
        assert command.type == SuspensionType.TOOL_APPROVAL
        assert command.correlation_id == CALL
        assert command.approved == (not isinstance(call, ToolCallCancelled))
