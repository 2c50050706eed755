"""People sign in as themselves (docs/sign-in.md): through a real OpenID
provider (npm's oidc-provider, tests/oidc_kit.py) in Chromium and over plain
HTTP, and behind an auth proxy. The person is then the token's subject
wherever the server names who did something; a forged or misdirected ID
token, a foreign page's socket and an untrusted proxy header get nobody in.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, expect
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from server.auth import MAX_SUBJECT, Person, RoleMap, person_id
from server.cli import build_parser, main
from server.config import Settings, settings_from
from server.edge.signin import PROXY_ISSUER, SESSION_COOKIE
from tests import test_web_client as web
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, start_server
from tests.edge import Peer, eventually, initialize_params
from tests.notify_kit import Receiver, add_webhook, receiving
from tests.oidc_kit import Provider, oidc_settings, sign_in, signed_in_server
from tests.test_web_client import create_session, session_href
from tests.test_web_people import FORM, ask, here, request_note

browser = web.browser

DANA = {"name": "Dana Scully", "email": "dana@example.com"}


@pytest.fixture
async def provided() -> AsyncIterator[tuple[RunningServer, Provider]]:
    async with signed_in_server() as both:
        yield both


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10 * UNIT) as client:
        yield client


async def audit_of(running: RunningServer, session: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=running.http, timeout=10 * UNIT) as agent:
        answer = await agent.get(
            "/api/audit",
            params={"session": session},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )
    answer.raise_for_status()
    return [json.loads(line) for line in answer.text.splitlines() if line]


async def agent_waits(running: RunningServer, chat: str) -> httpx.Response:
    """The agent's long poll for the answer to FORM in ``chat``."""
    async with httpx.AsyncClient(base_url=running.http, timeout=20 * UNIT) as agent:
        return await agent.get(
            "/api/input/wait",
            params={"chat": chat, "request": FORM.id, "timeout": str(15 * UNIT)},
            headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
        )


async def identity_over(running: RunningServer, headers: dict[str, str]) -> dict[str, Any]:
    """Who the server takes a socket opened with ``headers`` for (its
    ``initialize`` answer's identity); InvalidStatus when it is refused."""
    async with connect(running.ws, additional_headers=headers, proxy=None) as ws:
        peer = Peer(ws, "who-am-i")
        reply = await peer.request(
            "initialize", initialize_params("who-am-i", extensions=("huddle.identity",))
        )
    identity: dict[str, Any] = reply["result"]["_meta"]["huddle"]["identity"]
    return identity


def signed_in_socket(running: RunningServer, http: httpx.AsyncClient, origin: str | None) -> Any:
    headers = {"Cookie": f"{SESSION_COOKIE}={http.cookies[SESSION_COOKIE]}"}
    if origin is not None:
        headers["Origin"] = origin
    return identity_over(running, headers)


# ─── Roles from groups ───────────────────────────────────────────────────────

ONCALL_OR_ANYONE = ("participant=eng-oncall", "observer=*")


@pytest.mark.parametrize(
    ("rules", "groups", "role"),
    [
        pytest.param(ONCALL_OR_ANYONE, ["eng-oncall"], "participant", id="first-match"),
        pytest.param(ONCALL_OR_ANYONE, ["staff", "eng-oncall"], "participant", id="any-group"),
        pytest.param(ONCALL_OR_ANYONE, ["staff"], "observer", id="star-catches-the-rest"),
        pytest.param(ONCALL_OR_ANYONE, [], "observer", id="star-catches-no-groups"),
        pytest.param(
            ("observer=*", "participant=eng-oncall"), ["eng-oncall"], "observer", id="order"
        ),
        pytest.param(("participant=eng-oncall",), ["staff"], None, id="unmapped"),
        pytest.param((), [], "participant", id="no-rules-everyone"),
    ],
)
def test_the_first_role_rule_a_person_s_groups_match_gives_the_role(
    rules: tuple[str, ...], groups: list[str], role: str | None
) -> None:
    assert RoleMap.parse(rules).role_of(groups) == role


