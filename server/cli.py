"""The ``huddle`` command.

``huddle serve`` runs the server: the embedded store unless ``--store``
names another, an agent token from ``--token``/``HUDDLE_TOKEN`` (or a new
one, printed), and a link to the web client with a participant token, as
Jupyter prints one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import webbrowser
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from protocol.codec import MalformedFrame
from protocol.uris import SESSION_SCHEME, session_uri
from reducers.clock import iso_time
from server.auth import TokenAuthority, name_problem
from server.build import build, open_store
from server.config import Settings, settings_from
from server.core.audit import AuditBroken, PublicKeys, Verified, signed_export, verify
from server.core.audit_key import AuditKeys, read_public_keys
from server.edge.app import create_app
from server.edge.serve import UvicornServer, uvicorn_config
from server.errors import CommandError, StoreError
from server.notify.endpoints import Endpoints
from server.runner.service import load_agent

SPARE_WORKERS = (
    "workers more, at most, while tools wait for people (8): an MCP server's question "
    "holds its turn's worker until answered, and a spare runs other turns meanwhile"
)
AUDIT_KEY = (
    "a PEM file with the Ed25519 private key that signs the audit (default: one the "
    "store keeps, generated once, shared by every process on it)"
)
DRAIN_SECONDS = (
    "at a stop (SIGTERM, SIGINT), how long turns running here may go on to their next "
    "stop before another worker takes them over (10); 0: hand them on at once"
)


def _add_sign_in(serve: argparse.ArgumentParser) -> None:
    """The flags of signing in with the organisation's identity (docs/sign-in.md)."""
    sign_in = serve.add_argument_group("sign-in", "people sign in as themselves (docs/sign-in.md)")
    sign_in.add_argument("--oidc-issuer", metavar="URL", help="the OpenID provider's issuer URL")
    sign_in.add_argument("--oidc-client-id", metavar="ID", help="Huddle's client id there")
    sign_in.add_argument("--oidc-client-secret", metavar="SECRET", help="and its secret")
    sign_in.add_argument(
        "--oidc-role-claim", metavar="CLAIM", help="the ID token's claim listing groups (groups)"
    )
    sign_in.add_argument(
        "--oidc-role",
        dest="oidc_roles",
        action="append",
        metavar="ROLE=GROUP",
        help="participant=GROUP or observer=GROUP ('*': anyone), repeatable, the first match "
        "wins; a person matched by none is refused (default: everyone a participant)",
    )
    sign_in.add_argument(
        "--auth-proxy-header",
        metavar="HEADER",
        help="the header a trusted auth proxy names the person in (X-Forwarded-Email)",
    )
    sign_in.add_argument(
        "--auth-proxy-trusted",
        action="append",
        metavar="CIDR",
        help="a network whose requests' proxy header is believed (repeatable; default none)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="huddle",
        description="Huddle: a real-time, human-in-the-loop session server for AI agents.",
    )
    parser.add_argument("--version", action="version", version=f"huddle {version('huddle')}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the server",
        description="Run the Huddle server. Every flag has a HUDDLE_* variable "
        "(--max-subscriptions: HUDDLE_MAX_SUBSCRIPTIONS); a flag wins.",
    )
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8765; 0 picks one)")
    serve.add_argument(
        "--store",
        help="'memory' (default, embedded), redis://host:port/db (also rediss://, unix://) "
        "or a Redis Cluster: redis+cluster://host:port[,host:port...] (also rediss+cluster://)",
    )
    serve.add_argument("--token", help="the agent token (default: a new one, printed)")
    serve.add_argument(
        "--origin",
        dest="origins",
        action="append",
        metavar="ORIGIN",
        help="a browser origin allowed besides the server's own (repeatable; '*' for any)",
    )
    serve.add_argument(
        "--agent",
        help="the agent people's turns start: module:attribute (default: the demo, "
        "server.runner.demo:agent), or 'none' (outside agents connect with the agent token)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        help="worker tasks running turns in this process (1; 0 when `huddle worker` "
        "processes run them)",
    )
    serve.add_argument("--spare-workers", type=int, help=SPARE_WORKERS)
    serve.add_argument("--drain-seconds", type=float, help=DRAIN_SECONDS)
    serve.add_argument("--max-frame-bytes", type=int, help="largest frame accepted (1 MiB)")
    serve.add_argument(
        "--max-body-bytes", type=int, help="largest HTTP API body, refused unread (1 MiB)"
    )
    for name, what, default in (
        ("title", "a title", "1 KiB"),
        ("message", "a message, draft or streamed delta", "64 KiB"),
        ("answer", "one answer", "16 KiB"),
        ("tool-data", "a tool's input, result or content", "256 KiB"),
        ("action", "any one action", "512 KiB"),
        ("chat", "a chat's state before it takes no new turn", "16 MiB"),
    ):
        serve.add_argument(
            f"--max-{name}-bytes", type=int, help=f"JSON bytes {what} may take ({default})"
        )
    serve.add_argument(
        "--actions-per-second",
        type=float,
        help="actions a participant or observer token may send a second (50)",
    )
    serve.add_argument("--action-burst", type=int, help="actions a token may burst (100)")
    serve.add_argument(
        "--agent-actions-per-second",
        type=float,
        help="actions an agent token may send a second (2000)",
    )
    serve.add_argument(
        "--agent-action-burst", type=int, help="actions an agent token may burst (4000)"
    )
    serve.add_argument(
        "--max-token-ttl", type=float, help="longest lifetime of a minted token, seconds (90 days)"
    )
    serve.add_argument(
        "--client-claim-ttl",
        type=float,
        help="seconds the agent token keeps a client id after its last socket closed (1 day)",
    )
    serve.add_argument(
        "--metrics-token", help="a token that may read /metrics (the agent token may too)"
    )
    serve.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        metavar="HOST",
        help="a Host name the server answers to (repeatable; '*' for any; default: the "
        "loopback names when listening on loopback, any otherwise)",
    )
    _add_sign_in(serve)
    serve.add_argument("--max-subscriptions", type=int, help="subscriptions per connection (100)")
    serve.add_argument(
        "--max-chats", type=int, help="chats a session holds at most, its default chat too (1000)"
    )
    serve.add_argument(
        "--max-notes-bytes",
        type=int,
        help="bytes of a session's notes (who answered, who approved; the oldest are dropped "
        "beyond) (64 KiB)",
    )
    serve.add_argument(
        "--max-sessions",
        type=int,
        help="sessions the server holds at most; participant tokens create them only below "
        "nine tenths of it (10000)",
    )
    serve.add_argument(
        "--send-buffer",
        type=int,
        help="bytes a client may leave unread before it is cut off (4 MiB)",
    )
    serve.add_argument(
        "--flood-close-after",
        type=int,
        help="rate-limited actions in a row after which a client is closed (1000)",
    )
    serve.add_argument(
        "--replay-window", type=int, help="envelopes kept per channel for reconnect (1000)"
    )
    serve.add_argument(
        "--replay-window-bytes",
        type=int,
        help="bytes of envelopes kept per channel for reconnect (8 MiB)",
    )
    serve.add_argument(
        "--snapshot-every", type=int, help="actions between stored snapshots of a channel (100)"
    )
    serve.add_argument(
        "--audit-values",
        choices=("keep", "redact"),
        help="keep answer values and tool input in the audit, or redact them all (keep; "
        "fields a form marks writeOnly or x-huddle-sensitive are redacted either way)",
    )
    serve.add_argument(
        "--audit-max-records", type=int, help="records a session's audit holds at most (100000)"
    )
    serve.add_argument(
        "--audit-max-bytes",
        type=int,
        help="bytes of records a session's audit holds at most (268435456: 256 MiB)",
    )
    serve.add_argument("--audit-key", metavar="PATH", help=AUDIT_KEY)
    serve.add_argument(
        "--retention",
        help="remove a session finished this long (and a disposed one's audit): 90s, 15m, "
        "12h, 30d (default: keep everything)",
    )
    serve.add_argument(
        "--audit-dir", help="export a session's audit here (<session id>.jsonl) before removing it"
    )
    serve.add_argument(
        "--open-browser", action="store_true", default=None, help="open the web client"
    )
    serve.add_argument(
        "--public-url",
        help="the address people reach the server at, for the links notifications carry "
        "(default http://localhost:PORT)",
    )
    serve.add_argument(
        "--smtp-url",
        help="smtp://[user:password@]host:port (or smtps://) to email people invited with "
        "huddle invite --email",
    )
    serve.add_argument("--smtp-from", help="the From address of emails (huddle@localhost)")
    serve.add_argument(
        "--notify-interval", type=float, help="seconds between sweeps of the outbox (1)"
    )
    invite = commands.add_parser(
        "invite",
        help="print a web client link with a token of a person's own",
        description="Mint a token in NAME's name (signed with the agent token: HUDDLE_TOKEN "
        "or --token, the one the servers run with) and print the web client link that "
        "carries it. Everything NAME does through it is credited to NAME.",
    )
    invite.add_argument("name", metavar="NAME", help="the name the person goes by")
    invite.add_argument(
        "--session",
        dest="sessions",
        action="append",
        metavar="ID",
        help="a session the token reaches (repeatable; default: every session)",
    )
    invite.add_argument(
        "--role", choices=("participant", "observer"), default="participant", help="(participant)"
    )
    invite.add_argument("--ttl", type=float, help="lifetime in seconds (7 days; at most 90 days)")
    invite.add_argument(
        "--email",
        metavar="ADDRESS",
        help="also tell the running server (--url) to email ADDRESS each request opened in "
        "the token's sessions, with a sign-in link (the server needs --smtp-url)",
    )
    invite.add_argument("--token", help="the agent token (also HUDDLE_TOKEN)")
    invite.add_argument(
        "--url", help="the server's address (default http://localhost:8765; HUDDLE_URL)"
    )
    audit = commands.add_parser(
        "audit",
        help="export a session's audit, or check an exported one",
        description="A session's audit is a hash chain of records (JSON Lines): "
        "export it, from the store or from a running server, and verify it.",
    )
    audits = audit.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    exporting = audits.add_parser(
        "export",
        help="write a session's audit as JSON Lines",
        description="Read from --store (a redis:// URL; the embedded store lives in its "
        "server) or else from the server at --url with the agent token. Prints the "
        "record count and the last hash on stderr.",
    )
    exporting.add_argument("session", metavar="SESSION", help="the session's id or URI")
    exporting.add_argument("--store", help="the store to read: redis://host:port/db")
    exporting.add_argument("--url", help="the server (default http://localhost:8765; HUDDLE_URL)")
    exporting.add_argument("--token", help="the agent token (also HUDDLE_TOKEN)")
    exporting.add_argument("--out", help="the file to write (default: stdout)")
    exporting.add_argument(
        "--audit-key",
        metavar="PATH",
        help="with --store: the servers' --audit-key, to sign the export's end (default: "
        "the key the store keeps)",
    )
    verifying = audits.add_parser(
        "verify",
        help="check an exported audit's hash chain",
        description="Exit 0 when every record is in its place and unaltered, 1 naming the "
        "first line that is not. With --public-key, every record's signature and the "
        "export's signed end are checked too: nothing else is needed to trust it. "
        "Without, only the hashes are: anyone could have rewritten and rehashed it.",
    )
    verifying.add_argument("file", metavar="FILE", help="JSON Lines, as exported ('-': stdin)")
    verifying.add_argument(
        "--head", help="the last hash the export reported: also catches records cut off the end"
    )
    verifying.add_argument(
        "--public-key",
        dest="public_keys",
        action="append",
        metavar="KEY",
        help="the server's public key: the answer of GET /api/audit/key (a file, or its "
        "text), a PEM public key, or the key in base64; repeatable (keys rotated)",
    )
    webhook = commands.add_parser(
        "webhook",
        help="add, list or remove webhook endpoints",
        description="Webhook endpoints hear of requests opened, settled and expired "
        "(docs/notifications.md): managed on a running server (--url, with the agent token: "
        "HUDDLE_TOKEN or --token) or in the store itself (--store).",
    )
    webhooks = webhook.add_subparsers(dest="webhook_command", metavar="ACTION", required=True)
    adding = webhooks.add_parser("add", help="add an endpoint; prints its id and secret")
    adding.add_argument("target", metavar="URL", help="the http(s) URL to POST events to")
    adding.add_argument(
        "--event", dest="events", action="append", metavar="TYPE", help="(repeatable; all)"
    )
    adding.add_argument("--format", choices=("standard", "slack"), help="(standard)")
    adding.add_argument(
        "--session", dest="sessions", action="append", metavar="ID", help="(repeatable; all)"
    )
    adding.add_argument(
        "--escalate-after",
        type=float,
        metavar="SECONDS",
        help="send input.escalated when a wait is still open this long after it opened",
    )
    webhooks.add_parser("list", help="list the endpoints (never their secrets)")
    removing = webhooks.add_parser("remove", help="remove an endpoint")
    removing.add_argument("id", metavar="ID")
    for one in webhooks.choices.values():
        one.add_argument("--store", help="the store to change: redis://host:port/db")
        one.add_argument("--url", help="the server (default http://localhost:8765; HUDDLE_URL)")
        one.add_argument("--token", help="the agent token (also HUDDLE_TOKEN)")
    worker = commands.add_parser(
        "worker",
        help="run an agent's turns as a process of its own (Redis store)",
        description="Run workers that claim the agent's runnable turns from the shared "
        "store and show them in their chats. Needs the Redis store the servers use.",
    )
    worker.add_argument(
        "--store",
        help="the servers' Redis: redis://host:port/db or redis+cluster://host:port[,...] "
        "(also HUDDLE_STORE)",
    )
    worker.add_argument("--agent", help="module:attribute (default: the demo agent)")
    worker.add_argument("--workers", type=int, help="concurrent workers (1)")
    worker.add_argument("--spare-workers", type=int, help=SPARE_WORKERS)
    worker.add_argument("--drain-seconds", type=float, help=DRAIN_SECONDS)
    worker.add_argument("--audit-key", metavar="PATH", help=AUDIT_KEY)
    return parser


