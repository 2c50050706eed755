"""A session's audit: every answer and approval on record, with who did it,
in a hash chain that catches a record removed or altered; redaction of
sensitive fields; export over HTTP and from the store; one chain across
processes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from msgspec.structs import replace

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatToolCallConfirmed,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
)
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    SelectedValue,
    TextQuestion,
    TextValue,
)
from server.auth import TokenAuthority
from server.build import default_agents
from server.cli import main
from server.client import HuddleClient
from server.config import Limits, Settings
from server.core.audit import (
    FIELD_BYTES,
    GENESIS,
    REDACTED,
    AuditBroken,
    canonical,
    export,
    seal,
    verify,
)
from server.core.audit_key import key_id, read_public_keys
from server.core.host import Host
from server.errors import ActionRejected, StoreUnavailable
from server.frames import OutFrame
from server.runner.demo import agent as demo
from server.store.memory import MemoryStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    RunningServer,
    session_chat_with_turn,
    start_server,
    user_message,
    watched_chat,
)
from tests.edge import Peer, http, initialize_params
from tests.redis_server import RedisServer
from tests.test_runner_demo import open_request, pending_call, wait
from tests.test_serve_cli import TOKEN, Served, start
from tests.test_trust import TURN

SESSION = "ahp-session:/audited"
SCHEMA = {
    "type": "object",
    "properties": {
        "system": {"type": "string", "title": "Which system?"},
        "password": {"type": "string", "title": "Admin password", "writeOnly": True},
        "pin": {"type": "string", "title": "PIN", "x-huddle-sensitive": True},
    },
}
FORM = InputRequest(id="access", message="Access details")


def text(value: str, state: str = "submitted") -> InputAnswer:
    return InputAnswer(state=state, value=TextValue(value=value))  # type: ignore[arg-type]


async def audit_of(huddle: RunningServer, token: str, session: str = SESSION) -> list[bytes]:
    await huddle.server.parts.host.audit.settled()
    reply = await http("GET", f"{huddle.http}/api/audit?session={session}", token=token)
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"].startswith("application/x-ndjson")
    *lines, end = reply.body.splitlines()
    assert json.loads(end)["what"] == "audit/end"  # the export's signed end
    return lines


def records(lines: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


async def asked(huddle: RunningServer) -> str:
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    await huddle.server.parts.host.ask(chat, FORM, schema=SCHEMA)
    return chat


# ─── The story on record ─────────────────────────────────────────────────────


@pytest.fixture
async def with_demo() -> AsyncIterator[RunningServer]:
    running = await start_server(agent=demo)
    try:
        yield running
    finally:
        await running.stop()


async def test_the_demo_story_is_on_record_with_who_did_what(with_demo: RunningServer) -> None:
    alice = await with_demo.client(name="Alice")
    chat, mirror = await watched_chat(alice, "ahp-session:/story")
    await alice.dispatch_and_wait(
        chat,
        ChatTurnStarted(
            turn_id="t1", started_at="2026-12-01T10:00:00.000Z", message=user_message("Login")
        ),
    )
    request = open_request(await wait(mirror, lambda s: open_request(s) is not None))
    assert request is not None
    await alice.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id=request.request.id,
            response="accept",
            answers={
                "affectedSystem": text("SSO"),
                "impactScope": InputAnswer(
                    state="submitted", value=SelectedValue(value="ALL_USERS")
                ),
            },
        ),
    )
    call = pending_call(await wait(mirror, lambda s: pending_call(s) is not None))
    assert call is not None
    await alice.dispatch_and_wait(
        chat,
        ChatToolCallConfirmed(
            turn_id="t1", tool_call_id=call.tool_call_id, approved=True, confirmed="user-action"
        ),
    )
    await wait(mirror, lambda s: isinstance(s, ChatState) and bool(s.turns))

    lines = await audit_of(with_demo, with_demo.token(name="Alice"), "ahp-session:/story")

    checked = verify(lines)
    assert checked.records == len(lines)
    assert checked.session == "ahp-session:/story"
    kept = records(lines)
    what = [r["what"] for r in kept]
    assert what[0] == "chat/turnStarted"
    for step in ("chat/inputRequested", "chat/toolCallReady", "chat/turnComplete"):
        assert step in what
    assert what.count("runner/resumed") == 2
    assert what.index("chat/inputCompleted") < what.index("runner/resumed")
    by_what = {r["what"]: r for r in kept}
    alice_token = by_what["chat/turnStarted"]["who"]["token"]
    assert by_what["chat/turnStarted"]["who"] == {
        "name": "Alice",
        "role": "participant",
        "token": alice_token,
        "link": True,  # a token link's, not a signed-in person's
    }
    completed = by_what["chat/inputCompleted"]
    assert completed["who"]["name"] == "Alice"
    assert completed["action"]["answers"]["affectedSystem"]["value"]["value"] == "SSO"
    assert "redacted" not in completed
    assert by_what["chat/toolCallConfirmed"]["who"]["name"] == "Alice"
    # Each decision carries what it decided on, as the chat showed it.
    assert by_what["chat/toolCallConfirmed"]["asked"]["toolCallId"] == call.tool_call_id
    assert by_what["chat/toolCallConfirmed"]["asked"]["status"] == "pending-confirmation"
    assert completed["asked"]["id"] == request.request.id
    assert "answers" not in completed["asked"]  # drafts are not what was decided
    assert by_what["chat/inputRequested"]["who"] == {"role": "server"}
    resumes = [r for r in kept if r["what"] == "runner/resumed"]
    assert resumes[0]["resume"]["command"] == "USER_INPUT"
    assert resumes[0]["resume"]["metadata"]["by"] == "Alice"
    assert resumes[1]["resume"]["command"] == "TOOL_APPROVAL"
    assert [r["n"] for r in kept] == list(range(1, len(kept) + 1))
    assert kept[0]["prev"] == GENESIS


# ─── Drafts, redaction, identity ────────────────────────────────────────────


async def test_sensitive_fields_are_redacted_and_drafts_recorded_when_their_author_changes(
    huddle: RunningServer,
) -> None:
    chat = await asked(huddle)
    lee = await huddle.client(name="Lee")
    dana = await huddle.client(name="Dana")
    for typed in ("S", "SS", "SSO"):  # one author, one state: one record
        await lee.dispatch_and_wait(
            chat,
            ChatInputAnswerChanged(
                request_id="access", question_id="system", answer=text(typed, "draft")
            ),
        )
    await dana.dispatch_and_wait(
        chat,
        ChatInputAnswerChanged(
            request_id="access", question_id="system", answer=text("SSO+", "draft")
        ),
    )
    await dana.dispatch_and_wait(
        chat,
        ChatInputAnswerChanged(
            request_id="access", question_id="password", answer=text("hunter2", "draft")
        ),
    )
    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id="access",
            response="accept",
            answers={"system": text("SSO"), "password": text("hunter2"), "pin": text("1234")},
        ),
    )

    kept = records(await audit_of(huddle, AGENT_TOKEN))

    drafts = [r for r in kept if r["what"] == "chat/inputAnswerChanged"]
    assert [(r["who"]["name"], r["action"]["questionId"]) for r in drafts] == [
        ("Lee", "system"),
        ("Dana", "system"),
        ("Dana", "password"),
    ]
    assert drafts[0]["action"]["answer"]["value"]["value"] == "S"
    assert drafts[2]["action"]["answer"]["value"] == REDACTED
    assert drafts[2]["redacted"] == ["answer"]
    completed = next(r for r in kept if r["what"] == "chat/inputCompleted")
    answers = completed["action"]["answers"]
    assert answers["system"]["value"]["value"] == "SSO"
    assert answers["password"]["value"] == answers["pin"]["value"] == REDACTED
    assert sorted(completed["redacted"]) == ["answers/password", "answers/pin"]
    assert b"hunter2" not in b"".join(await audit_of(huddle, AGENT_TOKEN))


async def test_toggling_answers_cannot_fill_the_audit_and_the_completion_is_recorded(
    huddle: RunningServer,
) -> None:
    huddle.server.parts.host.audit.drafts_per_request = 6
    chat = await asked(huddle)
    lee = await huddle.client(name="Lee")
    dana = await huddle.client(name="Dana")
    for n in range(10):
        for person in (lee, dana):  # authors taking turns: every change a new author
            await person.dispatch_and_wait(
                chat,
                ChatInputAnswerChanged(
                    request_id="access", question_id="system", answer=text(f"{n}", "draft")
                ),
            )
        # An answer cleared and typed again is no news.
        await lee.dispatch_and_wait(
            chat, ChatInputAnswerChanged(request_id="access", question_id="pin", answer=None)
        )
        await lee.dispatch_and_wait(
            chat,
            ChatInputAnswerChanged(
                request_id="access", question_id="pin", answer=text("1", "draft")
            ),
        )
    await lee.dispatch_and_wait(
        chat, ChatInputCompleted(request_id="access", response="accept", answers={})
    )

    kept = records(await audit_of(huddle, AGENT_TOKEN))

    drafts = [r for r in kept if r["what"] == "chat/inputAnswerChanged"]
    assert len(drafts) == 6
    assert [r["action"]["questionId"] for r in drafts].count("pin") == 1
    assert kept[-1]["what"] == "chat/inputCompleted"


async def test_redacting_every_value_keeps_who_and_what() -> None:
    huddle = await start_server(Settings(port=0, audit_values="redact"))
    try:
        chat = await asked(huddle)
        lee = await huddle.client(name="Lee")
        await lee.dispatch_and_wait(
            chat,
            ChatInputCompleted(
                request_id="access", response="accept", answers={"system": text("SSO")}
            ),
        )
        kept = records(await audit_of(huddle, AGENT_TOKEN))
    finally:
        await huddle.stop()

    completed = next(r for r in kept if r["what"] == "chat/inputCompleted")
    assert completed["action"]["answers"]["system"]["value"] == REDACTED
    assert completed["who"]["name"] == "Lee"


async def test_a_shared_links_holder_is_recorded_with_the_token_and_the_typed_name(
    huddle: RunningServer,
) -> None:
    chat = await asked(huddle)
    shared = huddle.authority.mint(
        "participant", name="participant", expires_at=time.time() + 60, shared=True
    )
    peer = await Peer.open(huddle.ws, shared, "dana-tab")
    params = initialize_params("dana-tab")
    params["capabilities"]["huddle.identity"] = {"name": "Dana"}
    await peer.request("initialize", params)
    await peer.subscribe(chat)
    await peer.dispatch(
        chat, ChatInputAnswerChanged(request_id="access", question_id="system", answer=text("x"))
    )
    assert "rejectionReason" not in await peer.envelope()

    draft = records(await audit_of(huddle, AGENT_TOKEN))[-1]

    assert draft["who"] == {
        "name": "Dana",
        "role": "participant",
        "token": huddle.authority.verify(shared, 0).token_id,
        "declared": True,
        "link": True,
    }
    assert draft["origin"]["clientId"] == "dana-tab"  # what it said, beside who it is
    await peer.close()


async def test_a_full_audit_says_so_and_records_no_more() -> None:
    huddle = await start_server(Settings(port=0, audit_max_records=3))
    try:
        chat = await asked(huddle)  # turn started, input requested: 2
        lee = await huddle.client(name="Lee")
        for state in ("draft", "submitted", "draft"):
            await lee.dispatch_and_wait(
                chat,
                ChatInputAnswerChanged(
                    request_id="access", question_id="system", answer=text("x", state)
                ),
            )
        kept = records(await audit_of(huddle, AGENT_TOKEN))
    finally:
        await huddle.stop()

    assert [r["what"] for r in kept] == ["chat/turnStarted", "chat/inputRequested", "audit/full"]
    assert verify([json.dumps(r).encode() for r in kept]).records == 3


async def test_the_last_tenth_of_an_audit_is_kept_for_decisive_records() -> None:
    huddle = await start_server(Settings(port=0, audit_max_records=30))
    try:
        audit = huddle.server.parts.host.audit
        mallory = {"role": "participant", "name": "Mallory", "token": "t-m"}

        def body(what: str, who: dict[str, Any]) -> dict[str, Any]:
            return {"at": "2026-12-01T10:00:00.000Z", "session": SESSION, "what": what, "who": who}

        for _ in range(40):  # what a person can repeat at will
            await audit.record(SESSION, body("chat/turnStarted", mallory))
        await audit.record(SESSION, body("chat/inputCompleted", mallory))
        # What the agent does in each turn a person starts is not decisive.
        await audit.record(SESSION, body("chat/turnComplete", {"role": "server"}))
        await audit.record(SESSION, body("runner/resumed", {"role": "server"}))
        await audit.record(SESSION, body("chat/turnCancelled", mallory))
        for _ in range(3):
            await audit.record(SESSION, body("chat/toolCallConfirmed", mallory))
        lines = [line async for line in export(huddle.server.parts.store, SESSION)]
    finally:
        await huddle.stop()

    whats = [r["what"] for r in records(lines)]
    assert whats == [
        *["chat/turnStarted"] * 26,
        "audit/reserve",
        "chat/inputCompleted",
        "runner/resumed",
        "audit/full",
    ]
    assert verify(lines).records == 30


async def test_a_large_message_is_kept_as_its_digest_and_the_chain_still_verifies(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent", name="agent")
    big = "m" * 65_000
    turn = ChatTurnStarted(
        turn_id="t1", started_at="2026-12-01T10:00:00.000Z", message=user_message(big)
    )
    await session_chat_with_turn(agent, SESSION, turn)
    lines = await audit_of(huddle, AGENT_TOKEN)

    started = records(lines)[0]
    assert len(lines[0]) < 4 * FIELD_BYTES  # not the 65 KB sent
    assert started["elided"] == ["action/message/text"]
    kept = started["action"]["message"]["text"]
    assert kept["sha256"] == hashlib.sha256(big.encode()).hexdigest()
    assert kept["bytes"] == 65_000
    assert kept["head"] == big[:FIELD_BYTES]
    assert started["action"]["message"]["origin"] == {"kind": "user"}
    checked = verify(lines)
    assert (checked.records, checked.elided) == (1, 1)
    pointless = lines[0].replace(b'"elided":["action/message/text"]', b'"elided":["action/x"]')
    with pytest.raises(AuditBroken):  # altered: the hash covers the paths too
        verify([pointless])


async def test_an_audit_is_bounded_in_bytes_and_its_reserve_keeps_decisions() -> None:
    huddle = await start_server(Settings(port=0, audit_max_bytes=40_000))
    try:
        audit = huddle.server.parts.host.audit
        mallory = {"role": "participant", "name": "Mallory", "token": "t-m"}

        def body(what: str, text: str) -> dict[str, Any]:
            return {
                "at": "2026-12-01T10:00:00.000Z",
                "session": SESSION,
                "what": what,
                "who": mallory,
                "action": {"type": what, "a": text, "b": text, "c": text},
            }

        for _ in range(100):  # about 3.3 KB each, however long the text
            await audit.record(SESSION, body("chat/turnStarted", "x" * 60_000))
        for _ in range(20):
            await audit.record(SESSION, body("chat/inputCompleted", "y" * 900))
        lines = [line async for line in export(huddle.server.parts.store, SESSION)]
    finally:
        await huddle.stop()

    whats = [r["what"] for r in records(lines)]
    assert sum(len(line) for line in lines) < 40_000 + 4_000
    assert whats.index("audit/reserve") == whats.count("chat/turnStarted")
    assert 0 < whats.count("chat/inputCompleted") < 20
    assert whats[-1] == "audit/full"
    totals = [r["bytes"] for r in records(lines)]
    assert totals == [sum(len(line) for line in lines[:i]) for i in range(len(lines))]
    assert verify(lines).records == len(lines)


async def test_an_export_is_charged_by_its_bytes_as_a_debt() -> None:
    # A slow refill: the debt must still be owed when the next request
    # comes, however long a loaded machine takes between the two.
    limits = Limits(action_burst=10, actions_per_second=0.1)
    huddle = await start_server(Settings(port=0, limits=limits))
    try:
        audit = huddle.server.parts.host.audit
        agent = await huddle.client("agent", name="agent")
        await session_chat_with_turn(agent, SESSION, TURN)
        for _ in range(60):  # 60 records of about 12 KB: 0 whole hundreds of records
            action = {"type": "chat/turnStarted", **{f"f{i}": "z" * 1000 for i in range(12)}}
            await audit.record(SESSION, {"session": SESSION, "what": "x", "action": action})
        token = huddle.token(name="Lee")
        exported = await http("GET", f"{huddle.http}/api/audit?session={SESSION}", token=token)
        after = await http("GET", f"{huddle.http}/api/snapshot?channel={SESSION}", token=token)
    finally:
        await huddle.stop()

    assert exported.status == 200
    assert len(exported.body) > 11 * 64 * 1024
    assert after.status == 429  # the export's 11+ units are more than the burst of 10


async def test_truncation_is_on_record_with_the_turns_it_removed(huddle: RunningServer) -> None:
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    await agent.dispatch_and_wait(chat, ChatTurnComplete(turn_id="t1", duration=1))
    second = ChatTurnStarted(
        turn_id="t2", started_at="2026-12-01T10:00:00.000Z", message=user_message("again")
    )
    await agent.dispatch_and_wait(chat, second)
    await agent.dispatch_and_wait(chat, ChatTruncated())
    truncated = records(await audit_of(huddle, AGENT_TOKEN))[-1]

    assert truncated["what"] == "chat/truncated"
    assert truncated["who"]["role"] == "agent"
    assert truncated["removed"] == {"turns": ["t1"], "activeTurn": "t2"}


async def test_a_participants_truncations_are_refused_past_their_share_and_the_agents_land() -> (
    None
):
    limits = Limits(action_burst=1000)
    huddle = await start_server(Settings(port=0, audit_max_records=290, limits=limits))
    try:
        agent = await huddle.client("agent", name="agent")
        chat = await session_chat_with_turn(agent, SESSION, TURN)
        await agent.dispatch_and_wait(chat, ChatTurnCancelled(turn_id="t1", duration=1))
        lee = await huddle.client(name="Lee")
        truncated, refused = 0, None
        for i in range(120):  # a turn, cancelled, truncated away: 3 records each
            turn = ChatTurnStarted(
                turn_id=f"l{i}", started_at="2026-12-01T10:00:00.000Z", message=user_message("x")
            )
            await lee.dispatch_and_wait(chat, turn)
            await lee.dispatch_and_wait(chat, ChatTurnCancelled(turn_id=f"l{i}", duration=1))
            try:
                await lee.dispatch_and_wait(chat, ChatTruncated(turn_id="t1"))  # Lee's own away
            except ActionRejected as error:
                refused = error
                break
            truncated += 1
        await agent.dispatch_and_wait(chat, ChatTruncated())
        lines = await audit_of(huddle, AGENT_TOKEN)
    finally:
        await huddle.stop()

    # A reserve of 29 records, a tenth of it Lee's: two truncations.
    assert truncated == 2
    assert refused is not None
    assert refused.code == "audit-share-used"
    whats = [r["what"] for r in records(lines)]
    assert whats.count("chat/truncated") == 3
    assert records(lines)[-1]["who"]["role"] == "agent"


# ─── Who may read it ─────────────────────────────────────────────────────────


async def test_who_may_read_a_sessions_audit(huddle: RunningServer) -> None:
    await asked(huddle)
    url = f"{huddle.http}/api/audit?session="

    observer = await http("GET", url + SESSION, token=huddle.token("observer"))
    elsewhere = await http(
        "GET", url + SESSION, token=huddle.token(sessions=["ahp-session:/other"])
    )
    unknown = await http("GET", url + "ahp-session:/nope", token=AGENT_TOKEN)
    chat = await http("GET", url + "ahp-chat:/x", token=AGENT_TOKEN)
    garbled = await http("GET", url + "not%20a%20uri", token=AGENT_TOKEN)
    scoped = await http("GET", url + SESSION, token=huddle.token(sessions=[SESSION]))

    assert observer.status == 403
    assert elsewhere.status == unknown.status == 404
    assert chat.status == garbled.status == 400
    assert scoped.status == 200
    assert 'filename="audit-audited.jsonl"' in scoped.headers["Content-Disposition"]


# ─── Checking a chain ────────────────────────────────────────────────────────


async def test_a_removed_altered_or_reordered_record_breaks_the_chain(
    huddle: RunningServer,
) -> None:
    chat = await asked(huddle)
    lee = await huddle.client(name="Lee")
    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(request_id="access", response="accept", answers={"system": text("a")}),
    )
    lines = await audit_of(huddle, AGENT_TOKEN)
    assert len(lines) == 3
    altered = lines[2].replace(b'"a"', b'"b"')

    with pytest.raises(AuditBroken, match="altered") as edited:
        verify([lines[0], lines[1], altered])
    with pytest.raises(AuditBroken, match="missing") as removed:
        verify([lines[0], lines[2]])
    with pytest.raises(AuditBroken, match="missing"):
        verify([lines[1], lines[0], lines[2]])
    with pytest.raises(AuditBroken, match="not JSON"):
        verify([b"{"])
    with pytest.raises(AuditBroken, match="no hash"):
        verify([b"{}"])
    with pytest.raises(AuditBroken, match="not a JSON object"):
        verify([b"[]"])
    assert (edited.value.line, removed.value.line) == (3, 2)
    assert verify([]).head == GENESIS


def test_a_record_numbered_out_of_place_or_of_another_session_is_caught() -> None:
    first, digest = seal({"session": "ahp-session:/a", "what": "x"}, 1, GENESIS)
    skipped, _ = seal({"session": "ahp-session:/a", "what": "y"}, 3, digest)
    other, _ = seal({"session": "ahp-session:/b", "what": "y"}, 2, digest)

    with pytest.raises(AuditBroken, match="record 3 where 2 belongs"):
        verify([first, skipped])
    with pytest.raises(AuditBroken, match="another session"):
        verify([first, other])


def test_a_line_with_a_key_given_twice_is_caught_and_one_written_otherwise_is_not() -> None:
    line, _ = seal(
        {"session": "ahp-session:/a", "what": "x", "who": {"role": "server"}}, 1, GENESIS
    )
    # A forged key before the real one: a parser keeping the first would
    # show it, the hash covers the last.
    forged = line.replace(b'"who":', b'"who":{"name":"bob","role":"agent"},"who":', 1)
    reformatted = line.replace(b",", b", ")

    assert verify([line]).records == 1
    assert verify([reformatted + b"\r\n"]).records == 1  # the same record, written otherwise
    with pytest.raises(AuditBroken, match="a key is given twice"):
        verify([forged])


async def test_the_command_line_exports_and_verifies(
    huddle: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await asked(huddle)
    await huddle.server.parts.host.audit.settled()
    out = tmp_path / "audit.jsonl"

    exported = await asyncio.to_thread(
        main,
        [
            "audit",
            "export",
            "audited",
            "--url",
            huddle.http,
            "--token",
            AGENT_TOKEN,
            "--out",
            str(out),
        ],
    )
    reported = capsys.readouterr().err
    head = reported.split("last hash ")[1].strip()
    verified = main(["audit", "verify", str(out), "--head", head])
    said = capsys.readouterr().out
    out.write_bytes(b"\n".join(out.read_bytes().splitlines()[:-2]) + b"\n")  # cut off the end
    intact_but_cut = main(["audit", "verify", str(out)])
    capsys.readouterr()
    caught = main(["audit", "verify", str(out), "--head", head])
    broken = capsys.readouterr().err

    assert exported == 0
    assert reported.startswith("2 records, last hash ")
    assert verified == 0
    assert said.startswith("ok: 2 records of ahp-session:/audited, chain intact")
    assert intact_but_cut == 0  # a chain alone cannot tell it was cut...
    assert caught == 1  # ...the head the export reported can
    assert "not the one the export reported" in broken


async def test_exporting_needs_the_agent_token_and_a_real_store(
    huddle: RunningServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HUDDLE_TOKEN", raising=False)
    no_token = await asyncio.to_thread(main, ["audit", "export", "audited", "--url", huddle.http])
    memory = await asyncio.to_thread(main, ["audit", "export", "audited", "--store", "memory"])
    wrong = await asyncio.to_thread(
        main, ["audit", "export", "audited", "--url", huddle.http, "--token", "nope"]
    )
    errors = capsys.readouterr().err
    unreachable = await asyncio.to_thread(
        main, ["audit", "export", "x", "--url", "http://127.0.0.1:9", "--token", "t"]
    )

    assert no_token == memory == wrong == unreachable == 2
    assert "needs the agent token" in errors
    assert "embedded store lives in its server" in errors
    assert "the server answered 401" in errors


# ─── Across processes, from the store ────────────────────────────────────────


@pytest.fixture
async def two_servers(redis_server: RedisServer) -> AsyncIterator[tuple[Served, Served]]:
    async with served_twice(redis_server) as both:
        yield both


@contextlib.asynccontextmanager
async def served_twice(redis: RedisServer, *flags: str) -> AsyncIterator[tuple[Served, Served]]:
    """Two ``huddle serve`` processes on ``redis`` (with ``flags``), no agent."""
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": redis.url, "HUDDLE_AGENT": "none"}
    first, second = await asyncio.gather(start(*flags, env=env), start(*flags, env=env))
    try:
        yield first, second
    finally:
        for served in (first, second):
            if served.process.returncode is None:
                served.process.terminate()
                await served.process.wait()


@pytest.mark.redis
async def test_two_processes_writing_one_session_keep_one_chain(
    two_servers: tuple[Served, Served], redis_server: RedisServer, tmp_path: Path
) -> None:
    a, b = (f"ws://127.0.0.1:{served.port}/ahp" for served in two_servers)
    mint = TokenAuthority(TOKEN).mint
    agent = await HuddleClient.connect(a, TOKEN)
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    request = InputRequest(
        id="r", questions=[TextQuestion(id=q, message=q) for q in ("one", "two")]
    )
    asking = asyncio.create_task(agent.request_input(chat, request))
    lee = await HuddleClient.connect(
        a, mint("participant", name="Lee", expires_at=time.time() + 600)
    )
    dana = await HuddleClient.connect(
        b, mint("participant", name="Dana", expires_at=time.time() + 600)
    )
    chat_mirror = await lee.subscribe(chat)
    async with asyncio.timeout(5 * UNIT):
        await chat_mirror.wait_for(
            lambda s: (
                isinstance(s, ChatState)
                and s.active_turn is not None
                and any(getattr(p, "request", None) for p in s.active_turn.response_parts)
            )
        )

    async def toggle(client: HuddleClient, question: str) -> None:
        for n in range(20):  # every change of state is a record
            state = "draft" if n % 2 == 0 else "submitted"
            await client.dispatch_and_wait(
                chat,
                ChatInputAnswerChanged(
                    request_id="r", question_id=question, answer=text(f"{n}", state)
                ),
            )

    await asyncio.gather(toggle(lee, "one"), toggle(dana, "two"))
    await lee.dispatch_and_wait(chat, ChatInputCompleted(request_id="r", response="accept"))
    await asking
    for client in (agent, lee, dana):
        await client.close()

    lines = await exported_once_stopped(two_servers, redis_server, tmp_path, SESSION)

    checked = verify(lines)
    kept = records(lines)
    assert checked.records == 2 + 40 + 1
    assert {r["who"].get("name") for r in kept if r["what"] == "chat/inputAnswerChanged"} == {
        "Lee",
        "Dana",
    }


async def exported_once_stopped(
    servers: tuple[Served, ...], redis: RedisServer, tmp_path: Path, session: str
) -> list[bytes]:
    """The session's audit as ``huddle audit export`` writes it from
    ``redis`` once ``servers`` stopped (a clean stop writes what is
    queued): its lines, the signed end last."""
    for served in servers:
        served.process.terminate()
        await served.process.wait()
    out = tmp_path / "audit.jsonl"
    code = await asyncio.to_thread(
        main, ["audit", "export", session, "--store", redis.url, "--out", str(out)]
    )
    assert code == 0
    return out.read_bytes().splitlines()


class LostAuditReply(MemoryStore):
    """A memory store that takes its second audit record and then fails as
    if its answer had been lost on the way (a Redis reply timed out)."""

    def __init__(self) -> None:
        super().__init__()
        self.appends = 0

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        await super().append_audit(session, n, record)
        self.appends += 1
        if self.appends == 2:
            raise StoreUnavailable("the store's answer was lost")


async def test_an_audit_record_whose_answer_was_lost_is_on_record_once() -> None:
    # The record stays first in line and is sent again: sealed anew on the
    # head the store then had, it was on record twice (an outside run: 9 of
    # 30 answers audited twice after a Redis stall).
    store = LostAuditReply()
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        for n in range(3):
            turn = replace(TURN, turn_id=f"t{n}")
            await host.dispatch(chat, turn)
            await host.dispatch(chat, ChatTurnComplete(turn_id=f"t{n}", duration=1))
        await host.audit.settled()
        lines = await store.read_audit(SESSION, 0, 100)
    finally:
        await host.stop()

    verify(lines)
    assert store.appends > 2
    on_record = [(r["what"], r["seq"]) for r in map(json.loads, lines)]
    assert on_record == [
        (what, seq)
        for seq, what in enumerate(["chat/turnStarted", "chat/turnComplete"] * 3, start=1)
    ]


class AuditDownAWhile(MemoryStore):
    """A memory store whose audit refuses ``refusals`` writes (Redis down)."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        if self.refusals > 0:
            self.refusals -= 1
            raise StoreUnavailable("down")
        await super().append_audit(session, n, record)


