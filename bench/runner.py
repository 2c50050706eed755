"""Resume latency of the durable runner: a person's answer to the tool it unblocks.

    .venv/bin/python -m bench.runner [--quick] [--turns N] [--rounds N] [--pings N]
                                     [--think S] [--race-turns N] [--trace]
                                     [--against CHECKOUT]

Scenario: the bench agent (:func:`bench_agent`, loaded by the servers and
the worker with ``--agent bench.runner:bench_agent``) asks a form with
``request_user_input``; once it is submitted its scripted model calls
``stamp_after_form`` (allowed), ``stamp_with_its_form`` (which raises
FormRequired, and runs again once its own form is submitted) and
``stamp_after_approval`` (needs a person's approval); then it says
"Done.". Each tool's first statement is ``time.time_ns()``, which it
``RPUSH``es, with its kind and turn id, on a list in the benchmark's
redis-server (the second tool only on its run with the data). One participant (``HuddleClient``,
the participant token ``huddle serve`` prints) plays every turn, one at a
time, each in a session of its own: it waits for the form in its mirror of
the chat, looks at it for ``--think`` seconds as a person would, takes
``time.time_ns()`` and dispatches ``chat/inputCompleted``; it does the same
for the tool's own form (``inputCompleted/tool`` below), and once the last
call waits for confirmation, with ``chat/toolCallConfirmed``. A sample is the tool's stamp minus the
participant's: send (the client's encoding included, a few us), the server
accepting the action, the resume it submits, a worker claiming the turn
and running it up to the tool, all observed from outside.

Set-ups, each a ``huddle`` command in child processes, as deployed:

(1) ``huddle serve --store memory --workers 1``: the memory stores, the
    worker a task in the server process;
(2) ``huddle serve --store unix://... --workers 0`` and ``huddle worker
    --store unix://...``: the Redis stores, the turn resumed by the server
    and run by the worker process, to which the script of the answer's
    append hands it (the worker's BLPOP on its inbox returns it);
(3) the floor (:mod:`bench.floor`): the crossings of (2) with nothing at
    the stops, a bare websockets server that makes (2)'s server's one Redis
    call and a bare worker that BLPOPs and, after a form, makes its one
    more call before it stamps. No Huddle code runs in it: (2) over (3) is
    what Huddle adds; (3) over a paused PING is the least a resume through
    this topology costs on this machine, in round trips.

(1) and (2) serve with the per-connection action rate limit lifted, so that it is
not what gets measured. The redis-server is the benchmark's own (unix
socket in a temporary directory, ``appendonly yes``, ``appendfsync
everysec`` as the README advises). Baseline: one bare Redis round trip,
``PING`` over the same socket with redis-py asyncio (the client the stores
use), from this process, measured two ways: back to back (``--pings`` a
round), and each one ``--think`` seconds after the last answer (``--turns``
a round), as the answers are sent. The second is the like-for-like one:
every process on the resume's path (the server, Redis, the worker) has
slept through the pause, and on a virtual machine a round trip that wakes
sleeping processes costs several times one that does not (here a paused
PING is about 7 back-to-back ones); a back-to-back PING measures Redis with
everything awake. Rounds alternate the order of (1), (2), (3) and the pings so
that machine noise hits all alike; every figure is over all rounds.
Printed: p50 and p99 of each kind in each set-up, of both PINGs, and the
ratios of the p50s: (2) over each PING (in round trips), (2) over (1),
(2) over (3) and (3) over the paused PING, and (2) minus (3): the time
Huddle's own work at the stops takes.

Before its tool starts a resume crosses between processes three times
(the participant to the server, the server's append to Redis, whose script
saves the turn and hands it to the worker: server.store.base.Rider) for
``toolCallConfirmed`` and ``inputCompleted/tool`` (the tool itself
resumes), five for ``inputCompleted`` (the model then calls the tool: the
worker's save of that call, to Redis and back, comes first, since a call
never starts before it is saved); a PING crosses twice.

The pause matters: a person answers a moment after the prompt shows, and
by then the worker that asked has released the turn and waits for work,
and the server's bridge has read the waiting turn ahead; the resume then
rides on the answer's append, whose script hands the turn to that worker.
``--race-turns`` turns of (2) are played after the rounds with no pause,
where the answer can race both (the resume is then queued and claimed, or
loads the turn first): their median and max, and the resumes the server
dropped as not waiting (none is expected: a question shows only once its
turn is saved waiting).

``--against CHECKOUT`` serves (2) a second time from another checkout
of Huddle (a clone at another commit, say), as (2'), in the same rounds,
and prints (2) over (2'): a change to the resume path measured against
what it changes, with the noise of this machine on both alike (runs apart
differ by 10 to 15 % here). (2') has a database of its own on the same
Redis, so that no resume is handed to the other's worker. An A/A run (this
checkout against a clone of it) read 1.04 to 1.07 here: read less than
about 7 % as noise.

``--trace`` plays one more turn of (2) with Redis MONITOR on and prints the
commands on each resume's path, in order, with their times at Redis: where
the time goes, step by step (MONITOR slows Redis; read the order and the
count, not the absolute times).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import platform
import secrets
import statistics
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection, connect

from bench.redis_store import own_redis
from protocol.actions import ChatInputCompleted, ChatToolCallConfirmed, ChatTurnStarted
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequestPart,
    Message,
    MessageOrigin,
    TextValue,
    ToolCallPart,
    ToolCallPendingConfirmation,
)
from protocol.messages import ChannelState
from protocol.session import SessionState
from server.client import HuddleClient
from server.runner.agent import Agent, FormDefinition, FormRequired, Tool, require_approval_for
from server.runner.context import ToolContext
from server.runner.ids import runner_turn_id
from server.runner.model import ModelReply, ScriptedModel, last_tool_result
from server.runner.runner import REQUEST_USER_INPUT
from server.runner.turn import ModelMessage, ToolCall

ROOT = Path(__file__).resolve().parent.parent
AGENT_SPEC = "bench.runner:bench_agent"
AGENT_TOKEN = "bench-runner-agent-token-0123456789"
STAMPS_URL = "HUDDLE_BENCH_STAMPS_URL"
STAMPS_KEY = "HUDDLE_BENCH_STAMPS_KEY"
"""Environment of the children: where the bench agent's tools stamp."""
AFTER_FORM = "stamp_after_form"
ITS_FORM = "stamp_with_its_form"
AFTER_APPROVAL = "stamp_after_approval"
KINDS = {
    AFTER_FORM: "inputCompleted",
    ITS_FORM: "inputCompleted/tool",
    AFTER_APPROVAL: "toolCallConfirmed",
}
"""Each tool, by the participant action that resumes the turn it starts in:
``inputCompleted`` answers ``request_user_input`` (the model then calls the
tool), ``inputCompleted/tool`` the tool's own form (it raised FormRequired,
and runs again with the data)."""
CHAT_TURN = "t1"
STEP_TIMEOUT = 15.0
"""Seconds any one step of a turn may take before the run is abandoned."""
STARTUP_TIMEOUT = 60.0
WARMUP_TURNS = 3
MEMORY_LABEL = "(1) memory, worker task in the server"
REDIS_LABEL = "(2) redis, serve --workers 0 + huddle worker"
FLOOR_LABEL = "(3) floor: (2)'s crossings, nothing else"
AGAINST_LABEL = "(2') as (2), from the --against checkout"
DROPPED = "not waiting: a duplicate resume?"
"""What a server logs when it drops a resume because the turn is not
waiting (yet): ``ResumeRejected`` from ``Runner._check_resume``."""

