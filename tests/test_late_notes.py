"""A note or an expiry record of a turn truncated away, written late, does
not take the place of those of the turn that used its id next."""

from __future__ import annotations

import asyncio

from protocol.actions import ChatTruncated
from protocol.chat import ChatState
from protocol.session import SessionState
from reducers import notes
from reducers.chat import select_input_settlement
from server.build import default_agents
from server.core.expiry import EXPIRY_RECORDS, Expiry
from server.core.host import Host
from tests.conftest import UNIT, WallClock
from tests.test_expiry import (
    AGENT,
    DANA,
    REQUEST,
    SESSION,
    ExpiryPuts,
    answer,
    expiring_in_a_batch,
    stamped_turn,
)


async def test_a_late_note_of_a_truncated_turn_leaves_the_next_turns_note_alone(
    clock: WallClock,
) -> None:
    # A gives the old turn's question an expiry while its notes wait out
    # their interval; B truncates the turn away; C, which wrote no notes
    # lately, notes the next turn's question of the same id (its deadline,
    # who drafts it) at once. A's note then lands: being of another turn, it
    # replaced C's, so the new question showed no deadline and no author
    # (and answers past its deadline were not refused before the sweep).
    store = ExpiryPuts()
    a, b, c = (
        Host(store, agents=default_agents(), clock=clock, expiry_check_interval=3600.0)
        for _ in range(3)
    )
    for host in (a, b, c):
        await host.start()
    chat, expiring = await expiring_in_a_batch(a, store)
    await b.view(chat)
    await b.dispatch(chat, ChatTruncated(), sender=AGENT)
    await c.view(chat)
    await c.dispatch(chat, stamped_turn("bbbbbbbb"))
    await c.ask(chat, REQUEST)
    at = await c.expire(chat, "requests", "details", Expiry(600))
    await c.dispatch(chat, answer("SSO"), sender=DANA)
    async with asyncio.timeout(2 * UNIT):
        await expiring
        await c.notes.note(SESSION, chat)  # C's draft note, batched, is written too
    state = (await c.view(SESSION)).state
    for host in (a, b, c):
        await host.stop()

    assert isinstance(state, SessionState)
    assert notes.expiry_of(state.meta, "requests", chat, "details", "bbbbbbbb") == (at, "cancel")
    note = notes.note_for(state.meta, "requests", chat, "details", "bbbbbbbb")
    assert note is not None
    assert note["answers"]["system"]["by"] == DANA.who()


async def test_a_late_expiry_record_of_a_truncated_turn_leaves_the_next_turns_in_place(
    clock: WallClock,
) -> None:
    # A's record of the old turn's question, put after B's truncation
    # deleted it (as the commit's own test has it), but after the next
    # turn's question of the same id was given its expiry: the record is
    # named by the wait's id alone, so A's took the place of the new one, the
    # sweep dropped it as another turn's, and the new question never expired.
    store = ExpiryPuts()
    a, b = (
        Host(store, agents=default_agents(), clock=clock, expiry_check_interval=3600.0)
        for _ in range(2)
    )
    for host in (a, b):
        await host.start()
    chat = await a.create_session(SESSION)
    await a.dispatch(chat, stamped_turn("aaaaaaaa"))
    await a.ask(chat, REQUEST)
    await a.expire(chat, "requests", "details", Expiry(60))
    late = await store.records(EXPIRY_RECORDS)
    await b.view(chat)
    await b.dispatch(chat, ChatTruncated(), sender=AGENT)
    await b.dispatch(chat, stamped_turn("bbbbbbbb"))
    await b.ask(chat, REQUEST)
    await b.expire(chat, "requests", "details", Expiry(600))
    for name, raw in late.items():
        await store.put_record(EXPIRY_RECORDS, name, raw)  # A's, late

    clock.now += 601
    fired = [await host.expiries.sweep() for host in (a, b)]  # A fires, if any
    state = (await a.view(chat)).state
    for host in (a, b):
        await host.stop()

    assert sum(fired) == 1
    assert isinstance(state, ChatState)
    settled = select_input_settlement(state, "details").part
    assert settled is not None
    assert settled.response == "cancel"
