"""Huddle as an MCP server: tools any MCP client (Claude Code, Cursor, VS
Code, an agent of its own) calls to ask the people of a chat, served over
streamable HTTP at ``/mcp`` by the official SDK's server side (whatever
versions it negotiates: 2025-11-25 and 2026-07-28).

==================  ==========================================================
tool                returns once people settle it
==================  ==========================================================
``ask_people``      ``{action, content, answered_by}``: an input request (a
                    flat JSON Schema form, frozen with the request so the host
                    refuses an accept that does not fit it, or AHP questions)
``request_approval``  ``{decision, arguments, reason, decided_by}``: a tool
                    call waiting for approval (approve, deny with a reason,
                    edit the arguments)
``ask_to_visit``    ``{action, answered_by}``: a URL request
``list_sessions``   the sessions the token reaches, with the web client's link
``create_session``  a new session, with the link to its chat
==================  ==========================================================

**Who asks.** The edge authenticates each HTTP request (an agent token, else
401/403) and hands the door its grant (:meth:`McpDoor.serve`). The door
speaks for that token through an AHP connection inside the process
(server.edge.local: the same command layer, policy, budgets and audit as a
WebSocket, the agent token credited), one per token while any of its calls
run (:class:`Askers`), through :class:`~server.mcp.people.RemoteChat` (which
opens a turn to ask in, and finds a request asked again after a restart).
``answered_by`` and ``decided_by`` are the server's word: the session's notes.

**Where.** ``chat``, else the default chat of ``session``, else the MCP
client's own session: one per token and client name (``clientInfo.name``),
its id a digest of both (server.runner.ids.door_session), so it is the same
in every process and after restarts and no mapping needs keeping. A token
scoped to sessions reaches only those: scoped to one, that one is its
default; scoped to several, a tool must name one.

**Waits.** A wait may take hours: while it lasts the door sends progress
notifications every ``progress_every`` seconds (to a client that sent a
progress token). A cancelled call (``notifications/cancelled``; on
2026-07-28 the response stream closed; on 2025-11-25 the client hung up,
which the SDK does not cancel: :meth:`McpDoor._waiting`) withdraws what it
asked (an approval is marked skipped); a stopping
server does not, so that the call made again after the restart with the same
``idempotency_key`` finds the same request (its id is a digest of the token,
the tool and the key: server.runner.ids.door_ask_id), or its answer. An
expiry (``expires_in``, ``on_expiry``) returns what its policy says: the
``cancel`` or ``decline`` action, an ``expired`` decision, or with ``fail``
a tool error.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal, TypeVar
from urllib.parse import quote

import anyio
import mcp_types as types
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from protocol.chat import InputAnswer, InputQuestion, InputRequest
from protocol.codec import MalformedFrame, convert
from protocol.messages import ErrorCode
from protocol.session import SessionState
from protocol.uris import ROOT_URI, BadChannelUri, channel_id, channel_kind, session_uri
from server.auth import Grant, Identity
from server.client import HuddleClient, ProtocolError
from server.core.expiry import Expiry
from server.core.frozen_forms import FormRegistry
from server.errors import HuddleError, InputAbandoned
from server.mcp.elicitation import (
    DONE_SCHEMA,
    Question,
    ask_once,
    asked_by,
    form_content,
    question_for,
)
from server.mcp.errors import ElicitationExpired, Unaskable
from server.mcp.people import Decision, RemoteChat, person
from server.runner.ids import door_ask_id, door_session

GRANT: Final = "huddle.grant"
"""The scope key the door reads the request's grant from."""
HUNG_UP: Final = "huddle.hung_up"
"""The scope key of an event set once the HTTP request's client hung up."""
WITHDRAW_WITHIN: Final = 5.0
"""Seconds a withdrawal may take once the call is cancelled."""
MAX_KEY: Final = 200
"""Characters of an idempotency key."""
MAX_CLIENT_NAME: Final = 100
"""Characters of an MCP client's name used to name its session."""
MAX_PROGRESS_EVERY: Final = 30.0
"""Seconds between progress notifications at most: the issue's promise to
clients that time out on a quiet call."""
LISTED: Final = 100
"""Sessions ``list_sessions`` returns at most (the most recent)."""