T = TypeVar("T")


# ─── The bench agent (runs in the children) ──────────────────────────────────

FORM = FormDefinition(
    key="incident",
    description="Which system is failing",
    schema={
        "type": "object",
        "properties": {"system": {"type": "string", "title": "System", "maxLength": 80}},
        "required": ["system"],
    },
)


@functools.cache
def _stamp_client() -> aioredis.Redis:
    return aioredis.Redis.from_url(os.environ[STAMPS_URL])


async def _record(tool: str, started_ns: int) -> dict[str, str]:
    turn_id = ToolContext.current().turn_id
    await _stamp_client().rpush(os.environ[STAMPS_KEY], f"{tool} {turn_id} {started_ns}")
    return {"status": "done"}


async def stamp_after_form(arguments: dict[str, Any]) -> dict[str, str]:
    return await _record(AFTER_FORM, time.time_ns())


async def stamp_with_its_form(arguments: dict[str, Any]) -> dict[str, str]:
    started = time.time_ns()
    if not ToolContext.current().form_submitted:
        raise FormRequired(FORM, "Which system fails, for this tool?")
    return await _record(ITS_FORM, started)


async def stamp_after_approval(arguments: dict[str, Any]) -> dict[str, str]:
    return await _record(AFTER_APPROVAL, time.time_ns())


