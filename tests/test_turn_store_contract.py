"""Every turn store honours the TurnStore contract: memory, Redis and Redis
Cluster alike.

Times are the callers' own (``now`` is a plain number here): a store keeps
no clock, so a lease "expires" when a claim says it is later than its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from server.errors import StoreError, StoreUnavailable
from server.runner.events import EventType
from server.runner.redis_turn_store import CLUSTER_GROUPS, RedisTurnStore, group_index
from server.runner.runner import Runner
from server.runner.turn import ModelMessage, Turn, TurnStatus
from server.runner.turn_store import (
    Claim,
    Fenced,
    MemoryTurnStore,
    TurnNotFound,
    TurnStore,
    VersionConflict,
    Waiter,
)
from server.runner.worker import Worker
from tests.conftest import UNIT
from tests.redis_server import RedisServer, running_redis, shared_cluster
from tests.runner_kit import Clock, agent, say, scripted
from tests.runner_kit import started as start

LEASE = 10.0


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=pytest.mark.redis),
    ]
)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[TurnStore]:
    if request.param == "memory":
        yield MemoryTurnStore()
        return
    async with redis_turn_store(request.param) as made:
        yield made


@contextlib.asynccontextmanager
async def redis_turn_store(kind: str) -> AsyncIterator[RedisTurnStore]:
    """A Redis turn store on a Redis of its own (``redis``) or on the
    shared cluster, emptied first (``cluster``)."""
    async with contextlib.AsyncExitStack() as stack:
        if kind == "redis":
            server = await stack.enter_async_context(running_redis(10 * UNIT))
            made = RedisTurnStore(server.url)
        else:
            cluster = shared_cluster(10 * UNIT)
            cluster.flush()
            made = RedisTurnStore(cluster.url())
        try:
            yield made
        finally:
            await made.close()


async def create(store: TurnStore, turn_id: str = "t1") -> Turn:
    return await store.create(Turn(id=turn_id, agent="echo"))


def said(turn: Turn, text: str) -> Turn:
    return msgspec.structs.replace(
        turn, messages=(*turn.messages, ModelMessage(role="user", content=text))
    )


# ─── Create, load, save ──────────────────────────────────────────────────────


async def test_a_created_turn_loads_back_at_version_one(store: TurnStore) -> None:
    created = await store.create(said(Turn(id="t1", agent="echo", chat="ahp-chat:/c"), "hi"))
    assert created.version == 1
    loaded = await store.load("t1")
    assert loaded == created
    assert loaded is not created


async def test_creating_an_existing_turn_fails(store: TurnStore) -> None:
    await create(store)
    with pytest.raises(StoreError):
        await store.create(Turn(id="t1", agent="other"))
    assert (await store.load("t1")).agent == "echo"


UNKNOWN_TURN_CALLS: list[tuple[str, Callable[[TurnStore], Awaitable[object]]]] = [
    ("load", lambda store: store.load("nope")),
    ("save", lambda store: store.save(Turn(id="nope", agent="echo", version=1))),
    ("save_runnable", lambda store: store.save_runnable(Turn(id="nope", agent="echo"), 0.0)),
    ("request_cancel", lambda store: store.request_cancel("nope")),
    ("cancel_requested", lambda store: store.cancel_requested("nope")),
    ("make_runnable", lambda store: store.make_runnable("nope", 0.0)),
]


@pytest.mark.parametrize(
    "call", [call for _, call in UNKNOWN_TURN_CALLS], ids=[name for name, _ in UNKNOWN_TURN_CALLS]
)
async def test_an_unknown_turn_raises_turn_not_found(
    store: TurnStore, call: Callable[[TurnStore], Awaitable[object]]
) -> None:
    with pytest.raises(TurnNotFound):
        await call(store)


async def test_a_save_returns_the_turn_at_the_next_version(store: TurnStore) -> None:
    turn = await create(store)
    saved = await store.save(said(turn, "one"))
    assert saved.version == 2
    assert await store.load("t1") == saved
    assert [m.content for m in saved.messages] == ["one"]


async def test_saving_a_stale_version_raises_version_conflict(store: TurnStore) -> None:
    stale = await create(store)
    await store.save(said(await store.load("t1"), "first"))
    with pytest.raises(VersionConflict) as conflict:
        await store.save(said(stale, "late"))
    assert (conflict.value.expected, conflict.value.current) == (1, 2)
    assert [m.content for m in (await store.load("t1")).messages] == ["first"]


async def test_two_concurrent_saves_of_one_version_let_exactly_one_win(store: TurnStore) -> None:
    await create(store)
    one, two = await store.load("t1"), await store.load("t1")
    results = await asyncio.gather(
        store.save(said(one, "one")), store.save(said(two, "two")), return_exceptions=True
    )
    saved = [r for r in results if isinstance(r, Turn)]
    conflicts = [r for r in results if isinstance(r, VersionConflict)]
    assert (len(saved), len(conflicts)) == (1, 1)
    assert await store.load("t1") == saved[0]


async def test_a_cancel_request_survives_a_later_save(store: TurnStore) -> None:
    loaded_before = await create(store)
    await store.request_cancel("t1")
    assert not loaded_before.cancel_requested
    saved = await store.save(said(loaded_before, "still working"))
    assert saved.cancel_requested
    assert (await store.load("t1")).cancel_requested


async def test_by_status_follows_saves(store: TurnStore) -> None:
    await create(store, "a")
    await create(store, "b")
    assert sorted(await store.by_status(TurnStatus.READY)) == ["a", "b"]
    turn = start(await store.load("a"))
    await store.save(turn)
    assert await store.by_status(TurnStatus.READY) == ["b"]
    assert await store.by_status(TurnStatus.RUNNING) == ["a"]
    assert await store.by_status(TurnStatus.COMPLETED) == []


# ─── Claims and leases ───────────────────────────────────────────────────────


async def test_a_claim_takes_the_earliest_due_turn_and_skips_those_not_yet_due(
    store: TurnStore,
) -> None:
    for turn_id, due_at in [("later", 5.0), ("sooner", 3.0), ("future", 50.0)]:
        await create(store, turn_id)
        await store.make_runnable(turn_id, due_at)
    taken = [await store.claim("w", 10.0, LEASE) for _ in range(3)]
    assert [lease.turn_id if lease else None for lease in taken] == ["sooner", "later", None]
    future = await store.claim("w", 50.0, LEASE)
    assert future is not None
    assert future.turn_id == "future"


async def test_a_claim_returns_a_lease_on_the_turn(store: TurnStore) -> None:
    await create(store)
    await store.make_runnable("t1", 0.0)
    lease = await store.claim("worker-a", 1.0, LEASE)
    assert lease is not None
    assert (lease.turn_id, lease.owner, lease.until) == ("t1", "worker-a", 1.0 + LEASE)
    assert await store.claim("worker-a", 1.0, LEASE) is None


async def test_a_given_turn_is_claimed_even_when_not_due_and_leaves_the_queue(
    store: TurnStore,
) -> None:
    await create(store)
    await store.make_runnable("t1", 100.0)
    lease = await store.claim("w", 0.0, LEASE, turn_id="t1")
    assert lease is not None
    await store.release(lease)
    assert await store.claim("w", 200.0, LEASE) is None


async def test_claiming_an_unknown_turn_gets_nothing(store: TurnStore) -> None:
    assert await store.claim("w", 0.0, LEASE, turn_id="nope") is None


@pytest.mark.parametrize("given", [False, True], ids=["next-due", "by-id"])
async def test_a_leased_turn_is_not_claimable_until_its_lease_expires(
    store: TurnStore, given: bool
) -> None:
    await create(store)
    await store.make_runnable("t1", 0.0)
    first = await store.claim("worker-a", 0.0, LEASE)
    assert first is not None
    await store.make_runnable("t1", 0.0)
    turn_id = "t1" if given else None
    assert await store.claim("worker-b", LEASE / 2, LEASE, turn_id) is None
    second = await store.claim("worker-b", LEASE + 1, LEASE, turn_id)
    assert second is not None
    assert second.turn_id == "t1"
    assert second.token != first.token


@pytest.mark.parametrize("given", [False, True], ids=["next-due", "by-id"])
async def test_two_concurrent_claims_of_one_turn_let_exactly_one_have_it(
    store: TurnStore, given: bool
) -> None:
    await create(store)
    await store.make_runnable("t1", 0.0)
    turn_id = "t1" if given else None
    leases = await asyncio.gather(
        store.claim("worker-a", 1.0, LEASE, turn_id), store.claim("worker-b", 1.0, LEASE, turn_id)
    )
    assert len([lease for lease in leases if lease is not None]) == 1


@pytest.mark.parametrize(
    "owner_b", ["worker-b", "worker-a"], ids=["another-worker", "same-worker-id-reused"]
)
async def test_a_worker_whose_lease_was_taken_over_is_fenced(
    store: TurnStore, owner_b: str
) -> None:
    await create(store)
    await store.make_runnable("t1", 0.0)
    lease_a = await store.claim("worker-a", 0.0, LEASE)
    assert lease_a is not None
    turn_a = await store.load("t1")
    # A stalls past its lease; B finds the expired lease and takes the turn.
    lease_b = await store.claim(owner_b, lease_a.until + 1, LEASE)
    assert lease_b is not None
    assert lease_b.turn_id == "t1"
    with pytest.raises(Fenced) as fenced:
        await store.save(said(turn_a, "from A"), lease=lease_a)
    assert fenced.value.token == lease_a.token
    saved = await store.save(said(await store.load("t1"), "from B"), lease=lease_b)
    assert [m.content for m in saved.messages] == ["from B"]


async def test_a_fenced_save_says_fenced_even_when_its_version_is_stale_too(
    store: TurnStore,
) -> None:
    await create(store)
    lease_a = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease_a is not None
    turn_a = await store.load("t1")
    lease_b = await store.claim("worker-a", lease_a.until + 1, LEASE, turn_id="t1")
    assert lease_b is not None
    await store.save(said(await store.load("t1"), "from B"), lease=lease_b)
    with pytest.raises(Fenced):
        await store.save(said(turn_a, "from A"), lease=lease_a)


async def test_renew_extends_only_the_current_lease(store: TurnStore) -> None:
    await create(store)
    lease_a = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease_a is not None
    renewed = await store.renew(lease_a, 5.0, LEASE)
    assert renewed is not None
    assert (renewed.token, renewed.until) == (lease_a.token, 5.0 + LEASE)
    assert await store.claim("worker-b", lease_a.until + 1, LEASE, turn_id="t1") is None
    lease_b = await store.claim("worker-b", renewed.until + 1, LEASE, turn_id="t1")
    assert lease_b is not None
    assert await store.renew(renewed, renewed.until + 2, LEASE) is None
    assert await store.renew(lease_b, renewed.until + 2, LEASE) is not None


async def test_release_with_a_stale_token_leaves_the_new_lease_alone(store: TurnStore) -> None:
    await create(store)
    lease_a = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease_a is not None
    lease_b = await store.claim("worker-a", lease_a.until + 1, LEASE, turn_id="t1")
    assert lease_b is not None
    await store.release(lease_a)
    assert await store.claim("worker-c", lease_b.until - 1, LEASE, turn_id="t1") is None
    await store.release(lease_b)
    lease_c = await store.claim("worker-c", lease_b.until - 1, LEASE, turn_id="t1")
    assert lease_c is not None
    assert len({lease_a.token, lease_b.token, lease_c.token}) == 3


async def test_a_lease_given_up_is_claimed_at_once_by_another_worker(store: TurnStore) -> None:
    await create(store)
    lease = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease is not None
    await store.give_up(lease, 1.0)
    # Neither the turn's id nor a lease end is needed: it is queued, due now.
    taken = await store.claim("worker-b", 1.0, LEASE)
    assert taken is not None
    assert (taken.turn_id, taken.owner) == ("t1", "worker-b")
    assert taken.token != lease.token


async def test_a_claim_says_whether_the_lease_before_was_given_up_or_lost(
    store: TurnStore,
) -> None:
    await create(store)
    first = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert first is not None
    lost = await store.claim("worker-b", first.until + 1, LEASE)  # worker-a died
    assert lost is not None
    await store.give_up(lost, lost.until - 1)  # worker-b stops, handing it on
    handed = await store.claim("worker-c", lost.until - 1, LEASE)
    assert handed is not None
    renewed = await store.renew(handed, lost.until, LEASE)

    assert (first.freed, lost.freed, handed.freed) == (True, False, True)
    assert renewed is not None
    assert renewed.freed  # a renewal keeps what the claim said


async def test_a_lease_given_up_wakes_a_waiting_worker(store: TurnStore) -> None:
    await create(store)
    lease = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease is not None
    waiter = asyncio.create_task(store.wait_for_work(60 * UNIT))
    await asyncio.sleep(0)  # a yield, not a wait: let the waiter start waiting
    await store.give_up(lease, 1.0)
    async with asyncio.timeout(3 * UNIT):
        assert await waiter is None  # woken: claim now
    assert await store.claim("worker-b", 1.0, LEASE) is not None


@pytest.mark.parametrize("after", ["released", "taken over"])
async def test_a_lease_no_longer_held_is_given_up_as_nothing(store: TurnStore, after: str) -> None:
    await create(store)
    lease = await store.claim("worker-a", 0.0, LEASE, turn_id="t1")
    assert lease is not None
    newer = None
    if after == "released":
        await store.release(lease)
    else:
        newer = await store.claim("worker-b", lease.until + 1, LEASE, turn_id="t1")
        assert newer is not None
    await store.give_up(lease, lease.until + 2)
    # Not queued: a claim of any due turn finds none (a turn released as it
    # blocked stays asleep; a turn taken over stays with its new worker,
    # whose lease holds).
    assert await store.claim("worker-c", lease.until + 2, LEASE) is None
    if newer is not None:
        assert await store.renew(newer, lease.until + 3, LEASE) is not None


# ─── Waiting for work ────────────────────────────────────────────────────────


async def test_wait_for_work_returns_when_a_turn_becomes_runnable(store: TurnStore) -> None:
    await create(store)
    waiter = asyncio.create_task(store.wait_for_work(60 * UNIT))
    await asyncio.sleep(0)  # a yield, not a wait: let the waiter start waiting
    await store.make_runnable("t1", 0.0)
    async with asyncio.timeout(3 * UNIT):
        await waiter


async def test_wait_for_work_returns_after_at_most_when_nothing_happens(
    store: TurnStore,
) -> None:
    loop = asyncio.get_running_loop()
    at_most = 0.2 * UNIT
    started = loop.time()
    async with asyncio.timeout(3 * UNIT):
        await store.wait_for_work(at_most)
    # Timers may fire up to a clock tick early; Redis counts in milliseconds.
    assert loop.time() - started >= at_most * 0.9


# ─── The fast path of a resume ───────────────────────────────────────────────


def waiter(name: str = "w1", until: float = 100.0, owner: str = "worker-a") -> Waiter:
    return Waiter(id=name, owner=owner, lease_seconds=LEASE, until=until)


async def waiting(store: TurnStore, name: str = "w1", until: float = 100.0) -> Waiter:
    """A waiter registered by an empty claim (nothing runnable)."""
    registered = waiter(name, until)
    assert await store.claim_turn("worker-a", 0.0, LEASE, waiter=registered) is None
    return registered


def started(turn: Turn) -> Turn:
    return start(turn)


HANDED = next(f"t{n}" for n in itertools.count(1) if group_index(f"t{n}", CLUSTER_GROUPS) == 0)
"""A turn id in the first group of a store spread over a cluster: only
that group's turns are handed over there (the others are queued, and a
waiting worker woken: see test_a_turn_outside_the_desk_is_queued_and_wakes_a_waiter)."""


async def handed_to(store: TurnStore, registered: Waiter) -> Claim:
    """What ``registered`` is handed, as its wait returns it."""
    async with asyncio.timeout(3 * UNIT):
        claim = await store.wait_for_work(60 * UNIT, registered)
    assert claim is not None
    return claim


async def test_a_claim_can_load_the_turn_it_leases(store: TurnStore) -> None:
    saved = await store.save(said(await create(store), "hi"))
    await store.make_runnable("t1", 0.0)
    claim = await store.claim_turn("worker-a", 1.0, LEASE)
    assert claim is not None
    assert (claim.lease.turn_id, claim.lease.owner, claim.lease.until) == ("t1", "worker-a", 11.0)
    assert (claim.turn, claim.running) == (saved, False)
    assert await store.claim_turn("worker-b", 1.0, LEASE) is None


async def test_the_cancel_flag_reads_alone(store: TurnStore) -> None:
    await create(store)
    assert not await store.cancel_requested("t1")
    await store.request_cancel("t1")
    assert await store.cancel_requested("t1")


async def test_save_runnable_queues_the_turn_when_no_worker_waits(store: TurnStore) -> None:
    turn = await create(store)
    saved = await store.save_runnable(said(turn, "resumed"), 5.0, started=started(turn))
    assert (saved.version, saved.status) == (2, TurnStatus.READY)
    assert await store.claim_turn("worker-a", 4.0, LEASE) is None  # due at 5
    claim = await store.claim_turn("worker-a", 5.0, LEASE)
    assert claim is not None
    assert (claim.turn, claim.running) == (saved, False)


@pytest.mark.parametrize("stale", ["version", "cancel flag"])
async def test_save_runnable_of_a_stale_turn_conflicts_and_changes_nothing(
    store: TurnStore, stale: str
) -> None:
    turn = await create(store)
    registered = await waiting(store)
    if stale == "version":
        await store.save(said(await store.load("t1"), "meanwhile"))
    else:
        await store.request_cancel("t1")
    with pytest.raises(VersionConflict):
        await store.save_runnable(said(turn, "late"), 1.0, started=started(turn))
    assert "late" not in [m.content for m in (await store.load("t1")).messages]
    assert await store.claim_turn("worker-b", 1.0, LEASE) is None  # neither queued
    assert await store.claim_turn("worker-a", 1.0, LEASE, waiter=registered) is None  # nor handed


async def test_of_two_concurrent_save_runnables_of_one_version_exactly_one_wins(
    store: TurnStore,
) -> None:
    await create(store, HANDED)
    registered = await waiting(store)
    one, two = await store.load(HANDED), await store.load(HANDED)
    results = await asyncio.gather(
        store.save_runnable(said(one, "one"), 1.0, started=started(one)),
        store.save_runnable(said(two, "two"), 1.0, started=started(two)),
        return_exceptions=True,
    )
    saved = [r for r in results if isinstance(r, Turn)]
    assert (len(saved), len([r for r in results if isinstance(r, VersionConflict)])) == (1, 1)
    claim = await handed_to(store, registered)
    assert claim.turn == saved[0] == await store.load(HANDED)
    assert await store.claim_turn("worker-b", 1.0, LEASE) is None  # handed once, not queued


async def test_save_runnable_hands_the_turn_started_to_the_waiting_worker(
    store: TurnStore,
) -> None:
    turn = await create(store, HANDED)
    registered = await waiting(store)
    resumed = said(turn, "resumed")
    saved = await store.save_runnable(resumed, 1.0, started=started(resumed))
    assert (saved.version, saved.status) == (2, TurnStatus.RUNNING)
    claim = await handed_to(store, registered)
    assert claim.running
    assert claim.turn == saved == await store.load(HANDED)
    assert (claim.lease.turn_id, claim.lease.owner, claim.lease.until) == (HANDED, "worker-a", 11.0)
    assert await store.by_status(TurnStatus.RUNNING) == [HANDED]
    # Leased like a claimed turn: nobody else may claim it, and its saves go.
    assert await store.claim_turn("worker-b", 5.0, LEASE, turn_id=HANDED) is None
    again = await store.save(said(claim.turn, "ran"), lease=claim.lease)
    assert again.version == 3


async def test_save_runnable_without_a_started_turn_hands_it_as_saved(store: TurnStore) -> None:
    turn = await create(store, HANDED)
    registered = await waiting(store)
    saved = await store.save_runnable(said(turn, "resumed"), 1.0)
    claim = await handed_to(store, registered)
    assert (claim.running, claim.turn, saved.status) == (False, saved, TurnStatus.READY)


async def test_a_handed_turn_is_fenced_once_its_lease_was_taken_over(store: TurnStore) -> None:
    turn = await create(store, HANDED)
    registered = await waiting(store)
    await store.save_runnable(turn, 1.0, started=started(turn))
    claim = await handed_to(store, registered)
    # Its worker stalls past the lease: another takes the turn over.
    other = await store.claim_turn("worker-b", claim.lease.until + 1, LEASE)
    assert other is not None
    assert other.turn.status == TurnStatus.RUNNING  # a takeover, as after a crash
    assert other.lease.token != claim.lease.token
    with pytest.raises(Fenced):
        await store.save(said(claim.turn, "from the stalled worker"), lease=claim.lease)
    await store.save(said(other.turn, "from B"), lease=other.lease)


async def test_a_turn_whose_lease_is_held_is_queued_not_handed(store: TurnStore) -> None:
    await create(store)
    holder = await store.claim_turn("worker-h", 0.0, LEASE, turn_id="t1")
    assert holder is not None
    registered = await waiting(store)
    await store.save_runnable(holder.turn, 1.0, started=started(holder.turn))
    # The waiter got nothing; the turn waits in the queue for the lease to go.
    assert await store.claim_turn("worker-a", 1.0, LEASE, waiter=registered) is None
    await store.release(holder.lease)
    claim = await store.claim_turn("worker-a", 2.0, LEASE)
    assert claim is not None
    assert (claim.turn.status, claim.running) == (TurnStatus.READY, False)


async def test_a_waiter_whose_wait_ended_is_handed_nothing(store: TurnStore) -> None:
    turn = await create(store)
    registered = await waiting(store, until=5.0)
    saved = await store.save_runnable(turn, 6.0, started=started(turn))  # its worker died
    assert saved.status == TurnStatus.READY
    claim = await store.claim_turn("worker-b", 6.0, LEASE)  # queued instead
    assert claim is not None
    assert (claim.lease.owner, claim.running) == ("worker-b", False)
    assert await store.wait_for_work(0.05 * UNIT, registered) is None


async def test_the_last_registered_waiter_gets_the_turn_and_only_it(store: TurnStore) -> None:
    turn = await create(store, HANDED)
    first = await waiting(store, "w1", until=50.0)
    last = await waiting(store, "w2", until=60.0)
    await store.save_runnable(turn, 1.0, started=started(turn))
    assert (await handed_to(store, last)).lease.turn_id == HANDED
    assert await store.claim_turn("worker-a", 1.0, LEASE, waiter=first) is None


async def test_a_claim_of_a_waiter_takes_what_was_handed_to_it_first(store: TurnStore) -> None:
    await create(store, "other")
    await store.make_runnable("other", 0.0)
    turn = await create(store, HANDED)
    registered = waiter()
    # A turn that is not there (on a cluster, in another group than the
    # workers wait on): nothing claimed, the waiter registered all the same.
    assert (
        await store.claim_turn("worker-a", 0.0, LEASE, turn_id="no-such-turn", waiter=registered)
        is None
    )
    await store.save_runnable(turn, 1.0, started=started(turn))
    # Woken otherwise (a wake token, the end of its wait), it claims again.
    claim = await store.claim_turn("worker-a", 1.0, LEASE, waiter=registered)
    assert claim is not None
    assert (claim.lease.turn_id, claim.running) == (HANDED, True)


async def test_a_waiter_that_claimed_waits_no_more(store: TurnStore) -> None:
    await create(store, "queued")
    await store.make_runnable("queued", 5.0)
    turn = await create(store)
    registered = await waiting(store)  # at 0, nothing is due
    claimed = await store.claim_turn("worker-a", 5.0, LEASE, waiter=registered)
    assert claimed is not None
    assert claimed.lease.turn_id == "queued"
    await store.save_runnable(turn, 5.0, started=started(turn))
    queued = await store.claim_turn("worker-b", 5.0, LEASE)
    assert queued is not None
    assert (queued.lease.turn_id, queued.running) == ("t1", False)


async def test_a_stopping_waiter_gives_back_what_it_was_handed(store: TurnStore) -> None:
    turn = await create(store)
    registered = await waiting(store)
    await store.save_runnable(turn, 1.0, started=started(turn))
    await store.stop_waiting(registered, 2.0)
    claim = await store.claim_turn("worker-b", 2.0, LEASE)
    assert claim is not None
    assert claim.lease.turn_id == "t1"
    assert await store.wait_for_work(0.05 * UNIT, registered) is None


async def test_wait_for_work_returns_the_turn_handed_to_the_waiter_at_once(
    store: TurnStore,
) -> None:
    turn = await create(store, HANDED)
    registered = await waiting(store)
    wait = asyncio.create_task(store.wait_for_work(60 * UNIT, registered))
    await asyncio.sleep(0)  # a yield, not a wait: let the waiter start waiting
    await store.save_runnable(turn, 1.0, started=started(turn))
    async with asyncio.timeout(3 * UNIT):
        claim = await wait
    assert claim is not None
    assert (claim.lease.turn_id, claim.running) == (HANDED, True)


async def test_wait_for_work_of_a_waiter_returns_nothing_when_woken_otherwise(
    store: TurnStore,
) -> None:
    await create(store)
    registered = await waiting(store)
    wait = asyncio.create_task(store.wait_for_work(60 * UNIT, registered))
    await asyncio.sleep(0)
    await store.make_runnable("t1", 0.0)
    async with asyncio.timeout(3 * UNIT):
        assert await wait is None
    claim = await store.claim_turn("worker-a", 1.0, LEASE, waiter=registered)
    assert claim is not None
    assert not claim.running


@pytest.mark.redis
async def test_a_turn_outside_the_desk_is_queued_and_wakes_a_waiter() -> None:
    async with redis_turn_store("cluster") as store:
        assert store.group_of("t1") is not store.desk
        turn = await create(store)
        registered = await waiting(store)
        wait = asyncio.create_task(store.wait_for_work(60 * UNIT, registered))
        await asyncio.sleep(0)
        saved = await store.save_runnable(said(turn, "resumed"), 1.0, started=started(turn))
        assert saved.status == TurnStatus.READY  # queued as resumed, not handed over started
        async with asyncio.timeout(3 * UNIT):
            assert await wait is None
        claim = await store.claim_turn("worker-a", 1.0, LEASE, waiter=registered)
        assert claim is not None
        assert (claim.lease.turn_id, claim.running, claim.turn) == ("t1", False, saved)


# ─── Redis only ──────────────────────────────────────────────────────────────


@pytest.fixture
async def redis_turns(redis_server: RedisServer) -> AsyncIterator[RedisTurnStore]:
    store = RedisTurnStore(redis_server.url)
    try:
        yield store
    finally:
        await store.close()


@pytest.mark.redis
async def test_redis_keeps_every_runner_key_under_one_hash_tag(
    redis_server: RedisServer, redis_turns: RedisTurnStore
) -> None:
    await create(redis_turns)
    await redis_turns.make_runnable("t1", 0.0)
    lease = await redis_turns.claim("w", 0.0, LEASE, turn_id="t1")
    assert lease is not None
    await redis_turns.request_cancel("t1")
    await redis_turns.make_runnable("t1", 0.0)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        keys = set(await raw.keys("*"))
        fields = set(await raw.hkeys("{huddle:turn}:turn:t1"))
    finally:
        await raw.aclose()
    assert keys == {
        b"{huddle:turn}:turn:t1",
        b"{huddle:turn}:status:READY",
        b"{huddle:turn}:runnable",
        b"{huddle:turn}:leases",
        b"{huddle:turn}:wake",
        b"{huddle:turn}:tokens",
    }
    assert fields == {
        b"version",
        b"status",
        b"phase",
        b"lease_owner",
        b"lease_token",
        b"lease_until",
        b"cancel",
        b"payload",
    }


@pytest.mark.redis
async def test_redis_keeps_the_waiting_workers_and_their_inboxes_under_the_hash_tag(
    redis_server: RedisServer, redis_turns: RedisTurnStore
) -> None:
    turn = await create(redis_turns)
    await waiting(redis_turns, "w1")
    await waiting(redis_turns, "w2")
    await redis_turns.save_runnable(turn, 1.0, started=started(turn))
    raw = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        keys = {k if isinstance(k, str) else k.decode() for k in await raw.keys("*")}
        inbox = await raw.lrange("{huddle:turn}:inbox:w2", 0, -1)
    finally:
        await raw.aclose()
    assert {"{huddle:turn}:waiting", "{huddle:turn}:waiters", "{huddle:turn}:inbox:w2"} <= keys
    assert all(key.startswith("{huddle:turn}:") for key in keys)
    assert len(inbox) == 1  # handed to the waiter that registered last


@pytest.mark.redis
async def test_redis_down_fails_fast_and_a_waiting_worker_waits_out_at_most(
    redis_server: RedisServer, redis_turns: RedisTurnStore
) -> None:
    await create(redis_turns)
    await redis_server.kill()
    async with asyncio.timeout(2 * UNIT):
        with pytest.raises(StoreUnavailable):
            await redis_turns.load("t1")
        with pytest.raises(StoreUnavailable):
            await redis_turns.claim("w", 0.0, LEASE)
    loop = asyncio.get_running_loop()
    at_most = 0.2 * UNIT
    started = loop.time()
    async with asyncio.timeout(3 * UNIT):
        await redis_turns.wait_for_work(at_most)
    assert loop.time() - started >= at_most * 0.9


@pytest.mark.redis
async def test_redis_reloads_its_scripts_after_a_restart(
    redis_server: RedisServer, redis_turns: RedisTurnStore
) -> None:
    turn = await redis_turns.save(said(await create(redis_turns), "before"))
    await redis_server.stop()
    async with asyncio.timeout(10 * UNIT):
        await redis_server.start()
    saved = await redis_turns.save(said(turn, "after the restart"))
    assert saved.version == 3


# ─── Redis only: records this version cannot decode ──────────────────────────
# A record corrupted in Redis, or written by a newer version, is parked on its
# first claim: claimed no more, logged once, kept for an operator. The record
# is turn bad2's, which is in the first group (the desk) of a store spread
# over a cluster, as every turn handed over there is.


def tag(store: RedisTurnStore) -> str:
    """The hash tag of turn ``bad2``'s group."""
    return store.group_of("bad2").tag


