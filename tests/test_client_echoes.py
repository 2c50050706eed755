"""What the Python client (server.client) does with an echo it cannot read:
the action it answers fails, and the connection carries on."""

from __future__ import annotations

import asyncio

import pytest

from protocol.actions import ChatInputCompleted
from protocol.chat import InputAnswer, NumberValue, TextValue
from server.errors import ActionRejected
from tests.conftest import UNIT, RunningServer
from tests.test_host_api import SESSION
from tests.test_session_telling import asked_and_listed


async def test_an_action_whose_rejected_echo_does_not_decode_fails_and_the_client_goes_on(
    huddle: RunningServer,
) -> None:
    # A NaN goes out as null (JSON has no NaN); the server refuses the
    # action and echoes it as sent, which the client could not decode: its
    # reader died, and every reconnect sent the action again, for ever.
    chat, asking = await asked_and_listed(huddle.server.parts.host)
    person = await huddle.client(sessions=[SESSION])
    await person.subscribe(chat)
    nan = InputAnswer(state="submitted", value=NumberValue(value=float("nan")))

    async with asyncio.timeout(2 * UNIT):
        with pytest.raises(ActionRejected) as refused:
            await person.dispatch_and_wait(
                chat, ChatInputCompleted(request_id="q", response="accept", answers={"x": nan})
            )
        assert refused.value.code == "invalid-action"

        note = InputAnswer(state="submitted", value=TextValue(value="fine"))
        answer = ChatInputCompleted(request_id="q", response="accept", answers={"x": note})
        await person.dispatch_and_wait(chat, answer)
        await asking