@pytest.mark.parametrize(
    "rule", ["agent=admins", "participant", "participant=", "owner=eng"], ids=str
)
def test_a_role_rule_that_gives_no_person_s_role_is_refused(rule: str) -> None:
    with pytest.raises(ValueError, match="participant=GROUP or observer=GROUP"):
        RoleMap.parse([rule])


@pytest.mark.parametrize(
    ("name", "email", "shown", "kept_email"),
    [
        ("Dana Scully", "dana@example.com", "Dana Scully", "dana@example.com"),
        ("Eve\u202egnp.exe", None, "Evegnp.exe", None),  # a directory's bidi override goes
        (None, "dana@example.com", "dana@example.com", "dana@example.com"),
        ("", "x" * 300 + "@example.com", "dana", None),  # too long to be an email
        ("Dana", "dana@example.com\n", "Dana", None),
    ],
    ids=["as-said", "bidi-override", "no-name", "long-email", "control-in-email"],
)
def test_a_person_is_recorded_as_their_issuer_said_made_fit_to_show(
    name: str | None, email: str | None, shown: str, kept_email: str | None
) -> None:
    person = Person.vouched("https://id.example", "dana", name, email, [])

    assert (person.name, person.email) == (shown, kept_email)


@pytest.mark.parametrize("subject", ["", "s" * (MAX_SUBJECT + 1)], ids=["empty", "too-long"])
def test_a_subject_unfit_to_name_a_person_is_refused(subject: str) -> None:
    with pytest.raises(ValueError, match="subject"):
        Person.vouched("https://id.example", subject, "Dana", None, [])


# ─── Signing in through the provider ─────────────────────────────────────────


async def dana_answers(
    page: Page, running: RunningServer, chat: str, receiver: Receiver, provider: Provider
) -> None:
    """Dana, signed in, answers the form asked in ``chat``: the audit, the
    session's notes, the waiting agent and the webhook all name her, with
    her email and the issuer that vouches for her."""
    session = await running.server.parts.host.session_of(chat)
    assert session is not None
    waited = asyncio.create_task(agent_waits(running, chat))
    await eventually(lambda: running.server.parts.host.waiters.waiting_on(chat) > 0)
    system = page.get_by_label("Affected system")
    await system.fill("SSO")
    await system.press("Tab")
    await page.get_by_role("button", name="Submit").click()
    await expect(page.locator("section.request .outcome")).to_have_text(
        "Submitted by Dana Scully (dana@example.com)"
    )

    dana = {
        **DANA,
        "role": "participant",
        "issuer": provider.issuer,
        "token": person_id(provider.issuer, "dana"),
    }
    records = await audit_of(running, session)
    record = next(r for r in records if r["what"] == "chat/inputCompleted")
    assert record["who"] == dana
    assert (await request_note(running, session, chat))["completed"]["by"] == dana
    assert (await waited).json()["who"] == dana  # what the agent waiting is told

    requested = await receiver.next()
    assert requested.json["type"] == "input.requested"
    told = await receiver.next()
    assert told.verified is not None
    assert told.json["type"] == "input.completed"
    assert told.json["data"]["settledBy"] == dana  # what the webhook tells


