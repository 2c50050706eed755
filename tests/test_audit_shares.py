"""A session's audit shared out: one person (a token, a shared link's
browsers together) cannot fill its reserve to keep the others' decisions
out of it. Their decisions are refused once their share is used up, on
every process alike, and every decision accepted is on record."""

from __future__ import annotations

from collections.abc import AsyncIterator

from msgspec.structs import replace

from protocol.actions import ChatInputCompleted, ChatToolCallConfirmed, ChatTurnStarted
from protocol.chat import InputAnswer, SelectedValue, TextValue
from protocol.rejections import RejectionCode
from server.client import HuddleClient, Mirror
from server.config import Limits, Settings
from server.core.audit import CHARGED, verify
from server.errors import ActionRejected
from server.runner.demo import agent as demo
from tests.conftest import (
    AGENT_TOKEN,
    start_server,
    user_message,
    watched_chat,
)
from tests.test_audit import audit_of, records
from tests.test_runner_demo import open_request, pending_call, wait

SESSION = "ahp-session:/shared-out"
MAX_RECORDS = 400
"""A reserve of 40 records, a person's share of it 4: two decisions."""
DECISIONS = MAX_RECORDS // 10 // 10 // CHARGED


def turn(n: int) -> ChatTurnStarted:
    return ChatTurnStarted(
        turn_id=f"m{n}",
        started_at="2026-12-01T10:00:00.000Z",
        message=user_message("Open a high-priority ticket: nobody can log in"),
    )


async def decline_until_refused(
    client: HuddleClient, chat: str, opened: AsyncIterator[str], most: int
) -> tuple[int, ActionRejected | None]:
    """Decline each request ``opened`` yields until one is refused (at most
    ``most``): how many were accepted, and the refusal."""
    for accepted in range(most):
        request = await anext(opened)
        try:
            await client.dispatch_and_wait(
                chat, ChatInputCompleted(request_id=request, response="decline")
            )
        except ActionRejected as refused:
            return accepted, refused
    return most, None


async def demo_requests(client: HuddleClient, chat: str, mirror: Mirror) -> AsyncIterator[str]:
    """The demo agent's form, asked anew in each turn ``client`` starts."""
    n = 0
    while True:
        await wait(mirror, lambda s: s.active_turn is None)
        await client.dispatch_and_wait(chat, turn(n))
        part = open_request(await wait(mirror, lambda s: open_request(s) is not None))
        assert part is not None
        yield part.request.id
        n += 1


async def test_declining_the_demo_form_in_a_loop_is_refused_and_the_others_approval_lands() -> None:
    limits = Limits(action_burst=10_000, actions_per_second=10_000)
    huddle = await start_server(
        Settings(port=0, audit_max_records=MAX_RECORDS, limits=limits), agent=demo
    )
    try:
        mallory = await huddle.client(name="Mallory")
        chat, flooded = await watched_chat(mallory, SESSION)
        accepted, refused = await decline_until_refused(
            mallory, chat, demo_requests(mallory, chat, flooded), 100
        )
        # Alice answers the form Mallory could not decline (one of her own
        # where every decline was taken), and approves.
        alice = await huddle.client(name="Alice")
        seen = await alice.subscribe(chat)
        state = await wait(seen, lambda s: s.active_turn is None or open_request(s) is not None)
        if state.active_turn is None:
            await alice.dispatch_and_wait(chat, replace(turn(0), turn_id="a1"))
        state = await wait(seen, lambda s: open_request(s) is not None)
        assert state.active_turn is not None
        part = open_request(state)
        assert part is not None
        await alice.dispatch_and_wait(
            chat,
            ChatInputCompleted(
                request_id=part.request.id,
                response="accept",
                answers={
                    "affectedSystem": InputAnswer(state="submitted", value=TextValue(value="SSO")),
                    "impactScope": InputAnswer(
                        state="submitted", value=SelectedValue(value="ALL_USERS")
                    ),
                },
            ),
        )
        call = pending_call(await wait(seen, lambda s: pending_call(s) is not None))
        assert call is not None
        await alice.dispatch_and_wait(
            chat,
            ChatToolCallConfirmed(
                turn_id=state.active_turn.id,
                tool_call_id=call.tool_call_id,
                approved=True,
                confirmed="user-action",
            ),
        )
        await wait(seen, lambda s: s.active_turn is None)
        lines = await audit_of(huddle, AGENT_TOKEN, SESSION)
    finally:
        await huddle.stop()

    kept = records(lines)
    whats = [(r["what"], r["who"].get("name")) for r in kept]
    assert ("chat/toolCallConfirmed", "Alice") in whats
    assert refused is not None, "the flood was never refused"
    assert refused.code == RejectionCode.AUDIT_SHARE_USED
    assert "share" in refused.sentence
    assert accepted == DECISIONS
    assert verify(lines).records == len(kept)
    assert whats.count(("chat/inputCompleted", "Mallory")) == DECISIONS
    # Alice's decisions are on record, and so is the tool they let run.
    assert ("chat/inputCompleted", "Alice") in whats
    approved = whats.index(("chat/toolCallConfirmed", "Alice"))
    after = kept[approved:]
    assert [r["resume"]["command"] for r in after if r["what"] == "runner/resumed"] == [
        "TOOL_APPROVAL"
    ]
    assert any(r["what"] == "chat/toolCallComplete" for r in after)
    assert kept[-1]["what"] == "chat/turnComplete"
    assert "audit/full" not in {r["what"] for r in kept}
