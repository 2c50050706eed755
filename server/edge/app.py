"""The network edge: a Starlette app with the AHP WebSocket at ``/ahp``, the
HTTP API for agents without a socket, health, metrics and the web client.

Authentication happens before a WebSocket is accepted (HTTP 401/403 on
refusal). A token is read from ``Authorization: Bearer``, from a WebSocket
subprotocol ``huddle.token.<token>`` (browsers cannot set headers; offer
``ahp`` too and the server selects it), or from the ``huddle_token`` cookie
that ``GET /?token=...`` sets. A person is known by the session cookie of
their sign-in, or by a trusted auth proxy's header (server.edge.signin):
an explicit token (header, subprotocol) wins over both, both over the
``huddle_token`` cookie. A request that carries an ``Origin`` header
must come from the server's own origin (its ``Host``, and a name on the
host allow-list when there is one: :func:`server.edge.headers.is_own_origin`) or
one on the origin allow-list.

Budgets (:mod:`server.ratelimit`): every authenticated HTTP request spends
from its token's budget, as the same command on the socket does, what its
command costs (server.commands.COSTS), and is answered 429 with ``Retry-After`` before any
work when that does not fit; a snapshot's or an audit's size is charged on
top, as a debt. A client address that keeps failing to authenticate is
refused (429) before its token is looked at, and a token holds at most
``LONG_POLLS`` long polls at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import HTTPConnection, Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from protocol.actions import StateAction
from protocol.chat import ChatState
from protocol.codec import MalformedFrame, convert, decode_json, encode
from protocol.messages import ErrorCode, ExpireParams, ExpireResult, Implementation
from protocol.rejections import RejectionCode
from protocol.uris import channel_id, session_uri
from server.auth import Grant, TokenAuthority
from server.build import Parts, mcp_door
from server.client import HuddleClient
from server.commands import BYTES_PER_COST, Command, Commands
from server.config import Settings
from server.edge.connection import CLOSE_GOING_AWAY, CLOSE_INTERNAL, CLOSE_UNSUPPORTED, Connection
from server.edge.headers import Guard, allowed_hosts, is_own_origin, rebinding_warning, retry_after
from server.edge.idempotency import Idempotency
from server.edge.local import LocalSocket, ServerEnd
from server.edge.rpc import LiveClients, Rpc
from server.edge.signin import SessionCookie, SignIn, notice
from server.errors import (
    ActionRejected,
    AuthError,
    BodyTooLarge,
    ChannelGone,
    CommandError,
    Disconnected,
    HuddleError,
    InputAbandoned,
    StoreError,
    StoreUnavailable,
)
from server.frames import WRITE_EXTENSION
from server.metrics import ServerMetrics
from server.periodic import Periodic
from server.ratelimit import (
    AGENT_SOCKETS,
    LINK_SOCKETS,
    SOCKETS,
    AuthThrottled,
    Budget,
    Budgets,
    FailedAuthentications,
    RateLimited,
    Slots,
)

log = logging.getLogger("huddle.app")

WEB_ROOT = Path(__file__).resolve().parents[2] / "web"
TOKEN_COOKIE = "huddle_token"
TOKEN_SUBPROTOCOL = "huddle.token."
AHP_SUBPROTOCOL = "ahp"
SERVER_INFO = Implementation(name="huddle", version="0.1.0")


@dataclass
class Server:
    """Everything one running server holds."""

    parts: Parts
    authority: TokenAuthority
    metrics: ServerMetrics
    commands: Commands
    idempotency: Idempotency
    hosts: tuple[str, ...] | None
    """The ``Host`` names answered (None: any; server.edge.headers)."""
    signin: SignIn
    """Who a request's person is (server.edge.signin)."""
    failures: FailedAuthentications = field(default_factory=FailedAuthentications)
    """Failed authentications per client address."""
    polls: Slots = field(default_factory=Slots)
    """Long polls held open per token."""
    sockets: Slots = field(
        default_factory=lambda: Slots(SOCKETS, AGENT_SOCKETS, link_limit=LINK_SOCKETS)
    )
    """WebSocket connections held open per token."""
    connections: set[Rpc] = field(default_factory=set)
    """The open WebSocket connections (their JSON-RPC side)."""
    clients: LiveClients = field(default_factory=LiveClients)
    """The initialized ones by client id."""

    @property
    def settings(self) -> Settings:
        return self.parts.settings

    @property
    def clock(self) -> Callable[[], float]:
        """The clock tokens are minted and verified by."""
        return self.commands.clock

    async def renew_claims(self) -> None:
        """Hold again the client ids this process's open sockets use
        (server.credentials.Credentials.renew_claims): run every quarter of
        the claims' lifetime while the app runs."""
        held = [(r.grant, r.client_id) for r in self.connections if r.client_id is not None]
        await self.commands.credentials.renew_claims(held)


