"""The Redis store under load, each figure beside a baseline from the same run.

    .venv/bin/python -m bench.redis_store [--quick] [--redis URL] [--only PART]
        [--chats N] [--actions N] [--rounds N]
        [--subscribers N] [--rate N] [--seconds S] [--windows N]

Without ``--redis`` the benchmark runs a redis-server of its own on a unix
socket in a temporary directory, with ``appendonly yes`` and ``appendfsync
everysec`` (DESIGN.md's setting). With ``--redis URL`` that database is used
and never flushed: every key the run writes has a name of its own, (a)
deletes its sessions and keys at the end, and what stays behind is the root
channel, the client records and the fan-out's ``ahp-session:/bench-<hex>``.

(a) Throughput. One :class:`server.core.host.Host` in this process on a
    :class:`RedisStore`: ``--chats`` chats, each with an open input request,
    one dispatcher task per chat sending ``--actions``
    ``chat/inputAnswerChanged`` one after another through ``Host.dispatch``
    (validate, reduce, append, broadcast, the session's upkeep). Baseline: a
    bare redis-py loop with the same concurrency, one task per channel
    calling the same APPEND script (``EVALSHA``) with an entry of the same
    size; and, for scale, the same appends sent one pipeline per step (all
    channels' next append at once: what group commit aims at). Rounds
    alternate their order (host, bare, piped, then the other way round);
    medians are compared. Goal: host / bare >= 0.8. CPU per action of this
    process and of redis-server (``INFO cpu``) is printed beside each.
    redis-py parses replies in Python unless ``hiredis`` is installed; the
    header says which.
(b) Fan-out. bench.broadcast's load (``--subscribers`` raw WebSocket clients
    on one chat, one dispatcher sending ``--rate`` actions a second, each
    answer stamped with its send time) against a Huddle child on the Redis
    store and one on the memory store: delivered / expected, latency p50 and
    p99, server CPU per delivered frame, and the Redis / memory ratios.
(c) Across processes. A second Huddle child on the same Redis serves the
    same chat: the dispatcher sends to the first child and the subscribers
    listen on the second, so every action travels child -> Redis (append,
    pub/sub) -> child. Dispatch-to-delivery p50 / p99 beside (b)'s Redis
    figures, where dispatcher and subscribers share one child.

The load windows of (b) and (c) alternate (memory, redis, cross, then the
other way round ...) so that machine noise hits all three alike. The last
line counts Redis's ``aof_delayed_fsync``: writes it held back because an
``everysec`` fsync was still running (a slow disk shows up as p99 spikes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.utils import HIREDIS_AVAILABLE
from websockets.asyncio.client import ClientConnection

from bench.broadcast import (
    AGENT_TOKEN,
    Child,
    Recorder,
    huddle_frame,
    open_huddle,
    open_many,
    read_frames,
)
from protocol.actions import ChatInputAnswerChanged, ChatInputRequested, ChatTurnStarted
from protocol.chat import (
    InputAnswer,
    InputQuestion,
    InputRequest,
    Message,
    MessageOrigin,
    TextQuestion,
    TextValue,
)
from protocol.codec import encode
from protocol.messages import ActionEnvelope
from server.auth import TokenAuthority
from server.build import build, default_agents
from server.config import Limits, Settings
from server.core.host import Host
from server.edge.app import Server, create_app
from server.edge.serve import UvicornServer, uvicorn_config
from server.store.base import encode_entry
from server.store.redis import APPEND, RedisStore
from tests.redis_server import RedisServer

THROUGHPUT_GOAL = 0.8
ROOT = Path(__file__).resolve().parent.parent
REQUEST_ID = "details"
QUESTIONS = 10
TURN_ID = "bench-turn"
STALL = 3.0
"""Seconds without a delivery after which a window stops waiting."""


def _request() -> InputRequest:
    questions: list[InputQuestion] = [
        TextQuestion(id=f"q{i}", message=f"Question {i}?") for i in range(QUESTIONS)
    ]
    return InputRequest(id=REQUEST_ID, message="Tell us about the outage", questions=questions)


def _turn() -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id=TURN_ID,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        message=Message(text="Users cannot log in", origin=MessageOrigin(kind="user")),
    )


def _answer(n: int) -> ChatInputAnswerChanged:
    value = TextValue(value=f"draft {n} of a person typing an answer")
    return ChatInputAnswerChanged(
        request_id=REQUEST_ID,
        question_id=f"q{n % QUESTIONS}",
        answer=InputAnswer(state="draft", value=value),
    )


def _percentile(values: list[int], q: float) -> float:
    """The ``q`` quantile of nanosecond ``values``, in milliseconds."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _redis_cpu(client: aioredis.Redis) -> float:
    info: dict[str, Any] = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# ─── Child: a Huddle server ──────────────────────────────────────────────────