def bench_script(messages: Sequence[ModelMessage]) -> ModelReply:
    """Ask the form; then call the three stamping tools; then finish. The
    replies that lead to a tool carry no text, so that no streamed text
    sits between a resume and the tool."""
    if last_tool_result(messages, AFTER_APPROVAL) is not None:
        return ModelReply(text="Done.")
    if last_tool_result(messages, REQUEST_USER_INPUT) is not None:
        return ModelReply(
            tool_calls=[
                ToolCall(id="call-after-form", name=AFTER_FORM),
                ToolCall(id="call-with-its-form", name=ITS_FORM),
                ToolCall(id="call-after-approval", name=AFTER_APPROVAL),
            ]
        )
    ask = {"formKey": FORM.key, "message": "Which system fails?"}
    return ModelReply(tool_calls=[ToolCall(id="call-form", name=REQUEST_USER_INPUT, arguments=ask)])


def bench_agent() -> Agent:
    """The agent ``--agent bench.runner:bench_agent`` loads; its tools need
    ``HUDDLE_BENCH_STAMPS_URL`` and ``HUDDLE_BENCH_STAMPS_KEY``."""
    return Agent(
        name="bench-agent",
        instructions="Ask which system fails, then stamp three times. A benchmark of resumes.",
        model=ScriptedModel(bench_script),
        tools=(
            Tool(
                AFTER_FORM, "Record when the turn resumed after the form", function=stamp_after_form
            ),
            Tool(
                ITS_FORM,
                "Ask its own form, and record when it runs again with the data",
                function=stamp_with_its_form,
            ),
            Tool(
                AFTER_APPROVAL,
                "Record when the turn resumed after the approval",
                function=stamp_after_approval,
            ),
        ),
        forms=(FORM,),
        approval_policy=require_approval_for(AFTER_APPROVAL),
    )


# ─── Children ────────────────────────────────────────────────────────────────


@dataclass
class Child:
    """A ``huddle`` child process; the tail of its output is kept for when
    it fails."""

    name: str
    process: asyncio.subprocess.Process
    output: deque[str] = field(default_factory=lambda: deque(maxlen=40))
    drainer: asyncio.Task[None] | None = None
    dropped_resumes: int = 0
    """Lines of its output that say it dropped a resume (:data:`DROPPED`)."""

    def _saw(self, line: str) -> None:
        self.output.append(line)
        if DROPPED in line:
            self.dropped_resumes += 1

    async def read_until(self, marker: str) -> str:
        assert self.process.stdout is not None
        async with asyncio.timeout(STARTUP_TIMEOUT):
            while True:
                line = (await self.process.stdout.readline()).decode(errors="replace")
                if not line:
                    raise SystemExit(f"{self.name} exited:\n{self.tail()}")
                self._saw(line)
                if marker in line:
                    return line

    def drain(self) -> None:
        """Keep reading its output so that it never blocks on a full pipe."""

        async def drain() -> None:
            assert self.process.stdout is not None
            while line := await self.process.stdout.readline():
                self._saw(line.decode(errors="replace"))

        self.drainer = asyncio.create_task(drain())

    def tail(self) -> str:
        return "".join(self.output)

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                async with asyncio.timeout(10):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.drainer is not None:
            self.drainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.drainer


