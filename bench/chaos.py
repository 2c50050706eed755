"""Nothing lost, nothing run twice, nothing stuck: many faults at once while
real work runs, then a checker that reads what happened.

    .venv/bin/python -m bench.chaos [--minutes M] [--seed S] [--sessions N]
        [--single-redis] [--every A B]

Started, all real processes on loopback: Redis (by default a Cluster of 3
primaries and 3 replicas, ``appendfsync always``, written with ``?replicas=1``
so that a write is acknowledged once its replica has it; ``--single-redis``:
one redis-server), 3 ``huddle serve --workers 0`` and 3 ``huddle worker``
processes on it, running ``bench.chaos_agent:deployer`` (a tool that needs
approval, asks a form, and records its side effect in a ledger keyed by the
call's idempotency key), a CuttingProxy in front of each server, and an
outside AHP agent (HuddleClient with the agent token) that asks questions
in turns of its own. ``--sessions`` simulated sessions each have 2-4 people
(participant tokens in their names, spread over the three servers) who
start turns, approve, edit and deny the tool calls, co-edit the form's
drafts and submit it, and answer the outside agent; their clients reconnect
by themselves after drops (``huddle.resend``). A session moves to a fresh
Huddle session every few turns, so each chat's whole log stays in the
store's replay window for the checker.

The fault loop (seeded: ``--seed`` replays the schedule) waits ``--every``
seconds (5-15) between faults and injects one of: kill -9 a server, a worker
or a Redis primary (the cluster's replica takes over; the killed node comes
back as a replica) and start it again; SIGSTOP a process for 5 s, then
SIGCONT; cut a client's socket mid-frame at a proxy. Each is printed.

At the end faults stop, every session finishes its turn (driven to rest by
its people), and the checker prints a table; the exit status is 1 when any
violation count is not 0, and the seed is printed with it:

- actions acknowledged / lost: every echo a person's client got must be in
  its chat's log at its seq, from that client;
- tools run / run twice / run unapproved: the ledger against the chats;
- answers submitted / not delivered: every acknowledged submission reached
  the tool (the ledger's form) or the outside agent (its completion);
- turns started / stuck: a chat whose active turn shows nothing for people
  to do, or an acknowledged turn start the chat never shows;
- audit chains verified / broken: each session's export and its verify
  (signatures checked), as ``huddle audit export`` and ``verify`` do;
- each process's peak RSS against its first start, and faults by kind.

``CHAOS_DEBUG=1`` prints what the people were refused and every wait that
ran out, as it happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatTurnComplete,
    ChatTurnStarted,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    Message,
    MessageOrigin,
    TextQuestion,
    TextValue,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallPart,
    ToolCallPendingConfirmation,
    Turn,
)
from protocol.rejections import RejectionCode
from protocol.session import SessionState
from protocol.uris import channel_id
from server.auth import TokenAuthority
from server.client import Disconnected, HuddleClient, Mirror
from server.core.audit import AuditBroken, signed_export, verify
from server.core.audit_key import AuditKeys, read_public_keys
from server.errors import ActionRejected, InputAbandoned
from server.store import open_channel_store
from server.store.base import decode_entry
from tests.edge import CuttingProxy
from tests.redis_server import RedisServer, RunningCluster, free_port
from tests.test_serve_cli import read_until, start

TOKEN = "chaos-agent-token-0123456789abcdef"
SERVERS = WORKERS = 3
PAUSE = 5.0
"""How long a SIGSTOPped process stays stopped (a hung node)."""
PATIENCE = 60.0
"""How long anything the run awaits may take (a lease, a failover, a
restart, a retry after the store came back): past it, the wait gives up and
the checker says what is left undone."""
TURNS_PER_SESSION = 8
"""Turns before a simulated session moves to a fresh Huddle session."""
RETRY = 0.2
"""Seconds between two tries of an action the store could not take."""


def debug(text: str) -> None:
    if os.environ.get("CHAOS_DEBUG"):
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())


def rss_kib(pid: int, field_name: str) -> int:
    """VmRSS (now) or VmHWM (the peak) of a running process, in KiB."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


# ─── The processes ───────────────────────────────────────────────────────────


@dataclass
class Slot:
    """One of the run's processes, which faults kill and the run restarts."""

    name: str
    pid: int = 0
    first_rss: int = 0
    peak_rss: int = 0

    def started(self, pid: int) -> None:
        self.pid = pid
        rss = rss_kib(pid, "VmRSS")
        self.first_rss = self.first_rss or rss
        self.peak_rss = max(self.peak_rss, rss)

    def sample(self) -> None:
        self.peak_rss = max(self.peak_rss, rss_kib(self.pid, "VmHWM"))


