"""Fan-out cost: Huddle against a bare ``websockets`` relay, same load, same run.

    .venv/bin/python -m bench.broadcast [--quick] [--seconds S] [--rounds R]
                                        [--rate N] [--subscribers N] [--idle N]
                                        [--profile PATH]

Scenario: ``--subscribers`` raw ``websockets`` clients (in this process)
watch one chat whose active turn holds an open input request; a dispatcher
sends ``--rate`` ``chat/inputAnswerChanged`` a second (participant token,
JSON-RPC ``dispatchAction`` notifications) for ``--seconds``. Each answer's
text value carries ``time.time_ns()`` at sending, so every subscriber
computes its dispatch-to-delivery latency from the envelope it receives.

Baseline: a tiny ``websockets.asyncio.server`` relay that, for every text
frame from its dispatcher, sends those same bytes to every subscriber with
``websockets.broadcast``. Its dispatcher sends the very action frame Huddle
would fan out (same envelope, same size, same timestamp), so subscribers do
identical work for both.

Three targets, each a server in a child process of its own (``--serve-huddle
PORTFILE`` / ``--serve-relay PORTFILE``), so that its CPU time is read from
``/proc/<pid>/stat``: Huddle with plain AHP clients (each connection numbers
what it is sent: ``serverSeq`` spliced in once per distinct number), Huddle
with clients that ask for ``huddle.channelSeqs`` (as Huddle's own: the same
bytes for all), and the relay. Load windows rotate over the three (a round
starts one later each time) so machine noise hits all alike. Printed per
target: delivered / expected frames, latency p50 and p99, server CPU seconds
per delivered frame, and each Huddle's ratios to the relay (goals:
``CPU_GOALS`` for CPU per frame, ``P99_GOAL`` for p99). Then the memory of one
idle, initialized and subscribed connection: the Huddle child's RSS with
``--idle`` such connections minus its RSS with none, divided (the relay's
figure is printed beside it for scale).

``--profile PATH`` runs cProfile in the Huddle child during its load windows
only (enabled on SIGUSR1, disabled and dumped to PATH on SIGUSR2) and prints
the top entries; the CPU figures of a profiled run are inflated and not
comparable with the relay's.

Memory goal: at most ``MEMORY_GOAL_KIB`` per idle connection with 2,000 of
them (``--idle``); the ratio to the bare websockets server is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import json
import os
import pstats
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, broadcast, serve
from websockets.exceptions import ConnectionClosed

from protocol.actions import ChatInputAnswerChanged, ChatInputRequested, ChatTurnStarted
from protocol.chat import InputAnswer, InputRequest, Message, MessageOrigin, TextQuestion, TextValue
from protocol.codec import encode
from protocol.messages import (
    PROTOCOL_VERSION,
    ActionEnvelope,
    ActionOrigin,
    DispatchActionParams,
    InitializeParams,
)
from protocol.uris import ROOT_URI

CPU_GOALS = {"plain": 1.2, "ext": 1.1}
"""Server CPU per delivered frame, over the relay's, for each Huddle target."""
P99_GOAL = 1.3
EXTENSIONS: dict[str, Any] = {"huddle.channelSeqs": {}}
"""What the ``ext`` target's clients ask for at initialize."""
MEMORY_GOAL_KIB = 24.0
REQUEST_ID = "details"
QUESTIONS = 10
TURN_ID = "bench-turn"
SESSION = "ahp-session:/bench"
AGENT_TOKEN = "bench-agent-token-0123456789abcdef"
PEOPLE_PER_TOKEN = 30
"""Clients opened with one participant token: a person's token holds 32
sockets at once and starts 30 client ids (server.ratelimit), so many
clients are many people here, as they would be."""
STAMP = "ts:"
"""Prefix of the send time in the answer's text value (``ts:<time_ns>``)."""
ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CONNECT_BATCH = 50


# ─── Child: the Huddle server ────────────────────────────────────────────────


def _write_portfile(path: str, info: dict[str, Any]) -> None:
    temporary = f"{path}.tmp"
    Path(temporary).write_text(json.dumps(info))
    os.replace(temporary, path)


