"""The host's validation rules: a table of accepted actions and a table of
rejected ones, each rejection checked for its stable code and for leaking no
answer value or tool input into its sentence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import pytest

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageRemoved,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallResultConfirmed,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionDefaultChatChanged,
    SessionTitleChanged,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    AnswerState,
    BooleanQuestion,
    BooleanValue,
    ChatState,
    ChatSummary,
    ClientContributor,
    ConfirmationOption,
    InputAnswer,
    InputAnswerValue,
    InputOption,
    InputQuestion,
    InputRequest,
    InputRequestPart,
    InputResponseKind,
    IntegerQuestion,
    MarkdownPart,
    Message,
    MessageOrigin,
    MultiSelectQuestion,
    NumberQuestion,
    NumberValue,
    PendingMessage,
    ResponsePart,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallPendingResultConfirmation,
    ToolCallResult,
    ToolCallRunning,
    ToolCallState,
)
from protocol.messages import ChannelState
from protocol.rejections import Rejection
from protocol.session import SessionState
from reducers.chat import reduce_chat, select_latest_input_part
from reducers.fixtures import AHP_FIXTURE_NOW_MS, run_fixture
from reducers.validation import (
    FormCheck,
    ToolInputCheck,
)
from reducers.validation import (
    answer_problem as _answer_problem,
)
from reducers.validation import (
    client_action_problem as _client_action_problem,
)
from reducers.validation import (
    reject_reason as _reject_reason,
)


def _text(rejection: Rejection | None) -> str | None:
    return None if rejection is None else rejection.reason


def reject_reason(*args: Any, **kwargs: Any) -> str | None:
    return _text(_reject_reason(*args, **kwargs))


def answer_problem(*args: Any, **kwargs: Any) -> str | None:
    return _text(_answer_problem(*args, **kwargs))


def client_action_problem(*args: Any, **kwargs: Any) -> str | None:
    return _text(_client_action_problem(*args, **kwargs))


# ─── Builders ────────────────────────────────────────────────────────────────

MESSAGE = Message(text="hi", origin=MessageOrigin(kind="user"))


def options(*ids: str) -> list[InputOption]:
    return [InputOption(id=i, label=i.title()) for i in ids]


QUESTIONS: list[InputQuestion] = [
    TextQuestion(id="name", message="Name?", required=True, min=2, max=20),
    TextQuestion(id="email", message="E-mail?", format="email"),
    TextQuestion(id="site", message="Site?", format="uri"),
    TextQuestion(id="born", message="Born?", format="date"),
    TextQuestion(id="at", message="When?", format="date-time"),
    TextQuestion(id="colour", message="Colour?", format="color"),
    NumberQuestion(id="ratio", message="Ratio?", min=0, max=1),
    IntegerQuestion(id="age", message="Age?", min=18, max=120),
    BooleanQuestion(id="agree", message="Agree?", required=True),
    SingleSelectQuestion(id="runtime", message="Runtime?", options=options("node", "deno")),
    SingleSelectQuestion(
        id="editor", message="Editor?", options=options("vim", "emacs"), allow_freeform_input=True
    ),
    MultiSelectQuestion(
        id="langs", message="Languages?", options=options("py", "js", "go"), min=1, max=2
    ),
    MultiSelectQuestion(
        id="tags", message="Tags?", options=options("red", "blue"), allow_freeform_input=True, max=3
    ),
]


def request(
    answers: dict[str, InputAnswer] | None = None, request_id: str = "form"
) -> InputRequest:
    return InputRequest(id=request_id, message="Tell us", questions=QUESTIONS, answers=answers)


def input_part(
    answers: dict[str, InputAnswer] | None = None,
    response: InputResponseKind | None = None,
    request_id: str = "form",
) -> InputRequestPart:
    return InputRequestPart(request=request(answers, request_id), response=response)


def chat(*parts: ResponsePart, turn_id: str | None = "turn-1") -> ChatState:
    active = None
    if turn_id is not None:
        active = ActiveTurn(
            id=turn_id,
            started_at="1970-01-01T00:00:01.000Z",
            message=MESSAGE,
            response_parts=list(parts),
        )
    return ChatState(
        resource="ahp-chat:/c",
        title="t",
        status=8,
        modified_at="1970-01-01T00:00:01.000Z",
        turns=[],
        active_turn=active,
    )


IDLE = chat(turn_id=None)
OPEN = chat(input_part())


def submitted(value: InputAnswerValue) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


def draft(value: InputAnswerValue) -> InputAnswer:
    return InputAnswer(state="draft", value=value)


SKIPPED = InputAnswer(state="skipped")
REQUIRED_SUBMITTED = {
    "name": submitted(TextValue(value="Ada Lovelace")),
    "agree": submitted(BooleanValue(value=True)),
}


def changed(
    question_id: str, answer: InputAnswer | None, request_id: str = "form"
) -> ChatInputAnswerChanged:
    return ChatInputAnswerChanged(request_id=request_id, question_id=question_id, answer=answer)


def completed(
    response: InputResponseKind = "accept",
    answers: dict[str, InputAnswer] | None = None,
    request_id: str = "form",
) -> ChatInputCompleted:
    return ChatInputCompleted(request_id=request_id, response=response, answers=answers)


def answered(question_id: str, state: AnswerState, value: InputAnswerValue) -> StateAction:
    """An answer change for ``question_id`` of the open request ``form``."""
    return changed(question_id, InputAnswer(state=state, value=value))


def pending(
    editable: bool | None = None, option_ids: tuple[str, ...] = ("allow", "deny")
) -> ToolCallPart:
    call = ToolCallPendingConfirmation(
        tool_call_id="call-1",
        tool_name="write_file",
        display_name="Write file",
        invocation_message="Write a file",
        tool_input='{"path": "a.txt"}',
        editable=editable,
        options=[
            ConfirmationOption(id=i, label=i, kind="deny" if i == "deny" else "approve")
            for i in option_ids
        ]
        or None,
    )
    return ToolCallPart(tool_call=call)


RUNNING = ToolCallPart(
    tool_call=ToolCallRunning(
        tool_call_id="call-1",
        tool_name="write_file",
        display_name="Write file",
        invocation_message="Writing a file",
        confirmed="user-action",
    )
)
PENDING_RESULT = ToolCallPart(
    tool_call=ToolCallPendingResultConfirmation(
        tool_call_id="call-1",
        tool_name="write_file",
        display_name="Write file",
        invocation_message="Wrote a file",
        confirmed="user-action",
        success=True,
        past_tense_message="Wrote a file",
    )
)


def approve(
    edited: str | None = None, option: str | None = None, turn_id: str = "turn-1"
) -> ChatToolCallConfirmed:
    return ChatToolCallConfirmed(
        turn_id=turn_id,
        tool_call_id="call-1",
        approved=True,
        confirmed="user-action",
        edited_tool_input=edited,
        selected_option_id=option,
    )


DENY = ChatToolCallConfirmed(
    turn_id="turn-1",
    tool_call_id="call-1",
    approved=False,
    reason="denied",
    selected_option_id="deny",
)


def result_confirmed(turn_id: str = "turn-1") -> ChatToolCallResultConfirmed:
    return ChatToolCallResultConfirmed(turn_id=turn_id, tool_call_id="call-1", approved=True)


def turn_started(turn_id: str = "turn-2") -> ChatTurnStarted:
    return ChatTurnStarted(turn_id=turn_id, started_at="1970-01-01T00:00:02.000Z", message=MESSAGE)


def turn_cancelled(turn_id: str = "turn-1") -> ChatTurnCancelled:
    return ChatTurnCancelled(turn_id=turn_id, duration=5)


def refuse_everything(*_: Any) -> str:
    return "field `age`: minimum"


def accept_everything(*_: Any) -> None:
    return None


def text(value: str) -> TextValue:
    return TextValue(value=value)


def number(value: float) -> NumberValue:
    return NumberValue(value=value)


def selected(value: str, freeform: list[str] | None = None) -> SelectedValue:
    return SelectedValue(value=value, freeform_values=freeform)


def selected_many(*values: str, freeform: list[str] | None = None) -> SelectedManyValue:
    return SelectedManyValue(value=list(values), freeform_values=freeform)


class Checks(TypedDict, total=False):
    """The host's checks a case passes to ``reject_reason``."""

    form_check: FormCheck
    tool_input_check: ToolInputCheck