async def spawn(
    name: str,
    stamps_url: str,
    stamps_key: str,
    *args: str,
    module: str = "server",
    root: Path = ROOT,
) -> Child:
    """``python -m <module> <args>`` in checkout ``root``, with only the
    bench's HUDDLE_ variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUDDLE_")}
    env |= {"HUDDLE_TOKEN": AGENT_TOKEN, STAMPS_URL: stamps_url, STAMPS_KEY: stamps_key}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=root,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    return Child(name, process)


@dataclass
class Setup:
    """One way of serving the agent: its children, where the participant
    connects, and its samples (nanoseconds, by tool)."""

    name: str
    label: str
    children: list[Child]
    url: str
    token: str
    samples: dict[str, list[int]] = field(default_factory=lambda: {t: [] for t in KINDS})
    turns: int = 0

    def tails(self) -> str:
        return "\n".join(f"--- {c.name}:\n{c.tail()}" for c in self.children)

    def dropped_resumes(self) -> int:
        return sum(child.dropped_resumes for child in self.children)

    async def stop(self) -> None:
        for child in self.children:
            await child.stop()


async def serve(
    name: str,
    label: str,
    store: str,
    stamps: tuple[str, str],
    *,
    worker: bool,
    root: Path = ROOT,
) -> Setup:
    """``huddle serve`` on a loopback port with the bench agent: its turns
    run by a worker task in the server, or, with ``worker``, by a ``huddle
    worker`` process beside a server with ``--workers 0``; both from the
    checkout ``root``. Returns once they are ready."""
    server = await spawn(
        f"{name} server",
        *stamps,
        "serve",
        *("--port", "0", "--store", store, "--agent", AGENT_SPEC),
        *("--workers", "0" if worker else "1"),
        # One participant plays turn after turn: lift the per-connection
        # action rate limit so that it is not what gets measured.
        *("--actions-per-second", "100000", "--action-burst", "100000"),
        root=root,
    )
    children = [server]
    try:
        link = (await server.read_until("Open the web client:")).split(":", 1)[1].strip()
        server.drain()
        if worker:
            children.append(
                await spawn(
                    f"{name} worker",
                    *stamps,
                    *("worker", "--store", store, "--agent", AGENT_SPEC),
                    root=root,
                )
            )
            await children[-1].read_until("huddle worker:")
            children[-1].drain()
    except BaseException:
        for child in children:
            await child.stop()
        raise
    parsed = urlparse(link)
    token = parse_qs(parsed.query)["token"][0]
    return Setup(name, label, children, f"ws://127.0.0.1:{parsed.port}/ahp", token)


async def floor(name: str, label: str, url: str, stamps: tuple[str, str]) -> Setup:
    """:mod:`bench.floor`'s relay and worker on ``url``: the resume's
    crossings with nothing else. Returns once they are ready."""
    inbox = f"{stamps[1]}:floor-inbox"
    relay = await spawn(f"{name} relay", *stamps, "relay", url, inbox, module="bench.floor")
    children = [relay]
    try:
        port = (await relay.read_until("listening on")).split()[-1]
        relay.drain()
        args = ("worker", url, inbox, stamps[1])
        children.append(await spawn(f"{name} worker", *stamps, *args, module="bench.floor"))
        await children[-1].read_until("bench.floor worker: ready")
        children[-1].drain()
    except BaseException:
        for child in children:
            await child.stop()
        raise
    return Setup(name, label, children, f"ws://127.0.0.1:{port}", "")


# ─── The participant ─────────────────────────────────────────────────────────


def _active_parts(state: ChannelState) -> list[Any]:
    if not isinstance(state, ChatState) or state.active_turn is None:
        return []
    return list(state.active_turn.response_parts)


def open_form(state: ChannelState) -> InputRequestPart | None:
    for part in _active_parts(state):
        if isinstance(part, InputRequestPart) and part.response is None:
            return part
    return None


def call_to_confirm(state: ChannelState) -> ToolCallPendingConfirmation | None:
    for part in _active_parts(state):
        if isinstance(part, ToolCallPart) and isinstance(
            part.tool_call, ToolCallPendingConfirmation
        ):
            return part.tool_call
    return None


def turn_done(state: ChannelState) -> bool:
    return isinstance(state, ChatState) and state.active_turn is None and bool(state.turns)


class Player:
    """Plays turns against one set-up and reads the stamps of its tools."""

    def __init__(self, setup: Setup, stamps: aioredis.Redis, key: str, think: float) -> None:
        self.setup, self.stamps, self.key = setup, stamps, key
        self.think = think
        """Seconds the participant looks at a prompt before answering it."""
        self.sent: dict[str, int] = {}
        """When the last turn's actions were sent (``time.time_ns()``), by
        the tool each resumes."""

    async def _until(self, what: str, waiting: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(STEP_TIMEOUT):
                return await waiting
        except TimeoutError:
            raise SystemExit(
                f"{self.setup.name}: no {what} within {STEP_TIMEOUT:g} s\n{self.setup.tails()}"
            ) from None

    async def _stamp(self, tool: str, turn_id: str) -> int:
        popped = await self._until(f"{tool} stamp", self.stamps.blpop([self.key], timeout=0))
        assert popped is not None  # BLPOP without a timeout returns an item
        stamp = popped[1].decode() if isinstance(popped[1], bytes) else popped[1]
        found, turn, at = stamp.split()
        if (found, turn) != (tool, turn_id):
            raise SystemExit(f"expected a {tool} stamp of {turn_id}, got {stamp!r}")
        return int(at)

    async def play(self, session: str) -> dict[str, int]:
        """One turn in ``session``: each tool's latency (ns), by tool."""
        raise NotImplementedError