async def serve_child(portfile: str, store: str, chat: str | None) -> None:
    """Run Huddle on a loopback port with ``store``. Without ``chat``, make a
    session whose chat's active turn holds an open input request; with it,
    serve that chat (made by another child on the same Redis). Write the
    port, the chat and the agent token to ``portfile``."""
    # One dispatcher sends --rate actions a second: lift the per-connection
    # rate limit so that it is not what gets measured.
    limits = Limits(actions_per_second=100_000, action_burst=100_000)
    settings = Settings(port=0, store=store, limits=limits)
    authority = TokenAuthority(AGENT_TOKEN)
    ready: dict[str, Any] = {}

    async def on_start(server: Server) -> None:
        host = server.host
        served = chat
        if served is None:
            session = f"ahp-session:/bench-{secrets.token_hex(4)}"
            served = await host.create_session(session, title="Bench")
            await host.dispatch(served, _turn())
            await host.dispatch(served, ChatInputRequested(request=_request()))
        await host.view(served)
        ready["chat"], ready["agent"] = served, AGENT_TOKEN

    app = create_app(build(settings), authority, on_start=on_start)

    def listening(port: int) -> None:
        temporary = f"{portfile}.tmp"
        Path(temporary).write_text(json.dumps({"port": port, "pid": os.getpid(), **ready}))
        os.replace(temporary, portfile)

    config = uvicorn_config(app, settings, port=0, log_level="warning", access_log=False)
    await UvicornServer(config, on_listening=listening).serve()


def start_child(name: str, workdir: str, store: str, chat: str | None = None) -> Child:
    """Spawn a Huddle child and wait (blocking) for its port file."""
    portfile = os.path.join(workdir, f"{name}-{time.monotonic_ns()}.json")
    command = [sys.executable, "-m", "bench.redis_store", "--serve", portfile, "--store", store]
    if chat is not None:
        command += ["--chat", chat]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not os.path.exists(portfile):
        if process.poll() is not None:
            raise SystemExit(f"the {name} child exited with {process.returncode}")
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the {name} child did not start within 60 s")
        time.sleep(0.05)
    return Child(name, process, json.loads(Path(portfile).read_text()))


# ─── (a) Throughput: Host.dispatch against a bare EVALSHA loop ───────────────


@dataclass
class Round:
    actions: int
    seconds: float
    cpu: float
    redis_cpu: float

    @property
    def rate(self) -> float:
        return self.actions / self.seconds


async def _timed(
    redis_client: aioredis.Redis, actions: int, work: Callable[[], Awaitable[None]]
) -> Round:
    redis0, cpu0, start = await _redis_cpu(redis_client), _cpu(), time.perf_counter()
    await work()
    seconds, cpu = time.perf_counter() - start, _cpu() - cpu0
    return Round(actions, seconds, cpu, await _redis_cpu(redis_client) - redis0)


async def host_round(host: Host, chats: list[str], actions: int, first: int) -> None:
    async def one(chat: str) -> None:
        for n in range(first, first + actions):
            await host.dispatch(chat, _answer(n))

    await asyncio.gather(*(one(chat) for chat in chats))