async def test_a_stop_goes_on_writing_the_audit_while_the_store_is_down_a_moment() -> None:
    # A SIGTERM while Redis was away: the records still queued were tried
    # once and lost with the process.
    store = AuditDownAWhile(refusals=4)
    host = Host(store, agents=default_agents())
    await host.start()
    chat = await host.create_session(SESSION)
    await host.dispatch(chat, TURN)
    await host.stop()

    assert store.refusals == 0
    [record] = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    assert record["what"] == "chat/turnStarted"


class AuditHung(MemoryStore):
    """A memory store whose audit writes are refused while ``down``; once
    ``hung`` is set, each write waits until ``hung`` of them wait at once
    (Redis hung: each waits out its timeout), then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.down, self.hung, self.waiting = True, 0, 0
        self.all_waiting = asyncio.Event()

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        if self.hung:
            self.waiting += 1
            if self.waiting >= self.hung:
                self.all_waiting.set()
            await self.all_waiting.wait()
            raise StoreUnavailable("timed out")
        if self.down:
            raise StoreUnavailable("down")
        await super().append_audit(session, n, record)


async def test_a_stop_tries_every_sessions_audit_at_once() -> None:
    # One after the other, a stop with Redis hung took a store timeout per
    # session still waiting to be written: minutes, for a busy server.
    store = AuditHung()
    host = Host(store, agents=default_agents())
    await host.start()
    sessions = [f"ahp-session:/hung-{n}" for n in range(3)]
    for session in sessions:
        await host.dispatch(await host.create_session(session), TURN)
    store.hung = len(sessions)
    async with asyncio.timeout(2 * UNIT):
        await host.audit.settled(until=time.monotonic())
    store.hung, store.down = 0, False
    await host.stop()

    for session in sessions:
        [record] = [json.loads(line) for line in await store.read_audit(session, 0, 100)]
        assert record["what"] == "chat/turnStarted"


async def test_records_a_stop_could_not_write_are_logged_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = AuditDownAWhile(refusals=1_000_000)
    host = Host(store, agents=default_agents())
    await host.start()
    await host.dispatch(await host.create_session(SESSION), TURN)
    await host.stop(until=time.monotonic())

    assert "audit: 1 records lost with the process" in caplog.text
    assert await store.read_audit(SESSION, 0, 100) == []


class AuditWritten(AuditDownAWhile):
    """AuditDownAWhile that says when a record is in."""

    def __init__(self, refusals: int) -> None:
        super().__init__(refusals)
        self.written = asyncio.Event()

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        await super().append_audit(session, n, record)
        self.written.set()


async def test_a_record_the_store_refused_is_written_without_waiting_for_the_next() -> None:
    # It waited for the session's next record (or the stop): a session whose
    # last decision met a Redis blip had it off the record for as long.
    store = AuditWritten(refusals=1)
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        await host.dispatch(await host.create_session(SESSION), TURN)
        async with asyncio.timeout(10 * UNIT):
            await store.written.wait()
        [record] = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    finally:
        await host.stop()

    assert record["what"] == "chat/turnStarted"


class Happenings(MemoryStore):
    """A memory store that notes each audit record once it is in, in
    ``happened``, which the :class:`Watching` subscriber writes to too."""

    def __init__(self) -> None:
        super().__init__()
        self.happened: list[str] = []

    async def append_audit(self, session: str, n: int, record: bytes) -> None:
        await super().append_audit(session, n, record)
        self.happened.append("recorded " + json.loads(record)["what"])


@dataclass(eq=False)
class Watching:
    """A subscriber noting each envelope it is sent."""

    happened: list[str]

    def send_frame(
        self, frame: OutFrame, session: str | None = None, channel: str | None = None
    ) -> None:
        action = json.loads(frame.payload)["params"]["action"]
        self.happened.append("shown " + action["type"])

    def resync(self, channel: str) -> None:
        raise AssertionError("no log is lost here")


async def test_an_action_is_shown_only_once_its_record_is_in_the_store() -> None:
    # Shown first (its sender's echo among them), then recorded: a kill -9
    # in between left an acknowledged action with no record.
    store = Happenings()
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        await host.core.subscribe(chat, Watching(store.happened))
        await host.dispatch(chat, TURN)
    finally:
        await host.stop()

    assert store.happened == ["recorded chat/turnStarted", "shown chat/turnStarted"]


async def test_no_action_is_accepted_while_its_sessions_audit_waits_in_memory() -> None:
    # Accepted all the same, each action's record joined a queue that only
    # this process held: a crash then lost every one of them.
    store = AuditDownAWhile(refusals=1_000_000)
    host = Host(store, agents=default_agents())
    await host.start()
    try:
        chat = await host.create_session(SESSION)
        await host.dispatch(chat, TURN)  # accepted as the audit's store failed
        with pytest.raises(StoreUnavailable):
            await host.dispatch(chat, ChatTurnComplete(turn_id="t1", duration=1))
        refused = (await host.view(chat)).state
        store.refusals = 0  # back
        await host.dispatch(chat, ChatTurnComplete(turn_id="t1", duration=1))
        records = [json.loads(line) for line in await store.read_audit(SESSION, 0, 100)]
    finally:
        await host.stop()

    assert isinstance(refused, ChatState)
    assert refused.active_turn is not None  # the completion was not taken
    assert [r["what"] for r in records] == ["chat/turnStarted", "chat/turnComplete"]


# ─── Signed by the server's key ──────────────────────────────────────────────


def _rehashed(lines: list[bytes]) -> list[bytes]:
    """What an editor with no key can do: renumber and rehash the records so
    the plain chain holds again (the signatures stay as they were)."""
    prev, out = GENESIS, []
    for n, line in enumerate(lines, 1):
        record = json.loads(line)
        sig = record.pop("sig", None)
        body = {key: value for key, value in record.items() if key not in {"n", "prev", "hash"}}
        sealed, prev = seal(body, n, prev)
        if sig is not None:
            sealed = canonical({**json.loads(sealed), "sig": sig})
        out.append(sealed)
    return out


async def test_a_signed_export_verifies_with_the_served_key_and_every_tamper_is_named(
    huddle: RunningServer,
) -> None:
    chat = await asked(huddle)
    lee = await huddle.client(name="Lee")
    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(request_id="access", response="accept", answers={"system": text("a")}),
    )
    await huddle.server.parts.host.audit.settled()
    exported = await http("GET", f"{huddle.http}/api/audit?session={SESSION}", token=AGENT_TOKEN)
    lines = exported.body.splitlines()
    *body, end = lines
    served = await http("GET", f"{huddle.http}/api/audit/key", token=AGENT_TOKEN)
    assert served.status == 200, served.body
    keys = read_public_keys(served.body.decode())
    checked = verify(lines, keys)
    assert (checked.records, checked.signed) == (len(body), len(body))
    assert checked.ended is not None

    who = [line.replace(b'"Lee"', b'"Eve"') for line in body]
    assert who != body
    with pytest.raises(AuditBroken) as renamed:
        verify([*_rehashed(who), end], keys)
    with pytest.raises(AuditBroken) as removed:
        verify([*_rehashed(body[:-1]), end], keys)
    with pytest.raises(AuditBroken) as cut:
        verify(body[:-1], keys)
    with pytest.raises(AuditBroken) as swapped:
        verify([body[1], body[0], *body[2:], end], keys)
    stranger = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(AuditBroken) as unknown:
        verify(lines, {key_id(stranger): stranger})
    # The plain chain alone is fooled by the rehash; the signatures are not.
    assert verify(_rehashed(who)).records == len(body)
    first_renamed = next(i for i, (a, b) in enumerate(zip(who, body, strict=True), 1) if a != b)
    assert renamed.value.line == first_renamed
    assert "altered and rehashed" in renamed.value.reason
    assert removed.value.line == 3
    assert "cut off the end" in removed.value.reason
    assert cut.value.line == 3
    assert "no signed end" in cut.value.reason
    assert (swapped.value.line, unknown.value.line) == (1, 1)
    assert "not one given" in unknown.value.reason


async def _served_key(served: Served) -> bytes:
    reply = await http("GET", f"http://127.0.0.1:{served.port}/api/audit/key", token=TOKEN)
    assert reply.status == 200, reply.body
    return reply.body


@pytest.mark.redis
async def test_a_generated_key_is_one_for_every_process_and_outlives_a_redis_restart(
    two_servers: tuple[Served, Served], redis_server: RedisServer
) -> None:
    # Two processes started at once both find no key: one generates it,
    # the other takes that one (kept with HSETNX), so an export signed by
    # either verifies with the key either serves.
    first, second = await asyncio.gather(*map(_served_key, two_servers))
    keys = read_public_keys(first.decode())
    assert len(keys) == 1
    assert second == first
    for served in two_servers:
        served.process.terminate()
        await served.process.wait()
    await redis_server.stop()
    async with asyncio.timeout(10 * UNIT):
        await redis_server.start()
    env = {"HUDDLE_TOKEN": TOKEN, "HUDDLE_STORE": redis_server.url, "HUDDLE_AGENT": "none"}
    again = await start(env=env)
    try:
        assert await _served_key(again) == first
    finally:
        again.process.terminate()
        await again.process.wait()