def _json(value: Any, status: int = 200) -> Response:
    return Response(encode(value), status_code=status, media_type="application/json")


def _problem(status: int, message: str, **extra: Any) -> Response:
    return _json({"error": message, **extra}, status)


# ─── Authentication ──────────────────────────────────────────────────────────


def _offered_subprotocols(conn: HTTPConnection) -> list[str]:
    return list(conn.scope.get("subprotocols") or [])


def token_of(conn: HTTPConnection) -> str | None:
    """The token a request carries, from header, subprotocol or cookie."""
    return _explicit_token(conn) or conn.cookies.get(TOKEN_COOKIE)


def _explicit_token(conn: HTTPConnection) -> str | None:
    """The token a request names itself (header or subprotocol), if any."""
    header = conn.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    for offered in _offered_subprotocols(conn):
        if offered.startswith(TOKEN_SUBPROTOCOL):
            return offered[len(TOKEN_SUBPROTOCOL) :]
    return None


def check_origin(
    conn: HTTPConnection, allowed: tuple[str, ...], hosts: tuple[str, ...] | None
) -> None:
    """Raise AuthError(403) for a foreign ``Origin`` (browsers send one): one
    neither on the ``allowed`` origins nor this server's own (the request's
    ``Host``, whose name must be on ``hosts`` when that is not None: a
    rebound page's ``Host`` is its own name)."""
    origin = conn.headers.get("origin")
    if origin is None or origin in allowed or "*" in allowed:
        return
    if is_own_origin(origin, conn.headers.get("host", ""), hosts):
        return
    raise AuthError(403, f"origin {urlsplit(origin).netloc or origin} is not allowed")


def authenticate(server: Server, conn: HTTPConnection) -> Grant:
    """The grant of the request's token. AuthError: 403 for a foreign
    origin, 401 for a token that does not verify (a guess counted against
    the client's address: :func:`verify_token`), AuthThrottled (429) while
    that address has no failure left to make (its token, valid or not, is
    not looked at). Without an explicit token, the person a trusted proxy
    names, or the one signed in (server.edge.signin), before the
    ``huddle_token`` cookie."""
    check_origin(conn, server.settings.origins, server.hosts)
    token = _explicit_token(conn)
    if token is None:
        person = server.signin.proxied(conn)
        if person is not None:
            return person
        token = server.signin.session_token(conn) or conn.cookies.get(TOKEN_COOKIE)
    return verify_token(server, conn, token)


def verify_token(server: Server, conn: HTTPConnection, token: str | None) -> Grant:
    """``token``'s grant, its failures counted per address of ``conn``'s
    client (see :func:`authenticate`). What counts is a token that is not
    one of ours (unknown, forged, malformed): a guess. No token at all, or
    one of ours that has expired (a browser's stale cookie), guesses
    nothing and is not counted."""
    address = conn.client.host if conn.client is not None else None
    server.failures.check(address)
    try:
        return server.authority.verify(token, server.clock())
    except AuthError:
        if token and not _ours(server, token):
            server.failures.failed(address)
        raise


def _ours(server: Server, token: str) -> bool:
    """Whether ``token`` is one this server signed, expired or not."""
    try:
        server.authority.verify(token, 0.0)
    except AuthError:
        return False
    return True


def _auth_refusal(error: AuthError, response: Response) -> Response:
    """``response`` to a refused authentication, saying when to try again
    if the client's address was throttled."""
    if isinstance(error, AuthThrottled):
        return retry_after(response, error.retry_after)
    return response