async def bare_round(client: aioredis.Redis, channels: list[str], actions: int) -> None:
    sha = await client.script_load(APPEND)
    entry = _entry_like_the_hosts(channels[0])
    for channel in channels:
        await client.hset(f"huddle:{{{channel}}}:meta", mapping={"seq": 0, "epoch": "bench"})

    async def one(channel: str) -> None:
        meta, log = f"huddle:{{{channel}}}:meta", f"huddle:{{{channel}}}:log"
        for seq in range(actions):
            result = await client.evalsha(sha, 2, meta, log, seq, entry, channel)
            if int(result[0]) != 1:
                raise SystemExit(f"bare append failed: {result}")

    await asyncio.gather(*(one(channel) for channel in channels))


async def piped_round(client: aioredis.Redis, channels: list[str], actions: int) -> None:
    """The bare loop's appends, but each step's (one per channel) sent as
    one pipeline: what group commit aims at."""
    sha = await client.script_load(APPEND)
    entry = _entry_like_the_hosts(channels[0])
    for channel in channels:
        await client.hset(f"huddle:{{{channel}}}:meta", mapping={"seq": 0, "epoch": "bench"})
    for seq in range(actions):
        pipe = client.pipeline(transaction=False)
        for channel in channels:
            meta, log = f"huddle:{{{channel}}}:meta", f"huddle:{{{channel}}}:log"
            pipe.evalsha(sha, 2, meta, log, seq, entry, channel)
        results = await pipe.execute()
        if any(int(result[0]) != 1 for result in results):
            raise SystemExit(f"pipelined append failed: {results}")


def _entry_like_the_hosts(channel: str) -> bytes:
    """A log entry as the host writes one for ``_answer``."""
    envelope = ActionEnvelope(channel=channel, action=_answer(123), server_seq=1234)
    return encode_entry(int(time.time() * 1000), encode(envelope))


def bare_channels(tag: str, kind: str, count: int) -> list[str]:
    return [f"ahp-chat:/bench-{tag}-{kind}-{i}" for i in range(count)]


async def throughput(url: str, args: argparse.Namespace) -> None:
    print(
        f"(a) accepted actions/s: {args.chats} chats x {args.actions} chat/inputAnswerChanged, "
        f"one task per chat, {args.rounds} round(s)"
    )
    tag = secrets.token_hex(4)
    store = RedisStore(url)
    host = Host(store, agents=default_agents())
    bare = aioredis.Redis.from_url(url)
    sessions: list[str] = []
    try:
        await host.start()
        chats = []
        for i in range(args.chats):
            sessions.append(f"ahp-session:/bench-{tag}-{i}")
            chat = await host.create_session(sessions[-1], title="Bench")
            await host.dispatch(chat, _turn())
            await host.dispatch(chat, ChatInputRequested(request=_request()))
            chats.append(chat)
        # Warm-up, not counted: scripts loaded, connections open, caches hot.
        await host_round(host, chats, 5, 0)
        await bare_round(bare, bare_channels(tag, "warm", 2), 5)
        rounds: dict[str, list[Round]] = {"host": [], "bare": [], "piped": []}
        total = args.chats * args.actions
        for index in range(args.rounds):
            first = 5 + index * args.actions

            async def run_host(first: int = first) -> None:
                await host_round(host, chats, args.actions, first)

            async def run_bare(index: int = index) -> None:
                await bare_round(bare, bare_channels(tag, f"bare{index}", args.chats), args.actions)

            async def run_piped(index: int = index) -> None:
                channels = bare_channels(tag, f"piped{index}", args.chats)
                await piped_round(bare, channels, args.actions)

            order: list[tuple[str, Callable[[], Awaitable[None]]]] = [
                ("host", run_host),
                ("bare", run_bare),
                ("piped", run_piped),
            ]
            for name, work in order if index % 2 == 0 else order[::-1]:
                rounds[name].append(await _timed(bare, total, work))
            print(
                f"  round {index + 1}: "
                + "   ".join(f"{name} {done[-1].rate:9,.0f}/s" for name, done in rounds.items())
            )
        labels = {
            "host": "host (Host.dispatch, RedisStore)        ",
            "bare": "bare (redis-py EVALSHA APPEND, per call)",
            "piped": "bare, one pipeline per step (for scale) ",
        }
        for name, label in labels.items():
            done = rounds[name]
            print(
                f"  {label} median {statistics.median(r.rate for r in done):9,.0f} actions/s   "
                f"this process CPU {statistics.median(r.cpu / r.actions for r in done) * 1e6:6.1f}"
                f" us/action   redis-server CPU "
                f"{statistics.median(r.redis_cpu / r.actions for r in done) * 1e6:5.1f} us/action"
            )
        ratio = statistics.median(r.rate for r in rounds["host"]) / statistics.median(
            r.rate for r in rounds["bare"]
        )
        met = "yes" if ratio >= THROUGHPUT_GOAL else "NO"
        print(
            f"  throughput, host / bare: ratio {ratio:.2f}   goal: >= {THROUGHPUT_GOAL}  met: {met}"
        )
    finally:
        if args.redis:
            for session in sessions:
                with contextlib.suppress(Exception):
                    await host.dispose_session(session)
            names = [bare_channels(tag, "warm", 2)]
            names += [
                bare_channels(tag, f"{kind}{r}", args.chats)
                for kind in ("bare", "piped")
                for r in range(args.rounds)
            ]
            keys = [
                f"huddle:{{{c}}}:{k}" for group in names for c in group for k in ("meta", "log")
            ]
            await bare.delete(*keys)
        await host.stop()
        await store.close()
        await bare.aclose()


