"""Retention: a finished session older than ``--retention`` goes, its
audit exported to ``--audit-dir`` first; a session in progress stays; a
disposed session's audit goes once old enough. The hosts' clock is the
test's; sweeps are called."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protocol.actions import ChatTurnComplete
from server.config import Settings, parse_duration, settings_from
from server.core.audit import GONE_RECORDS, verify
from server.core.retention import Retention
from server.errors import ChannelGone, CommandError
from tests.conftest import RunningServer, WallClock, session_chat_with_turn, start_server
from tests.test_trust import TURN

DAY = 86400.0


@pytest.fixture
async def huddle(clock: WallClock, tmp_path: Path) -> AsyncIterator[RunningServer]:
    settings = Settings(port=0, retention=30 * DAY, audit_dir=str(tmp_path / "audits"))
    running = await start_server(settings, clock=clock)
    try:
        yield running
    finally:
        await running.stop()


def retention(huddle: RunningServer) -> Retention:
    kept = huddle.server.parts.retention
    assert kept is not None
    return kept


async def session_with_a_turn(huddle: RunningServer, uri: str, *, finish: bool) -> str:
    agent = huddle.clients[0] if huddle.clients else await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, uri, TURN)
    if finish:
        await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id=TURN.turn_id, duration=5))
    return chat


async def test_a_finished_session_past_its_time_goes_after_its_audit_is_exported(
    huddle: RunningServer, clock: WallClock, tmp_path: Path
) -> None:
    chat = await session_with_a_turn(huddle, "ahp-session:/old", finish=True)
    await session_with_a_turn(huddle, "ahp-session:/busy", finish=False)
    await huddle.server.parts.host.audit.settled()
    host = huddle.server.parts.host

    assert await retention(huddle).sweep() == []  # not old enough
    clock.now += 31 * DAY
    retired = await retention(huddle).sweep()

    assert retired == ["ahp-session:/old"]
    with pytest.raises(ChannelGone):
        await host.view("ahp-session:/old")
    with pytest.raises(ChannelGone):
        await host.view(chat)
    await host.view("ahp-session:/busy")  # a turn runs in it: it stays
    exported = (tmp_path / "audits" / "old.jsonl").read_bytes().splitlines()
    assert verify(exported).session == "ahp-session:/old"
    assert verify(exported).records == 2  # the turn started and completed
    assert await huddle.server.parts.store.read_audit("ahp-session:/old", 0, 10) == []
    assert await huddle.server.parts.store.records(GONE_RECORDS) == {}
    assert await retention(huddle).sweep() == []


async def test_a_disposed_sessions_audit_stays_its_time_then_goes(
    huddle: RunningServer, clock: WallClock, tmp_path: Path
) -> None:
    await session_with_a_turn(huddle, "ahp-session:/gone", finish=False)
    await huddle.server.parts.host.audit.settled()
    await huddle.server.parts.host.dispose_session("ahp-session:/gone")
    store = huddle.server.parts.store

    clock.now += 29 * DAY
    assert await retention(huddle).sweep() == []
    assert len(await store.read_audit("ahp-session:/gone", 0, 10)) == 1  # still readable
    # Its id stays taken meanwhile: a new session there would read the old
    # one's records (and lose its own with them).
    with pytest.raises(CommandError, match="already exists"):
        await huddle.server.parts.host.create_session("ahp-session:/gone")
    clock.now += 2 * DAY
    assert await retention(huddle).sweep() == ["ahp-session:/gone"]

    assert await store.read_audit("ahp-session:/gone", 0, 10) == []
    assert verify((tmp_path / "audits" / "gone.jsonl").read_bytes().splitlines()).records == 1
    await huddle.server.parts.host.create_session("ahp-session:/gone")  # free once it went


async def test_without_an_audit_dir_nothing_is_written(clock: WallClock, tmp_path: Path) -> None:
    running = await start_server(Settings(port=0, retention=60), clock=clock)
    try:
        await session_with_a_turn(running, "ahp-session:/x", finish=True)
        clock.now += 120
        assert await retention(running).sweep() == ["ahp-session:/x"]
    finally:
        await running.stop()
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240 (after the server stopped)


def test_a_retention_is_a_duration() -> None:
    assert parse_duration("90") == parse_duration("90s") == 90
    assert parse_duration("15m") == 900
    assert parse_duration(" 12H ") == 12 * 3600
    assert parse_duration("1.5d") == 1.5 * DAY
    for wrong in ("", "0", "-1d", "3w", "d"):
        with pytest.raises(ValueError, match="a duration is"):
            parse_duration(wrong)
    settings = settings_from({"retention": "30d", "audit_dir": "/var/audits"}, {})
    assert settings.retention == 30 * DAY
    assert settings.audit_dir == "/var/audits"
    assert settings_from({}, {"HUDDLE_RETENTION": "1h"}).retention == 3600
    assert settings_from({}, {}).retention is None
