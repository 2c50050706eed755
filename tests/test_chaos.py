"""The chaos run's short version (bench.chaos): a minute of people at work
on three servers and three workers on one Redis, a fault every 1.5-3 s (the
seed's schedule holds every kind), then the checker: nothing lost, nothing
run twice or unapproved, every answer delivered, nothing stuck, every audit
chain whole. Its goals are guarantees, not figures: any count but 0 fails."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

from bench.chaos import KINDS
from bench.fanout import ROOT
from tests.conftest import UNIT

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300 * UNIT)]

SEED = "7"


async def test_a_minute_of_faults_loses_nothing_runs_nothing_twice_and_leaves_nothing_stuck() -> (
    None
):
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.chaos",
        *("--minutes", "1", "--seed", SEED, "--sessions", "4", "--single-redis"),
        *("--every", "1.5", "3"),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(240 * UNIT):
            output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text
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