async def serve(settings: Settings) -> None:
    generated = settings.token is None
    token = settings.token or TokenAuthority.generate_agent_token()
    authority = TokenAuthority(token)
    parts = build(settings, agent=load_agent(settings.agent), authority=authority)
    app = create_app(parts, authority)

    def announce(port: int) -> None:
        host = "localhost" if settings.host in ("127.0.0.1", "0.0.0.0", "::") else settings.host
        if not settings.public_url:  # the port is known now (--port 0 picks one)
            parts.notifier.base_url = f"http://{host}:{port}"
        participant = authority.mint(
            "participant",
            name="participant",
            expires_at=time.time() + settings.participant_ttl,
            shared=True,
        )
        link = f"http://{host}:{port}/?token={participant}"
        if generated:
            print(f"Agent token (keep it secret; set HUDDLE_TOKEN to reuse it): {token}")
        print(f"Huddle is serving on http://{host}:{port}")
        print(f"Open the web client: {link}", flush=True)
        settle_heap()
        if settings.open_browser:
            webbrowser.open(link)

    server = UvicornServer(uvicorn_config(app, settings), on_listening=announce)
    await server.serve()


async def work(settings: Settings) -> None:
    """``huddle worker``: a host on the shared store, without a network edge,
    running the agent's turns until SIGTERM or SIGINT."""
    if settings.store == "memory":
        raise ValueError("huddle worker needs the shared store: --store redis://...")
    agent = load_agent(settings.agent)
    if agent is None:
        raise ValueError("huddle worker needs an agent: --agent module:attribute")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with build(settings, agent=agent).running():
        print(f"huddle worker: {settings.workers} worker(s) for {agent.name}", flush=True)
        settle_heap()
        await stop.wait()
        print(
            "huddle worker: stopping; turns running here go on for up to "
            f"{settings.drain_seconds:g} s, then another worker takes them over",
            flush=True,
        )


