"""A server's pub/sub subscriptions follow the channels it serves, on a
single Redis and on a cluster, seen through the servers (``PUBSUB
SHARDNUMSUB`` counts the connections subscribed to a channel's topic; each
server here has a store of its own, as a process would).

- a server subscribes to what its clients watch, and not to the channels
  other servers serve;
- subscriptions follow clients as they come and go: a channel is watched
  from its first subscriber on, and once its last one left and the channel
  is evicted it is no longer watched;
- a lost pub/sub message is caught by the head check: for a served channel
  within an interval, and for every channel held (idle ones too) when the
  link to Redis comes back.

What decides which channels are served and held is the channel core's: it
keeps a channel nobody here serves for ``idle_keep`` seconds after its last
use (so a server soon stops hearing a chat its clients left, and a chat a
turn waits on here stays heard: it is pinned), and up to ``idle_channels``
of them, the least recently used evicted first (first test, on the memory
store); a channel
only held applies what it hears a moment later, but before a read or a
write of it (second test).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from protocol.actions import ChatDraftChanged
from protocol.chat import ChatState
from protocol.messages import ReplayResume
from protocol.session import SessionState
from server.config import Settings
from server.core.channels import Applied, ChannelCore, Step, step
from server.frames import ActionFrame, OutFrame
from server.store.base import ClientAction, encode_entry
from server.store.memory import MemoryStore
from server.store.redis import APPEND, RedisStore
from tests.conftest import UNIT, RunningServer, start_server, user_message
from tests.redis_server import Deployment, deployed
from tests.test_store_contract import Heard


@pytest.fixture(
    params=[
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ]
)
async def deployment(request: pytest.FixtureRequest) -> AsyncIterator[Deployment]:
    async with deployed(request.param, 10 * UNIT) as made:
        yield made


@contextlib.asynccontextmanager
async def servers(
    deployment: Deployment, count: int, settings: Settings | None = None
) -> AsyncIterator[list[RunningServer]]:
    """``count`` servers, each on a Redis store of its own."""
    running: list[RunningServer] = []
    try:
        for _ in range(count):
            store = RedisStore(deployment.url)
            running.append(await start_server(settings or Settings(port=0), store))
        yield running
    finally:
        for server in running:
            await server.stop()


async def new_chat(server: RunningServer, session: str) -> str:
    """Create ``session`` through ``server``; its default chat."""
    agent = await server.client("agent")
    await agent.create_session(session)
    state = (await agent.subscribe(session)).state
    assert isinstance(state, SessionState)
    assert state.default_chat is not None
    await agent.close()
    return state.default_chat


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Return once ``check`` holds (what it looks at changes elsewhere, in
    Redis or in a server's background task, with nothing to await)."""
    async with asyncio.timeout(5 * UNIT):
        while not await check():  # noqa: ASYNC110 - nothing to await
            await asyncio.sleep(0.02 * UNIT)


def draft(text: str) -> ChatDraftChanged:
    return ChatDraftChanged(draft=user_message(text))


class Subscriber:
    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        pass

    def resync(self, channel: str) -> None:
        pass


async def test_the_core_keeps_the_idle_channels_used_last_and_every_served_one() -> None:
    core = ChannelCore(MemoryStore(), idle_check_interval=0)
    core.idle_channels = 2
    uris = [f"ahp-chat:/c{n}" for n in range(4)]
    for uri in uris:
        await core.create(
            uri, ChatState(resource=uri, title="", status=1, modified_at="", turns=[])
        )
    reader = Subscriber()

    def held() -> list[str]:
        return [uri for uri in uris if core.cached(uri) is not None]

    await core.subscribe(uris[0], reader)
    for uri in uris[1:]:
        await core.view(uri)
    assert held() == [uris[0], uris[2], uris[3]]  # c1, the oldest idle one, went
    await core.view(uris[2])
    core.unsubscribe(uris[0], reader)
    assert held() == [uris[0], uris[2]]  # c0 idle now, c3 the oldest
    await core.view(uris[1])  # loaded again; c2 the oldest idle one
    assert held() == [uris[0], uris[1]]


