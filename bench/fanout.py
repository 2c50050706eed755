"""Each process pays for its own channels: what other processes' traffic
costs a ``huddle serve`` process, same run, flood against no flood.

    .venv/bin/python -m bench.fanout [--quick] [--only redis|cluster]
        [--subscribers N] [--rate N] [--flooders N] [--flood-chats N]
        [--flood-rate N] [--seconds S] [--windows N]

Every process is a real ``huddle serve --agent none`` (its CPU time read
from ``/proc/<pid>/stat``), on a Redis of the benchmark's own: a single
redis-server on a unix socket, then a Redis Cluster of three primaries on
loopback (``redis-cli --cluster create``), both with ``appendonly yes`` and
``appendfsync everysec``.

- Process A serves ``--subscribers`` raw WebSocket clients of chat X, whose
  active turn holds an open input request; a dispatcher (on A) sends
  ``--rate`` ``chat/inputAnswerChanged`` a second (bench.broadcast's load).
- Processes B1.. (``--flooders``) each serve ``--flood-chats`` other chats,
  which a load generator of their own (a child process, one connection per
  chat) floods at ``--flood-rate`` actions a second in all.
- Process C serves nothing: no client at all.
- A control process (no Huddle in it) does a fixed CPU job at a fixed pace
  (``CONTROL_RATE`` units a second, each the same hashing): its CPU per
  unit, flooded over quiet, is what the flood costs any process on this
  machine (caches, frequency, the scheduler), and A's ratio is printed
  divided by it as well.
- Unless ``--fresh``, before the windows a client of A subscribes to every
  flooded chat and leaves, and the run waits ``IDLE_KEEP`` and a second:
  the chats A served once and serves no more, which A must stop hearing
  (issue 42's isolation finding).

Windows of ``--seconds`` alternate, quiet (A's load only) and flood (A's load
and the flood), ``--windows`` of each. Printed: A's server CPU per delivered
frame with the flood divided by the same without it, as measured and
divided by the control's ratio (goal: at most ``GOAL``; every process
hearing every append would make it grow with the flood), and C's CPU in
CPU milliseconds per second during the flood (goal: about idle, beside its
quiet figure), with the flood's accepted actions a second (the growth of
the flooded chats' heads in the store over A's window: what the machine
sustained, which on a small one is less than asked).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as websockets_connect

from bench.broadcast import (
    Child,
    Recorder,
    _initialize_frame,
    _request,
    huddle_frame,
    open_huddle,
    open_many,
    read_frames,
)
from bench.redis_store import own_redis
from protocol.actions import ChatInputRequested, ChatTurnStarted
from protocol.chat import Message, MessageOrigin
from protocol.session import SessionState
from server.client import HuddleClient
from server.core.held import IDLE_KEEP
from server.store.redis import RedisStore
from tests.redis_server import RunningCluster

GOAL = 1.1
CONTROL_RATE = 100
"""Units of the control's job a second (each about half a millisecond here)."""
CONTROL_UNIT = 500
"""SHA-256 digests of 1 KiB in one unit of the control's job."""
TOKEN = "bench-fanout-agent-token-0123456789"
ROOT = Path(__file__).resolve().parent.parent
UNLIMITED = "1000000"
STALL = 3.0
"""Seconds without a delivery after which a window stops waiting."""


# ─── Processes ───────────────────────────────────────────────────────────────


def cpu_seconds(child: Child) -> float:
    """CPU time of ``child`` so far, to the nanosecond where the kernel
    keeps scheduler statistics (summed over its threads), else in clock
    ticks from ``/proc/<pid>/stat``: an idle process uses less than a tick
    a second."""
    try:
        tasks = Path(f"/proc/{child.pid}/task").iterdir()
        return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
    except (OSError, ValueError, IndexError):
        return child.cpu_seconds()


@dataclass
class Served:
    """A ``huddle serve`` child: its port, a participant token, its output
    drained on a thread (so that it never blocks on a full pipe)."""

    name: str
    child: Child
    output: list[str] = field(default_factory=list)

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.child.port}/ahp"