# ─── WebSocket ───────────────────────────────────────────────────────────────


async def ahp_socket(websocket: WebSocket) -> None:
    server: Server = websocket.app.state.server
    try:
        grant = authenticate(server, websocket)
    except AuthError as error:
        denial = Response(error.reason, status_code=error.status, media_type="text/plain")
        await websocket.send_denial_response(_auth_refusal(error, denial))
        return
    if not server.sockets.open(grant):
        limit = server.sockets.limit_of(grant)
        denial = _problem(429, f"at most {limit} connections at once per token")
        await websocket.send_denial_response(denial)
        return
    try:
        await _serve_socket(server, websocket, grant)
    finally:
        server.sockets.close(grant)


async def open_local(server: Server, grant: Grant) -> LocalSocket:
    """An AHP connection inside this process for ``grant`` (server.edge.local),
    served as a WebSocket is and holding one of the token's socket slots
    until it closes. Raises Disconnected when the token holds all its
    slots."""
    if not server.sockets.open(grant):
        raise Disconnected(
            f"at most {server.sockets.limit_of(grant)} connections at once per token"
        )
    pair = LocalSocket()

    async def serve() -> None:
        try:
            await _serve_socket(server, pair.server_end, grant)
        finally:
            server.sockets.close(grant)
            pair.abort()

    pair.served = asyncio.create_task(serve())
    return pair


async def _serve_socket(server: Server, websocket: WebSocket | ServerEnd, grant: Grant) -> None:
    # Select only what we speak: echoing an offered ``huddle.token.*`` would
    # put the credential into the response headers.
    offered = list(websocket.scope.get("subprotocols") or [])
    subprotocol = AHP_SUBPROTOCOL if AHP_SUBPROTOCOL in offered else None
    await websocket.accept(subprotocol=subprotocol)

    async def close(code: int, reason: str) -> None:
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
            await websocket.close(code, reason)

    direct = websocket.scope.get("extensions", {}).get(WRITE_EXTENSION)
    connection = Connection(
        send=websocket.send_text,
        close=close,
        direct=DirectWriter(direct["write"], direct["abort"]) if direct else None,
        limits=server.settings.limits,
        metrics=server.metrics,
    )
    rpc = Rpc(connection, server.commands, grant, clients=server.clients, server_info=SERVER_INFO)
    server.connections.add(rpc)
    server.metrics.connections.inc()
    writer = connection.start_writer()
    try:
        await _read_frames(websocket, connection)
    finally:
        server.connections.discard(rpc)
        server.metrics.connections.dec()
        rpc.closed()
        connection.shut(CLOSE_GOING_AWAY, "")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer, 5)


async def _read_frames(websocket: WebSocket | ServerEnd, connection: Connection) -> None:
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


def api(method: str, path: str, handler: Handler, pays: str | None = None) -> Route:
    """The route ``method path``: authenticate, pay what the command
    ``pays`` names costs up front (server.commands.COSTS: 429 with
    ``Retry-After`` beyond the token's budget, :func:`over_budget`; None:
    the command pays in Commands.admit, after the permission check), then
    map the server's errors to HTTP answers. A request cut off by the stop
    (uvicorn cancels those still running after its graceful timeout) is
    answered 503, try again, like one the store refused: what it did may
    have landed, and a re-send with the same clientSeq says so."""

    async def endpoint(request: Request) -> Response:
        server: Server = request.app.state.server
        try:
            grant = authenticate(server, request)
            if pays is not None:
                await server.commands.pay(grant, pays)
            return await handler(request, server, grant)
        except RateLimited as error:
            return over_budget(error)
        except (HuddleError, MalformedFrame) as error:
            return http_answer(error)
        except asyncio.CancelledError:
            return retry_after(_problem(503, "the server is stopping: try again"), 1)

    return Route(path, endpoint, methods=[method])


def over_budget(error: RateLimited) -> Response:
    """429 for a request over its token's budget (a dispatch answers as a
    rejected action instead: :func:`http_answer`)."""
    return retry_after(_problem(429, error.sentence, code=error.code), error.retry_after)