@pytest.mark.browser
async def test_a_person_signs_in_with_chromium_answers_and_is_named_by_the_server(
    browser: Browser, provided: tuple[RunningServer, Provider]
) -> None:
    running, provider = provided
    base = running.http
    session, chat = await create_session(base, "Signed in")
    context = await browser.new_context()
    context.set_default_timeout(web.WAIT_MS)
    page = await context.new_page()

    # No token link: the web client sends the browser to the provider's login page.
    await page.goto(base + "/")
    await page.locator("input[name=login]").fill("dana")
    await page.locator("input[name=password]").fill("any password")
    await page.get_by_role("button", name="Sign-in").click()
    await page.get_by_role("button", name="Continue").click()  # the provider's consent
    await expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    cookie = next(c for c in await context.cookies() if c["name"] == SESSION_COOKIE)
    assert (cookie["httpOnly"], cookie["sameSite"], cookie["secure"]) == (True, "Lax", False)

    await page.goto(base + session_href(session))
    await expect(here(page)).to_have_text(["Dana Scully (dana@example.com)"])
    async with receiving() as receiver:
        receiver.secret = (await add_webhook(running, url=receiver.url))["secret"]
        await ask(running, chat, FORM)
        await dana_answers(page, running, chat, receiver, provider)

    await page.get_by_role("link", name="Sign out").click()
    await expect(page.get_by_text("You are signed out")).to_be_visible()
    assert SESSION_COOKIE not in {c["name"] for c in await context.cookies()}
    # The provider's own session stays: signing in again asks nothing.
    await page.goto(base + "/")
    await expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    await context.close()


@pytest.mark.parametrize(("proto", "secure"), [("https", True), ("http", False)])
async def test_the_session_cookie_is_secure_when_the_browser_came_over_https(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient, proto: str, secure: bool
) -> None:
    running, _ = provided
    # uvicorn believes X-Forwarded-Proto from 127.0.0.1 (FORWARDED_ALLOW_IPS), as
    # from a TLS proxy in front of it.
    login = await http.get(f"{running.http}/login", headers={"X-Forwarded-Proto": proto})

    assert login.status_code == 302
    cookie = login.headers["set-cookie"].lower()
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert ("httponly" in cookie, "samesite=lax" in cookie) == (True, True)
    assert ("; secure" in cookie) == secure
    assert f"redirect_uri={proto}%3A%2F%2F127.0.0.1" in login.headers["location"]


@pytest.mark.parametrize("how", ["aud", "nonce", "signature"])
async def test_an_id_token_for_another_audience_nonce_or_key_gets_nobody_in(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient, how: str
) -> None:
    running, provider = provided
    await provider.tamper(how)

    refused = await sign_in(http, running.http, "dana")

    assert refused.status_code == 401
    assert "did not go through" in refused.text
    assert (await http.get(f"{running.http}/api/audit/key")).status_code == 401
    # The same person, the same browser, an untouched token: in.
    assert (await sign_in(http, running.http, "dana")).status_code == 200
    assert (await http.get(f"{running.http}/api/audit/key")).status_code == 200


@pytest.mark.parametrize(
    ("login", "role"), [("dana", "participant"), ("olly", "observer")], ids=["oncall", "staff"]
)
async def test_a_person_s_groups_give_their_role(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient, login: str, role: str
) -> None:
    running, provider = provided
    assert (await sign_in(http, running.http, login)).status_code == 200

    identity = await signed_in_socket(running, http, running.http)

    assert (identity["role"], identity["issuer"]) == (role, provider.issuer)
    assert identity["token"] == person_id(provider.issuer, login)


async def test_a_person_no_group_takes_is_told_so_and_gets_nothing(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient
) -> None:
    running, _ = provided

    refused = await sign_in(http, running.http, "nina")

    assert refused.status_code == 403
    assert "signed in as Nina Nobody (nina@example.com)" in refused.text
    assert "none of your groups is given a role" in refused.text
    assert (await http.get(f"{running.http}/api/audit/key")).status_code == 401


@pytest.mark.parametrize(
    "origin", ["http://evil.example", "http://127.0.0.1:1", None], ids=["site", "port", "none"]
)
async def test_a_socket_with_the_cookie_from_another_origin_is_refused(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient, origin: str | None
) -> None:
    running, _ = provided
    await sign_in(http, running.http, "dana")
    assert (await signed_in_socket(running, http, running.http))["email"] == DANA["email"]

    with pytest.raises(InvalidStatus) as refused:
        await signed_in_socket(running, http, origin)

    assert refused.value.response.status_code == 403