# ─── (b), (c) Fan-out over WebSockets ────────────────────────────────────────


@dataclass
class Window:
    sent: int
    expected: int
    delivered: int
    cpu: float
    latencies_ns: list[int]


@dataclass
class Target:
    """One way of serving the load: where the dispatcher sends, where the
    subscribers listen, and whose CPU counts."""

    name: str
    servers: list[Child]
    chat: str
    recorder: Recorder
    subscribers: list[ClientConnection]
    dispatcher: ClientConnection
    readers: list[asyncio.Task[None]]
    windows: list[Window] = field(default_factory=list)

    def cpu(self) -> float:
        return sum(child.cpu_seconds() for child in self.servers)


async def open_target(
    name: str, publish_to: Child, listen_on: Child, servers: list[Child], subscribers: int
) -> Target:
    recorder = Recorder()
    subs = await open_many(subscribers, lambda i: open_huddle(listen_on, f"{name}-sub-{i}", True))
    dispatcher = await open_huddle(publish_to, f"{name}-dispatcher", False)
    readers = [asyncio.create_task(read_frames(ws, recorder)) for ws in subs]
    readers.append(asyncio.create_task(read_frames(dispatcher, Recorder())))
    chat: str = publish_to.info["chat"]
    return Target(name, servers, chat, recorder, subs, dispatcher, readers)


async def close_target(target: Target) -> None:
    sockets = [*target.subscribers, target.dispatcher]
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for reader in target.readers:
        reader.cancel()
    await asyncio.gather(*target.readers, return_exceptions=True)


async def run_window(target: Target, rate: float, seconds: float) -> Window:
    """Dispatch at ``rate`` for ``seconds``; wait for the fan-out to drain."""
    loop = asyncio.get_running_loop()
    recorder = target.recorder
    count = round(rate * seconds)
    expected = count * len(target.subscribers)
    await asyncio.sleep(0.2)  # let the previous window's stragglers settle
    recorder.reset()
    cpu0, start = target.cpu(), loop.time()
    for index in range(count):
        delay = start + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await target.dispatcher.send(huddle_frame(target.chat, index))
    last, stalled = recorder.delivered, loop.time()
    while recorder.delivered < expected and loop.time() - stalled < STALL:
        await asyncio.sleep(0.05)
        if recorder.delivered != last:
            last, stalled = recorder.delivered, loop.time()
    cpu = target.cpu() - cpu0
    recorder.recording = False
    return Window(count, expected, recorder.delivered, cpu, list(recorder.latencies_ns))


