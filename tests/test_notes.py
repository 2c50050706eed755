"""The session's notes on its requests (reducers.notes): who wrote each
answer, who completed or decided, when a wait expires; pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from protocol.actions import ChatInputCompleted
from reducers import notes
from reducers.clock import iso_ms, iso_time

CHAT = "ahp-chat:/c"
DANA: dict[str, Any] = {"name": "Dana", "role": "participant", "token": "t-dana"}
LEE: dict[str, Any] = {"name": "Lee", "role": "participant", "token": "t-lee", "declared": True}


def test_an_answer_is_noted_with_its_author_and_state() -> None:
    meta = notes.answered(None, CHAT, "r1", "q1", DANA, "draft")
    assert meta == {
        "huddle": {"requests": {CHAT: {"r1": {"answers": {"q1": {"by": DANA, "state": "draft"}}}}}}
    }


def test_the_same_note_again_changes_nothing() -> None:
    meta = notes.answered(None, CHAT, "r1", "q1", DANA, "draft")
    assert notes.answered(meta, CHAT, "r1", "q1", DANA, "draft") is None


def test_another_author_or_state_changes_the_note_and_keeps_other_metadata() -> None:
    meta = notes.answered({"other": 1}, CHAT, "r1", "q1", DANA, "draft")
    assert meta is not None
    lee = notes.answered(meta, CHAT, "r1", "q1", LEE, "submitted")
    assert lee is not None
    assert lee["other"] == 1
    assert notes.note_of(lee, "requests", CHAT, "r1") == {
        "answers": {"q1": {"by": LEE, "state": "submitted"}}
    }
    assert notes.note_of(meta, "requests", CHAT, "r1") == {
        "answers": {"q1": {"by": DANA, "state": "draft"}}
    }  # the input is not changed


def test_a_cleared_answer_loses_its_note() -> None:
    meta = notes.answered(None, CHAT, "r1", "q1", DANA, "draft")
    cleared = notes.unanswered(meta, CHAT, "r1", "q1")
    assert notes.note_of(cleared, "requests", CHAT, "r1") == {"answers": {}}
    assert notes.unanswered(cleared, CHAT, "r1", "q1") is None


def test_completion_and_decision_are_noted() -> None:
    meta = notes.completed(None, CHAT, "r1", LEE, "accept")
    meta = notes.decided(meta, CHAT, "call-1", DANA, False)
    assert notes.note_of(meta, "requests", CHAT, "r1") == {
        "completed": {"by": LEE, "response": "accept"}
    }
    assert notes.note_of(meta, "toolCalls", CHAT, "call-1") == {
        "decided": {"by": DANA, "approved": False}
    }


def test_an_expiry_is_noted_and_read_back() -> None:
    meta = notes.expiring(None, "requests", CHAT, "r1", 5000, "decline")
    assert notes.expiry_of(meta, "requests", CHAT, "r1", None) == (5000, "decline")
    assert notes.expiring(meta, "requests", CHAT, "r1", 5000, "decline") is None
    later = notes.expiring(meta, "requests", CHAT, "r1", 6000, "decline")
    assert notes.expiry_of(later, "requests", CHAT, "r1", None) == (6000, "decline")
    assert notes.expiry_of(meta, "requests", CHAT, "r2", None) is None
    assert (
        notes.expiry_of(
            notes.completed(None, CHAT, "r3", DANA, "cancel"), "requests", CHAT, "r3", None
        )
        is None
    )


def test_the_oldest_notes_of_a_chat_go_first() -> None:
    meta: dict[str, Any] | None = None
    for n in range(notes.KEPT + 5):
        meta = notes.completed(meta, CHAT, f"r{n}", DANA, "accept")
    kept = meta["huddle"]["requests"][CHAT]  # type: ignore[index]
    assert len(kept) == notes.KEPT
    assert "r0" not in kept
    assert f"r{notes.KEPT + 4}" in kept


def test_a_note_touched_again_is_the_newest() -> None:
    meta = notes.completed(None, CHAT, "r1", DANA, "accept")
    meta = notes.completed(meta, CHAT, "r2", DANA, "accept")
    meta = notes.answered(meta, CHAT, "r1", "q", DANA, "draft")
    assert list(meta["huddle"]["requests"][CHAT]) == ["r2", "r1"]  # type: ignore[index]


def test_notes_of_something_not_a_mapping_are_absent() -> None:
    meta = {"huddle": {"requests": {CHAT: {"r1": "not a note"}}}}
    assert notes.note_of(meta, "requests", CHAT, "r1") is None
    assert notes.note_of(None, "requests", CHAT, "r1") is None


def test_an_answer_after_the_expiry_is_rejected_as_expired() -> None:
    from protocol.actions import (
        ChatInputAnswerChanged,
        ChatInputCompleted,
        ChatToolCallConfirmed,
        ChatTurnStarted,
    )
    from protocol.chat import Message, MessageOrigin
    from protocol.rejections import RejectionCode

    meta = notes.expiring(None, "requests", CHAT, "r1", 1000, "cancel")
    meta = notes.expiring(meta, "toolCalls", CHAT, "call", 5000, "decline")
    answer = ChatInputAnswerChanged(request_id="r1", question_id="q")
    completion = ChatInputCompleted(request_id="r1", response="accept")
    denial = ChatToolCallConfirmed(
        turn_id="t", tool_call_id="call", approved=False, reason="denied"
    )
    other = ChatInputCompleted(request_id="r2", response="accept")
    turn = ChatTurnStarted(
        turn_id="t", started_at="x", message=Message(text="", origin=MessageOrigin(kind="user"))
    )

    assert notes.expired_wait(meta, CHAT, answer, 999, turn=None) is None  # in time
    late = notes.expired_wait(meta, CHAT, answer, 1000, turn=None)
    assert late is not None
    assert late.code == RejectionCode.EXPIRED
    assert late.sentence == (
        "the input request 'r1' expired at 1970-01-01T00:00:01.000Z and takes no answer any more"
    )
    assert notes.expired_wait(meta, CHAT, completion, 2000, turn=None) is not None
    assert notes.expired_wait(meta, CHAT, denial, 2000, turn=None) is None
    assert notes.expired_wait(meta, CHAT, other, 2000, turn=None) is None  # no expiry of its own
    assert notes.expired_wait(meta, CHAT, turn, 9000, turn=None) is None  # not an answer
    fired = notes.expired(meta, "toolCalls", CHAT, "call")
    assert (
        notes.expired_wait(fired, CHAT, denial, 0, turn=None) is not None
    )  # applied: late whatever the clock
    assert notes.expired(fired, "toolCalls", CHAT, "call") is None  # noted already
    bare = notes.expired(None, "requests", CHAT, "r9")
    said = notes.expired_wait(
        bare, CHAT, ChatInputCompleted(request_id="r9", response="accept"), 0, turn=None
    )
    assert said is not None
    assert " at " not in said.sentence


def test_an_iso_time_reads_back_as_the_ms_it_was_written_from() -> None:
    assert iso_ms(iso_time(1_764_000_000_123), 0) == 1_764_000_000_123
    assert iso_ms("2026-12-01T10:00:00+01:00", 0) == iso_ms("2026-12-01T09:00:00.000Z", 0)


def test_a_time_without_a_zone_is_utc_and_one_that_is_no_time_the_fallback() -> None:
    assert iso_ms("1970-01-01T00:00:01", 0) == 1000
    assert iso_ms("next tuesday", -1) == -1


def test_huddle_meta_reads_one_key_and_nothing_from_what_is_not_huddles() -> None:
    assert notes.huddle_meta({"huddle": {"session": "s"}, "other": 1}, "session") == "s"
    assert notes.huddle_meta({"huddle": "not an object"}, "session") is None
    assert notes.huddle_meta(None, "session") is None


# ─── The bound (notes.bounded) ───────────────────────────────────────────────


def chats_of(meta: Any, family: str = "requests") -> dict[str, list[str]]:
    """Per chat the keys of its notes, in order."""
    return {chat: list(keyed) for chat, keyed in (notes.huddle_meta(meta, family) or {}).items()}


def settled_in(chats: list[str], count: int, meta: Any = None) -> Any:
    """``count`` completed requests in each of ``chats``, one chat after the other."""
    for chat in chats:
        for n in range(count):
            meta = notes.completed(meta, chat, f"r{n}", DANA, "accept")
    return meta


def test_notes_within_the_bound_are_left_as_they_are() -> None:
    meta = settled_in(["a", "b"], 3)
    assert notes.bounded(meta, notes.notes_bytes(meta), "b") is meta


def test_beyond_the_bound_the_chat_noted_least_recently_loses_its_notes_first() -> None:
    meta = settled_in(["a", "b", "c"], 4, {"other": 1})
    before = copy.deepcopy(meta)
    budget = notes.notes_bytes(meta) - 1

    bounded = notes.bounded(meta, budget, "c")

    assert notes.notes_bytes(bounded) <= budget
    assert chats_of(bounded) == {
        "a": ["r1", "r2", "r3"],
        "b": ["r0", "r1", "r2", "r3"],
        "c": ["r0", "r1", "r2", "r3"],
    }
    assert bounded is not None
    assert bounded["other"] == 1
    assert meta == before  # the input is not changed


def test_a_chat_whose_notes_all_go_is_gone_and_the_chat_just_noted_keeps_its_newest() -> None:
    meta = settled_in(["a", "b"], 4)
    meta = notes.decided(meta, "b", "call-1", LEE, True)
    budget = notes.notes_bytes(
        notes.decided(notes.completed(None, "b", "r3", DANA, "accept"), "b", "call-1", LEE, True)
    )

    bounded = notes.bounded(meta, budget, "b")

    assert chats_of(bounded) == {"b": ["r3"]}
    assert chats_of(bounded, "toolCalls") == {"b": ["call-1"]}
    assert notes.bounded(meta, budget - 1, "b") is None  # even those do not fit


def test_a_chats_requests_and_tool_calls_lose_their_oldest_in_turn() -> None:
    meta = None
    for n in range(3):
        meta = notes.completed(meta, "a", f"r{n}", DANA, "accept")
        meta = notes.decided(meta, "a", f"c{n}", DANA, True)
    meta = notes.completed(meta, "b", "r0", DANA, "accept")
    whole = notes.notes_bytes(meta)

    bounded = notes.bounded(meta, whole - 1, "b")
    assert chats_of(bounded)["a"] == ["r1", "r2"]
    assert chats_of(bounded, "toolCalls")["a"] == ["c0", "c1", "c2"]
    less = notes.bounded(meta, notes.notes_bytes(bounded) - 1, "b")
    assert chats_of(less)["a"] == ["r1", "r2"]
    assert chats_of(less, "toolCalls")["a"] == ["c1", "c2"]


def test_what_still_waits_keeps_its_notes_until_every_settled_one_is_gone() -> None:
    meta = notes.answered(None, "a", "open", "q", LEE, "draft")
    meta = notes.expiring(meta, "toolCalls", "a", "call", 5000, "decline")
    meta = settled_in(["a", "b"], 3, meta)
    meta = notes.decided(meta, "b", "done", DANA, False)
    waiting = notes.notes_bytes(
        notes.expiring(
            notes.answered(None, "a", "open", "q", LEE, "draft"),
            "toolCalls",
            "a",
            "call",
            5000,
            "decline",
        )
    )
    newest = notes.notes_bytes(
        notes.decided(notes.completed(None, "b", "r2", DANA, "accept"), "b", "done", DANA, False)
    )

    bounded = notes.bounded(meta, waiting + newest + 4, "b")

    assert chats_of(bounded) == {"a": ["open"], "b": ["r2"]}
    assert chats_of(bounded, "toolCalls") == {"a": ["call"], "b": ["done"]}


def test_a_chat_noted_anew_goes_last_in_both_families() -> None:
    meta = notes.decided(None, "a", "call", DANA, True)
    meta = notes.decided(meta, "b", "call", DANA, True)
    meta = notes.completed(meta, "b", "r", DANA, "accept")
    meta = notes.completed(meta, "a", "r", DANA, "accept")
    assert list(chats_of(meta)) == ["b", "a"]
    assert list(chats_of(meta, "toolCalls")) == ["b", "a"]


def test_a_note_shares_what_it_does_not_change_with_the_meta_it_came_from() -> None:
    meta = settled_in(["a", "b"], 2)
    new = notes.answered(meta, "b", "r1", "q", LEE, "draft")
    assert new is not None
    assert new["huddle"]["requests"]["a"] is meta["huddle"]["requests"]["a"]
    assert notes.note_of(meta, "requests", "b", "r1") == {
        "completed": {"by": DANA, "response": "accept"}
    }


def test_the_rest_of_the_meta_is_measured_whatever_its_shape() -> None:
    assert notes.other_bytes(None) == notes.other_bytes({}) == 0
    assert notes.other_bytes({"x": 1}) == len(b'{"x":1}')
    assert notes.other_bytes({"huddle": "not ours"}) == len(b'{"huddle":"not ours"}')
    noted = notes.completed({"x": 1}, "a", "r", DANA, "accept")
    assert notes.other_bytes(noted) == len(b'{"x":1,"huddle":{}}')


@pytest.mark.parametrize(
    ("requests", "tool_calls", "merged"),
    [
        (["a", "c"], ["b", "a", "d", "c"], ["b", "a", "d", "c"]),  # each as noted
        (["a", "c"], ["c", "a"], ["a", "c"]),  # out of step: the first family leads
        (["a", "a"], ["a"], ["a"]),  # once each
        ([], ["b"], ["b"]),
    ],
)
def test_the_chats_of_both_families_least_recently_noted_first(
    requests: list[str], tool_calls: list[str], merged: list[str]
) -> None:
    assert notes._merged(requests, tool_calls) == merged


def test_a_note_is_of_its_turns_wait_and_another_turns_replaces_it() -> None:
    # Ids are unique within a turn only: a turn truncated away and the next
    # may both ask "r1". A note of the old turn written late is read by
    # neither the new wait's deadline nor its authors.
    old = notes.expiring(None, "requests", CHAT, "r1", 5000, "fail", turn="aaaaaaaa")
    old = notes.answered(old, CHAT, "r1", "q", DANA, "draft", turn="aaaaaaaa")
    assert notes.note_of(old, "requests", CHAT, "r1") == {
        "turn": "aaaaaaaa",
        "expiresAt": 5000,
        "onExpiry": "fail",
        "answers": {"q": {"by": DANA, "state": "draft"}},
    }
    assert notes.expiry_of(old, "requests", CHAT, "r1", "aaaaaaaa") == (5000, "fail")
    assert notes.expiry_of(old, "requests", CHAT, "r1", "bbbbbbbb") is None
    assert notes.note_for(old, "requests", CHAT, "r1", None) is None
    late = ChatInputCompleted(request_id="r1", response="accept")
    assert notes.expired_wait(old, CHAT, late, 9000, turn="bbbbbbbb") is None
    assert notes.expired_wait(old, CHAT, late, 9000, turn="aaaaaaaa") is not None
    # Nothing of the new turn's to clear; a note of it replaces the old one.
    assert notes.unanswered(old, CHAT, "r1", "q", turn="bbbbbbbb") is None
    new = notes.answered(old, CHAT, "r1", "q", LEE, "draft", turn="bbbbbbbb")
    assert notes.note_of(new, "requests", CHAT, "r1") == {
        "turn": "bbbbbbbb",
        "answers": {"q": {"by": LEE, "state": "draft"}},
    }
    # A note that names no turn (unstamped, or from before) is any turn's.
    bare = notes.decided(None, CHAT, "c1", DANA, True)
    assert notes.note_for(bare, "toolCalls", CHAT, "c1", "aaaaaaaa") is not None
    adopted = notes.expiring(bare, "toolCalls", CHAT, "c1", 7000, "cancel", turn="aaaaaaaa")
    assert notes.note_of(adopted, "toolCalls", CHAT, "c1") == {
        "decided": {"by": DANA, "approved": True},
        "turn": "aaaaaaaa",
        "expiresAt": 7000,
        "onExpiry": "cancel",
    }


def test_a_truncation_forgets_the_notes_of_the_turns_it_took_away_only() -> None:
    meta = notes.decided(None, CHAT, "c1", DANA, True, turn="aaaaaaaa")  # a kept turn's
    meta = notes.completed(meta, CHAT, "r1", DANA, "accept", turn="bbbbbbbb")
    meta = notes.completed(meta, CHAT, "r2", DANA, "accept")  # names no turn

    left = notes.forgotten(meta, CHAT, ["r1", "r2"], ["c1"], {"bbbbbbbb"})

    assert left is not None
    assert notes.note_of(left, "toolCalls", CHAT, "c1") is not None
    assert notes.note_of(left, "requests", CHAT, "r1") is None
    assert notes.note_of(left, "requests", CHAT, "r2") is None
    assert notes.forgotten(left, CHAT, [], ["c1"], {"bbbbbbbb", None}) is None


def test_the_notes_of_waits_truncated_away_are_forgotten_and_the_rest_kept() -> None:
    meta = notes.completed({"other": 1}, CHAT, "r1", DANA, "accept")
    meta = notes.completed(meta, CHAT, "r2", DANA, "accept")
    meta = notes.decided(meta, CHAT, "c1", LEE, True)
    meta = notes.decided(meta, "ahp-chat:/other", "c1", LEE, True)

    kept = notes.forgotten(meta, CHAT, ["r1"], ["c1"])

    assert kept is not None
    assert kept["other"] == 1
    assert notes.note_of(kept, "requests", CHAT, "r1") is None
    assert notes.note_of(kept, "requests", CHAT, "r2") is not None
    assert notes.note_of(kept, "toolCalls", CHAT, "c1") is None
    assert notes.note_of(kept, "toolCalls", "ahp-chat:/other", "c1") is not None
    gone = notes.forgotten(kept, CHAT, ["r2"], [])
    assert gone is not None
    assert "requests" not in gone["huddle"]  # no chat has request notes left
    assert notes.forgotten(gone, CHAT, ["r2"], ["c9"]) is None  # nothing of them is left
    alone = notes.forgotten(notes.completed(None, CHAT, "r1", DANA, "accept"), CHAT, ["r1"], [])
    assert alone == {"huddle": {}}
