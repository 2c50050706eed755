"""The host's validation rules: which well-formed actions it rejects, and why.

``reject_reason(state, action)`` is ``None`` when the host may reduce
``action`` on ``state``; otherwise it is the ``rejectionReason`` to echo to
the sender, and the host leaves the state untouched and keeps the connection.
Like the reducers it is pure: no clock, no I/O, no jsonschema. What needs more
than the state (a request's frozen JSON Schema, a tool's input schema) comes
in as a check the host supplies (:data:`FormCheck`, :data:`ToolInputCheck`).

A reason reads ``"<code>: <sentence>"``. The code is stable: clients and
fixtures match on it. The sentence names the turn, tool call, input request
or question and the rule it breaks, and never an answer value or a tool
input, because form data can be sensitive ("is longer than 20 characters",
never the text).

Rules, per action, checked top to bottom; the first broken rule wins::

    action                        code                   rejected when
    ----------------------------  ---------------------  --------------------------------------
    chat/turnStarted              turn-in-progress       a turn is active
                                  turn-id-reused         a completed turn has `turnId`
    chat/turnCancelled            no-active-turn         no turn is active, or another one is
    chat/toolCallConfirmed        tool-call-not-pending  the active turn `turnId` has no such
                                                         call in pending-confirmation
                                  unknown-option         `selectedOptionId` is not one of the
                                                         call's `options`
                                  not-editable           `editedToolInput` on a call whose
                                                         `editable` is not true
                                  invalid-tool-input     `editedToolInput` nests deeper than 64
                                                         levels, is not a JSON object, or the
                                                         ToolInputCheck refuses it
    chat/toolCallResultConfirmed  tool-call-not-pending  ... in pending-result-confirmation
    chat/toolCallReady            invalid-options        an offered option's `id` is empty, or
                                                         two options share one
    chat/responsePart             invalid-options        as above, for the `options` of a tool
                                                         call part in pending-confirmation
    chat/inputAnswerChanged       no-open-input-request  the active turn has no unresolved
                                                         input request `requestId`
                                  unknown-question       `questionId` is not a question of it
                                  (answer rules)         the answer breaks one (below)
    chat/inputCompleted           no-open-input-request  as above: the first completion wins,
                                                         every later one is rejected
                                  unknown-question       a key of `answers` is not a question
                                  (answer rules)         an answer in `answers` breaks one
                                  required-unanswered    accept, and a required question has
                                                         no submitted answer once `answers`
                                                         overlay the synced ones
                                  form-invalid           accept, and the FormCheck refuses the
                                                         overlaid answers
    chat/inputRequested           answered-question-dropped  it replaces an open request
                                                         with the same id, carries no
                                                         `answers`, and leaves out a
                                                         question that has an answer (the
                                                         reducer would keep that answer)
    chat/pendingMessageRemoved    no-pending-message     no pending message of that `kind` has
                                                         that `id` (AHP: SHOULD reject)
    chat/workingDirectorySet      unknown-directory      `directory` is not one of the owning
                                                         session's `workingDirectories` (AHP:
                                                         MUST reject); a chat of no known
                                                         session has none to choose from
    session/defaultChatChanged    unknown-chat           `defaultChat` is not in the session's
                                                         chat catalog (AHP: MUST reject)
    any other action, or an action of another channel's family: no rule, accepted

Answer rules (:func:`answer_problem`), one answer to one question::

    answer-missing-value   a draft or submitted answer without a value
    answer-kind-mismatch   the value's kind does not fit the question: text -> text,
                           number/integer -> number, boolean -> boolean,
                           single-select -> selected, multi-select -> selected-many
    invalid-answer         a submitted answer that breaks the question:
                           text      length outside min/max (in code points), or not of
                                     its `format`: email, uri (RFC 3986, absolute),
                                     date (YYYY-MM-DD), date-time (RFC 3339); other
                                     formats are hints and pass
                           number    not finite, below min, above max; integer
                                     questions also need a whole number (3.0 is one)
                           single    `freeformValues` without allowFreeformInput; an
                                     option id not in `options` unless freeform is allowed
                           multi     as single, per id; an id twice; selected + freeform
                                     item count outside min/max

Drafts are checked for kind only (a half-typed draft is normal) and skipped
answers need no value. Decisions where AHP is silent: only submitted answers
count on accept; answers carried by a decline or cancel are checked too,
because the reducer records them; an empty ``freeformValues`` list carries
nothing and is not "given"; ``editedToolInput`` is checked on a denial as on
an approval (a client that sends it is confused either way). AHP calls an
option's id its unique identifier and says no more; the reducers (as AHP's
TypeScript reducer) read an empty ``selectedOptionId`` as no selection, so an
option offered with an empty id could be chosen and silently lost: offering
one is refused, as is offering one id twice, even on an auto-confirmed
``toolCallReady`` (whose options the reducer drops).

A chat's working directories are a subset of its session's (AHP), so the
chat rule reads the owning session's state, which the host passes as
``session``; ``createChat``'s ``workingDirectories`` meet the same rule
(:func:`working_directories_problem`) before the chat is created. AHP says
nothing of a chat's directories when the session loses one
(``session/workingDirectoryRemoved``): Huddle leaves them as they are (the
chat's subset is the chat's; removing one from a chat is never refused,
setting it again is until the session has it again). The session is another
channel, read as this process holds it when the chat action is checked:
there is no lock across the two, so a directory removed from the session at
that moment may still reach a chat, as it would have had it come first.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, TypeAlias, assert_never

import msgspec

from protocol.actions import (
    ChatActivityChanged,
    ChatDelta,
    ChatDraftChanged,
    ChatError,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageRemoved,
    ChatPendingMessageSet,
    ChatQueuedMessagesReordered,
    ChatReasoning,
    ChatResponsePart,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatToolCallResultConfirmed,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnsLoaded,
    ChatTurnStarted,
    ChatUsage,
    ChatWorkingDirectoryRemoved,
    ChatWorkingDirectorySet,
    SessionDefaultChatChanged,
    StateAction,
    is_chat_action,
)
from protocol.chat import (
    BooleanQuestion,
    BooleanValue,
    ChatState,
    ConfirmationOption,
    InputAnswer,
    InputAnswerValue,
    InputQuestion,
    InputRequest,
    InputRequestPart,
    IntegerQuestion,
    MultiSelectQuestion,
    NumberQuestion,
    NumberValue,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallPendingResultConfirmation,
    ToolCallState,
)
from protocol.codec import MAX_DEPTH, nested_too_deep
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import SessionState
from reducers.chat import select_open_input_part, select_tool_call

VALIDATION_CODES = frozenset(
    {
        RejectionCode.NO_OPEN_INPUT_REQUEST,
        RejectionCode.UNKNOWN_QUESTION,
        RejectionCode.ANSWER_MISSING_VALUE,
        RejectionCode.ANSWER_KIND_MISMATCH,
        RejectionCode.INVALID_ANSWER,
        RejectionCode.REQUIRED_UNANSWERED,
        RejectionCode.FORM_INVALID,
        RejectionCode.TOOL_CALL_NOT_PENDING,
        RejectionCode.UNKNOWN_OPTION,
        RejectionCode.INVALID_OPTIONS,
        RejectionCode.NOT_EDITABLE,
        RejectionCode.INVALID_TOOL_INPUT,
        RejectionCode.NO_ACTIVE_TURN,
        RejectionCode.TURN_IN_PROGRESS,
        RejectionCode.TURN_ID_REUSED,
        RejectionCode.NO_PENDING_MESSAGE,
        RejectionCode.UNKNOWN_CHAT,
        RejectionCode.UNKNOWN_DIRECTORY,
        RejectionCode.ANSWERED_QUESTION_DROPPED,
    }
)
"""The codes :func:`reject_reason` may give (the table above)."""

FormCheck: TypeAlias = Callable[[InputRequest, dict[str, InputAnswer]], str | None]
"""Checks the answers of an accepted request against its frozen JSON Schema.