def settle_heap() -> int:
    """Once a process has started: leave what it holds now (modules,
    classes, schemas, the app: about 55,000 objects) out of the cyclic
    garbage collector's full passes, which otherwise walk all of it and
    stall the event loop (15 ms warm, 36 ms seen in a running server, for
    every connection at once). Returns how many objects that is."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def invite(args: argparse.Namespace, settings: Settings) -> str:
    """``huddle invite``: the web client link for a token in a person's name."""
    if not settings.token:
        raise ValueError("huddle invite needs the agent token: HUDDLE_TOKEN or --token")
    ttl = settings.participant_ttl if args.ttl is None else args.ttl
    if not 0 < ttl <= settings.max_token_ttl:
        raise ValueError(f"--ttl must be above 0 and at most {settings.max_token_ttl:.0f} seconds")
    if (problem := name_problem(args.name)) is not None:
        raise ValueError(problem)
    sessions = None
    if args.sessions:
        sessions = [s if s.startswith(SESSION_SCHEME) else session_uri(s) for s in args.sessions]
    token = TokenAuthority(settings.token).mint(
        args.role, sessions=sessions, name=args.name, expires_at=time.time() + ttl
    )
    base = (args.url or os.environ.get("HUDDLE_URL") or "http://localhost:8765").rstrip("/")
    if args.email:
        body = {"email": args.email, "name": args.name, "role": args.role, "ttl": ttl}
        if sessions is not None:
            body["sessions"] = sessions
        call_server(args, settings, "POST", "/api/invites/email", body)
    return f"{base}/?token={token}"


