"""What a chat's state says resumes a runner's turn: pure, no I/O.

Every path that resumes a waiting turn from a chat asks :func:`resume_for`
of the chat's state: the hook on a person's answer, the rider on that
answer's append, the periodic sweep (server.runner.resuming,
server.runner.sweep). The action itself decides nothing: it only says which
turn to ask about (:func:`awaits` names the question a turn waits on).

The rule for approvals, which the sweep once got wrong (a call still being
shown, ``streaming``, passed for an approved one, so a tool ran with nobody
approving it):

    chat's tool call                          resume
    ----------------------------------------  -----------------------------
    absent, streaming, pending-confirmation   none: nobody has decided yet
    running / auth-required / pending-result  approve, with the call's input
    / completed, confirmed by a person or a   (as people may have edited it)
    setting ("user-action", "setting")
    the same, confirmed "not-needed"          none: the confirmation was
                                              skipped, nobody approved it
    cancelled                                 deny, with the person's reason
                                              (the expiry's wording when the
                                              wait expired)
"""

from __future__ import annotations

import json
from typing import Any, Final

from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputRequestPart,
    TextValue,
    ToolCallAuthRequired,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallPendingResultConfirmation,
    ToolCallRunning,
)
from protocol.chat import Turn as ChatTurn
from protocol.wire import Markdown
from reducers.chat import select_input_settlement, select_latest_tool_call
from server.core.policy import same_turn
from server.runner.ids import InputRequestRef, input_request_id, parse_input_request_id
from server.runner.turn import ResumeCommand, SuspensionType, Turn

REPLY: Final = "reply"
"""The question id of a plain-text question's one answer."""

EXPIRED_APPROVAL: Final = "nobody approved it in time: its approval expired"

CONFIRMED_BY_SOMEONE: Final = frozenset({"user-action", "setting"})
"""The confirmations that are somebody's decision; "not-needed" is none."""


def resume_for(
    turn: Turn, state: ChatState, *, data: dict[str, Any] | None = None, expired: bool = False
) -> ResumeCommand | None:
    """The resume chat ``state`` gives waiting ``turn``, or None while its
    wait is unanswered there (or the chat turn it waits in is another's).
    ``data`` is an accepted form's data (the host's word on the answers:
    see :func:`answered_input` for the part to ask it of); ``expired``: the
    session's notes say the approval's wait expired."""
    suspension = turn.suspension
    if suspension is None or not _still_its_own(turn, state):
        return None
    if suspension.type == SuspensionType.USER_INPUT:
        part = answered_input(turn, state)
        opened = None if part is None else parse_input_request_id(part.request.id)
        if part is None or opened is None:
            return None
        return input_command(part, opened, data)
    if suspension.type != SuspensionType.TOOL_APPROVAL:
        return None
    call = select_latest_tool_call(state, turn.chat_turn or "", suspension.correlation_id or "")
    if isinstance(call, ToolCallCancelled):
        if expired:
            skipped = call.reason == "skipped"
            return ResumeCommand.reject_tool(call.tool_call_id, EXPIRED_APPROVAL, skipped=skipped)
        reason = call.reason_message
        text = reason.markdown if isinstance(reason, Markdown) else reason
        return ResumeCommand.reject_tool(call.tool_call_id, text or call.reason)
    decided = (
        ToolCallRunning
        | ToolCallAuthRequired
        | ToolCallPendingResultConfirmation
        | ToolCallCompleted
    )
    if isinstance(call, decided) and call.confirmed in CONFIRMED_BY_SOMEONE:
        return ResumeCommand.approve_tool(
            call.tool_call_id, edited_arguments=_object(call.tool_input)
        )
    return None


def awaits(turn: Turn) -> str | None:
    """The id of the question ``turn`` waits on in its chat: the input
    request it opened, or the tool call waiting for confirmation; None when
    it waits on neither."""
    suspension = turn.suspension
    if suspension is None or turn.chat_turn is None:
        return None
    if suspension.type == SuspensionType.USER_INPUT:
        return input_request_id(turn.chat_turn, suspension.correlation_id)
    if suspension.type == SuspensionType.TOOL_APPROVAL:
        return suspension.correlation_id
    return None


def answered_input(turn: Turn, state: ChatState) -> InputRequestPart | None:
    """The settled input request of ``state`` that answers ``turn``'s
    question, or None (it waits for no input, or nobody has answered)."""
    suspension = turn.suspension
    if suspension is None or suspension.type != SuspensionType.USER_INPUT:
        return None
    if turn.chat_turn is None:
        return None
    settled = select_input_settlement(
        state, input_request_id(turn.chat_turn, suspension.correlation_id)
    )
    return settled.part if settled.status == "resolved" else None


def input_command(
    part: InputRequestPart, opened: InputRequestRef, data: dict[str, Any] | None
) -> ResumeCommand:
    """The resume a settled input request the runner ``opened`` makes;
    ``data`` is an accepted form's (None: the request had no form)."""
    assert part.response is not None
    call = opened.call_id
    if call is None:
        answer = (part.request.answers or {}).get(REPLY)
        text = answer.value.value if answer and isinstance(answer.value, TextValue) else ""
        reply = text if part.response == "accept" else ""
        return ResumeCommand.user_input(reply, question=opened.question_id)
    if part.response == "accept":
        return ResumeCommand.user_input(call, data or {})
    return ResumeCommand.user_input(call, None, response=part.response)


def shows(turn: Turn, chat_turn: ChatTurn | ActiveTurn) -> bool:
    """Whether ``chat_turn`` is the AHP turn the runner's ``turn`` shows: its
    id, and its stamp (a turn id used again after a truncation names
    another chat turn, which the earlier runner's turn must not reach)."""
    return same_turn(chat_turn, turn.chat_turn, turn.chat_turn_stamp)


def ended_turn(state: ChatState, turn: Turn) -> ChatTurn | None:
    """The AHP turn of ``state`` the runner's ``turn`` shows, if it is over
    (not the active one)."""
    if state.active_turn is not None and shows(turn, state.active_turn):
        return None
    return next((t for t in state.turns if shows(turn, t)), None)


def _still_its_own(turn: Turn, state: ChatState) -> bool:
    """Whether the answers in ``state`` may be ``turn``'s: the chat turn it
    waits in is active, or over; not gone (truncated away, its id used by
    another chat turn)."""
    if turn.chat_turn is None or ended_turn(state, turn) is not None:
        return True
    active = state.active_turn
    return active is not None and shows(turn, active)


def _object(text: str | None) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None."""
    if text is None:
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
