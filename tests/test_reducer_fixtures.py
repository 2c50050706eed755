"""Huddle's language-neutral reducer fixtures, one test per file.

Every ``*.json`` in ``tests/fixtures/reducers/`` runs through
:func:`reducers.fixtures.run_fixtures`, the same runner the command line
uses; the web client's JavaScript reducers run the same files. The runner's
own failure paths are tested at the bottom with fixtures written on the fly
(its command line in ``test_ahp_fixture_runner.py``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path, PurePath
from typing import Any

import pytest

from protocol.actions import (
    CHAT_ACTIONS,
    ROOT_ACTIONS,
    SESSION_ACTIONS,
    Action,
)
from reducers.fixtures import AHP_FIXTURE_NOW_MS, Outcome, Report, run_fixture, run_fixtures

FIXTURES = Path(__file__).parent / "fixtures" / "reducers"
FIXTURE_FILES = sorted(FIXTURES.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


@cache
def outcomes_by_name() -> dict[str, Outcome]:
    """Every fixture's outcome, by file name; the directory runs once."""
    report = run_fixtures([(path, load(path)) for path in FIXTURE_FILES], AHP_FIXTURE_NOW_MS)
    return {outcome.path.name: outcome for outcome in report.outcomes}


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in FIXTURE_FILES])
def test_reducer_fixture_passes(path: Path) -> None:
    outcome = outcomes_by_name().get(path.name)
    assert outcome is not None, f"{path.name} is not a fixture the runner can run"
    assert outcome.error is None, f"{path.name}: {outcome.description}\n{outcome.error}"


def action_tag(cls: type[Action]) -> str:
    return str(cls.__struct_config__.tag)


EVERY_ACTION_TYPE = [action_tag(cls) for cls in ROOT_ACTIONS + SESSION_ACTIONS + CHAT_ACTIONS]


@pytest.mark.parametrize("action_type", EVERY_ACTION_TYPE)
def test_every_action_type_has_a_fixture_named_after_it(action_type: str) -> None:
    family, name = action_type.split("/")
    named = [p for p in FIXTURE_FILES if p.name.startswith(f"{family}-{name}-")]
    assert named, f"no fixture {family}-{name}-<case>.json"
    assert any(action_type in {a.get("type") for a in load(p)["actions"]} for p in named), (
        f"no {family}-{name}-*.json fixture dispatches {action_type}"
    )


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, id=p.stem) for p in FIXTURE_FILES if not p.name.startswith("validate-")],
)
def test_fixture_name_starts_with_its_reducer(path: Path) -> None:
    assert path.name.startswith(load(path)["reducer"] + "-")


# ─── The runner's other paths ────────────────────────────────────────────────

EMPTY_CHAT: dict[str, Any] = {
    "resource": "ahp-chat:/ticket-1",
    "title": "Order question",
    "status": 1,
    "modifiedAt": "2026-03-02T10:00:00.000Z",
    "turns": [],
}
ACTIVITY = {"type": "chat/activityChanged", "activity": "Looking up the order"}
DRAFT = {"type": "chat/draftChanged", "draft": {"text": "hi", "origin": {"kind": "user"}}}


def fixture(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "description": "made on the fly",
        "reducer": "chat",
        "initial": EMPTY_CHAT,
        "actions": [],
        "expected": EMPTY_CHAT,
    }
    data.update(fields)
    return data


def run(data: dict[str, Any]) -> str | None:
    return run_fixture(PurePath("on-the-fly.json"), data, AHP_FIXTURE_NOW_MS).error


def test_runner_reports_an_initial_state_that_does_not_decode() -> None:
    error = run(fixture(initial={**EMPTY_CHAT, "status": "busy"}))
    assert error is not None
    assert error.startswith("initial state does not decode: Expected `int`, got `str`")
    assert "$.status" in error


def test_runner_reports_an_action_that_does_not_decode() -> None:
    error = run(fixture(actions=[ACTIVITY, {"type": "chat/delta", "turnId": 7}]))
    assert error is not None
    assert error.startswith("action 1 does not decode:")


def test_runner_skips_an_action_type_it_does_not_know() -> None:
    actions = [{"type": "chat/fromTheFuture", "turnId": 7}, ACTIVITY]
    expected = {**EMPTY_CHAT, "activity": "Looking up the order"}
    assert run(fixture(actions=actions, expected=expected)) is None