# ─── Accepted ────────────────────────────────────────────────────────────────

ACCEPTED: list[Any] = [
    # turns
    pytest.param(IDLE, turn_started(), {}, id="turn-starts-when-none-is-active"),
    pytest.param(OPEN, turn_cancelled(), {}, id="active-turn-is-cancelled"),
    # tool calls
    pytest.param(chat(pending()), approve(), {}, id="pending-call-is-approved"),
    pytest.param(chat(pending()), DENY, {}, id="pending-call-is-denied-with-an-offered-option"),
    pytest.param(chat(pending()), approve(option="allow"), {}, id="offered-option-is-selected"),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited='{"path": "b.txt"}'),
        {"tool_input_check": accept_everything},
        id="editable-call-gets-edited-input-that-fits-its-schema",
    ),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited='{"path": "b.txt"}'),
        {},
        id="edited-input-is-an-object-and-no-schema-check-is-given",
    ),
    pytest.param(chat(PENDING_RESULT), result_confirmed(), {}, id="result-is-confirmed"),
    # answer changes
    pytest.param(
        OPEN, answered("name", "draft", text("A")), {}, id="draft-is-checked-for-kind-only"
    ),
    pytest.param(
        OPEN, answered("age", "draft", number(3.5)), {}, id="draft-number-may-break-the-bounds"
    ),
    pytest.param(OPEN, changed("name", SKIPPED), {}, id="skipped-answer-needs-no-value"),
    pytest.param(OPEN, changed("name", None), {}, id="answer-is-cleared"),
    pytest.param(OPEN, answered("name", "submitted", text("Ada")), {}, id="text-within-its-length"),
    pytest.param(OPEN, answered("email", "submitted", text("ada@example.org")), {}, id="email"),
    pytest.param(
        OPEN,
        answered("site", "submitted", text("https://example.org/a%20b?q=1#top")),
        {},
        id="absolute-uri",
    ),
    pytest.param(OPEN, answered("born", "submitted", text("2000-02-29")), {}, id="leap-day"),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2024-06-30T23:59:60.5+05:30")),
        {},
        id="date-time-with-leap-second-and-offset",
    ),
    pytest.param(
        OPEN, answered("at", "submitted", text("2024-01-01t00:00:00z")), {}, id="date-time-lower"
    ),
    pytest.param(
        OPEN, answered("colour", "submitted", text("teal-ish")), {}, id="unknown-format-passes"
    ),
    pytest.param(OPEN, answered("ratio", "submitted", number(0.5)), {}, id="number-in-range"),
    pytest.param(
        OPEN, answered("age", "submitted", number(30.0)), {}, id="integer-question-takes-30.0"
    ),
    pytest.param(OPEN, answered("age", "submitted", number(42)), {}, id="integer"),
    pytest.param(OPEN, answered("agree", "submitted", BooleanValue(value=False)), {}, id="boolean"),
    pytest.param(OPEN, answered("runtime", "submitted", selected("deno")), {}, id="offered-option"),
    pytest.param(
        OPEN,
        answered("editor", "submitted", selected("", ["nano"])),
        {},
        id="freeform-single-select-takes-free-text",
    ),
    pytest.param(
        OPEN,
        answered("runtime", "submitted", selected("node", [])),
        {},
        id="empty-freeform-list-carries-nothing",
    ),
    pytest.param(
        OPEN, answered("langs", "submitted", selected_many("py", "go")), {}, id="multi-in-count"
    ),
    pytest.param(
        OPEN,
        answered("tags", "submitted", selected_many("red", "mauve", freeform=["plum"])),
        {},
        id="freeform-multi-select-takes-any-item",
    ),
    # completion
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED)), completed(), {}, id="accept-with-required-submitted"
    ),
    pytest.param(
        OPEN, completed(answers=REQUIRED_SUBMITTED), {}, id="accept-with-required-in-the-overlay"
    ),
    pytest.param(
        chat(input_part({"name": draft(text("Ada"))})),
        completed(
            answers={"name": submitted(text("Ada")), "agree": submitted(BooleanValue(value=True))}
        ),
        {},
        id="overlay-turns-a-draft-into-a-submitted-answer",
    ),
    pytest.param(OPEN, completed("decline"), {}, id="decline-needs-no-answers"),
    pytest.param(OPEN, completed("cancel"), {}, id="cancel-needs-no-answers"),
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED)),
        completed(),
        {"form_check": accept_everything},
        id="accept-whose-answers-fit-the-form",
    ),
    pytest.param(
        chat(
            input_part(response="accept", request_id="old"),
            input_part(REQUIRED_SUBMITTED, request_id="old"),
        ),
        completed(request_id="old"),
        {},
        id="request-re-asked-under-a-resolved-id-is-open",
    ),
    pytest.param(
        chat(InputRequestPart(request=InputRequest(id="visit", url="https://example.org/approve"))),
        completed(request_id="visit"),
        {},
        id="url-request-is-accepted",
    ),
    # no rule
    pytest.param(OPEN, ChatDelta(turn_id="x", part_id="p", content="c"), {}, id="action-no-rule"),
    pytest.param(OPEN, SessionTitleChanged(title="t"), {}, id="action-of-another-family"),
]