def http_answer(error: HuddleError | MalformedFrame) -> Response:
    """The HTTP answer to an error of a request (its transport's shape of
    what the socket answers as a JSON-RPC error or a rejection echo)."""
    match error:
        case AuthError():
            return _auth_refusal(error, _problem(error.status, error.reason))
        case BodyTooLarge():
            return _problem(413, str(error))
        case MalformedFrame():
            return _problem(400, error.reason, path=error.path)
        case CommandError():
            status = 403 if error.code == ErrorCode.PERMISSION_DENIED else 409
            if error.code in (ErrorCode.SESSION_NOT_FOUND, ErrorCode.NOT_FOUND):
                status = 404
            return _problem(status, error.message, code=error.code)
        case ActionRejected():
            status = REJECTION_STATUS.get(error.code, 409)
            answer = _json({"rejectionReason": error.reason, "code": error.code}, status)
            if isinstance(error, RateLimited):
                return retry_after(answer, error.retry_after)
            return answer
        case ChannelGone():
            return _problem(404, str(error))
        case StoreUnavailable():
            return _problem(503, str(error))
    raise error


REJECTION_STATUS: dict[str, int] = {
    RejectionCode.FORBIDDEN: 403,
    RejectionCode.RATE_LIMITED: 429,
    RejectionCode.STORE_UNAVAILABLE: 503,
}
"""The HTTP status of a rejected action by its code (409 for the others)."""


async def _body(request: Request, server: Server) -> dict[str, Any]:
    """The request's JSON object body, read only up to ``max_body_bytes``
    (BodyTooLarge beyond, as soon as it is known: from Content-Length before
    a byte is read)."""
    return _json_object(await _raw_body(request, server))


async def _raw_body(request: Request, server: Server) -> bytes:
    limit = server.settings.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _json_object(raw: bytes) -> dict[str, Any]:
    body = decode_json(raw or b"{}")
    if not isinstance(body, dict):
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "the body must be a JSON object", "$")
    return body


async def create_session(request: Request, server: Server, grant: Grant) -> Response:
    server.commands.allow(grant, Command.CREATE_SESSION)
    await server.commands.admit(grant)  # the token's budget, before the body is read (429)
    body = await _body(request, server)
    uri = session_uri(str(body.get("id") or secrets.token_hex(8)))
    title, provider = body.get("title"), body.get("provider")
    chat = await server.commands.create_session(
        grant,
        uri,
        provider=provider if isinstance(provider, str) else None,
        title=title if isinstance(title, str) else None,
        path="$.id",
        admitted=True,
    )
    return _json({"session": uri, "chat": chat}, 201)


async def read_snapshot(request: Request, server: Server, grant: Grant) -> Response:
    """``GET /api/snapshot?channel=URI``: the channel's snapshot, a chat's
    windowed as the socket windows one: the newest turns that fit in what
    one answer may take (half of ``--send-buffer``), at most ``turns=N`` of
    them, and ``turnsNextCursor`` when older turns exist. With ``cursor=C``
    (a chat's): the turns before C, oldest first, as ``fetchTurns`` pages
    them (at most N, 50 unless asked), as many as fit in the same budget
    but at least one, ``{"resource", "turns", "turnsNextCursor"?}``. The
    answer's size is charged to the token (a debt)."""
    query = request.query_params
    uri = query.get("channel", "")
    turns = _positive(query.get("turns"), "$.turns")
    budget = server.settings.limits.answer_budget
    cursor = query.get("cursor")
    if cursor is not None:
        return await _older_turns(server, grant, uri, cursor, turns, budget)
    view = await server.commands.snapshot(grant, uri)
    state = view.state
    if isinstance(state, ChatState):
        state = server.commands.window(state, turns, budget)
    return _charged(server, grant, _json({"resource": uri, "state": state, "fromSeq": view.seq}))


