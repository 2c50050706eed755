"""The network edge: a Starlette app with the AHP WebSocket at ``/ahp``, the
HTTP API for agents without a socket, health, metrics and the web client.

Authentication happens before a WebSocket is accepted (HTTP 401/403 on
refusal). A token is read from ``Authorization: Bearer``, from a WebSocket
subprotocol ``huddle.token.<token>`` (browsers cannot set headers; offer
``ahp`` too and the server selects it), or from the ``huddle_token`` cookie
that ``GET /?token=...`` sets. A request that carries an ``Origin`` header
must come from the server's own origin or one on the allow-list.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol.actions import StateAction, action_type, is_client_dispatchable
from protocol.codec import MalformedFrame, convert, encode
from protocol.messages import ErrorCode, Implementation
from protocol.session import AgentInfo
from protocol.uris import BadChannelUri, channel_kind, session_uri
from reducers.validation import client_action_problem
from server.auth import ROLES, Grant, TokenAuthority
from server.config import Settings
from server.connection import CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_UNSUPPORTED, Connection
from server.errors import (
    ActionRejected,
    AuthError,
    ChannelGone,
    CommandError,
    InputAbandoned,
    StoreUnavailable,
)
from server.frames import WRITE_EXTENSION
from server.host import Host
from server.metrics import ServerMetrics
from server.runner.agent import Agent
from server.runner.service import AgentService, agent_info
from server.runner.store import MemoryTurnStore, TurnStore
from server.store.base import ChannelStore

log = logging.getLogger("huddle.app")

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
TOKEN_COOKIE = "huddle_token"
TOKEN_SUBPROTOCOL = "huddle.token."
AHP_SUBPROTOCOL = "ahp"
SERVER_INFO = Implementation(name="huddle", version="0.1.0")


@dataclass
class Server:
    """Everything one running server holds."""

    settings: Settings
    store: ChannelStore
    host: Host
    authority: TokenAuthority
    metrics: ServerMetrics
    connections: set[Connection]
    clock: Callable[[], float] = time.time


def default_agents() -> list[AgentInfo]:
    return [
        AgentInfo(
            provider="huddle",
            display_name="Huddle",
            description="Agents that ask people for input through Huddle",
            models=[],
        )
    ]


def _json(value: Any, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type="application/json")


def _problem(status: int, message: str, **extra: Any) -> Response:
    return _json({"error": message, **extra}, status)


# ─── Authentication ──────────────────────────────────────────────────────────


def _offered_subprotocols(conn: HTTPConnection) -> list[str]:
    return list(conn.scope.get("subprotocols") or [])


def token_of(conn: HTTPConnection) -> str | None:
    """The token a request carries, from header, subprotocol or cookie."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    for offered in _offered_subprotocols(conn):
        if offered.startswith(TOKEN_SUBPROTOCOL):
            return offered[len(TOKEN_SUBPROTOCOL) :]
    return conn.cookies.get(TOKEN_COOKIE)


def check_origin(conn: HTTPConnection, allowed: tuple[str, ...]) -> None:
    """Raise AuthError(403) for a foreign ``Origin`` (browsers send one)."""
    origin = conn.headers.get("origin")
    if origin is None:
        return
    host = conn.headers.get("host", "")
    own = {f"http://{host}", f"https://{host}"}
    if origin in own or origin in allowed or "*" in allowed:
        return
    raise AuthError(403, f"origin {urlsplit(origin).netloc or origin} is not allowed")


def authenticate(server: Server, conn: HTTPConnection) -> Grant:
    check_origin(conn, server.settings.origins)
    return server.authority.verify(token_of(conn), server.clock())


# ─── WebSocket ───────────────────────────────────────────────────────────────


async def ahp_socket(websocket: WebSocket) -> None:
    server: Server = websocket.app.state.server
    try:
        grant = authenticate(server, websocket)
    except AuthError as error:
        await websocket.send_denial_response(
            Response(error.reason, status_code=error.status, media_type="text/plain")
        )
        return
    # Select only what we speak: echoing an offered ``huddle.token.*`` would
    # put the credential into the response headers.
    offered = _offered_subprotocols(websocket)
    subprotocol = AHP_SUBPROTOCOL if AHP_SUBPROTOCOL in offered else None
    await websocket.accept(subprotocol=subprotocol)

    async def close(code: int, reason: str) -> None:
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await websocket.close(code, reason)

    direct = websocket.scope.get("extensions", {}).get(WRITE_EXTENSION)
    connection = Connection(
        server.host,
        grant,
        send=websocket.send_text,
        close=close,
        direct=DirectWriter(direct["write"], direct["abort"]) if direct else None,
        limits=server.settings.limits,
        metrics=server.metrics,
        server_info=SERVER_INFO,
    )
    server.connections.add(connection)
    server.metrics.connections.inc()
    writer = connection.start_writer()
    try:
        await _read_frames(websocket, connection)
    finally:
        server.connections.discard(connection)
        server.metrics.connections.dec()
        connection.closed()
        connection.shut(CLOSE_GOING_AWAY, "")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, 5)