@dataclass(frozen=True)
class Summary:
    delivered: int
    expected: int
    p50: float
    p99: float
    cpu_per_frame: float

    @classmethod
    def of(cls, windows: list[Window]) -> Summary:
        latencies = [lat for w in windows for lat in w.latencies_ns]
        return cls(
            delivered=sum(w.delivered for w in windows),
            expected=sum(w.expected for w in windows),
            p50=_percentile(latencies, 0.50),
            p99=_percentile(latencies, 0.99),
            cpu_per_frame=statistics.median(w.cpu / max(1, w.delivered) for w in windows),
        )

    def line(self, label: str) -> str:
        return (
            f"  {label} delivered {self.delivered:>8,} / {self.expected:>8,}   "
            f"latency p50 {self.p50:7.2f} ms  p99 {self.p99:7.2f} ms   "
            f"server CPU {self.cpu_per_frame * 1e6:6.2f} us/frame"
        )


async def fan_out(url: str, workdir: str, args: argparse.Namespace) -> None:
    print(
        f"(b) fan-out and (c) across processes: {args.subscribers} subscribers, "
        f"{args.rate:g} actions/s for {args.seconds:g} s, {args.windows} window(s) each"
    )
    memory, first = await asyncio.gather(
        asyncio.to_thread(start_child, "memory", workdir, "memory"),
        asyncio.to_thread(start_child, "redis", workdir, url),
    )
    children = [memory, first]
    targets: list[Target] = []
    try:
        second = await asyncio.to_thread(start_child, "redis-2", workdir, url, first.info["chat"])
        children.append(second)
        targets = [
            await open_target("memory", memory, memory, [memory], args.subscribers),
            await open_target("redis", first, first, [first], args.subscribers),
            await open_target("cross", first, second, [first, second], args.subscribers),
        ]
        for target in targets:  # warm-up at the same rate, not counted
            await run_window(target, args.rate, args.warmup)
        for index in range(args.windows):
            for target in targets if index % 2 == 0 else targets[::-1]:
                window = await run_window(target, args.rate, args.seconds)
                target.windows.append(window)
                print(
                    f"  {target.name:<6} window {index + 1}: delivered "
                    f"{window.delivered:>7,}/{window.expected:>7,}, p50 "
                    f"{_percentile(window.latencies_ns, 0.5):7.2f} ms, p99 "
                    f"{_percentile(window.latencies_ns, 0.99):7.2f} ms, "
                    f"server CPU {window.cpu:5.2f} s"
                )
        for target in targets:
            if target.recorder.closed or target.recorder.rejected:
                print(
                    f"  {target.name}: {target.recorder.closed} subscriber(s) closed, "
                    f"{target.recorder.rejected} rejection(s)"
                )
    finally:
        for target in targets:
            await close_target(target)
        for child in children:
            child.stop()
    mem, red, cross = (Summary.of(t.windows) for t in targets)
    print("(b) fan-out, one child serving dispatcher and subscribers:")
    print(mem.line("memory store"))
    print(red.line("redis store "))
    print(
        f"  redis / memory: server CPU per frame ratio "
        f"{red.cpu_per_frame / mem.cpu_per_frame:.2f}, latency p50 ratio "
        f"{red.p50 / mem.p50:.2f}, p99 ratio {red.p99 / mem.p99:.2f}"
    )
    print("(c) dispatch-to-delivery across processes on one Redis:")
    print(red.line("one child   "))
    print(cross.line("two children"))
    print(
        f"  two children / one child: latency p50 ratio {cross.p50 / red.p50:.2f}, "
        f"p99 ratio {cross.p99 / red.p99:.2f}  (CPU counts both children)"
    )


