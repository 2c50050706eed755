"""``huddle serve`` as a user runs it: a real process on a free port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from server.client import HuddleClient
from tests.conftest import UNIT

TOKEN = "cli-agent-token-0123456789abcdef"


@dataclass
class Served:
    process: asyncio.subprocess.Process
    output: list[str]
    port: int
    link: str


async def read_until(process: asyncio.subprocess.Process, output: list[str], marker: str) -> str:
    assert process.stdout is not None
    async with asyncio.timeout(20 * UNIT):
        while True:
            line = (await process.stdout.readline()).decode()
            if not line:
                raise AssertionError("huddle serve exited:\n" + "".join(output))
            output.append(line)
            if marker in line:
                return line


async def start(*args: str, env: dict[str, str] | None = None) -> Served:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "serve",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    output: list[str] = []
    line = await read_until(process, output, "Open the web client:")
    link = line.split("Open the web client:", 1)[1].strip()
    match = re.search(r":(\d+)/", link)
    assert match is not None
    return Served(process, output, int(match.group(1)), link)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    running = await start(env={"HUDDLE_TOKEN": TOKEN})
    try:
        yield running
    finally:
        if running.process.returncode is None:
            running.process.kill()
            await running.process.wait()


async def test_serve_prints_a_participant_link_that_connects(served: Served) -> None:
    token = served.link.split("token=", 1)[1]
    client = await HuddleClient.connect(f"ws://127.0.0.1:{served.port}/ahp", token)
    sessions = await client.list_sessions()
    assert sessions == []
    await client.close()


async def test_serve_takes_the_agent_token_from_the_environment(served: Served) -> None:
    client = await HuddleClient.connect(f"ws://127.0.0.1:{served.port}/ahp", TOKEN)
    await client.create_session("ahp-session:/from-cli")
    assert [s["resource"] for s in await client.list_sessions()] == ["ahp-session:/from-cli"]
    await client.close()
    assert not any("Agent token" in line for line in served.output)


async def test_serve_without_a_token_makes_one_and_prints_it() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HUDDLE_TOKEN"}
    running = await start(env=env)
    try:
        line = next(x for x in running.output if "Agent token" in x)
        token = line.rsplit(" ", 1)[1].strip()
        client = await HuddleClient.connect(f"ws://127.0.0.1:{running.port}/ahp", token)
        await client.create_session("ahp-session:/generated")
        await client.close()
    finally:
        running.process.kill()
        await running.process.wait()


async def test_serve_shuts_down_gracefully_on_sigterm(served: Served) -> None:
    client = await HuddleClient.connect(f"ws://127.0.0.1:{served.port}/ahp", TOKEN, reconnect=False)
    served.process.send_signal(signal.SIGTERM)
    assert served.process.stdout is not None
    async with asyncio.timeout(20 * UNIT):
        rest = (await served.process.stdout.read()).decode()
        code = await served.process.wait()
        await client.lost.wait()
    # uvicorn shuts down, then re-raises the signal: the conventional status.
    assert code in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in rest
    assert "Finished server process" in rest
    await client.close()


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        pytest.param((), False, id="loopback"),
        # 127.0.0.2 is loopback to the kernel but not a loopback bind to the
        # Host guard (only 127.0.0.1, localhost, ::1 are): it answers to any
        # Host, as 0.0.0.0 does, and nothing here listens beyond loopback.
        pytest.param(("--host", "127.0.0.2"), True, id="elsewhere"),
        pytest.param(
            ("--host", "127.0.0.2", "--allowed-host", "127.0.0.2"), False, id="elsewhere-named"
        ),
    ],
)
async def test_serve_warns_when_no_host_name_guards_against_dns_rebinding(
    args: tuple[str, ...], warned: bool
) -> None:
    running = await start(*args, env={"HUDDLE_TOKEN": TOKEN})
    try:
        warnings = [line for line in running.output if "DNS rebinding is not guarded" in line]
    finally:
        running.process.kill()
        await running.process.wait()

    assert len(warnings) == warned
    if warned:
        assert warnings[0].startswith("WARNING ")
        assert "--allowed-host" in warnings[0]