@pytest.mark.parametrize(("state", "action", "checks"), ACCEPTED)
def test_host_accepts(state: ChannelState, action: StateAction, checks: Checks) -> None:
    assert reject_reason(state, action, **checks) is None


def test_host_has_no_rule_for_a_session_state() -> None:
    session = SessionState(
        provider="p", title="t", status=1, lifecycle="ready", active_clients=[], chats=[]
    )
    assert reject_reason(session, turn_cancelled()) is None


# ─── Rejected ────────────────────────────────────────────────────────────────

SECRET = "hunter2-secret"

REJECTED: list[Any] = [
    # turns
    pytest.param(
        OPEN, turn_started(), {}, "turn-in-progress", id="turn-starts-while-one-is-active"
    ),
    pytest.param(IDLE, turn_cancelled(), {}, "no-active-turn", id="cancel-without-active-turn"),
    pytest.param(OPEN, turn_cancelled("turn-0"), {}, "no-active-turn", id="cancel-of-another-turn"),
    # tool calls
    pytest.param(IDLE, approve(), {}, "tool-call-not-pending", id="confirm-without-active-turn"),
    pytest.param(
        chat(pending()),
        approve(turn_id="turn-0"),
        {},
        "tool-call-not-pending",
        id="confirm-in-another-turn",
    ),
    pytest.param(
        chat(MarkdownPart(id="m", content="x")),
        approve(),
        {},
        "tool-call-not-pending",
        id="confirm-unknown-call",
    ),
    pytest.param(chat(RUNNING), approve(), {}, "tool-call-not-pending", id="confirm-running-call"),
    pytest.param(
        chat(pending()), approve(option="always"), {}, "unknown-option", id="option-not-offered"
    ),
    pytest.param(
        chat(pending(option_ids=())),
        DENY,
        {},
        "unknown-option",
        id="option-on-a-call-without-options",
    ),
    pytest.param(
        chat(pending()),
        approve(edited='{"path": "hunter2-secret"}'),
        {},
        "not-editable",
        id="edited-input-on-call-not-editable",
    ),
    pytest.param(
        chat(pending(editable=False)),
        approve(edited='{"path": "hunter2-secret"}'),
        {},
        "not-editable",
        id="edited-input-on-call-marked-not-editable",
    ),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited='{"path": hunter2-secret}'),
        {},
        "invalid-tool-input",
        id="edited-input-not-json",
    ),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited="NaN"),
        {},
        "invalid-tool-input",
        id="edited-input-is-javascript-not-json",
    ),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited='["hunter2-secret"]'),
        {},
        "invalid-tool-input",
        id="edited-input-not-an-object",
    ),
    pytest.param(
        chat(pending(editable=True)),
        approve(edited='{"path": "hunter2-secret"}'),
        {"tool_input_check": refuse_everything},
        "invalid-tool-input",
        id="edited-input-refused-by-the-tool-schema",
    ),
    pytest.param(
        chat(pending()), result_confirmed(), {}, "tool-call-not-pending", id="result-not-pending"
    ),
    pytest.param(
        IDLE, result_confirmed(), {}, "tool-call-not-pending", id="result-without-active-turn"
    ),
    # open request
    pytest.param(
        IDLE,
        answered("name", "draft", text(SECRET)),
        {},
        "no-open-input-request",
        id="answer-without-active-turn",
    ),
    pytest.param(
        OPEN,
        changed("name", draft(text(SECRET)), "other"),
        {},
        "no-open-input-request",
        id="answer-to-unknown-request",
    ),
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED, "accept")),
        answered("name", "draft", text(SECRET)),
        {},
        "no-open-input-request",
        id="answer-to-completed-request",
    ),
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED, "accept")),
        completed("accept"),
        {},
        "no-open-input-request",
        id="second-completion-is-rejected",
    ),
    pytest.param(
        chat(input_part(None, "decline")),
        completed("accept", REQUIRED_SUBMITTED),
        {},
        "no-open-input-request",
        id="accept-after-decline-is-rejected",
    ),
    pytest.param(
        IDLE, completed("cancel"), {}, "no-open-input-request", id="completion-without-active-turn"
    ),
    # unknown question
    pytest.param(
        OPEN, answered("shoe", "draft", text(SECRET)), {}, "unknown-question", id="unknown-question"
    ),
    pytest.param(
        OPEN, changed("shoe", None), {}, "unknown-question", id="clearing-unknown-question"
    ),
    pytest.param(
        OPEN,
        completed("accept", {**REQUIRED_SUBMITTED, "shoe": submitted(text(SECRET))}),
        {},
        "unknown-question",
        id="completion-answers-unknown-question",
    ),
    # missing value and kind
    pytest.param(
        OPEN,
        changed("name", InputAnswer(state="draft")),
        {},
        "answer-missing-value",
        id="draft-without-value",
    ),
    pytest.param(
        OPEN,
        completed("accept", {"name": InputAnswer(state="submitted")}),
        {},
        "answer-missing-value",
        id="submitted-without-value-in-completion",
    ),
    pytest.param(
        OPEN,
        answered("name", "draft", number(41)),
        {},
        "answer-kind-mismatch",
        id="number-for-text-draft",
    ),
    pytest.param(
        OPEN,
        answered("age", "submitted", text(SECRET)),
        {},
        "answer-kind-mismatch",
        id="text-for-integer",
    ),
    pytest.param(
        OPEN,
        answered("agree", "submitted", text(SECRET)),
        {},
        "answer-kind-mismatch",
        id="text-for-boolean",
    ),
    pytest.param(
        OPEN,
        answered("runtime", "submitted", selected_many(SECRET)),
        {},
        "answer-kind-mismatch",
        id="selected-many-for-single-select",
    ),
    pytest.param(
        OPEN,
        answered("langs", "draft", selected(SECRET)),
        {},
        "answer-kind-mismatch",
        id="selected-for-multi-select",
    ),
    pytest.param(
        OPEN,
        completed("decline", {"ratio": submitted(BooleanValue(value=True))}),
        {},
        "answer-kind-mismatch",
        id="decline-carrying-a-wrong-kind",
    ),
    # invalid submitted answers
    pytest.param(
        OPEN, answered("name", "submitted", text("Q")), {}, "invalid-answer", id="text-too-short"
    ),
    pytest.param(
        OPEN,
        answered("name", "submitted", text(SECRET * 2)),
        {},
        "invalid-answer",
        id="text-too-long",
    ),
    pytest.param(
        OPEN, answered("email", "submitted", text(SECRET)), {}, "invalid-answer", id="email-no-at"
    ),
    pytest.param(
        OPEN,
        answered("email", "submitted", text("hunter2@secret")),
        {},
        "invalid-answer",
        id="email-undotted-domain",
    ),
    pytest.param(
        OPEN,
        answered("email", "submitted", text("hunter 2@secret.org")),
        {},
        "invalid-answer",
        id="email-with-space",
    ),
    pytest.param(
        OPEN,
        answered("site", "submitted", text("/hunter2/secret")),
        {},
        "invalid-answer",
        id="relative-uri",
    ),
    pytest.param(
        OPEN,
        answered("site", "submitted", text("https://hunter2.org/a b")),
        {},
        "invalid-answer",
        id="uri-with-space",
    ),
    pytest.param(
        OPEN,
        answered("site", "submitted", text("https://hunter2.org/%zz")),
        {},
        "invalid-answer",
        id="uri-with-bad-percent-escape",
    ),
    pytest.param(
        OPEN,
        answered("born", "submitted", text("1900-02-29")),
        {},
        "invalid-answer",
        id="date-not-in-calendar",
    ),
    pytest.param(
        OPEN,
        answered("born", "submitted", text("2023-13-01")),
        {},
        "invalid-answer",
        id="date-month-13",
    ),
    pytest.param(
        OPEN,
        answered("born", "submitted", text("2023-04-31")),
        {},
        "invalid-answer",
        id="date-april-31",
    ),
    pytest.param(
        OPEN,
        answered("born", "submitted", text("20230401")),
        {},
        "invalid-answer",
        id="date-without-dashes",
    ),
    pytest.param(
        OPEN,
        answered("born", "submitted", text("\uff12\uff10\uff12\uff13-04-01")),
        {},
        "invalid-answer",
        id="date-with-non-ascii-digits",
    ),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2024-01-01 12:00:00Z")),
        {},
        "invalid-answer",
        id="date-time-with-space",
    ),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2024-01-01T12:00:00")),
        {},
        "invalid-answer",
        id="date-time-without-offset",
    ),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2023-02-29T12:00:00Z")),
        {},
        "invalid-answer",
        id="date-time-with-bad-date",
    ),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2024-01-01T24:00:00Z")),
        {},
        "invalid-answer",
        id="date-time-hour-24",
    ),
    pytest.param(
        OPEN,
        answered("at", "submitted", text("2024-01-01T12:00:00+05:60")),
        {},
        "invalid-answer",
        id="date-time-offset-minute-60",
    ),
    pytest.param(
        OPEN,
        answered("ratio", "submitted", number(-0.25)),
        {},
        "invalid-answer",
        id="number-below-min",
    ),
    pytest.param(
        OPEN,
        answered("ratio", "submitted", number(1.25)),
        {},
        "invalid-answer",
        id="number-above-max",
    ),
    pytest.param(
        OPEN,
        answered("ratio", "submitted", number(float("nan"))),
        {},
        "invalid-answer",
        id="number-not-finite",
    ),
    pytest.param(
        OPEN, answered("age", "submitted", number(17)), {}, "invalid-answer", id="integer-below-min"
    ),
    pytest.param(
        OPEN,
        answered("age", "submitted", number(121)),
        {},
        "invalid-answer",
        id="integer-above-max",
    ),
    pytest.param(
        OPEN,
        answered("age", "submitted", number(33.5)),
        {},
        "invalid-answer",
        id="integer-with-a-fraction",
    ),
    pytest.param(
        OPEN,
        answered("runtime", "submitted", selected(SECRET)),
        {},
        "invalid-answer",
        id="option-not-offered",
    ),
    pytest.param(
        OPEN,
        answered("runtime", "submitted", selected("node", [SECRET])),
        {},
        "invalid-answer",
        id="freeform-when-not-allowed",
    ),
    pytest.param(
        OPEN,
        answered("langs", "submitted", selected_many("py", SECRET)),
        {},
        "invalid-answer",
        id="multi-option-not-offered",
    ),
    pytest.param(
        OPEN,
        answered("langs", "submitted", selected_many("py", freeform=[SECRET])),
        {},
        "invalid-answer",
        id="multi-freeform-when-not-allowed",
    ),
    pytest.param(
        OPEN,
        answered("langs", "submitted", selected_many()),
        {},
        "invalid-answer",
        id="multi-too-few",
    ),
    pytest.param(
        OPEN,
        answered("langs", "submitted", selected_many("py", "js", "go")),
        {},
        "invalid-answer",
        id="multi-too-many",
    ),
    pytest.param(
        OPEN,
        answered("langs", "submitted", selected_many("py", "py")),
        {},
        "invalid-answer",
        id="multi-same-option-twice",
    ),
    pytest.param(
        OPEN,
        answered("tags", "submitted", selected_many("red", "blue", freeform=[SECRET, "plum"])),
        {},
        "invalid-answer",
        id="multi-count-includes-freeform",
    ),
    pytest.param(
        OPEN,
        completed("accept", {**REQUIRED_SUBMITTED, "age": submitted(number(5))}),
        {},
        "invalid-answer",
        id="completion-carries-an-invalid-answer",
    ),
    # required
    pytest.param(OPEN, completed(), {}, "required-unanswered", id="accept-with-nothing-answered"),
    pytest.param(
        chat(
            input_part({"name": draft(text(SECRET)), "agree": submitted(BooleanValue(value=True))})
        ),
        completed(),
        {},
        "required-unanswered",
        id="draft-does-not-count-on-accept",
    ),
    pytest.param(
        OPEN,
        completed("accept", {"name": SKIPPED, "agree": submitted(BooleanValue(value=True))}),
        {},
        "required-unanswered",
        id="skipped-does-not-count-on-accept",
    ),
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED)),
        completed("accept", {"name": draft(text(SECRET))}),
        {},
        "required-unanswered",
        id="overlay-draft-replaces-a-submitted-answer",
    ),
    # form
    pytest.param(
        chat(input_part(REQUIRED_SUBMITTED)),
        completed(),
        {"form_check": refuse_everything},
        "form-invalid",
        id="accept-refused-by-the-form-schema",
    ),
]


