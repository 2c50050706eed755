"""The ``huddle`` command.

``huddle serve`` runs the server: the embedded store unless ``--store``
names another, an agent token from ``--token``/``HUDDLE_TOKEN`` (or a new
one, printed), and a link to the web client with a participant token, as
Jupyter prints one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import time
import webbrowser
from importlib.metadata import version
from typing import Any

from server.app import create_app
from server.auth import TokenAuthority
from server.build import build
from server.config import Settings, settings_from
from server.runner.service import load_agent
from server.serve import UvicornServer, uvicorn_config


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
    serve.add_argument("--max-subscriptions", type=int, help="subscriptions per connection (100)")
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
        "--open-browser", action="store_true", default=None, help="open the web client"
    )
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
    return parser


async def serve(settings: Settings) -> None:
    generated = settings.token is None
    token = settings.token or TokenAuthority.generate_agent_token()
    authority = TokenAuthority(token)
    app = create_app(build(settings, agent=load_agent(settings.agent)), authority)

    def announce(port: int) -> None:
        host = "localhost" if settings.host in ("127.0.0.1", "0.0.0.0", "::") else settings.host
        participant = authority.mint(
            "participant", name="participant", expires_at=time.time() + settings.participant_ttl
        )
        link = f"http://{host}:{port}/?token={participant}"
        if generated:
            print(f"Agent token (keep it secret; set HUDDLE_TOKEN to reuse it): {token}")
        print(f"Huddle is serving on http://{host}:{port}")
        print(f"Open the web client: {link}", flush=True)
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
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    flags: dict[str, Any] = vars(args)
    settings = settings_from(flags, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(settings) if args.command == "serve" else work(settings))
    except ValueError as error:
        print(f"huddle: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0
