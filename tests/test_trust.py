"""Who did what is the server's word: tried as an attacker with a
participant or observer token would, over real sockets.

Every test here is a hole that was open: a forged tool result through a
borrowed client id, an answer credited to the wrong person, an observer
overwriting an identity, a scoped token writing the root channel.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatDraftChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageSet,
    ChatToolCallComplete,
    ChatToolCallContentChanged,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnComplete,
    ChatTurnStarted,
    RootConfigChanged,
    SessionActiveClientRemoved,
    SessionActiveClientSet,
)
from protocol.chat import (
    ChatState,
    ClientContributor,
    InputAnswer,
    InputRequest,
    TextQuestion,
    TextValue,
    ToolCallResult,
    ToolCallRunning,
)
from protocol.codec import encode
from protocol.session import ActiveClient, SessionState
from protocol.uris import ROOT_URI
from reducers.chat import select_tool_call
from server.auth import token_id
from server.config import Settings
from server.edge.rpc import PRESENT_PER_TOKEN
from server.store.redis import RedisStore
from tests.conftest import UNIT, RunningServer, start_server, user_message
from tests.edge import Frame, Peer, eventually, http, initialize_params
from tests.redis_server import RedisServer

SESSION = "ahp-session:/trust"
TURN = ChatTurnStarted(
    turn_id="t1", started_at="2026-11-30T10:00:00.000Z", message=user_message("Go")
)


async def chat_of(huddle: RunningServer) -> str:
    agent = await huddle.client("agent", name="agent")
    await agent.create_session(SESSION)
    mirror = await agent.subscribe(SESSION)
    assert isinstance(mirror.state, SessionState)
    assert mirror.state.default_chat is not None
    await agent.dispatch_and_wait(mirror.state.default_chat, TURN)
    return mirror.state.default_chat


async def call_run_by(huddle: RunningServer, chat: str, client_id: str) -> None:
    """Tool call ``open`` of turn t1, executed by the client ``client_id``."""
    agent = huddle.clients[0]
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallStart(
            turn_id="t1",
            tool_call_id="open",
            tool_name="open_browser",
            display_name="Open browser",
            contributor=ClientContributor(client_id=client_id),
        ),
    )
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallReady(
            turn_id="t1", tool_call_id="open", invocation_message="Open it", confirmed="not-needed"
        ),
    )


def complete(text: str) -> ChatToolCallComplete:
    result = ToolCallResult(success=True, past_tense_message=text)
    return ChatToolCallComplete(turn_id="t1", tool_call_id="open", result=result)


async def test_a_client_id_another_token_holds_is_refused_at_initialize(
    huddle: RunningServer,
) -> None:
    chat = await chat_of(huddle)
    await call_run_by(huddle, chat, "laptop")
    alice = await Peer.ready(huddle.ws, huddle.token(name="alice"), "laptop")

    mallory = await Peer.open(huddle.ws, huddle.token(name="mallory"))
    reply = await mallory.request("initialize", initialize_params("laptop"))

    assert reply["error"]["code"] == -32009
    assert reply["error"]["message"] == (
        "clientId 'laptop' belongs to another token: choose another"
    )
    await alice.close()


async def test_a_client_id_stays_its_tokens_after_the_connection_closed(
    huddle: RunningServer,
) -> None:
    alice = await Peer.ready(huddle.ws, huddle.token(name="alice"), "laptop")
    await alice.close()

    mallory = await Peer.open(huddle.ws, huddle.token(name="mallory"))
    reply = await mallory.request("initialize", initialize_params("laptop"))

    assert reply["error"]["code"] == -32009


async def test_an_observer_cannot_take_a_participants_client_id(huddle: RunningServer) -> None:
    alice = await Peer.ready(huddle.ws, huddle.token(name="alice"), "laptop")

    olga = await Peer.open(huddle.ws, huddle.token("observer", name="olga"))
    reply = await olga.request("initialize", initialize_params("laptop"))

    assert reply["error"]["code"] == -32009
    await alice.close()


async def test_the_same_token_reconnecting_with_its_client_id_takes_its_place(
    huddle: RunningServer,
) -> None:
    token = huddle.token(name="alice")
    old = await Peer.ready(huddle.ws, token, "laptop")

    new = await Peer.ready(huddle.ws, token, "laptop")

    assert await old.close_code() == 4001
    assert "result" in await new.request("ping", {"channel": ROOT_URI})


async def test_a_participant_cannot_forge_another_clients_tool_result(
    huddle: RunningServer,
) -> None:
    chat = await chat_of(huddle)
    await call_run_by(huddle, chat, "laptop")
    mallory = await Peer.ready(huddle.ws, huddle.token(name="mallory"), "mallory-pc")
    await mallory.subscribe(chat)

    await mallory.dispatch(chat, complete("Opened (forged)"))

    echo = await mallory.envelope()
    assert echo["rejectionReason"] == (
        "forbidden: tool call 'open' is not executed by this client, so it may not complete "
        "or update it"
    )
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert isinstance(select_tool_call(state, "open"), ToolCallRunning)


async def test_the_executing_client_completes_its_own_tool_call(huddle: RunningServer) -> None:
    chat = await chat_of(huddle)
    alice = await Peer.ready(huddle.ws, huddle.token(name="alice"), "laptop")
    await call_run_by(huddle, chat, "laptop")
    await alice.subscribe(chat)

    await alice.dispatch(chat, complete("Opened"))

    assert "rejectionReason" not in await alice.envelope()


async def test_the_executor_completes_its_call_after_an_update_that_replaced_its_meta(
    huddle: RunningServer,
) -> None:
    # AHP: an action's _meta replaces the call's; the executor the server
    # recorded there is carried on, or the update would lock its sender out.
    chat = await chat_of(huddle)
    alice = await Peer.ready(huddle.ws, huddle.token(name="alice"), "laptop")
    await call_run_by(huddle, chat, "laptop")
    await alice.subscribe(chat)
    progress = ChatToolCallContentChanged(
        turn_id="t1", tool_call_id="open", content=[], meta={"progress": 0.5}
    )

    await alice.dispatch(chat, progress)
    await alice.dispatch(chat, complete("Opened"))

    updated, completed = await alice.envelope(), await alice.envelope()
    assert "rejectionReason" not in updated
    assert "rejectionReason" not in completed
    await alice.close()


async def test_the_token_executing_a_call_completes_it_over_http_and_no_other(
    huddle: RunningServer,
) -> None:
    # Every door asks the same policy: over HTTP, with no client id at all,
    # the executing token is the one that may complete its call.
    chat = await chat_of(huddle)
    alice = huddle.token(name="alice")
    laptop = await Peer.ready(huddle.ws, alice, "laptop")
    await call_run_by(huddle, chat, "laptop")
    body = {"channel": chat, "action": json.loads(encode(complete("Opened")))}

    forged = await http(
        "POST", f"{huddle.http}/api/dispatch", token=huddle.token(name="mallory"), body=body
    )
    done = await http("POST", f"{huddle.http}/api/dispatch", token=alice, body=body)

    assert forged.status == 403
    assert done.status == 200, done
    await laptop.close()


async def test_the_long_poll_credits_the_token_that_answered(huddle: RunningServer) -> None:
    chat = await chat_of(huddle)
    agent = huddle.clients[0]
    question = InputRequest(id="q", questions=[TextQuestion(id="why", message="Why?")])
    await agent.dispatch_and_wait(chat, ChatInputRequested(request=question))
    poll = asyncio.create_task(
        http(
            "GET",
            f"{huddle.http}/api/input/wait?chat={chat}&request=q&timeout={5 * UNIT}",
            token=huddle.token(name="agent-poller"),
        )
    )
    await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) > 0)
    mallory = await huddle.client(name="mallory", client_id="alice")
    answer = InputAnswer(state="submitted", value=TextValue(value="because"))

    await mallory.dispatch_and_wait(
        chat, ChatInputCompleted(request_id="q", response="accept", answers={"why": answer})
    )

    reply = await poll
    assert reply.json()["by"] == "mallory"


async def test_a_participant_sets_only_its_own_active_client_entry_under_its_tokens_name(
    huddle: RunningServer,
) -> None:
    await chat_of(huddle)
    dana = await Peer.ready(huddle.ws, huddle.token(name="dana"), "dana-phone")
    await dana.subscribe(SESSION)
    mine = ActiveClient(client_id="dana-phone", display_name="The CEO", tools=[])
    theirs = ActiveClient(client_id="laptop", display_name="Dana", tools=[])

    await dana.dispatch(SESSION, SessionActiveClientSet(active_client=mine))
    await dana.dispatch(SESSION, SessionActiveClientSet(active_client=theirs))
    await dana.dispatch(SESSION, SessionActiveClientRemoved(client_id="laptop"))

    accepted, *refused = [await dana.envelope() for _ in range(3)]
    assert accepted["action"]["activeClient"]["displayName"] == "dana"
    assert [e["rejectionReason"] for e in refused] == [
        "forbidden: a client may set only its own active-client entry, not 'laptop'",
        "forbidden: a client may remove only its own active-client entry, not 'laptop'",
    ]


async def test_one_token_cannot_crowd_a_session_out_with_its_sockets(
    huddle: RunningServer,
) -> None:
    await chat_of(huddle)
    token = huddle.token(name="mallory")
    sockets = [await Peer.ready(huddle.ws, token, f"m-{n}") for n in range(PRESENT_PER_TOKEN + 1)]
    for peer in sockets:
        await peer.subscribe(SESSION)
        entry = ActiveClient(client_id=peer.client_id, tools=[])
        await peer.dispatch(SESSION, SessionActiveClientSet(active_client=entry))

    async def own_echo(peer: Peer) -> Frame:
        while (envelope := await peer.envelope()).get("origin", {}).get(
            "clientId"
        ) != peer.client_id:
            pass
        return envelope

    echoes = [await own_echo(peer) for peer in sockets]
    dana = await Peer.ready(huddle.ws, huddle.token(name="dana"), "dana")
    await dana.subscribe(SESSION)
    await dana.dispatch(
        SESSION, SessionActiveClientSet(active_client=ActiveClient(client_id="dana", tools=[]))
    )

    assert [e.get("rejectionReason") for e in echoes[:-1]] == [None] * PRESENT_PER_TOKEN
    assert echoes[-1]["rejectionReason"].startswith("too-many: a token may be among")
    assert "rejectionReason" not in await own_echo(dana)


@pytest.mark.redis
async def test_one_token_cannot_crowd_a_session_out_by_spreading_over_processes(
    redis_server: RedisServer,
) -> None:
    one = await start_server(Settings(port=0), RedisStore(redis_server.url))
    other = await start_server(Settings(port=0), RedisStore(redis_server.url))
    try:
        await chat_of(one)
        token = one.token(name="mallory")
        sockets = [
            await Peer.ready((one, other)[n % 2].ws, token, f"m-{n}")
            for n in range(PRESENT_PER_TOKEN + 1)
        ]
        watcher = await (await other.client(name="watcher")).subscribe(SESSION)
        echoes = []
        for peer in sockets:  # one by one: the last is the one too many
            await peer.subscribe(SESSION)
            entry = ActiveClient(client_id=peer.client_id, tools=[])
            await peer.dispatch(SESSION, SessionActiveClientSet(active_client=entry))
            echoes.append(await own_echo(peer))
        await sockets[0].close()  # its place comes free, for this token too
        await watcher.wait_for(
            lambda state: (
                isinstance(state, SessionState)
                and all(c.client_id != "m-0" for c in state.active_clients)
            )
        )
        again = sockets[-1]
        entry = ActiveClient(client_id=again.client_id, tools=[])
        await again.dispatch(SESSION, SessionActiveClientSet(active_client=entry))
        taken = await own_echo(again)
        for peer in sockets[1:]:
            await peer.close()
    finally:
        await one.stop()
        await other.stop()

    assert [e.get("rejectionReason") for e in echoes[:-1]] == [None] * PRESENT_PER_TOKEN
    assert echoes[-1]["rejectionReason"].startswith("too-many: a token may be among")
    assert "rejectionReason" not in taken


async def own_echo(peer: Peer) -> Frame:
    """The next envelope of ``peer``'s own action."""
    while (envelope := await peer.envelope()).get("origin", {}).get("clientId") != peer.client_id:
        pass
    return envelope


