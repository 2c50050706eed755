"""People sign in as themselves: through the organisation's OpenID provider,
or behind an auth proxy that says who they are (docs/sign-in.md).

OIDC (``--oidc-issuer``): ``/login`` sends the browser to the provider
(authorization code with PKCE, the provider found by discovery);
``/auth/callback`` takes the code back, and Authlib checks the ID token's
signature against the provider's published keys, its issuer, ``nonce``
(the one this browser's login sent) and lifetime, and we make it check
``aud`` (our client id), which it leaves to ``azp`` otherwise.
The person's groups (``--oidc-role-claim``) give their role
(server.auth.RoleMap); a person none gives one is answered 403 with a page
that says so. The browser then holds a signed session cookie
(``huddle_session``: HttpOnly, SameSite=Lax, Secure on https; signed with
a key derived from the agent token, so every process reads it) carrying a
token minted for the person (server.auth.TokenAuthority.mint_person), which
the server verifies as any token on each request. ``/logout`` forgets it.

Auth proxy (``--auth-proxy-header X-Forwarded-Email``): a request from a
trusted network (``--auth-proxy-trusted``, none by default) that carries the
header is that person's, their name from ``X-Forwarded-User`` and groups
from ``X-Forwarded-Groups`` (as oauth2-proxy sends them). The same header
from anywhere else is ignored, and logged once per address.

Either way a socket opened with the person's cookie must say its
``Origin`` (a browser always does), and it must be an allowed one
(server.edge.app.check_origin): another site's page cannot ride on it.
"""

from __future__ import annotations

import html
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

import httpx
from authlib.integrations.starlette_client import OAuth, OAuthError
from joserfc.errors import JoseError
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from server.auth import Grant, Person, RoleMap, TokenAuthority
from server.config import Settings
from server.errors import AuthError

log = logging.getLogger("huddle.signin")

SESSION_COOKIE = "huddle_session"
SESSION_TTL = 12 * 3600.0
"""How long a sign-in lasts (seconds): the cookie's and the token's life."""
PROXY_ISSUER = "auth-proxy"
"""The issuer of a person an auth proxy names."""
PROXY_USER = "x-forwarded-user"
PROXY_GROUPS = "x-forwarded-groups"
NOTED_ADDRESSES = 1024
"""Untrusted addresses remembered as logged already (then forgotten all)."""
SCOPES = "openid email profile"


