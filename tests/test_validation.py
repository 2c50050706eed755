"""The host's validation rules, run from the shared fixtures.

Every case of ``tests/fixtures/validation/*.json`` (the format and what is
checked are in the ``README.md`` there) runs here through
:mod:`reducers.validation`, and through ``web/validation.js`` in
``web/test/validation.test.mjs``: the same files and the same checks, the
sentence word for word. A new case goes into a fixture file, not into a test.

Python only, at the bottom and marked so: the server's JSON Schema checks
(``form_check``, ``tool_input_check``; the browser never holds the schemas),
which take their states and actions from shared cases by id, and which tool
calls a client may complete (``client_action_problem``, which has no
JavaScript port).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from protocol.actions import (
    ChatInputCompleted,
    StateAction,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputQuestion,
    InputRequest,
    InputRequestPart,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from protocol.codec import convert_state, to_builtins
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import SessionState
from reducers.fixtures import AHP_FIXTURE_NOW_MS, run_fixture, strip_nulls
from reducers.validation import (
    VALIDATION_CODES,
    answer_problem,
    reject_reason,
)

FIXTURES = Path(__file__).parent / "fixtures" / "validation"
SECRET = "hunter2"
"""No sentence may contain it; fixtures write it into values that must not leak."""
VALUE_KINDS = frozenset({"text", "number", "boolean", "selected", "selected-many"})
REJECTION_CASE = frozenset({"id", "note", "state", "session", "action", "expected"})
ANSWER_CASE = frozenset({"id", "note", "question", "answer", "requestId", "expected"})


# ─── The shared cases ────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Case:
    """One case of a fixture file, as written (wire JSON)."""

    file: str
    raw: dict[str, Any]
    reducer: str | None
    state: Any  # the wire JSON of its named state; None for an answer case
    session: Any  # the wire JSON of its named session state; None when it names none

    @property
    def id(self) -> str:
        return str(self.raw["id"])


def load_files() -> dict[str, Any]:
    return {
        path.stem: json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(FIXTURES.glob("*.json"))
    }


def load_cases() -> list[Case]:
    cases: list[Case] = []
    for name, data in load_files().items():
        states, sessions = data.get("states", {}), data.get("sessions", {})
        for raw in data["cases"]:
            state = states[raw["state"]] if "state" in raw else None
            session = sessions[raw["session"]] if "session" in raw else None
            cases.append(Case(name, raw, data.get("reducer"), state, session))
    return cases


CASES = load_cases()
SHARED = {case.id: case for case in CASES}


def decoded(case: Case) -> tuple[ChannelState, StateAction]:
    """The state and action of a rejection case, as the host holds them."""
    assert case.reducer is not None
    state = convert_state(strip_nulls(case.state), case.reducer)
    action: StateAction = msgspec.convert(strip_nulls(case.raw["action"]), StateAction)
    return state, action


def decoded_session(case: Case) -> SessionState | None:
    """The state of the chat's session a case names, as the host holds it."""
    if case.session is None:
        return None
    session = convert_state(strip_nulls(case.session), "session")
    assert isinstance(session, SessionState)
    return session


def expected(case: Case) -> Rejection | None:
    want = case.raw["expected"]
    return None if want is None else Rejection(RejectionCode(want["code"]), want["sentence"])


def carried_values(value: Any) -> list[str]:
    """Every answer value, free-form value, tool input and edited tool input
    in ``value`` (wire JSON), as text; the same walk as the JS runner's."""
    found: list[str] = []
    if isinstance(value, list):
        for item in value:
            found.extend(carried_values(item))
    if not isinstance(value, dict):
        return found
    if value.get("kind") in VALUE_KINDS and "value" in value:
        found.extend(leaf_texts(value["value"]))
        found.extend(leaf_texts(value.get("freeformValues")))
    for key in ("toolInput", "editedToolInput"):
        if isinstance(value.get(key), str):
            found.append(value[key])
    for member in value.values():
        found.extend(carried_values(member))
    return found


def leaf_texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, str)]
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return [json.dumps(value)]
    return []


def assert_leaks_nothing(sentence: str, *carriers: Any) -> None:
    assert SECRET not in sentence
    for text in carried_values(list(carriers)):
        if len(text) >= 3:
            assert text not in sentence, f"the sentence quotes {text!r}"


@pytest.mark.parametrize("case", CASES, ids=[f"{case.file}/{case.id}" for case in CASES])
def test_shared_case(case: Case) -> None:
    raw = case.raw
    if "action" in raw:
        state, action = decoded(case)
        session = decoded_session(case)
        got = reject_reason(state, action, session=session)
        # Read back after the check: the rule left all three as they were
        # (the host keeps this state when it rejects), and the decode lost
        # nothing.
        assert to_builtins(state) == strip_nulls(case.state)
        assert msgspec.to_builtins(action) == strip_nulls(raw["action"])
        if session is not None:
            assert to_builtins(session) == strip_nulls(case.session)
        carriers = [case.state, case.session, raw["action"]]
    else:
        question: InputQuestion = msgspec.convert(strip_nulls(raw["question"]), InputQuestion)
        answer = msgspec.convert(strip_nulls(raw["answer"]), InputAnswer)
        got = answer_problem(question, answer, request_id=raw.get("requestId"))
        assert msgspec.to_builtins(question) == strip_nulls(raw["question"])
        assert msgspec.to_builtins(answer) == strip_nulls(raw["answer"])
        carriers = [raw["answer"]]
    assert got == expected(case)
    if got is not None:
        assert_leaks_nothing(got.sentence, *carriers)


