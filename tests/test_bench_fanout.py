"""bench.fanout runs: a smoke run of ``--quick`` on a single Redis (its
figures are not checked: a smoke run on a busy machine says nothing)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench.fanout import ROOT
from tests.conftest import UNIT

pytestmark = pytest.mark.redis


async def test_the_fanout_benchmark_runs_quick() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.fanout",
        "--quick",
        "--only",
        "redis",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(60 * UNIT):
            output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text
    assert "A's server CPU per delivered frame" in text
    assert "C (serves no channel) CPU" in text
    assert "not delivered" not in text