def test_runner_treats_null_as_absent_on_both_sides() -> None:
    initial = {**EMPTY_CHAT, "activity": None, "draft": None}
    assert run(fixture(initial=initial, expected={**EMPTY_CHAT, "turnsNextCursor": None})) is None


def test_runner_prints_both_states_when_they_differ() -> None:
    error = run(fixture(actions=[ACTIVITY]))
    assert error is not None
    assert error.startswith("state differs\n  expected: ")
    assert '"activity": "Looking up the order"' in error.split("actual:")[1]


CANCEL_WITHOUT_TURN = {"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}
"""Rejected by the host's rules (no-active-turn): no turn is active."""


def test_runner_skips_rejected_actions_when_validating() -> None:
    data = fixture(
        validate=True,
        rejections=[None, "no-active-turn"],
        actions=[DRAFT, CANCEL_WITHOUT_TURN],
        expected={**EMPTY_CHAT, "draft": DRAFT["draft"]},
    )
    assert run(data) is None


def test_runner_reports_a_rejection_the_fixture_did_not_expect() -> None:
    error = run(fixture(validate=True, actions=[CANCEL_WITHOUT_TURN]))
    assert error == (
        "action 0: expected rejection None, got "
        "\"no-active-turn: turn 't1' cannot be cancelled: no turn is active\""
    )


def test_runner_reports_an_expected_rejection_that_did_not_happen() -> None:
    error = run(fixture(validate=True, rejections=["no-active-turn"], actions=[DRAFT]))
    assert error == "action 0: expected rejection 'no-active-turn', got None"


def test_runner_skips_what_is_not_a_fixture_of_a_reducer_it_implements() -> None:
    files: list[tuple[PurePath, object]] = [
        (PurePath("list.json"), [1, 2]),
        (PurePath("partial.json"), {"description": "no reducer"}),
        (PurePath("terminal.json"), fixture(reducer="terminal")),
        (PurePath("chat.json"), fixture()),
    ]
    report = run_fixtures(files, AHP_FIXTURE_NOW_MS)
    assert [o.path.name for o in report.outcomes] == ["chat.json"]
    assert report.skipped == 3


def test_report_lists_each_failure_then_the_skipped_then_the_counts() -> None:
    passed = Outcome(PurePath("a.json"), "fine", None)
    failed = Outcome(PurePath("dir/b.json"), "wrong title", "state differs")
    assert Report((passed, failed), 2).lines() == [
        "FAIL b.json: wrong title\n  state differs",
        "2 skipped (not a fixture, or a reducer Huddle does not implement)",
        "1 passed, 1 failed",
    ]
    assert Report((passed,), 0).lines() == ["1 passed, 0 failed"]


# ─── Where the session reducer still differs from AHP ────────────────────────
# Each is a fixture in the usual shape: once the reducer is fixed it can move
# into tests/fixtures/reducers/ as a file.


def plugin(plugin_id: str, *children: dict[str, Any]) -> dict[str, Any]:
    return {"id": plugin_id, "type": "plugin", "enabled": True, "children": list(children)}


def queue_session(customizations: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "provider": "huddle",
        "title": "ACME support queue",
        "status": 1,
        "lifecycle": "ready",
        "activeClients": [],
        "chats": [],
        "customizations": customizations,
    }


MACRO = {"id": "shared-id", "type": "prompt"}
SERVER = {"id": "shared-id", "type": "mcpServer", "enabled": True, "state": {"kind": "stopped"}}


def test_customization_removed_removes_the_child_from_every_container() -> None:
    data = fixture(
        reducer="session",
        initial=queue_session([plugin("zendesk", MACRO), plugin("macros", MACRO)]),
        actions=[{"type": "session/customizationRemoved", "id": "shared-id"}],
        expected=queue_session([plugin("zendesk"), plugin("macros")]),
    )
    assert run(data) is None


def test_mcp_server_start_skips_a_same_id_child_that_is_not_a_server() -> None:
    data = fixture(
        reducer="session",
        initial=queue_session([plugin("macros", MACRO), plugin("zendesk", SERVER)]),
        actions=[{"type": "session/mcpServerStartRequested", "id": "shared-id"}],
        expected=queue_session(
            [plugin("macros", MACRO), plugin("zendesk", {**SERVER, "state": {"kind": "starting"}})]
        ),
    )
    assert run(data) is None