class CountingStore(MemoryStore):
    """The memory store, counting the appends tried (a conflict included)."""

    appends = 0

    async def append(
        self,
        channel: str,
        expected_seq: int,
        envelope: bytes,
        origin: ClientAction | None = None,
    ) -> None:
        self.appends += 1
        await super().append(channel, expected_seq, envelope, origin)


async def test_a_channel_nobody_here_watches_applies_what_it_heard_before_a_read_or_write() -> None:
    # Nobody subscribes to the chat in the second core (a worker holding the
    # chats it writes to): it applies the first core's appends a moment
    # later (UNSUBSCRIBED_FOLLOW), but a read or a write there sees them first,
    # and its hooks hear every one, in order.
    store = CountingStore()
    first = ChannelCore(store, idle_check_interval=0)
    second = ChannelCore(store, idle_check_interval=0)
    heard: list[int] = []
    all_heard = asyncio.Event()

    def hear(event: Applied) -> None:
        heard.append(event.envelope.server_seq)
        if len(heard) == 7:
            all_heard.set()

    second.hooks.reactions.append(hear)
    await first.start()
    await second.start()
    uri = "ahp-chat:/c"
    await first.create(uri, ChatState(resource=uri, title="", status=1, modified_at="", turns=[]))
    assert (await second.view(uri)).seq == 0
    written = await first.write(uri, draft("one"))
    assert (await second.view(uri)).seq == written.envelope.server_seq == 1
    for n in range(5):
        await first.write(uri, draft(f"more {n}"))
    store.appends = 0
    mine = await second.write(uri, draft("mine"))
    assert mine.envelope.server_seq == 7
    assert store.appends == 1  # no append refused for a seq heard already
    async with asyncio.timeout(5 * UNIT):
        await all_heard.wait()
    assert heard == list(range(1, 8))
    await first.stop()
    await second.stop()


def empty_chat(uri: str) -> ChatState:
    return ChatState(resource=uri, title="", status=1, modified_at="", turns=[])


async def two_cores(store: MemoryStore) -> tuple[ChannelCore, ChannelCore]:
    first = ChannelCore(store, idle_check_interval=0)
    second = ChannelCore(store, idle_check_interval=0)
    await first.start()
    await second.start()
    return first, second


async def test_a_channel_caught_up_later_still_counts_among_the_idle_ones() -> None:
    # An eviction passes over a channel that is catching up (for
    # UNSUBSCRIBED_FOLLOW): it stays among the idle ones, and goes at a later
    # touch; dropped from them, it stayed held and watched for good.
    first, second = await two_cores(MemoryStore())
    second.idle_channels = 2
    uris = [f"ahp-chat:/c{n}" for n in range(4)]
    for uri in uris:
        await first.create(uri, empty_chat(uri))
    applied = asyncio.Event()
    second.hooks.reactions.append(lambda event: applied.set() if event.uri == uris[0] else None)
    await second.view(uris[0])
    await second.view(uris[1])
    await first.write(uris[0], draft("heard, applied later"))
    await second.view(uris[2])  # evicts the oldest idle one, c0: passed over
    async with asyncio.timeout(5 * UNIT):
        await applied.wait()
    await second.view(uris[3])
    held = [uri for uri in uris if second.cached(uri) is not None]
    assert held == [uris[0], uris[3]]
    await first.stop()
    await second.stop()


class Frames(Subscriber):
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.arrived = asyncio.Event()

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        assert isinstance(frame, ActionFrame)
        self.seqs.append(frame.seq)
        self.arrived.set()


