"""Helpers for the tests of the network edge: an AHP peer that sees every
frame exactly as the server wrote it, a peer that stops reading, HTTP over
the standard library, and a check that a server still serves.

The peer speaks through the real ``websockets`` client; HTTP goes through
``urllib`` in a worker thread (the server runs on the test's event loop),
without proxies and without following redirects.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame as WsFrame
from websockets.http11 import Response
from websockets.uri import parse_uri

from protocol.codec import encode
from protocol.messages import PROTOCOL_VERSION
from protocol.uris import ROOT_URI
from tests.conftest import UNIT, RunningServer

Frame = dict[str, Any]


HUDDLE = ("huddle.channelSeqs", "huddle.turnWindows", "huddle.titles", "huddle.resend")
"""Huddle's extensions: what these tests' peers ask for unless told (the
plain-AHP tests ask for none)."""


def plain_reconnect(client_id: str, subscriptions: list[str]) -> Frame:
    """AHP's reconnect params for ``client_id`` that has seen nothing yet."""
    return {
        "channel": ROOT_URI,
        "clientId": client_id,
        "lastSeenServerSeq": 0,
        "subscriptions": subscriptions,
    }


def initialize_params(
    client_id: str,
    versions: tuple[str, ...] = (PROTOCOL_VERSION,),
    extensions: tuple[str, ...] = HUDDLE,
) -> Frame:
    params: Frame = {"channel": ROOT_URI, "protocolVersions": list(versions), "clientId": client_id}
    if extensions:
        params["capabilities"] = {key: {} for key in extensions}
    return params


def rpc(method: str, params: Any, request_id: int | str | None = None) -> Frame:
    """A JSON-RPC request (with an id) or notification (without)."""
    frame: Frame = {"jsonrpc": "2.0", "method": method, "params": params}
    if request_id is not None:
        frame["id"] = request_id
    return frame


class Peer:
    """A raw AHP connection: frames in, frames out, nothing interpreted.

    Frames read while waiting for a response stay in ``backlog`` and come
    first from :meth:`receive`, so nothing is lost or reordered.
    """

    def __init__(self, ws: ClientConnection, client_id: str) -> None:
        self.ws = ws
        self.client_id = client_id
        self.backlog: deque[Frame] = deque()
        self._ids = itertools.count(1)
        self._seqs = itertools.count(1)

    @classmethod
    async def open(cls, url: str, token: str, client_id: str = "raw-peer") -> Self:
        """Connect (token as ``Authorization: Bearer``) without initializing."""
        ws = await connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            compression=None,
            proxy=None,
        )
        return cls(ws, client_id)

    @classmethod
    async def ready(
        cls,
        url: str,
        token: str,
        client_id: str = "raw-peer",
        extensions: tuple[str, ...] = HUDDLE,
    ) -> Self:
        """Connect and initialize (asking for ``extensions``)."""
        peer = await cls.open(url, token, client_id)
        reply = await peer.request(
            "initialize", initialize_params(client_id, extensions=extensions)
        )
        assert "result" in reply, reply
        return peer

    async def send(self, frame: Frame | str) -> None:
        """Send one text frame: a dict as JSON, a str as it is."""
        await self.ws.send(frame if isinstance(frame, str) else encode(frame).decode())

    async def _read(self) -> Frame:
        async with asyncio.timeout(5 * UNIT):
            data = await self.ws.recv()
        frame: Frame = json.loads(data)
        return frame

    async def receive(self) -> Frame:
        """The next frame from the server."""
        if self.backlog:
            return self.backlog.popleft()
        return await self._read()

    async def request(self, method: str, params: Any) -> Frame:
        """Send a request and return its response frame (result or error)."""
        request_id = next(self._ids)
        await self.send(rpc(method, params, request_id))
        skipped: list[Frame] = []
        try:
            while True:
                frame = await self._read()
                if "method" not in frame and frame.get("id") == request_id:
                    return frame
                skipped.append(frame)
        finally:
            self.backlog.extend(skipped)

    async def subscribe(self, channel: str) -> Frame:
        """Subscribe; returns the snapshot."""
        reply = await self.request("subscribe", {"channel": channel})
        assert "result" in reply, reply
        snapshot: Frame = reply["result"]["snapshot"]
        return snapshot

    async def dispatch(self, channel: str, action: Any) -> int:
        """Send ``dispatchAction``; returns its clientSeq."""
        seq = next(self._seqs)
        params = {"channel": channel, "clientSeq": seq, "action": action}
        await self.send(rpc("dispatchAction", params))
        return seq

    async def envelope(self) -> Frame:
        """The next frame, which must be an ``action`` notification."""
        frame = await self.receive()
        assert frame.get("method") == "action", frame
        envelope: Frame = frame["params"]
        return envelope

    async def close_code(self) -> int | None:
        """Read until the server closes; its close code (None: no close frame)."""
        async with asyncio.timeout(5 * UNIT):
            try:
                while True:
                    data = await self.ws.recv()
                    if isinstance(data, str):
                        self.backlog.append(json.loads(data))
            except ConnectionClosed as closed:
                return None if closed.rcvd is None else closed.rcvd.code

    async def close(self) -> None:
        await self.ws.close()