class Participant(Player):
    """A person in a Huddle set-up: a HuddleClient that answers the form
    and approves the call in its mirror of the chat."""

    def __init__(
        self, setup: Setup, client: HuddleClient, stamps: aioredis.Redis, key: str, think: float
    ) -> None:
        super().__init__(setup, stamps, key, think)
        self.client = client

    async def play(self, session: str) -> dict[str, int]:
        """One turn in a new session; returns its latency by tool (ns)."""
        client = self.client
        await client.create_session(session, title="Bench")
        session_mirror = await client.subscribe(session)
        assert isinstance(session_mirror.state, SessionState)
        chat = session_mirror.state.default_chat
        assert chat is not None
        mirror = await client.subscribe(chat)
        message = Message(text="The login page fails", origin=MessageOrigin(kind="user"))
        started = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        await client.dispatch_and_wait(
            chat, ChatTurnStarted(turn_id=CHAT_TURN, started_at=started, message=message)
        )
        turn_id = runner_turn_id(chat, CHAT_TURN)
        state = await self._until("form", mirror.wait_for(lambda s: open_form(s) is not None))
        form = open_form(state)
        assert form is not None
        await asyncio.sleep(self.think)
        answer = InputAnswer(state="submitted", value=TextValue(value="Single sign-on"))
        completed = ChatInputCompleted(
            request_id=form.request.id, response="accept", answers={"system": answer}
        )
        self.sent[AFTER_FORM] = time.time_ns()
        await client.dispatch(chat, completed)
        latency = {AFTER_FORM: await self._stamp(AFTER_FORM, turn_id) - self.sent[AFTER_FORM]}
        first = form.request.id  # the mirror may not show it answered yet

        def its_form(state: ChannelState) -> bool:
            part = open_form(state)
            return part is not None and part.request.id != first

        state = await self._until("the tool's form", mirror.wait_for(its_form))
        form = open_form(state)
        assert form is not None
        await asyncio.sleep(self.think)
        completed = ChatInputCompleted(
            request_id=form.request.id, response="accept", answers={"system": answer}
        )
        self.sent[ITS_FORM] = time.time_ns()
        await client.dispatch(chat, completed)
        latency[ITS_FORM] = await self._stamp(ITS_FORM, turn_id) - self.sent[ITS_FORM]
        state = await self._until(
            "call to confirm", mirror.wait_for(lambda s: call_to_confirm(s) is not None)
        )
        call = call_to_confirm(state)
        assert call is not None
        await asyncio.sleep(self.think)
        confirmed = ChatToolCallConfirmed(
            turn_id=CHAT_TURN,
            tool_call_id=call.tool_call_id,
            approved=True,
            confirmed="user-action",
        )
        self.sent[AFTER_APPROVAL] = time.time_ns()
        await client.dispatch(chat, confirmed)
        stamped = await self._stamp(AFTER_APPROVAL, turn_id)
        latency[AFTER_APPROVAL] = stamped - self.sent[AFTER_APPROVAL]
        await self._until("end of the turn", mirror.wait_for(turn_done))
        await client.unsubscribe(chat)
        await client.unsubscribe(session)
        return latency


class FloorPlayer(Player):
    """The participant of set-up (3): for each tool, after the same pause,
    one text frame to the relay naming it, and its stamp read back."""

    def __init__(
        self, setup: Setup, ws: ClientConnection, stamps: aioredis.Redis, key: str, think: float
    ) -> None:
        super().__init__(setup, stamps, key, think)
        self.ws = ws

    async def play(self, session: str) -> dict[str, int]:
        latency: dict[str, int] = {}
        for tool in KINDS:
            await asyncio.sleep(self.think)
            self.sent[tool] = time.time_ns()
            await self.ws.send(f"{tool} {session}")
            latency[tool] = await self._stamp(tool, session) - self.sent[tool]
        return latency


