"""The host is the one authority for people's answers to a runner's turn: a
form answer that does not fit the form the turn froze, or edited tool input
that does not fit the tool's input schema, is refused in the chat with the
host's wording, and the turn keeps waiting. A real Huddle server running the
agent, a participant on a real WebSocket.

The runner checks a resume's kind and correlation id only
(tests/test_runner_forms.py, tests/test_runner_approval.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from protocol.actions import ChatInputCompleted, ChatToolCallConfirmed
from protocol.chat import TextValue
from server.errors import ActionRejected
from server.runner.agent import Agent, FormDefinition, require_approval_for
from server.runner.ids import runner_turn_id
from server.runner.runner import REQUEST_USER_INPUT
from server.runner.turn import TurnStatus
from server.runner.worker import Worker
from tests.conftest import start_server
from tests.mcp_kit import submitted
from tests.runner_kit import Runs, call, say, scripted, use
from tests.test_runner_chat_faults import open_chat, pending, until
from tests.test_runner_chat_resume import open_form

CODE = FormDefinition(
    key="code",
    description="The incident's code",
    schema={
        "type": "object",
        # A rule only the schema knows (AHP questions have no pattern): the
        # reducers' own answer rules let it through, the frozen form does not.
        "properties": {"code": {"type": "string", "title": "Code", "pattern": "^[A-Z]+$"}},
        "required": ["code"],
    },
)
ENV_SCHEMA = {
    "type": "object",
    "properties": {"env": {"enum": ["staging", "prod"]}},
    "required": ["env"],
}


async def test_a_form_answer_that_does_not_fit_the_frozen_form_is_refused_and_the_turn_waits() -> (
    None
):
    runs = Runs()
    ask = call("c1", REQUEST_USER_INPUT, formKey="code", message="Which code?")
    helper = Agent(
        name="asker",
        instructions="Ask.",
        model=scripted(use(ask), say("Noted.")),
        tools=(runs.tool("deploy"),),
        forms=(CODE,),
    )
    huddle = await start_server(agent=helper, workers=0)
    try:
        service = huddle.server.parts.service
        assert service is not None
        alice, chat, mirror = await open_chat(huddle, "Log the incident")
        assert await Worker(service.runner).step()  # up to the question
        state = await until(mirror, lambda s: open_form(s) is not None)
        part = open_form(state)
        assert part is not None
        turn_id = runner_turn_id(chat, "t1")

        unfit = ChatInputCompleted(
            request_id=part.request.id,
            response="accept",
            answers=submitted(code=TextValue(value="secret-lowercase")),
        )
        with pytest.raises(ActionRejected) as refused:
            await alice.dispatch_and_wait(chat, unfit)

        assert refused.value.code == "form-invalid"
        assert refused.value.sentence.endswith(": code fails the schema's `pattern` rule")
        assert "secret" not in refused.value.reason
        assert (await service.runner.store.load(turn_id)).status == TurnStatus.WAITING_FOR_USER
        fit = ChatInputCompleted(
            request_id=part.request.id,
            response="accept",
            answers=submitted(code=TextValue(value="SSO")),
        )
        await alice.dispatch_and_wait(chat, fit)
        resumed = await service.runner.store.load(turn_id)
        assert resumed.status == TurnStatus.READY
    finally:
        await huddle.stop()


async def test_edited_input_that_does_not_fit_the_tools_schema_is_refused_and_the_turn_waits() -> (
    None
):
    runs = Runs()
    deploy = dataclasses.replace(runs.tool("deploy"), input_schema=ENV_SCHEMA)
    helper = Agent(
        name="deployer",
        instructions="Deploy.",
        model=scripted(use(call("c1", "deploy", env="prod")), say("Deployed.")),
        tools=(deploy,),
        approval_policy=require_approval_for("deploy"),
    )
    huddle = await start_server(agent=helper, workers=0)
    try:
        service = huddle.server.parts.service
        assert service is not None
        alice, chat, mirror = await open_chat(huddle, "Deploy it")
        assert await Worker(service.runner).step()  # up to the approval
        state = await until(mirror, lambda s: pending(s) is not None)
        waiting = pending(state)
        assert waiting is not None
        assert waiting.editable is True
        turn_id = runner_turn_id(chat, "t1")

        def approve(edited: str) -> ChatToolCallConfirmed:
            return ChatToolCallConfirmed(
                turn_id="t1",
                tool_call_id=waiting.tool_call_id,
                approved=True,
                confirmed="user-action",
                edited_tool_input=edited,
            )

        with pytest.raises(ActionRejected) as refused:
            await alice.dispatch_and_wait(chat, approve('{"env": "moon"}'))

        assert refused.value.code == "invalid-tool-input"
        assert refused.value.sentence.endswith(": env fails the schema's `enum` rule")
        assert "moon" not in refused.value.reason
        assert (await service.runner.store.load(turn_id)).status == TurnStatus.WAITING_FOR_APPROVAL
        assert runs.count("deploy") == 0
        await alice.dispatch_and_wait(chat, approve('{"env": "staging"}'))
        assert await Worker(service.runner).step()
        assert [run.arguments for run in runs.runs] == [{"env": "staging"}]
    finally:
        await huddle.stop()