def _install_profiler(path: str) -> None:
    """SIGUSR1 starts profiling the event loop's thread; SIGUSR2 stops and
    dumps the stats gathered so far (they accumulate over windows)."""
    profiler = cProfile.Profile()
    loop = asyncio.get_running_loop()

    def stop() -> None:
        profiler.disable()
        profiler.dump_stats(path)

    loop.add_signal_handler(signal.SIGUSR1, profiler.enable)
    loop.add_signal_handler(signal.SIGUSR2, stop)


async def serve_huddle(portfile: str, profile: str | None) -> None:
    """Run Huddle on a loopback port with one chat whose active turn holds
    an open input request; write port, chat and the agent token."""
    from server.auth import TokenAuthority
    from server.build import build
    from server.config import Limits, Settings
    from server.edge.app import Server, create_app
    from server.edge.serve import UvicornServer, uvicorn_config
    from server.store.memory import MemoryStore

    # One dispatcher sends --rate actions a second; lift the per-connection
    # rate limit (50/s by default) so that it is not what gets measured.
    settings = Settings(port=0, limits=Limits(actions_per_second=100_000, action_burst=100_000))
    authority = TokenAuthority(AGENT_TOKEN)
    ready: dict[str, Any] = {}

    async def on_start(server: Server) -> None:
        host = server.parts.host
        chat = await host.create_session(SESSION, title="Bench")
        message = Message(text="Users cannot log in", origin=MessageOrigin(kind="user"))
        started = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        await host.dispatch(
            chat, ChatTurnStarted(turn_id=TURN_ID, started_at=started, message=message)
        )
        await host.dispatch(chat, ChatInputRequested(request=_request()))
        ready["chat"], ready["agent"] = chat, AGENT_TOKEN
        if profile is not None:
            _install_profiler(profile)

    app = create_app(build(settings, store=MemoryStore()), authority, on_start=on_start)

    def listening(port: int) -> None:
        _write_portfile(portfile, {"port": port, "pid": os.getpid(), **ready})

    config = uvicorn_config(app, settings, port=0, log_level="warning", access_log=False)
    await UvicornServer(config, on_listening=listening).serve()


def _request() -> InputRequest:
    return InputRequest(
        id=REQUEST_ID,
        message="Tell us about the outage",
        questions=[TextQuestion(id=f"q{i}", message=f"Question {i}?") for i in range(QUESTIONS)],
    )


# ─── Child: the bare relay ───────────────────────────────────────────────────


async def serve_relay(portfile: str) -> None:
    """Subscribers connect to ``/sub``; every text frame that arrives on any
    other path goes, as the same bytes, to every subscriber."""
    subscribers: set[ServerConnection] = set()

    async def handler(ws: ServerConnection) -> None:
        if ws.request is not None and ws.request.path == "/sub":
            subscribers.add(ws)
            try:
                await ws.wait_closed()
            finally:
                subscribers.discard(ws)
            return
        async for message in ws:
            broadcast(subscribers, message)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        _write_portfile(portfile, {"port": port, "pid": os.getpid()})
        await stop.wait()


# ─── Parent: children and /proc ──────────────────────────────────────────────


