"""The chat's selectors that every waiter shares: how an input request
stands, and the newest state of a tool call."""

from __future__ import annotations

from msgspec.structs import replace

from protocol.actions import (
    ChatAction,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnComplete,
    ChatTurnStarted,
)
from protocol.chat import (
    ChatState,
    InputRequest,
    Message,
    MessageOrigin,
    TextQuestion,
    ToolCallCancelled,
    ToolCallPendingConfirmation,
)
from protocol.status import SessionStatus
from reducers.aggregate import (
    catalog_changes,
    chat_summary,
    input_entry_id,
    select_settled_entries,
)
from reducers.chat import (
    reduce_chat,
    select_input_settlement,
    select_latest_input_part,
    select_latest_tool_call,
    select_truncated,
    select_waits,
)

ASK = Message(text="Open a ticket", origin=MessageOrigin(kind="user"))
REQUEST = InputRequest(id="details", questions=[TextQuestion(id="system", message="Which?")])
EMPTY = ChatState(
    resource="ahp-chat:/c", title="Chat", status=SessionStatus.IDLE, modified_at="t0", turns=[]
)


def chat(*actions: ChatAction) -> ChatState:
    state = EMPTY
    for action in actions:
        state = reduce_chat(state, action, 1)
    return state


def started(turn_id: str = "t1") -> ChatTurnStarted:
    return ChatTurnStarted(turn_id=turn_id, started_at="t", message=ASK)


ASKED = (started(), ChatInputRequested(request=REQUEST))
ENDED = ChatTurnComplete(turn_id="t1", duration=1)


def test_a_request_never_asked_is_gone() -> None:
    settled = select_input_settlement(chat(started()), "details")
    assert settled.status == "gone"
    assert settled.part is None


def test_a_request_waiting_in_the_active_turn_is_open() -> None:
    settled = select_input_settlement(chat(*ASKED), "details")
    assert settled.status == "open"
    assert settled.part is not None
    assert settled.part.request.id == "details"


def test_a_completed_request_is_resolved_with_its_response() -> None:
    done = ChatInputCompleted(request_id="details", response="decline")
    settled = select_input_settlement(chat(*ASKED, done), "details")
    assert settled.status == "resolved"
    assert settled.part is not None
    assert settled.part.response == "decline"


def test_a_resolved_request_stays_resolved_after_its_turn_ends() -> None:
    done = ChatInputCompleted(request_id="details", response="accept")
    settled = select_input_settlement(chat(*ASKED, done, ENDED, started("t2")), "details")
    assert settled.status == "resolved"


def test_a_request_whose_turn_ended_unanswered_is_gone_with_its_part() -> None:
    settled = select_input_settlement(chat(*ASKED, ENDED), "details")
    assert settled.status == "gone"
    assert settled.part is not None
    assert settled.part.response is None


def test_the_newest_state_of_a_tool_call_is_found_in_its_own_turn() -> None:
    ready = ChatToolCallReady(
        turn_id="t1", tool_call_id="c1", invocation_message="Run?", tool_input="{}"
    )
    start = ChatToolCallStart(turn_id="t1", tool_call_id="c1", tool_name="run", display_name="Run")
    waiting = chat(started(), start, ready)
    assert isinstance(select_latest_tool_call(waiting, "t1", "c1"), ToolCallPendingConfirmation)
    denied = ChatToolCallConfirmed(turn_id="t1", tool_call_id="c1", approved=False, reason="denied")
    finished = chat(started(), start, ready, denied, ENDED)
    assert isinstance(select_latest_tool_call(finished, "t1", "c1"), ToolCallCancelled)
    assert select_latest_tool_call(finished, "t2", "c1") is None
    assert select_latest_tool_call(finished, "t1", "c2") is None


def test_the_latest_input_part_is_found_open_or_resolved_in_any_turn() -> None:
    asked = chat(*ASKED)
    assert select_latest_input_part(asked, "details") is not None
    assert select_latest_input_part(asked, "other") is None
    done = ChatInputCompleted(request_id="details", response="accept")
    part = select_latest_input_part(chat(*ASKED, done, ENDED), "details")
    assert part is not None
    assert part.response == "accept"


# ─── What a truncation takes away ────────────────────────────────────────────


def test_a_truncation_takes_the_turns_after_its_turn_and_the_active_one() -> None:
    start = ChatToolCallStart(turn_id="t2", tool_call_id="c1", tool_name="run", display_name="Run")
    state = chat(
        *ASKED,
        ENDED,
        started("t2"),
        start,
        ChatTurnComplete(turn_id="t2", duration=1),
        started("t3"),
    )
    assert [t.id for t in select_truncated(state, ChatTruncated(turn_id="t1"))] == ["t2", "t3"]
    assert [t.id for t in select_truncated(state, ChatTruncated())] == ["t1", "t2", "t3"]
    assert select_truncated(state, ChatTruncated(turn_id="unknown")) == []  # the reducer keeps all
    assert select_waits(select_truncated(state, ChatTruncated())) == (["details"], ["c1"])


# ─── What a session lists of the chat that is out of date ────────────────────


def test_a_session_entry_is_settled_when_the_chat_holds_its_block_closed() -> None:
    asked, answered = (
        chat(*ASKED),
        chat(*ASKED, ChatInputCompleted(request_id="q", response="cancel")),
    )
    done = chat(*ASKED, ChatInputCompleted(request_id="details", response="cancel"), ENDED)
    entry = input_entry_id(EMPTY.resource, "input", "details")
    opened_elsewhere = input_entry_id(EMPTY.resource, "tool", "c9")

    assert select_settled_entries(asked, [entry, opened_elsewhere]) == []  # still open; unknown
    assert select_settled_entries(answered, [entry]) == []
    assert select_settled_entries(done, [entry, opened_elsewhere]) == [entry]


def test_a_catalog_entry_differs_from_its_chat_in_summary_fields_besides_modified_at() -> None:
    entry = chat_summary(chat(started()))  # in progress
    later = replace(chat(started(), ENDED), modified_at="t9")

    assert catalog_changes(entry, later) == {"status": later.status, "modified_at": "t9"}
    assert catalog_changes(entry, replace(chat(started()), modified_at="t9")) == {}