@dataclass
class Huddle:
    """A ``huddle serve`` or ``huddle worker`` process of the run."""

    slot: Slot
    args: tuple[str, ...]
    env: dict[str, str]
    port: int = 0
    process: asyncio.subprocess.Process | None = None
    drain: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self.port:
            served = await start("--workers", "0", "--port", str(self.port), env=self.env)
            self.process = served.process
        else:
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "server",
                *self.args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **self.env},
            )
            await read_until(self.process, [], "huddle worker:")
        log = self.env["HUDDLE_FAULTS_DIR"] + f"/{self.slot.name.replace(' ', '-')}.log"
        self.drain = asyncio.create_task(drained(self.process, Path(log)))
        self.slot.started(self.process.pid)

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.slot.sample()
            self.process.kill()  # SIGKILL: no handler, no last save
            await self.process.wait()


async def drained(process: asyncio.subprocess.Process, log: Path) -> None:
    """Keep a process's output in ``log`` (so that it never blocks on a full
    pipe, and a violation can be traced)."""
    assert process.stdout is not None
    with log.open("ab") as out:
        out.write(f"--- started {time.strftime('%H:%M:%S')} pid {process.pid}\n".encode())
        while line := await process.stdout.readline():
            out.write(line)
            out.flush()


class Store:
    """The run's Redis: one redis-server, or a cluster of 3 + 3."""

    def __init__(self, cluster: bool, root: Path) -> None:
        self.cluster: RunningCluster | None = None
        self.single: RedisServer | None = None
        self.is_cluster = cluster
        self.root = root
        self.slots: dict[str, Slot] = {}

    async def start(self) -> None:
        if self.is_cluster:
            self.cluster = await asyncio.to_thread(
                RunningCluster.start, replicas=1, timeout=PATIENCE, node_timeout_ms=2000
            )
            for node in self.cluster.nodes:
                self.slots[node.address] = Slot(f"redis {node.address}")
                assert node.process is not None
                self.slots[node.address].started(node.process.pid)
        else:
            self.single = RedisServer(self.root)
            async with asyncio.timeout(PATIENCE):
                await self.single.start()
            assert self.single.process is not None
            self.slots["redis"] = Slot("redis")
            self.slots["redis"].started(self.single.process.pid)

    @property
    def url(self) -> str:
        if self.cluster is not None:
            return self.cluster.url(replicas=1)
        assert self.single is not None
        return self.single.url

    def pids(self) -> dict[str, int]:
        """The running Redis processes, by slot name."""
        if self.cluster is not None:
            return {
                a: n.process.pid
                for a, n in ((n.address, n) for n in self.cluster.nodes)
                if n.process is not None and n.process.poll() is None
            }
        assert self.single is not None
        assert self.single.process is not None
        return {"redis": self.single.process.pid}

    async def kill_primary(self, rng: random.Random) -> str:
        """kill -9 a primary; for a cluster, await its replica's election
        and start the killed node again (it rejoins as a replica)."""
        if self.cluster is None:
            assert self.single is not None
            assert self.single.process is not None
            self.slots["redis"].sample()
            await self.single.kill()
            async with asyncio.timeout(PATIENCE):
                await self.single.start()
            assert self.single.process is not None
            self.slots["redis"].started(self.single.process.pid)
            return "redis"
        cluster = self.cluster
        primary = rng.choice(sorted(await asyncio.to_thread(cluster.primaries), key=_address))
        replica = await asyncio.to_thread(cluster.replica_of, primary)
        mark = len(replica.lines)
        self.slots[primary.address].sample()
        await asyncio.to_thread(primary.kill)
        await asyncio.to_thread(replica.wait_for, "Failover election won", PATIENCE, since=mark)
        mark = len(primary.lines)  # past the killed process's last words
        await asyncio.to_thread(primary.start, PATIENCE)
        synced = "MASTER <-> REPLICA sync: Finished with success"
        await asyncio.to_thread(primary.wait_for, synced, PATIENCE, since=mark)
        assert primary.process is not None
        self.slots[primary.address].started(primary.process.pid)
        return primary.address

    def sample(self) -> None:
        for name, pid in self.pids().items():
            self.slots[name].pid = pid
            self.slots[name].sample()

    async def stop(self) -> None:
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.destroy)
        if self.single is not None:
            await self.single.kill()


def _address(node: Any) -> str:
    return str(node.address)


# ─── What the people and the outside agent were told ─────────────────────────


