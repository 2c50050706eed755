"""A client id stays its token's while that token may come back, on every
process of one Redis; and a tool call is its executing token's, not its
client id's (issue 39).

Two servers share one Redis and one clock, which the tests move: a day
passes in a step, and each process renews the claims of its open sockets
when its time comes (:meth:`Server.renew_claims`, called here as the app's
timer would call it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.actions import (
    ChatToolCallComplete,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTurnStarted,
    SessionTitleChanged,
)
from protocol.chat import (
    ChatState,
    ClientContributor,
    ToolCallCompleted,
    ToolCallResult,
    ToolCallRunning,
)
from protocol.uris import ROOT_URI
from reducers.chat import select_tool_call
from server.client import Disconnected, HuddleClient
from server.config import Settings
from server.store.redis import RedisStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    RunningServer,
    WallClock,
    session_chat_with_turn,
    start_server,
    user_message,
)
from tests.edge import CuttingProxy, Peer, eventually, initialize_params
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis

SESSION = "ahp-session:/refunds"
HOUR = 3600.0
DAY = 24 * HOUR
TURN_STARTED = ChatTurnStarted(
    turn_id="t1", started_at="2026-12-08T10:00:00.000Z", message=user_message("Refund me")
)
NOT_EXECUTED = (
    "forbidden: tool call 'open' is not executed by this client, so it may not complete "
    "or update it"
)


@pytest.fixture
async def two(
    redis_server: RedisServer, clock: WallClock
) -> AsyncIterator[tuple[RunningServer, RunningServer]]:
    """Two servers on one Redis, on the test's clock."""
    a = await start_server(Settings(port=0), RedisStore(redis_server.url), clock=clock)
    b = await start_server(Settings(port=0), RedisStore(redis_server.url), clock=clock)
    try:
        yield a, b
    finally:
        await a.stop()
        await b.stop()


def person(running: RunningServer, clock: WallClock, name: str) -> str:
    """A participant token valid for an hour from the clock's now."""
    return running.authority.mint("participant", name=name, expires_at=clock.now + HOUR)


async def pass_time(clock: WallClock, seconds: float, *servers: RunningServer) -> None:
    """Move the clock on by ``seconds``, each process renewing its claims
    every quarter of a day as it goes."""
    left = seconds
    while left > 0:
        step = min(left, DAY / 4)
        clock.now += step
        left -= step
        for running in servers:
            await running.server.renew_claims()


