"""MCP servers as tool sources of an agent.

    bookings = McpToolSource(McpServerConfig.stdio("bookings", "python", "-m", "bookings"))
    async with bookings:
        agent = Agent(..., tools=await bookings.list_tools(),
                      approval_policy=require_approval_for("book_table"))

Every tool the server lists becomes a runner :class:`~server.runner.agent.Tool`
(name, optionally prefixed; description; input schema), so the runner treats
it like any other: the agent's approval policy decides before it runs, the
turn shows the call in its chat, and its result (structured content, else its
text) is what the model gets; an ``isError`` result fails the call.

While an MCP tool runs, the elicitations of its server go to the people of
the turn's chat (:class:`~server.mcp.people.HostChat` through the chat
bridge's host), named after the server (``config.name``), in both protocol
flows (:func:`~server.mcp.calls.call_tool`), with the expiry of
``config.expiry``, else the agent's ``input_expiry``. One that runs out of
time with ``fail`` fails the call with
:class:`~server.mcp.errors.ElicitationExpired`, and so the turn. A call outside a turn with a
chat can still be made with :meth:`McpToolSource.call` and explicit people.

Connections are pooled: a call borrows one for itself (so an elicitation of
the 2025-11-25 flow, which names no call, reaches the right chat), keeps it
while people answer, and gives it back; at most ``keep_idle`` stay open.
Each connection lives in a task of its own, which enters and leaves the
SDK's ``Client`` (anyio wants both in the same task).

Every connection, the ones that only list tools included, declares the same
client capabilities: elicitation (form and URL), sampling when
``config.sampling`` is on, roots when ``config.roots`` lists some. A server
that offers a tool only to clients that can answer its questions lists it
to every path.

With ``mode="auto"`` a server may settle on 2026-07-28 and then refuse to
ask in it (FastMCP's tools fail with "elicitation ... is unavailable on
2026-07-28 connections"; the SDK's server answers -32600 "no back-channel
for server-initiated requests"): the call is made again over the
2025-11-25 handshake, and the source keeps to it from then on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeAlias

import httpx2
import mcp_types as types
from mcp.client import Client, Transport
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from server.core.expiry import Expiry
from server.core.policy import same_turn
from server.mcp.calls import call_tool
from server.mcp.elicitation import ChatElicitation, UrlCompletions
from server.mcp.errors import McpBridgeError, McpToolFailed
from server.mcp.people import HostChat, People
from server.mcp.sampling import ChatSampling, Roots
from server.runner.agent import Tool
from server.runner.context import ToolContext
from server.runner.model import ChatModel
from server.runner.showing import ChatShowing

log = logging.getLogger("huddle.mcp")

Target: TypeAlias = (
    Server[Any] | MCPServer | StdioServerParameters | Callable[[], AbstractAsyncContextManager[Any]]
)
"""An in-process server, a command to run (stdio), or a transport factory."""

_BROKEN = frozenset({types.CONNECTION_CLOSED})


@dataclass(frozen=True)
class McpServerConfig:
    """How to reach an MCP server, and how its tools show.

    ``name`` names it in the chat ("<name> asks: ...") and in logs;
    ``prefix`` is put before its tool names (to keep them apart from other
    sources'); ``mode`` is the SDK's: ``auto`` (2026-07-28 when the server
    speaks it, else the initialize handshake), ``legacy`` or a version.
    """

    name: str
    target: Target
    mode: str = "auto"
    prefix: str = ""
    read_timeout: float | None = None
    """Seconds one request may take; None, because people take their time."""
    link_wait: float = 300.0
    """Seconds to wait for a link's completion before calling again (-32042),
    unless the people say they are done first."""
    sampling: bool = False
    """Let the server ask for model completions (``sampling/createMessage``):
    the chat's people approve (and may edit) each, and the agent's model
    answers. Off: no sampling capability is declared."""
    roots: tuple[str, ...] = ()
    """Root URIs (``file://...``) the server may ask for (``roots/list``);
    none: no roots capability is declared."""
    expiry: Expiry | None = None
    """How long people have to answer the server's questions (elicitations,
    sampling approvals) and what then applies; None: the agent's
    ``input_expiry`` when a runner's tool calls, else no limit."""

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        *args: str,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> Self:
        """A server run as ``command args...``, spoken to over stdin/stdout."""
        params = StdioServerParameters(command=command, args=list(args), env=env, cwd=cwd)
        return cls(name, params, **options)

    @classmethod
    def http(
        cls, name: str, url: str, *, headers: dict[str, str] | None = None, **options: Any
    ) -> Self:
        """A server at ``url`` (streamable HTTP). Responses may wait on
        people, so reads never time out (``read_timeout`` bounds a request)."""
        fixed = dict(headers or {})

        def transport() -> AbstractAsyncContextManager[Any]:
            return _http_transport(url, fixed)

        return cls(name, transport, **options)

    @classmethod
    def in_process(cls, name: str, server: Server[Any] | MCPServer, **options: Any) -> Self:
        """A server object in this process (tests, embedded servers)."""
        return cls(name, server, **options)

    def connect_target(self) -> Server[Any] | MCPServer | StdioServerParameters | Transport:
        """What the SDK's ``Client`` connects to (a fresh transport each time)."""
        target = self.target
        if isinstance(target, Server | MCPServer | StdioServerParameters):
            return target
        transport: Transport = target()
        return transport


@contextlib.asynccontextmanager
async def _http_transport(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    timeout = httpx2.Timeout(30.0, read=None)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


# ─── One connection ──────────────────────────────────────────────────────────


def new_client(
    config: McpServerConfig,
    mode: str,
    elicitation: ChatElicitation,
    sampling: ChatSampling,
    completions: UrlCompletions,
) -> Client:
    """A ``Client`` for ``config`` declaring every capability it serves."""
    return Client(
        config.connect_target(),
        mode=mode,
        read_timeout_seconds=config.read_timeout,
        elicitation_callback=elicitation,
        sampling_callback=sampling if config.sampling else None,
        list_roots_callback=Roots(config.roots) if config.roots else None,
        message_handler=completions.message_handler,
    )


@dataclass(eq=False)
class _Connection:
    """A connected ``Client``, entered and left by a task of its own."""

    config: McpServerConfig
    completions: UrlCompletions
    mode: str = "auto"
    people: People | None = None
    """Who the current borrower's elicitations and sampling go to."""
    model: ChatModel | None = None
    """The model the current borrower's sampling goes to."""
    client: Client | None = None
    elicitation: ChatElicitation = field(init=False)
    sampling: ChatSampling = field(init=False)
    _task: asyncio.Task[None] | None = None
    _closing: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.elicitation = ChatElicitation(route=lambda: self.people, server=self.config.name)
        self.sampling = ChatSampling(lambda: (self.people, self.model), server=self.config.name)

    @property
    def modern(self) -> bool:
        return self.client is not None and self.client.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing.is_set()

    async def open(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        await ready

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        client = new_client(
            self.config, self.mode, self.elicitation, self.sampling, self.completions
        )
        try:
            async with client:
                self.client = client
                ready.set_result(None)
                await self._closing.wait()
        except BaseException as error:
            if not ready.done():
                failed = error if isinstance(error, Exception) else McpBridgeError("cancelled")
                ready.set_exception(failed)
            elif isinstance(error, Exception):
                log.warning("%s: the connection failed: %s", self.config.name, error)
            if not isinstance(error, Exception):
                raise

    async def close(self) -> None:
        self._closing.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._task


# ─── The source ──────────────────────────────────────────────────────────────


class McpToolSource:
    """An MCP server whose tools an agent may call; see the module docstring.

    Use it as an async context manager (or call :meth:`close`): it closes
    its connections (and stdio servers) at the end.
    """

    def __init__(self, config: McpServerConfig, *, keep_idle: int = 2) -> None:
        self.config = config
        self.keep_idle = keep_idle
        self.completions = UrlCompletions()
        self.mode = config.mode
        """The mode new connections use: the config's, until a server that
        refused to ask in 2026-07-28 made it ``legacy``."""
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closers: set[asyncio.Task[None]] = set()
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection (a call still running loses its own)."""
        self._closed = True
        self._idle.clear()
        for connection in list(self._open):
            await connection.close()
        self._open.clear()
        for task in list(self._closers):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    # ─── Tools ───────────────────────────────────────────────────────────

    async def list_tools(self) -> tuple[Tool, ...]:
        """The server's tools as runner tools (every page of its listing)."""
        async with self._borrow(None) as connection:
            assert connection.client is not None
            listed = await _listing(connection.client)
        return tuple(self._runner_tool(tool) for tool in listed)

    def list_tools_sync(self) -> tuple[Tool, ...]:
        """:meth:`list_tools` for code that defines an agent without an
        event loop to await in (``huddle serve --agent module:function``):
        it lists over a connection of its own, in a thread of its own, and
        blocks until done. The tools' calls use the pool as usual."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mcp-list") as thread:
            listed = thread.submit(asyncio.run, self._listing_once()).result()
        return tuple(self._runner_tool(tool) for tool in listed)

    async def _listing_once(self) -> list[types.Tool]:
        # The same capabilities as a pooled connection (nobody to ask while
        # listing: a question now gets an error).
        lister = _Connection(self.config, UrlCompletions(), self.mode)
        client = new_client(
            self.config, self.mode, lister.elicitation, lister.sampling, lister.completions
        )
        async with client:
            return await _listing(client)

    def _runner_tool(self, listed: types.Tool) -> Tool:
        name = listed.name

        async def run(arguments: dict[str, Any]) -> Any:
            return await self.call(
                name,
                arguments,
                people=people_of_current_call(),
                model=model_of_current_call(),
                expiry=self.config.expiry or input_expiry_of_current_call(),
            )

        title = listed.title or (listed.annotations.title if listed.annotations else None)
        return Tool(
            name=f"{self.config.prefix}{name}",
            description=listed.description or title or name,
            input_schema=dict(listed.input_schema),
            function=run,
            display_name=title,
        )

    async def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        people: People | None,
        model: ChatModel | None = None,
        expiry: Expiry | None = None,
    ) -> Any:
        """Call tool ``name`` (its name on the server) with its elicitations
        (and sampling, when on) put to ``people`` with ``expiry`` (default:
        ``config.expiry``), sampling answered by ``model``; returns the
        structured content, else the text. Raises McpToolFailed (an
        ``isError`` result), ElicitationExpired (a question nobody answered
        in time, with ``fail``), MCPError, and the bridge's errors."""
        while True:
            async with self._borrow(people, model, expiry or self.config.expiry) as connection:
                assert connection.client is not None
                falls_back = connection.modern and self.config.mode == "auto"
                try:
                    result = await call_tool(
                        connection.client,
                        name,
                        arguments,
                        elicitation=connection.elicitation,
                        completions=self.completions,
                        read_timeout=self.config.read_timeout,
                        link_wait=self.config.link_wait,
                    )
                except MCPError as error:
                    _raise_expired(connection)
                    if not (falls_back and refuses_to_ask(error)):
                        raise
                    result = None
                except McpToolFailed:
                    _raise_expired(connection)
                    raise
                _raise_expired(connection)
            if result is not None and not (falls_back and refuses_to_ask(result)):
                return tool_output(name, result)
            self._fall_back(name)

    def _fall_back(self, tool: str) -> None:
        log.info(
            "%s: %s cannot ask in the 2026-07-28 flow; calling again with 2025-11-25",
            self.config.name,
            tool,
        )
        self.mode = "legacy"
        for connection in self._idle:
            self._give_back(connection, healthy=False)
        self._idle.clear()

    # ─── The pool ────────────────────────────────────────────────────────

    @contextlib.asynccontextmanager
    async def _borrow(
        self, people: People | None, model: ChatModel | None = None, expiry: Expiry | None = None
    ) -> AsyncIterator[_Connection]:
        if self._closed:
            raise McpBridgeError(f"{self.config.name}: the tool source is closed")
        connection = self._take_idle() or await self._connect()
        connection.people, connection.model = people, model
        connection.elicitation.expiry = connection.sampling.expiry = expiry
        connection.elicitation.expired = connection.sampling.expired = None
        healthy = False
        try:
            yield connection
            healthy = True
        except (McpBridgeError, MCPError) as error:
            # The server answered; the connection is fine unless it closed.
            healthy = getattr(error, "code", None) not in _BROKEN
            raise
        finally:
            connection.people = connection.model = None
            connection.elicitation.expiry = connection.sampling.expiry = None
            self._give_back(connection, healthy)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if connection.alive and connection.mode == self.mode:
                return connection
            self._open.discard(connection)
        return None

    async def _connect(self) -> _Connection:
        connection = _Connection(self.config, self.completions, self.mode)
        await connection.open()
        self._open.add(connection)
        return connection

    def _give_back(self, connection: _Connection, healthy: bool) -> None:
        keep = healthy and connection.alive and connection.mode == self.mode
        if keep and not self._closed and len(self._idle) < self.keep_idle:
            self._idle.append(connection)
            return
        self._open.discard(connection)
        # Closed in a task of its own: giving back may happen while the
        # borrower is being cancelled, when it can await nothing.
        task = asyncio.get_running_loop().create_task(connection.close())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)


async def _listing(client: Client) -> list[types.Tool]:
    """Every page of the server's tool listing."""
    listed: list[types.Tool] = []
    cursor: str | None = None
    while True:
        page = await client.list_tools(cursor=cursor)
        listed.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return listed


def refuses_to_ask(outcome: types.CallToolResult | MCPError) -> bool:
    """Whether a server said it cannot ask (elicit, sample) in the
    2026-07-28 flow, the way the SDK's servers (-32600, no back-channel for
    ``elicitation/create`` or ``sampling/createMessage``) and FastMCP's
    (an ``isError`` result: "... unavailable on 2026-07-28 connections") do."""
    if isinstance(outcome, MCPError):
        text = outcome.error.message
        return outcome.error.code == types.INVALID_REQUEST and "back-channel" in text
    if not outcome.is_error:
        return False
    text = "\n".join(_content_text(block) for block in outcome.content).lower()
    asks = "elicitation" in text or "sampling" in text
    return asks and "2026-07-28" in text and "unavailable" in text


def _raise_expired(connection: _Connection) -> None:
    """Raise the ElicitationExpired of the call that just ended, if one of
    its questions ran out of time with ``fail`` (whatever the MCP server
    made of the error it got)."""
    expired = connection.elicitation.expired or connection.sampling.expired
    if expired is not None:
        raise expired


def input_expiry_of_current_call() -> Expiry | None:
    """The ``input_expiry`` of the agent whose tool runs now (None outside
    one)."""
    try:
        return ToolContext.current().input_expiry
    except LookupError:
        return None


def model_of_current_call() -> ChatModel | None:
    """The model of the agent whose tool runs now (None outside one)."""
    try:
        return ToolContext.current().model
    except LookupError:
        return None


def people_of_current_call() -> People | None:
    """The people of the chat of the turn whose tool runs now (None outside
    a runner tool call, or for a turn without a chat)."""
    try:
        context = ToolContext.current()
    except LookupError:
        return None
    port = context.port
    if context.chat is None or not isinstance(port, ChatShowing):
        return None
    chat_turn, stamp = context.chat_turn, context.chat_turn_stamp
    if chat_turn is None:
        return HostChat(port.host, context.chat, answering=context.people_answering)
    # Only in its own chat turn: one the tool's turn lost (cancelled, then
    # truncated away) may bear its id again, or the next one may be active.
    return HostChat(
        port.host,
        context.chat,
        lambda active: same_turn(active, chat_turn, stamp),
        answering=context.people_answering,
    )


def tool_output(name: str, result: types.CallToolResult) -> Any:
    """What the model gets from an MCP tool result: its structured content,
    else its content as text. Raises McpToolFailed for an ``isError`` one."""
    text = "\n".join(_content_text(block) for block in result.content)
    if result.is_error:
        raise McpToolFailed(name, text)
    if result.structured_content is not None:
        return result.structured_content
    return text


def _content_text(block: types.ContentBlock) -> str:
    match block:
        case types.TextContent():
            return block.text
        case types.ImageContent() | types.AudioContent():
            return f"[{block.type}: {block.mime_type}]"
        case types.ResourceLink():
            return f"[resource: {block.uri}]"
        case types.EmbeddedResource():
            resource = block.resource
            if isinstance(resource, types.TextResourceContents):
                return resource.text
            return f"[resource: {resource.uri}]"
    return ""