@dataclass
class History:
    """What each client was acknowledged, for the checker."""

    acked: list[tuple[str, int, str, int, StateAction]] = field(default_factory=list)
    """(chat, serverSeq, clientId, clientSeq, action) of every echo."""
    rejected: Counter[str] = field(default_factory=Counter)
    unacknowledged: int = 0
    """Actions whose echo never came (the socket dropped, a server died):
    their fate is the store's, and the people tried again from the state."""
    agent_answers: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    """What the outside agent's completions carried, by (chat, request)."""
    chats: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    turns_started: int = 0
    outside_turns: int = 0


@dataclass
class Person:
    name: str
    client: HuddleClient


RETRY_IT = None
"""What :func:`act` says of an action to try again: the store could not
take it, or its echo never came (its fate is then the store's; the state
tells whether it landed)."""


async def act(
    history: History, person: HuddleClient, chat: str, action: StateAction
) -> bool | None:
    """Send ``action`` and wait for its echo: True when acknowledged (and
    recorded), False when rejected for good, RETRY_IT."""
    try:
        async with asyncio.timeout(PATIENCE):
            envelope = await person.dispatch_and_wait(chat, action)
    except ActionRejected as rejected:
        history.rejected[str(rejected.code)] += 1
        debug(f"rejected {type(action).__name__}: {rejected}")
        if rejected.code == RejectionCode.STORE_UNAVAILABLE:
            await asyncio.sleep(RETRY)  # a retry's pause: the store comes back by itself
            return RETRY_IT
        return False
    except (Disconnected, TimeoutError):
        history.unacknowledged += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PATIENCE):
                await person.connected.wait()
        return RETRY_IT
    assert envelope.origin is not None
    history.acked.append(
        (chat, envelope.server_seq, envelope.origin.client_id, envelope.origin.client_seq, action)
    )
    return True


def active(state: ChatState, turn_id: str) -> bool:
    return state.active_turn is not None and state.active_turn.id == turn_id


def finished(state: ChatState, turn_id: str) -> bool:
    return any(turn.id == turn_id for turn in state.turns)


def pending(state: ChatState) -> list[ToolCallPendingConfirmation]:
    turn = state.active_turn
    parts = turn.response_parts if turn else []
    return [
        p.tool_call
        for p in parts
        if isinstance(p, ToolCallPart) and isinstance(p.tool_call, ToolCallPendingConfirmation)
    ]


def open_requests(state: ChatState) -> list[InputRequestPart]:
    turn = state.active_turn
    parts = turn.response_parts if turn else []
    return [p for p in parts if isinstance(p, InputRequestPart) and p.response is None]


def waiting_for_people(state: ChatState) -> bool:
    return bool(pending(state) or open_requests(state))


async def changed(mirror: Mirror, seq: int) -> ChatState | None:
    """The chat once its mirror moved past ``seq`` (None after PATIENCE)."""
    try:
        async with asyncio.timeout(PATIENCE):
            state = await mirror.wait_for(lambda s: mirror.seq > seq)
    except TimeoutError:
        debug(f"nothing moved in {mirror.uri} past {seq}: {mirror.chat.active_turn}")
        return None
    assert isinstance(state, ChatState)
    return state


def answers_of(values: dict[str, str]) -> dict[str, InputAnswer]:
    return {k: InputAnswer(state="submitted", value=TextValue(value=v)) for k, v in values.items()}


async def answer(
    history: History, rng: random.Random, people: list[Person], chat: str, part: InputRequestPart
) -> bool | None:
    """Some people co-edit drafts of the request's answers, then one submits."""
    questions = [q.id for q in part.request.questions or []]
    for _ in range(rng.randint(0, 3)):
        writer = rng.choice(people)
        question = rng.choice(questions)
        draft = InputAnswer(state="draft", value=TextValue(value=f"{writer.name} drafts"))
        action = ChatInputAnswerChanged(
            request_id=part.request.id, question_id=question, answer=draft
        )
        await act(history, writer.client, chat, action)
    submitter = rng.choice(people)
    values = {q: f"{q} by {submitter.name}" for q in questions}
    completed = ChatInputCompleted(
        request_id=part.request.id, response="accept", answers=answers_of(values)
    )
    return await act(history, submitter.client, chat, completed)