def serve(name: str, store: str) -> Served:
    """Start ``huddle serve`` on ``store`` and wait (blocking) until it
    listens; rate limits lifted so that they are not what gets measured."""
    command = [sys.executable, "-m", "server", "serve", "--port", "0", "--store", store]
    command += ["--agent", "none", "--workers", "0", "--token", TOKEN]
    for flag in ("actions-per-second", "action-burst", "agent-actions-per-second"):
        command += [f"--{flag}", UNLIMITED]
    command += ["--agent-action-burst", UNLIMITED, "--flood-close-after", UNLIMITED]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    output: list[str] = []
    for raw in process.stdout:
        output.append(raw.decode(errors="replace"))
        if "Open the web client:" in output[-1]:
            break
    else:
        raise SystemExit(f"{name} exited:\n{''.join(output)}")
    match = re.search(r":(\d+)/\?token=(\S+)", output[-1])
    if match is None:
        process.kill()
        raise SystemExit(f"{name} did not start:\n{''.join(output)}")
    served = Served(
        name,
        Child(name, process, {"port": int(match[1]), "token": match[2], "agent": TOKEN}),
        output,
    )
    threading.Thread(target=_drain, args=(process, output), daemon=True).start()
    return served


def _drain(process: subprocess.Popen[bytes], output: list[str]) -> None:
    assert process.stdout is not None
    for raw in process.stdout:
        if len(output) < 1000:
            output.append(raw.decode(errors="replace"))


async def make_chat(served: Served, session: str) -> str:
    """A session on ``served`` whose chat's active turn holds an open input
    request (what ``huddle_frame`` answers); returns the chat."""
    async with await HuddleClient.connect(served.ws, TOKEN) as agent:
        await agent.create_session(session)
        state = (await agent.subscribe(session)).state
        assert isinstance(state, SessionState)
        assert state.default_chat is not None
        chat = state.default_chat
        message = Message(text="Users cannot log in", origin=MessageOrigin(kind="user"))
        started = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        await agent.dispatch_and_wait(
            chat, ChatTurnStarted(turn_id="bench-turn", started_at=started, message=message)
        )
        await agent.dispatch_and_wait(chat, ChatInputRequested(request=_request()))
    return chat


# ─── The flood: a load generator of its own ──────────────────────────────────


async def flood(port: int, token: str, chats: list[str], rate: float) -> None:
    """(Child) per chat a dispatcher on ``port``; print ``ready``, then send
    ``rate`` actions a second over all chats until SIGTERM."""
    tag = secrets.token_hex(4)  # a client id is its token's for good: one of our own
    dispatchers = await open_many(
        len(chats), lambda i: connect(port, token, f"flood-{tag}-{i}", None)
    )
    inbox = Recorder()  # only rejections would arrive
    readers = [asyncio.create_task(read_frames(ws, inbox)) for ws in dispatchers]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    start, sent = loop.time(), 0
    while not stop.is_set():
        delay = start + sent / rate - loop.time()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            continue
        chat = sent % len(chats)
        await dispatchers[chat].send(huddle_frame(chats[chat], sent))
        sent += 1
    await asyncio.gather(*(ws.close() for ws in dispatchers))
    for reader in readers:
        reader.cancel()
    if inbox.rejected:
        print(f"{inbox.rejected} flood action(s) rejected", file=sys.stderr)


async def connect(port: int, token: str, client_id: str, chat: str | None) -> ClientConnection:
    """A raw client that has initialized (and subscribed to ``chat``)."""
    ws = await websockets_connect(
        f"ws://127.0.0.1:{port}/ahp",
        additional_headers={"Authorization": f"Bearer {token}"},
        compression=None,
        max_size=None,
    )
    await ws.send(_initialize_frame(client_id, chat))
    if "result" not in json.loads(await ws.recv()):
        raise SystemExit(f"initialize failed for {client_id}")
    return ws


class Flood:
    """The load generators of one flood window, one per flooding process."""

    def __init__(self, targets: list[tuple[Served, list[str]]], rate: float) -> None:
        share = rate / len(targets)
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.fanout",
                    "--flood-port",
                    str(served.child.port),
                    "--flood-token",
                    served.child.info["token"],
                    "--flood-at",
                    str(share),
                    *chats,
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            for served, chats in targets
        ]

    def wait_ready(self) -> None:
        for process in self.processes:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                for other in self.processes:
                    other.kill()
                raise SystemExit("a flood generator did not start")

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            process.wait(30)