INSTRUCTIONS: Final = (
    "Huddle puts your questions to the people in a shared chat, who answer live. "
    "Use ask_people for information or a decision you need from a person, "
    "request_approval before a risky action, ask_to_visit when a person must open a link. "
    "Each call waits until someone answers (possibly hours). Pass the same idempotency_key "
    "when you call again after an error or a restart: you get the same request, never a "
    "second one."
)

T = TypeVar("T")
Expiring = Literal["cancel", "decline", "fail"]

# The arguments several tools take, as the model reads them.
InChat = Annotated[str | None, Field(description="The chat URI to ask in")]
InSession = Annotated[str | None, Field(description="A session URI: ask in its default chat")]
ExpiresIn = Annotated[float | None, Field(description="Seconds to wait for people at most")]
OnExpiry = Annotated[Expiring, Field(description="What a wait that expires returns")]
IdempotencyKey = Annotated[
    str | None,
    Field(
        description="Call again with the same key (after an error, a timeout or a restart) "
        "to get the same request or its answer, never a second one",
        max_length=MAX_KEY,
    ),
]


# ─── Results ─────────────────────────────────────────────────────────────────


class Person(BaseModel):
    """Who answered, as the server knows them (never a name the agent chose)."""

    name: str
    role: str
    token: str = Field(description="The id of the token they used (not the token)")
    declared: bool = Field(default=False, description="A name they typed in on a shared link")
    email: str | None = Field(default=None, description="A signed-in person's email")
    issuer: str | None = Field(default=None, description="Who vouches for a signed-in person")

    @classmethod
    def of(cls, who: Identity | None) -> Person | None:
        told = person(who)
        return None if told is None else cls(**told)


class PeopleAnswer(BaseModel):
    action: Literal["accept", "decline", "cancel"] = Field(
        description="accept: submitted (content holds the answers); decline: refused; "
        "cancel: dismissed, withdrawn or expired"
    )
    content: dict[str, Any] | None = Field(
        default=None, description="On accept: the answers, checked against the schema, by field"
    )
    answered_by: Person | None = None


class ApprovalDecision(BaseModel):
    decision: Literal["approved", "denied", "expired"]
    arguments: dict[str, Any] = Field(
        description="The arguments to run the tool with: as a person edited them, else yours"
    )
    reason: str | None = Field(default=None, description="Why it was denied, when a person said")
    decided_by: Person | None = None


class VisitAnswer(BaseModel):
    action: Literal["accept", "decline", "cancel"] = Field(
        description="accept: a person agreed to open the link"
    )
    answered_by: Person | None = None


class SessionLink(BaseModel):
    session: str
    title: str
    chat: str | None = None
    link: str = Field(description="The web client's page of the session's chat (no token in it)")


class SessionList(BaseModel):
    sessions: list[SessionLink]


# ─── The connections it speaks through ───────────────────────────────────────


@dataclass
class _Chat:
    people: RemoteChat
    users: int = 0


@dataclass
class _Held:
    client: HuddleClient
    users: int = 0
    chats: dict[str, _Chat] = field(default_factory=dict)


class Askers:
    """The in-process connections the door speaks through: one per token
    while any of its calls run (``connect`` opens it), and on it one
    RemoteChat per chat while calls ask there (concurrent calls share the
    turn it asks in). Both go when their last call ends: what the door holds
    is bounded by the calls running."""

    def __init__(self, connect: Callable[[Grant], Awaitable[HuddleClient]]) -> None:
        self._connect = connect
        self._held: dict[str, _Held] = {}
        self._opening = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def client(self, grant: Grant) -> AsyncIterator[_Held]:
        async with self._opening:
            held = self._held.get(grant.token_id)
            if held is None:
                held = self._held[grant.token_id] = _Held(await self._connect(grant))
            held.users += 1
        try:
            yield held
        finally:
            held.users -= 1
            if held.users == 0 and self._held.get(grant.token_id) is held:
                del self._held[grant.token_id]
                with anyio.CancelScope(shield=True):
                    await held.client.close()

    @contextlib.asynccontextmanager
    async def people(self, held: _Held, chat: str, asker: str) -> AsyncIterator[RemoteChat]:
        entry = held.chats.get(chat)
        if entry is None:
            opening = f"{asker} asks the people here"
            entry = held.chats[chat] = _Chat(RemoteChat(held.client, chat, opening=opening))
        entry.users += 1
        try:
            yield entry.people
        finally:
            entry.users -= 1
            if entry.users == 0 and held.chats.get(chat) is entry:
                del held.chats[chat]
                # Its subscription goes with it (a connection holds few).
                with anyio.CancelScope(shield=True), contextlib.suppress(HuddleError):
                    await held.client.unsubscribe(chat)