async def export_audit(args: argparse.Namespace, settings: Settings) -> list[bytes]:
    """``huddle audit export``: the session's records, each a line."""
    session = args.session if args.session.startswith(SESSION_SCHEME) else session_uri(args.session)
    return [line async for line in _audit_lines(args, settings, session)]


async def _audit_lines(
    args: argparse.Namespace, settings: Settings, session: str
) -> AsyncIterator[bytes]:
    if args.store:
        if args.store == "memory":
            raise ValueError("the embedded store lives in its server: leave out --store")
        store = open_store(settings)
        try:
            keys = AuditKeys(store, settings.audit_key, now_ms=lambda: int(time.time() * 1000))
            at = iso_time(int(time.time() * 1000))
            async for line in signed_export(store, session, await keys.signing(), at):
                yield line
        finally:
            await store.close()
        return
    query = urllib.parse.urlencode({"session": session})
    body = await asyncio.to_thread(call_server, args, settings, "GET", f"/api/audit?{query}")
    for line in body.splitlines():
        if line:
            yield line


def call_server(
    args: argparse.Namespace, settings: Settings, method: str, path: str, body: Any = None
) -> bytes:
    """``method path`` on the server ``--url`` (HUDDLE_URL) names, with the
    agent token; its answer's body. ValueError when it cannot be done."""
    if not settings.token:
        raise ValueError("asking a server needs the agent token: HUDDLE_TOKEN or --token")
    base = (args.url or os.environ.get("HUDDLE_URL") or "http://localhost:8765").rstrip("/")
    headers = {"Authorization": f"Bearer {settings.token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return bytes(response.read())
    except urllib.error.HTTPError as error:
        raise ValueError(f"the server answered {error.code}: {error.read().decode()}") from None
    except urllib.error.URLError as error:
        raise ValueError(f"cannot reach {base}: {error.reason}") from None


async def manage_webhooks(args: argparse.Namespace, settings: Settings) -> str:
    """``huddle webhook add|list|remove``: what to print."""
    if args.store:
        if args.store == "memory":
            raise ValueError("the embedded store lives in its server: use --url instead")
        store = open_store(settings)
        try:
            return await _in_store(args, settings, Endpoints(store))
        finally:
            await store.close()
    if args.webhook_command == "add":
        body = {
            "url": args.target,
            "events": args.events,
            "format": args.format,
            "sessions": args.sessions,
            "escalateAfter": args.escalate_after,
        }
        body = {k: v for k, v in body.items() if v is not None}
        added = json.loads(await asyncio.to_thread(call_server, args, settings, "POST", _WH, body))
        return _added(added["id"], added["secret"])
    if args.webhook_command == "list":
        listed = json.loads(await asyncio.to_thread(call_server, args, settings, "GET", _WH))
        return "\n".join(_line(e) for e in listed["webhooks"]) or "no webhooks"
    path = f"{_WH}/{urllib.parse.quote(args.id, safe='')}"
    await asyncio.to_thread(call_server, args, settings, "DELETE", path)
    return f"removed {args.id}"


_WH = "/api/webhooks"


async def _in_store(args: argparse.Namespace, settings: Settings, endpoints: Endpoints) -> str:
    if args.webhook_command == "add":
        endpoint, secret = await endpoints.add(
            "cli",
            args.target,
            own=[settings.base_url],
            now=time.time(),
            events=args.events,
            format=args.format,
            sessions=args.sessions,
            escalate_after=args.escalate_after,
        )
        return _added(endpoint.id, secret)
    if args.webhook_command == "list":
        return "\n".join(_line(e.listed()) for e in await endpoints.all()) or "no webhooks"
    if not await endpoints.remove(args.id):
        raise ValueError(f"no webhook {args.id!r}")
    return f"removed {args.id}"


def _added(endpoint_id: str, secret: str) -> str:
    return f"{endpoint_id}\nsecret (shown this once): {secret}"


def _line(endpoint: dict[str, Any]) -> str:
    """One endpoint as ``huddle webhook list`` prints it."""
    extra = [
        f"{key}={endpoint[key]}"
        for key in ("events", "format", "sessions", "escalateAfter", "escalate_after", "disabled")
        if endpoint.get(key) is not None
    ]
    return " ".join([str(endpoint["id"]), str(endpoint["url"]), *extra])


def webhook(args: argparse.Namespace, settings: Settings) -> int:
    try:
        print(asyncio.run(manage_webhooks(args, settings)))
    except (ValueError, OSError, StoreError, CommandError, MalformedFrame) as error:
        print(f"huddle: {error}", file=sys.stderr)
        return 2
    return 0


def audit(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.audit_command == "verify":
            print(verify_audit(args))
            return 0
        lines = asyncio.run(export_audit(args, settings))
        data = b"".join(line + b"\n" for line in lines)
        if args.out:
            with open(args.out, "wb") as out:
                out.write(data)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        result = verify(lines)
    except AuditBroken as error:
        print(f"huddle: the audit is broken at {error}", file=sys.stderr)
        return 1
    except (ValueError, OSError, StoreError) as error:
        print(f"huddle: {error}", file=sys.stderr)
        return 2
    print(f"{result.records} records, last hash {result.head}", file=sys.stderr)
    return 0


def verify_audit(args: argparse.Namespace) -> str:
    """``huddle audit verify``: what the file holds; raises AuditBroken
    (ValueError for a key that cannot be read)."""
    keys = public_keys(args.public_keys) if args.public_keys else None
    if args.file == "-":
        result = verify(sys.stdin.buffer, keys)
    else:
        with open(args.file, "rb") as lines:
            result = verify(lines, keys)
    if args.head and args.head != result.head:
        raise AuditBroken(result.records, "the last record is not the one the export reported")
    return said(result, signatures=keys is not None)


def public_keys(given: list[str]) -> PublicKeys:
    """The keys ``--public-key`` gives: each a file or the text itself."""
    keys: dict[str, Ed25519PublicKey] = {}
    for key in given:
        text = key
        if not key.lstrip().startswith(("{", "-----")) and os.path.isfile(key):
            with open(key, encoding="utf-8") as file:
                text = file.read(1 << 20)
        keys.update(read_public_keys(text))
    return keys


def said(result: Verified, *, signatures: bool) -> str:
    """What ``huddle audit verify`` says of an export it found whole."""
    whose = f"ok: {result.records} records of {result.session}"
    if not signatures:
        kept = " (it carries signatures: check them with --public-key)" if result.signed else ""
        return (
            f"{whose}, chain intact, last hash {result.head}; only the hashes were checked, "
            f"which anyone rewriting it can redo{kept}"
        )
    end = result.ended or {}
    legacy = result.records - result.signed
    before = (
        f"; the first {legacy} written before the audit was signed, covered by the signatures "
        "after them"
        if legacy
        else ""
    )
    return (
        f"{whose}, chain intact and signed (key {', '.join(sorted(result.keys))}){before}; "
        f"the export's signed end says {end.get('records')} records, last hash {result.head}, "
        f"exported at {end.get('at')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    flags: dict[str, Any] = vars(args)
    try:
        settings = settings_from(flags, os.environ)
    except ValueError as error:  # a flag or HUDDLE_ variable out of range: said as argparse would
        parser.error(str(error))
    if args.command == "invite":
        try:
            print(invite(args, settings))
        except ValueError as error:
            print(f"huddle: {error}", file=sys.stderr)
            return 2
        return 0
    if args.command == "audit":
        return audit(args, settings)
    if args.command == "webhook":
        return webhook(args, settings)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(settings) if args.command == "serve" else work(settings))
    except ValueError as error:
        print(f"huddle: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