async def came_and_went(a: Served, chats: list[str]) -> None:
    """A client of A subscribes to each of ``chats`` and leaves; then wait
    until A has let them go (``IDLE_KEEP``, and a second)."""
    tag = secrets.token_hex(4)
    for index, chat in enumerate(chats):
        ws = await connect(a.child.port, TOKEN, f"came-{tag}-{index}", chat)
        await ws.close()
    await asyncio.sleep(IDLE_KEEP + 1.0)


# ─── The control: a fixed CPU job beside A ───────────────────────────────────


def control_job() -> None:
    """(Child) ``CONTROL_RATE`` units of a fixed job a second until killed,
    printing after each "<units done> <CPU seconds so far>"."""
    block, start, done = os.urandom(1024), time.monotonic(), 0
    while True:
        delay = start + done / CONTROL_RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for _ in range(CONTROL_UNIT):
            hashlib.sha256(block).digest()
        done += 1
        print(done, time.process_time(), flush=True)


class Control:
    """The control process, its last reading kept by a thread of ours."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.fanout", "--control"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.last = (0, 0.0)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            units, cpu = line.split()
            self.last = (int(units), float(cpu))

    def wait_ready(self) -> None:
        """Block until the job has done a unit."""
        while self.last[0] == 0:
            if self.process.poll() is not None:
                raise SystemExit("the control process exited")
            time.sleep(0.05)

    def reading(self) -> tuple[int, float]:
        return self.last

    @staticmethod
    def per_unit(before: tuple[int, float], after: tuple[int, float]) -> float:
        return (after[1] - before[1]) / max(1, after[0] - before[0])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@contextlib.contextmanager
def controlling() -> Iterator[Control]:
    control = Control()
    try:
        yield control
    finally:
        control.stop()


# ─── Windows ─────────────────────────────────────────────────────────────────


@dataclass
class Window:
    flooded: bool
    expected: int
    delivered: int
    cpu: float
    """A's CPU seconds."""
    idle_cpu: float
    """C's CPU seconds."""
    seconds: float
    flood_rate: float = 0.0
    control_per_unit: float = 0.0
    """The control's CPU seconds per unit of its job."""

    @property
    def cpu_per_frame(self) -> float:
        return self.cpu / max(1, self.delivered)

    @property
    def idle_ms_per_second(self) -> float:
        return self.idle_cpu / self.seconds * 1000


@dataclass
class Setup:
    a: Served
    c: Served
    control: Control
    chat: str
    flooders: list[tuple[Served, list[str]]]
    store: RedisStore
    """For the heads of the flooded chats (what was accepted)."""
    recorder: Recorder
    subscribers: list[ClientConnection]
    dispatcher: ClientConnection
    readers: list[asyncio.Task[None]]


async def run_window(setup: Setup, args: argparse.Namespace, flooded: bool) -> Window:
    loop = asyncio.get_running_loop()
    flood_load = None
    if flooded:
        flood_load = Flood(setup.flooders, args.flood_rate)
        await asyncio.to_thread(flood_load.wait_ready)
    await asyncio.sleep(args.settle)  # connections made, the flood under way
    recorder = setup.recorder
    count = round(args.rate * args.seconds)
    expected = count * len(setup.subscribers)
    recorder.reset()
    flooded_chats = [chat for _, chats in setup.flooders for chat in chats]
    heads0 = await setup.store.heads(flooded_chats)
    cpu0, idle0, start = cpu_seconds(setup.a.child), cpu_seconds(setup.c.child), loop.time()
    control0 = setup.control.reading()
    for index in range(count):
        delay = start + index / args.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await setup.dispatcher.send(huddle_frame(setup.chat, index))
    last, stalled = recorder.delivered, loop.time()
    while recorder.delivered < expected and loop.time() - stalled < STALL:
        await asyncio.sleep(0.05)
        if recorder.delivered != last:
            last, stalled = recorder.delivered, loop.time()
    seconds = loop.time() - start
    cpu = cpu_seconds(setup.a.child) - cpu0
    idle_cpu = cpu_seconds(setup.c.child) - idle0
    heads1 = await setup.store.heads(flooded_chats)
    recorder.recording = False
    accepted = sum(heads1[c][1] - heads0[c][1] for c in flooded_chats)
    window = Window(flooded, expected, recorder.delivered, cpu, idle_cpu, seconds)
    window.flood_rate = accepted / seconds
    window.control_per_unit = setup.control.per_unit(control0, setup.control.reading())
    if flood_load is not None:
        await asyncio.to_thread(flood_load.stop)
    return window