def leaked_values(action: StateAction) -> list[str]:
    """Every answer value and tool input the action carries, as text."""
    values: list[str] = []
    answers: list[InputAnswer] = []
    if isinstance(action, ChatInputAnswerChanged) and action.answer is not None:
        answers.append(action.answer)
    if isinstance(action, ChatInputCompleted):
        answers.extend((action.answers or {}).values())
    for answer in answers:
        value = answer.value
        if isinstance(value, SelectedManyValue):
            values.extend(value.value)
        elif value is not None:
            values.append(str(value.value))
        if isinstance(value, SelectedValue | SelectedManyValue):
            values.extend(value.freeform_values or [])
    if isinstance(action, ChatToolCallConfirmed) and action.edited_tool_input is not None:
        values.append(action.edited_tool_input)
    return [v for v in values if len(v) >= 3 and v not in ("True", "False")]


@pytest.mark.parametrize(("state", "action", "checks", "code"), REJECTED)
def test_host_rejects(state: ChannelState, action: StateAction, checks: Checks, code: str) -> None:
    reason = reject_reason(state, action, **checks)
    assert reason is not None
    assert reason.split(":", 1)[0] == code
    assert "hunter2" not in reason
    for value in leaked_values(action):
        assert value not in reason


def test_rejection_sentence_names_the_request_question_and_rule() -> None:
    action = answered("name", "submitted", text(SECRET * 2))
    assert reject_reason(OPEN, action) == (
        "invalid-answer: the submitted answer to question 'name' of input request 'form' "
        "is longer than 20 characters"
    )


