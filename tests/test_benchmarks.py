"""The benchmarks run: smoke runs of ``--quick`` (their figures are not
checked: a smoke run on a busy machine says nothing, but a benchmark that
no longer measures what it says fails here, not months later)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bench.fanout import ROOT
from tests.conftest import UNIT

pytestmark = pytest.mark.redis


async def _quick(module: str, *args: str) -> str:
    """``python -m <module> --quick <args>``'s output; it must succeed."""
    return await benchmark_output(module, "--quick", *args, within=60 * UNIT)


async def benchmark_output(module: str, *args: str, within: float) -> str:
    """``python -m <module> <args>``'s output, within ``within`` seconds; it
    must succeed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(within):
            output, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = output.decode()
    assert process.returncode == 0, text
    return text


async def test_the_fanout_benchmark_runs_quick() -> None:
    text = await _quick("bench.fanout", "--only", "redis")
    assert "A's server CPU per delivered frame" in text
    assert "C (serves no channel) CPU" in text
    assert "A's ratio over the control's" in text
    assert "not delivered" not in text


async def test_the_resume_benchmark_runs_quick_with_both_baselines() -> None:
    # Against this same checkout: (2') runs beside (2), in its own database.
    text = await _quick("bench.runner", "--against", str(ROOT))
    # Every turn of both set-ups was played to the tool (a turn that is not
    # ends the run with an error), and both yardsticks were measured.
    assert "(2) redis, serve --workers 0 + huddle worker toolCallConfirmed   p50" in text
    assert "(2) redis, serve --workers 0 + huddle worker inputCompleted/tool p50" in text
    assert "back to back" in text
    assert "each 25 ms after the last" in text
    assert text.count("(2) / paused PING") == 3
    # The floor (the same crossings with nothing at the stops) ran too.
    assert "(3) floor: (2)'s crossings, nothing else     toolCallConfirmed   p50" in text
    assert text.count("(2) / (3)") == 3
    assert "(2') as (2), from the --against checkout     toolCallConfirmed   p50" in text
    assert "(2) / (2'), the same set-up from the other checkout: inputCompleted" in text


async def test_the_broadcast_benchmark_runs_quick() -> None:
    # Its 100 idle connections are more than one person's token may hold:
    # the benchmark mints a token for every few, as that many people would.
    text = await _quick("bench.broadcast")
    # Huddle with plain AHP clients and with Huddle's extensions, beside the relay.
    assert "plain / relay: server CPU per delivered frame" in text
    assert "ext / relay: server CPU per delivered frame" in text
    assert "huddle / bare websockets: ratio" in text