def _charged(server: Server, grant: Grant, answer: Response) -> Response:
    """``answer``, its size charged to ``grant``'s token (a debt)."""
    server.commands.charge(grant, len(answer.body) // BYTES_PER_COST)
    return answer


async def _older_turns(
    server: Server, grant: Grant, chat: str, cursor: str, limit: int | None, budget: int
) -> Response:
    """A page of ``chat``'s turns before ``cursor`` (see read_snapshot)."""
    try:
        page, older = await server.commands.fetch_turns(grant, chat, cursor, limit, budget)
    except CommandError as error:
        if error.code != ErrorCode.INVALID_PARAMS:
            raise
        raise MalformedFrame(error.code, error.message, "$.cursor") from None
    answer: dict[str, Any] = {"resource": chat, "turns": page}
    if older is not None:
        answer["turnsNextCursor"] = older
    return _charged(server, grant, _json(answer))


def _positive(value: str | None, path: str) -> int | None:
    """A query parameter that must be a positive integer, if given."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 9) or int(value) < 1:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "expected a positive integer", path)
    return int(value)


async def read_audit(request: Request, server: Server, grant: Grant) -> Response:
    """The session's audit as JSON Lines (server.core.audit), streamed
    (:meth:`Commands.export_audit` charges it)."""
    uri = request.query_params.get("session", "")
    records = await server.commands.audit.export(grant, uri)
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in channel_id(uri))

    async def lines() -> AsyncIterator[bytes]:
        async for line in records:
            yield line + b"\n"

    return StreamingResponse(
        lines(),
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="audit-{name}.jsonl"'},
    )


async def read_audit_key(request: Request, server: Server, grant: Grant) -> Response:
    """``GET /api/audit/key``: the public keys that sign the audit
    (:meth:`Commands.audit_key`), for ``huddle audit verify --public-key``."""
    return _json(await server.commands.audit.key(grant))


async def set_expiry(request: Request, server: Server, grant: Grant) -> Response:
    """``POST /api/expiry``: an open wait's expiry (server.core.expiry), as the
    socket's ``huddle/expire``."""
    params = convert(await _body(request, server), ExpireParams, "$")
    return _json(ExpireResult(expires_at=await server.commands.expire(grant, params)))


async def dispatch_action(request: Request, server: Server, grant: Grant) -> Response:
    """Dispatch; with an ``Idempotency-Key``, a retry gets the first
    answer (server.edge.idempotency) and nothing is applied twice. Admitted as
    the socket's actions are (observers 403, the token's budget 429),
    before the body is read."""
    try:
        await server.commands.admit(grant)
    except ActionRejected as error:
        return http_answer(error)
    raw = await _raw_body(request, server)

    async def dispatch() -> Response:
        try:
            body = _json_object(raw)
            uri = body.get("channel")
            if not isinstance(uri, str):
                raise MalformedFrame(ErrorCode.INVALID_PARAMS, "Expected `str`", "$.channel")
            action: StateAction = convert(body.get("action"), StateAction, "$.action")  # type: ignore[arg-type]
            envelope = await server.commands.dispatch(grant, uri, action, admitted=True)
            return _json(envelope)
        except (HuddleError, MalformedFrame) as error:
            return http_answer(error)

    key = request.headers.get("idempotency-key")
    if key is None:
        return await dispatch()
    return await server.idempotency.once(grant, key, raw, dispatch)


async def wait_input(request: Request, server: Server, grant: Grant) -> Response:
    """Long poll: the outcome of an input request, or 408 after ``timeout``
    seconds (default 30, at most 300). A token holds at most LONG_POLLS
    (agents AGENT_LONG_POLLS) at once: 429 ``too-many`` beyond; a poll's
    slot is given back however it ends."""
    if not server.polls.open(grant):
        limit = server.polls.limit_of(grant)
        return _problem(
            429, f"at most {limit} long polls at once per token", code=RejectionCode.TOO_MANY
        )
    try:
        return await _wait_input(request, server, grant)
    finally:
        server.polls.close(grant)


async def _wait_input(request: Request, server: Server, grant: Grant) -> Response:
    chat = request.query_params.get("chat", "")
    request_id = request.query_params.get("request", "")
    try:
        timeout = min(300.0, float(request.query_params.get("timeout", "30")))
    except ValueError:
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS, "timeout must be a number", "$.timeout"
        ) from None
    try:
        async with asyncio.timeout(timeout):
            outcome = await _unless_hung_up(
                request, server.commands.wait_input(grant, chat, request_id)
            )
    except TimeoutError:
        return _problem(408, "still waiting: poll again")
    except InputAbandoned as error:
        return _problem(410, error.reason)
    except _HungUp:
        return Response(status_code=499)  # nobody reads it; the wait is given up
    return _json(
        {
            "response": outcome.response,
            "answers": outcome.answers,
            **({"data": outcome.data} if outcome.data is not None else {}),
            # ``by`` the name; ``who`` the whole identity (a shared link's
            # typed-in name is marked ``declared``).
            **({"by": outcome.by.name, "who": outcome.by.who()} if outcome.by is not None else {}),
        }
    )


