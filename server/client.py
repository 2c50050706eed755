"""An async AHP client for agents, tools, tests and benchmarks.

    async with await HuddleClient.connect(url, token) as client:
        chat = await client.subscribe("ahp-chat:/...")      # a live Mirror
        await client.dispatch_and_wait(chat.uri, action)     # echo or raise
        outcome = await client.request_input(chat.uri, request)

Each subscription is a :class:`Mirror`: the channel's state kept current
with the same reducers the server runs, applying envelopes strictly in
``serverSeq`` order. When the socket drops, the client reconnects by itself
(with backoff), sends ``reconnect`` with one cursor per channel, and applies
the replay or the fresh snapshot; a mirror never skips or repeats a seq.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol, Self

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from protocol.actions import ChatInputRequested, StateAction
from protocol.chat import ChatState, InputAnswer, InputRequest
from protocol.codec import MalformedFrame, convert, decode_snapshot, encode
from protocol.messages import (
    CLIENT_ID_PATH,
    PROTOCOL_VERSION,
    ActionEnvelope,
    ChannelCursor,
    ChannelParams,
    ChannelState,
    DispatchActionParams,
    ErrorCode,
    ExpireParams,
    InitializeParams,
    ReconnectParams,
    Snapshot,
    SubscribeParams,
    SubscribeView,
)
from protocol.rejections import RejectionCode
from protocol.uris import ROOT_URI
from reducers import reduce
from reducers.chat import select_input_settlement
from server.errors import ActionRejected, InputAbandoned
from server.errors import Disconnected as Disconnected
from server.errors import ProtocolError as ProtocolError

EXTENSIONS = (
    "huddle.channelSeqs",
    "huddle.turnWindows",
    "huddle.titles",
    "huddle.identity",
    "huddle.expiry",
    "huddle.resend",
)
"""The Huddle extensions this client asks for (see server.edge.rpc.EXTENSIONS):
per-channel seqs and cursors, tail windows, titles, identity, expiries, and
re-sending what a drop left unconfirmed under its first clientSeq."""

log = logging.getLogger("huddle.client")


class Abortable(Protocol):
    def abort(self) -> None: ...


class Socket(Protocol):
    """What the client needs of its connection: a WebSocket
    (``websockets``' ClientConnection), or one inside the server's own
    process (server.edge.local). Iterating it yields the server's frames
    until it closes; a send on a closed one raises ConnectionClosed."""

    @property
    def transport(self) -> Abortable: ...

    async def send(self, message: str) -> None: ...

    async def close(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[str | bytes]: ...


Opener = Callable[[], Awaitable[Socket]]
"""Opens a connection that is not a WebSocket to ``url`` (raising
Disconnected when refused)."""


@dataclass(frozen=True)
class Completion:
    """How an input request was completed, as a client sees it."""

    response: str
    answers: dict[str, InputAnswer]


class Mirror:
    """A channel's state, kept current from its envelopes. The client's
    reader applies every frame in the order frames arrive (a subscribe's
    snapshot included), so a mirror never misses an envelope that followed
    its snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.uri = snapshot.resource
        self.state: ChannelState = snapshot.state
        self.seq = snapshot.from_seq
        self.listeners: list[Callable[[ActionEnvelope], None]] = []
        self._waiting: list[asyncio.Future[None]] = []

    def _changed(self) -> None:
        waiting, self._waiting = self._waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def _reset(self, snapshot: Snapshot) -> None:
        self.state, self.seq = snapshot.state, snapshot.from_seq
        self._changed()

    def _apply(self, envelope: ActionEnvelope, now_ms: int) -> bool:
        """Apply the next envelope; False when it leaves a gap."""
        if envelope.server_seq <= self.seq:
            return True
        if envelope.server_seq != self.seq + 1:
            return False
        self.state = reduce(self.state, envelope.action, now_ms)
        self.seq = envelope.server_seq
        for listener in list(self.listeners):
            listener(envelope)
        self._changed()
        return True

    async def wait_for(self, predicate: Callable[[ChannelState], bool]) -> ChannelState:
        """Wait until ``predicate(state)`` holds; returns that state. Bound
        it with ``asyncio.timeout``."""
        while not predicate(self.state):
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append(future)
            await future
        return self.state

    @property
    def chat(self) -> ChatState:
        assert isinstance(self.state, ChatState)
        return self.state


class HuddleClient:
    """A connection to a Huddle server; see the module docstring."""

    def __init__(
        self, url: str, token: str, *, client_id: str | None = None, opener: Opener | None = None
    ) -> None:
        self.url = url
        self.token = token
        self.opener = opener
        """How to connect when not by WebSocket to ``url`` with ``token``."""
        self.client_id = client_id or _fresh_client_id()
        self.mirrors: dict[str, Mirror] = {}
        self.notices: list[Callable[[str, Any], None]] = []
        self.connected = asyncio.Event()
        self.reconnects = 0
        self._ws: Socket | None = None
        self._ids = itertools.count(1)
        # A client id given again (by a process started again) goes on from
        # past the numbers it used before, not from 1 again: the server
        # takes a (clientId, clientSeq) it has seen for a re-send.
        self._seqs = itertools.count(1 if client_id is None else time.time_ns() // 1_000_000)
        self._calls: dict[int, tuple[asyncio.Future[Any], Callable[[Any], Any] | None]] = {}
        self._echoes: dict[int, asyncio.Future[ActionEnvelope]] = {}
        self._sent: dict[int, DispatchActionParams] = {}
        """What the awaited echoes answer, to send again after a drop."""
        self._stale_echoes: set[int] = set()
        self._reader: asyncio.Task[None] | None = None
        self._closed = False
        self._lost = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self.resumed: dict[str, str] = {}
        """How each channel resumed at the last reconnect: replay, snapshot
        or missing."""

    # ─── Connecting ──────────────────────────────────────────────────────

    @classmethod
    async def connect(
        cls,
        url: str,
        token: str,
        *,
        client_id: str | None = None,
        reconnect: bool = True,
        opener: Opener | None = None,
    ) -> Self:
        """Connect and initialize; with ``reconnect`` the client reconnects
        by itself after a drop. Raises Disconnected when refused."""
        client = cls(url, token, client_id=client_id, opener=opener)
        await client._open(initial=True)
        if reconnect:
            client._supervisor = asyncio.create_task(client._supervise())
        return client

    async def _open(self, *, initial: bool) -> None:
        ws = await (self.opener() if self.opener is not None else self._connect())
        self._ws = ws
        self._lost.clear()
        self._reader = asyncio.create_task(self._read(ws))
        raw = await self._initialize()
        self.protocol_version: str = raw["protocolVersion"]
        self.initial_snapshots = [decode_snapshot(s) for s in raw.get("snapshots", [])]
        if not initial:
            self.reconnects += 1  # counted before the mirrors catch up
            await self._resume()
        self.connected.set()

    async def _initialize(self) -> Any:
        """``initialize``; when another token holds this client's id, once
        more with a fresh random one. Ids are claimed per token, so one that
        somebody claimed first (guessed, or taken once its own token's
        window to come back had passed) can only refuse, never take this
        client over: no id anyone can predict locks it out. Actions awaiting
        their echo under the old id then fail: a re-send under the new one
        could not be told from a new action."""
        try:
            return await self.call("initialize", self._initialize_params())
        except ProtocolError as error:
            if error.code != ErrorCode.PERMISSION_DENIED or not _names_client_id(error.data):
                raise
        log.info("client id %s belongs to another token: starting with a fresh one", self.client_id)
        self.client_id = _fresh_client_id()
        self._stale_echoes.clear()
        self._fail_echoes(Disconnected("this client's id was taken: it started with a fresh one"))
        return await self.call("initialize", self._initialize_params())

    def _initialize_params(self) -> InitializeParams:
        return InitializeParams(
            channel=ROOT_URI,
            protocol_versions=[PROTOCOL_VERSION],
            client_id=self.client_id,
            capabilities={key: {} for key in EXTENSIONS},
        )

    async def _connect(self) -> ClientConnection:
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            return await connect(
                self.url, additional_headers=headers, compression=None, max_size=None
            )
        except InvalidStatus as error:
            status = error.response.status_code
            raise Disconnected(f"the server refused the connection ({status})") from None
        except InvalidHandshake as error:
            # E.g. a server that died after accepting the TCP connection.
            raise Disconnected(f"the handshake with {self.url} failed: {error}") from None
        except OSError as error:
            raise Disconnected(f"cannot reach {self.url}: {error}") from None

    async def _supervise(self) -> None:
        delay = 0.05
        while not self._closed:
            await self._lost.wait()
            self.connected.clear()
            if self._closed:
                return
            try:
                await self.reconnect()
            except Exception as error:
                # Whatever went wrong, keep trying: a client that stops
                # reconnecting leaves its callers waiting forever.
                log.info("reconnect failed: %s", error)
                await asyncio.sleep(delay)  # backoff between attempts
                delay = min(delay * 2, 2.0)
                self._lost.set()
                continue
            delay = 0.05

    @property
    def lost(self) -> asyncio.Event:
        """Set while the socket is down."""
        return self._lost

    async def reconnect(self) -> None:
        """Open a new socket, initialize with the same client id and resume
        every mirror from its last seq (replay or snapshot)."""
        await self._open(initial=False)

    async def _resume(self) -> None:
        cursors = [
            ChannelCursor(channel=m.uri, last_seen_server_seq=m.seq) for m in self.mirrors.values()
        ]
        if not cursors:
            await self._send_again()
            return

        def apply(result: Any) -> None:
            for item in result["channels"]:
                mirror = self.mirrors.get(item["channel"])
                if mirror is None:
                    continue
                self.resumed[mirror.uri] = item["type"]
                if item["type"] == "replay":
                    for envelope in item["actions"]:
                        self._on_raw_envelope(envelope)
                elif item["type"] == "snapshot":
                    mirror._reset(decode_snapshot(item["snapshot"]))
                else:
                    del self.mirrors[item["channel"]]

        params = ReconnectParams(channel=ROOT_URI, client_id=self.client_id, cursors=cursors)
        await self.call("reconnect", params, apply)
        await self._send_again()

    async def close(self) -> None:
        self._closed = True
        self._lost.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def _drop_socket(self) -> None:
        if self._ws is not None:
            self._ws.transport.abort()

    # ─── Reading ─────────────────────────────────────────────────────────

    async def _read(self, ws: Socket) -> None:
        try:
            async for text in ws:
                await self._on_frame(msgspec.json.decode(text))
        except ConnectionClosed:
            pass
        finally:
            self._fail_calls(Disconnected("the connection dropped"))
            if self._supervisor is None:
                self._fail_echoes(Disconnected("the connection dropped"))
            else:
                # These may still be echoed by the replay after reconnecting;
                # whatever is not, the reconnect fails.
                self._stale_echoes |= set(self._echoes)
            self._lost.set()

    async def _on_frame(self, frame: dict[str, Any]) -> None:
        if "method" not in frame:
            call = self._calls.pop(frame.get("id"), None)  # type: ignore[arg-type]
            if call is None or call[0].done():
                return
            future, on_result = call
            error = frame.get("error")
            if error is not None:
                future.set_exception(
                    ProtocolError(error.get("code"), error.get("message"), error.get("data"))
                )
                return
            try:
                # Applied here, before the next frame is read: envelopes
                # that follow a snapshot must find its mirror.
                value = on_result(frame.get("result")) if on_result else frame.get("result")
            except Exception as failure:
                future.set_exception(failure)
            else:
                future.set_result(value)
            return
        if frame["method"] == "action":
            self._on_raw_envelope(frame["params"])
            return
        for notice in list(self.notices):
            notice(frame["method"], frame.get("params"))

    def _on_raw_envelope(self, params: Any) -> None:
        """An envelope as received. One that does not decode (a server
        echoing a rejected action as it was sent: a number this client sent
        as NaN went out as null) is not applied; if it answers an action of
        ours, that action fails with the envelope's rejection. It used to
        end the reader, and the reconnect sent the action again, for ever."""
        try:
            envelope = convert(params, ActionEnvelope)
        except MalformedFrame as error:
            log.warning("an envelope that does not decode: %s", error)
            raw = params if isinstance(params, dict) else {}
            origin = raw.get("origin")
            if not isinstance(origin, dict) or origin.get("clientId") != self.client_id:
                return
            waiter = self._echoes.pop(origin.get("clientSeq"), None)  # type: ignore[arg-type]
            if waiter is not None and not waiter.done():
                reason = raw.get("rejectionReason")
                if not isinstance(reason, str):
                    reason = f"the echo of this action does not decode: {error}"
                waiter.set_exception(ActionRejected.parse(reason))
            return
        self._on_envelope(envelope)

    def _on_envelope(self, envelope: ActionEnvelope) -> None:
        origin = envelope.origin
        if origin is not None and origin.client_id == self.client_id:
            waiter = self._echoes.pop(origin.client_seq, None)
            if waiter is not None and not waiter.done():
                if envelope.rejection_reason is not None:
                    waiter.set_exception(ActionRejected.parse(envelope.rejection_reason))
                else:
                    waiter.set_result(envelope)
        if envelope.rejection_reason is not None:
            return
        mirror = self.mirrors.get(envelope.channel)
        if mirror is not None and not mirror._apply(envelope, _now_ms()):
            log.warning("gap on %s: resyncing", envelope.channel)
            self._drop_socket()

    def _fail_calls(self, error: BaseException) -> None:
        for future, _ in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()

    async def _send_again(self) -> None:
        """Send again the actions whose echo the drop cut off and the replay
        did not bring, with their own clientSeq: the server applies each once
        (one it took already answers with its first envelope). Echoes of
        actions sent since are left alone."""
        stale, self._stale_echoes = self._stale_echoes, set()
        for seq in sorted(stale):
            params = self._sent.get(seq)
            future = self._echoes.get(seq)
            if params is None or future is None or future.done():
                continue
            try:
                await self._notify("dispatchAction", params)
            except Disconnected as error:
                self._echoes.pop(seq, None)
                self._sent.pop(seq, None)
                future.set_exception(error)

    def _fail_echoes(self, error: BaseException) -> None:
        for future in self._echoes.values():
            if not future.done():
                future.set_exception(error)
        self._echoes.clear()
        self._sent.clear()

    # ─── Requests ────────────────────────────────────────────────────────

    async def call(
        self, method: str, params: Any, on_result: Callable[[Any], Any] | None = None
    ) -> Any:
        """Send a request and return its result (what ``on_result`` makes of
        it, run by the reader in frame order); raises ProtocolError."""
        if self._ws is None:
            raise Disconnected("not connected")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[request_id] = (future, on_result)
        frame = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            await self._ws.send(encode(frame).decode())
        except ConnectionClosed:
            self._calls.pop(request_id, None)
            raise Disconnected("the connection dropped") from None
        return await future

    async def _notify(self, method: str, params: Any) -> None:
        if self._ws is None:
            raise Disconnected("not connected")
        frame = {"jsonrpc": "2.0", "method": method, "params": params}
        try:
            await self._ws.send(encode(frame).decode())
        except ConnectionClosed:
            raise Disconnected("the connection dropped") from None

    async def subscribe(self, uri: str, *, turns: int | None = None) -> Mirror:
        """Subscribe and return the channel's live mirror."""
        view = SubscribeView(turns=turns) if turns is not None else None

        def install(result: Any) -> Mirror:
            mirror = Mirror(decode_snapshot(result["snapshot"]))
            self.mirrors[uri] = mirror
            return mirror

        mirror: Mirror = await self.call(
            "subscribe", SubscribeParams(channel=uri, view=view), install
        )
        return mirror

    async def unsubscribe(self, uri: str) -> None:
        self.mirrors.pop(uri, None)
        await self._notify("unsubscribe", ChannelParams(channel=uri))

    async def create_session(self, uri: str, *, title: str | None = None) -> None:
        params: dict[str, Any] = {"channel": uri}
        if title is not None:
            params["title"] = title
        await self.call("createSession", params)

    async def list_sessions(self) -> list[dict[str, Any]]:
        """Every session this token reaches, page by page."""
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = {"channel": ROOT_URI}
        while True:
            result = await self.call("listSessions", params)
            items.extend(result["items"])
            if not result.get("nextCursor"):
                return items
            params = {"channel": ROOT_URI, "cursor": result["nextCursor"]}

    async def dispatch(self, uri: str, action: StateAction) -> int:
        """Send an action without waiting; returns its ``clientSeq``."""
        seq = next(self._seqs)
        await self._notify(
            "dispatchAction", DispatchActionParams(channel=uri, client_seq=seq, action=action)
        )
        return seq

    async def dispatch_and_wait(self, uri: str, action: StateAction) -> ActionEnvelope:
        """Send an action and wait for its echo; raises ActionRejected.
        Subscribes to ``uri`` first if needed: only subscribers see echoes."""
        if uri not in self.mirrors:
            await self.subscribe(uri)
        seq = next(self._seqs)
        future: asyncio.Future[ActionEnvelope] = asyncio.get_running_loop().create_future()
        params = DispatchActionParams(channel=uri, client_seq=seq, action=action)
        self._echoes[seq] = future
        self._sent[seq] = params
        try:
            await self._notify("dispatchAction", params)
        except Disconnected:
            self._echoes.pop(seq, None)
            self._sent.pop(seq, None)
            raise
        try:
            return await future
        finally:
            self._sent.pop(seq, None)

    async def expire(
        self,
        chat: str,
        seconds: float,
        on_expiry: Literal["cancel", "decline", "fail"] = "cancel",
        *,
        request_id: str | None = None,
        tool_call_id: str | None = None,
    ) -> int:
        """Give an open input request (or a tool call waiting for approval)
        of ``chat`` an expiry (``huddle/expire``; agent tokens); returns
        when it expires, ms since the epoch."""
        params = ExpireParams(
            channel=chat,
            seconds=seconds,
            request_id=request_id,
            tool_call_id=tool_call_id,
            on_expiry=on_expiry,
        )
        result = await self.call("huddle/expire", params)
        return int(result["expiresAt"])

    async def request_input(
        self,
        chat: str,
        request: InputRequest,
        *,
        expires_in: float | None = None,
        on_expiry: Literal["cancel", "decline", "fail"] = "cancel",
    ) -> Completion:
        """Ask the people in ``chat`` (needs an agent token and an active
        turn) and wait for the completion. With ``expires_in`` seconds,
        nobody answering in time applies ``on_expiry`` (the completion is
        then ``cancel`` or ``decline``; ``fail`` ends the turn). Raises
        InputAbandoned when the turn ends or the chat is truncated first."""
        mirror = self.mirrors.get(chat) or await self.subscribe(chat)
        active = mirror.chat.active_turn
        if active is None:
            raise ActionRejected(
                RejectionCode.NO_ACTIVE_TURN, f"{chat} has no active turn to ask in"
            )
        await self.dispatch_and_wait(chat, ChatInputRequested(request=request))
        if expires_in is not None:
            await self.expire(chat, expires_in, on_expiry, request_id=request.id)

        def settled(state: ChannelState) -> bool:
            assert isinstance(state, ChatState)
            return select_input_settlement(state, request.id).status != "open"

        state = await mirror.wait_for(settled)
        assert isinstance(state, ChatState)
        outcome = select_input_settlement(state, request.id)
        if outcome.status != "resolved" or outcome.part is None or outcome.part.response is None:
            raise InputAbandoned(f"request {request.id}: the turn ended first")
        answers = dict(outcome.part.request.answers or {})
        return Completion(response=outcome.part.response, answers=answers)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _fresh_client_id() -> str:
    """A client id nobody can guess (so nobody can claim it first)."""
    return f"py-{secrets.token_hex(6)}"


def _names_client_id(data: Any) -> bool:
    """Whether an error's ``data`` names the ``clientId`` (another token holds it)."""
    return isinstance(data, dict) and data.get("path") == CLIENT_ID_PATH