@dataclass
class Child:
    """A server child process and what it wrote to its port file (a Huddle
    child's ``agent``: its agent token, which :meth:`person_token` mints
    with)."""

    name: str
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    tokens_handed: int = 0
    people: list[str] = field(default_factory=list)
    """The participant tokens :meth:`person_token` minted, in order."""

    def person_token(self) -> str:
        """The participant token of one more client: a new one for every
        PEOPLE_PER_TOKEN, as that many people would hold."""
        from server.auth import TokenAuthority

        index, self.tokens_handed = self.tokens_handed // PEOPLE_PER_TOKEN, self.tokens_handed + 1
        if index == len(self.people):
            expires = time.time() + 24 * 3600
            authority = TokenAuthority(self.info["agent"])
            self.people.append(authority.mint("participant", name="bench", expires_at=expires))
        return self.people[index]

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        port: int = self.info["port"]
        return port

    def cpu_seconds(self) -> float:
        """User plus system CPU time of the child so far."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_child(mode: str, workdir: str, profile: str | None = None) -> Child:
    """Spawn a server child and wait (blocking) for its port file."""
    portfile = os.path.join(workdir, f"{mode}-{time.monotonic_ns()}.json")
    command = [sys.executable, "-m", "bench.broadcast", f"--serve-{mode}", portfile]
    if profile is not None:
        command += ["--profile-to", profile]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 60
    while not os.path.exists(portfile):
        if process.poll() is not None:
            raise SystemExit(f"the {mode} child exited with {process.returncode}")
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the {mode} child did not start within 60 s")
        time.sleep(0.05)
    return Child(mode, process, json.loads(Path(portfile).read_text()))


# ─── Parent: clients ─────────────────────────────────────────────────────────


@dataclass
class Recorder:
    """What the subscribers of one server saw during the current window."""

    recording: bool = False
    delivered: int = 0
    latencies_ns: list[int] = field(default_factory=list)
    closed: int = 0
    rejected: int = 0
    sample: str = ""

    def reset(self) -> None:
        self.recording, self.delivered, self.latencies_ns = True, 0, []

    def on_frame(self, frame: str | bytes) -> None:
        received = time.time_ns()
        if not isinstance(frame, str):
            return
        if '"rejectionReason"' in frame:
            self.rejected += 1
            return
        if not self.recording:
            return
        at = frame.find(STAMP)
        if at < 0:
            return
        start = at + len(STAMP)
        sent = int(frame[start : frame.index('"', start)])
        self.latencies_ns.append(received - sent)
        self.delivered += 1
        if not self.sample:
            self.sample = frame


async def read_frames(ws: ClientConnection, recorder: Recorder) -> None:
    try:
        async for frame in ws:
            recorder.on_frame(frame)
    except ConnectionClosed:
        pass
    recorder.closed += 1


def _initialize_frame(
    client_id: str, chat: str | None, capabilities: dict[str, Any] | None = None
) -> str:
    """``initialize`` (subscribing to ``chat``), as a plain AHP client
    sends it, or asking for ``capabilities``."""
    params = InitializeParams(
        channel=ROOT_URI,
        protocol_versions=[PROTOCOL_VERSION],
        client_id=client_id,
        capabilities=capabilities,
        initial_subscriptions=[chat] if chat is not None else None,
    )
    return encode({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}).decode()


async def open_huddle(
    child: Child, client_id: str, subscribe: bool, capabilities: dict[str, Any] | None = None
) -> ClientConnection:
    """A raw client that has initialized (and subscribed to the chat)."""
    ws = await connect(
        f"ws://127.0.0.1:{child.port}/ahp",
        additional_headers={"Authorization": f"Bearer {child.person_token()}"},
        compression=None,
        max_size=None,
    )
    chat = child.info["chat"] if subscribe else None
    await ws.send(_initialize_frame(client_id, chat, capabilities))
    reply = json.loads(await ws.recv())
    if "result" not in reply:
        raise SystemExit(f"initialize failed: {reply}")
    return ws


async def open_relay(child: Child, path: str) -> ClientConnection:
    return await connect(f"ws://127.0.0.1:{child.port}{path}", compression=None, max_size=None)


async def open_many(
    count: int, opener: Callable[[int], Awaitable[ClientConnection]]
) -> list[ClientConnection]:
    clients: list[ClientConnection] = []
    for first in range(0, count, CONNECT_BATCH):
        batch = range(first, min(count, first + CONNECT_BATCH))
        clients += await asyncio.gather(*(opener(i) for i in batch))
    return clients


def _answer(index: int) -> ChatInputAnswerChanged:
    value = TextValue(value=f"{STAMP}{time.time_ns()}")
    return ChatInputAnswerChanged(
        request_id=REQUEST_ID,
        question_id=f"q{index % QUESTIONS}",
        answer=InputAnswer(state="draft", value=value),
    )


_CLIENT_SEQS = itertools.count(1)
"""Every frame a new ``clientSeq``: a re-used one is a re-send, which the
server applies once (and echoes to its sender alone)."""


def huddle_frame(chat: str, index: int) -> str:
    """A participant's ``dispatchAction`` notification."""
    params = DispatchActionParams(
        channel=chat, client_seq=next(_CLIENT_SEQS), action=_answer(index)
    )
    return encode({"jsonrpc": "2.0", "method": "dispatchAction", "params": params}).decode()