# ─── Main ────────────────────────────────────────────────────────────────────


@contextlib.asynccontextmanager
async def own_redis() -> AsyncIterator[str]:
    """A redis-server of the benchmark's own: unix socket, AOF everysec."""
    directory = Path(tempfile.mkdtemp(prefix="huddle-bench-redis-", dir="/tmp"))
    server = RedisServer(directory, appendfsync="everysec")
    try:
        async with asyncio.timeout(20):
            await server.start()
        yield server.url
    finally:
        await server.kill()
        shutil.rmtree(directory, ignore_errors=True)


async def _redis_line(url: str, own: bool) -> str:
    client = aioredis.Redis.from_url(url)
    try:
        server: dict[str, Any] = await client.info("server")
        persistence: dict[str, Any] = await client.info("persistence")
        config: dict[Any, Any] = await client.config_get("appendfsync")
    finally:
        await client.aclose()
    return (
        f"redis {server['redis_version']} ({'own, unix socket' if own else url}, "
        f"appendonly {'yes' if persistence.get('aof_enabled') else 'no'}, "
        f"appendfsync {config.get('appendfsync', '?')}), "
        f"redis-py {redis.__version__} {'with' if HIREDIS_AVAILABLE else 'without'} hiredis"
    )


async def _fsync_line(url: str) -> str:
    """How often Redis held writes back for a slow fsync (latency spikes)."""
    client = aioredis.Redis.from_url(url)
    try:
        persistence: dict[str, Any] = await client.info("persistence")
    finally:
        await client.aclose()
    if not persistence.get("aof_enabled"):
        return "redis AOF off"
    delayed = persistence.get("aof_delayed_fsync", "?")
    return f"redis aof_delayed_fsync {delayed} (writes held back for a slow fsync)"


async def run(args: argparse.Namespace) -> int:
    async with contextlib.AsyncExitStack() as stack:
        url: str = args.redis or await stack.enter_async_context(own_redis())
        print("bench.redis_store: the Redis store against baselines measured in the same run")
        print(
            f"  {os.cpu_count()} CPUs, load average {_loadavg()}, python "
            f"{platform.python_version()}, {await _redis_line(url, not args.redis)}"
            f"{', QUICK' if args.quick else ''}"
        )
        if args.only in (None, "throughput"):
            await throughput(url, args)
        if args.only in (None, "fan-out"):
            with tempfile.TemporaryDirectory(prefix="huddle-bench-") as workdir:
                await fan_out(url, workdir, args)
        print(f"  load average at the end {_loadavg()}; {await _fsync_line(url)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.redis_store", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--redis", metavar="URL", help="use this Redis instead of an own one")
    parser.add_argument(
        "--only", choices=["throughput", "fan-out"], help="run (a) only, or (b) and (c) only"
    )
    parser.add_argument("--chats", type=int, help="(a) chats (default 50; quick 10)")
    parser.add_argument("--actions", type=int, help="(a) actions per chat (default 200; quick 20)")
    parser.add_argument("--rounds", type=int, help="(a) rounds of each loop (5; quick 1)")
    parser.add_argument("--subscribers", type=int, help="(b, c) subscribers (100; quick 20)")
    parser.add_argument("--rate", type=float, default=200.0, help="(b, c) actions a second")
    parser.add_argument("--seconds", type=float, help="(b, c) seconds per window (5; quick 1)")
    parser.add_argument("--windows", type=int, help="(b, c) windows per target (3; quick 1)")
    parser.add_argument("--serve", metavar="PORTFILE", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--chat", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve_child(args.serve, args.store, args.chat))
        return 0
    args.chats = args.chats or (10 if args.quick else 50)
    args.actions = args.actions or (20 if args.quick else 200)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.subscribers = args.subscribers or (20 if args.quick else 100)
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    args.windows = args.windows or (1 if args.quick else 3)
    args.warmup = 0.25 if args.quick else 1.0
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