async def test_a_connection_that_takes_over_a_client_id_takes_its_presence_too(
    huddle: RunningServer,
) -> None:
    await chat_of(huddle)
    watcher = await (await huddle.client(name="watcher")).subscribe(SESSION)
    token = huddle.token(name="mallory")
    first = await Peer.ready(huddle.ws, token, "m-1")
    await first.subscribe(SESSION)
    entry = ActiveClient(client_id="m-1", tools=[])
    await first.dispatch(SESSION, SessionActiveClientSet(active_client=entry))
    await first.envelope()

    def listed(state: object) -> bool:
        assert isinstance(state, SessionState)
        return any(c.client_id == "m-1" for c in state.active_clients)

    async with asyncio.timeout(5 * UNIT):
        await watcher.wait_for(listed)
    again = await Peer.ready(huddle.ws, token, "m-1")  # the first is closed: replaced
    budget = huddle.authority.verify(token, 0).budget_key
    assert huddle.server.clients.present_in(SESSION, budget) == 1  # counted for the token
    await again.ws.close()  # and taken out with the one that holds it now

    async with asyncio.timeout(5 * UNIT):
        await watcher.wait_for(lambda state: not listed(state))


async def test_a_token_scoped_to_a_session_cannot_change_the_root_channel(
    huddle: RunningServer,
) -> None:
    await chat_of(huddle)
    scoped = await Peer.ready(huddle.ws, huddle.token(sessions=[SESSION], name="s"), "scoped")
    await scoped.subscribe(ROOT_URI)
    before = (await huddle.server.parts.host.view(ROOT_URI)).seq

    await scoped.dispatch(ROOT_URI, RootConfigChanged(config={"theme": "mine"}))

    echo = await scoped.envelope()
    assert echo["rejectionReason"] == (
        "forbidden: a token scoped to sessions may not change the root channel"
    )
    assert (await huddle.server.parts.host.view(ROOT_URI)).seq == before


