"""Run language-neutral reducer fixtures through our reducers.

    python -m reducers.fixtures DIR [--now-ms N]

A fixture is a JSON file with ``description``, ``reducer`` (``root``,
``session`` or ``chat``), ``initial``, ``actions`` and ``expected``; ``null``
anywhere means "absent". The actions are applied in order with ``now_ms`` as
the clock (AHP generated its fixtures with 9999) and the result must equal
``expected``. An action whose ``type`` we do not know is a no-op, as in AHP.

Huddle's own fixtures may add ``"validate": true`` and ``"rejections"``, one
entry per action: ``null`` when the host accepts it, else the stable code the
host's validation rejects it with (the part of ``rejectionReason`` before the
first colon). Rejected actions are not reduced, as on the host.

Files of another shape and reducers we do not implement are skipped. Each
failure prints its file and description; the last line is ``N passed, N
failed``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from protocol.actions import ACTION_TYPES, StateAction
from protocol.codec import STATE_TYPES, MalformedFrame, convert_state, to_builtins
from reducers import reduce
from reducers.validation import reject_reason

AHP_FIXTURE_NOW_MS = 9999
FIXTURE_KEYS = {"description", "reducer", "initial", "actions", "expected"}


def strip_nulls(value: Any) -> Any:
    """``value`` with every ``null`` object member removed (null = absent)."""
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nulls(v) for v in value]
    return value


@dataclass(frozen=True)
class Outcome:
    path: Path
    description: str
    error: str | None  # None when the fixture passed


def run_fixture(path: Path, data: dict[str, Any], now_ms: int) -> Outcome:
    """Run one fixture; the outcome says why it failed, if it did."""
    description = str(data["description"])

    def fail(why: str) -> Outcome:
        return Outcome(path, description, why)

    try:
        state = convert_state(strip_nulls(data["initial"]), data["reducer"])
    except MalformedFrame as error:
        return fail(f"initial state does not decode: {error}")
    validate = bool(data.get("validate"))
    rejections = data.get("rejections") or []
    for index, raw in enumerate(data["actions"]):
        if raw.get("type") not in ACTION_TYPES:
            continue
        try:
            action: StateAction = msgspec.convert(strip_nulls(raw), StateAction)
        except msgspec.ValidationError as error:
            return fail(f"action {index} does not decode: {error}")
        if validate:
            rejection = reject_reason(state, action)
            code = None if rejection is None else str(rejection.code)
            wanted = rejections[index] if index < len(rejections) else None
            if code != wanted:
                got = None if rejection is None else rejection.reason
                return fail(f"action {index}: expected rejection {wanted!r}, got {got!r}")
            if rejection is not None:
                continue
        state = reduce(state, action, now_ms)
    actual = strip_nulls(to_builtins(state))
    expected = strip_nulls(data["expected"])
    if actual != expected:
        return fail(
            "state differs\n  expected: "
            + json.dumps(expected, sort_keys=True)
            + "\n  actual:   "
            + json.dumps(actual, sort_keys=True)
        )
    return Outcome(path, description, None)


def run_directory(directory: Path, now_ms: int) -> tuple[list[Outcome], int]:
    """Run every fixture in ``directory``; returns the outcomes and the
    number of files skipped."""
    outcomes: list[Outcome] = []
    skipped = 0
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        is_fixture = isinstance(data, dict) and data.keys() >= FIXTURE_KEYS
        if not is_fixture or data["reducer"] not in STATE_TYPES:
            skipped += 1
        else:
            outcomes.append(run_fixture(path, data, now_ms))
    return outcomes, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reducers.fixtures", description=__doc__)
    parser.add_argument("directory", type=Path, help="folder of *.json fixtures")
    parser.add_argument(
        "--now-ms",
        type=int,
        default=AHP_FIXTURE_NOW_MS,
        help=f"the clock the reducers see (default {AHP_FIXTURE_NOW_MS}, as AHP's fixtures)",
    )
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        parser.error(f"{args.directory} is not a directory")
    outcomes, skipped = run_directory(args.directory, args.now_ms)
    failed = [o for o in outcomes if o.error is not None]
    for outcome in failed:
        print(f"FAIL {outcome.path.name}: {outcome.description}\n  {outcome.error}")
    if skipped:
        print(f"{skipped} skipped (not a fixture, or a reducer Huddle does not implement)")
    print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