UNDECODABLE_PAYLOADS = [
    pytest.param(b'{"id": "bad2", "agent": ', id="corrupt-json"),
    pytest.param(b'{"id": "bad2", "agent": "echo", "status": "PAUSED"}', id="newer-status"),
    pytest.param(None, id="no-payload"),
]


@pytest.fixture(params=["redis", "cluster"])
async def poisoned(request: pytest.FixtureRequest) -> AsyncIterator[RedisTurnStore]:
    """A Redis turn store, on one Redis or on the cluster (every script
    keeps to the one slot of the prefix's hash tag there)."""
    async with redis_turn_store(request.param) as made:
        yield made


async def write_record(
    store: RedisTurnStore, payload: bytes | None, *, status: str = "READY", token: int = 0
) -> None:
    """Turn ``bad2`` as another writer left it, straight into Redis: its hash
    (``payload`` left out when None), its status set, due at once."""
    fields: dict[str, bytes | str | int] = {
        "version": 3,
        "status": status,
        "phase": "MODEL",
        "lease_owner": "",
        "lease_token": token,
        "lease_until": 0,
        "cancel": 0,
    }
    if payload is not None:
        fields["payload"] = payload
    await store.client.hset(f"{tag(store)}:turn:bad2", mapping=fields)  # type: ignore[arg-type]
    await store.client.sadd(f"{tag(store)}:status:{status}", "bad2")
    await store.client.zadd(f"{tag(store)}:runnable", {"bad2": 0.0})


