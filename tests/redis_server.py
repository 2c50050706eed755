"""A real redis-server for tests: its own directory, a unix socket, AOF on."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

READY = b"ready to accept connections"


class RedisServer:
    """One redis-server process that can be stopped, killed and restarted
    on the same data directory."""

    def __init__(self, directory: Path, *, appendfsync: str = "always") -> None:
        self.directory = directory
        self.socket = directory / "redis.sock"
        self.appendfsync = appendfsync
        self.process: asyncio.subprocess.Process | None = None
        self._drainer: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> None:
        """Start and wait until it accepts connections (bound it with
        ``asyncio.timeout``)."""
        self.process = await asyncio.create_subprocess_exec(
            "redis-server",
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--save",
            "",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        seen = b""
        while READY not in seen.lower():
            line = await self.process.stdout.readline()
            if not line:
                raise RuntimeError("redis-server exited:\n" + seen.decode(errors="replace"))
            seen += line
        # Keep draining its output so that it never blocks on a full pipe.
        self._drainer = asyncio.get_running_loop().create_task(self._drain(self.process))

    @staticmethod
    async def _drain(process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while await process.stdout.readline():
            pass

    async def stop(self) -> None:
        """SHUTDOWN as an operator would (SIGTERM): AOF is flushed."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            await self.process.wait()

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def running_redis(start_timeout: float) -> AsyncIterator[RedisServer]:
    """A started redis-server in a fresh short directory (unix socket paths
    are limited to 107 bytes), killed and removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="huddle-redis-", dir="/tmp"))
    server = RedisServer(directory)
    try:
        async with asyncio.timeout(start_timeout):
            await server.start()
        yield server
    finally:
        await server.kill()
        shutil.rmtree(directory, ignore_errors=True)
