"""People told they are needed while they look elsewhere: the web client in
Chromium, the demo agent asking on a real server.

The tab's title counts the sessions that need someone; a session that
comes to need someone while the tab is hidden shows a browser
notification, which opens it; permission is asked on a click, never on
load. The page's visibility is the one thing set by hand (headless
Chromium shows every page): ``document.hidden`` answers what the test says,
and the Notification constructor records what it was asked to show.
"""

from __future__ import annotations

from typing import Any

from playwright.async_api import Browser, Page, expect

from protocol.actions import ChatTurnStarted
from tests.conftest import RunningServer, user_message
from tests.test_web_client import (
    TICKET,
    browser,
    create_session,
    demo_server,
    open_client,
)

__all__ = ["browser", "demo_server"]  # the fixtures, used by name

WATCHED = """
window.__shown = [];
window.__asked = 0;
let hidden = false;
const seen = () => (hidden ? 'hidden' : 'visible');
for (const [name, value] of [['hidden', () => hidden], ['visibilityState', seen]]) {
  Object.defineProperty(Document.prototype, name, { get: value, configurable: true });
}
window.__hide = (value) => {
  hidden = value;
  document.dispatchEvent(new Event('visibilitychange'));
};
const Real = window.Notification;
class Recorded extends Real {
  constructor(title, options) {
    super(title, options);
    window.__shown.push({ title, body: options?.body ?? null, tag: options?.tag ?? null });
    window.__last = this;
  }
  static get permission() { return Real.permission; }
  static requestPermission(...args) { window.__asked += 1; return Real.requestPermission(...args); }
}
window.Notification = Recorded;
"""


async def watched(page: Page) -> None:
    await page.add_init_script(WATCHED)


async def ask_for_a_ticket(running: RunningServer, title: str) -> str:
    """Bob asks the demo agent for a ticket in a new session titled
    ``title``: its form makes the session need someone."""
    session, chat = await create_session(running.http, title)
    bob = await running.client(name="Bob")
    started = ChatTurnStarted(
        turn_id="t1", started_at="2027-01-10T10:00:00.000Z", message=user_message(TICKET)
    )
    await bob.dispatch_and_wait(chat, started)
    return session


async def shown(page: Page) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = await page.evaluate("window.__shown")
    return result


async def test_a_request_while_the_tab_is_hidden_notifies_counts_and_opens_its_session(
    browser: Browser, demo_server: RunningServer
) -> None:
    context, page = await open_client(
        browser, demo_server.http, demo_server.token(name="Alice"), prepare=watched
    )
    await context.grant_permissions(["notifications"])
    await page.evaluate("window.__hide(true)")

    session = await ask_for_a_ticket(demo_server, "Printer on fire")

    await expect(page).to_have_title("(1) Huddle")
    notified = await shown(page)
    assert [(n["title"], n["tag"]) for n in notified] == [("Needed in Printer on fire", session)]

    # Seen, a second request counts but shows no notification.
    await page.evaluate("window.__hide(false)")
    await ask_for_a_ticket(demo_server, "Coffee machine down")
    await expect(page).to_have_title("(2) Huddle")
    assert len(await shown(page)) == 1

    await page.evaluate("window.__last.onclick()")
    await expect(page.get_by_role("heading", name="Printer on fire")).to_be_visible()
    await expect(page).to_have_title("(2) Printer on fire · Huddle")


async def test_permission_is_asked_on_a_click_never_on_load(
    browser: Browser, demo_server: RunningServer
) -> None:
    _, page = await open_client(browser, demo_server.http, demo_server.token(), prepare=watched)
    button = page.get_by_role("button", name="Notify me")

    await expect(button).to_be_visible()  # this browser was never asked
    assert await page.evaluate("Notification.permission") == "default"
    assert await page.evaluate("window.__asked") == 0
    await button.click()
    await page.wait_for_function("window.__asked === 1")
    await expect(button).to_be_hidden()  # asked and answered: no second asking