async def record_of_bad(store: RedisTurnStore) -> dict[Any, Any]:
    held: dict[Any, Any] = await store.client.hgetall(f"{tag(store)}:turn:bad2")
    return held


def parked_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("parked turn bad2:")]


async def assert_parked_and_kept(store: RedisTurnStore, before: dict[Any, Any]) -> None:
    """``bad2`` is parked: in no queue, lease or status set; its data as it was."""
    assert set(await store.parked()) == {"bad2"}
    assert await store.client.zscore(f"{tag(store)}:runnable", "bad2") is None
    assert await store.client.zscore(f"{tag(store)}:leases", "bad2") is None
    assert "bad2" not in await store.by_status(TurnStatus.READY)
    after = await record_of_bad(store)
    kept = {b"version", b"status", b"phase", b"cancel", b"payload"}
    assert {k: v for k, v in after.items() if k in kept} == {
        k: v for k, v in before.items() if k in kept
    }


@pytest.mark.redis
@pytest.mark.parametrize("payload", UNDECODABLE_PAYLOADS)
async def test_redis_parks_a_record_it_cannot_decode_and_claims_the_next_turn(
    poisoned: RedisTurnStore, payload: bytes | None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="huddle.runner.redis_store")
    await write_record(poisoned, payload)
    before = await record_of_bad(poisoned)
    await create(poisoned)
    await poisoned.make_runnable("t1", 1.0)  # due after the bad2 one

    claim = await poisoned.claim_turn("worker-a", 2.0, LEASE)

    assert claim is not None
    assert claim.lease.turn_id == "t1"
    await assert_parked_and_kept(poisoned, before)
    [logged] = parked_logs(caplog)
    assert logged.levelno == logging.ERROR
    why = (await poisoned.parked())["bad2"]
    assert why
    assert why in logged.getMessage()
    # Long after any lease would have expired: nothing to claim, bad2 included.
    await poisoned.release(claim.lease)
    token = (await record_of_bad(poisoned))[b"lease_token"]
    assert await poisoned.claim_turn("worker-a", 2.0 + 10 * LEASE, LEASE) is None
    assert (await record_of_bad(poisoned))[b"lease_token"] == token  # not claimed again
    assert len(parked_logs(caplog)) == 1