class StalledPeer:
    """A client that subscribes, then never reads another byte.

    It speaks WebSocket through ``websockets``' sans-I/O client over a plain
    socket with a small receive buffer, so the server's writes back up fast.
    """

    def __init__(self, sock: socket.socket, protocol: ClientProtocol) -> None:
        self.sock = sock
        self.protocol = protocol

    @classmethod
    async def subscribed(cls, running: RunningServer, token: str, channel: str) -> Self:
        """Connect, initialize and subscribe to ``channel``; from then on the
        peer reads nothing until :meth:`read_to_end`."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", running.port))
        protocol = ClientProtocol(parse_uri(running.ws))
        request = protocol.connect()
        request.headers["Authorization"] = f"Bearer {token}"
        protocol.send_request(request)
        peer = cls(sock, protocol)
        await peer._flush()
        await peer._receive_events(lambda e: isinstance(e, Response))
        assert protocol.handshake_exc is None, protocol.handshake_exc
        await peer.send(rpc("initialize", initialize_params("stalled"), 1))
        await peer.send(rpc("subscribe", {"channel": channel}, 2))
        replies = await peer._receive_events(lambda e: isinstance(e, WsFrame), count=2)
        assert all(b'"result"' in bytes(r.data) for r in replies if isinstance(r, WsFrame))
        return peer

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(self.sock, b"".join(self.protocol.data_to_send()))

    async def _receive_events(
        self, wanted: Callable[[object], bool], count: int = 1
    ) -> list[object]:
        loop = asyncio.get_running_loop()
        found: list[object] = []
        async with asyncio.timeout(5 * UNIT):
            while len(found) < count:
                self.protocol.receive_data(await loop.sock_recv(self.sock, 4096))
                found.extend(e for e in self.protocol.events_received() if wanted(e))
        return found

    async def send(self, frame: Frame) -> None:
        self.protocol.send_text(encode(frame))
        await self._flush()

    async def read_to_end(self) -> bytes:
        """Start reading at last: everything the server sent, up to its EOF."""
        loop = asyncio.get_running_loop()
        received = bytearray()
        async with asyncio.timeout(5 * UNIT):
            while chunk := await loop.sock_recv(self.sock, 1 << 16):
                received += chunk
        return bytes(received)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.sock.close()


# ─── HTTP ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: Message
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects())


def _fetch(request: urllib.request.Request, timeout: float) -> HttpReply:
    try:
        with _opener.open(request, timeout=timeout) as response:
            return HttpReply(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        with error:
            return HttpReply(error.code, error.headers, error.read())


async def http(
    method: str,
    url: str,
    *,
    token: str | None = None,
    body: Any = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> HttpReply:
    """One HTTP request; ``body`` is sent as JSON, ``data`` as it is. The
    socket timeout (10 UNIT) outlasts every long poll the tests make."""
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if body is not None:
        data = json.dumps(body).encode()
        sent["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=sent, method=method)
    return await asyncio.to_thread(_fetch, request, 10 * UNIT)


# ─── Waiting and checking ────────────────────────────────────────────────────


async def eventually(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` until it holds (at most 5 UNIT): only for facts
    inside the server that no event announces, such as a connection torn
    down or a long poll parked."""
    async with asyncio.timeout(5 * UNIT):
        while not predicate():  # noqa: ASYNC110 - nothing to await: the server announces nothing
            await asyncio.sleep(0.01)


async def assert_still_serving(running: RunningServer, session: str) -> None:
    """A fresh client connects, creates ``session`` and sees it ready."""
    async with asyncio.timeout(5 * UNIT):
        client = await running.client("agent", name="fresh")
        await client.create_session(session, title="still serving")
        mirror = await client.subscribe(session)
        assert getattr(mirror.state, "lifecycle", None) == "ready"
        await client.close()


# ─── A network that drops a frame's answer ───────────────────────────────────


class CuttingProxy:
    """A TCP proxy in front of a server that can cut a connection right
    after the client's next bytes went through and before anything comes
    back ("the socket cut after the frame is sent, before the echo
    arrives"), or right before they go through. Connections made after the
    cut pass untouched (held first, when :meth:`hold_new_connections` says so)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listening_port = 0
        self._armed = False
        self._forward_last = True
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()
        self._open.set()
        self.cuts = 0
        self._live: set[asyncio.Event] = set()

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listening_port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, path: str = "/ahp") -> str:
        return f"ws://127.0.0.1:{self.listening_port}{path}"

    def cut_after_next_send(self) -> None:
        """The next bytes a client sends are its last on that connection."""
        self._armed = True
        self._forward_last = True

    def cut_at_next_send(self) -> None:
        """The next bytes a client sends are lost, and the connection with
        them: the server never sees that frame."""
        self._armed = True
        self._forward_last = False

    def hold_new_connections(self) -> None:
        """Connections made from now on wait, accepted but not yet passed on
        to the server, until :meth:`release` (a client kept away while the
        server moves on)."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def go_silent(self) -> None:
        """The connections open now carry nothing more either way, and are
        not closed: a network gone dead under them (new ones pass)."""
        for silenced in self._live:
            silenced.set()

    async def close(self) -> None:
        self._open.set()
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._open.wait()
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        cut, silent = asyncio.Event(), asyncio.Event()
        self._live.add(silent)

        async def upstream() -> None:
            while data := await reader.read(65536):
                armed = self._armed  # frames are masked: the next chunk is the one
                if armed:
                    self._armed = False
                    cut.set()  # nothing more comes back on this connection
                if silent.is_set():
                    continue
                if not armed or self._forward_last:
                    up_writer.write(data)
                    await up_writer.drain()
                if armed:
                    self.cuts += 1
                    writer.transport.abort()
                    return

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if cut.is_set():
                    return
                if silent.is_set():
                    continue
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except (ConnectionError, OSError):
            pass
        finally:
            self._live.discard(silent)
            for task in tasks:
                task.cancel()
            writer.transport.abort()
            up_writer.transport.abort()