async def decide(
    history: History,
    rng: random.Random,
    people: list[Person],
    chat: str,
    turn_id: str,
    call: ToolCallPendingConfirmation,
) -> bool | None:
    """One of the people approves (maybe with an edited input) or denies."""
    decider = rng.choice(people)
    roll = rng.random()
    if roll < 0.2:
        action = ChatToolCallConfirmed(
            turn_id=turn_id,
            tool_call_id=call.tool_call_id,
            approved=False,
            reason="denied",
            selected_option_id="deny",
            reason_message=f"{decider.name} says no",
        )
    else:
        edited = json.dumps({"target": f"edited by {decider.name}"}) if roll < 0.4 else None
        action = ChatToolCallConfirmed(
            turn_id=turn_id,
            tool_call_id=call.tool_call_id,
            approved=True,
            confirmed="user-action",
            selected_option_id="approve",
            edited_tool_input=edited,
        )
    return await act(history, decider.client, chat, action)


async def idle(mirror: Mirror) -> bool:
    """Whether the chat has no active turn, once it has none (False after
    PATIENCE: the checker then finds out why)."""
    try:
        async with asyncio.timeout(PATIENCE):
            await mirror.wait_for(lambda s: isinstance(s, ChatState) and s.active_turn is None)
    except TimeoutError:
        debug(f"{mirror.uri} never idle: {mirror.chat.active_turn}")
        return False
    return True


async def people_turn(
    history: History, rng: random.Random, people: list[Person], chat: str, turn_id: str
) -> None:
    """A person starts a turn of the deployer; the people see it through."""
    starter = rng.choice(people)
    started = ChatTurnStarted(
        turn_id=turn_id,
        started_at=iso_now(),
        message=Message(text=f"deploy {turn_id}", origin=MessageOrigin(kind="user")),
    )
    mirror = starter.client.mirrors[chat]
    while not (finished(mirror.chat, turn_id) or active(mirror.chat, turn_id)):
        if not await idle(mirror):
            return
        if await act(history, starter.client, chat, started):
            history.turns_started += 1
    await see_through(history, rng, people, mirror, chat, turn_id)


async def see_through(
    history: History,
    rng: random.Random,
    people: list[Person],
    mirror: Mirror,
    chat: str,
    turn_id: str,
) -> None:
    """Do what the turn waits for until it ends (or nothing moves for PATIENCE)."""
    while True:
        state = mirror.chat
        if not active(state, turn_id):
            return
        calls, requests = pending(state), open_requests(state)
        seq = mirror.seq
        outcome: bool | None = False
        if calls:
            outcome = await decide(history, rng, people, chat, turn_id, calls[0])
        elif requests:
            outcome = await answer(history, rng, people, chat, requests[0])
        if outcome is RETRY_IT:
            continue
        if mirror.seq == seq and await changed(mirror, seq) is None:
            seen = {p.name: p.client.mirrors[chat].seq for p in people if chat in p.client.mirrors}
            debug(f"{chat}: the people's mirrors stand at {seen}")
            return


async def outside_turn(
    history: History,
    rng: random.Random,
    agent: HuddleClient,
    people: list[Person],
    chat: str,
    turn_id: str,
) -> None:
    """The outside agent's own turn: it asks the people a question (its own
    ``request_input``), they answer, it records what it got and ends the turn."""
    mirror = agent.mirrors[chat]
    started = ChatTurnStarted(
        turn_id=turn_id,
        started_at=iso_now(),
        message=Message(text="a question from outside", origin=MessageOrigin(kind="agent")),
    )
    while not (finished(mirror.chat, turn_id) or active(mirror.chat, turn_id)):
        if not await idle(mirror):
            return
        await act(history, agent, chat, started)
    if not active(mirror.chat, turn_id):
        return
    history.outside_turns += 1
    request = InputRequest(
        id=f"{turn_id}-q",
        message="Which window?",
        questions=[TextQuestion(id="window", message="When may we deploy?")],
    )
    asking = asyncio.create_task(agent.request_input(chat, request))
    people_mirror = people[0].client.mirrors[chat]
    while not asking.done():
        requests = [p for p in open_requests(people_mirror.chat) if p.request.id == request.id]
        seq = people_mirror.seq
        outcome: bool | None = False
        if requests:
            outcome = await answer(history, rng, people, chat, requests[0])
        if outcome is RETRY_IT:
            continue
        if people_mirror.seq == seq:
            moved = asyncio.create_task(changed(people_mirror, seq))
            await asyncio.wait([asking, moved], return_when=asyncio.FIRST_COMPLETED)
            if not moved.done():
                moved.cancel()
            elif moved.result() is None:
                break
    with contextlib.suppress(InputAbandoned, ActionRejected, Disconnected, TimeoutError):
        async with asyncio.timeout(PATIENCE):
            debug(f"awaiting the outside agent's answer in {chat}")
            completion = await asking
        history.agent_answers[(chat, request.id)] = {
            k: str(getattr(a.value, "value", None)) for k, a in completion.answers.items()
        }
    asking.cancel()
    done = ChatTurnComplete(turn_id=turn_id, duration=1)
    while active(mirror.chat, turn_id):
        await act(history, agent, chat, done)


