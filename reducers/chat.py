"""The chat channel reducer: turns, streaming, tool calls, input requests.

``reduce_chat(state, action, now_ms)`` returns the next state. It is pure:
it never mutates ``state`` (Structs are frozen and lists are copied before a
change), never reads a clock (``now_ms`` is the caller's time, used only for
``modifiedAt``) and never raises on a well-typed action. An action that does
not fit the state (wrong turn, unknown tool call, a transition the tool call's
status does not allow) returns ``state`` itself, as in AHP.

Work is proportional to the active turn, never to the history: completed
turns are shared by reference between successive states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, assert_never

import msgspec
from msgspec.structs import replace

from protocol.actions import (
    ChatAction,
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
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    ConfirmationOption,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    InputResponseKind,
    MarkdownPart,
    McpContributor,
    PendingMessage,
    ReasoningPart,
    ResponsePart,
    ToolCallAuthRequired,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallPart,
    ToolCallPendingConfirmation,
    ToolCallPendingResultConfirmation,
    ToolCallRunning,
    ToolCallState,
    ToolCallStreaming,
    Turn,
    TurnState,
)
from protocol.status import SessionStatus, with_activity, with_flag
from protocol.wire import ErrorInfo, JsonObject, Number
from reducers.clock import iso_time
from reducers.lists import directory_removed, directory_set

# ─── Selectors ───────────────────────────────────────────────────────────────


def select_open_input_part(
    parts: list[ResponsePart], request_id: str
) -> tuple[int, InputRequestPart] | None:
    """The unresolved input-request part with ``request_id``, and its index."""
    for index, part in enumerate(parts):
        if (
            type(part) is InputRequestPart
            and part.response is None
            and part.request.id == request_id
        ):
            return index, part
    return None


def select_latest_input_part(state: ChatState, request_id: str) -> InputRequestPart | None:
    """The newest input-request part with ``request_id``, open or resolved:
    in the active turn, else in the newest completed turn that has one."""
    turns: list[ActiveTurn | Turn] = [state.active_turn] if state.active_turn else []
    turns.extend(reversed(state.turns))
    for turn in turns:
        for part in reversed(turn.response_parts):
            if type(part) is InputRequestPart and part.request.id == request_id:
                return part
    return None


class InputSettlement(msgspec.Struct, frozen=True):
    """How an input request stands: ``open`` (unresolved in the active
    turn), ``resolved`` (``part`` carries the response and the answers) or
    ``gone`` (never asked here, or its turn ended before anyone answered;
    ``part`` is the unanswered part, if any)."""

    status: Literal["open", "resolved", "gone"]
    part: InputRequestPart | None = None


def select_input_settlement(state: ChatState, request_id: str) -> InputSettlement:
    """Whether input request ``request_id`` is settled, and how: the one
    answer every waiter (the host, a client's mirror, the runner's bridge)
    takes."""
    active = state.active_turn
    if active is not None:
        found = select_open_input_part(active.response_parts, request_id)
        if found is not None:
            return InputSettlement("open", found[1])
    part = select_latest_input_part(state, request_id)
    if part is not None and part.response is not None:
        return InputSettlement("resolved", part)
    return InputSettlement("gone", part)


def select_latest_tool_call(
    state: ChatState, turn_id: str, tool_call_id: str
) -> ToolCallState | None:
    """The newest state of tool call ``tool_call_id`` of turn ``turn_id``,
    active or completed."""
    turns: list[ActiveTurn | Turn] = [state.active_turn] if state.active_turn else []
    turns.extend(reversed(state.turns))
    for turn in turns:
        if turn.id != turn_id:
            continue
        for part in reversed(turn.response_parts):
            if type(part) is ToolCallPart and part.tool_call.tool_call_id == tool_call_id:
                return part.tool_call
    return None


def select_tool_call(state: ChatState, tool_call_id: str) -> ToolCallState | None:
    """The tool call ``tool_call_id`` of the active turn, if there is one."""
    if state.active_turn is None:
        return None
    for part in state.active_turn.response_parts:
        if type(part) is ToolCallPart and part.tool_call.tool_call_id == tool_call_id:
            return part.tool_call
    return None


def select_truncated(state: ChatState, action: ChatTruncated) -> list[ActiveTurn | Turn]:
    """The turns ``action`` takes away from ``state``: those after its
    ``turnId`` (all of them without one) and the active turn; none for a
    ``turnId`` the chat does not have (the reducer then changes nothing)."""
    if action.turn_id is None:
        kept = 0
    else:
        kept = next((i + 1 for i, t in enumerate(state.turns) if t.id == action.turn_id), -1)
        if kept < 0:
            return []
    away: list[ActiveTurn | Turn] = list(state.turns[kept:])
    if state.active_turn is not None:
        away.append(state.active_turn)
    return away


def select_waits(turns: list[ActiveTurn | Turn]) -> tuple[list[str], list[str]]:
    """The ids of the input requests and of the tool calls of ``turns``:
    what a wait on them (its notes, its expiry) is keyed by."""
    requests: list[str] = []
    calls: list[str] = []
    for turn in turns:
        for part in turn.response_parts:
            if type(part) is InputRequestPart:
                requests.append(part.request.id)
            elif type(part) is ToolCallPart:
                calls.append(part.tool_call.tool_call_id)
    return requests, calls


_BLOCKING = (ToolCallPendingConfirmation, ToolCallPendingResultConfirmation, ToolCallAuthRequired)


def select_activity(state: ChatState) -> int:
    """The activity bits the chat's live work implies (AHP's summary status):
    InputNeeded while an input request is open or a tool call waits on a
    person, InProgress while a turn runs, Idle otherwise."""
    turn = state.active_turn
    if turn is None:
        return SessionStatus.IDLE
    for part in turn.response_parts:
        if type(part) is InputRequestPart:
            if part.response is None:
                return SessionStatus.INPUT_NEEDED
        elif type(part) is ToolCallPart and isinstance(part.tool_call, _BLOCKING):
            return SessionStatus.INPUT_NEEDED
    return SessionStatus.IN_PROGRESS


def _refresh_status(state: ChatState) -> ChatState:
    status = with_activity(state.status, select_activity(state))
    return state if status == state.status else replace(state, status=status)


# ─── Turn end ────────────────────────────────────────────────────────────────


def _base(tc: ToolCallState, meta: JsonObject | None = None) -> dict[str, Any]:
    """The fields every tool-call state shares; ``meta`` replaces ``_meta``
    when the action carries one."""
    return {
        "tool_call_id": tc.tool_call_id,
        "tool_name": tc.tool_name,
        "display_name": tc.display_name,
        "intention": tc.intention,
        "contributor": tc.contributor,
        "meta": tc.meta if meta is None else meta,
    }


def _skip_unfinished(part: ResponsePart) -> ResponsePart:
    if type(part) is not ToolCallPart:
        return part
    tc = part.tool_call
    if isinstance(tc, ToolCallCompleted | ToolCallCancelled):
        return part
    if isinstance(tc, ToolCallStreaming):
        message = tc.invocation_message if tc.invocation_message is not None else ""
        tool_input = None
    else:
        message, tool_input = tc.invocation_message, tc.tool_input
    return ToolCallPart(
        tool_call=ToolCallCancelled(
            **_base(tc), invocation_message=message, tool_input=tool_input, reason="skipped"
        )
    )


def _end_turn(
    state: ChatState,
    turn_id: str,
    outcome: TurnState,
    duration: Number,
    now_ms: int,
    error: ErrorInfo | None = None,
) -> ChatState:
    """Move the active turn into ``turns``: unfinished tool calls become
    cancelled (``skipped``); unresolved input requests stay as they are."""
    active = state.active_turn
    if active is None or active.id != turn_id:
        return state
    turn = Turn(
        id=active.id,
        started_at=active.started_at,
        duration=max(0, duration),
        message=active.message,
        response_parts=[_skip_unfinished(part) for part in active.response_parts],
        usage=active.usage,
        state=outcome,
        error=error,
    )
    activity = SessionStatus.ERROR if outcome == "error" else SessionStatus.IDLE
    return replace(
        state,
        turns=[*state.turns, turn],
        active_turn=None,
        modified_at=iso_time(now_ms),
        status=with_activity(state.status, activity),
    )


# ─── Part updates ────────────────────────────────────────────────────────────


def _with_parts(state: ChatState, active: ActiveTurn, parts: list[ResponsePart]) -> ChatState:
    return replace(state, active_turn=replace(active, response_parts=parts))


def _append_text(state: ChatState, turn_id: str, part_id: str, text: str, kind: type) -> ChatState:
    """AHP ``chat/delta`` / ``chat/reasoning``: append to the first part whose
    id is ``part_id`` if it is of ``kind``."""
    active = state.active_turn
    if active is None or active.id != turn_id:
        return state
    parts = active.response_parts
    for index, part in enumerate(parts):
        if type(part) is ToolCallPart:
            found = part.tool_call.tool_call_id == part_id
        else:
            found = isinstance(part, MarkdownPart | ReasoningPart) and part.id == part_id
        if found:
            if type(part) is not kind:
                return state
            assert isinstance(part, MarkdownPart | ReasoningPart)
            updated = list(parts)
            updated[index] = replace(part, content=part.content + text)
            return _with_parts(state, active, updated)
    return state


def _update_tool_call(
    state: ChatState,
    turn_id: str,
    tool_call_id: str,
    update: Callable[[ToolCallState], ToolCallState],
    refresh: bool,
) -> ChatState:
    """Apply ``update`` to the tool call; it returns its argument to decline.
    With ``refresh`` the status is derived again (AHP does so after every
    transition that can enter or leave a waiting state)."""
    active = state.active_turn
    if active is None or active.id != turn_id:
        return state
    updated: list[ResponsePart] | None = None
    for index, part in enumerate(active.response_parts):
        if type(part) is ToolCallPart and part.tool_call.tool_call_id == tool_call_id:
            new = update(part.tool_call)
            if new is not part.tool_call:
                if updated is None:
                    updated = list(active.response_parts)
                updated[index] = ToolCallPart(tool_call=new)
    if updated is None:
        return state
    next_state = _with_parts(state, active, updated)
    return _refresh_status(next_state) if refresh else next_state


def _select_option(
    options: list[ConfirmationOption] | None, option_id: str | None
) -> ConfirmationOption | None:
    # An empty id selects nothing, as in AHP 0.7's TypeScript reducer (its Go,
    # Kotlin and Swift ones resolve it); validation refuses to offer one.
    if not option_id or not options:
        return None
    return next((option for option in options if option.id == option_id), None)


# ─── Tool-call transitions (each returns its input to decline) ───────────────


def _tool_delta(action: ChatToolCallDelta) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallStreaming):
            return tc
        return replace(
            tc,
            meta=tc.meta if action.meta is None else action.meta,
            partial_input=(tc.partial_input or "") + action.content,
            invocation_message=action.invocation_message
            if action.invocation_message is not None
            else tc.invocation_message,
        )

    return update


def _tool_ready(action: ChatToolCallReady) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallStreaming | ToolCallRunning | ToolCallPendingConfirmation):
            return tc
        base = _base(tc, action.meta)
        if action.confirmed is not None:
            return ToolCallRunning(
                **base,
                invocation_message=action.invocation_message,
                tool_input=action.tool_input,
                confirmed=action.confirmed,
            )
        # Re-confirmation of a running call keeps nothing of the old prompt;
        # an update of a pending prompt keeps what the action leaves out.
        old = tc if isinstance(tc, ToolCallPendingConfirmation) else None

        def keep(new: Any, field: str) -> Any:
            return new if new is not None or old is None else getattr(old, field)

        return ToolCallPendingConfirmation(
            **base,
            invocation_message=action.invocation_message,
            tool_input=keep(action.tool_input, "tool_input"),
            confirmation_title=keep(action.confirmation_title, "confirmation_title"),
            risk_assessment=keep(action.risk_assessment, "risk_assessment"),
            edits=keep(action.edits, "edits"),
            editable=keep(action.editable, "editable"),
            options=keep(action.options, "options"),
        )

    return update


def _tool_confirmed(action: ChatToolCallConfirmed) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallPendingConfirmation):
            return tc
        base = _base(tc, action.meta)
        selected = _select_option(tc.options, action.selected_option_id)
        if action.approved:
            assert action.confirmed is not None  # checked when the action was built
            return ToolCallRunning(
                **base,
                invocation_message=tc.invocation_message,
                tool_input=action.edited_tool_input
                if action.edited_tool_input is not None
                else tc.tool_input,
                confirmed=action.confirmed,
                selected_option=selected,
            )
        assert action.reason is not None  # checked when the action was built
        return ToolCallCancelled(
            **base,
            invocation_message=tc.invocation_message,
            tool_input=tc.tool_input,
            reason=action.reason,
            reason_message=action.reason_message,
            user_suggestion=action.user_suggestion,
            selected_option=selected,
        )

    return update


def _tool_complete(action: ChatToolCallComplete) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallRunning | ToolCallPendingConfirmation | ToolCallAuthRequired):
            return tc
        result = action.result
        # AHP: from auth-required only a failed result is allowed (the client
        # gave up on authenticating), and it always completes terminally.
        is_auth = isinstance(tc, ToolCallAuthRequired)
        if is_auth and result.success:
            return tc
        if isinstance(tc, ToolCallPendingConfirmation):
            confirmed, selected, content = "not-needed", None, result.content
        else:
            pre_auth = tc.content if is_auth else None
            confirmed, selected = tc.confirmed, tc.selected_option
            content = result.content if result.content is not None else pre_auth
        fields: dict[str, Any] = {
            **_base(tc, action.meta),
            "invocation_message": tc.invocation_message,
            "tool_input": tc.tool_input,
            "confirmed": confirmed,
            "selected_option": selected,
            "success": result.success,
            "past_tense_message": result.past_tense_message,
            "content": content,
            "structured_content": result.structured_content,
            "error": result.error,
        }
        if action.requires_result_confirmation and not is_auth:
            return ToolCallPendingResultConfirmation(**fields)
        return ToolCallCompleted(**fields)

    return update


def _tool_result_confirmed(
    action: ChatToolCallResultConfirmed,
) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallPendingResultConfirmation):
            return tc
        base = _base(tc, action.meta)
        if action.approved:
            return ToolCallCompleted(
                **base,
                invocation_message=tc.invocation_message,
                tool_input=tc.tool_input,
                confirmed=tc.confirmed,
                selected_option=tc.selected_option,
                success=tc.success,
                past_tense_message=tc.past_tense_message,
                content=tc.content,
                structured_content=tc.structured_content,
                error=tc.error,
            )
        return ToolCallCancelled(
            **base,
            invocation_message=tc.invocation_message,
            tool_input=tc.tool_input,
            reason="result-denied",
            selected_option=tc.selected_option,
        )

    return update


def _tool_content(action: ChatToolCallContentChanged) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallRunning):
            return tc
        meta = tc.meta if action.meta is None else action.meta
        return replace(tc, meta=meta, content=action.content)

    return update


def _tool_auth_required(
    action: ChatToolCallAuthRequired,
) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        # AHP: only a running call of an MCP server can wait for auth.
        if not isinstance(tc, ToolCallRunning) or not isinstance(tc.contributor, McpContributor):
            return tc
        return ToolCallAuthRequired(
            **_base(tc, action.meta),
            invocation_message=tc.invocation_message,
            tool_input=tc.tool_input,
            confirmed=tc.confirmed,
            selected_option=tc.selected_option,
            content=tc.content,
            auth=action.auth,
        )

    return update


def _tool_auth_resolved(
    action: ChatToolCallAuthResolved,
) -> Callable[[ToolCallState], ToolCallState]:
    def update(tc: ToolCallState) -> ToolCallState:
        if not isinstance(tc, ToolCallAuthRequired):
            return tc
        return ToolCallRunning(
            **_base(tc, action.meta),
            invocation_message=tc.invocation_message,
            tool_input=tc.tool_input,
            confirmed=tc.confirmed,
            selected_option=tc.selected_option,
            content=tc.content,
        )

    return update


# ─── Turn start, truncation, input requests, pending messages ────────────────


def _turn_started(state: ChatState, action: ChatTurnStarted, now_ms: int) -> ChatState:
    active = ActiveTurn(
        id=action.turn_id, started_at=action.started_at, message=action.message, response_parts=[]
    )
    status = with_flag(
        with_activity(state.status, SessionStatus.IN_PROGRESS), SessionStatus.IS_READ, False
    )
    steering, queued = state.steering_message, state.queued_messages
    if action.queued_message_id:
        if steering is not None and steering.id == action.queued_message_id:
            steering = None
        if queued is not None:
            queued = [m for m in queued if m.id != action.queued_message_id] or None
    return replace(
        state,
        active_turn=active,
        status=status,
        modified_at=iso_time(now_ms),
        steering_message=steering,
        queued_messages=queued,
    )


def _truncated(state: ChatState, action: ChatTruncated, now_ms: int) -> ChatState:
    cursor = state.turns_next_cursor
    if action.turn_id is None:
        turns: list[Turn] = []
        cursor = None
    else:
        index = next((i for i, t in enumerate(state.turns) if t.id == action.turn_id), -1)
        if index < 0:
            return state
        turns = state.turns[: index + 1]
    return replace(
        state,
        turns=turns,
        turns_next_cursor=cursor,
        active_turn=None,
        modified_at=iso_time(now_ms),
        status=with_activity(state.status, SessionStatus.IDLE),
    )


def _turns_loaded(state: ChatState, action: ChatTurnsLoaded) -> ChatState:
    known = {turn.id for turn in state.turns}
    older = [turn for turn in action.turns if turn.id not in known]
    return replace(state, turns=[*older, *state.turns], turns_next_cursor=action.turns_next_cursor)


def _input_requested(state: ChatState, request: InputRequest, now_ms: int) -> ChatState:
    """Insert the request at the end of the stream, or replace the open one
    with the same id in place, keeping its drafts unless answers are given."""
    active = state.active_turn
    if active is None:
        return state
    parts = list(active.response_parts)
    found = select_open_input_part(parts, request.id)
    if found is None:
        parts.append(InputRequestPart(request=request))
    else:
        index, old = found
        if request.answers is None:
            request = replace(request, answers=old.request.answers)
        parts[index] = InputRequestPart(request=request)
    next_state = _with_parts(state, active, parts)
    status = with_flag(
        with_activity(state.status, select_activity(next_state)), SessionStatus.IS_READ, False
    )
    return replace(next_state, status=status, modified_at=iso_time(now_ms))


def _answers_changed(
    state: ChatState,
    request_id: str,
    now_ms: int,
    change: Callable[[dict[str, InputAnswer]], None],
    response: InputResponseKind | None = None,
) -> ChatState:
    """Apply ``change`` to a copy of the open request's answers; with
    ``response`` also resolve the request in place."""
    active = state.active_turn
    if active is None:
        return state
    found = select_open_input_part(active.response_parts, request_id)
    if found is None:
        return state
    index, part = found
    answers = dict(part.request.answers or {})
    change(answers)
    request = replace(part.request, answers=answers or None)
    parts = list(active.response_parts)
    parts[index] = InputRequestPart(request=request, response=response)
    next_state = _with_parts(state, active, parts)
    if response is not None:
        next_state = _refresh_status(next_state)
    return replace(next_state, modified_at=iso_time(now_ms))


def _answer_changed(state: ChatState, action: ChatInputAnswerChanged, now_ms: int) -> ChatState:
    def change(answers: dict[str, InputAnswer]) -> None:
        if action.answer is None:
            answers.pop(action.question_id, None)
        else:
            answers[action.question_id] = action.answer

    return _answers_changed(state, action.request_id, now_ms, change)


def _input_completed(state: ChatState, action: ChatInputCompleted, now_ms: int) -> ChatState:
    def change(answers: dict[str, InputAnswer]) -> None:
        answers.update(action.answers or {})

    return _answers_changed(state, action.request_id, now_ms, change, action.response)


def _pending_set(state: ChatState, action: ChatPendingMessageSet) -> ChatState:
    entry = PendingMessage(id=action.id, message=action.message)
    if action.kind == "steering":
        return replace(state, steering_message=entry)
    queued = list(state.queued_messages or [])
    index = next((i for i, m in enumerate(queued) if m.id == action.id), -1)
    if index >= 0:
        queued[index] = entry
    else:
        queued.append(entry)
    return replace(state, queued_messages=queued)


def _pending_removed(state: ChatState, action: ChatPendingMessageRemoved) -> ChatState:
    if action.kind == "steering":
        if state.steering_message is None or state.steering_message.id != action.id:
            return state
        return replace(state, steering_message=None)
    queued = state.queued_messages
    if queued is None:
        return state
    kept = [m for m in queued if m.id != action.id]
    if len(kept) == len(queued):
        return state
    return replace(state, queued_messages=kept or None)


def _reordered(state: ChatState, action: ChatQueuedMessagesReordered) -> ChatState:
    queued = state.queued_messages
    if queued is None:
        return state
    by_id = {m.id: m for m in queued}
    ordered: dict[str, PendingMessage] = {}
    for message_id in action.order:
        if message_id in by_id and message_id not in ordered:
            ordered[message_id] = by_id[message_id]
    rest = [m for m in queued if m.id not in ordered]
    return replace(state, queued_messages=[*ordered.values(), *rest])


# ─── The reducer ─────────────────────────────────────────────────────────────


def reduce_chat(state: ChatState, action: ChatAction, now_ms: int) -> ChatState:
    """The chat state after ``action``; ``now_ms`` stamps ``modifiedAt``."""
    match action:
        case ChatDelta():
            return _append_text(state, action.turn_id, action.part_id, action.content, MarkdownPart)
        case ChatInputAnswerChanged():
            return _answer_changed(state, action, now_ms)
        case ChatReasoning():
            return _append_text(
                state, action.turn_id, action.part_id, action.content, ReasoningPart
            )
        case ChatResponsePart():
            active = state.active_turn
            if active is None or active.id != action.turn_id:
                return state
            return _with_parts(state, active, [*active.response_parts, action.part])
        case ChatTurnStarted():
            return _turn_started(state, action, now_ms)
        case ChatTurnComplete():
            return _end_turn(state, action.turn_id, "complete", action.duration, now_ms)
        case ChatTurnCancelled():
            return _end_turn(state, action.turn_id, "cancelled", action.duration, now_ms)
        case ChatError():
            return _end_turn(state, action.turn_id, "error", action.duration, now_ms, action.error)
        case ChatUsage():
            active = state.active_turn
            if active is None or active.id != action.turn_id:
                return state
            return replace(state, active_turn=replace(active, usage=action.usage))
        case ChatActivityChanged():
            return replace(state, activity=action.activity)
        case ChatWorkingDirectorySet():
            dirs = directory_set(state.working_directories, action.directory)
            return state if dirs is None else replace(state, working_directories=dirs)
        case ChatWorkingDirectoryRemoved():
            dirs = directory_removed(state.working_directories, action.directory)
            return state if dirs is None else replace(state, working_directories=dirs)
        case ChatToolCallStart():
            active = state.active_turn
            if active is None or active.id != action.turn_id:
                return state
            call = ToolCallStreaming(
                tool_call_id=action.tool_call_id,
                tool_name=action.tool_name,
                display_name=action.display_name,
                intention=action.intention,
                contributor=action.contributor,
                meta=action.meta,
            )
            return _with_parts(
                state, active, [*active.response_parts, ToolCallPart(tool_call=call)]
            )
        case ChatToolCallDelta():
            update = _tool_delta(action)
        case ChatToolCallReady():
            update = _tool_ready(action)
        case ChatToolCallConfirmed():
            update = _tool_confirmed(action)
        case ChatToolCallComplete():
            update = _tool_complete(action)
        case ChatToolCallResultConfirmed():
            update = _tool_result_confirmed(action)
        case ChatToolCallContentChanged():
            update = _tool_content(action)
        case ChatToolCallAuthRequired():
            update = _tool_auth_required(action)
        case ChatToolCallAuthResolved():
            update = _tool_auth_resolved(action)
        case ChatTruncated():
            return _truncated(state, action, now_ms)
        case ChatTurnsLoaded():
            return _turns_loaded(state, action)
        case ChatInputRequested():
            return _input_requested(state, action.request, now_ms)
        case ChatInputCompleted():
            return _input_completed(state, action, now_ms)
        case ChatPendingMessageSet():
            return _pending_set(state, action)
        case ChatPendingMessageRemoved():
            return _pending_removed(state, action)
        case ChatQueuedMessagesReordered():
            return _reordered(state, action)
        case ChatDraftChanged():
            return replace(state, draft=action.draft)
        case _:
            assert_never(action)
    refresh = not isinstance(action, ChatToolCallDelta | ChatToolCallContentChanged)
    return _update_tool_call(state, action.turn_id, action.tool_call_id, update, refresh)
