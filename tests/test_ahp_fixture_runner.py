"""The fixture runner's command line, ``python -m reducers.fixtures DIR``:
files it reads and skips, failures it prints, its exit codes."""

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

from reducers.fixtures.__main__ import main

EMPTY_CHAT: dict[str, Any] = {
    "resource": "ahp-chat:/c",
    "title": "t",
    "status": 1,
    "modifiedAt": "1970-01-01T00:00:00.000Z",
    "turns": [],
}


def write(directory: Path, name: str, data: object) -> None:
    (directory / name).write_text(json.dumps(data), encoding="utf-8")


def chat_fixture(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "description": "d",
        "reducer": "chat",
        "initial": EMPTY_CHAT,
        "actions": [],
        "expected": EMPTY_CHAT,
    }
    data.update(fields)
    return data


def test_runner_passes_a_good_fixture_and_skips_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        "a.json",
        chat_fixture(
            actions=[{"type": "chat/activityChanged", "activity": "x"}],
            expected=dict(EMPTY_CHAT, activity="x"),
        ),
    )
    write(tmp_path, "b.json", chat_fixture(reducer="terminal", initial={}, expected={}))
    write(tmp_path, "c.json", [1, 2])
    (tmp_path / "notes.txt").write_text("not JSON, not read", encoding="utf-8")
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "2 skipped (not a fixture, or a reducer Huddle does not implement)",
        "1 passed, 0 failed",
    ]


def test_runner_reports_the_failing_file_and_description(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(
        tmp_path,
        "bad.json",
        chat_fixture(description="wrong title", expected=dict(EMPTY_CHAT, title="other")),
    )
    assert main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL bad.json: wrong title\n  state differs" in out
    assert out.splitlines()[-1] == "0 passed, 1 failed"


def test_runner_reduces_with_the_clock_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truncated = {"type": "chat/truncated"}  # stamps modifiedAt with the clock
    expected = dict(EMPTY_CHAT, modifiedAt="1970-01-01T00:00:01.000Z")
    write(tmp_path, "clock.json", chat_fixture(actions=[truncated], expected=expected))
    assert main([str(tmp_path), "--now-ms", "1000"]) == 0
    assert main([str(tmp_path)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "0 passed, 1 failed"


def test_runner_refuses_a_path_that_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2


@pytest.mark.filterwarnings(
    "ignore:'reducers.fixtures.__main__' found in sys.modules:RuntimeWarning"
)
def test_runner_runs_as_a_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path, "one.json", chat_fixture())
    monkeypatch.setattr(sys, "argv", ["reducers.fixtures", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("reducers.fixtures", run_name="__main__")
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 passed, 0 failed"