def test_required_unanswered_lists_every_missing_question() -> None:
    assert reject_reason(OPEN, completed()) == (
        "required-unanswered: input request 'form' cannot be accepted: required questions "
        "'name', 'agree' have no submitted answer"
    )


def test_form_check_sees_the_request_and_the_overlaid_answers() -> None:
    seen: list[tuple[InputRequest, dict[str, InputAnswer]]] = []

    def form_check(request: InputRequest, answers: dict[str, InputAnswer]) -> str | None:
        seen.append((request, answers))
        return "field `name`: maxLength"

    synced = {"name": draft(text("Ada")), "ratio": submitted(number(0.5))}
    state = chat(input_part(synced))
    reason = reject_reason(state, completed(answers=REQUIRED_SUBMITTED), form_check=form_check)
    assert reason == (
        "form-invalid: the answers to input request 'form' do not fit its form: "
        "field `name`: maxLength"
    )
    assert seen == [(request(synced), {**synced, **REQUIRED_SUBMITTED})]


def test_tool_input_check_sees_the_call_and_the_parsed_input() -> None:
    seen: list[tuple[ToolCallState, Any]] = []

    def tool_input_check(call: ToolCallPendingConfirmation, tool_input: Any) -> str | None:
        seen.append((call, tool_input))
        return None

    part = pending(editable=True)
    action = approve(edited='{"path": "b.txt", "mode": 420}')
    assert reject_reason(chat(part), action, tool_input_check=tool_input_check) is None
    assert seen == [(part.tool_call, {"path": "b.txt", "mode": 420})]