@pytest.mark.redis
async def test_redis_parks_a_given_turn_it_cannot_decode_and_claims_nothing_else(
    poisoned: RedisTurnStore,
) -> None:
    await write_record(poisoned, b"not json")
    await create(poisoned)
    await poisoned.make_runnable("t1", 0.0)
    assert await poisoned.claim_turn("worker-a", 2.0, LEASE, turn_id="bad2") is None
    assert set(await poisoned.parked()) == {"bad2"}
    claim = await poisoned.claim_turn("worker-a", 2.0, LEASE)
    assert claim is not None
    assert claim.lease.turn_id == "t1"


def inbox_item(header: bytes, payload: bytes) -> bytes:
    return header + b"\n" + payload


HANDED_BAD = b'["bad2", 7, 3, 0, "1000.0", 1]'
"""The header of turn ``bad2`` handed over under lease token 7."""


@pytest.mark.redis
@pytest.mark.parametrize("taken_by", ["claim_turn", "wait_for_work"])
async def test_redis_parks_a_handed_turn_it_cannot_decode(
    poisoned: RedisTurnStore, taken_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="huddle.runner.redis_store")
    await write_record(poisoned, b"not json", token=7)
    await poisoned.client.zrem(f"{tag(poisoned)}:runnable", "bad2")  # handed: leased, not queued
    await poisoned.client.zadd(f"{tag(poisoned)}:leases", {"bad2": 1000.0})
    before = await record_of_bad(poisoned)
    registered = await waiting(poisoned)
    await create(poisoned)
    await poisoned.make_runnable("t1", 0.0)
    item = inbox_item(HANDED_BAD, b"not json")
    await poisoned.client.rpush(f"{poisoned.desk.tag}:inbox:{registered.id}", item)

    if taken_by == "wait_for_work":
        async with asyncio.timeout(3 * UNIT):
            assert await poisoned.wait_for_work(60 * UNIT, registered) is None
    claim = await poisoned.claim_turn("worker-a", 2.0, LEASE, waiter=registered)

    assert claim is not None
    assert claim.lease.turn_id == "t1"
    await assert_parked_and_kept(poisoned, before)
    assert len(parked_logs(caplog)) == 1