async def test_every_process_of_the_agent_token_reads_the_cookie_and_none_a_forged_one(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient
) -> None:
    running, provider = provided
    await sign_in(http, running.http, "dana")
    cookie = http.cookies[SESSION_COOKIE]
    forged = cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB")
    other = await start_server(oidc_settings(provider.issuer))  # the same agent token
    try:
        there = {"Cookie": f"{SESSION_COOKIE}={cookie}", "Origin": other.http}
        identity = await identity_over(other, there)
        with pytest.raises(InvalidStatus) as refused:
            await identity_over(other, {**there, "Cookie": f"{SESSION_COOKIE}={forged}"})
    finally:
        await other.stop()

    assert identity["email"] == DANA["email"]
    assert refused.value.response.status_code == 401


async def test_logging_out_forgets_the_person(
    provided: tuple[RunningServer, Provider], http: httpx.AsyncClient
) -> None:
    running, _ = provided
    await sign_in(http, running.http, "dana")
    assert (await http.get(f"{running.http}/api/audit/key")).status_code == 200

    assert (await http.get(f"{running.http}/logout")).status_code == 200

    assert (await http.get(f"{running.http}/api/audit/key")).status_code == 401
    again = await http.get(f"{running.http}/")
    assert (again.status_code, again.headers["location"]) == (303, "/login")


# ─── Behind an auth proxy ────────────────────────────────────────────────────

PROXIED = {
    "X-Forwarded-Email": "dana@example.com",
    "X-Forwarded-User": "Dana Scully",
    "X-Forwarded-Groups": "staff,eng-oncall",
}


async def proxied_server(trusted: str) -> RunningServer:
    return await start_server(
        Settings(
            port=0,
            auth_proxy_header="X-Forwarded-Email",
            auth_proxy_trusted=(trusted,),
            oidc_roles=("participant=eng-oncall",),
        )
    )


async def test_a_trusted_proxy_s_header_names_the_person() -> None:
    running = await proxied_server("127.0.0.0/8")
    try:
        identity = await identity_over(running, PROXIED)
    finally:
        await running.stop()

    assert identity == {
        **DANA,
        "role": "participant",
        "issuer": PROXY_ISSUER,
        "token": person_id(PROXY_ISSUER, "dana@example.com"),
        "display": "Dana Scully (dana@example.com)",
        "shared": False,
    }


async def test_a_proxy_header_from_an_untrusted_address_is_ignored_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    running = await proxied_server("10.0.0.0/8")
    try:
        with caplog.at_level(logging.WARNING, "huddle.signin"):
            with pytest.raises(InvalidStatus) as refused:
                await identity_over(running, PROXIED)
            async with httpx.AsyncClient(timeout=10 * UNIT) as http:
                answer = await http.get(f"{running.http}/api/audit/key", headers=PROXIED)
    finally:
        await running.stop()

    assert refused.value.response.status_code == 401
    assert answer.status_code == 401
    warned = [r.getMessage() for r in caplog.records if r.name == "huddle.signin"]
    assert len(warned) == 1  # once per address
    assert "ignored the x-forwarded-email header of a request from 127.0.0.1" in warned[0]


async def test_a_proxy_s_person_no_group_takes_is_told_so() -> None:
    running = await proxied_server("127.0.0.0/8")
    try:
        async with httpx.AsyncClient(timeout=10 * UNIT) as http:
            page = await http.get(
                f"{running.http}/", headers={**PROXIED, "X-Forwarded-Groups": "staff"}
            )
            api = await http.get(
                f"{running.http}/api/audit/key", headers={**PROXIED, "X-Forwarded-Groups": "staff"}
            )
    finally:
        await running.stop()

    assert (page.status_code, api.status_code) == (403, 403)
    assert "none of your groups is given a role" in page.text


# ─── A person's own chats ────────────────────────────────────────────────────


async def proxied_peer(running: RunningServer, email: str, client_id: str) -> Peer:
    headers = {**PROXIED, "X-Forwarded-Email": email, "X-Forwarded-User": email}
    ws = await connect(running.ws, additional_headers=headers, proxy=None)
    peer = Peer(ws, client_id)
    assert "result" in await peer.request("initialize", initialize_params(client_id))
    return peer