def test_form_check_is_not_consulted_unless_accepting() -> None:
    assert reject_reason(OPEN, completed("decline"), form_check=refuse_everything) is None


def test_answer_problem_without_a_request_names_the_question() -> None:
    question = IntegerQuestion(id="age", message="Age?", min=18)
    assert answer_problem(question, submitted(number(17))) == (
        "invalid-answer: the submitted answer to question 'age' is below the minimum 18"
    )
    assert answer_problem(question, submitted(number(18.0))) is None


def test_answer_problem_names_the_kinds_of_a_mismatch() -> None:
    question = SingleSelectQuestion(id="pick", message="Pick", options=options("a"))
    assert answer_problem(question, draft(text(SECRET))) == (
        "answer-kind-mismatch: the draft answer to question 'pick' is a 'text' value; "
        "single-select questions take 'selected'"
    )


def test_sentences_count_one_in_the_singular() -> None:
    question = MultiSelectQuestion(id="pick", message="Pick", options=options("a"), min=1)
    assert answer_problem(question, submitted(selected_many())) == (
        "invalid-answer: the submitted answer to question 'pick' has fewer than 1 item"
    )
    state = chat(input_part({"name": submitted(text("Ada"))}))
    assert reject_reason(state, completed()) == (
        "required-unanswered: input request 'form' cannot be accepted: required question "
        "'agree' has no submitted answer"
    )