async def play_round(
    participant: Player, tag: str, first: int, turns: int, counted: bool
) -> dict[str, list[int]]:
    """``turns`` turns one after another, their samples added to the
    set-up's when ``counted``."""
    setup = participant.setup
    samples: dict[str, list[int]] = {tool: [] for tool in KINDS}
    for index in range(first, first + turns):
        latency = await participant.play(f"ahp-session:/bench-runner-{tag}-{setup.name}-{index}")
        for tool, value in latency.items():
            samples[tool].append(value)
    if counted:
        setup.turns += turns
        for tool, values in samples.items():
            setup.samples[tool].extend(values)
    return samples


# ─── The baseline: a bare Redis round trip ───────────────────────────────────


async def ping_round(client: aioredis.Redis, count: int, pause: float = 0.0) -> list[int]:
    """``count`` PINGs one after another, each ``pause`` seconds after the
    last one's answer; each one's round trip (ns)."""
    samples = []
    for _ in range(count):
        if pause:
            await asyncio.sleep(pause)
        start = time.perf_counter_ns()
        await client.ping()
        samples.append(time.perf_counter_ns() - start)
    return samples


# ─── Output ──────────────────────────────────────────────────────────────────


def _percentile(values: list[int], q: float) -> float:
    """The ``q`` quantile of nanosecond ``values``, in milliseconds."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6


def _p50_p99(values: list[int]) -> str:
    return f"p50 {_percentile(values, 0.5):7.3f} ms  p99 {_percentile(values, 0.99):7.3f} ms"


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def _redis_line(client: aioredis.Redis) -> str:
    server: dict[str, Any] = await client.info("server")
    config: dict[Any, Any] = await client.config_get("appendfsync")
    return (
        f"redis {server['redis_version']} (own, unix socket, appendonly yes, "
        f"appendfsync {config.get('appendfsync', '?')})"
    )


def _round_line(name: str, samples: dict[str, list[int]]) -> str:
    return f"{name} " + "  ".join(
        f"{KINDS[tool]} p50 {_percentile(values, 0.5):6.2f} ms" for tool, values in samples.items()
    )


def print_summary(setups: list[Setup], pings: list[int], paused: list[int], think: float) -> None:
    memory, redis, bare, *against = setups
    turns = memory.turns
    print(
        f"resume latency, dispatch to the resumed tool's first statement "
        f"({turns} turns per set-up, one at a time):"
    )
    for setup in setups:
        for tool, values in setup.samples.items():
            print(f"  {setup.label:<44} {KINDS[tool]:<19} {_p50_p99(values)}")
    back_to_back = "bare Redis round trip (PING, redis-py asyncio), back to back"
    after = f"the same, each {think * 1000:g} ms after the last (as the answers)"
    print(f"  {back_to_back:<62} {_p50_p99(pings)}")
    print(f"  {after:<62} {_p50_p99(paused)}")
    ping, paused_ping = _percentile(pings, 0.5), _percentile(paused, 0.5)
    print("ratios of p50s:")
    for tool in KINDS:
        resume = _percentile(redis.samples[tool], 0.5)
        over_memory = resume / _percentile(memory.samples[tool], 0.5)
        least = _percentile(bare.samples[tool], 0.5)
        print(
            f"  {KINDS[tool]:<19}  (2) / PING {resume / ping:6.1f}   (2) / paused PING "
            f"{resume / paused_ping:5.1f}   (2) / (1) {over_memory:5.2f}   (2) / (3) "
            f"{resume / least:5.2f}   (3) / paused PING {least / paused_ping:5.1f}   "
            f"(2) - (3) {resume - least:5.2f} ms"
        )
    for other in against:
        ratios = []
        for tool in KINDS:
            ratio = _percentile(redis.samples[tool], 0.5) / _percentile(other.samples[tool], 0.5)
            ratios.append(f"{KINDS[tool]} {ratio:5.3f}")
        print("  (2) / (2'), the same set-up from the other checkout: " + "   ".join(ratios))


# ─── Main ────────────────────────────────────────────────────────────────────


async def measure_rounds(
    participants: Sequence[Player], client: aioredis.Redis, tag: str, args: argparse.Namespace
) -> tuple[list[int], list[int]]:
    """The counted rounds; returns the PING samples of all of them: back
    to back, and each after the participant's pause."""
    pings: list[int] = []
    paused: list[int] = []

    async def ping_step(index: int) -> str:
        samples = await ping_round(client, args.pings)
        pings.extend(samples)
        return f"PING p50 {_percentile(samples, 0.5):6.3f} ms"

    async def paused_ping_step(index: int) -> str:
        samples = await ping_round(client, args.turns, args.think)
        paused.extend(samples)
        return f"paused PING p50 {_percentile(samples, 0.5):6.3f} ms"

    async def play_step(participant: Player, index: int) -> str:
        first = WARMUP_TURNS + index * args.turns
        samples = await play_round(participant, tag, first, args.turns, True)
        return _round_line(participant.setup.name, samples)

    steps: list[Callable[[int], Awaitable[str]]] = [
        *(functools.partial(play_step, p) for p in participants),
        ping_step,
        paused_ping_step,
    ]
    for index in range(args.rounds):
        parts = [await step(index) for step in (steps if index % 2 == 0 else steps[::-1])]
        print(f"  round {index + 1}:   " + "   ".join(parts), flush=True)
    return pings, paused


