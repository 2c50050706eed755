"""An MCP client asks the room through Huddle's MCP server, and a person
answers it live in the web client (a real Chromium): the form it asked, then
the approval, each credited to that person."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from playwright.async_api import Browser, expect

from tests import test_web_client as web
from tests.conftest import RunningServer
from tests.people_kit import WITHIN
from tests.test_mcp_door import mcp_client, structured
from tests.test_web_client import open_client

pytestmark = pytest.mark.browser

browser = web.browser
plain_server = web.plain_server

SYSTEM_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {"system": {"type": "string", "title": "Affected system", "minLength": 2}},
    "required": ["system"],
}


async def test_a_person_answers_an_mcp_clients_form_and_approval_in_the_web_client(
    browser: Browser, plain_server: RunningServer
) -> None:
    huddle = plain_server
    async with mcp_client(huddle, "auto", name="Claude Code") as client:
        room = structured(await client.call_tool("create_session", {"title": "Outage"}))
        session, chat, link = room["session"], room["chat"], room["link"]
        token = huddle.token("participant", sessions=[session], name="Nora")
        context, page = await open_client(browser, huddle.http, token)
        try:
            await page.goto(link)  # the link the tool gave, with no token of its own
            asked = asyncio.create_task(
                client.call_tool(
                    "ask_people",
                    {"message": "Which system fails?", "schema": SYSTEM_FORM, "chat": chat},
                )
            )
            await expect(page.get_by_text("Claude Code asks: Which system fails?")).to_be_visible()
            await page.get_by_label("Affected system").fill("SSO")
            await page.get_by_role("button", name="Submit").click()
            async with asyncio.timeout(WITHIN):
                answer = structured(await asked)
            assert answer["action"] == "accept"
            assert answer["content"] == {"system": "SSO"}
            assert answer["answered_by"]["name"] == "Nora"

            approval = asyncio.create_task(
                client.call_tool(
                    "request_approval",
                    {"tool": "restart_sso", "arguments": {"region": "eu"}, "session": session},
                )
            )
            await page.get_by_role("button", name="Approve").click()
            async with asyncio.timeout(WITHIN):
                decided = structured(await approval)
            assert decided["decision"] == "approved"
            assert decided["arguments"] == {"region": "eu"}
            assert decided["decided_by"]["name"] == "Nora"
        finally:
            await context.close()