Called with the open request and its answers after the ``inputCompleted``
overlay, only for an accept that passed every other rule. Returns ``None``
when the answers fit (and for a request that was not made from a form), else
a short text appended to the reason: it must name the failing field and
keyword, never the value (jsonschema's ``error.message`` quotes the value).
"""

ToolInputCheck: TypeAlias = Callable[[ToolCallPendingConfirmation, Any], str | None]
"""Checks an edited tool input (parsed JSON, always an object) against the
tool's input schema. Returns ``None`` when it fits, else a short text that is
appended to the reason and must not quote the input."""


def reject_reason(
    state: ChannelState,
    action: StateAction,
    *,
    form_check: FormCheck | None = None,
    tool_input_check: ToolInputCheck | None = None,
    session: SessionState | None = None,
) -> Rejection | None:
    """Why the host must reject ``action`` on ``state``, or ``None`` to reduce it.

    ``session`` is the state of the session a chat belongs to (None: no
    session is known), which the working directory rule reads. An action of
    another channel's family than ``state`` has no rule here (the reducer
    ignores it). See the module docstring for the rules.
    """
    if isinstance(state, SessionState) and isinstance(action, SessionDefaultChatChanged):
        return _default_chat_reason(state, action)
    if not isinstance(state, ChatState) or not is_chat_action(action):
        return None
    match action:
        case ChatTurnStarted():
            return _turn_started_reason(state, action)
        case ChatTurnCancelled():
            return _turn_cancelled_reason(state, action)
        case ChatToolCallConfirmed():
            return _tool_call_confirmed_reason(state, action, tool_input_check)
        case ChatToolCallResultConfirmed():
            return _tool_call_result_confirmed_reason(state, action)
        case ChatToolCallReady():
            return _options_reason(action.tool_call_id, action.options)
        case ChatResponsePart():
            return _response_part_reason(action)
        case ChatInputAnswerChanged():
            return _input_answer_changed_reason(state, action)
        case ChatInputCompleted():
            return _input_completed_reason(state, action, form_check)
        case ChatPendingMessageRemoved():
            return _pending_removed_reason(state, action)
        case ChatInputRequested():
            return _input_requested_reason(state, action)
        case ChatWorkingDirectorySet():
            return working_directories_problem(session, [action.directory])
        case (
            ChatDelta()
            | ChatReasoning()
            | ChatUsage()
            | ChatTurnComplete()
            | ChatError()
            | ChatActivityChanged()
            | ChatWorkingDirectoryRemoved()
            | ChatTruncated()
            | ChatTurnsLoaded()
            | ChatToolCallStart()
            | ChatToolCallDelta()
            | ChatToolCallComplete()
            | ChatToolCallContentChanged()
            | ChatToolCallAuthRequired()
            | ChatToolCallAuthResolved()
            | ChatPendingMessageSet()
            | ChatQueuedMessagesReordered()
            | ChatDraftChanged()
        ):
            return None
        case _:
            assert_never(action)


def answer_problem(
    question: InputQuestion, answer: InputAnswer, *, request_id: str | None = None
) -> Rejection | None:
    """Why ``answer`` cannot be the answer to ``question``, or ``None``.

    The per-answer rules (missing value, kind, and for a submitted answer the
    question's bounds, format and options), as a reason ``"<code>:
    <sentence>"``; ``request_id`` names the request in the sentence.
    """
    broken = _broken_answer_rule(question, answer)
    if broken is None:
        return None
    code, rule = broken
    where = f"question '{question.id}'"
    if request_id is not None:
        where += f" of input request '{request_id}'"
    return _reason(code, f"the {answer.state} answer to {where} {rule}")


def working_directories_problem(
    session: SessionState | None, directories: list[str]
) -> Rejection | None:
    """Why a chat of ``session`` (None: no known session) may not work in
    ``directories``: the first that is not one of the session's working
    directories (AHP: a chat's are a subset of its session's), or ``None``."""
    held = set(session.working_directories or []) if session is not None else set()
    missing = next((d for d in directories if d not in held), None)
    if missing is None:
        return None
    return _reason(
        RejectionCode.UNKNOWN_DIRECTORY,
        f"the session has no working directory {missing}; add it to the session first",
    )


def _reason(code: RejectionCode, sentence: str) -> Rejection:
    return Rejection(code, sentence)


def _input_requested_reason(state: ChatState, action: ChatInputRequested) -> Rejection | None:
    request = action.request
    if request.answers is not None:
        return None
    old = _select_open_request(state, request.id)
    if old is None or not old.answers:
        return None
    asked = {question.id for question in request.questions or []}
    dropped = sorted(set(old.answers) - asked)
    if not dropped:
        return None
    names = ", ".join(f"'{q}'" for q in dropped)
    return _reason(
        RejectionCode.ANSWERED_QUESTION_DROPPED,
        f"input request '{request.id}' would drop {names}, which already have answers; "
        "send `answers` to say what to keep",
    )


def _pending_removed_reason(
    state: ChatState, action: ChatPendingMessageRemoved
) -> Rejection | None:
    if action.kind == "steering":
        pending = [state.steering_message] if state.steering_message else []
    else:
        pending = state.queued_messages or []
    if any(message.id == action.id for message in pending):
        return None
    return _reason(
        RejectionCode.NO_PENDING_MESSAGE, f"there is no {action.kind} message '{action.id}'"
    )


def _default_chat_reason(
    state: SessionState, action: SessionDefaultChatChanged
) -> Rejection | None:
    chat = action.default_chat
    if chat is None or any(summary.resource == chat for summary in state.chats):
        return None
    return _reason(RejectionCode.UNKNOWN_CHAT, f"the session has no chat {chat}")


# ─── Turns ───────────────────────────────────────────────────────────────────


def _turn_started_reason(state: ChatState, action: ChatTurnStarted) -> Rejection | None:
    active = state.active_turn
    if active is None:
        if any(turn.id == action.turn_id for turn in state.turns):
            return _reason(
                RejectionCode.TURN_ID_REUSED,
                f"turn '{action.turn_id}' already ran in this chat; a new turn needs a new id",
            )
        return None
    return _reason(
        RejectionCode.TURN_IN_PROGRESS,
        f"turn '{active.id}' is still active; turn '{action.turn_id}' can start once it ends",
    )


def _turn_cancelled_reason(state: ChatState, action: ChatTurnCancelled) -> Rejection | None:
    active = state.active_turn
    if active is None:
        return _reason(
            RejectionCode.NO_ACTIVE_TURN,
            f"turn '{action.turn_id}' cannot be cancelled: no turn is active",
        )
    if active.id != action.turn_id:
        return _reason(
            RejectionCode.NO_ACTIVE_TURN,
            f"turn '{action.turn_id}' cannot be cancelled: the active turn is '{active.id}'",
        )
    return None


# ─── Tool calls ──────────────────────────────────────────────────────────────

_CONFIRMATION = "pending-confirmation"
_RESULT = "pending-result-confirmation"


def _select_turn_tool_call(
    state: ChatState, turn_id: str, tool_call_id: str
) -> ToolCallState | None:
    """The tool call of the active turn, if that turn is ``turn_id``."""
    active = state.active_turn
    if active is None or active.id != turn_id:
        return None
    return select_tool_call(state, tool_call_id)


def _not_pending_reason(
    state: ChatState, turn_id: str, tool_call_id: str, call: ToolCallState | None, wanted: str
) -> Rejection:
    active = state.active_turn
    if active is None or active.id != turn_id:
        why = f"turn '{turn_id}' is not the active turn"
    elif call is None:
        why = f"the active turn '{turn_id}' has no tool call '{tool_call_id}'"
    else:
        why = f"tool call '{tool_call_id}' is {_tag(call)}, not {wanted}"
    return _reason(RejectionCode.TOOL_CALL_NOT_PENDING, why)


def _tool_call_confirmed_reason(
    state: ChatState, action: ChatToolCallConfirmed, tool_input_check: ToolInputCheck | None
) -> Rejection | None:
    call = _select_turn_tool_call(state, action.turn_id, action.tool_call_id)
    if not isinstance(call, ToolCallPendingConfirmation):
        return _not_pending_reason(state, action.turn_id, action.tool_call_id, call, _CONFIRMATION)
    name = f"tool call '{call.tool_call_id}'"
    option_id = action.selected_option_id
    if option_id is not None and option_id not in {o.id for o in call.options or []}:
        return _reason(RejectionCode.UNKNOWN_OPTION, f"{name} offers no option '{option_id}'")
    edited = action.edited_tool_input
    if edited is None:
        return None
    if call.editable is not True:
        return _reason(RejectionCode.NOT_EDITABLE, f"the input of {name} is not editable")
    if nested_too_deep(edited):
        return _reason(
            RejectionCode.INVALID_TOOL_INPUT,
            f"the edited input of {name} nests deeper than {MAX_DEPTH} levels",
        )
    try:
        tool_input = msgspec.json.decode(edited)
    except msgspec.DecodeError:
        return _reason(
            RejectionCode.INVALID_TOOL_INPUT, f"the edited input of {name} is not valid JSON"
        )
    if not isinstance(tool_input, dict):
        return _reason(
            RejectionCode.INVALID_TOOL_INPUT, f"the edited input of {name} is not a JSON object"
        )
    problem = None if tool_input_check is None else tool_input_check(call, tool_input)
    if problem is not None:
        return _reason(
            RejectionCode.INVALID_TOOL_INPUT,
            f"the edited input of {name} does not fit the input schema of tool "
            f"'{call.tool_name}': {problem}",
        )
    return None


def _options_reason(
    tool_call_id: str, options: list[ConfirmationOption] | None
) -> Rejection | None:
    """Why confirmation ``options`` cannot be offered: an empty or repeated id."""
    name = f"tool call '{tool_call_id}'"
    seen: set[str] = set()
    for option in options or []:
        if not option.id:
            return _reason(
                RejectionCode.INVALID_OPTIONS,
                f"{name} offers an option with an empty id, which no confirmation can select",
            )
        if option.id in seen:
            return _reason(
                RejectionCode.INVALID_OPTIONS, f"{name} offers option '{option.id}' more than once"
            )
        seen.add(option.id)
    return None


def _response_part_reason(action: ChatResponsePart) -> Rejection | None:
    part = action.part
    if type(part) is not ToolCallPart or type(part.tool_call) is not ToolCallPendingConfirmation:
        return None
    return _options_reason(part.tool_call.tool_call_id, part.tool_call.options)


def _tool_call_result_confirmed_reason(
    state: ChatState, action: ChatToolCallResultConfirmed
) -> Rejection | None:
    call = _select_turn_tool_call(state, action.turn_id, action.tool_call_id)
    if isinstance(call, ToolCallPendingResultConfirmation):
        return None
    return _not_pending_reason(state, action.turn_id, action.tool_call_id, call, _RESULT)


# ─── Input requests ──────────────────────────────────────────────────────────


def _select_open_request(state: ChatState, request_id: str) -> InputRequest | None:
    active = state.active_turn
    if active is None:
        return None
    found = select_open_input_part(active.response_parts, request_id)
    return None if found is None else found[1].request


def _not_open_reason(state: ChatState, request_id: str) -> Rejection:
    name = f"input request '{request_id}'"
    active = state.active_turn
    if active is None:
        why = f"{name} is not open: no turn is active"
    elif any(
        type(part) is InputRequestPart and part.request.id == request_id
        for part in active.response_parts
    ):
        why = f"{name} is already completed; only the first completion counts"
    else:
        why = f"the active turn '{active.id}' has no {name}"
    return _reason(RejectionCode.NO_OPEN_INPUT_REQUEST, why)


def _select_question(request: InputRequest, question_id: str) -> InputQuestion | None:
    return next((q for q in request.questions or [] if q.id == question_id), None)


def _answer_reason(
    request: InputRequest, question_id: str, answer: InputAnswer | None
) -> Rejection | None:
    """The reason an answer to ``question_id`` of ``request`` is refused; an
    absent answer (clearing it) only needs a known question."""
    question = _select_question(request, question_id)
    if question is None:
        return _reason(
            RejectionCode.UNKNOWN_QUESTION,
            f"input request '{request.id}' has no question '{question_id}'",
        )
    if answer is None:
        return None
    return answer_problem(question, answer, request_id=request.id)


def _input_answer_changed_reason(
    state: ChatState, action: ChatInputAnswerChanged
) -> Rejection | None:
    request = _select_open_request(state, action.request_id)
    if request is None:
        return _not_open_reason(state, action.request_id)
    return _answer_reason(request, action.question_id, action.answer)


def _input_completed_reason(
    state: ChatState, action: ChatInputCompleted, form_check: FormCheck | None
) -> Rejection | None:
    request = _select_open_request(state, action.request_id)
    if request is None:
        return _not_open_reason(state, action.request_id)
    carried = action.answers or {}
    for question_id, answer in carried.items():
        problem = _answer_reason(request, question_id, answer)
        if problem is not None:
            return problem
    if action.response != "accept":
        return None
    # AHP: reject an accept while required questions lack submitted answers;
    # Huddle: drafts do not count.
    answers = {**(request.answers or {}), **carried}
    unanswered = [
        q.id
        for q in request.questions or []
        if q.required and (q.id not in answers or answers[q.id].state != "submitted")
    ]
    if unanswered:
        listed = ", ".join(f"'{question_id}'" for question_id in unanswered)
        questions = "question {} has" if len(unanswered) == 1 else "questions {} have"
        return _reason(
            RejectionCode.REQUIRED_UNANSWERED,
            f"input request '{request.id}' cannot be accepted: required "
            f"{questions.format(listed)} no submitted answer",
        )
    detail = None if form_check is None else form_check(request, answers)
    if detail is not None:
        return _reason(
            RejectionCode.FORM_INVALID,
            f"the answers to input request '{request.id}' do not fit its form: {detail}",
        )
    return None


# ─── Answers ─────────────────────────────────────────────────────────────────

BrokenRule: TypeAlias = tuple[RejectionCode, str]
"""A broken answer rule: its code and the predicate of the sentence."""


def _tag(value: msgspec.Struct | type[msgspec.Struct]) -> str:
    """The wire tag (``kind``/``status``) of a tagged Struct or its class."""
    return str(value.__struct_config__.tag)


def _value_kind(question: InputQuestion) -> type[InputAnswerValue]:
    """The kind of value that answers ``question``."""
    match question:
        case TextQuestion():
            return TextValue
        case NumberQuestion() | IntegerQuestion():
            return NumberValue
        case BooleanQuestion():
            return BooleanValue
        case SingleSelectQuestion():
            return SelectedValue
        case MultiSelectQuestion():
            return SelectedManyValue
        case _:
            assert_never(question)


def _broken_answer_rule(question: InputQuestion, answer: InputAnswer) -> BrokenRule | None:
    if answer.state == "skipped":
        return None
    value = answer.value
    if value is None:
        return RejectionCode.ANSWER_MISSING_VALUE, "has no value"
    kind = _value_kind(question)
    if type(value) is not kind:
        return (
            RejectionCode.ANSWER_KIND_MISMATCH,
            f"is a '{_tag(value)}' value; {_tag(question)} questions take '{_tag(kind)}'",
        )
    if answer.state == "draft":
        return None
    rule = _submitted_value_problem(question, value)
    return None if rule is None else (RejectionCode.INVALID_ANSWER, rule)


def _submitted_value_problem(question: InputQuestion, value: InputAnswerValue) -> str | None:
    """The rule a submitted value of the right kind breaks, as a predicate."""
    match question:
        case TextQuestion():
            assert isinstance(value, TextValue)
            return _text_problem(question, value.value)
        case NumberQuestion() | IntegerQuestion():
            assert isinstance(value, NumberValue)
            return _number_problem(question, value.value)
        case BooleanQuestion():
            return None
        case SingleSelectQuestion():
            assert isinstance(value, SelectedValue)
            return _selection_problem(question, [value.value], value.freeform_values)
        case MultiSelectQuestion():
            assert isinstance(value, SelectedManyValue)
            return _selection_problem(question, value.value, value.freeform_values)
        case _:
            assert_never(question)


def _text_problem(question: TextQuestion, text: str) -> str | None:
    # JSON Schema counts minLength/maxLength in code points, as len() does.
    if question.min is not None and len(text) < question.min:
        return f"is shorter than {_count(question.min, 'character')}"
    if question.max is not None and len(text) > question.max:
        return f"is longer than {_count(question.max, 'character')}"
    check = _FORMATS.get(question.format or "")
    if check is not None and not check[0](text):
        return f"is not {check[1]}"
    return None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _number_problem(question: NumberQuestion | IntegerQuestion, number: float) -> str | None:
    if isinstance(number, float) and not math.isfinite(number):
        return "is not a finite number"
    if question.min is not None and number < question.min:
        return f"is below the minimum {question.min}"
    if question.max is not None and number > question.max:
        return f"is above the maximum {question.max}"
    if (
        isinstance(question, IntegerQuestion)
        and isinstance(number, float)
        and not number.is_integer()
    ):
        return "is not a whole number"
    return None


def _selection_problem(
    question: SingleSelectQuestion | MultiSelectQuestion,
    option_ids: list[str],
    freeform: list[str] | None,
) -> str | None:
    freeform_allowed = question.allow_freeform_input is True
    if freeform and not freeform_allowed:
        return "has free-form values, but the question allows no free-form input"
    offered = {option.id for option in question.options}
    if not freeform_allowed and not offered.issuperset(option_ids):
        return "names an option the question does not offer"
    if len(set(option_ids)) != len(option_ids):
        return "names an option more than once"
    if isinstance(question, SingleSelectQuestion):
        return None
    count = len(option_ids) + len(freeform or [])
    if question.min is not None and count < question.min:
        return f"has fewer than {_count(question.min, 'item')}"
    if question.max is not None and count > question.max:
        return f"has more than {_count(question.max, 'item')}"
    return None


# ─── Text formats (simple, strict, ASCII-only patterns) ──────────────────────

_EMAIL = re.compile(r"[^@\s\x00-\x1f\x7f]+@[^@.\s\x00-\x1f\x7f]+(?:\.[^@.\s\x00-\x1f\x7f]+)+")
_URI = re.compile(
    r"[A-Za-z][A-Za-z0-9+.\-]*:(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})+"
)
_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME = re.compile(
    r"([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?(?:[Zz]|[+-]([0-9]{2}):([0-9]{2}))"
)


def _is_email(text: str) -> bool:
    """``local@domain.tld``: one ``@``, a dotted domain, no spaces."""
    return _EMAIL.fullmatch(text) is not None


def _is_uri(text: str) -> bool:
    """An absolute RFC 3986 URI: a scheme, then only URI characters."""
    return _URI.fullmatch(text) is not None


def _is_date(text: str) -> bool:
    """RFC 3339 ``full-date``: ``YYYY-MM-DD`` naming a day of the calendar."""
    match = _DATE.fullmatch(text)
    if match is None:
        return False
    year, month, day = (int(part) for part in match.groups())
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]
    return 1 <= day <= days


def _is_date_time(text: str) -> bool:
    """RFC 3339 ``date-time``: full-date, ``T``, time with seconds, offset."""
    date, separator, time = text[:10], text[10:11], text[11:]
    match = _TIME.fullmatch(time)
    if separator not in ("T", "t") or match is None or not _is_date(date):
        return False
    hour, minute, second, offset_hour, offset_minute = (int(g or 0) for g in match.groups())
    # RFC 3339 allows a leap second (60).
    return (
        hour <= 23 and minute <= 59 and second <= 60 and offset_hour <= 23 and offset_minute <= 59
    )


_FORMATS: dict[str, tuple[Callable[[str], bool], str]] = {
    "email": (_is_email, "a valid email address"),
    "uri": (_is_uri, "a valid absolute URI"),
    "date": (_is_date, "a date (YYYY-MM-DD)"),
    "date-time": (_is_date_time, "an RFC 3339 date-time"),
}
"""The text formats Huddle checks, with what the sentence says they need."""