async def probe_race(participant: Participant, tag: str, turns: int) -> None:
    """Turns answered the moment each prompt shows (no pause): a
    confirmation that arrives before the worker has saved the turn as
    waiting is dropped by the server, and the turn waits for the worker's
    recovery sweep."""
    setup, think = participant.setup, participant.think
    participant.think = 0.0
    dropped = setup.dropped_resumes()
    try:
        samples = await play_round(participant, f"{tag}-race", 0, turns, False)
    finally:
        participant.think = think
    figures = "; ".join(
        f"{KINDS[tool]} median {statistics.median(values) / 1e6:.1f} ms, "
        f"max {max(values) / 1e6:.1f} ms"
        for tool, values in samples.items()
    )
    print(
        f"  {setup.label}, answering at once (no pause), {turns} turns: {figures}; "
        f"resumes the server dropped as early: {setup.dropped_resumes() - dropped}"
    )


async def trace_turn(participant: Participant, url: str, tag: str) -> None:
    """Play one turn with Redis MONITOR on and print, for each action, the
    commands clients sent (not those inside scripts; not the bench's own)
    from its dispatch to the tool's start, with their times at Redis."""
    seen: list[tuple[float, str]] = []
    watcher = aioredis.Redis.from_url(url, socket_timeout=None)
    ready = asyncio.Event()

    async def watch() -> None:
        async with watcher.monitor() as monitor:
            ready.set()
            async for command in monitor.listen():
                if command["client_address"] != "lua" and participant.key not in command["command"]:
                    seen.append((command["time"], command["command"]))

    watching = asyncio.create_task(watch())
    try:
        await ready.wait()
        latency = await participant.play(f"ahp-session:/bench-runner-{tag}-trace")
        await asyncio.sleep(0.2)  # MONITOR lines trail the commands
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await watcher.aclose()
    print(
        f"trace of one turn in {participant.setup.label} (MONITOR on, which slows Redis; "
        "client commands only, times at Redis from the dispatch):"
    )
    for tool, kind in KINDS.items():
        start = participant.sent[tool] / 1e9
        end = start + latency[tool] / 1e9
        path = [(at - start, command) for at, command in seen if start <= at <= end]
        print(f"  {kind}: {len(path)} commands, tool started after {latency[tool] / 1e6:.2f} ms")
        for offset, command in path:
            print(f"    +{offset * 1000:6.2f} ms  {_command_summary(command)}")


def _command_summary(command: str) -> str:
    """The command and its first key (a script's sha abbreviated)."""
    words = command.split()
    if words[0] == "EVALSHA" and len(words) > 3:
        return f"EVALSHA {words[1][:8]} {words[3]}"[:90]
    return " ".join(words[:2])[:90]