async def test_a_scoped_token_cannot_tell_a_chat_of_another_session_by_its_uri(
    huddle: RunningServer,
) -> None:
    own_chat = await chat_of(huddle)
    agent = await huddle.client("agent", name="agent")
    await agent.create_session("ahp-session:/elsewhere")
    elsewhere = await agent.subscribe("ahp-session:/elsewhere")
    assert isinstance(elsewhere.state, SessionState)
    other_chat = elsewhere.state.default_chat
    assert other_chat is not None
    scoped = await Peer.ready(huddle.ws, huddle.token(sessions=[SESSION], name="s"), "scoped")

    answers = [
        (await scoped.request("createChat", {"channel": SESSION, "chat": chat}))["error"]
        for chat in (other_chat, own_chat)
    ]

    # AHP: AlreadyExists; one answer for any taken URI, naming no session.
    assert answers == [
        {
            "code": -32010,
            "message": f"the chat URI {chat} is taken: choose another (ahp-chat:/<uuid>)",
        }
        for chat in (other_chat, own_chat)
    ]


async def test_a_root_action_that_changes_nothing_is_not_stored(huddle: RunningServer) -> None:
    # Huddle's root channel has no config schema: a config change is a no-op.
    peer = await Peer.ready(huddle.ws, huddle.token(name="p"), "p")
    await peer.subscribe(ROOT_URI)
    seq = (await huddle.server.parts.host.view(ROOT_URI)).seq

    for _ in range(3):
        await peer.dispatch(ROOT_URI, RootConfigChanged(config={"theme": "dark"}))

    for _ in range(3):
        echo = await peer.envelope()
        assert echo["rejectionReason"] == "no-change: the root channel already holds that"
    assert (await huddle.server.parts.host.view(ROOT_URI)).seq == seq


