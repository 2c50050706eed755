"""How fast the chat reducer applies the two hottest live actions.

    .venv/bin/python -m bench.reducers [--quick] [--rounds N] [--batch-ms MS]

``chat/inputAnswerChanged`` (people co-editing an input request) and
``chat/delta`` (an agent streaming markdown) are applied by
``reduce_chat(state, action, now_ms)`` to a chat whose active turn holds an
open input request and a markdown part. Every call starts from the same
state, so each timed call does the same work.

Printed: actions per second of each kind, and two ratios measured in the same
run, in interleaved rounds (A, B, A, B ... with the order flipped every other
round) whose medians are compared, so that machine noise hits both sides
alike:

(a) cost per action with 10,000 completed turns in the chat versus none
    (goal: at most 1.2, so that history never slows a live turn);
(b) cost of ``chat/inputAnswerChanged`` with 1,000 answers in the request
    versus 10 (informational: no goal is set).
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import time
from dataclasses import dataclass

from protocol.actions import ChatAction, ChatDelta, ChatInputAnswerChanged
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    MarkdownPart,
    Message,
    MessageOrigin,
    ResponsePart,
    TextQuestion,
    TextValue,
    Turn,
    UserOrigin,
)
from protocol.status import SessionStatus
from reducers.chat import reduce_chat

HISTORY_GOAL = 1.2
NOW_MS = 1_785_000_000_000
TURN_ID = "live"
REQUEST_ID = "details"
PART_ID = "reply"


# ─── States and actions ──────────────────────────────────────────────────────


def _message(text: str) -> Message:
    return Message(text=text, origin=MessageOrigin(kind="user"))


def _draft(text: str) -> InputAnswer:
    return InputAnswer(state="draft", value=TextValue(value=text))


def _request(answers: int, *, resolved_id: str | None = None) -> InputRequest:
    """A request with ``answers`` text questions, each with a draft answer."""
    questions = [TextQuestion(id=f"q{i}", message=f"Question {i}?") for i in range(answers)]
    return InputRequest(
        id=resolved_id or REQUEST_ID,
        message="Tell us about the outage",
        questions=list(questions),
        answers={f"q{i}": _draft(f"draft {i}") for i in range(answers)},
    )


def _completed_turn(index: int) -> Turn:
    """A finished turn like the ones a real chat piles up: a question, a
    streamed reply and an answered input request."""
    parts: list[ResponsePart] = [
        MarkdownPart(id=f"md-{index}", content=f"Looking into request {index}. " * 4),
        InputRequestPart(request=_request(3, resolved_id=f"req-{index}"), response="accept"),
    ]
    return Turn(
        id=f"turn-{index}",
        started_at="2026-07-28T10:00:00.000Z",
        duration=1200,
        message=_message(f"Question number {index}"),
        response_parts=parts,
        state="complete",
    )


def chat_with(turns: int, answers: int) -> ChatState:
    """A chat with ``turns`` completed turns and an active turn holding a
    markdown part and an open input request with ``answers`` drafts."""
    active = ActiveTurn(
        id=TURN_ID,
        started_at="2026-07-28T10:00:00.000Z",
        message=_message("Users cannot log in"),
        response_parts=[
            MarkdownPart(id=PART_ID, content="Let me check the login service. "),
            InputRequestPart(request=_request(answers)),
        ],
    )
    return ChatState(
        resource="ahp-chat:/bench",
        title="Bench",
        status=SessionStatus.INPUT_NEEDED,
        modified_at="2026-07-28T10:00:00.000Z",
        origin=UserOrigin(),
        turns=[_completed_turn(i) for i in range(turns)],
        active_turn=active,
    )


ANSWER_CHANGED = ChatInputAnswerChanged(
    request_id=REQUEST_ID, question_id="q1", answer=_draft("the login service")
)
DELTA = ChatDelta(turn_id=TURN_ID, part_id=PART_ID, content="more text ")


# ─── Timing ──────────────────────────────────────────────────────────────────


@dataclass
class Case:
    """One (state, action) pair; ``samples`` are seconds per action, one a round."""

    name: str
    state: ChatState
    action: ChatAction
    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


def _check(case: Case) -> None:
    """Fail loudly when the action would be a no-op (the bench would then
    time the early return, not the work)."""
    after = reduce_chat(case.state, case.action, NOW_MS)
    if after is case.state:
        raise SystemExit(f"{case.name}: the action is a no-op on its state")


def _time_batch(case: Case, calls: int) -> float:
    reduce, state, action, now = reduce_chat, case.state, case.action, NOW_MS
    start = time.perf_counter()
    for _ in range(calls):
        reduce(state, action, now)
    return (time.perf_counter() - start) / calls


def _calls_per_batch(case: Case, batch_seconds: float) -> int:
    calls = 1
    while True:
        start = time.perf_counter()
        _time_batch(case, calls)
        elapsed = time.perf_counter() - start
        if elapsed >= batch_seconds / 4 or calls >= 1 << 24:
            return max(1, int(calls * batch_seconds / max(elapsed, 1e-9)))
        calls *= 2


def run_rounds(cases: list[Case], rounds: int, batch_seconds: float) -> None:
    """Time every case once a round, in interleaved order; every case does
    the same number of calls a batch, sized so the slowest takes one batch."""
    calls = min(_calls_per_batch(case, batch_seconds) for case in cases)
    for case in cases:  # warm-up: caches, allocator pools
        _time_batch(case, calls)
    for index in range(rounds):
        order = cases if index % 2 == 0 else list(reversed(cases))
        for case in order:
            case.samples.append(_time_batch(case, calls))


# ─── Report ──────────────────────────────────────────────────────────────────


def _verdict(ratio: float, goal: float | None) -> str:
    if goal is None:
        return "goal: none set (informational)"
    return f"goal: <= {goal:.2f}  met: {'yes' if ratio <= goal else 'NO'}"


def _ratio_line(label: str, slow: Case, fast: Case, goal: float | None) -> str:
    ratio = slow.median / fast.median
    return f"  {label:<58} ratio {ratio:6.3f}   {_verdict(ratio, goal)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reducers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 101; quick 7)")
    parser.add_argument("--batch-ms", type=float, help="ms per timed batch (default 30; quick 5)")
    parser.add_argument("--history", type=int, default=10_000, help="completed turns (10000)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (7 if args.quick else 101)
    batch_seconds = (args.batch_ms or (5.0 if args.quick else 30.0)) / 1000
    history = args.history

    built = time.perf_counter()
    empty, full, many = chat_with(0, 10), chat_with(history, 10), chat_with(0, 1_000)
    built = time.perf_counter() - built
    cases = {
        "delta/0": Case("chat/delta, 0 turns", empty, DELTA, []),
        "delta/H": Case(f"chat/delta, {history} turns", full, DELTA, []),
        "answer/0": Case("chat/inputAnswerChanged, 0 turns, 10 answers", empty, ANSWER_CHANGED, []),
        "answer/H": Case(
            f"chat/inputAnswerChanged, {history} turns, 10 answers", full, ANSWER_CHANGED, []
        ),
        "answer/1000": Case(
            "chat/inputAnswerChanged, 0 turns, 1000 answers", many, ANSWER_CHANGED, []
        ),
    }
    for case in cases.values():
        _check(case)
    gc.collect()
    started = time.perf_counter()
    run_rounds(list(cases.values()), rounds, batch_seconds)
    elapsed = time.perf_counter() - started

    print("bench.reducers: reduce_chat on a chat with an active turn")
    print(
        f"  python {platform.python_version()}, {rounds} interleaved rounds of "
        f"{batch_seconds * 1000:.0f} ms batches, {elapsed:.1f} s timed "
        f"(states built in {built:.1f} s){', QUICK' if args.quick else ''}"
    )
    print("actions per second (median of rounds):")
    for case in cases.values():
        spread = statistics.quantiles(case.samples, n=10) if len(case.samples) > 1 else []
        noise = f"(p10-p90 {1 / spread[-1]:>10,.0f} - {1 / spread[0]:>10,.0f})" if spread else ""
        print(f"  {case.name:<58} {1 / case.median:>10,.0f} /s  {noise}")
    print("ratios (same run, medians of interleaved rounds):")
    print(
        _ratio_line(
            f"(a) chat/delta: {history} turns vs 0",
            cases["delta/H"],
            cases["delta/0"],
            HISTORY_GOAL,
        )
    )
    print(
        _ratio_line(
            f"(a) chat/inputAnswerChanged: {history} turns vs 0",
            cases["answer/H"],
            cases["answer/0"],
            HISTORY_GOAL,
        )
    )
    print(
        _ratio_line(
            "(b) chat/inputAnswerChanged: 1000 answers vs 10",
            cases["answer/1000"],
            cases["answer/0"],
            None,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