# ─── A run ───────────────────────────────────────────────────────────────────


@dataclass
class Run:
    args: argparse.Namespace
    root: Path
    store: Store
    servers: list[Huddle]
    workers: list[Huddle]
    proxies: list[CuttingProxy]
    agents: list[HuddleClient] = field(default_factory=list)
    history: History = field(default_factory=History)
    faults: Counter[str] = field(default_factory=Counter)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    authority: TokenAuthority = field(default_factory=lambda: TokenAuthority(TOKEN))
    clean: bool = False
    """Whether the checker found nothing wrong (the logs are removed then)."""

    def token(self, name: str) -> str:
        return self.authority.mint("participant", name=name, expires_at=time.time() + 86_400)

    async def connect(self, token: str, index: int) -> HuddleClient:
        """A client through proxy ``index``, retried while its server is down."""
        async with asyncio.timeout(PATIENCE):
            while True:
                try:
                    return await HuddleClient.connect(self.proxies[index].url(), token)
                except (Disconnected, OSError):
                    await asyncio.sleep(RETRY)  # a retry's pause: the server is restarting


@contextlib.asynccontextmanager
async def deployed(args: argparse.Namespace) -> AsyncIterator[Run]:
    root = Path(tempfile.mkdtemp(prefix="huddle-chaos-", dir="/tmp"))
    store = Store(not args.single_redis, root)
    servers: list[Huddle] = []
    workers: list[Huddle] = []
    proxies: list[CuttingProxy] = []
    run: Run | None = None
    try:
        await store.start()
        env = {
            "HUDDLE_TOKEN": TOKEN,
            "HUDDLE_STORE": store.url,
            "HUDDLE_AGENT": "bench.chaos_agent:deployer",
            "HUDDLE_LEASE_SECONDS": "2",
            "HUDDLE_FAULTS_DIR": str(root),
            # Every chat's whole log stays for the checker (a session holds
            # TURNS_PER_SESSION turns of a few dozen actions).
            "HUDDLE_REPLAY_WINDOW": "100000",
            "HUDDLE_REPLAY_WINDOW_BYTES": str(256 << 20),
        }
        for index in range(SERVERS):
            server = Huddle(Slot(f"server {index}"), (), env, port=free_port())
            await server.start()
            servers.append(server)
            proxies.append(await CuttingProxy(server.port).start())
        for index in range(WORKERS):
            worker = Huddle(Slot(f"worker {index}"), ("worker",), env)
            await worker.start()
            workers.append(worker)
        run = Run(args, root, store, servers, workers, proxies)
        yield run
    finally:
        for proxy in proxies:
            await proxy.close()
        for process in (*servers, *workers):
            await process.kill()
        await store.stop()
        if run is not None and run.clean:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"the processes' logs and the ledger are kept in {root}")


async def play_session(run: Run, index: int) -> None:
    """One simulated session: its people and the outside agent, turn after
    turn, a fresh Huddle session every TURNS_PER_SESSION turns, until the
    run stops (the turn under way is seen through first)."""
    rng = random.Random(f"{run.args.seed}-session-{index}")
    names = [f"person {index}.{n}" for n in range(rng.randint(2, 4))]
    people = [
        Person(name, await run.connect(run.token(name), (index + n) % SERVERS))
        for n, name in enumerate(names)
    ]
    agent = run.agents[index % len(run.agents)]
    generation = 0
    try:
        while not run.stopping.is_set():
            session = f"ahp-session:/chaos-{index}-{generation}"
            chat = await open_session(run, agent, session)
            for person in people:
                await subscribed(person.client, chat)
            for n in range(TURNS_PER_SESSION):
                if run.stopping.is_set():
                    break
                turn_id = f"t{n}"
                if rng.random() < 0.25:
                    await outside_turn(run.history, rng, agent, people, chat, turn_id)
                else:
                    await people_turn(run.history, rng, people, chat, turn_id)
                await asyncio.sleep(rng.uniform(0.1, 1.0))  # the people's pace
            generation += 1
    finally:
        for person in people:
            await person.client.close()