class _HungUp(Exception):
    """The client of a long poll closed its connection."""


async def _unless_hung_up(request: Request, waiting: Awaitable[Any]) -> Any:
    """``waiting``'s result, unless the client hangs up first: then the wait
    is cancelled (nothing keeps waiting for a client that is gone) and
    _HungUp is raised."""
    wait = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_hang_up(request))
    try:
        await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not wait.done():
            wait.cancel()
        await asyncio.wait({wait, gone})
    if wait.cancelled():
        raise _HungUp
    return wait.result()  # or the wait's own error


async def _hang_up(request: Request) -> None:
    """Return when the client disconnects (ASGI ``http.disconnect``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def mint_token(request: Request, server: Server, grant: Grant) -> Response:
    server.commands.allow(grant, Command.MINT_TOKEN)
    body = await _body(request, server)
    token = server.commands.credentials.mint_token(
        grant,
        body.get("role"),
        sessions=body.get("sessions"),
        name=body.get("name"),
        ttl=body.get("ttl"),
    )
    # The web client link that carries it (what ``huddle invite`` prints).
    link = f"{str(request.base_url).rstrip('/')}/?token={token}"
    return _json({"token": token, "link": link})


# ─── MCP ─────────────────────────────────────────────────────────────────────


MCP_DOOR_CLIENT = "mcp-door"
"""The client id prefix of the MCP server's in-process connections."""


class McpEndpoint:
    """``/mcp``: Huddle's MCP server (server.mcp.door) for agent tokens,
    authenticated as the HTTP API is: no token or a bad one 401 with
    ``WWW-Authenticate: Bearer``, a participant's or an observer's 403; each
    request pays a read of the token's budget (429 beyond)."""

    def __init__(self, serve: Callable[[Grant, Scope, Receive, Send], Awaitable[None]]) -> None:
        self.serve = serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        server: Server = request.app.state.server
        try:
            grant = authenticate(server, request)
            if grant.role != "agent":
                raise AuthError(403, "Huddle's MCP server takes an agent token")
            await server.commands.pay(grant, "mcp")  # what its tools then do pays for itself
        except RateLimited as error:
            await over_budget(error)(scope, receive, send)
            return
        except AuthError as error:
            refusal = _auth_refusal(error, _problem(error.status, error.reason))
            if error.status == 401:
                refusal.headers["WWW-Authenticate"] = 'Bearer realm="huddle"'
            await refusal(scope, receive, send)
            return
        await self.serve(grant, scope, receive, send)


# ─── Notifications (server.notify; agent tokens only) ────────────────────────


async def add_webhook(request: Request, server: Server, grant: Grant) -> Response:
    """``POST /api/webhooks {url, events?, format?, sessions?, escalateAfter?}``:
    the endpoint with its secret, shown this once. The address the request
    came in on is the server's own too: no webhook may point at it."""
    server.commands.allow(grant, Command.MANAGE_WEBHOOKS)
    body = await _body(request, server)
    added = await server.commands.webhooks.add(grant, body, own=[str(request.base_url)])
    return _json(added, 201)


async def list_webhooks(request: Request, server: Server, grant: Grant) -> Response:
    return _json({"webhooks": await server.commands.webhooks.listed(grant)})


async def remove_webhook(request: Request, server: Server, grant: Grant) -> Response:
    await server.commands.webhooks.remove(grant, request.path_params["id"])
    return Response(status_code=204)


async def rotate_webhook_secret(request: Request, server: Server, grant: Grant) -> Response:
    return _json(await server.commands.webhooks.rotate_secret(grant, request.path_params["id"]))