class SessionCookie:
    """Starlette's SessionMiddleware (a signed cookie, itsdangerous), its
    cookie Secure when the request came over https: one middleware for
    each, chosen by the request's scheme."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        options: dict[str, Any] = {
            "secret_key": secret,
            "session_cookie": SESSION_COOKIE,
            "max_age": int(SESSION_TTL),
            "same_site": "lax",
        }
        self.plain = SessionMiddleware(app, https_only=False, **options)
        self.secure = SessionMiddleware(app, https_only=True, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        secure = scope.get("scheme") in ("https", "wss")
        await (self.secure if secure else self.plain)(scope, receive, send)


class SignIn:
    """Who a request's person is, by the session cookie or a trusted proxy
    header; the routes of signing in. ``clock`` is the one tokens are
    minted and verified by."""

    def __init__(
        self, settings: Settings, authority: TokenAuthority, clock: Callable[[], float]
    ) -> None:
        self.authority = authority
        self.clock = clock
        self.roles = RoleMap.parse(settings.oidc_roles)
        self.role_claim = settings.oidc_role_claim
        self.issuer = settings.oidc_issuer
        self.proxy_header = (settings.auth_proxy_header or "").lower() or None
        self.trusted = tuple(
            ipaddress.ip_network(c, strict=False) for c in settings.auth_proxy_trusted
        )
        self._noted: set[str] = set()
        self.client: Any = None
        if self.issuer is not None:
            if not (settings.oidc_client_id and settings.oidc_client_secret):
                raise ValueError("--oidc-issuer needs --oidc-client-id and --oidc-client-secret")
            oauth = OAuth()
            self.client = oauth.register(
                "huddle",
                client_id=settings.oidc_client_id,
                client_secret=settings.oidc_client_secret,
                server_metadata_url=self.issuer.rstrip("/") + "/.well-known/openid-configuration",
                client_kwargs={"scope": SCOPES, "code_challenge_method": "S256"},
            )

    @property
    def cookies(self) -> bool:
        """Whether browsers sign in here (and so hold session cookies)."""
        return self.client is not None

    @property
    def enabled(self) -> bool:
        """Whether people are known here other than by token links."""
        return self.cookies or self.proxy_header is not None

    def routes(self) -> list[Route]:
        if not self.cookies:
            return []
        return [
            Route("/login", self.login),
            Route("/logout", self.logout),
            Route("/auth/callback", self.callback, name="auth_callback"),
        ]

    # ─── Who a request's person is ───────────────────────────────────────

    def session_token(self, conn: HTTPConnection) -> str | None:
        """The person's token the request's session cookie holds, if any.
        AuthError(403) for a socket that says no ``Origin``: a browser's
        always does, and the cookie is a browser's."""
        if "session" not in conn.scope:
            return None
        token = conn.session.get("token")
        if not isinstance(token, str):
            return None
        if conn.scope["type"] == "websocket" and "origin" not in conn.headers:
            raise AuthError(403, "a signed-in browser's socket must say its Origin")
        return token

    def proxied(self, conn: HTTPConnection) -> Grant | None:
        """The grant of the person a trusted proxy names in the request, or
        None (no header, or one from an untrusted address: ignored, and
        logged). AuthError(403) for a person no role rule takes."""
        if self.proxy_header is None:
            return None
        email = conn.headers.get(self.proxy_header, "").strip()
        if not email:
            return None
        address = conn.client.host if conn.client is not None else ""
        if not self._trusts(address):
            self._note_untrusted(address)
            return None
        groups = [g.strip() for g in conn.headers.get(PROXY_GROUPS, "").split(",") if g.strip()]
        try:
            person = Person.vouched(
                PROXY_ISSUER, email, conn.headers.get(PROXY_USER), email, groups
            )
        except ValueError as error:
            raise AuthError(401, f"the proxy's {self.proxy_header}: {error}") from None
        role = self.roles.role_of(person.groups)
        if role is None:
            raise AuthError(403, f"{email} has no role here: {unmapped(person)}")
        return Grant.of_person(person, role, None)

    def _trusts(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in self.trusted)

    def _note_untrusted(self, address: str) -> None:
        if address in self._noted:
            return
        if len(self._noted) >= NOTED_ADDRESSES:
            self._noted.clear()
        self._noted.add(address)
        log.warning(
            "ignored the %s header of a request from %s, which --auth-proxy-trusted does not "
            "name (logged once per address)",
            self.proxy_header,
            address or "an unknown address",
        )

    # ─── The routes ──────────────────────────────────────────────────────

    async def login(self, request: Request) -> Response:
        """Off to the provider. What this browser's session held goes: a
        login starts over, and the cookie never piles up unfinished logins."""
        request.session.clear()
        try:
            redirect: Response = await self.client.authorize_redirect(
                request, request.url_for("auth_callback")
            )
        except (httpx.HTTPError, OAuthError, ValueError) as error:
            log.warning("the OpenID provider %s cannot be reached: %s", self.issuer, error)
            return notice(503, "The sign-in service cannot be reached now: try again in a moment.")
        return redirect

    async def callback(self, request: Request) -> Response:
        """Back from the provider: the ID token checked, the person's role
        from their groups, their token in the session cookie."""
        try:
            answer = await self.client.authorize_access_token(
                request, claims_options=await self._claims_options()
            )
        except (OAuthError, JoseError, httpx.HTTPError, ValueError, KeyError) as error:
            return refused_sign_in(str(error))
        claims = answer.get("userinfo")
        if not isinstance(claims, dict) or not isinstance(claims.get("sub"), str):
            return refused_sign_in("the provider sent no ID token")
        try:
            person = self._person(claims)
        except ValueError as error:
            return refused_sign_in(str(error))
        role = self.roles.role_of(person.groups)
        request.session.clear()
        if role is None:
            return notice(403, html.escape(unmapped(person)) + " <a href='/logout'>Sign out</a>.")
        expires = self.clock() + SESSION_TTL
        request.session["token"] = self.authority.mint_person(person, role, expires_at=expires)
        return RedirectResponse("/", status_code=303)

    async def _claims_options(self) -> dict[str, Any]:
        """What the ID token's claims must say: issued by the configured
        provider (which its discovery document must name as itself) to our
        client. OIDC: the client MUST validate that ``aud`` contains its
        client_id; Authlib, left to itself, checks ``azp`` only, which a
        token issued to another client may carry naming us."""
        metadata = await self.client.load_server_metadata()
        issuer = metadata.get("issuer")
        assert self.issuer is not None
        if not isinstance(issuer, str) or issuer.rstrip("/") != self.issuer.rstrip("/"):
            raise ValueError(f"the provider at {self.issuer} names itself {issuer!r}")
        return {
            "iss": {"essential": True, "value": issuer},
            "aud": {"essential": True, "value": self.client.client_id},
        }

    def _person(self, claims: dict[str, Any]) -> Person:
        """The person the ID token's claims describe; ValueError for one
        whose subject is not fit to record (:meth:`Person.vouched`)."""
        email, name = claims.get("email"), claims.get("name")
        groups = claims.get(self.role_claim)
        listed = groups if isinstance(groups, list) else [groups] if isinstance(groups, str) else []
        return Person.vouched(
            str(claims["iss"]),
            str(claims["sub"]),
            name if isinstance(name, str) else None,
            email if isinstance(email, str) else None,
            (str(g) for g in listed),
        )

    async def logout(self, request: Request) -> Response:
        """Forget the sign-in (the provider's own session stays: signing in
        again may not ask for a password)."""
        request.session.clear()
        return notice(200, "You are signed out. <a href='/login'>Sign in again</a>.")


def refused_sign_in(why: str) -> HTMLResponse:
    """401 for a sign-in that did not go through; ``why`` goes to the log
    only (it may say what a forger would like to know)."""
    log.warning("a sign-in was refused: %s", why)
    return notice(401, "The sign-in did not go through. <a href='/login'>Try again</a>.")


def unmapped(person: Person) -> str:
    """What a person no role rule takes is told."""
    who = f"{person.name} ({person.email})" if person.email else person.name
    return (
        f"You are signed in as {who}, but none of your groups is given a role in this "
        "Huddle. Ask whoever runs it to add one (--oidc-role)."
    )


def notice(status: int, body_html: str) -> HTMLResponse:
    """A small page of ``body_html`` (escaped by the caller)."""
    return HTMLResponse(
        f"<!doctype html><title>Huddle</title><p>{body_html}</p>", status_code=status
    )
