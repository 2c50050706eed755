import gc

import pytest

from server.cli import main, settle_heap


def test_huddle_prints_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("huddle ")


def test_huddle_without_a_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: huddle" in capsys.readouterr().out


def test_a_started_process_leaves_its_startup_heap_out_of_full_collections() -> None:
    # What huddle serve and huddle worker call once they are up: a full
    # garbage collection then walks none of what they held at startup.
    held = [{"startup": n} for n in range(100)]
    try:
        frozen = settle_heap()
        assert frozen >= len(held)
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in held)
    finally:
        gc.unfreeze()


def test_a_setting_out_of_range_is_a_usage_error_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["worker", "--spare-workers", "-5"])
    assert exited.value.code == 2
    assert "error: --spare-workers is a count: 0 or more, not -5" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--drain-seconds", "-1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "error: --drain-seconds is a number of seconds: 0 or more, not -1.0" in err
    monkeypatch.setenv("HUDDLE_RETENTION", "3w")
    with pytest.raises(SystemExit):
        main(["serve"])
    assert "error: a duration is a positive number" in capsys.readouterr().err
