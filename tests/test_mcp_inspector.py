"""Huddle's MCP server with a client nobody here wrote: the MCP Inspector's
CLI (``@modelcontextprotocol/inspector``, from npm: ``.ci/setup --test``
installs the pinned version into ``.ci/node``)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from tests.conftest import AGENT_TOKEN, RunningServer
from tests.people_kit import WITHIN, open_room, requests_open
from tests.test_mcp_door import answer

INSPECTOR = Path(__file__).resolve().parents[1] / ".ci" / "node" / "node_modules" / ".bin"


async def inspect(huddle: RunningServer, tmp_path: Path, *args: str) -> Any:
    """What ``mcp-inspector --cli`` prints for ``args`` against ``/mcp``
    (as JSON); it must exit 0."""
    binary = INSPECTOR / "mcp-inspector"
    assert binary.exists(), "the MCP Inspector is missing: run .ci/setup --test"
    process = await asyncio.create_subprocess_exec(
        str(binary),
        "--cli",
        f"{huddle.http}/mcp",
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {AGENT_TOKEN}",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")},
    )
    async with asyncio.timeout(3 * WITHIN):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return json.loads(out)


async def test_the_inspector_lists_the_tools_with_their_schemas(
    huddle: RunningServer, tmp_path: Path
) -> None:
    listed = await inspect(huddle, tmp_path, "--method", "tools/list")
    tools = {tool["name"]: tool for tool in listed["tools"]}
    assert {"ask_people", "request_approval", "ask_to_visit"} <= set(tools)
    assert all("outputSchema" in tool for tool in tools.values())


async def test_the_inspector_gets_what_a_person_answered(
    huddle: RunningServer, tmp_path: Path
) -> None:
    room = await open_room(huddle, "ahp-session:/inspected")
    call = asyncio.create_task(
        inspect(
            huddle,
            tmp_path,
            "--method",
            "tools/call",
            "--tool-name",
            "ask_people",
            "--tool-arg",
            "message=Ship it?",
            f"chat={room.chat}",
        )
    )
    [request] = await requests_open(room)
    await answer(room, request)
    result = await call
    assert result["isError"] is False
    assert result["structuredContent"]["action"] == "accept"
    assert result["structuredContent"]["answered_by"]["name"] == room.name