def relay_frame(chat: str, index: int) -> str:
    """The ``action`` notification Huddle would fan out for the same answer."""
    envelope = ActionEnvelope(
        channel=chat,
        action=_answer(index),
        server_seq=index + 3,
        origin=ActionOrigin(client_id="bench-dispatcher", client_seq=index + 1),
    )
    return '{"jsonrpc":"2.0","method":"action","params":' + encode(envelope).decode() + "}"


@dataclass
class Target:
    """One server under load: its child, subscribers and dispatcher."""

    name: str
    child: Child
    recorder: Recorder
    inbox: Recorder
    subscribers: list[ClientConnection]
    readers: list[asyncio.Task[None]]
    dispatcher: ClientConnection
    frame: Callable[[int], str]
    windows: list[Window] = field(default_factory=list)


@dataclass
class Window:
    sent: int
    expected: int
    delivered: int
    seconds: float
    cpu: float
    load_cpu: float
    latencies_ns: list[int]

    @property
    def cpu_per_frame(self) -> float:
        return self.cpu / max(1, self.delivered)


async def run_window(target: Target, rate: float, seconds: float, profile: bool) -> Window:
    """Dispatch at ``rate`` for ``seconds``, wait for the fan-out to drain,
    and measure the server's CPU over the whole window."""
    recorder, child = target.recorder, target.child
    loop = asyncio.get_running_loop()
    count = round(rate * seconds)
    expected = count * len(target.subscribers)
    await asyncio.sleep(0.2)  # let the previous window's stragglers settle
    recorder.reset()
    if profile:
        os.kill(child.pid, signal.SIGUSR1)
    load0, cpu0, start = os.times(), child.cpu_seconds(), loop.time()
    for index in range(count):
        delay = start + index / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await target.dispatcher.send(target.frame(index))
    last, stalled = recorder.delivered, loop.time()
    while recorder.delivered < expected and loop.time() - stalled < 3.0:
        await asyncio.sleep(0.05)
        if recorder.delivered != last:
            last, stalled = recorder.delivered, loop.time()
    elapsed = loop.time() - start
    cpu, load1 = child.cpu_seconds() - cpu0, os.times()
    recorder.recording = False
    if profile:
        os.kill(child.pid, signal.SIGUSR2)
    load_cpu = (load1.user + load1.system) - (load0.user + load0.system)
    return Window(
        count, expected, recorder.delivered, elapsed, cpu, load_cpu, recorder.latencies_ns
    )


async def open_target(
    name: str, child: Child, subscribers: int, chat: str, capabilities: dict[str, Any] | None
) -> Target:
    """Connect ``subscribers`` (asking for ``capabilities``) and a
    dispatcher; ``chat`` names the channel in the relay's frames too, so
    that every server sends equal frames."""
    recorder = Recorder()
    if child.name == "huddle":
        subs = await open_many(
            subscribers, lambda i: open_huddle(child, f"sub-{i}", True, capabilities)
        )
        dispatcher = await open_huddle(child, "bench-dispatcher", False)

        def frame(index: int) -> str:
            return huddle_frame(chat, index)

    else:
        subs = await open_many(subscribers, lambda i: open_relay(child, "/sub"))
        dispatcher = await open_relay(child, "/pub")

        def frame(index: int) -> str:
            return relay_frame(chat, index)

    readers = [asyncio.create_task(read_frames(ws, recorder)) for ws in subs]
    inbox = Recorder()  # the dispatcher's: only rejections would arrive
    readers.append(asyncio.create_task(read_frames(dispatcher, inbox)))
    return Target(name, child, recorder, inbox, subs, readers, dispatcher, frame)


async def close_target(target: Target) -> None:
    await asyncio.gather(
        *(ws.close() for ws in [*target.subscribers, target.dispatcher]), return_exceptions=True
    )
    for reader in target.readers:
        reader.cancel()
    await asyncio.gather(*target.readers, return_exceptions=True)


# ─── Parent: idle memory ─────────────────────────────────────────────────────