# ─── The door ────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Caller:
    """Who calls a tool: the request's grant, the MCP client's name, and
    the server's address as the client reached it (for links)."""

    grant: Grant
    client: str
    base_url: str


class McpDoor:
    """See the module docstring. :meth:`serve` is the ASGI entry (after the
    edge authenticated the request); :meth:`running` is held while the
    server runs."""

    def __init__(
        self,
        askers: Askers,
        forms: FormRegistry,
        *,
        progress_every: float = 15.0,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        if not 0 < progress_every <= MAX_PROGRESS_EVERY:
            raise ValueError(
                f"the MCP progress interval is above 0 and at most {MAX_PROGRESS_EVERY:.0f} "
                f"seconds (clients time out on quiet calls), not {progress_every}"
            )
        self.askers = askers
        self.forms = forms
        self.progress_every = progress_every
        self.stopping = False
        self.mcp: MCPServer[Any] = MCPServer(
            "huddle", title="Huddle", instructions=INSTRUCTIONS, version="0.1.0"
        )
        self.mcp.add_tool(self.ask_people, description=ASK_PEOPLE)
        self.mcp.add_tool(self.request_approval, description=REQUEST_APPROVAL)
        self.mcp.add_tool(self.ask_to_visit, description=ASK_TO_VISIT)
        self.mcp.add_tool(self.list_sessions, description=LIST_SESSIONS)
        self.mcp.add_tool(self.create_session, description=CREATE_SESSION)
        # The edge guards Host and Origin (server.edge.headers) and the token.
        self.mcp.streamable_http_app(
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=max_body_bytes,
        )
        self.manager = self.mcp.session_manager

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's sessions, for as long as this is held; at the end the
        calls still waiting are cut off without withdrawing what they asked."""
        async with self.manager.run():
            try:
                yield
            finally:
                self.stopping = True

    async def serve(self, grant: Grant, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request of ``grant``'s. Its MCP session is bound
        to the token (the SDK answers another token's use of it as an
        unknown session)."""
        principal = AccessToken(token=grant.token_id, client_id=grant.token_id, scopes=[grant.role])
        hung_up = asyncio.Event()

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                hung_up.set()
            return message

        scope = {**scope, GRANT: grant, HUNG_UP: hung_up, "user": AuthenticatedUser(principal)}
        await self.manager.handle_request(scope, receiving, send)

    # ─── Tools ───────────────────────────────────────────────────────────

    async def ask_people(
        self,
        ctx: Context,
        message: Annotated[str, Field(description="What you ask, as the people will read it")],
        schema: Annotated[
            dict[str, Any] | None,
            Field(
                description="A flat JSON Schema object (as MCP elicitation allows: string, "
                "number, integer, boolean, enum and arrays of enum properties) for the "
                "answer; omit it (and questions) to ask for a plain accept or decline"
            ),
        ] = None,
        questions: Annotated[
            list[dict[str, Any]] | None,
            Field(description="AHP input questions instead of a schema (advanced)"),
        ] = None,
        chat: InChat = None,
        session: InSession = None,
        expires_in: ExpiresIn = None,
        on_expiry: OnExpiry = "cancel",
        idempotency_key: IdempotencyKey = None,
    ) -> PeopleAnswer:
        caller = self._caller(ctx)
        expiry = _expiry(expires_in, on_expiry)
        request_id = door_ask_id(caller.grant.token_id, "ask_people", idempotency_key)
        question = _question(caller.client, message, schema, questions, request_id)
        async with _told(), self._people(caller, chat, session) as people:
            if question.schema is not None:
                await self._freeze(people, question)
            try:
                reply = await self._waiting(
                    ctx, ask_once(people, question, expiry, withdrawing=self._withdrawing)
                )
            except InputAbandoned:
                return PeopleAnswer(action="cancel")
        by = Person.of(reply.answered_by)
        if reply.response != "accept":
            return PeopleAnswer(action=reply.response, answered_by=by)
        return PeopleAnswer(
            action="accept", content=_content(question, reply.answers), answered_by=by
        )

    async def request_approval(
        self,
        ctx: Context,
        tool: Annotated[str, Field(description="The name of the tool (or action) to approve")],
        arguments: Annotated[
            dict[str, Any], Field(description="The arguments you would run it with")
        ],
        reason: Annotated[
            str | None, Field(description="Why you want to run it, shown to the people")
        ] = None,
        chat: InChat = None,
        session: InSession = None,
        expires_in: ExpiresIn = None,
        on_expiry: OnExpiry = "cancel",
        idempotency_key: IdempotencyKey = None,
    ) -> ApprovalDecision:
        caller = self._caller(ctx)
        expiry = _expiry(expires_in, on_expiry)
        call_id = door_ask_id(caller.grant.token_id, "request_approval", idempotency_key)
        async with _told(), self._people(caller, chat, session) as people:
            try:
                decision = await self._waiting(
                    ctx,
                    people.approve(tool, arguments, reason=reason, expiry=expiry, call_id=call_id),
                )
            except (ElicitationExpired, InputAbandoned) as why:
                decision = _unsettled(why, arguments)
            except BaseException:
                if self._withdrawing():
                    with anyio.CancelScope(shield=True), anyio.move_on_after(WITHDRAW_WITHIN):
                        await people.withdraw_call(call_id)
                raise
        return _approval(decision)

    async def ask_to_visit(
        self,
        ctx: Context,
        url: Annotated[str, Field(description="The http(s) link a person should open")],
        message: Annotated[str, Field(description="Why, as the people will read it")],
        chat: InChat = None,
        session: InSession = None,
        idempotency_key: IdempotencyKey = None,
    ) -> VisitAnswer:
        caller = self._caller(ctx)
        request_id = door_ask_id(caller.grant.token_id, "ask_to_visit", idempotency_key)
        params = types.ElicitRequestURLParams(message=message, url=url, elicitation_id=request_id)
        question = _asked(lambda: question_for(params, server=caller.client, request_id=request_id))
        async with _told(), self._people(caller, chat, session) as people:
            try:
                reply = await self._waiting(
                    ctx, ask_once(people, question, None, withdrawing=self._withdrawing)
                )
            except InputAbandoned:
                return VisitAnswer(action="cancel")
        return VisitAnswer(action=reply.response, answered_by=Person.of(reply.answered_by))

    async def list_sessions(self, ctx: Context) -> SessionList:
        caller = self._caller(ctx)
        async with _told(), self.askers.client(caller.grant) as held:
            # One page, the most recent (not every session, page by page).
            page = await held.client.call("listSessions", {"channel": ROOT_URI, "limit": LISTED})
        items: list[dict[str, Any]] = page["items"]
        return SessionList(
            sessions=[
                SessionLink(
                    session=item["resource"],
                    title=item.get("title") or "",
                    link=web_link(caller.base_url, item["resource"]),
                )
                for item in items
            ]
        )

    async def create_session(
        self, ctx: Context, title: Annotated[str, Field(description="The session's title")]
    ) -> SessionLink:
        caller = self._caller(ctx)
        if caller.grant.sessions is not None:
            raise ToolError("this token reaches only the sessions it was given: it cannot make one")
        uri = session_uri(secrets.token_hex(8))
        async with _told(), self.askers.client(caller.grant) as held:
            await held.client.create_session(uri, title=title)
            chat = await self._default_chat(held.client, uri)
        return SessionLink(
            session=uri, title=title, chat=chat, link=web_link(caller.base_url, uri, chat)
        )

    # ─── Helpers ─────────────────────────────────────────────────────────

    def _caller(self, ctx: Context) -> Caller:
        request = ctx.request_context.request
        grant = request.scope.get(GRANT) if isinstance(request, Request) else None
        if not isinstance(request, Request) or not isinstance(grant, Grant):
            raise ToolError("Huddle's tools are served over HTTP with an agent token")
        params = ctx.session.client_params
        info = params.client_info if params is not None else None
        name = (info.name if info is not None else "") or "An MCP client"
        base = str(request.base_url).rstrip("/")
        return Caller(grant, name[:MAX_CLIENT_NAME], base)

    def _withdrawing(self) -> bool:
        return not self.stopping

    @contextlib.asynccontextmanager
    async def _people(
        self, caller: Caller, chat: str | None, session: str | None
    ) -> AsyncIterator[RemoteChat]:
        """The people of the chat a tool asks in (see the module docstring)."""
        async with self.askers.client(caller.grant) as held:
            uri = await self._chat_of(held.client, caller, chat, session)
            async with self.askers.people(held, uri, caller.client) as people:
                await people.turn.mirror()  # the token reaches it: else not found
                yield people

    async def _chat_of(
        self, client: HuddleClient, caller: Caller, chat: str | None, session: str | None
    ) -> str:
        if chat is not None:
            _expect(chat, "chat")
            return chat
        if session is not None:
            _expect(session, "session")
            found = await self._default_chat(client, session)
        else:
            found = await self._own_chat(client, caller)
        if found is None:
            raise ToolError(f"{session or 'the session'} has no chat to ask in")
        return found

    async def _own_chat(self, client: HuddleClient, caller: Caller) -> str | None:
        """The default chat of the MCP client's own session (created on
        first use), or of the one session a scoped token reaches."""
        scope = caller.grant.sessions
        if scope is not None:
            if len(scope) != 1:
                raise ToolError("this token reaches several sessions: name one (see list_sessions)")
            return await self._default_chat(client, next(iter(scope)))
        uri = door_session(caller.grant.token_id, caller.client)
        try:
            return await self._default_chat(client, uri)
        except ProtocolError as error:
            if error.code != ErrorCode.SESSION_NOT_FOUND:
                raise
        try:
            await client.create_session(uri, title=caller.client)
        except ProtocolError as error:
            if error.code != ErrorCode.SESSION_ALREADY_EXISTS:  # another call made it first
                raise
        return await self._default_chat(client, uri)

    async def _default_chat(self, client: HuddleClient, session: str) -> str | None:
        mirror = client.mirrors.get(session) or await client.subscribe(session)
        state = mirror.state
        return state.default_chat if isinstance(state, SessionState) else None

    async def _freeze(self, people: RemoteChat, question: Question) -> None:
        """Freeze the question's schema with its request, so the host
        refuses an accept that does not fit it; a request asked already
        (the same idempotency key) keeps the schema it was asked with."""
        assert question.schema is not None
        request_id = question.request.id
        if await self.forms.load(people.chat, request_id) is None:
            await self.forms.freeze(people.chat, request_id, question.schema)

    async def _waiting(self, ctx: Context, waiting: Awaitable[T]) -> T:
        """``waiting``'s result, with a progress notification every
        ``progress_every`` seconds meanwhile (a no-op for a client that sent
        no progress token). Should the client hang up first (its response
        stream dropped: the SDK goes on with a call whose answer nobody will
        read, on 2025-11-25 and with no resumable stream), the wait is
        cancelled, which withdraws what it asked, and ToolError is raised."""
        request = ctx.request_context.request
        hung_up = request.scope.get(HUNG_UP) if isinstance(request, Request) else None
        wait = asyncio.ensure_future(self._progressing(ctx, waiting))
        if not isinstance(hung_up, asyncio.Event):
            return await wait
        gone = asyncio.ensure_future(hung_up.wait())
        try:
            await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not wait.done():  # hung up, or this call cancelled
                wait.cancel()
                # Its withdrawal, before the connection it goes through is let go.
                with anyio.CancelScope(shield=True), anyio.move_on_after(WITHDRAW_WITHIN):
                    await asyncio.wait({wait})
        if wait.cancelled():
            raise ToolError("the client hung up")
        return wait.result()

    async def _progressing(self, ctx: Context, waiting: Awaitable[T]) -> T:

        async def tick() -> None:
            ticks = 0
            while True:
                await anyio.sleep(self.progress_every)
                ticks += 1
                await ctx.report_progress(ticks, message="Waiting for people in the chat")

        ticker = asyncio.create_task(tick())
        try:
            return await waiting
        finally:
            ticker.cancel()


# ─── Descriptions (what the model reads) ─────────────────────────────────────

ASK_PEOPLE: Final = (
    "Ask the people in a Huddle chat and wait for their answer. Give a message and, for "
    "structured answers, a flat JSON Schema (the people fill it in as a form, together). "
    "Returns action accept (content holds the answers, already checked against your "
    "schema), decline or cancel, and answered_by: who answered. Without chat or session it "
    "asks in this client's own session. The wait may be long: pass an idempotency_key and "
    "call again with it if the call is cut off."
)
REQUEST_APPROVAL: Final = (
    "Ask the people in a Huddle chat to approve a tool call (or any action) before you run "
    "it. They may approve it, deny it with a reason, or edit the arguments. Returns decision "
    "approved (run it with the returned arguments, which may differ from yours), denied "
    "(do not run it; reason says why) or expired, and decided_by. Pass an idempotency_key "
    "and call again with it if the call is cut off."
)
ASK_TO_VISIT: Final = (
    "Ask a person in a Huddle chat to open a link (to sign in, to look at something). "
    "Returns accept once a person agreed to open it, decline or cancel."
)
LIST_SESSIONS: Final = (
    "List the Huddle sessions this token reaches, most recent first, each with the link of "
    "its page in the web client (share it with the people who should answer)."
)
CREATE_SESSION: Final = (
    "Create a Huddle session (a room with its chat) with this title; returns its session "
    "and chat URIs (pass them to the other tools) and the web client's link to the chat."
)


# ─── Shapes ──────────────────────────────────────────────────────────────────


def web_link(base_url: str, session: str, chat: str | None = None) -> str:
    """The web client's page of ``session`` (and ``chat``): its route
    ``#/s/<session id>/c/<chat id>`` (web/app.js), with no token in it."""
    link = f"{base_url}/#/s/{quote(channel_id(session), safe='')}"
    return link if chat is None else f"{link}/c/{quote(channel_id(chat), safe='')}"


def _expect(uri: str, kind: str) -> None:
    try:
        if channel_kind(uri) == kind:
            return
    except BadChannelUri:
        pass
    raise ToolError(f"{uri!r} is not a {kind} URI (ahp-{kind}:/<id>)")


def _expiry(seconds: float | None, policy: Expiring) -> Expiry | None:
    if seconds is None:
        return None
    try:
        return Expiry(seconds, policy)
    except ValueError as error:
        raise ToolError(str(error)) from None


def _asked(build: Callable[[], Question]) -> Question:
    try:
        return build()
    except Unaskable as error:
        raise ToolError(str(error)) from None


def _question(
    client: str,
    message: str,
    schema: dict[str, Any] | None,
    questions: list[dict[str, Any]] | None,
    request_id: str,
) -> Question:
    """The chat request of an ``ask_people`` call."""
    if questions is not None:
        if schema is not None:
            raise ToolError("give a schema or questions, not both")
        try:
            asked = convert(questions, list[InputQuestion], "$.questions")
        except MalformedFrame as error:
            raise ToolError(str(error)) from None
        text = asked_by(client, message)
        return Question(InputRequest(id=request_id, message=text, questions=asked))
    params = types.ElicitRequestFormParams(message=message, requested_schema=schema or DONE_SCHEMA)
    return _asked(lambda: question_for(params, server=client, request_id=request_id))


def _content(question: Question, answers: dict[str, InputAnswer]) -> dict[str, Any]:
    """What an accept returns: a form's data with its schema's types, or
    the submitted answers' values by question."""
    if question.form is None:
        return {
            key: answer.value.value
            for key, answer in answers.items()
            if answer.state == "submitted" and answer.value is not None
        }
    # The host refused any accept that did not fit the frozen schema.
    content = form_content(question, answers)
    if not isinstance(content, dict):
        raise ToolError(f"the answers do not fit the schema: {'; '.join(content)}")
    return content


def _unsettled(why: ElicitationExpired | InputAbandoned, arguments: dict[str, Any]) -> Decision:
    if isinstance(why, ElicitationExpired):
        return Decision("expired", arguments, reason="nobody decided in time")
    return Decision("cancelled", arguments, reason=why.reason)


def _approval(decision: Decision) -> ApprovalDecision:
    """A decision as the tool returns it: one nobody made (its turn ended
    first) is a denial saying so."""
    kind = decision.decision
    reason = decision.reason
    if kind == "cancelled":
        kind, reason = "denied", reason or "nobody decided: the chat's turn ended first"
    return ApprovalDecision(
        decision=kind,
        arguments=decision.arguments,
        reason=reason,
        decided_by=Person.of(decision.decided_by),
    )


@contextlib.asynccontextmanager
async def _told() -> AsyncIterator[None]:
    """What Huddle refused, as a tool error saying why (the model reads it):
    a request the chat cannot take, a wait expired with ``fail``, a command
    refused (a channel the token does not reach reads as not found)."""
    try:
        yield
    except (Unaskable, ElicitationExpired, ProtocolError, MalformedFrame) as error:
        raise ToolError(str(error)) from None
    except HuddleError as error:
        raise ToolError(f"Huddle could not do that: {error}") from None