async def _read_frames(websocket: WebSocket, connection: Connection) -> None:
    """Handle frames in order until the peer goes (after a close from our
    side too: uvicorn ends a closing handshake that the peer leaves open)."""
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        if connection.closing is not None:
            continue
        text = message.get("text")
        if text is None:
            connection.shut(CLOSE_UNSUPPORTED, "binary frames are not AHP: send text")
            continue
        try:
            await connection.receive_frame(text)
        except Exception:
            log.exception("bug while handling a frame")
            connection.shut(CLOSE_INTERNAL, "internal error")


@dataclass(frozen=True)
class DirectWriter:
    """The ``huddle.write`` extension of the server's WebSocket protocol."""

    write: Callable[[bytes, int], int]
    abort: Callable[[], None]


# ─── HTTP API ────────────────────────────────────────────────────────────────

Handler = Callable[[Request, Server, Grant], Awaitable[Response]]


def api(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """Authenticate, then map the server's errors to HTTP answers."""

    async def endpoint(request: Request) -> Response:
        server: Server = request.app.state.server
        try:
            grant = authenticate(server, request)
            return await handler(request, server, grant)
        except AuthError as error:
            return _problem(error.status, error.reason)
        except MalformedFrame as error:
            return _problem(400, error.reason, path=error.path)
        except CommandError as error:
            status = (
                404 if error.code in (ErrorCode.SESSION_NOT_FOUND, ErrorCode.NOT_FOUND) else 409
            )
            if error.code == ErrorCode.PERMISSION_DENIED:
                status = 403
            return _problem(status, error.message, code=error.code)
        except ChannelGone as error:
            return _problem(404, str(error))
        except StoreUnavailable as error:
            return _problem(503, str(error))

    return endpoint


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise MalformedFrame(ErrorCode.PARSE_ERROR, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "the body must be a JSON object", "$")
    return body


async def _reachable(server: Server, grant: Grant, uri: str) -> None:
    try:
        session = await server.host.session_of(uri)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.channel") from None
    if not grant.may_touch(session):
        raise CommandError(ErrorCode.PERMISSION_DENIED, f"this token does not reach {uri}")


async def create_session(request: Request, server: Server, grant: Grant) -> Response:
    if grant.role == "observer" or grant.sessions is not None:
        raise CommandError(
            ErrorCode.PERMISSION_DENIED, "creating sessions needs an agent or unscoped token"
        )
    body = await _body(request)
    uri = session_uri(str(body.get("id") or secrets.token_hex(8)))
    try:
        channel_kind(uri)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.id") from None
    title = body.get("title")
    chat = await server.host.create_session(
        uri, provider=body.get("provider"), title=title if isinstance(title, str) else None
    )
    return _json({"session": uri, "chat": chat}, 201)


async def read_snapshot(request: Request, server: Server, grant: Grant) -> Response:
    uri = request.query_params.get("channel", "")
    await _reachable(server, grant, uri)
    ch = await server.host.channel(uri)
    return _json({"resource": uri, "state": ch.state, "fromSeq": ch.seq})


async def dispatch_action(request: Request, server: Server, grant: Grant) -> Response:
    body = await _body(request)
    uri = body.get("channel")
    if not isinstance(uri, str):
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "Expected `str`", "$.channel")
    action: StateAction = convert(body.get("action"), StateAction, "$.action")  # type: ignore[arg-type]
    await _reachable(server, grant, uri)
    family, kind = action_type(action).split("/", 1)[0], channel_kind(uri)
    if family != kind:
        server.metrics.rejected(action_type(action))
        reason = f"wrong-channel: a {family} action cannot go to a {kind} channel"
        return _json({"rejectionReason": reason}, 409)
    if not grant.may_dispatch:
        raise CommandError(ErrorCode.PERMISSION_DENIED, "observers may not dispatch actions")
    if grant.role != "agent" and not is_client_dispatchable(action):
        raise CommandError(
            ErrorCode.PERMISSION_DENIED, f"{action_type(action)} is dispatched only by the server"
        )
    if grant.role != "agent":
        problem = client_action_problem((await server.host.channel(uri)).state, action, None)
        if problem is not None:
            raise CommandError(ErrorCode.PERMISSION_DENIED, problem.reason)
    try:
        envelope = await server.host.dispatch(uri, action)
    except ActionRejected as rejected:
        server.metrics.rejected(action_type(action))
        return _json({"rejectionReason": rejected.reason}, 409)
    return _json(envelope)


