"""A resume that rides on the answer's append: one script on Redis appends a
person's answer to the chat and, once it landed, saves the turn it resumes
(server.store.base.Rider, server.runner.resuming.ChatResuming.rider_for).

First the store's part, with riders of the test's own: a rider runs only
when its entry landed, a rider that fails leaves the entry appended, a
rider whose answer is lost is known to be unknown, and only a single Redis
that both stores are on carries one. Then the server's, a real Huddle
server on a real redis-server with a participant on a real WebSocket: the
answer resumes the turn with no save of its own, and a copy read ahead
that went stale, or a cancel asked meanwhile, is decided again on the turn
as it is, the tool run once or not at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import pytest
from redis.crc import key_slot

from server.client import HuddleClient, Mirror
from server.errors import AlreadyApplied, SeqConflict, StoreUnavailable
from server.runner.agent import Agent
from server.runner.events import EventType, RunnerEvent
from server.runner.ids import runner_turn_id
from server.runner.redis_turn_store import RedisTurnStore
from server.runner.service import AgentService
from server.runner.turn import Turn, TurnStatus
from server.runner.worker import Worker
from server.store.base import ClientAction, Rider
from server.store.memory import MemoryStore
from server.store.redis import RedisStore
from tests.conftest import UNIT, RunningServer, start_server
from tests.redis_server import RedisServer, shared_cluster
from tests.runner_kit import Runs
from tests.test_runner_chat_faults import ended, open_chat, pending, until
from tests.test_runner_chat_resume import answer, asking_a_form, asking_approval, read_ahead
from tests.test_turn_store_contract import HANDED

WITHIN = 10 * UNIT
CHANNEL = "ahp-chat:/riding"

# KEYS: a counter.  Counts the rider's runs.
COUNT = "return redis.call('INCR', KEYS[1])"
# KEYS: a key.  ARGV: seconds.  Holds Redis for that long, then sets the key.
HOLD = """
local t = redis.call('TIME')
local until_us = (tonumber(t[1]) + tonumber(ARGV[1])) * 1000000 + tonumber(t[2])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) * 1000000 + tonumber(t[2]) >= until_us
redis.call('SET', KEYS[1], 'held')
return 1
"""


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_server.url)
    assert await store.create(CHANNEL, b"{}")
    try:
        yield store
    finally:
        await store.close()


def counting(url: str) -> Rider:
    return Rider(COUNT, ["riding:runs"], [], url)


async def runs_of(store: RedisStore) -> int:
    return int(await store.client.get("riding:runs") or 0)


async def test_a_rider_runs_in_the_append_once_its_entry_landed(store: RedisStore) -> None:
    rider = counting(store.url)
    await store.append_riding(CHANNEL, 0, b"first", None, rider)
    assert (rider.ran, rider.reply, rider.unknown) == (True, 1, False)
    assert (await store.load(CHANNEL)).log == [b"first"]
    assert await runs_of(store) == 1


async def test_a_rider_of_an_append_that_does_not_land_does_not_run(store: RedisStore) -> None:
    rider = counting(store.url)
    with pytest.raises(SeqConflict):
        await store.append_riding(CHANNEL, 5, b"late", None, rider)
    assert not rider.ran
    alice = ClientAction("alice 1", "d1")
    await store.append_riding(CHANNEL, 0, b"once", alice, counting(store.url))
    again = counting(store.url)
    with pytest.raises(AlreadyApplied):
        await store.append_riding(CHANNEL, 1, b"once", alice, again)
    assert not again.ran
    assert (await store.load(CHANNEL)).log == [b"once"]
    assert await runs_of(store) == 1


async def test_a_rider_that_fails_leaves_its_entry_appended(store: RedisStore) -> None:
    await store.client.set("riding:runs", "not a number")
    rider = counting(store.url)
    await store.append_riding(CHANNEL, 0, b"kept", None, rider)
    assert not rider.ran
    assert not rider.unknown
    assert "not an integer" in rider.reply.decode()
    assert (await store.load(CHANNEL)).log == [b"kept"]


async def test_a_rider_that_returns_nothing_ran(store: RedisStore) -> None:
    rider = Rider("redis.call('SET', KEYS[1], 'x')", ["riding:set"], [], store.url)
    await store.append_riding(CHANNEL, 0, b"first", None, rider)
    assert rider.ran
    assert rider.reply is None
    assert await store.client.get("riding:set") == b"x"


async def test_a_rider_that_returns_an_error_failed(store: RedisStore) -> None:
    rider = Rider("return redis.error_reply('no such thing')", [], [], store.url)
    await store.append_riding(CHANNEL, 0, b"kept", None, rider)
    assert not rider.ran
    assert rider.reply == b"no such thing"
    assert (await store.load(CHANNEL)).log == [b"kept"]


async def test_a_rider_whose_answer_is_lost_is_unknown(redis_server: RedisServer) -> None:
    impatient = RedisStore(redis_server.url, timeout=0.2)
    try:
        assert await impatient.create(CHANNEL, b"{}")
        rider = Rider(HOLD, ["riding:held"], [1], impatient.url)
        with pytest.raises(StoreUnavailable):
            await impatient.append_riding(CHANNEL, 0, b"slow", None, rider)
        assert rider.unknown
        assert not rider.ran
    finally:
        await impatient.close()
    patient = RedisStore(redis_server.url)
    try:
        # It landed all the same: the entry and the rider, in one script.
        assert (await patient.load(CHANNEL)).log == [b"slow"]
        assert await patient.client.get("riding:held") == b"held"
    finally:
        await patient.close()


async def test_only_the_redis_that_both_stores_are_on_carries_a_rider(
    store: RedisStore,
) -> None:
    assert store.carries(store.url)
    assert store.carries(store.url, CHANNEL, ["riding:runs"])
    assert not store.carries(store.url + "?db=1")
    assert not MemoryStore().carries(store.url)


def chat_in_slot_of(key: str) -> str:
    """A chat whose channel keys are in ``key``'s cluster slot."""
    slot = key_slot(key.encode())
    return next(
        f"ahp-chat:/beside-{n}"
        for n in itertools.count()
        if key_slot(f"ahp-chat:/beside-{n}".encode()) == slot
    )