FIXTURES = sorted((Path(__file__).parent / "fixtures" / "reducers").glob("validate-*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=[path.stem for path in FIXTURES])
def test_validate_fixture_passes(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["validate"] is True
    assert len(data["rejections"]) == len(data["actions"])
    assert None in data["rejections"]
    assert any(code is not None for code in data["rejections"])
    assert run_fixture(path, data, AHP_FIXTURE_NOW_MS).error is None


# ─── AHP's pending-message and default-chat rules ────────────────────────────


def _chat_with_queue() -> ChatState:
    message = Message(text="and escalate it", origin=MessageOrigin(kind="user"))
    return ChatState(
        resource="ahp-chat:/c",
        title="t",
        status=1,
        modified_at="1970-01-01T00:00:00.000Z",
        turns=[],
        steering_message=PendingMessage(id="steer", message=message),
        queued_messages=[PendingMessage(id="next", message=message)],
    )


@pytest.mark.parametrize(
    ("kind", "message_id", "code"),
    [
        pytest.param("steering", "steer", None, id="steering-present"),
        pytest.param("queued", "next", None, id="queued-present"),
        pytest.param("steering", "next", "no-pending-message", id="steering-absent"),
        pytest.param("queued", "steer", "no-pending-message", id="queued-absent"),
    ],
)
def test_removing_a_pending_message_needs_one_to_remove(
    kind: str, message_id: str, code: str | None
) -> None:
    action = ChatPendingMessageRemoved(kind=kind, id=message_id)  # type: ignore[arg-type]
    reason = reject_reason(_chat_with_queue(), action)
    assert (reason.split(":", 1)[0] if reason else None) == code


@pytest.mark.parametrize(
    ("default_chat", "code"),
    [
        pytest.param("ahp-chat:/main", None, id="chat-in-catalog"),
        pytest.param(None, None, id="clearing"),
        pytest.param("ahp-chat:/elsewhere", "unknown-chat", id="chat-not-in-catalog"),
    ],
)
def test_the_default_chat_must_be_in_the_catalog(
    default_chat: str | None, code: str | None
) -> None:
    session = SessionState(
        provider="huddle",
        title="s",
        status=1,
        lifecycle="ready",
        active_clients=[],
        chats=[
            ChatSummary(
                resource="ahp-chat:/main",
                title="Main",
                status=1,
                modified_at="1970-01-01T00:00:00.000Z",
            )
        ],
    )
    reason = reject_reason(session, SessionDefaultChatChanged(default_chat=default_chat))
    assert (reason.split(":", 1)[0] if reason else None) == code


def test_an_upsert_may_not_silently_drop_an_answered_question() -> None:
    asked = InputRequest(
        id="r",
        questions=[
            TextQuestion(id="keep", message="Keep"),
            TextQuestion(id="drop", message="Drop"),
        ],
    )
    draft = InputAnswer(state="draft", value=TextValue(value="typed"))
    state = reduce_chat(chat(), ChatInputRequested(request=asked), 0)
    state = reduce_chat(
        state, ChatInputAnswerChanged(request_id="r", question_id="drop", answer=draft), 0
    )
    narrower = InputRequest(id="r", questions=[TextQuestion(id="keep", message="Keep")])
    reason = reject_reason(state, ChatInputRequested(request=narrower))
    assert reason is not None
    assert reason.startswith("answered-question-dropped:")
    assert "typed" not in reason
    explicit = InputRequest(id="r", questions=narrower.questions, answers={})
    assert reject_reason(state, ChatInputRequested(request=explicit)) is None
    assert reject_reason(state, ChatInputRequested(request=asked)) is None


# ─── Which tool calls a client may complete ──────────────────────────────────


def _chat_with_call(contributor: ClientContributor | None) -> ChatState:
    call = ToolCallRunning(
        tool_call_id="call-1",
        tool_name="open_browser",
        display_name="Open browser",
        invocation_message="Open it",
        confirmed="not-needed",
        contributor=contributor,
    )
    return chat(ToolCallPart(tool_call=call))


@pytest.mark.parametrize(
    ("contributor", "client_id", "allowed"),
    [
        pytest.param(ClientContributor(client_id="laptop"), "laptop", True, id="its-own-call"),
        pytest.param(ClientContributor(client_id="laptop"), "phone", False, id="another-clients"),
        pytest.param(None, "laptop", False, id="the-agents-call"),
    ],
)
def test_a_client_completes_only_the_tool_calls_it_executes(
    contributor: ClientContributor | None, client_id: str, allowed: bool
) -> None:
    result = ToolCallResult(success=True, past_tense_message="Opened")
    actions: list[StateAction] = [
        ChatToolCallComplete(turn_id="turn-1", tool_call_id="call-1", result=result),
        ChatToolCallContentChanged(turn_id="turn-1", tool_call_id="call-1", content=[]),
    ]
    for action in actions:
        problem = client_action_problem(_chat_with_call(contributor), action, client_id)
        assert (problem is None) is allowed
        assert problem is None or problem.startswith("forbidden:")


def test_other_actions_need_no_tool_call_ownership() -> None:
    assert client_action_problem(chat(), ChatDraftChanged(), "laptop") is None


def test_the_latest_input_part_is_found_open_or_resolved_in_any_turn() -> None:
    open_part = InputRequestPart(request=InputRequest(id="form"))
    assert select_latest_input_part(chat(open_part), "form") == open_part
    assert select_latest_input_part(chat(open_part), "other") is None
    done = InputRequestPart(request=InputRequest(id="form"), response="accept")
    finished = reduce_chat(chat(done), ChatTurnComplete(turn_id="turn-1", duration=1), 0)
    assert select_latest_input_part(finished, "form") == done