async def open_session(run: Run, agent: HuddleClient, session: str) -> str:
    """Create ``session`` as the outside agent (again while a fault refuses
    it) and return its chat, which the agent watches."""
    async with asyncio.timeout(PATIENCE):
        while True:
            try:
                with contextlib.suppress(Exception):
                    await agent.create_session(session)
                state = (await agent.subscribe(session)).state
                assert isinstance(state, SessionState)
                if state.default_chat is not None:
                    chat = state.default_chat
                    await agent.subscribe(chat)
                    run.history.sessions.append(session)
                    run.history.chats.append(chat)
                    return chat
            except Exception:
                pass
            await asyncio.sleep(RETRY)  # a retry's pause


async def subscribed(client: HuddleClient, chat: str) -> None:
    async with asyncio.timeout(PATIENCE):
        while chat not in client.mirrors:
            try:
                await client.subscribe(chat)
            except Exception:
                await asyncio.sleep(RETRY)  # a retry's pause


# ─── Faults ──────────────────────────────────────────────────────────────────

KINDS = ("kill server", "kill worker", "kill redis primary", "stop process", "cut socket")


async def inject(run: Run, rng: random.Random, kind: str) -> str:
    """One fault, over when it is (what it killed runs again)."""
    if kind in ("kill server", "kill worker"):
        group = run.servers if kind == "kill server" else run.workers
        victim = rng.choice(group)
        await victim.kill()
        await victim.start()
        return victim.slot.name
    if kind == "kill redis primary":
        return await run.store.kill_primary(rng)
    if kind == "stop process":
        targets = {h.slot.name: h.process.pid for h in (*run.servers, *run.workers) if h.process}
        targets.update({f"redis {n}": pid for n, pid in run.store.pids().items()})
        name = rng.choice(sorted(targets))
        os.kill(targets[name], signal.SIGSTOP)
        await asyncio.sleep(PAUSE)  # the fault itself: a node hung this long
        os.kill(targets[name], signal.SIGCONT)
        return name
    proxy = rng.randrange(SERVERS)
    if rng.random() < 0.5:
        run.proxies[proxy].cut_after_next_send()
    else:
        run.proxies[proxy].cut_at_next_send()
    return f"proxy {proxy}"


async def fault_loop(run: Run, until: float) -> None:
    rng = random.Random(f"{run.args.seed}-faults")
    low, high = run.args.every
    while True:
        wait = rng.uniform(low, high)
        if time.monotonic() + wait > until:
            return
        await asyncio.sleep(wait)  # the run's schedule
        kind = KINDS[rng.randrange(len(KINDS))]
        at, began = time.strftime("%H:%M:%S"), time.monotonic()
        what = await inject(run, rng, kind)
        run.faults[kind] += 1
        took = time.monotonic() - began
        print(
            f"fault {sum(run.faults.values())} at {at}: {kind} ({what}), {took:.1f} s", flush=True
        )


# ─── The checker ─────────────────────────────────────────────────────────────


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def count(self, name: str, value: int) -> None:
        self.counts[name] = value

    def violate(self, name: str, note: str) -> None:
        self.violations[name] = self.violations.get(name, 0) + 1
        if len(self.notes) < 40:
            self.notes.append(f"{name}: {note}")