async def read_deliveries(request: Request, server: Server, grant: Grant) -> Response:
    """``GET /api/webhooks/deliveries[?webhook=ID]``: each delivery's tries."""
    webhook = request.query_params.get("webhook")
    return _json({"deliveries": await server.commands.webhooks.deliveries(grant, webhook)})


async def resend_delivery(request: Request, server: Server, grant: Grant) -> Response:
    """``POST /api/webhooks/deliveries/{id}/resend [{target}]``: send it again now."""
    server.commands.allow(grant, Command.MANAGE_WEBHOOKS)
    target = (await _body(request, server)).get("target")
    delivery = request.path_params["id"]
    await server.commands.webhooks.resend(
        grant, delivery, target if isinstance(target, str) else None
    )
    return Response(status_code=202)


async def invite_by_email(request: Request, server: Server, grant: Grant) -> Response:
    """``POST /api/invites/email {email, name, role?, sessions?, ttl?}``."""
    server.commands.allow(grant, Command.MANAGE_WEBHOOKS)
    await server.commands.webhooks.invite_by_email(grant, await _body(request, server))
    return Response(status_code=204)


# ─── Health, metrics, web client ─────────────────────────────────────────────


async def healthz(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


async def readyz(request: Request) -> Response:
    server: Server = request.app.state.server
    try:
        ready = await server.parts.store.ready()
    except Exception:
        ready = False
    if ready:
        return Response("ready\n", media_type="text/plain")
    return Response("store unavailable\n", status_code=503, media_type="text/plain")


async def read_metrics(request: Request) -> Response:
    """Prometheus metrics, for the agent token or the metrics token."""
    server: Server = request.app.state.server
    token = token_of(request)
    scraper = server.settings.metrics_token
    if not (scraper and token and hmac.compare_digest(token.encode(), scraper.encode())):
        try:
            grant = authenticate(server, request)
            await server.commands.pay(grant, "metrics")
        except RateLimited as error:
            return over_budget(error)
        except AuthError as error:
            return _auth_refusal(error, _problem(error.status, error.reason))
        if grant.role != "agent":
            return _problem(403, "metrics need the agent token or the metrics token")
    return Response(server.metrics.render(), media_type="text/plain; version=0.0.4")


async def index(request: Request) -> Response:
    """The web client; ``?token=`` becomes a cookie and leaves the URL (a
    shared link's, a token of this browser's own). A token that does not
    verify sets nothing (a link must not plant someone else's credential in
    a browser). Where people sign in, a browser that holds no valid token
    is sent to sign in; a person a trusted proxy names whom no role rule
    takes is told so."""
    server: Server = request.app.state.server
    token = request.query_params.get("token")
    if not token and server.signin.enabled:
        try:
            authenticate(server, request)
        except AuthError as error:
            if error.status == 403:
                return notice(403, html.escape(error.reason))
            if server.signin.cookies and not isinstance(error, AuthThrottled):
                return RedirectResponse("/login", status_code=303)
    if token:
        try:
            grant = verify_token(server, request, token)
        except AuthThrottled as error:
            refusal = HTMLResponse(
                "<!doctype html><title>Huddle</title><p>Too many links that were not valid "
                "came from this address: try again in a moment.</p>",
                status_code=error.status,
            )
            return _auth_refusal(error, refusal)
        except AuthError as error:
            return HTMLResponse(
                "<!doctype html><title>Huddle</title><p>This link's token is not valid: "
                f"{html.escape(error.reason)}. Ask for a new link.</p>",
                status_code=error.status,
            )
        if grant.shared and grant.expires_at is not None:
            # A shared link's every browser gets a token of its own (the same
            # role, scope and lifetime, its own id): its own client ids and
            # idempotency keys, told apart in the audit; the rate budget
            # stays the link's (opening it again buys no more).
            token = server.authority.mint(
                grant.role,
                sessions=sorted(grant.sessions) if grant.sessions is not None else None,
                name=grant.name,
                expires_at=grant.expires_at,
                shared=True,
                link=grant.budget_key,
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
    parts: Parts,
    authority: TokenAuthority,
    *,
    on_start: Callable[[Server], Awaitable[None]] | None = None,
) -> Starlette:
    """The app serving ``parts``; they start and stop with it (the stores
    are closed when it stops)."""
    metrics = ServerMetrics()
    parts.host.add_hook(metrics.hook)
    if parts.service is not None:
        metrics.registry.register(parts.service.metrics)
    limits = parts.settings.limits
    budgets = Budgets(
        Budget(limits.actions_per_second, limits.action_burst),
        Budget(limits.agent_actions_per_second, limits.agent_action_burst),
        draw=parts.host.store.draw,
        wall=parts.clock,
    )
    commands = Commands(
        parts.host,
        authority,
        metrics=metrics,
        budgets=budgets,
        clock=parts.clock,
        default_ttl=parts.settings.participant_ttl,
        max_ttl=parts.settings.max_token_ttl,
        max_sessions=limits.max_sessions,
        client_claim_ttl=parts.settings.client_claim_ttl,
        notifier=parts.notifier,
    )
    hosts = allowed_hosts(parts.settings.host, parts.settings.allowed_hosts)
    if (warning := rebinding_warning(parts.settings.host, hosts)) is not None:
        log.warning(warning)
    server = Server(
        parts=parts,
        authority=authority,
        metrics=metrics,
        commands=commands,
        idempotency=Idempotency(
            parts.store,
            parts.settings.idempotency_ttl,
            pool=parts.settings.idempotency_pool or None,
        ),
        hosts=hosts,
        signin=SignIn(parts.settings, authority, commands.clock),
    )

    door_id = secrets.token_hex(4)

    async def connect(grant: Grant) -> HuddleClient:
        # A client id per process and token: claimed once, not per call.
        client_id = f"{MCP_DOOR_CLIENT}-{door_id}-{grant.token_id[:16]}"
        return await HuddleClient.connect(
            "huddle:in-process", "", client_id=client_id, opener=lambda: open_local(server, grant)
        )

    door = mcp_door(parts, connect)

    claims = Periodic(
        server.renew_claims,
        commands.credentials.claim_ttl / 4,
        log=log,
        what="renewing the client ids of open sockets",
        expected=(StoreError,),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await parts.start()
        if on_start is not None:
            await on_start(server)
        claims.start()
        try:
            async with door.running():
                yield
        finally:
            await claims.stop()
            for rpc in list(server.connections):
                rpc.connection.shut(CLOSE_GOING_AWAY, "the server is shutting down")
            await parts.stop()

    routes = [
        Route("/", index),
        WebSocketRoute("/ahp", ahp_socket),
        api("POST", "/api/sessions", create_session),
        api("GET", "/api/snapshot", read_snapshot, pays="snapshot"),
        api("GET", "/api/audit", read_audit, pays="audit"),
        api("GET", "/api/audit/key", read_audit_key, pays="auditKey"),
        api("POST", "/api/expiry", set_expiry, pays="expire"),
        api("POST", "/api/dispatch", dispatch_action),
        api("GET", "/api/input/wait", wait_input, pays="waitInput"),
        api("POST", "/api/tokens", mint_token, pays="mintToken"),
        Route("/mcp", McpEndpoint(door.serve), methods=["GET", "POST", "DELETE"]),
        api("GET", "/api/webhooks/deliveries", read_deliveries, pays="webhooks"),
        api("POST", "/api/webhooks/deliveries/{id}/resend", resend_delivery, pays="webhooks"),
        api("POST", "/api/webhooks", add_webhook, pays="webhooks"),
        api("GET", "/api/webhooks", list_webhooks, pays="webhooks"),
        api("DELETE", "/api/webhooks/{id}", remove_webhook, pays="webhooks"),
        api("POST", "/api/webhooks/{id}/secret", rotate_webhook_secret, pays="webhooks"),
        api("POST", "/api/invites/email", invite_by_email, pays="webhooks"),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", read_metrics),
    ]
    routes.extend(server.signin.routes())
    if WEB_ROOT.is_dir():
        routes.append(Mount("/web", StaticFiles(directory=WEB_ROOT), name="web"))
    middleware = [Middleware(Guard, hosts=hosts)]
    if server.signin.cookies:
        middleware.append(Middleware(SessionCookie, secret=authority.derived_key("session")))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware)
    app.state.server = server
    app.state.agents = parts.service
    return app
