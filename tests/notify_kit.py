"""What the notification tests run against: a real HTTP receiver that checks
Standard Webhooks signatures with the ``standardwebhooks`` package, a real
SMTP server (aiosmtpd), and the chat steps that open and settle waits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any

import uvicorn
from aiosmtpd.smtp import SMTP, Envelope, Session
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from protocol.actions import ChatInputRequested, ChatToolCallReady, ChatToolCallStart
from protocol.chat import InputRequest
from server.client import HuddleClient
from server.edge.serve import UvicornServer
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer
from tests.edge import http


def verifies(secret: str, received: Received) -> bool:
    try:
        Webhook(secret).verify(received.body, received.headers)
    except WebhookVerificationError:
        return False
    return True


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    verified: Any
    """What Webhook.verify returned (None: the signature did not verify)."""

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """A webhook receiver on a free loopback port. ``answers`` are the
    statuses it answers with, in turn (200 once they run out)."""

    secret: str | None = None
    answers: list[int] = field(default_factory=list)
    got: asyncio.Queue[Received] = field(default_factory=asyncio.Queue)
    port: int = 0
    gate: asyncio.Event | None = None
    """When set up, each answer waits for it (a slow endpoint)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def receive(self, request: Request) -> Response:
        body = await request.body()
        headers = dict(request.headers)
        verified = None
        if self.secret is not None:
            with contextlib.suppress(WebhookVerificationError):
                verified = Webhook(self.secret).verify(body, headers)
        await self.got.put(Received(headers, body, verified))
        if self.gate is not None:
            await self.gate.wait()
        return Response(status_code=self.answers.pop(0) if self.answers else 200)

    async def next(self) -> Received:
        async with asyncio.timeout(10 * UNIT):
            return await self.got.get()

    def nothing_more(self) -> bool:
        return self.got.empty()


@contextlib.asynccontextmanager
async def receiving(answers: list[int] | None = None) -> AsyncIterator[Receiver]:
    receiver = Receiver(answers=list(answers or []))
    app = Starlette(routes=[Route("/hook", receiver.receive, methods=["POST"])])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = UvicornServer(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10 * UNIT):
        await server.listening.wait()
    receiver.port = server.port
    try:
        yield receiver
    finally:
        server.should_exit = True
        await task


class Mailbox:
    """An aiosmtpd handler that keeps each message."""

    def __init__(self) -> None:
        self.got: asyncio.Queue[Message] = asyncio.Queue()

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:  # noqa: N802
        assert isinstance(envelope.content, bytes)
        await self.got.put(message_from_bytes(envelope.content))
        return "250 OK"

    async def next(self) -> Message:
        async with asyncio.timeout(10 * UNIT):
            return await self.got.get()


@contextlib.asynccontextmanager
async def smtp_server() -> AsyncIterator[tuple[Mailbox, int]]:
    """A real SMTP server (aiosmtpd) on a free loopback port, in this loop."""
    mailbox = Mailbox()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(mailbox), "127.0.0.1", 0)
    try:
        yield mailbox, server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def add_webhook(huddle: RunningServer, **body: Any) -> dict[str, Any]:
    reply = await http("POST", f"{huddle.http}/api/webhooks", token=AGENT_TOKEN, body=body)
    assert reply.status == 201, reply.body
    added: dict[str, Any] = reply.json()
    return added


async def ask(agent: HuddleClient, chat: str, request_id: str, message: str) -> None:
    await agent.dispatch_and_wait(
        chat, ChatInputRequested(request=InputRequest(id=request_id, message=message))
    )


async def ask_approval(agent: HuddleClient, chat: str, call: str = "deploy") -> None:
    await agent.dispatch_and_wait(
        chat, ChatToolCallStart(turn_id="t1", tool_call_id=call, tool_name=call, display_name=call)
    )
    await agent.dispatch_and_wait(
        chat,
        ChatToolCallReady(turn_id="t1", tool_call_id=call, invocation_message="Deploy to prod"),
    )
