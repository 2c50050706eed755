"""A real OpenID provider for the sign-in tests, and signing in through it.

:func:`signed_in_server` runs npm's ``oidc-provider`` (tests/oidc_provider.mjs,
installed under .ci/node by ``.ci/setup --test``) on a free port, then a
Huddle server that signs people in with it. :func:`sign_in` goes through
the provider's own login and consent pages over plain HTTP, as a browser
would (Chromium does the same in test_sign_in's first test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

from server.config import Settings
from tests.conftest import UNIT, RunningServer, start_server

ROOT = Path(__file__).resolve().parents[1]
PROVIDER = ROOT / "tests" / "oidc_provider.mjs"
CLIENT_ID = "huddle"
CLIENT_SECRET = "huddle-test-client-secret-0123456789"
ROLES = ("participant=eng-oncall", "observer=staff")
"""Dana is in eng-oncall, Olly in staff, Nina in no group
(tests/oidc_provider.mjs)."""


@dataclass
class Provider:
    """The provider's process and its issuer URL."""

    process: asyncio.subprocess.Process
    issuer: str

    async def tamper(self, how: str) -> None:
        """Make the next token answer's ID token wrong: ``aud``, ``nonce``
        (signed by the provider's own key) or ``signature`` (by a key it
        never published)."""
        async with httpx.AsyncClient(timeout=5 * UNIT) as http:
            answer = await http.post(f"{self.issuer}/__test/tamper", content=how)
        answer.raise_for_status()


async def _line(process: asyncio.subprocess.Process) -> dict[str, Any]:
    assert process.stdout is not None
    async with asyncio.timeout(20 * UNIT):
        line = await process.stdout.readline()
    assert line, "the OpenID provider stopped before it was ready (.ci/setup --test installs it)"
    said: dict[str, Any] = json.loads(line)
    return said


def oidc_settings(issuer: str, **settings: Any) -> Settings:
    """A server's settings on a free port whose people sign in at ``issuer``
    (``settings`` on top: role rules are :data:`ROLES` unless given)."""
    options: dict[str, Any] = {
        "oidc_issuer": issuer,
        "oidc_client_id": CLIENT_ID,
        "oidc_client_secret": CLIENT_SECRET,
        "oidc_roles": ROLES,
        **settings,
    }
    return Settings(port=0, **options)


@contextlib.asynccontextmanager
async def signed_in_server(**settings: Any) -> AsyncIterator[tuple[RunningServer, Provider]]:
    """A provider, and a server on loopback whose people sign in with it
    (``settings`` on top: role rules are :data:`ROLES` unless given)."""
    node = shutil.which("node")
    assert node is not None, "node is needed: run .ci/setup --test"
    process = await asyncio.create_subprocess_exec(
        node, str(PROVIDER), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        issuer = f"http://127.0.0.1:{(await _line(process))['port']}"
        running = await start_server(oidc_settings(issuer, **settings))
        try:
            client = {
                "redirectUri": f"{running.http}/auth/callback",
                "clientId": CLIENT_ID,
                "clientSecret": CLIENT_SECRET,
            }
            assert process.stdin is not None
            process.stdin.write(json.dumps(client).encode() + b"\n")
            await process.stdin.drain()
            assert (await _line(process)) == {"ready": True}
            yield running, Provider(process, issuer)
        finally:
            await running.stop()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


_FORM_ACTION = re.compile(r'<form[^>]* action="([^"]+)"')


async def sign_in(http: httpx.AsyncClient, base: str, login: str) -> httpx.Response:
    """Sign in at ``base`` as ``login`` through the provider's pages (any
    password does), following every redirect; the last answer (Huddle's
    page, or its refusal). ``http`` keeps the cookies of both sites."""
    answer = await http.get(f"{base}/login", follow_redirects=True)
    fields = {"prompt": "login", "login": login, "password": "any"}
    for _ in range(2):  # the login page, then the consent page
        action = _FORM_ACTION.search(answer.text)
        if action is None or str(answer.url).startswith(base):
            break
        answer = await http.post(
            urljoin(str(answer.url), action.group(1)), data=fields, follow_redirects=True
        )
        fields = {"prompt": "consent"}
    return answer