async def test_json_nested_too_deeply_is_a_parse_error_and_the_socket_stays(
    huddle: RunningServer,
) -> None:
    peer = await Peer.ready(huddle.ws, huddle.token(), "deep")
    nested = "[" * 5000 + "]" * 5000
    await peer.send('{"jsonrpc":"2.0","id":7,"method":"ping","params":' + nested + "}")

    reply = await peer.receive()

    assert reply == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32700, "message": "JSON nested deeper than 64 levels"},
    }
    assert "result" in await peer.request("ping", {"channel": ROOT_URI})


async def test_minted_token_lifetime_has_a_maximum(huddle: RunningServer) -> None:
    reply = await http(
        "POST",
        f"{huddle.http}/api/tokens",
        token=huddle.token("agent"),
        body={"role": "participant", "ttl": 10 * 365 * 24 * 3600},
    )

    assert reply.status == 400
    assert reply.json()["path"] == "$.ttl"
    assert "at most 7776000" in reply.json()["error"]


def test_encoded_frames_stay_plain_json() -> None:
    # The frames the tests above send are what a client would send.
    assert json.loads(encode(TURN)) == {
        "type": "chat/turnStarted",
        "turnId": "t1",
        "startedAt": "2026-11-30T10:00:00.000Z",
        "message": {"text": "Go", "origin": {"kind": "user"}},
    }