def test_every_case_has_a_unique_id_and_one_shape() -> None:
    assert len(SHARED) == len(CASES)
    for case in CASES:
        keys = case.raw.keys()
        assert keys <= REJECTION_CASE or keys <= ANSWER_CASE, case.id
        assert "expected" in keys, case.id
        assert {"state", "action"} <= keys or {"question", "answer"} <= keys, case.id


def test_every_file_describes_its_rules_and_uses_every_state() -> None:
    for name, data in load_files().items():
        assert data["description"], name
        used = {case["state"] for case in data["cases"] if "state" in case}
        assert set(data.get("states", {})) == used, name
        assert ("reducer" in data) is bool(used), name
        sessions = {case["session"] for case in data["cases"] if "session" in case}
        assert set(data.get("sessions", {})) == sessions, name
        if sessions:
            assert data["reducer"] == "chat", name


def test_every_validation_code_has_a_case() -> None:
    shared = {case.raw["expected"]["code"] for case in CASES if case.raw["expected"]}
    python_only = {RejectionCode.FORM_INVALID}  # the form's JSON Schema, below
    assert shared | python_only == VALIDATION_CODES


# ─── Python only: the server's JSON Schema checks ────────────────────────────
# form_check and tool_input_check are the server's jsonschema checks, which the
# browser cannot run. These take a shared case and add the check.


def refuse_everything(*_: Any) -> str:
    return "field `age`: minimum"


def accept_everything(*_: Any) -> None:
    return None


def test_an_edited_input_the_tool_schema_accepts_is_accepted() -> None:
    state, action = decoded(SHARED["edited-input-is-a-json-object"])
    assert reject_reason(state, action, tool_input_check=accept_everything) is None


def test_an_edited_input_the_tool_schema_refuses_is_rejected() -> None:
    case = SHARED["edited-input-is-a-json-object"]
    state, action = decoded(case)
    got = reject_reason(state, action, tool_input_check=refuse_everything)
    assert got == Rejection(
        RejectionCode.INVALID_TOOL_INPUT,
        "the edited input of tool call 'call-1' does not fit the input schema of tool "
        "'write_file': field `age`: minimum",
    )
    assert_leaks_nothing(got.sentence, case.state, case.raw["action"])


def test_tool_input_check_sees_the_call_and_the_parsed_input() -> None:
    seen: list[tuple[ToolCallPendingConfirmation, Any]] = []

    def tool_input_check(call: ToolCallPendingConfirmation, tool_input: Any) -> str | None:
        seen.append((call, tool_input))
        return None

    state, action = decoded(SHARED["edited-input-is-a-json-object"])
    assert isinstance(state, ChatState)
    assert state.active_turn is not None
    part = state.active_turn.response_parts[0]
    assert isinstance(part, ToolCallPart)
    assert reject_reason(state, action, tool_input_check=tool_input_check) is None
    assert seen == [(part.tool_call, {"path": "hunter2.txt", "mode": 420})]


def test_an_accept_the_form_schema_accepts_is_accepted() -> None:
    state, action = decoded(SHARED["accept-with-required-submitted"])
    assert reject_reason(state, action, form_check=accept_everything) is None


def test_an_accept_the_form_schema_refuses_is_rejected() -> None:
    state, action = decoded(SHARED["accept-with-required-submitted"])
    assert reject_reason(state, action, form_check=refuse_everything) == Rejection(
        RejectionCode.FORM_INVALID,
        "the answers to input request 'form' do not fit its form: field `age`: minimum",
    )


def test_form_check_sees_the_request_and_the_overlaid_answers() -> None:
    seen: list[tuple[InputRequest, dict[str, InputAnswer]]] = []

    def form_check(request: InputRequest, answers: dict[str, InputAnswer]) -> str | None:
        seen.append((request, answers))
        return None

    state, action = decoded(SHARED["overlay-keeps-the-synced-answers-it-does-not-replace"])
    assert isinstance(state, ChatState)
    assert state.active_turn is not None
    assert isinstance(action, ChatInputCompleted)
    part = state.active_turn.response_parts[0]
    assert isinstance(part, InputRequestPart)
    synced, carried = part.request.answers or {}, action.answers or {}
    assert set(synced) - set(carried)  # the overlay keeps what it does not replace
    assert reject_reason(state, action, form_check=form_check) is None
    assert seen == [(part.request, {**synced, **carried})]


def test_form_check_is_not_consulted_unless_accepting() -> None:
    state, action = decoded(SHARED["decline-needs-no-answers"])
    assert reject_reason(state, action, form_check=refuse_everything) is None


# ─── The validate-* reducer fixtures ─────────────────────────────────────────
# Both languages run them (tests/test_reducer_fixtures.py, web/test/reducers.test.mjs);
# here, that each one is a validation fixture worth the name.

REDUCER_FIXTURES = sorted((Path(__file__).parent / "fixtures" / "reducers").glob("validate-*.json"))


@pytest.mark.parametrize("path", REDUCER_FIXTURES, ids=[path.stem for path in REDUCER_FIXTURES])
def test_validate_fixture_passes(path: Path) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["validate"] is True
    assert len(data["rejections"]) == len(data["actions"])
    assert None in data["rejections"]
    assert any(code is not None for code in data["rejections"])
    assert run_fixture(path, data, AHP_FIXTURE_NOW_MS).error is None
