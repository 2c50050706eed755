"""The demo story across processes: two servers and a worker on one Redis.

Two participants fill in the form on one server, a third approves on the
other, and the turn runs in a ``huddle worker`` process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatTurnStarted,
    StateAction,
)
from protocol.chat import ChatState, InputAnswer, SelectedValue, TextValue
from protocol.messages import ActionEnvelope
from protocol.session import SessionState
from server.client import HuddleClient
from tests.conftest import UNIT, user_message
from tests.redis_server import RedisServer
from tests.test_runner_demo import final_text, open_request, pending_call, wait
from tests.test_serve_cli import TOKEN, Served, read_until, start

pytestmark = pytest.mark.redis


@dataclass
class Cluster:
    first: Served
    second: Served
    worker: asyncio.subprocess.Process
    worker_output: list[str]

    def ws(self, served: Served) -> str:
        return f"ws://127.0.0.1:{served.port}/ahp"

    @property
    def processes(self) -> list[asyncio.subprocess.Process]:
        return [self.first.process, self.second.process, self.worker]


@contextlib.asynccontextmanager
async def processes_on(store: str) -> AsyncIterator[Cluster]:
    """Two ``huddle serve --workers 0`` and a ``huddle worker`` on ``store``,
    killed at the end. Their output is read all along (into ``output``), so
    that no process ever blocks on a full pipe."""
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": store}
    started: list[asyncio.subprocess.Process] = []
    readers: list[asyncio.Task[None]] = []
    try:
        first = await start("--workers", "0", env=env)
        started.append(first.process)
        second = await start("--workers", "0", env=env)
        started.append(second.process)
        worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server",
            "worker",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
        )
        started.append(worker)
        worker_output: list[str] = []
        await read_until(worker, worker_output, "huddle worker:")
        for process, output in (
            (first.process, first.output),
            (second.process, second.output),
            (worker, worker_output),
        ):
            readers.append(asyncio.create_task(read_all(process, output)))
        try:
            yield Cluster(first, second, worker, worker_output)
        except BaseException:
            # Shown with the failure: what each process logged.
            for name, output in (
                ("first server", first.output),
                ("second server", second.output),
                ("worker", worker_output),
            ):
                print(f"─── {name} ───", "".join(output), sep="\n")
            raise
    finally:
        for process in started:
            if process.returncode is None:
                process.kill()
                await process.wait()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)


async def read_all(process: asyncio.subprocess.Process, output: list[str]) -> None:
    assert process.stdout is not None
    while line := await process.stdout.readline():
        output.append(line.decode())


@pytest.fixture
async def cluster(redis_server: RedisServer) -> AsyncIterator[Cluster]:
    async with processes_on(redis_server.url) as processes:
        yield processes


def submitted(value: TextValue | SelectedValue) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


Dispatch = Callable[[HuddleClient, str, StateAction], Awaitable[object]]


async def dispatch_and_wait(client: HuddleClient, chat: str, action: StateAction) -> object:
    return await client.dispatch_and_wait(chat, action)


async def play_the_story(
    cluster: Cluster,
    *,
    when_the_form_is_open: Callable[[str], Awaitable[None]] | None = None,
    dispatch: Dispatch = dispatch_and_wait,
    patience: float = 10 * UNIT,
) -> None:
    """The demo story: alice's turn starts the agent, alice and bob (on the
    first server) fill in its form, carol (on the second) approves, the
    ticket is created exactly once. ``when_the_form_is_open`` runs (with
    the chat) once the form is there; ``dispatch`` sends people's actions
    from then on, and the agent's steps after them may take ``patience``
    seconds each."""
    alice = await HuddleClient.connect(cluster.ws(cluster.first), TOKEN, client_id="alice")
    bob = await HuddleClient.connect(cluster.ws(cluster.first), TOKEN, client_id="bob")
    carol = await HuddleClient.connect(cluster.ws(cluster.second), TOKEN, client_id="carol")
    await alice.create_session("ahp-session:/outage")
    session = await alice.subscribe("ahp-session:/outage")
    assert isinstance(session.state, SessionState)
    chat = session.state.default_chat
    assert chat is not None
    alice_chat, bob_chat, carol_chat = (
        await alice.subscribe(chat),
        await bob.subscribe(chat),
        await carol.subscribe(chat),
    )
    completions: list[ActionEnvelope] = []
    carol_chat.listeners.append(
        lambda e: completions.append(e) if isinstance(e.action, ChatToolCallComplete) else None
    )
    await alice.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1",
            started_at="2026-11-30T10:00:00.000Z",
            message=user_message("Open a high-priority ticket: nobody can log in"),
        ),
    )
    state = await wait(bob_chat, lambda s: open_request(s) is not None)
    request = open_request(state)
    assert request is not None
    rid = request.request.id
    if when_the_form_is_open is not None:
        await when_the_form_is_open(chat)
    await dispatch(
        alice,
        chat,
        ChatInputAnswerChanged(
            request_id=rid,
            question_id="affectedSystem",
            answer=submitted(TextValue(value="Single sign-on")),
        ),
    )
    await dispatch(
        bob,
        chat,
        ChatInputAnswerChanged(
            request_id=rid,
            question_id="impactScope",
            answer=submitted(SelectedValue(value="ALL_USERS")),
        ),
    )
    await dispatch(bob, chat, ChatInputCompleted(request_id=rid, response="accept"))
    async with asyncio.timeout(patience):
        confirming = await carol_chat.wait_for(lambda s: pending_call(s) is not None)
    call = pending_call(confirming)
    assert call is not None
    await dispatch(
        carol,
        chat,
        ChatToolCallConfirmed(
            turn_id="t1", tool_call_id=call.tool_call_id, approved=True, confirmed="user-action"
        ),
    )
    async with asyncio.timeout(patience):
        done = await alice_chat.wait_for(lambda s: isinstance(s, ChatState) and bool(s.turns))
    assert isinstance(done, ChatState)
    assert done.turns[-1].state == "complete"
    assert "HUD-" in final_text(done)
    async with asyncio.timeout(5 * UNIT):
        await carol_chat.wait_for(lambda s: isinstance(s, ChatState) and bool(s.turns))
    assert len(completions) == 1  # the ticket was created exactly once
    for client in (alice, bob, carol):
        await client.close()


async def test_the_story_runs_in_a_worker_with_people_on_two_servers(cluster: Cluster) -> None:
    await play_the_story(cluster)