async def idle_memory(child: Child, count: int, settle: float) -> tuple[int, int]:
    """RSS of ``child`` with no client and with ``count`` idle ones, each
    read ``settle`` seconds after the connections opened or closed."""

    async def opener(i: int) -> ClientConnection:
        if child.name == "huddle":
            return await open_huddle(child, f"idle-{i}", True)
        return await open_relay(child, "/sub")

    warm = await open_many(10, opener)  # first-use costs: imports, caches
    await asyncio.gather(*(ws.close() for ws in warm))
    await asyncio.sleep(settle)
    before = child.rss_bytes()
    clients = await open_many(count, opener)
    await asyncio.sleep(settle)
    after = child.rss_bytes()
    await asyncio.gather(*(ws.close() for ws in clients), return_exceptions=True)
    return before, after


# ─── Parent: report ──────────────────────────────────────────────────────────


def _percentile(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def _summary(name: str, windows: list[Window]) -> tuple[str, float, float]:
    """The summary line of a target, its CPU per frame and its p99 (ms)."""
    delivered = sum(w.delivered for w in windows)
    expected = sum(w.expected for w in windows)
    latencies = [lat for w in windows for lat in w.latencies_ns]
    per_frame = statistics.median(w.cpu_per_frame for w in windows)
    line = (
        f"  {name:<7} delivered {delivered:>9,} / {expected:>9,} expected   "
        f"latency p50 {_percentile(latencies, 0.50):7.2f} ms  p99 "
        f"{_percentile(latencies, 0.99):7.2f} ms   "
        f"server CPU {per_frame * 1e6:6.2f} us/frame (median of windows)"
    )
    return line, per_frame, _percentile(latencies, 0.99)


def _window_line(name: str, index: int, w: Window) -> str:
    return (
        f"  {name:<7} window {index + 1}: sent {w.sent:>5} in {w.seconds:5.1f} s, "
        f"delivered {w.delivered:>8,}/{w.expected:>8,}, p50 "
        f"{_percentile(w.latencies_ns, 0.5):7.2f} ms, p99 {_percentile(w.latencies_ns, 0.99):7.2f}"
        f" ms, server CPU {w.cpu:5.2f} s ({w.cpu_per_frame * 1e6:6.2f} us/frame), "
        f"load generator CPU {w.load_cpu:5.2f} s"
    )


def print_profile(path: str, top: int) -> None:
    if not os.path.exists(path):
        print("Huddle server profile: the child wrote none")
        return
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    print("Huddle server profile (cProfile, load windows only; inflated CPU):")
    print(out.getvalue())


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def run(args: argparse.Namespace) -> int:
    print("bench.broadcast: Huddle vs a bare websockets relay, same load, same run")
    print(
        f"  {os.cpu_count()} CPUs, load average {_loadavg()}, python {sys.version.split()[0]}, "
        f"{args.subscribers} subscribers, {args.rate:g} actions/s for {args.seconds:g} s, "
        f"{args.rounds} round(s) of (plain, ext, relay){', QUICK' if args.quick else ''}"
    )
    print(
        "  Huddle: memory store, default settings but the per-connection action rate limit "
        "(lifted for the one dispatcher); relay: websockets.broadcast; asyncio loop, no uvloop"
    )
    print(
        "  plain: Huddle, plain AHP clients (numbered per connection); ext: Huddle, clients "
        "asking for huddle.channelSeqs; relay: the bare websockets relay"
    )
    with tempfile.TemporaryDirectory(prefix="huddle-bench-") as workdir:
        profile: str | None = args.profile
        plain = await asyncio.to_thread(start_child, "huddle", workdir, profile)
        ext = await asyncio.to_thread(start_child, "huddle", workdir)
        relay = await asyncio.to_thread(start_child, "relay", workdir)
        targets: list[Target] = []
        try:
            chat: str = plain.info["chat"]
            targets = [
                await open_target("plain", plain, args.subscribers, chat, None),
                await open_target("ext", ext, args.subscribers, ext.info["chat"], EXTENSIONS),
                await open_target("relay", relay, args.subscribers, chat, None),
            ]
            for target in targets:  # warm-up at the same rate, not counted
                await run_window(target, args.rate, args.warmup, False)
            for index in range(args.rounds):
                start = index % len(targets)
                for target in targets[start:] + targets[:start]:
                    window = await run_window(
                        target,
                        args.rate,
                        args.seconds,
                        profile is not None and target is targets[0],
                    )
                    target.windows.append(window)
                    print(_window_line(target.name, index, window))
            for target in targets:
                closed, rejected = target.recorder.closed, target.inbox.rejected
                if closed or rejected:
                    print(
                        f"  {target.name}: {closed} subscriber(s) closed by the server, "
                        f"{rejected} action(s) rejected"
                    )
        finally:
            for target in targets:
                await close_target(target)
            plain.stop()
            ext.stop()
            relay.stop()
        print("fan-out (all windows):")
        figures = {target.name: _summary(target.name, target.windows) for target in targets}
        for line, _, _ in figures.values():
            print(line)
        sizes = ", ".join(f"{t.name} {len(t.recorder.sample)} B" for t in targets)
        print(f"  frame size: {sizes}")
        _, relay_cpu, relay_p99 = figures["relay"]
        for name, goal in CPU_GOALS.items():
            _, cpu, p99 = figures[name]
            print(
                f"  {name} / relay: server CPU per delivered frame {cpu / relay_cpu:.2f}   "
                f"goal: <= {goal}  met: {'yes' if cpu / relay_cpu <= goal else 'NO'};  "
                f"p99 {p99 / relay_p99:.2f}   goal: <= {P99_GOAL}  "
                f"met: {'yes' if p99 / relay_p99 <= P99_GOAL else 'NO'}"
            )

        print(f"memory per idle connection (initialized, subscribed; 0 vs {args.idle}):")
        per_connection: dict[str, float] = {}
        for mode in ("huddle", "relay"):
            child = await asyncio.to_thread(start_child, mode, workdir)
            try:
                before, after = await idle_memory(child, args.idle, args.settle)
            finally:
                child.stop()
            per_connection[mode] = (after - before) / args.idle / 1024
            print(
                f"  {mode:<7} RSS {before / 2**20:7.1f} MiB -> {after / 2**20:7.1f} MiB: "
                f"{per_connection[mode]:6.1f} KiB per connection"
                + ("" if mode == "huddle" else "  (bare websockets)")
            )
        kib = per_connection["huddle"]
        print(
            f"  huddle / bare websockets: ratio {kib / per_connection['relay']:.2f}   "
            f"goal: <= {MEMORY_GOAL_KIB:g} KiB  met: {'yes' if kib <= MEMORY_GOAL_KIB else 'NO'}"
        )
        print(f"  load average at the end {_loadavg()}")
        if profile is not None:
            print_profile(profile, args.profile_top)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.broadcast", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--seconds", type=float, help="load per window (default 8; quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds of the three (default 3; quick 1)")
    parser.add_argument("--rate", type=float, default=200.0, help="actions a second (200)")
    parser.add_argument("--subscribers", type=int, help="subscribers (default 100; quick 20)")
    parser.add_argument("--idle", type=int, help="idle connections (default 2000; quick 100)")
    parser.add_argument("--profile", metavar="PATH", help="cProfile the Huddle child to PATH")
    parser.add_argument("--profile-top", type=int, default=30, help="profile rows to print")
    parser.add_argument("--serve-huddle", metavar="PORTFILE", help=argparse.SUPPRESS)
    parser.add_argument("--serve-relay", metavar="PORTFILE", help=argparse.SUPPRESS)
    parser.add_argument("--profile-to", metavar="PATH", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_huddle:
        asyncio.run(serve_huddle(args.serve_huddle, args.profile_to))
        return 0
    if args.serve_relay:
        asyncio.run(serve_relay(args.serve_relay))
        return 0
    args.seconds = args.seconds or (1.0 if args.quick else 8.0)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.subscribers = args.subscribers or (20 if args.quick else 100)
    args.idle = args.idle or (100 if args.quick else 2000)
    args.warmup = 0.25 if args.quick else 1.0
    args.settle = 0.3 if args.quick else 1.5
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
