"""Two participants co-edit one input request over real WebSockets."""

from __future__ import annotations

import asyncio

from protocol.actions import ChatInputAnswerChanged, ChatInputCompleted, ChatTurnStarted
from protocol.chat import (
    ChatState,
    InputAnswer,
    InputRequest,
    InputRequestPart,
    TextQuestion,
    TextValue,
)
from tests.conftest import UNIT, RunningServer, user_message

SESSION = "ahp-session:/ticket-42"
REQUEST = InputRequest(
    id="details",
    message="Tell us about the outage",
    questions=[
        TextQuestion(id="system", message="Which system?", required=True),
        TextQuestion(id="scope", message="Who is affected?"),
        TextQuestion(id="note", message="Anything else?"),
    ],
)


def draft(text: str) -> InputAnswer:
    return InputAnswer(state="draft", value=TextValue(value=text))


def submitted(text: str) -> InputAnswer:
    return InputAnswer(state="submitted", value=TextValue(value=text))


def answers_of(state: object) -> dict[str, InputAnswer]:
    assert isinstance(state, ChatState)
    assert state.active_turn is not None
    part = state.active_turn.response_parts[-1]
    assert isinstance(part, InputRequestPart)
    return dict(part.request.answers or {})


async def test_two_participants_co_edit_and_the_agent_gets_the_answers(
    huddle: RunningServer,
) -> None:
    agent = await huddle.client("agent")
    await agent.create_session(SESSION, title="Login failures")
    session = await agent.subscribe(SESSION)
    chat_uri = session.state.default_chat  # type: ignore[union-attr]
    assert chat_uri is not None
    alice = await huddle.client(name="alice")
    bob = await huddle.client(name="bob")
    alice_chat = await alice.subscribe(chat_uri)
    bob_chat = await bob.subscribe(chat_uri)
    await alice.dispatch_and_wait(
        chat_uri,
        ChatTurnStarted(
            turn_id="t1",
            started_at="2026-11-30T10:00:00.000Z",
            message=user_message("Users cannot log in"),
        ),
    )
    asking = asyncio.create_task(agent.request_input(chat_uri, REQUEST))

    def has_request(state: object) -> bool:
        return (
            isinstance(state, ChatState)
            and state.active_turn is not None
            and any(
                getattr(p, "request", None) is not None for p in state.active_turn.response_parts
            )
        )

    async with asyncio.timeout(5 * UNIT):
        await alice_chat.wait_for(has_request)
        await bob_chat.wait_for(has_request)
        await alice.dispatch(
            chat_uri,
            ChatInputAnswerChanged(request_id="details", question_id="system", answer=draft("SSO")),
        )
        await bob.dispatch(
            chat_uri,
            ChatInputAnswerChanged(
                request_id="details", question_id="scope", answer=draft("all staff")
            ),
        )
        for mirror in (alice_chat, bob_chat):
            await mirror.wait_for(lambda s: answers_of(s).keys() >= {"system", "scope"})
        await alice.dispatch(
            chat_uri,
            ChatInputAnswerChanged(
                request_id="details", question_id="note", answer=draft("from alice")
            ),
        )
        await bob.dispatch(
            chat_uri,
            ChatInputAnswerChanged(
                request_id="details", question_id="note", answer=draft("from bob")
            ),
        )
        seq = max(alice_chat.seq, bob_chat.seq) + 2
        await alice_chat.wait_for(lambda s: alice_chat.seq >= seq)
        await bob_chat.wait_for(lambda s: bob_chat.seq >= seq)
    assert answers_of(alice_chat.state) == answers_of(bob_chat.state)
    assert answers_of(alice_chat.state)["note"] in (draft("from alice"), draft("from bob"))

    await alice.dispatch_and_wait(
        chat_uri,
        ChatInputCompleted(
            request_id="details",
            response="accept",
            answers={"system": submitted("SSO"), "scope": submitted("all staff")},
        ),
    )
    async with asyncio.timeout(5 * UNIT):
        completion = await asking
    assert completion.response == "accept"
    assert completion.answers["system"] == submitted("SSO")
    assert completion.answers["scope"] == submitted("all staff")
