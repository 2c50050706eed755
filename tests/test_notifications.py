"""Notifications (server.notify): Standard Webhooks to a real receiver that
verifies each signature with the ``standardwebhooks`` package, retries on
the hosts' own clock (moved by the tests; sweeps are called, not waited
for), 410 Gone, the Slack format, email to a real SMTP server, escalation,
and who may add endpoints where."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from protocol.actions import (
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallStart,
)
from protocol.chat import InputRequest
from server.auth import TokenAuthority
from server.cli import main
from server.client import HuddleClient
from server.config import Settings
from server.core.expiry import Expiry
from server.notify.endpoints import MAX_PER_TOKEN, Endpoints
from server.notify.outbox import AHEAD_GRACE, Notifier
from server.store.redis import RedisStore
from tests.conftest import (
    AGENT_TOKEN,
    UNIT,
    RunningServer,
    WallClock,
    session_chat_with_turn,
    start_server,
)
from tests.edge import http
from tests.notify_kit import (
    Received,
    Receiver,
    add_webhook,
    ask,
    ask_approval,
    receiving,
    smtp_server,
    verifies,
)
from tests.redis_server import RedisServer
from tests.test_trust import TURN

SESSION = "ahp-session:/notified"
QUIET = Settings(port=0, notify_interval=3600.0, public_url="https://huddle.example")
"""No sweep runs by itself: the tests call it."""


@pytest.fixture
async def quiet(clock: WallClock) -> AsyncIterator[RunningServer]:
    running = await start_server(QUIET, clock=clock)
    try:
        yield running
    finally:
        await running.stop()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with receiving() as receiving_one:
        yield receiving_one


def notifier_of(huddle: RunningServer) -> Notifier:
    return huddle.server.parts.notifier


async def agent_in_chat(huddle: RunningServer, session: str = SESSION) -> tuple[HuddleClient, str]:
    """An agent and the chat of a new session, a turn started in it."""
    agent = await huddle.client("agent", name="agent")
    return agent, await session_chat_with_turn(agent, session, TURN)


async def test_a_receiver_gets_each_event_once_with_a_valid_signature(
    quiet: RunningServer, receiver: Receiver
) -> None:
    added = await add_webhook(quiet, url=receiver.url)
    receiver.secret = added["secret"]
    assert added["secret"].startswith("whsec_")
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which region?")
    requested = await receiver.next()
    assert requested.verified is not None, requested.headers
    assert requested.json["type"] == "input.requested"
    data = requested.json["data"]
    assert (data["session"], data["chat"], data["requestId"]) == (SESSION, chat, "q1")
    assert data["message"] == "Which region?"
    assert data["link"].startswith("https://huddle.example/#/s/notified/c/")
    assert "token" not in data["link"]

    dana = await quiet.client("participant", name="Dana")
    await dana.dispatch_and_wait(chat, ChatInputCompleted(request_id="q1", response="decline"))
    completed = await receiver.next()
    assert completed.verified is not None
    assert completed.json["type"] == "input.completed"
    assert completed.json["data"]["settledBy"]["name"] == "Dana"
    assert completed.json["data"]["response"] == "decline"
    assert completed.headers["webhook-id"] != requested.headers["webhook-id"]

    await notifier_of(quiet).sweep()
    assert receiver.nothing_more()
    shown = await http("GET", f"{quiet.http}/api/webhooks/deliveries", token=AGENT_TOKEN)
    outcomes = {(d["type"], d["outcome"]) for d in shown.json()["deliveries"]}
    assert outcomes == {("input.requested", "delivered"), ("input.completed", "delivered")}


async def test_approvals_are_told_when_asked_and_when_decided(
    quiet: RunningServer, receiver: Receiver
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask_approval(agent, chat)
    asked = await receiver.next()
    assert asked.json["type"] == "approval.requested"
    assert asked.json["data"]["toolCallId"] == "deploy"
    assert asked.json["data"]["message"] == "Deploy to prod"
    lee = await quiet.client("participant", name="Lee")
    await lee.dispatch_and_wait(
        chat,
        ChatToolCallConfirmed(
            turn_id="t1", tool_call_id="deploy", approved=True, confirmed="user-action"
        ),
    )
    decided = await receiver.next()
    assert decided.verified is not None
    assert decided.json["type"] == "approval.decided"
    assert decided.json["data"]["approved"] is True
    assert decided.json["data"]["settledBy"]["name"] == "Lee"


async def test_an_endpoint_hears_only_the_events_and_sessions_it_names(
    quiet: RunningServer, receiver: Receiver
) -> None:
    await add_webhook(quiet, url=receiver.url, events=["input.completed"], sessions=["other"])
    both = await add_webhook(quiet, url=receiver.url, events=["input.completed"])
    receiver.secret = both["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    await agent.dispatch_and_wait(chat, ChatInputCompleted(request_id="q1", response="cancel"))
    got = await receiver.next()
    assert got.json["type"] == "input.completed"
    assert got.verified is not None
    await notifier_of(quiet).settled()
    assert receiver.nothing_more()


async def test_a_failing_receiver_is_tried_again_on_the_backoff(
    quiet: RunningServer, clock: WallClock
) -> None:
    async with receiving(answers=[500, 503]) as receiver:
        receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
        agent, chat = await agent_in_chat(quiet)
        await ask(agent, chat, "q1", "Which?")
        first = await receiver.next()
        await notifier_of(quiet).settled()
        await notifier_of(quiet).sweep()  # not due yet: nothing is sent
        assert receiver.nothing_more()
        clock.now += 5
        await notifier_of(quiet).sweep()
        second = await receiver.next()
        clock.now += 299
        await notifier_of(quiet).sweep()
        assert receiver.nothing_more()
        clock.now += 1
        await notifier_of(quiet).sweep()
        third = await receiver.next()
        assert third.verified is not None
        ids = {r.headers["webhook-id"] for r in (first, second, third)}
        assert len(ids) == 1
        shown = await http("GET", f"{quiet.http}/api/webhooks/deliveries", token=AGENT_TOKEN)
        (delivery,) = shown.json()["deliveries"]
        assert [a["status"] for a in delivery["attempts"]] == [500, 503, 200]
        assert delivery["outcome"] == "delivered"
        assert delivery["nextTry"] is None


async def test_a_delivery_can_be_sent_again(quiet: RunningServer, receiver: Receiver) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    first = await receiver.next()
    await notifier_of(quiet).settled()
    shown = await http("GET", f"{quiet.http}/api/webhooks/deliveries", token=AGENT_TOKEN)
    delivery = shown.json()["deliveries"][0]["id"]
    url = f"{quiet.http}/api/webhooks/deliveries/{delivery}/resend"
    assert (await http("POST", url, token=AGENT_TOKEN, body={})).status == 202
    again = await receiver.next()
    assert again.headers["webhook-id"] == first.headers["webhook-id"]
    assert again.verified is not None


async def test_410_gone_disables_the_endpoint(quiet: RunningServer) -> None:
    async with receiving(answers=[410]) as receiver:
        await add_webhook(quiet, url=receiver.url)
        agent, chat = await agent_in_chat(quiet)
        await ask(agent, chat, "q1", "Which?")
        await receiver.next()
        await notifier_of(quiet).settled()
        listed = await http("GET", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN)
        (endpoint,) = listed.json()["webhooks"]
        assert endpoint["disabled"] == "410 Gone"
        assert "secrets" not in endpoint
        await ask(agent, chat, "q2", "And?")
        await notifier_of(quiet).settled()
        await notifier_of(quiet).sweep()
        assert receiver.nothing_more()


async def test_a_slack_endpoint_gets_a_block_kit_message_with_a_button_to_the_chat(
    quiet: RunningServer, receiver: Receiver
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url, format="slack"))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Ship <it> & tell")
    got = await receiver.next()
    assert got.verified is not None
    message = got.json
    assert message["text"] == "Input requested: Ship <it> & tell"
    section, context, actions = message["blocks"]
    assert section["type"] == "section"
    assert section["text"] == {
        "type": "mrkdwn",
        "text": "*Input requested*\nShip &lt;it&gt; &amp; tell",
    }
    assert context["type"] == "context"
    assert SESSION in context["elements"][0]["text"]
    (button,) = actions["elements"]
    assert button["type"] == "button"
    assert button["url"].startswith("https://huddle.example/#/s/notified/c/")


async def escalated_after(
    huddle: RunningServer, receiver: Receiver, clock: WallClock, seconds: float
) -> Received:
    """The one ``input.escalated`` the receiver gets ``seconds`` on, not before
    and never again."""
    notifier = notifier_of(huddle)
    await notifier.settled()
    clock.now += seconds - 1
    await notifier.sweep()
    assert receiver.nothing_more()
    clock.now += 1
    await notifier.sweep()
    escalated = await receiver.next()
    assert escalated.verified is not None
    assert escalated.json["type"] == "input.escalated"
    clock.now += 3600
    await notifier.sweep()
    assert receiver.nothing_more()
    return escalated


async def test_a_wait_still_open_escalates_once(
    quiet: RunningServer, receiver: Receiver, clock: WallClock
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url, escalateAfter=60))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "open", "Still there?")
    await ask(agent, chat, "answered", "Quick one")
    assert {(await receiver.next()).json["type"] for _ in range(2)} == {"input.requested"}
    await agent.dispatch_and_wait(
        chat, ChatInputCompleted(request_id="answered", response="cancel")
    )
    assert (await receiver.next()).json["type"] == "input.completed"
    escalated = await escalated_after(quiet, receiver, clock, 60)
    assert escalated.json["data"]["requestId"] == "open"


async def test_an_invited_person_gets_the_request_and_a_sign_in_link_by_email(
    clock: WallClock,
) -> None:
    async with smtp_server() as (mailbox, port):
        settings = Settings(
            port=0,
            notify_interval=3600.0,
            public_url="https://huddle.example",
            smtp_url=f"smtp://127.0.0.1:{port}",
            token=AGENT_TOKEN,
        )
        huddle = await start_server(settings, clock=clock)
        try:
            invite = {"email": "dana@example.com", "name": "Dana", "sessions": ["notified"]}
            url = f"{huddle.http}/api/invites/email"
            assert (await http("POST", url, token=AGENT_TOKEN, body=invite)).status == 204
            agent, chat = await agent_in_chat(huddle)
            await ask(agent, chat, "q1", "Which region?")
            mail = await mailbox.next()
        finally:
            await huddle.stop()
    assert mail["To"] == "dana@example.com"
    assert "Which region?" in mail["Subject"]
    text = mail.get_payload(decode=True)
    assert isinstance(text, bytes)
    (link,) = [w for w in text.decode().split() if w.startswith("https://huddle.example/?token=")]
    token, _, route = link.removeprefix("https://huddle.example/?token=").partition("#")
    grant = TokenAuthority(AGENT_TOKEN).verify(token, clock.now)
    assert (grant.name, grant.role, grant.sessions) == ("Dana", "participant", frozenset({SESSION}))
    assert route.startswith("/s/notified/c/")


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("ftp://example.com/hook", id="not-http"),
        pytest.param("file:///etc/passwd", id="file"),
        pytest.param("http:///nohost", id="no-host"),
        pytest.param("SELF", id="the-server-itself"),
        pytest.param("SELF-LOCALHOST", id="the-server-by-localhost"),
        pytest.param("https://huddle.example/api/tokens", id="its-public-url"),
    ],
)
async def test_a_url_that_is_not_http_or_points_at_the_server_is_refused(
    quiet: RunningServer, url: str
) -> None:
    url = url.replace("SELF-LOCALHOST", f"http://localhost:{quiet.port}/api/dispatch")
    url = url.replace("SELF", f"http://127.0.0.1:{quiet.port}/api/sessions")
    reply = await http("POST", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN, body={"url": url})
    assert reply.status == 400, reply.body
    listed = await http("GET", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN)
    assert listed.json()["webhooks"] == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/webhooks"),
        ("GET", "/api/webhooks"),
        ("DELETE", "/api/webhooks/wh_x"),
        ("GET", "/api/webhooks/deliveries"),
        ("POST", "/api/invites/email"),
    ],
)
async def test_participants_may_not_manage_webhooks(
    quiet: RunningServer, method: str, path: str
) -> None:
    token = quiet.token("participant", name="Dana")
    body = {"url": "http://example.com/hook"} if method == "POST" else None
    reply = await http(method, f"{quiet.http}{path}", token=token, body=body)
    assert reply.status == 403, reply.body


async def test_an_endpoint_removed_gets_nothing_more(
    quiet: RunningServer, receiver: Receiver
) -> None:
    added = await add_webhook(quiet, url=receiver.url)
    url = f"{quiet.http}/api/webhooks/{added['id']}"
    assert (await http("DELETE", url, token=AGENT_TOKEN)).status == 204
    assert (await http("DELETE", url, token=AGENT_TOKEN)).status == 404
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    await notifier_of(quiet).settled()
    await notifier_of(quiet).sweep()
    assert receiver.nothing_more()


async def test_a_wait_that_expires_is_told_as_expired(
    quiet: RunningServer, receiver: Receiver, clock: WallClock
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Anyone?")
    assert (await receiver.next()).json["type"] == "input.requested"
    host = quiet.server.parts.host
    await host.expire(chat, "requests", "q1", Expiry(60))
    clock.now += 61
    assert await host.expiries.sweep() == 1
    expired = await receiver.next()
    assert expired.verified is not None
    assert expired.json["type"] == "wait.expired"
    assert expired.json["data"]["settledBy"] is None
    assert expired.json["data"]["requestId"] == "q1"


# ─── Durable, and once, with Redis ───────────────────────────────────────────


def without_hook(huddle: RunningServer) -> None:
    """As if the process died between an append and its hooks: the event
    written ahead of the append is all that is left of it."""
    notifier = notifier_of(huddle)
    huddle.server.parts.host.hooks.reactions.remove(notifier.hook)


@pytest.mark.redis
async def test_an_event_whose_process_died_after_the_append_is_sent_after_a_restart(
    redis_server: RedisServer, receiver: Receiver, clock: WallClock
) -> None:
    first = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
    try:
        receiver.secret = (await add_webhook(first, url=receiver.url))["secret"]
        without_hook(first)
        agent, chat = await agent_in_chat(first)
        await ask(agent, chat, "q1", "Which?")
    finally:
        await first.stop()
    assert receiver.nothing_more()
    clock.now += AHEAD_GRACE
    second = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
    try:
        assert await notifier_of(second).sweep() == 1
        got = await receiver.next()
        await notifier_of(second).sweep()
    finally:
        await second.stop()
    assert got.verified is not None
    assert (got.json["type"], got.json["data"]["chat"]) == ("input.requested", chat)
    assert receiver.nothing_more()


@pytest.mark.redis
async def test_a_delivery_that_failed_before_a_restart_is_tried_again_after_it(
    redis_server: RedisServer, clock: WallClock
) -> None:
    async with receiving(answers=[503]) as receiver:
        first = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
        try:
            receiver.secret = (await add_webhook(first, url=receiver.url))["secret"]
            agent, chat = await agent_in_chat(first)
            await ask(agent, chat, "q1", "Which?")
            failed = await receiver.next()
            await notifier_of(first).settled()
        finally:
            await first.stop()
        clock.now += 5
        second = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
        try:
            await notifier_of(second).sweep()
            again = await receiver.next()
        finally:
            await second.stop()
    assert again.verified is not None
    assert again.headers["webhook-id"] == failed.headers["webhook-id"]


@pytest.mark.redis
async def test_two_processes_on_one_redis_send_each_event_once(
    redis_server: RedisServer, receiver: Receiver, clock: WallClock
) -> None:
    a = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
    b = await start_server(QUIET, RedisStore(redis_server.url), clock=clock)
    try:
        receiver.secret = (await add_webhook(a, url=receiver.url))["secret"]
        for huddle in (a, b):
            without_hook(huddle)  # left to the sweeps, which both run at once
        chats = []
        for n, huddle in enumerate((a, b, a)):
            agent, chat = await agent_in_chat(huddle, f"{SESSION}-{n}")
            await ask(agent, chat, "q1", f"Question {n}")
            chats.append(chat)
        clock.now += AHEAD_GRACE
        for _ in range(3):
            await asyncio.gather(notifier_of(a).sweep(), notifier_of(b).sweep())
        got = [await receiver.next() for _ in chats]
        await asyncio.gather(notifier_of(a).sweep(), notifier_of(b).sweep())
    finally:
        await a.stop()
        await b.stop()
    assert sorted(r.json["data"]["chat"] for r in got) == sorted(chats)
    assert all(r.verified is not None for r in got)
    assert receiver.nothing_more()


# ─── The command line ────────────────────────────────────────────────────────


async def test_huddle_webhook_adds_lists_and_removes_on_a_running_server(
    quiet: RunningServer, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    reach = ["--url", quiet.http, "--token", AGENT_TOKEN]
    add = ["webhook", "add", receiver.url, "--format", "slack", "--escalate-after", "90", *reach]
    assert await asyncio.to_thread(main, add) == 0
    endpoint, secret_line = capsys.readouterr().out.splitlines()
    assert secret_line.startswith("secret (shown this once): whsec_")
    assert await asyncio.to_thread(main, ["webhook", "list", *reach]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"{endpoint} {receiver.url} ")
    assert "format=slack" in listed
    assert "escalateAfter=90.0" in listed
    assert "whsec_" not in listed
    assert await asyncio.to_thread(main, ["webhook", "remove", endpoint, *reach]) == 0
    assert await asyncio.to_thread(main, ["webhook", "remove", endpoint, *reach]) == 2
    assert "404" in capsys.readouterr().err
    participant = ["--url", quiet.http, "--token", quiet.token("participant", name="Dana")]
    assert await asyncio.to_thread(main, ["webhook", "list", *participant]) == 2
    assert "403" in capsys.readouterr().err


@pytest.mark.redis
async def test_huddle_webhook_adds_to_the_store_what_a_server_on_it_sends_to(
    redis_server: RedisServer, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    add = ["webhook", "add", receiver.url, "--store", redis_server.url]
    assert await asyncio.to_thread(main, add) == 0
    receiver.secret = capsys.readouterr().out.split()[-1]
    bad = ["webhook", "add", "gopher://example.com", "--store", redis_server.url]
    assert await asyncio.to_thread(main, bad) == 2
    assert "http" in capsys.readouterr().err
    huddle = await start_server(QUIET, RedisStore(redis_server.url))
    try:
        agent, chat = await agent_in_chat(huddle)
        await ask(agent, chat, "q1", "Which?")
        got = await receiver.next()
    finally:
        await huddle.stop()
    assert got.verified is not None


async def test_huddle_invite_email_tells_the_server_whom_to_email(
    quiet: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    invite = ["invite", "Dana", "--email", "dana@example.com", "--session", "notified"]
    invite += ["--url", quiet.http, "--token", AGENT_TOKEN]
    assert await asyncio.to_thread(main, invite) == 0
    assert capsys.readouterr().out.startswith(f"{quiet.http}/?token=")
    (kept,) = await notifier_of(quiet).endpoints.invites()
    assert (kept.email, kept.name, kept.sessions) == ("dana@example.com", "Dana", [SESSION])


# ─── Bounds, rotation, slow endpoints ────────────────────────────────────────


async def test_a_slow_endpoint_never_slows_the_chat(
    quiet: RunningServer, receiver: Receiver
) -> None:
    receiver.gate = asyncio.Event()
    await add_webhook(quiet, url=receiver.url)
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    await receiver.next()  # held: the endpoint has not answered
    host = quiet.server.parts.host
    # The in-process API returns once an action's follow-ups are done: a
    # send among them would hold it for as long as the endpoint does.
    async with asyncio.timeout(10 * UNIT):
        await host.dispatch(chat, ChatInputRequested(request=InputRequest(id="q2")))
        await host.dispatch(chat, ChatInputCompleted(request_id="q2", response="cancel"))
    assert not receiver.gate.is_set()
    receiver.gate.set()
    await notifier_of(quiet).settled()


async def test_during_a_rotation_both_secrets_sign(
    quiet: RunningServer, receiver: Receiver, clock: WallClock
) -> None:
    added = await add_webhook(quiet, url=receiver.url)
    url = f"{quiet.http}/api/webhooks/{added['id']}/secret"
    rotated = (await http("POST", url, token=AGENT_TOKEN)).json()["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    got = await receiver.next()
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    assert verifies(added["secret"], got)
    assert verifies(rotated, got)
    clock.now += 24 * 3600
    await ask(agent, chat, "q2", "And?")
    later = await receiver.next()
    assert verifies(rotated, later)
    assert not verifies(added["secret"], later)


async def test_five_days_of_failures_disable_the_endpoint(
    quiet: RunningServer, clock: WallClock
) -> None:
    async with receiving(answers=[500] * 20) as receiver:
        await add_webhook(quiet, url=receiver.url)
        agent, chat = await agent_in_chat(quiet)
        notifier = notifier_of(quiet)
        await ask(agent, chat, "q1", "Which?")
        await receiver.next()
        await notifier.settled()
        clock.now += 4 * 86400
        await ask(agent, chat, "q2", "Still?")
        await receiver.next()
        await notifier.settled()
        listed = await http("GET", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN)
        assert listed.json()["webhooks"][0].get("disabled") is None
        clock.now += 86400
        await notifier.sweep()  # every delivery due: tried, failing
        listed = await http("GET", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN)
        assert listed.json()["webhooks"][0]["disabled"] == "failing for 5 days"


async def test_a_token_adds_a_bounded_number_of_endpoints(quiet: RunningServer) -> None:
    for n in range(MAX_PER_TOKEN):
        await add_webhook(quiet, url=f"https://example.com/{n}")
    body = {"url": "https://example.com/more"}
    reply = await http("POST", f"{quiet.http}/api/webhooks", token=AGENT_TOKEN, body=body)
    assert reply.status == 409
    assert f"at most {MAX_PER_TOKEN}" in reply.json()["error"]


async def test_a_full_outbox_drops_new_events_and_keeps_the_chat_going(
    quiet: RunningServer, receiver: Receiver
) -> None:
    receiver.answers = [500]
    await add_webhook(quiet, url=receiver.url)
    notifier = notifier_of(quiet)
    notifier.max_outbox = 1
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")  # failing: it stays in the outbox
    await receiver.next()
    await notifier.settled()
    await ask(agent, chat, "q2", "And?")
    await notifier.settled()
    assert receiver.nothing_more()
    shown = await http("GET", f"{quiet.http}/api/webhooks/deliveries", token=AGENT_TOKEN)
    assert [(d["type"], d["outcome"]) for d in shown.json()["deliveries"]] == [
        ("input.requested", "pending")
    ]


async def test_a_request_the_server_withdraws_is_completed_not_expired(
    quiet: RunningServer, receiver: Receiver
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Anyone?")
    await receiver.next()
    host = quiet.server.parts.host
    await host.dispatch(chat, ChatInputCompleted(request_id="q1", response="cancel"))
    withdrawn = await receiver.next()
    assert withdrawn.json["type"] == "input.completed"
    assert withdrawn.json["data"]["settledBy"] is None


async def test_an_approval_that_expires_is_told_as_expired(
    quiet: RunningServer, receiver: Receiver, clock: WallClock
) -> None:
    receiver.secret = (await add_webhook(quiet, url=receiver.url))["secret"]
    agent, chat = await agent_in_chat(quiet)
    await ask_approval(agent, chat)
    assert (await receiver.next()).json["type"] == "approval.requested"
    host = quiet.server.parts.host
    await host.expire(chat, "toolCalls", "deploy", Expiry(60, "decline"))
    clock.now += 61
    assert await host.expiries.sweep() == 1
    expired = await receiver.next()
    assert expired.verified is not None
    assert (expired.json["type"], expired.json["data"]["toolCallId"]) == ("wait.expired", "deploy")
    assert expired.json["data"]["approved"] is False


async def test_a_request_asked_again_under_a_settled_ones_id_is_another_event(
    quiet: RunningServer, receiver: Receiver
) -> None:
    await add_webhook(quiet, url=receiver.url, events=["input.requested"])
    agent, chat = await agent_in_chat(quiet)
    await ask(agent, chat, "q1", "Which?")
    await agent.dispatch_and_wait(chat, ChatInputCompleted(request_id="q1", response="cancel"))
    await ask(agent, chat, "q1", "Which, again?")
    first, second = await receiver.next(), await receiver.next()
    assert second.json["data"]["message"] == "Which, again?"
    assert first.headers["webhook-id"] != second.headers["webhook-id"]


@pytest.mark.redis
async def test_every_kind_of_target_gets_each_event_once_from_two_processes_after_a_restart(
    redis_server: RedisServer, clock: WallClock
) -> None:
    async with receiving() as standard, receiving() as slack, smtp_server() as (mailbox, port):
        settings = Settings(
            port=0,
            notify_interval=3600.0,
            smtp_url=f"smtp://127.0.0.1:{port}",
            token=AGENT_TOKEN,
        )
        first = await start_server(settings, RedisStore(redis_server.url), clock=clock)
        try:
            standard.secret = (await add_webhook(first, url=standard.url))["secret"]
            slack.secret = (await add_webhook(first, url=slack.url, format="slack"))["secret"]
            invite = {"email": "dana@example.com", "name": "Dana"}
            url = f"{first.http}/api/invites/email"
            assert (await http("POST", url, token=AGENT_TOKEN, body=invite)).status == 204
            without_hook(first)
            agent, chat = await agent_in_chat(first)
            await ask(agent, chat, "q1", "Which?")
        finally:
            await first.stop()  # as if killed after the append: nothing was sent
        clock.now += AHEAD_GRACE
        a = await start_server(settings, RedisStore(redis_server.url), clock=clock)
        b = await start_server(settings, RedisStore(redis_server.url), clock=clock)
        try:
            for _ in range(3):
                await asyncio.gather(notifier_of(a).sweep(), notifier_of(b).sweep())
            got = (await standard.next(), await slack.next(), await mailbox.next())
        finally:
            await a.stop()
            await b.stop()
    assert got[0].verified is not None
    assert got[1].verified is not None
    assert got[1].json["text"] == "Input requested: Which?"
    assert got[2]["To"] == "dana@example.com"
    assert standard.nothing_more()
    assert slack.nothing_more()
    assert mailbox.got.empty()


@pytest.mark.redis
async def test_an_endpoint_in_the_store_that_points_at_the_server_is_never_sent_to(
    redis_server: RedisServer, receiver: Receiver
) -> None:
    # Added to the store before the server's --public-url said it was there.
    endpoints = Endpoints(RedisStore(redis_server.url))
    await endpoints.add("cli", receiver.url, own=[], now=0.0)
    await endpoints.store.close()
    settings = Settings(port=0, notify_interval=3600.0, public_url=receiver.url)
    huddle = await start_server(settings, RedisStore(redis_server.url))
    try:
        agent, chat = await agent_in_chat(huddle)
        await ask(agent, chat, "q1", "Which?")
        await notifier_of(huddle).settled()
        shown = await http("GET", f"{huddle.http}/api/webhooks/deliveries", token=AGENT_TOKEN)
    finally:
        await huddle.stop()
    assert receiver.nothing_more()
    (delivery,) = shown.json()["deliveries"]
    assert delivery["outcome"] == "disabled"
    assert delivery["attempts"][0]["error"] == "url points at this server itself"


async def test_an_approval_asks_for_its_own_escalation(
    quiet: RunningServer, receiver: Receiver, clock: WallClock
) -> None:
    events = ["approval.requested", "input.escalated"]
    receiver.secret = (await add_webhook(quiet, url=receiver.url, events=events))["secret"]
    agent, chat = await agent_in_chat(quiet)
    start = ChatToolCallStart(turn_id="t1", tool_call_id="rm", tool_name="rm", display_name="rm")
    await agent.dispatch_and_wait(chat, start)
    ready = ChatToolCallReady(
        turn_id="t1",
        tool_call_id="rm",
        invocation_message="Remove the backups",
        meta={"huddle": {"escalateAfter": 30}},
    )
    await agent.dispatch_and_wait(chat, ready)
    assert (await receiver.next()).json["type"] == "approval.requested"
    escalated = await escalated_after(quiet, receiver, clock, 30)
    assert escalated.json["data"]["toolCallId"] == "rm"