@contextlib.contextmanager
def processes(store: str, flooders: int) -> Iterator[list[Served]]:
    started: list[Served] = []
    try:
        for name in ["A", *(f"B{n + 1}" for n in range(flooders)), "C"]:
            started.append(serve(name, store))
        yield started
    finally:
        for served in started:
            served.child.stop()


async def deployment(name: str, store_url: str, args: argparse.Namespace) -> list[Window]:
    print(
        f"{name}: A serves {args.subscribers} subscribers of one chat at {args.rate:g} "
        f"actions/s; {args.flooders} process(es) B serve {args.flood_chats} chats each, "
        f"flooded at {args.flood_rate:g} actions/s in all; C serves nothing"
    )
    # The control is started first: its imports take seconds on a busy machine.
    with controlling() as control, processes(store_url, args.flooders) as (a, *flooding, c):
        chat = await make_chat(a, f"ahp-session:/bench-x-{secrets.token_hex(3)}")
        a.child.info["chat"] = chat
        flooders = []
        for index, served in enumerate(flooding):
            chats = [
                await make_chat(served, f"ahp-session:/bench-b{index}-{n}-{secrets.token_hex(3)}")
                for n in range(args.flood_chats)
            ]
            flooders.append((served, chats))
        if not args.fresh:
            await came_and_went(a, [chat for _, chats in flooders for chat in chats])
        recorder = Recorder()
        subscribers = await open_many(
            args.subscribers, lambda i: open_huddle(a.child, f"sub-{i}", True)
        )
        dispatcher = await open_huddle(a.child, "dispatcher", False)
        readers = [asyncio.create_task(read_frames(ws, recorder)) for ws in subscribers]
        readers.append(asyncio.create_task(read_frames(dispatcher, Recorder())))
        store = RedisStore(store_url)
        await asyncio.to_thread(control.wait_ready)
        setup = Setup(
            a, c, control, chat, flooders, store, recorder, subscribers, dispatcher, readers
        )
        windows: list[Window] = []
        try:
            await run_window(setup, args, flooded=False)  # warm-up, not counted
            for index in range(args.windows):
                for flooded in (False, True) if index % 2 == 0 else (True, False):
                    window = await run_window(setup, args, flooded)
                    windows.append(window)
                    print(_window_line(index, window))
        finally:
            sockets = [*subscribers, dispatcher]
            await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            await store.close()
    return windows


def _window_line(index: int, w: Window) -> str:
    kind = "flood" if w.flooded else "quiet"
    flood = f", others accepted {w.flood_rate:7,.0f} actions/s" if w.flooded else ""
    return (
        f"  window {index + 1} {kind}: A delivered {w.delivered:>7,}/{w.expected:>7,}, "
        f"A CPU {w.cpu:5.2f} s ({w.cpu_per_frame * 1e6:6.2f} us/frame), "
        f"C CPU {w.idle_ms_per_second:6.2f} ms/s{flood}"
    )