async def test_an_open_agent_sockets_client_id_is_not_taken_a_day_later(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    agent = await Peer.ready(a.ws, AGENT_TOKEN, "agent-main")
    await pass_time(clock, DAY + 6 * HOUR, a, b)

    mallory = await Peer.open(b.ws, person(b, clock, "mallory"))
    reply = await mallory.request("initialize", initialize_params("agent-main"))

    assert reply["error"]["code"] == -32009
    assert reply["error"]["data"] == {"path": "$.params.clientId"}
    assert "result" in await agent.request(
        "ping", {"channel": ROOT_URI}
    )  # the agent's socket is still open
    await agent.close()
    await mallory.close()


async def test_a_closed_agent_comes_back_within_its_window_and_nobody_takes_its_id_meanwhile(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    gone = await Peer.ready(a.ws, AGENT_TOKEN, "agent-main")
    await gone.close()
    await pass_time(clock, 23 * HOUR, a, b)

    mallory = await Peer.open(b.ws, person(b, clock, "mallory"))
    refused = await mallory.request("initialize", initialize_params("agent-main"))
    back = await Peer.ready(b.ws, AGENT_TOKEN, "agent-main")  # on the other process

    assert refused["error"]["code"] == -32009
    # The window is bounded: a day after the agent's last socket closed,
    # the id is free again (nothing is judged by it any more).
    await back.close()
    await pass_time(clock, DAY + HOUR, a, b)
    taker = await Peer.ready(b.ws, person(b, clock, "mallory"), "agent-main")
    await taker.close()
    await mallory.close()


async def agents_chat(running: RunningServer) -> tuple[HuddleClient, str]:
    """The agent's client and a chat of its with turn t1 active."""
    agent = await running.client("agent")
    return agent, await session_chat_with_turn(agent, SESSION, TURN_STARTED)


async def completion_echo(
    running: RunningServer, token: str, chat: str, client_id: str
) -> dict[str, object]:
    """The echo of ``token``'s completion of tool call ``open``, sent on a
    socket of client id ``client_id``."""
    mallory = await Peer.ready(running.ws, token, client_id)
    await mallory.subscribe(chat)
    result = ToolCallResult(success=True, past_tense_message="Refunded (forged)")
    await mallory.dispatch(
        chat, ChatToolCallComplete(turn_id="t1", tool_call_id="open", result=result)
    )
    echo = await mallory.envelope()
    await mallory.close()
    return echo


async def start_call(agent: HuddleClient, chat: str, client_id: str) -> None:
    """Tool call ``open`` of turn t1, a tool of the client ``client_id``."""
    start = ChatToolCallStart(
        turn_id="t1",
        tool_call_id="open",
        tool_name="refund",
        display_name="Refund",
        contributor=ClientContributor(client_id=client_id),
    )
    await agent.dispatch_and_wait(chat, start)
    ready = ChatToolCallReady(
        turn_id="t1", tool_call_id="open", invocation_message="Refund", confirmed="not-needed"
    )
    await agent.dispatch_and_wait(chat, ready)


async def still_running(running: RunningServer, chat: str) -> bool:
    state = (await running.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    return isinstance(select_tool_call(state, "open"), ToolCallRunning)


async def test_a_forged_result_for_the_agents_tool_call_is_refused_under_the_agents_client_id(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    agent, chat = await agents_chat(a)
    tools = await Peer.ready(a.ws, AGENT_TOKEN, "agent-tools")  # the agent's own tools
    await start_call(agent, chat, "agent-tools")
    await tools.close()
    await pass_time(clock, DAY + HOUR, a, b)  # the id is free to be taken now

    echo = await completion_echo(b, person(b, clock, "mallory"), chat, "agent-tools")

    assert echo["rejectionReason"] == NOT_EXECUTED
    assert await still_running(a, chat)


async def test_a_forged_result_under_a_client_id_nobody_held_when_the_call_started_is_refused(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    agent, chat = await agents_chat(a)
    await start_call(agent, chat, "laptop")

    echo = await completion_echo(b, person(b, clock, "mallory"), chat, "laptop")

    assert echo["rejectionReason"] == NOT_EXECUTED
    assert await still_running(a, chat)


async def test_the_token_executing_a_call_completes_it_from_another_process(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    agent, chat = await agents_chat(a)
    alice_token = person(b, clock, "alice")
    laptop = await Peer.ready(b.ws, alice_token, "laptop")
    await start_call(agent, chat, "laptop")
    await laptop.close()

    echo = await completion_echo(b, alice_token, chat, "phone")  # her phone: another id

    assert "rejectionReason" not in echo
    async with asyncio.timeout(5 * UNIT):  # b's append reaches a through the store
        await agent.mirrors[chat].wait_for(
            lambda state: (
                isinstance(state, ChatState)
                and isinstance(select_tool_call(state, "open"), ToolCallCompleted)
            )
        )


async def test_huddles_client_starts_with_a_fresh_id_when_its_id_was_claimed_first(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    squatter = await Peer.ready(b.ws, person(b, clock, "mallory"), "agent-main")

    agent = await HuddleClient.connect(a.ws, AGENT_TOKEN, client_id="agent-main")
    a.clients.append(agent)
    chat = await session_chat_with_turn(agent, SESSION, TURN_STARTED)

    assert agent.client_id != "agent-main"
    assert agent.mirrors[chat].chat.active_turn is not None  # it works as itself
    await squatter.close()


async def test_huddles_client_back_after_its_window_goes_on_with_a_fresh_id(
    two: tuple[RunningServer, RunningServer], clock: WallClock
) -> None:
    a, b = two
    proxy = await CuttingProxy(a.port).start()
    agent = await HuddleClient.connect(proxy.url(), AGENT_TOKEN, client_id="agent-main")
    a.clients.append(agent)
    await session_chat_with_turn(agent, SESSION, TURN_STARTED)
    proxy.hold_new_connections()
    proxy.cut_at_next_send()  # the title never reaches the server
    sending = asyncio.create_task(agent.dispatch_and_wait(SESSION, SessionTitleChanged(title="1")))
    await eventually(lambda: all(r.client_id != "agent-main" for r in a.server.connections))
    await pass_time(clock, DAY + HOUR, a, b)
    squatter = await Peer.ready(b.ws, person(b, clock, "mallory"), "agent-main")

    proxy.release()
    async with asyncio.timeout(5 * UNIT):
        with pytest.raises(Disconnected, match="id was taken"):
            await sending  # sent again under a new id, it could be applied twice
        await agent.connected.wait()
    echo = await agent.dispatch_and_wait(SESSION, SessionTitleChanged(title="Refunds"))

    assert agent.client_id != "agent-main"
    assert echo.origin is not None
    assert echo.origin.client_id == agent.client_id
    await squatter.close()
    await proxy.close()
