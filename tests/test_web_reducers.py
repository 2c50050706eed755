"""The web client's JavaScript reducers and validation rules, run by node.

``web/test/*.test.mjs`` run every reducer fixture of ``tests/fixtures/reducers/``
through ``web/reducers.js`` and ``web/validation.js`` (the same files the
Python reducers pass), plus purity, totality and the validation tables. Here
pytest runs them with node's built-in test runner and shows node's output on
failure, and checks that the JavaScript knows the same action types as
:mod:`protocol.actions` and the codes it acts on (``web/chats.js``).

To check parity against another folder of fixtures (AHP's own, for example)::

    HUDDLE_EXTRA_FIXTURES=path/to/types/test-cases/reducers node --test web/test/*.test.mjs
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from protocol.actions import ACTION_TYPES, CLIENT_DISPATCHABLE
from protocol.messages import ErrorCode
from protocol.rejections import RejectionCode
from tests.conftest import UNIT

ROOT = Path(__file__).parent.parent
WEB = ROOT / "web"
# Files rather than the folder: what `node --test` does with a folder argument
# has changed between node versions; a list of files means the same to all.
TEST_FILES = sorted((WEB / "test").glob("*.test.mjs"))


def node() -> str:
    """The node executable; its absence fails the test rather than skipping
    it, so the web client is never left untested by accident."""
    path = shutil.which("node")
    if path is None:
        pytest.fail(
            "node is not on PATH: the web client's reducers need node to be tested "
            "(`.ci/setup --test` installs Debian's nodejs when it is missing)"
        )
    return path


def run_node(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node(), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120 * UNIT,
        check=False,
    )


def test_web_tests_exist() -> None:
    names = {path.name for path in TEST_FILES}
    assert {"reducers.test.mjs", "validation.test.mjs"} <= names


def failures(output: str) -> str:
    """The failing part of the spec reporter's output: node prints the list of
    failing tests, with their diffs, after every passing one."""
    _passed, marker, failing = output.partition("failing tests:")
    return marker + failing if marker else output


def test_web_reducers_pass_their_node_tests() -> None:
    result = run_node("--test", "--test-reporter=spec", *(str(path) for path in TEST_FILES))
    assert result.returncode == 0, (
        f"node --test failed ({result.returncode}):\n{failures(result.stdout)}\n{result.stderr}"
    )


def js_action_types() -> dict[str, list[str]]:
    """The action types web/reducers.js knows, and those it calls
    client-dispatchable."""
    module = (WEB / "reducers.js").as_uri()
    script = (
        f"import {{ ACTION_TYPES, isClientDispatchable }} from {json.dumps(module)};\n"
        "console.log(JSON.stringify({\n"
        "  known: [...ACTION_TYPES],\n"
        "  dispatchable: ACTION_TYPES.filter(isClientDispatchable),\n"
        "}));\n"
    )
    result = run_node("--input-type=module", "--eval", script)
    assert result.returncode == 0, result.stderr
    types: dict[str, list[str]] = json.loads(result.stdout)
    return types


def test_web_reducers_know_every_action_type_python_knows() -> None:
    assert sorted(js_action_types()["known"]) == sorted(ACTION_TYPES)


def test_web_client_dispatchable_set_is_ahps() -> None:
    python = sorted(str(cls.__struct_config__.tag) for cls in CLIENT_DISPATCHABLE)
    assert sorted(js_action_types()["dispatchable"]) == python


def test_web_chats_use_the_servers_codes() -> None:
    module = (WEB / "chats.js").as_uri()
    script = (
        f"import {{ ALREADY_EXISTS, CHAT_FULL }} from {json.dumps(module)};\n"
        "console.log(JSON.stringify([CHAT_FULL, ALREADY_EXISTS]));\n"
    )
    result = run_node("--input-type=module", "--eval", script)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [RejectionCode.CHAT_FULL, ErrorCode.ALREADY_EXISTS]
