"""Every store honours the ChannelStore contract: memory, Redis and Redis
Cluster alike."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from server.errors import AlreadyApplied, ChannelGone, SeqConflict
from server.store.base import ChannelStore, ClientAction, Listener
from server.store.memory import MemoryStore
from server.store.redis import RedisStore
from tests.conftest import UNIT
from tests.redis_server import running_redis, shared_cluster

CHAT = "ahp-chat:/contract"


class Heard(Listener):
    def __init__(self) -> None:
        self.appends: list[tuple[str, int, bytes]] = []
        self.notices: list[tuple[str, bytes]] = []
        self.changed = asyncio.Event()
        self.reconnected = 0

    def envelope_appended(self, channel: str, seq: int, envelope: bytes) -> None:
        self.appends.append((channel, seq, envelope))
        self.changed.set()

    def notice(self, topic: str, payload: bytes) -> None:
        self.notices.append((topic, payload))
        self.changed.set()

    def store_reconnected(self) -> None:
        self.reconnected += 1

    async def until(self, count: int) -> None:
        async with asyncio.timeout(2 * UNIT):
            while len(self.appends) + len(self.notices) < count:
                self.changed.clear()
                await self.changed.wait()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[ChannelStore]:
    async with contextlib.AsyncExitStack() as stack:
        made: ChannelStore
        if request.param == "memory":
            made = MemoryStore(retention=3)
        elif request.param == "redis":
            server = await stack.enter_async_context(running_redis(10 * UNIT))
            made = RedisStore(server.url, retention=3)
        else:
            cluster = shared_cluster(10 * UNIT)
            cluster.flush()
            made = RedisStore(cluster.url(), retention=3)
        try:
            yield made
        finally:
            await made.close()


async def test_a_new_channel_loads_at_seq_zero(store: ChannelStore) -> None:
    assert await store.create(CHAT, b'{"s":0}')
    loaded = await store.load(CHAT)
    assert (loaded.seq, loaded.snapshot, loaded.log) == (0, b'{"s":0}', [])


async def test_creating_an_existing_channel_says_no(store: ChannelStore) -> None:
    assert await store.create(CHAT, b"{}")
    assert not await store.create(CHAT, b"{}")


async def test_append_is_a_compare_and_set_on_the_seq(store: ChannelStore) -> None:
    await store.create(CHAT, b"{}")
    await store.append(CHAT, 0, b"one")
    with pytest.raises(SeqConflict) as conflict:
        await store.append(CHAT, 0, b"late")
    assert conflict.value.current == 1
    await store.append(CHAT, 1, b"two")
    assert (await store.load(CHAT)).log == [b"one", b"two"]


async def test_concurrent_appends_on_many_channels_all_land(store: ChannelStore) -> None:
    channels = [f"ahp-chat:/c{n}" for n in range(20)]
    for channel in channels:
        await store.create(channel, b"{}")

    async def write(channel: str) -> None:
        for seq in range(10):
            await store.append(channel, seq, f"{channel}:{seq}".encode())

    await asyncio.gather(*(write(c) for c in channels))
    heads = await store.heads(channels)
    assert {seq for _, seq in heads.values()} == {10}


async def test_read_log_returns_the_gap_or_none_when_it_is_gone(store: ChannelStore) -> None:
    await store.create(CHAT, b"{}")
    for seq in range(8):
        await store.append(CHAT, seq, f"e{seq + 1}".encode())
    epoch = (await store.load(CHAT)).epoch
    assert await store.read_log(CHAT, 6, epoch) == [b"e7", b"e8"]
    assert await store.read_log(CHAT, 8, epoch) == []
    assert await store.read_log(CHAT, 9, epoch) is None
    assert await store.read_log(CHAT, 6, "another-epoch") is None
    await store.save_snapshot(CHAT, 7, b'{"at":7}')
    # Retention 3 and a snapshot at 7: 5 and before are trimmed.
    assert await store.read_log(CHAT, 2, epoch) is None
    assert await store.read_log(CHAT, 5, epoch) == [b"e6", b"e7", b"e8"]
    loaded = await store.load(CHAT)
    assert (loaded.snapshot_seq, loaded.snapshot, loaded.log) == (7, b'{"at":7}', [b"e8"])


async def test_a_snapshot_never_goes_back_nor_ahead(store: ChannelStore) -> None:
    await store.create(CHAT, b"{}")
    for seq in range(4):
        await store.append(CHAT, seq, b"e")
    await store.save_snapshot(CHAT, 3, b"three")
    await store.save_snapshot(CHAT, 2, b"two")
    await store.save_snapshot(CHAT, 9, b"nine")
    loaded = await store.load(CHAT)
    assert (loaded.snapshot_seq, loaded.snapshot) == (3, b"three")


async def test_a_missing_channel_is_gone(store: ChannelStore) -> None:
    with pytest.raises(ChannelGone):
        await store.load(CHAT)
    with pytest.raises(ChannelGone):
        await store.append(CHAT, 0, b"x")
    with pytest.raises(ChannelGone):
        await store.read_log(CHAT, 0, "e")
    assert await store.heads([CHAT]) == {}


async def test_delete_removes_the_channel(store: ChannelStore) -> None:
    await store.create(CHAT, b"{}")
    await store.delete(CHAT)
    with pytest.raises(ChannelGone):
        await store.load(CHAT)


async def test_a_bucket_gives_at_most_what_it_holds_and_refills_on_the_callers_clock(
    store: ChannelStore,
) -> None:
    first = await store.draw("token-a", 2.0, 10, 4, 1000.0)
    second = await store.draw("token-a", 2.0, 10, 8, 1000.0)
    empty = await store.draw("token-a", 2.0, 10, 1, 1000.0)
    behind = await store.draw("token-a", 2.0, 10, 1, 999.0)  # another process's clock, behind
    refilled = await store.draw("token-a", 2.0, 10, 5, 1001.5)
    other = await store.draw("token-b", 2.0, 10, 10, 1000.0)

    assert (first, second, empty, behind) == (4, 6, 0, 0)
    assert refilled == pytest.approx(3.0)
    assert other == 10


async def test_a_tally_adds_up_to_its_bound_and_takes_back_what_is_given(
    store: ChannelStore,
) -> None:
    assert await store.tally("t", 60, 100, 60) == 0
    assert 0 < await store.tally("t", 50, 100, 60) <= 60  # over 100: refused, and until when
    assert await store.tally("t", -30, 0, 60) == 0  # given back
    assert await store.tally("t", 70, 100, 60) == 0  # 30 + 70
    assert await store.tally("other", 100, 100, 60) == 0  # a count of its own


async def test_records_are_set_read_listed_and_deleted(store: ChannelStore) -> None:
    await store.put_record("session", "a", b"1")
    await store.put_record("session", "b", b"2")
    assert await store.get_record("session", "a") == b"1"
    assert await store.records("session") == {"a": b"1", "b": b"2"}
    assert await store.count_records("session") == 2
    await store.delete_record("session", "a")
    assert await store.get_record("session", "a") is None
    assert await store.count_records("session") == 1
    assert await store.records("other") == {}
    assert await store.count_records("other") == 0


async def test_a_record_kept_once_holds_the_first_value_whoever_comes_after(
    store: ChannelStore,
) -> None:
    first, second = await asyncio.gather(
        store.keep_record("key", "k", b"one"), store.keep_record("key", "k", b"two")
    )
    again = await store.keep_record("key", "k", b"three")

    assert first == second == again == await store.get_record("key", "k")
    assert again in (b"one", b"two")


async def test_another_action_under_a_name_the_channel_took_is_told_apart(
    store: ChannelStore,
) -> None:
    await store.create("ahp-chat:/reused", b"{}")
    await store.append("ahp-chat:/reused", 0, b"first", ClientAction("browser-1 7", "d7"))
    other = ClientAction("browser-1 7", "another")

    with pytest.raises(AlreadyApplied) as reused:
        await store.append("ahp-chat:/reused", 1, b"second", other)
    seen = await store.applied("ahp-chat:/reused", other)

    assert (reused.value.seq, reused.value.same_action) == (1, False)
    assert seen is not None
    assert (seen.seq, seen.same_action) == (1, False)
    assert (await store.load("ahp-chat:/reused")).log == [b"first"]


async def test_a_clients_action_is_appended_once_however_often_it_comes(
    store: ChannelStore,
) -> None:
    seventh, eighth = ClientAction("browser-1 7", "d7"), ClientAction("browser-1 8", "d8")
    await store.create("ahp-chat:/once", b"{}")
    await store.append("ahp-chat:/once", 0, b"first", seventh)
    await store.append("ahp-chat:/once", 1, b"other", eighth)

    with pytest.raises(AlreadyApplied) as again:
        await store.append("ahp-chat:/once", 2, b"first", seventh)
    with pytest.raises(AlreadyApplied) as stale:
        await store.append("ahp-chat:/once", 0, b"first", seventh)  # even behind

    assert again.value.seq == stale.value.seq == 1
    assert again.value.same_action
    assert stale.value.same_action
    seen = await store.applied("ahp-chat:/once", eighth)
    assert seen is not None
    assert (seen.seq, seen.same_action) == (2, True)
    assert await store.applied("ahp-chat:/once", ClientAction("browser-1 9", "d9")) is None
    stored = await store.load("ahp-chat:/once")
    assert stored.log == [b"first", b"other"]
    await store.append("ahp-chat:/once", 2, b"server", None)  # the server's own: no name


async def test_what_is_remembered_lasts_its_time(store: ChannelStore) -> None:
    await store.remember("answer:a", b"kept", 60)
    await store.remember("answer:b", b"brief", 0.05)
    await store.remember("answer:binary", bytes(range(256)), 60)  # any bytes, not only text
    assert await store.recall("answer:a") == b"kept"
    assert await store.recall("answer:binary") == bytes(range(256))
    assert await store.recall("answer:missing") is None
    await asyncio.sleep(0.2)  # the time it takes to lapse
    assert await store.recall("answer:b") is None


async def test_a_claim_is_held_by_one_owner_until_it_expires(store: ChannelStore) -> None:
    assert await store.claim("client:web-1", "token-a", 60) is None
    assert await store.claim("client:web-1", "token-a", 60) is None  # renewed
    assert await store.claim("client:web-1", "token-b", 60) == "token-a"
    assert await store.claim("client:web-2", "token-b", 0.05) is None
    await asyncio.sleep(0.2)  # the time it takes a claim to lapse
    assert await store.claim("client:web-2", "token-a", 60) is None
    assert await store.claim("client:web-2", "token-b", 0) == "token-a"  # not b's to give up
    assert await store.claim("client:web-2", "token-a", 0) is None  # given up
    assert await store.claim("client:web-2", "token-b", 60) is None


async def test_a_claim_on_the_callers_clock_lapses_when_that_clock_passes_its_end(
    store: ChannelStore,
) -> None:
    now = 1_800_000_000.0
    assert await store.claim("client:agent", "token-a", 60, now) is None
    assert await store.claimant("client:agent", now + 59) == "token-a"
    assert await store.claim("client:agent", "token-b", 60, now + 59) == "token-a"
    assert await store.claim("client:agent", "token-a", 60, now + 59) is None  # renewed
    assert await store.claim("client:agent", "token-b", 60, now + 118) == "token-a"

    assert await store.claimant("client:agent", now + 120) is None
    assert await store.claim("client:agent", "token-b", 60, now + 120) is None
    assert await store.claimant("client:agent", now + 120) == "token-b"
    assert await store.claimant("client:nobody", now) is None


async def test_listeners_hear_appends_and_notices(store: ChannelStore) -> None:
    heard = Heard()
    remove = store.add_listener(heard)
    await store.watch(CHAT)
    await store.watch("ahp-root://")
    await store.create(CHAT, b"{}")
    await store.append(CHAT, 0, b"entry")
    await store.publish("ahp-root://", b"notice")
    await heard.until(2)
    assert heard.appends == [(CHAT, 1, b"entry")]
    assert heard.notices == [("ahp-root://", b"notice")]
    remove()


async def test_restore_puts_back_what_the_store_lost_under_a_new_epoch(
    store: ChannelStore,
) -> None:
    await store.create(CHAT, b"{}")
    for seq in range(3):
        await store.append(CHAT, seq, b"e")
    before = (await store.load(CHAT)).epoch
    assert await store.restore(CHAT, 3, b"held") is None  # nothing was lost
    epoch = await store.restore(CHAT, 5, b"held at 5")
    assert epoch is not None
    assert epoch != before
    loaded = await store.load(CHAT)
    assert (loaded.epoch, loaded.seq, loaded.snapshot, loaded.log) == (epoch, 5, b"held at 5", [])
    assert await store.read_log(CHAT, 3, before) is None
    await store.append(CHAT, 5, b"next")
    assert (await store.load(CHAT)).log == [b"next"]


async def test_an_audit_is_appended_in_order_and_read_in_pages(store: ChannelStore) -> None:
    session = "ahp-session:/audit"
    assert await store.last_audit(session) is None
    await store.append_audit(session, 1, b"one")
    with pytest.raises(SeqConflict) as ahead:
        await store.append_audit(session, 3, b"three")
    with pytest.raises(SeqConflict):
        await store.append_audit(session, 1, b"again")
    await store.append_audit(session, 2, b"two")
    await store.append_audit(session, 3, b"three")

    assert ahead.value.current == 1
    assert await store.read_audit(session, 0, 2) == [b"one", b"two"]
    assert await store.read_audit(session, 2, 10) == [b"three"]
    assert await store.read_audit(session, 3, 10) == []
    assert await store.last_audit(session) == b"three"
    await store.delete_audit(session)
    assert await store.read_audit(session, 0, 10) == []
    assert await store.last_audit(session) is None


async def test_an_audits_charges_stay_within_the_share_and_the_room_and_go_with_it(
    store: ChannelStore,
) -> None:
    session = "ahp-session:/charged"
    await store.append_audit(session, 1, b"one")
    assert await store.charge_audit(session, "t-1", 2, 4, 4) == "charged"
    assert await store.charge_audit(session, "t-1", 2, 4, 2) == "full"  # 1 held and 2 more
    assert await store.charge_audit(session, "t-1", 2, 4, 4) == "charged"
    assert await store.charge_audit(session, "t-1", 2, 4, 4) == "share"
    assert await store.charge_audit(session, "t-2", 2, 4, 4) == "charged"  # each their own
    assert await store.charge_audit(session, "t-1", -2, 4, 4) == "charged"  # given back
    assert await store.charge_audit(session, "t-1", 2, 4, 4) == "charged"
    await store.delete_audit(session)
    assert await store.charge_audit(session, "t-1", 4, 4, 4) == "charged"  # counted anew