async def wait_input(request: Request, server: Server, grant: Grant) -> Response:
    """Long poll: the outcome of an input request, or 408 after ``timeout``
    seconds (default 30, at most 300)."""
    chat = request.query_params.get("chat", "")
    request_id = request.query_params.get("request", "")
    try:
        timeout = min(300.0, float(request.query_params.get("timeout", "30")))
    except ValueError:
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS, "timeout must be a number", "$.timeout"
        ) from None
    await _reachable(server, grant, chat)
    try:
        async with asyncio.timeout(timeout):
            outcome = await server.host.wait_input(chat, request_id)
    except TimeoutError:
        return _problem(408, "still waiting: poll again")
    except InputAbandoned as error:
        return _problem(410, error.reason)
    return _json(
        {
            "response": outcome.response,
            "answers": outcome.answers,
            **({"data": outcome.data} if outcome.data is not None else {}),
            **({"by": outcome.by.name} if outcome.by is not None else {}),
        }
    )


async def mint_token(request: Request, server: Server, grant: Grant) -> Response:
    if grant.role != "agent":
        raise CommandError(ErrorCode.PERMISSION_DENIED, "only an agent token may mint tokens")
    body = await _body(request)
    role = body.get("role")
    if role not in ROLES:
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS, f"role must be one of {', '.join(ROLES)}", "$.role"
        )
    sessions = body.get("sessions")
    if sessions is not None and not (
        isinstance(sessions, list) and all(isinstance(s, str) for s in sessions)
    ):
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS, "sessions must be a list of URIs", "$.sessions"
        )
    ttl = body.get("ttl", server.settings.participant_ttl)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "ttl must be a positive number", "$.ttl")
    name = body.get("name")
    token = server.authority.mint(
        role,
        sessions=sessions,
        name=name if isinstance(name, str) else None,
        expires_at=server.clock() + float(ttl),
    )
    return _json({"token": token})


# ─── Health, metrics, web client ─────────────────────────────────────────────


async def healthz(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


async def readyz(request: Request) -> Response:
    server: Server = request.app.state.server
    try:
        ready = await server.store.ready()
    except Exception:
        ready = False
    if ready:
        return Response("ready\n", media_type="text/plain")
    return Response("store unavailable\n", status_code=503, media_type="text/plain")


async def metrics(request: Request) -> Response:
    server: Server = request.app.state.server
    return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")


async def index(request: Request) -> Response:
    """The web client; ``?token=`` becomes a cookie and leaves the URL. A
    token that does not verify sets nothing (a link must not plant someone
    else's credential in a browser)."""
    token = request.query_params.get("token")
    if token:
        server: Server = request.app.state.server
        try:
            server.authority.verify(token, server.clock())
        except AuthError as error:
            return HTMLResponse(
                "<!doctype html><title>Huddle</title><p>This link's token is not valid: "
                f"{html.escape(error.reason)}. Ask for a new link.</p>",
                status_code=error.status,
            )
        response: Response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            TOKEN_COOKIE, token, httponly=True, samesite="strict", max_age=30 * 24 * 3600
        )
        return response
    page = WEB_ROOT / "index.html"
    if page.is_file():
        return FileResponse(page)
    return HTMLResponse("<!doctype html><title>Huddle</title><p>Huddle is running.</p>")


def create_app(
    settings: Settings,
    store: ChannelStore,
    authority: TokenAuthority,
    *,
    agent: Agent | None = None,
    turn_store: TurnStore | None = None,
    workers: int = 1,
    clock: Callable[[], float] = time.time,
    on_start: Callable[[Server], Awaitable[None]] | None = None,
) -> Starlette:
    """The app for ``settings``; the stores are closed when the app stops.

    With an ``agent``, a participant's ``chat/turnStarted`` starts it and
    ``workers`` tasks in this process run its turns (0: only other
    processes' ``huddle worker`` do).
    """
    host = Host(
        store,
        agents=[agent_info(agent)] if agent else default_agents(),
        clock=clock,
        snapshot_every=settings.snapshot_every,
    )
    service = (
        AgentService(host, agent, turn_store or MemoryTurnStore(), workers=workers, clock=clock)
        if agent
        else None
    )
    server = Server(
        settings=settings,
        store=store,
        host=host,
        authority=authority,
        metrics=ServerMetrics(),
        connections=set(),
        clock=clock,
    )
    host.on_applied = server.metrics.applied

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await host.start()
        if service is not None:
            await service.start()
        if on_start is not None:
            await on_start(server)
        try:
            yield
        finally:
            for connection in list(server.connections):
                connection.shut(CLOSE_GOING_AWAY, "the server is shutting down")
            if service is not None:
                await service.stop()
            await host.stop()
            await store.close()

    routes = [
        Route("/", index),
        WebSocketRoute("/ahp", ahp_socket),
        Route("/api/sessions", api(create_session), methods=["POST"]),
        Route("/api/snapshot", api(read_snapshot), methods=["GET"]),
        Route("/api/dispatch", api(dispatch_action), methods=["POST"]),
        Route("/api/input/wait", api(wait_input), methods=["GET"]),
        Route("/api/tokens", api(mint_token), methods=["POST"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]
    if WEB_ROOT.is_dir():
        routes.append(Mount("/web", StaticFiles(directory=WEB_ROOT), name="web"))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = server
    app.state.agents = service
    return app