async def test_a_subscriber_or_a_resume_starts_from_what_was_heard() -> None:
    # What the second core heard and has not applied yet is applied before a
    # client subscribes or resumes there: no snapshot older than what the
    # client saw elsewhere, no gap and no envelope twice after it.
    first, second = await two_cores(MemoryStore())
    uri = "ahp-chat:/c"
    await first.create(uri, empty_chat(uri))
    await second.view(uri)
    seen = (await first.write(uri, draft("seen on the first"))).envelope.server_seq
    resumed = await second.resume(uri, seen, Frames())
    assert isinstance(resumed, ReplayResume)
    assert resumed.actions == []
    await first.write(uri, draft("two"))
    frames = Frames()
    snapshot = await second.subscribe(uri, frames)
    assert snapshot.from_seq == 2
    await first.write(uri, draft("three"))
    async with asyncio.timeout(5 * UNIT):
        await frames.arrived.wait()
    assert frames.seqs == [3]
    await first.stop()
    await second.stop()


async def test_a_server_subscribes_to_what_its_clients_watch_and_no_other(
    deployment: Deployment,
) -> None:
    async with servers(deployment, 2) as (a, b):
        heard = Heard()
        a.server.parts.host.store.add_listener(heard)
        x = await new_chat(a, "ahp-session:/x")
        y = await new_chat(b, "ahp-session:/y")
        alice, bob = await a.client("agent"), await b.client("agent")
        alice_x, bob_y = await alice.subscribe(x), await bob.subscribe(y)
        for n in range(20):
            await bob.dispatch(y, draft(f"y {n}"))
        await bob.dispatch_and_wait(x, draft("bob writes to x through b"))
        async with asyncio.timeout(5 * UNIT):
            await alice_x.wait_for(lambda s: isinstance(s, ChatState) and s.draft is not None)
        assert bob_y.seq == 20
        # b holds x now (it wrote to it), so both hear x; only b hears y.
        assert await deployment.subscribers(x) == 2
        assert await deployment.subscribers(y) == 1
        assert a.server.parts.host.core.cached(y) is None
        heard_on_a = {channel for channel, _, _ in heard.appends}
        assert x in heard_on_a
        assert not heard_on_a & {y, "ahp-session:/y"}


async def test_subscriptions_follow_clients_as_they_come_and_go(deployment: Deployment) -> None:
    async with servers(deployment, 2) as (a, b):
        a.server.parts.host.core.idle_channels = 0  # evict a channel once unserved
        chat = await new_chat(b, "ahp-session:/coming-and-going")

        async def watchers(count: int) -> bool:
            return await deployment.subscribers(chat) == count

        assert await watchers(0)  # created, but served nowhere
        alice, bob = await a.client(), await a.client()
        await alice.subscribe(chat)
        assert await watchers(1)  # a, from its first subscriber on
        await bob.subscribe(chat)
        assert await watchers(1)  # one subscription per server
        await alice.unsubscribe(chat)
        await bob.close()
        await eventually(lambda: watchers(0))  # the last one left: a let go
        assert a.server.parts.host.core.cached(chat) is None

        await comes_back(deployment, a, b, chat)
        assert await watchers(2)  # b holds it too now: it wrote to it


async def comes_back(deployment: Deployment, a: RunningServer, b: RunningServer, chat: str) -> None:
    """A client of ``a`` subscribes to ``chat`` again: ``a`` hears it again,
    and the client sees what a client of ``b`` writes to it."""
    carol = await a.client()
    carol_chat = await carol.subscribe(chat)
    assert await deployment_has(deployment, chat, 1)
    writer = await b.client()
    await writer.dispatch_and_wait(chat, draft("heard again"))
    async with asyncio.timeout(5 * UNIT):
        await carol_chat.wait_for(lambda s: isinstance(s, ChatState) and s.draft is not None)


async def test_a_server_stops_hearing_a_chat_soon_after_its_last_subscriber_left(
    deployment: Deployment,
) -> None:
    async with servers(deployment, 2) as (a, b):
        core = a.server.parts.host.core
        core.idle_keep = 0.1 * UNIT  # the LRU bound (idle_channels) as it is by default
        chat = await new_chat(b, "ahp-session:/left")
        alice = await a.client()
        await alice.subscribe(chat)
        assert await deployment_has(deployment, chat, 1)
        await alice.close()
        # a hears its pub/sub traffic no more
        await eventually(lambda: deployment_has(deployment, chat, 0))
        assert core.cached(chat) is None
        await comes_back(deployment, a, b, chat)