async def test_a_persons_turn_says_whose_it_is_and_only_they_may_truncate_it(
    huddle: RunningServer,
) -> None:
    # AHP's chat/truncated rewinds a chat: a participant could erase anyone's
    # finished turns; the turn's message now says whose token started it
    # (whatever the client claims there).
    chat = await chat_of(huddle)
    agent = huddle.clients[0]
    await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t1", duration=1))
    lee_token, dana_token = huddle.token(name="Lee"), huddle.token(name="Dana")
    lee = await Peer.ready(huddle.ws, lee_token, "lee")
    dana = await Peer.ready(huddle.ws, dana_token, "dana")
    for peer in (lee, dana):
        await peer.subscribe(chat)
    forged = replace(user_message("mine"), meta={"huddle": {"by": token_id(dana_token)}})
    started = ChatTurnStarted(turn_id="l1", started_at="2026-12-01T10:00:00Z", message=forged)
    await lee.dispatch(chat, started)
    assert "rejectionReason" not in await lee.envelope()
    await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="l1", duration=1))

    await dana.dispatch(chat, ChatTruncated(turn_id="t1"))
    refused = await eventually_envelope(dana, lambda e: e["origin"]["clientId"] == "dana")
    await lee.dispatch(chat, ChatTruncated(turn_id="t1"))
    accepted = await eventually_envelope(lee, lambda e: e["origin"]["clientId"] == "lee")

    state = await huddle.server.parts.host.view(chat)
    assert refused["rejectionReason"].startswith("forbidden: turn 'l1' was started by someone else")
    assert "rejectionReason" not in accepted
    assert [t.id for t in state.state.turns] == ["t1"]  # type: ignore[union-attr]


async def test_which_turn_of_an_id_a_turn_is_is_the_servers_word(huddle: RunningServer) -> None:
    # A turn id may come back after a truncation; the server's stamp tells
    # the turns that bore it apart (server.runner.bridge matches the agent's
    # turns by it), so a client's own "turn" there is replaced, or dropped.
    chat = await chat_of(huddle)
    agent = huddle.clients[0]
    await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t1", duration=1))
    lee = await Peer.ready(huddle.ws, huddle.token(name="Lee"), "lee")
    await lee.subscribe(chat)
    forged = replace(user_message("mine"), meta={"huddle": {"turn": "0badcafe"}})
    queued = ChatPendingMessageSet(kind="queued", id="q1", message=forged)
    await lee.dispatch(chat, queued)
    assert "rejectionReason" not in await lee.envelope()
    started = ChatTurnStarted(turn_id="l1", started_at="2026-12-01T10:00:00Z", message=forged)
    await lee.dispatch(chat, started)
    assert "rejectionReason" not in await lee.envelope()

    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert state.active_turn is not None
    stamp = state.active_turn.message.meta["huddle"]["turn"]  # type: ignore[index]
    assert re.fullmatch("[0-9a-f]{8}", stamp)
    assert stamp != "0badcafe"
    assert state.queued_messages is not None
    assert "turn" not in state.queued_messages[0].message.meta["huddle"]  # type: ignore[index]


async def eventually_envelope(peer: Peer, mine: Callable[[Frame], bool]) -> Frame:
    """The next envelope on ``peer`` that ``mine`` says is the one."""
    while not mine(envelope := await peer.envelope()):
        pass
    return envelope


async def test_a_persons_action_carries_no_huddle_meta_of_its_own(huddle: RunningServer) -> None:
    # `_meta.huddle` is the server's word (who sent it, the expiry that made
    # it); a participant's action or draft put Alice's token there, and every
    # subscriber and the chat's log had it as sent.
    chat = await chat_of(huddle)
    alice = token_id(huddle.token(name="alice"))
    forged = {"huddle": {"by": alice, "expired": {"family": "input"}}, "x": 1}
    mallory = await huddle.client(name="mallory")
    draft = ChatDraftChanged(draft=replace(user_message("draft"), meta=forged))

    drafted = (await mallory.dispatch_and_wait(chat, draft)).action

    assert isinstance(drafted, ChatDraftChanged)
    assert drafted.draft is not None
    assert drafted.draft.meta == {"x": 1}
    state = (await huddle.server.parts.host.view(chat)).state
    assert isinstance(state, ChatState)
    assert state.draft is not None
    assert state.draft.meta == {"x": 1}

    # A queued message is stamped with the server's keys, and only those.
    queued = ChatPendingMessageSet(
        kind="queued", id="q1", message=replace(user_message("next"), meta=forged)
    )
    sent = (await mallory.dispatch_and_wait(chat, queued)).action
    assert isinstance(sent, ChatPendingMessageSet)
    assert sent.message.meta == {"huddle": {"by": token_id(mallory.token)}, "x": 1}
