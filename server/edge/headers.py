"""What every HTTP answer carries, and which ``Host`` a request may name.

:class:`Guard` is ASGI middleware in front of the whole app:

- a ``Host`` header not on the allow-list is refused (400; a WebSocket
  before it opens) so that a page on another site whose name was rebound to
  this server's address (DNS rebinding) reaches nothing. By default a server
  listening on a loopback address accepts only loopback names
  (``localhost``, ``127.0.0.1``, ``::1``); one listening elsewhere accepts any
  name unless ``--allowed-host`` says which, and :func:`rebinding_warning`
  says so at start-up: nothing then guards against DNS rebinding;
- a browser's ``Origin`` is the server's own (:func:`is_own_origin`) only
  when it names the request's ``Host`` and, when there is an allow-list,
  a host on it: the ``Host`` a rebound page sends is its own name, so it
  cannot vouch for itself;
- every HTTP response gets security headers: a Content-Security-Policy that
  allows only the server's own scripts, styles and connections and no
  framing (``frame-ancestors 'none'``), ``X-Content-Type-Options: nosniff``,
  ``Referrer-Policy: no-referrer`` (the web client's address may carry a
  token) and ``X-Frame-Options: DENY`` for browsers without CSP 2.
"""

from __future__ import annotations

import math
from typing import Final

from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-src 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: Final = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
LOOPBACK_NAMES: Final = ("localhost", "127.0.0.1", "::1")
LOOPBACK_BINDS: Final = ("127.0.0.1", "localhost", "::1")


def allowed_hosts(listen: str, configured: tuple[str, ...]) -> tuple[str, ...] | None:
    """The host names a server listening on ``listen`` accepts (None: any)."""
    if configured:
        return None if "*" in configured else tuple(h.lower() for h in configured)
    return LOOPBACK_NAMES if listen in LOOPBACK_BINDS else None


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:80`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0].lower()
    return header.rsplit(":", 1)[0].lower() if header.count(":") == 1 else header.lower()


def is_own_origin(origin: str, host: str, hosts: tuple[str, ...] | None) -> bool:
    """Whether a browser's ``Origin`` is this server's own: ``http(s)://``
    and the request's ``Host`` (the same name and port: another port is
    another origin, though its cookies are this one's), and, with an
    allow-list (``hosts`` not None), a name on it."""
    if origin not in (f"http://{host}", f"https://{host}"):
        return False
    return hosts is None or host_name(host) in hosts


def rebinding_warning(listen: str, hosts: tuple[str, ...] | None) -> str | None:
    """What to warn of when a server listening on ``listen`` answers to
    any ``Host`` (``hosts`` None), else None."""
    if hosts is not None:
        return None
    return (
        f"serving on {listen} answers to any Host name: DNS rebinding is not guarded "
        "(a page on another site whose name is pointed at this address reaches the server "
        "as its own origin); name this server's host names with --allowed-host "
        "(HUDDLE_ALLOWED_HOSTS)"
    )


class Guard:
    """See the module docstring; ``hosts`` None accepts any ``Host``."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...] | None) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.hosts is not None:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(header) not in self.hosts:
                refusal = PlainTextResponse("this server does not answer to that host", 400)
                if scope["type"] == "websocket":
                    await WebSocket(scope, receive, send).send_denial_response(refusal)
                else:
                    await _with_headers(refusal)(scope, receive, send)
                return
        if scope["type"] == "http":
            await self.app(scope, receive, _adding_headers(send))
        else:
            await self.app(scope, receive, send)


def _adding_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
        await send(message)

    return sending


def _with_headers(response: PlainTextResponse) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await response(scope, receive, _adding_headers(send))

    return app


def retry_after(response: Response, seconds: float) -> Response:
    """``response`` saying when to try again (whole seconds, at least 1,
    at most a day)."""
    response.headers["Retry-After"] = str(max(1, math.ceil(min(seconds, 86_400.0))))
    return response