@pytest.mark.redis
async def test_on_a_cluster_a_resume_rides_when_its_keys_share_the_chats_slot() -> None:
    cluster = shared_cluster(10 * UNIT)
    cluster.flush()
    chats, turns = RedisStore(cluster.url()), RedisTurnStore(cluster.url())
    try:
        desk_turn = HANDED  # in the desk: its resume is one script in one slot
        turn = await turns.create(Turn(id=desk_turn, agent="echo"))
        rider = turns.runnable_rider(turn, 1.0)
        assert rider is not None
        beside, elsewhere = chat_in_slot_of(rider.keys[0]), "ahp-chat:/elsewhere"
        assert chats.carries(rider.store)  # it may carry some
        assert chats.carries(rider.store, beside, rider.keys)
        assert not chats.carries(rider.store, elsewhere, rider.keys)
        assert await chats.create(beside, b"{}")
        await chats.append_riding(beside, 0, b"the answer", None, rider)
        assert rider.ran
        saved = turns.rider_saved(rider, turn)
        assert saved == await turns.load(desk_turn)
        assert saved.version == 2
        claim = await turns.claim_turn("worker-a", 1.0, 10.0)
        assert claim is not None
        assert claim.turn == saved
        # A turn of another group has no rider: its wake-up is another write.
        other = await turns.create(Turn(id="t1", agent="echo"))
        assert turns.runnable_rider(other, 1.0) is None
    finally:
        await chats.close()
        await turns.close()


# ─── The server's resumes ────────────────────────────────────────────────────