async def test_a_chat_a_turn_waits_on_is_heard_until_the_wait_ends(
    deployment: Deployment,
) -> None:
    async with servers(deployment, 2) as (a, b):
        core = a.server.parts.host.core
        core.idle_keep = 0.1 * UNIT
        waited_on = await new_chat(b, "ahp-session:/waited-on")
        left = await new_chat(b, "ahp-session:/left-later")
        await core.pin(waited_on)  # as a runner turn waiting for people here pins it
        alice = await a.client()
        await alice.subscribe(waited_on)
        await alice.subscribe(left)
        await alice.unsubscribe(waited_on)
        await alice.unsubscribe(left)
        # The chat left later is let go; the pinned one, left first, is not.
        await eventually(lambda: deployment_has(deployment, left, 0))
        assert await deployment.subscribers(waited_on) == 1
        core.unpin(waited_on)
        await eventually(lambda: deployment_has(deployment, waited_on, 0))


async def deployment_has(deployment: Deployment, chat: str, count: int) -> bool:
    """Whether ``count`` connections hear ``chat``'s pub/sub traffic."""
    return await deployment.subscribers(chat) == count


async def append_unannounced(deployment: Deployment, b: RunningServer, chat: str) -> int:
    """Append the next envelope of ``chat`` as the store's script does, but
    announce it on a topic nobody hears (same slot): a lost pub/sub
    message. Returns its seq."""
    view = await b.server.parts.host.view(chat)
    made = step(view, draft("unannounced"), None, b.server.parts.host.now_ms())
    assert isinstance(made, Step)
    entry = encode_entry(b.server.parts.host.now_ms(), made.data)
    tag = "{" + chat + "}"
    keys = [f"huddle:{tag}:meta", f"huddle:{tag}:log"]
    result = await deployment.raw.eval(APPEND, 2, *keys, view.seq, entry, f"huddle:{tag}:nobody")
    assert int(result[0]) == 1
    return view.seq + 1


async def test_a_lost_message_is_caught_by_the_head_check(deployment: Deployment) -> None:
    settings = Settings(port=0, idle_check_interval=0.2 * UNIT)
    async with servers(deployment, 2, settings) as (a, b):
        chat = await new_chat(b, "ahp-session:/lost")
        alice = await a.client()
        mirror = await alice.subscribe(chat)
        seq = await append_unannounced(deployment, b, chat)
        async with asyncio.timeout(5 * UNIT):
            state = await mirror.wait_for(lambda _: mirror.seq == seq)
        assert isinstance(state, ChatState)
        assert state.draft is not None
        assert state.draft.text == "unannounced"


async def test_idle_channels_catch_up_when_pub_sub_comes_back(deployment: Deployment) -> None:
    """A channel held without subscribers is not compared every interval;
    a message lost while the link was down is caught when it is back."""
    async with servers(deployment, 2) as (a, b):
        chat = await new_chat(b, "ahp-session:/idle")
        host = a.server.parts.host
        before = (await host.view(chat)).seq  # held here, idle
        back = Reconnected()
        host.store.add_listener(back)
        seq = await append_unannounced(deployment, b, chat)
        await deployment.on_every_primary("CLIENT", "KILL", "TYPE", "pubsub")
        async with asyncio.timeout(10 * UNIT):
            await back.event.wait()

        async def caught_up() -> bool:
            view = host.core.cached(chat)
            return view is not None and view.seq == seq

        await eventually(caught_up)
        assert seq == before + 1


class Reconnected(Heard):
    def __init__(self) -> None:
        super().__init__()
        self.event = asyncio.Event()

    def store_reconnected(self) -> None:
        super().store_reconnected()
        self.event.set()