def read_ledger(root: Path) -> dict[str, list[dict[str, Any]]]:
    path = root / "ledger"
    runs: dict[str, list[dict[str, Any]]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            runs.setdefault(entry["key"], []).append(entry)
    return runs


async def final_states(run: Run) -> dict[str, ChatState]:
    reader = await run.connect(TOKEN, 0)
    states: dict[str, ChatState] = {}
    try:
        for chat in run.history.chats:
            mirror = await reader.subscribe(chat)
            states[chat] = mirror.chat
            await reader.unsubscribe(chat)
    finally:
        await reader.close()
    return states


async def check(run: Run) -> Tally:
    tally = Tally()
    history = run.history
    states = await final_states(run)
    store = open_channel_store(run.store.url, retention=100_000, retention_bytes=256 << 20)
    try:
        await check_actions(tally, history, store)
        await check_audit(tally, history, store)
    finally:
        await store.close()
    check_tools(tally, history, states, read_ledger(run.root))
    check_turns(tally, history, states)
    return tally


async def check_actions(tally: Tally, history: History, store: Any) -> None:
    logs: dict[str, dict[int, tuple[str | None, int | None]]] = {}
    for chat in history.chats:
        stored = await store.load(chat)
        entries = await store.read_log(chat, 0, stored.epoch)
        if entries is None:
            tally.violate("lost", f"{chat}: its log is not whole in the store")
            entries = stored.log
        log: dict[int, tuple[str | None, int | None]] = {}
        for raw in entries:
            envelope = decode_entry(raw).envelope
            origin = envelope.origin
            log[envelope.server_seq] = (
                (origin.client_id, origin.client_seq) if origin else (None, None)
            )
        logs[chat] = log
    for chat, seq, client, client_seq, action in history.acked:
        if logs.get(chat, {}).get(seq) != (client, client_seq):
            tally.violate("lost", f"{chat} seq {seq} ({type(action).__name__}) from {client}")
    tally.count("acknowledged", len(history.acked))


async def check_audit(tally: Tally, history: History, store: Any) -> None:
    keys = AuditKeys(store, None, now_ms=lambda: int(time.time() * 1000))
    signing = await keys.signing()
    public = read_public_keys(json.dumps(await keys.published()))
    verified = 0
    for session in history.sessions:
        lines = [line async for line in signed_export(store, session, signing, iso_now())]
        try:
            verify(lines, public)
            verified += 1
        except AuditBroken as error:
            tally.violate("audit broken", f"{session}: {error}")
    tally.count("audit verified", verified)


def submitted_values(action: ChatInputCompleted) -> dict[str, str]:
    return {k: str(getattr(a.value, "value", None)) for k, a in (action.answers or {}).items()}


def check_tools(
    tally: Tally,
    history: History,
    states: dict[str, ChatState],
    ledger: dict[str, list[dict[str, Any]]],
) -> None:
    calls: dict[str, tuple[str, ToolCallPart, list[InputRequestPart]]] = {}
    for chat, state in states.items():
        turns: list[Turn | ActiveTurn] = [*state.turns]
        if state.active_turn is not None:
            turns.append(state.active_turn)
        for turn in turns:
            forms = [p for p in turn.response_parts if isinstance(p, InputRequestPart)]
            for part in turn.response_parts:
                if isinstance(part, ToolCallPart):
                    key = f"{channel_id(chat)}.{turn.id}:{part.tool_call.tool_call_id}"
                    calls[key] = (chat, part, forms)
    ran = 0
    for key, runs in ledger.items():
        effects = {json.dumps([r["arguments"], r["form"]], sort_keys=True) for r in runs}
        if len(effects) > 1:
            tally.violate("run twice", f"{key}: {len(effects)} different effects")
        if key not in calls:
            tally.violate("run unapproved", f"{key}: no such call in any chat")
            continue
        chat, part, _ = calls[key]
        call = part.tool_call
        if not isinstance(call, ToolCallCompleted) or call.confirmed != "user-action":
            tally.violate("run unapproved", f"{key}: the chat shows it {call.__class__.__name__}")
        elif json.loads(call.tool_input or "null") != runs[0]["arguments"]:
            tally.violate("run unapproved", f"{key}: ran with input the people did not approve")
        ran += 1
    tally.count("tools run", ran)
    tally.count(REPLAYED, sum(len(r) - 1 for r in ledger.values()))
    denied = sum(1 for _, p, _ in calls.values() if isinstance(p.tool_call, ToolCallCancelled))
    tally.count("tools denied", denied)
    for key, (_, part, _) in calls.items():
        if isinstance(part.tool_call, ToolCallCompleted) and key not in ledger:
            tally.violate("run unapproved", f"{key}: shown completed, never ran")
    # Answers: every acknowledged submission reached whoever asked.
    forms_by_request = {
        (chat, form.request.id): key for key, (chat, _, forms) in calls.items() for form in forms
    }
    submitted = 0
    for chat, _, _, _, action in history.acked:
        if not isinstance(action, ChatInputCompleted) or action.response != "accept":
            continue
        submitted += 1
        values = submitted_values(action)
        where = (chat, action.request_id)
        if where in forms_by_request:
            runs = ledger.get(forms_by_request[where], [])
            if not any(r["form"] == values for r in runs):
                tally.violate("not delivered", f"{where}: the tool never saw {values}")
        elif history.agent_answers.get(where) != values:
            got = history.agent_answers.get(where)
            tally.violate("not delivered", f"{where}: the outside agent got {got}, not {values}")
    tally.count("answers submitted", submitted)


def check_turns(tally: Tally, history: History, states: dict[str, ChatState]) -> None:
    started = {
        (chat, action.turn_id)
        for chat, _, _, _, action in history.acked
        if isinstance(action, ChatTurnStarted)
    }
    for chat, turn_id in started:
        state = states[chat]
        if not finished(state, turn_id) and not active(state, turn_id):
            tally.violate("stuck", f"{chat} {turn_id}: acknowledged, then never shown")
    failed = 0
    for chat, state in states.items():
        failed += sum(1 for t in state.turns if t.state not in ("complete", "cancelled"))
        if state.active_turn is not None and not waiting_for_people(state):
            tally.violate("stuck", f"{chat} {state.active_turn.id}: active, nothing for people")
    tally.count("turns started", len(started))
    tally.count("turns that failed visibly", failed)


# ─── Main ────────────────────────────────────────────────────────────────────

REPLAYED = "tool bodies replayed under their key"
VIOLATIONS = ("lost", "run twice", "run unapproved", "not delivered", "stuck", "audit broken")


def table(run: Run, tally: Tally, minutes: float) -> str:
    c, v = tally.counts, tally.violations
    dict(sorted(run.history.rejected.items()))
    rows = [
        ("actions acknowledged / lost", f"{c.get('acknowledged', 0)} / {v.get('lost', 0)}"),
        (
            "tools run / run twice / run unapproved",
            f"{c.get('tools run', 0)} / {v.get('run twice', 0)} / {v.get('run unapproved', 0)}",
        ),
        ("tool calls denied", str(c.get("tools denied", 0))),
        (
            "tool bodies replayed under their key",
            str(c.get("tool bodies replayed under their key", 0)),
        ),
        (
            "answers submitted / not delivered",
            f"{c.get('answers submitted', 0)} / {v.get('not delivered', 0)}",
        ),
        ("turns started / stuck", f"{c.get('turns started', 0)} / {v.get('stuck', 0)}"),
        ("turns that failed visibly", str(c.get("turns that failed visibly", 0))),
        ("outside agent's turns", str(run.history.outside_turns)),
        (
            "audit chains verified / broken",
            f"{c.get('audit verified', 0)} / {v.get('audit broken', 0)}",
        ),
        ("actions never echoed (tried again)", str(run.history.unacknowledged)),
        (
            "actions rejected",
            ", ".join(f"{k} {n}" for k, n in sorted(run.history.rejected.items())) or "0",
        ),
        ("faults", ", ".join(f"{k} {run.faults[k]}" for k in KINDS)),
    ]
    slots = [h.slot for h in (*run.servers, *run.workers)] + list(run.store.slots.values())
    for slot in slots:
        rows.append(
            (
                f"RSS {slot.name}",
                f"{slot.first_rss // 1024} MiB -> peak {slot.peak_rss // 1024} MiB",
            )
        )
    head = f"seed {run.args.seed}, {minutes:.1f} minutes, {len(run.history.sessions)} sessions"
    lines = [head, "", "| | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join(lines)


def quiet_refusals(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A proxy whose server is down (killed, restarting) drops the client's
    connection: expected here, so not logged as a traceback."""
    if isinstance(context.get("exception"), OSError):
        return
    loop.default_exception_handler(context)


async def chaos(args: argparse.Namespace) -> int:
    asyncio.get_running_loop().set_exception_handler(quiet_refusals)
    async with deployed(args) as run:
        for index in range(SERVERS):
            run.agents.append(await run.connect(TOKEN, index))
        began = time.monotonic()
        sessions = [asyncio.create_task(play_session(run, i)) for i in range(args.sessions)]
        until = began + args.minutes * 60
        await fault_loop(run, until)
        await asyncio.sleep(max(0.0, until - time.monotonic()))  # the run's schedule
        run.stopping.set()
        print("faults stopped: driving every session to rest")
        results = await asyncio.gather(*sessions, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                where = traceback.extract_tb(result.__traceback__)[-2:]
                print(f"a session ended with {result!r} at {traceback.format_list(where)}")
        for process in (*run.servers, *run.workers):
            process.slot.sample()
        run.store.sample()
        tally = await check(run)
        for agent in run.agents:
            await agent.close()
        print(table(run, tally, (time.monotonic() - began) / 60))
        for note in tally.notes:
            print(f"  {note}")
        bad = {k: n for k, n in tally.violations.items() if n}
        if bad or any(isinstance(r, BaseException) for r in results):
            print(f"VIOLATIONS with seed {args.seed}: {bad}")
            return 1
        print(f"all zeros (seed {args.seed})")
        run.clean = True
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--single-redis", action="store_true", help="one redis-server")
    parser.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=(5.0, 15.0),
        metavar=("LOW", "HIGH"),
        help="seconds between faults (5 15)",
    )
    args = parser.parse_args(argv)
    print(f"chaos: seed {args.seed}, {args.minutes} minutes, {args.sessions} sessions")
    return asyncio.run(chaos(args))


if __name__ == "__main__":
    sys.exit(main())