class Watched(RedisTurnStore):
    """A real Redis turn store that counts loads and resumes saved on their
    own (not riding on an append)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.loads = 0
        self.loaded = asyncio.Event()
        self.created = asyncio.Event()
        self.saved_alone = 0

    async def create(self, turn: Turn) -> Turn:
        created = await super().create(turn)
        self.created.set()
        return created

    async def load(self, turn_id: str) -> Turn:
        self.loads += 1
        turn = await super().load(turn_id)
        self.loaded.set()
        return turn

    async def save_runnable(self, turn: Turn, now: float, *, started: Turn | None = None) -> Turn:
        self.saved_alone += 1
        return await super().save_runnable(turn, now, started=started)


class Served:
    """A server on ``redis_server`` (chats and turns) whose turns the test
    steps, and what its runner told."""

    def __init__(self, huddle: RunningServer, service: AgentService, turns: Watched) -> None:
        self.huddle, self.service, self.turns = huddle, service, turns
        self.heard: list[RunnerEvent] = []
        self._news = asyncio.Event()
        service.runner.listeners.append(self._hear)

    def _hear(self, event: RunnerEvent) -> None:
        self.heard.append(event)
        self._news.set()

    def told(self, kind: EventType) -> list[RunnerEvent]:
        return [event for event in self.heard if event.type == kind]

    async def hear(self, kind: EventType) -> RunnerEvent:
        """The first event of ``kind``, once it is told."""
        async with asyncio.timeout(WITHIN):
            while not self.told(kind):
                self._news.clear()
                await self._news.wait()
        return self.told(kind)[0]


@dataclass
class Asked:
    """A server's turn waiting on its question, read ahead by its bridge."""

    served: Served
    runs: Runs
    alice: HuddleClient
    chat: str
    mirror: Mirror
    turn_id: str


@contextlib.asynccontextmanager
async def asked(redis_server: RedisServer, make: Callable[[Runs], Agent]) -> AsyncIterator[Asked]:
    """A server on ``redis_server`` (chats and turns) running the agent
    ``make`` builds up to its question in Alice's chat."""
    runs, turns = Runs(), Watched(redis_server.url)
    huddle = await start_server(
        store=RedisStore(redis_server.url), agent=make(runs), turn_store=turns, workers=0
    )
    try:
        service = huddle.server.parts.service
        assert service is not None
        served = Served(huddle, service, turns)
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        async with asyncio.timeout(WITHIN):
            await turns.created.wait()
        assert await Worker(service.runner).step()  # up to the question
        await until(mirror, lambda s: pending(s) is not None or s.active_turn is not None)
        turn_id = runner_turn_id(chat, "t1")
        await read_ahead(service, turn_id)
        yield Asked(served, runs, alice, chat, mirror, turn_id)
    finally:
        await huddle.stop()
        await turns.close()


@pytest.mark.parametrize("make", [asking_approval, asking_a_form], ids=["approval", "form"])
async def test_a_persons_answer_saves_the_resume_in_its_own_append(
    redis_server: RedisServer, make: Callable[[Runs], Agent]
) -> None:
    async with asked(redis_server, make) as at:
        served = at.served
        loads = served.turns.loads
        await answer(at.alice, at.chat, at.mirror)
        event = await served.hear(EventType.TURN_RESUMED)
        assert served.turns.saved_alone == 0  # it rode on the answer's append
        assert served.turns.loads == loads  # and read nothing
        assert event.data["resume"].metadata["by"] == "alice"  # the server's word
        assert (await served.turns.load(at.turn_id)).status == TurnStatus.READY
        assert await Worker(served.service.runner).step()
        await until(at.mirror, ended)
        assert at.runs.count("deploy") == 1


async def test_a_resume_that_rode_on_a_stale_copy_is_decided_again(
    redis_server: RedisServer,
) -> None:
    async with asked(redis_server, asking_approval) as at:
        served = at.served
        # The turn changes after the bridge read it (a save elsewhere).
        await served.turns.save(await served.turns.load(at.turn_id))
        await answer(at.alice, at.chat, at.mirror)
        await served.hear(EventType.TURN_RESUMED)
        assert served.turns.saved_alone == 1  # the rider's save failed: saved again, fresh
        assert await Worker(served.service.runner).step()
        await until(at.mirror, ended)
        assert at.runs.count("deploy") == 1
        assert len(served.told(EventType.TURN_RESUMED)) == 1


async def test_a_cancel_asked_after_the_read_ahead_wins_over_a_riding_resume(
    redis_server: RedisServer,
) -> None:
    async with asked(redis_server, asking_approval) as at:
        served = at.served
        await served.service.runner.cancel(at.turn_id)  # the copy read ahead says no cancel
        served.turns.loaded.clear()
        await answer(at.alice, at.chat, at.mirror)
        async with asyncio.timeout(WITHIN):
            await served.turns.loaded.wait()  # the rider's save failed: decided again, fresh
        assert await Worker(served.service.runner).step()
        assert (await served.turns.load(at.turn_id)).status == TurnStatus.CANCELLED
        assert served.told(EventType.TURN_RESUMED) == []
        assert at.runs.count("deploy") == 0
