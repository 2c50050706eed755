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