@pytest.mark.redis
async def test_redis_drops_a_hand_over_whose_header_it_cannot_read(
    poisoned: RedisTurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="huddle.runner.redis_store")
    registered = await waiting(poisoned)
    await create(poisoned)
    await poisoned.make_runnable("t1", 0.0)
    item = inbox_item(b'["bad2", 7, "from a newer version"]', b"{}")
    await poisoned.client.rpush(f"{poisoned.desk.tag}:inbox:{registered.id}", item)
    async with asyncio.timeout(3 * UNIT):
        assert await poisoned.wait_for_work(60 * UNIT, registered) is None
    claim = await poisoned.claim_turn("worker-a", 2.0, LEASE, waiter=registered)
    assert claim is not None
    assert claim.lease.turn_id == "t1"
    [logged] = [r for r in caplog.records if r.getMessage().startswith("dropped a turn handed")]
    assert logged.levelno == logging.ERROR
    assert await poisoned.parked() == {}


@pytest.mark.redis
async def test_a_worker_parks_a_record_it_cannot_decode_once_and_runs_the_other_turns(
    poisoned: RedisTurnStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)
    await write_record(poisoned, b'{"id": "bad2", "agent": "helper", "status": "PAUSED"}')
    before = await record_of_bad(poisoned)
    clock = Clock()
    helper = agent(scripted(say("Hello.")))
    runner = Runner(poisoned, [helper], clock=clock, owner="worker", lease_seconds=LEASE)
    done = asyncio.Event()
    runner.listeners.append(lambda e: done.set() if e.type == EventType.TURN_COMPLETED else None)
    await runner.start(helper, "Hi", turn_id="t1")
    # Sweeps at every pass: they must not queue the parked turn again.
    worker = Worker(runner, idle_wait=0.05 * UNIT, recover_every=0.0)
    working = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(10 * UNIT):
            await done.wait()
    finally:
        working.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await working

    assert (await poisoned.load("t1")).status == TurnStatus.COMPLETED
    await assert_parked_and_kept(poisoned, before)
    token = (await record_of_bad(poisoned))[b"lease_token"]
    clock.advance(10 * LEASE)  # every lease long expired
    await runner.recover()
    while await worker.step():  # t1 again, if the stop left its lease to expire
        pass
    assert (await record_of_bad(poisoned))[b"lease_token"] == token  # not claimed again
    assert len(parked_logs(caplog)) == 1
    assert not [r for r in caplog.records if r.getMessage() == "claiming failed"]
