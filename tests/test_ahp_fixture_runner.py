"""The fixture runner itself: shapes it skips, failures it reports."""

import json
from pathlib import Path
from typing import Any

import pytest

from reducers.fixtures import main

EMPTY_CHAT: dict[str, Any] = {
    "resource": "ahp-chat:/c",
    "title": "t",
    "status": 1,
    "modifiedAt": "1970-01-01T00:00:00.000Z",
    "turns": [],
}


def write(directory: Path, name: str, data: object) -> None:
    (directory / name).write_text(json.dumps(data), encoding="utf-8")


def test_runner_passes_a_good_fixture_and_skips_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        "a.json",
        {
            "description": "d",
            "reducer": "chat",
            "initial": EMPTY_CHAT,
            "actions": [{"type": "chat/activityChanged", "activity": "x"}],
            "expected": dict(EMPTY_CHAT, activity="x"),
        },
    )
    write(
        tmp_path,
        "b.json",
        {"description": "d", "reducer": "terminal", "initial": {}, "actions": [], "expected": {}},
    )
    write(tmp_path, "c.json", [1, 2])
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 0 failed"


def test_runner_reports_the_failing_file_and_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        "bad.json",
        {
            "description": "wrong title",
            "reducer": "chat",
            "initial": EMPTY_CHAT,
            "actions": [],
            "expected": dict(EMPTY_CHAT, title="other"),
        },
    )
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL bad.json: wrong title" in out
    assert out.splitlines()[-1] == "0 passed, 1 failed"