def summary(name: str, windows: list[Window]) -> None:
    quiet = [w for w in windows if not w.flooded]
    flooded = [w for w in windows if w.flooded]
    per_frame_quiet = statistics.median(w.cpu_per_frame for w in quiet)
    per_frame_flood = statistics.median(w.cpu_per_frame for w in flooded)
    ratio = per_frame_flood / per_frame_quiet
    control = statistics.median(w.control_per_unit for w in flooded) / max(
        1e-9, statistics.median(w.control_per_unit for w in quiet)
    )
    lost = sum(w.expected - w.delivered for w in windows)
    print(f"{name}:")
    print(
        f"  A's server CPU per delivered frame: quiet {per_frame_quiet * 1e6:.2f} us, "
        f"flood {per_frame_flood * 1e6:.2f} us: ratio {ratio:.2f}; the control's CPU per "
        f"unit, flood over quiet, {control:.2f}; A's ratio over the control's "
        f"{ratio / control:.2f}   goal: <= {GOAL}  "
        f"met: {'yes' if ratio / control <= GOAL else 'NO'}"
        + (f"   ({lost} frame(s) not delivered)" if lost else "")
    )
    idle_quiet = statistics.median(w.idle_ms_per_second for w in quiet)
    idle_flood = statistics.median(w.idle_ms_per_second for w in flooded)
    rate = statistics.median(w.flood_rate for w in flooded)
    print(
        f"  C (serves no channel) CPU: {idle_flood:.2f} ms per second while the others take "
        f"{rate:,.0f} actions/s ({idle_flood / 10:.3f}% of a core), {idle_quiet:.2f} ms/s "
        f"when they do not" + (f": ratio {idle_flood / idle_quiet:.2f}" if idle_quiet > 0 else "")
    )


# ─── Deployments ─────────────────────────────────────────────────────────────


@contextlib.contextmanager
def cluster() -> Iterator[str]:
    running = RunningCluster.start(timeout=30, appendfsync="everysec")
    try:
        yield running.url()
    finally:
        running.destroy()


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args: argparse.Namespace) -> int:
    print("bench.fanout: what other processes' traffic costs a process, same run")
    print(
        f"  {os.cpu_count()} CPUs, load average {_loadavg()}, python "
        f"{platform.python_version()}, {args.windows} (quiet, flood) window pair(s) of "
        f"{args.seconds:g} s{', QUICK' if args.quick else ''}"
    )
    results: list[tuple[str, list[Window]]] = []
    if args.only in (None, "redis"):
        async with own_redis() as url:
            name = "single Redis"
            results.append((name, await deployment(name, url, args)))
    if args.only in (None, "cluster"):
        if shutil.which("redis-cli") is None:
            print("cluster: skipped (no redis-cli to create one)")
        else:
            with cluster() as url:
                name = "Redis Cluster, 3 primaries"
                results.append((name, await deployment(name, url, args)))
    for name, windows in results:
        summary(name, windows)
    print(f"  load average at the end {_loadavg()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fanout", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--only", choices=["redis", "cluster"], help="one deployment only")
    parser.add_argument("--subscribers", type=int, help="A's subscribers (50; quick 5)")
    parser.add_argument("--rate", type=float, help="A's actions a second (100; quick 50)")
    parser.add_argument("--flooders", type=int, help="flooding processes (2; quick 1)")
    parser.add_argument("--flood-chats", type=int, help="chats per flooder (10; quick 2)")
    parser.add_argument("--flood-rate", type=float, help="flood actions/s (5000; quick 200)")
    parser.add_argument("--seconds", type=float, help="seconds per window (5; quick 1)")
    parser.add_argument("--windows", type=int, help="(quiet, flood) pairs (3; quick 1)")
    parser.add_argument(
        "--fresh", action="store_true", help="skip the chats A served once (see above)"
    )
    parser.add_argument("--control", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flood-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--flood-token", help=argparse.SUPPRESS)
    parser.add_argument("--flood-at", type=float, help=argparse.SUPPRESS)
    parser.add_argument("chats", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.control:
        control_job()
        return 0
    if args.flood_port:
        asyncio.run(flood(args.flood_port, args.flood_token, args.chats, args.flood_at))
        return 0
    quick = args.quick
    args.subscribers = args.subscribers or (5 if quick else 50)
    args.rate = args.rate or (50.0 if quick else 100.0)
    args.flooders = args.flooders or (1 if quick else 2)
    args.flood_chats = args.flood_chats or (2 if quick else 10)
    args.flood_rate = args.flood_rate or (200.0 if quick else 5000.0)
    args.seconds = args.seconds or (1.0 if quick else 5.0)
    args.windows = args.windows or (1 if quick else 3)
    args.settle = 0.2 if quick else 1.0
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
