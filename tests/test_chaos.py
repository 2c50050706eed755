"""The chaos run's short version (bench.chaos): a minute of people at work
on three servers and three workers on one Redis, a fault every 1.5-3 s (the
seed's schedule holds every kind), then the checker: nothing lost, nothing
run twice or unapproved, every answer delivered, nothing stuck, every audit
chain whole. Its goals are guarantees, not figures: any count but 0 fails."""

from __future__ import annotations

import re

import pytest

from bench.chaos import KINDS
from tests.conftest import UNIT
from tests.test_benchmarks import benchmark_output

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300 * UNIT)]

SEED = "7"


async def test_a_minute_of_faults_loses_nothing_runs_nothing_twice_and_leaves_nothing_stuck() -> (
    None
):
    text = await benchmark_output(
        "bench.chaos",
        *("--minutes", "1", "--seed", SEED, "--sessions", "4", "--single-redis"),
        *("--every", "1.5", "3"),
        within=240 * UNIT,
    )
    assert f"all zeros (seed {SEED})" in text
    faults = re.search(r"\| faults \| (.*) \|", text)
    assert faults is not None, text
    counts = {kind: int(n) for kind, n in re.findall(r"([a-z ]+?) (\d+)(?:, |$)", faults[1])}
    assert set(counts) == set(KINDS)
    assert all(counts.values()), counts
    assert sum(counts.values()) >= 10, counts
    worked = re.search(r"\| turns started / stuck \| (\d+) / 0 \|", text)
    assert worked is not None
    assert int(worked[1]) > 0
