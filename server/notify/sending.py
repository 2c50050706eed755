"""One try at telling one target of one event: a webhook POST or an email.

A webhook is signed as Standard Webhooks asks (the ``standardwebhooks``
package signs: ``webhook-id``, ``webhook-timestamp``, ``webhook-signature``
``v1,<base64>``, one per secret, space-separated during a rotation). The
timestamp is the wall clock's, whatever clock schedules the tries: the
receiver checks it against its own. A Slack-format endpoint gets a Slack
incoming-webhook message built with ``slack-sdk``'s Block Kit models (the
same headers beside it: Slack ignores them). Email goes over SMTP with the
standard library's ``smtplib`` in a thread (one connection per message:
requests are rare, and a dead server costs a thread for the timeout, never
the event loop).

Each try answers a :class:`Tried`: the HTTP status (or None) and an error
to show in the deliveries list; a try never raises.
"""

from __future__ import annotations

import asyncio
import json
import smtplib
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any
from urllib.parse import urlsplit

import httpx
from slack_sdk.models.blocks import (
    ActionsBlock,
    ButtonElement,
    ContextBlock,
    MarkdownTextObject,
    SectionBlock,
)
from standardwebhooks.webhooks import Webhook

TIMEOUT = 15.0
"""Seconds one try may take, all of it (connect, send, answer)."""
MAX_ERROR = 300

TITLES = {
    "input.requested": "Input requested",
    "approval.requested": "Approval requested",
    "input.completed": "Input completed",
    "approval.decided": "Approval decided",
    "wait.expired": "Nobody answered in time",
    "input.escalated": "Still waiting for someone",
}


@dataclass(frozen=True, slots=True)
class Tried:
    status: int | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def signed_headers(message_id: str, body: str, secrets: list[str], at: float) -> dict[str, str]:
    """The Standard Webhooks headers of ``body`` signed at ``at`` (Unix
    time) with each of ``secrets``."""
    when = datetime.fromtimestamp(int(at), UTC)
    signatures = " ".join(Webhook(s).sign(message_id, when, body) for s in secrets)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at)),
        "webhook-signature": signatures,
        "content-type": "application/json",
        "user-agent": "huddle-webhooks",
    }


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message for an event: what is asked, in
    which chat, who settled it, and a button that opens the chat."""
    data = payload["data"]
    title = TITLES.get(payload["type"], payload["type"])
    message = data.get("message") or "(no message)"
    text = f"*{title}*\n{_mrkdwn(message)}"
    context = f"Asked of the people of {data['session']} in {data['chat']}"
    settled = data.get("settledBy")
    if isinstance(settled, dict):
        context = f"Settled by {settled.get('name')} ({settled.get('role')})"
    blocks = [
        SectionBlock(text=MarkdownTextObject(text=text)),
        ContextBlock(elements=[MarkdownTextObject(text=_mrkdwn(context))]),
        ActionsBlock(
            elements=[ButtonElement(text="Open the chat", url=data["link"], action_id="open")]
        ),
    ]
    return {"text": f"{title}: {message}", "blocks": [b.to_dict() for b in blocks]}


def _mrkdwn(text: str) -> str:
    """Slack's three escapes: the rest of the text shows as it is."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


async def post(
    client: httpx.AsyncClient,
    url: str,
    message_id: str,
    payload: dict[str, Any],
    *,
    secrets: list[str],
    slack: bool,
) -> Tried:
    """One try at POSTing the event to a webhook (never follows a redirect)."""
    body = json.dumps(slack_message(payload) if slack else payload, separators=(",", ":"))
    headers = signed_headers(message_id, body, secrets, time.time())
    try:
        async with asyncio.timeout(TIMEOUT):
            answer = await client.post(url, content=body.encode(), headers=headers)
    except (TimeoutError, httpx.TimeoutException):
        return Tried(None, f"no answer within {TIMEOUT:g} s")
    except httpx.HTTPError as error:
        return Tried(None, _short(f"{type(error).__name__}: {error}"))
    if 200 <= answer.status_code < 300:
        return Tried(answer.status_code)
    return Tried(answer.status_code, _short(answer.text))


@dataclass(frozen=True, slots=True)
class Smtp:
    """The SMTP server ``--smtp-url`` names: ``smtp://[user:password@]host
    [:port]`` (STARTTLS when the server offers it) or ``smtps://`` (TLS)."""

    host: str
    port: int
    tls: bool
    user: str | None
    password: str | None
    sender: str

    @classmethod
    def of(cls, url: str, sender: str) -> Smtp:
        parts = urlsplit(url)
        if parts.scheme not in ("smtp", "smtps") or not parts.hostname:
            raise ValueError(f"--smtp-url must be smtp://host:port or smtps://..., not {url!r}")
        tls = parts.scheme == "smtps"
        port = parts.port or (465 if tls else 25)
        return cls(parts.hostname, port, tls, parts.username, parts.password, sender)

    async def send(self, to: str, subject: str, text: str) -> Tried:
        message = EmailMessage()
        message["From"], message["To"], message["Subject"] = self.sender, to, subject
        message.set_content(text)
        try:
            await asyncio.to_thread(self._send, message)
        except (OSError, smtplib.SMTPException) as error:
            return Tried(None, _short(f"{type(error).__name__}: {error}"))
        return Tried(250)

    def _send(self, message: EmailMessage) -> None:
        smtp_class = smtplib.SMTP_SSL if self.tls else smtplib.SMTP
        with smtp_class(self.host, self.port, timeout=TIMEOUT) as smtp:
            if not self.tls:
                smtp.ehlo()
                if smtp.has_extn("starttls"):
                    smtp.starttls()
            if self.user:
                smtp.login(self.user, self.password or "")
            smtp.send_message(message)


def email_text(payload: dict[str, Any], sign_in: str | None) -> tuple[str, str]:
    """The subject and text of an email about an event; ``sign_in`` the
    link that signs the person in (a token of their own) and opens the chat."""
    data = payload["data"]
    title = TITLES.get(payload["type"], payload["type"])
    message = data.get("message") or "(no message)"
    link = sign_in or data["link"]
    subject = f"Huddle: {title}: {message}"[:200].replace("\n", " ")
    text = (
        f"{title} in {data['chat']} ({data['session']}):\n\n{message}\n\nAnswer it here: {link}\n"
    )
    if sign_in:
        text += "\nThe link signs you in as yourself: do not forward it.\n"
    return subject, text


def _short(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 1] + "…"