async def test_a_participant_disposes_a_chat_it_created_but_not_another_s() -> None:
    running = await proxied_server("127.0.0.0/8")
    try:
        session, default = await create_session(running.http, "Chats")
        dana = await proxied_peer(running, "dana@example.com", "dana-1")
        dana_again = await proxied_peer(running, "dana@example.com", "dana-2")  # another tab
        lee = await proxied_peer(running, "lee@example.com", "lee")
        for peer, chat in ((dana, "ahp-chat:/dana"), (lee, "ahp-chat:/lee")):
            created = await peer.request("createChat", {"channel": session, "chat": chat})
            assert created.get("result", "") is None, created
        busy = {
            "channel": session,
            "chat": "ahp-chat:/busy",
            "initialMessage": {"text": "go", "origin": {"kind": "user"}},
        }
        assert "result" in await dana.request("createChat", busy)

        others = await dana.request("disposeChat", {"channel": "ahp-chat:/lee"})
        defaults = await dana.request("disposeChat", {"channel": default})
        running_turn = await dana.request("disposeChat", {"channel": "ahp-chat:/busy"})
        own = await dana_again.request("disposeChat", {"channel": "ahp-chat:/dana"})
        for peer in (dana, dana_again, lee):
            await peer.close()
        state = (await running.server.parts.host.view(session)).state
    finally:
        await running.stop()

    assert others["error"]["code"] == -32009  # forbidden
    assert defaults["error"]["code"] == -32009  # the agent created it
    assert running_turn["error"]["code"] == -32011  # a turn is running
    assert own["result"] is None
    chats = sorted(c.resource for c in state.chats)  # type: ignore[union-attr]
    assert chats == sorted([default, "ahp-chat:/lee", "ahp-chat:/busy"])


# ─── Configuration ───────────────────────────────────────────────────────────


def test_the_sign_in_flags_and_their_variables_set_the_same_settings() -> None:
    flags = vars(
        build_parser().parse_args(
            [
                "serve",
                "--oidc-issuer=https://id.example",
                "--oidc-client-id=huddle",
                "--oidc-client-secret=s",
                "--oidc-role-claim=roles",
                "--oidc-role=participant=eng-oncall",
                "--oidc-role=observer=*",
                "--auth-proxy-header=X-Forwarded-Email",
                "--auth-proxy-trusted=10.0.0.0/8",
            ]
        )
    )
    env = {
        "HUDDLE_OIDC_ISSUER": "https://id.example",
        "HUDDLE_OIDC_CLIENT_ID": "huddle",
        "HUDDLE_OIDC_CLIENT_SECRET": "s",
        "HUDDLE_OIDC_ROLE_CLAIM": "roles",
        "HUDDLE_OIDC_ROLES": "participant=eng-oncall,observer=*",
        "HUDDLE_AUTH_PROXY_HEADER": "X-Forwarded-Email",
        "HUDDLE_AUTH_PROXY_TRUSTED": "10.0.0.0/8",
    }

    by_flags, by_env = settings_from(flags, {}), settings_from({}, env)

    assert by_flags == by_env
    assert by_flags.oidc_roles == ("participant=eng-oncall", "observer=*")
    assert by_flags.auth_proxy_trusted == ("10.0.0.0/8",)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--oidc-issuer=http://127.0.0.1:1"], "--oidc-issuer needs --oidc-client-id"),
        (["--oidc-role=agent=admins"], "participant=GROUP or observer=GROUP"),
        (["--auth-proxy-trusted=10.0.0.0/33"], "10.0.0.0/33"),
    ],
    ids=["no-client", "agent-role", "bad-network"],
)
def test_a_sign_in_misconfigured_stops_the_server_saying_why(
    capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    assert main(["serve", "--port=0", "--agent=none", *flags]) == 2
    assert said in capsys.readouterr().err