async def run(args: argparse.Namespace) -> int:
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(own_redis())
        client = aioredis.Redis.from_url(url)
        stack.push_async_callback(client.aclose)
        blocking = aioredis.Redis.from_url(url, socket_timeout=None)
        stack.push_async_callback(blocking.aclose)
        print(
            "bench.runner: participant action -> resumed tool starting, beside a Redis round trip"
        )
        print(
            f"  {os.cpu_count()} CPUs, load average {_loadavg()}, python "
            f"{platform.python_version()}, {await _redis_line(client)}"
            f"{', QUICK' if args.quick else ''}"
        )
        print(
            f"  {args.rounds} round(s) of {args.turns} turns per set-up and {args.pings} PINGs; "
            f"the participant pauses {args.think * 1000:g} ms at each prompt before answering"
        )
        tag = secrets.token_hex(3)
        key = f"huddle-bench:runner:{tag}:stamps"
        setups: list[Setup] = []

        async def stop_setups() -> None:
            for setup in setups:
                await setup.stop()

        stack.push_async_callback(stop_setups)
        # Its own database of the same Redis: its turns and workers apart
        # from (2)'s (a resume must not be handed to the other's worker).
        other_store = f"{url}{'&' if '?' in url else '?'}db=1"
        against = (
            [
                serve(
                    "against",
                    AGAINST_LABEL,
                    other_store,
                    (url, key),
                    worker=True,
                    root=args.against,
                )
            ]
            if args.against
            else []
        )
        started = await asyncio.gather(
            serve("memory", MEMORY_LABEL, "memory", (url, key), worker=False),
            serve("redis", REDIS_LABEL, url, (url, key), worker=True),
            floor("floor", FLOOR_LABEL, url, (url, key)),
            *against,
            return_exceptions=True,
        )
        setups += [s for s in started if isinstance(s, Setup)]
        for failed in started:
            if isinstance(failed, BaseException):
                raise failed
        memory, redis, bare, *others = setups
        participants: list[Player] = []
        for setup in (memory, redis, *others):
            huddle = await HuddleClient.connect(
                setup.url, setup.token, client_id=f"bench-{setup.name}"
            )
            stack.push_async_callback(huddle.close)
            participants.append(Participant(setup, huddle, blocking, key, args.think))
        ws = await stack.enter_async_context(connect(bare.url, compression=None))
        participants.insert(2, FloorPlayer(bare, ws, blocking, key, args.think))
        for participant in participants:  # warm-up, not counted
            await play_round(participant, tag, 0, WARMUP_TURNS, False)
        await ping_round(client, 100)
        pings, paused = await measure_rounds(participants, client, tag, args)
        print_summary(setups, pings, paused, args.think)
        huddle_redis = participants[1]
        assert isinstance(huddle_redis, Participant)
        if args.race_turns:
            await probe_race(huddle_redis, tag, args.race_turns)
        if args.trace:
            await trace_turn(huddle_redis, url, tag)
        print(f"  load average at the end {_loadavg()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runner", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a few seconds, for smoke tests")
    parser.add_argument("--turns", type=int, help="turns per set-up a round (50; quick 10)")
    parser.add_argument("--rounds", type=int, help="rounds of (1), (2), PINGs (4; quick 1)")
    parser.add_argument("--pings", type=int, help="PINGs a round (1000; quick 200)")
    parser.add_argument(
        "--think", type=float, default=0.025, help="seconds of pause at a prompt (0.025)"
    )
    parser.add_argument(
        "--race-turns", type=int, help="(2) turns answered with no pause (6; quick 0)"
    )
    parser.add_argument(
        "--trace", action="store_true", help="print the Redis commands of one turn of (2)"
    )
    parser.add_argument(
        "--against",
        type=Path,
        metavar="CHECKOUT",
        help="also serve (2) from this other checkout of Huddle, as (2'), in the same rounds",
    )
    args = parser.parse_args(argv)
    if args.against is not None and not (args.against / "server" / "__main__.py").is_file():
        parser.error(f"--against {args.against}: not a checkout of Huddle (no server/__main__.py)")
    if args.against is not None:
        args.against = args.against.resolve()
    args.turns = args.turns or (10 if args.quick else 50)
    args.rounds = args.rounds or (1 if args.quick else 4)
    args.pings = args.pings or (200 if args.quick else 1000)
    if args.race_turns is None:
        args.race_turns = 0 if args.quick else 6
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
