"""Forms: the ``request_user_input`` control tool, and tools that raise
FormRequired and run again with the submitted data. The schema is the
agent's, frozen into the turn when asked; the model never sees it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

import pytest

from server.runner.agent import FormDefinition, FormRequired, Tool
from server.runner.context import ToolContext
from server.runner.runner import REQUEST_USER_INPUT, ResumeRejected, Runner
from server.runner.turn import FrozenForm, Phase, ResumeCommand, SuspensionType, TurnStatus
from server.runner.turn_store import MemoryTurnStore
from tests.runner_kit import (
    DETAILS,
    GOOD_DETAILS,
    Clock,
    Model,
    Runs,
    agent,
    call,
    say,
    scripted,
    use,
)

FROZEN_DETAILS = FrozenForm(key=DETAILS.key, description=DETAILS.description, schema=DETAILS.schema)


# ─── A tool that raises FormRequired ─────────────────────────────────────────


@dataclasses.dataclass
class Helpdesk:
    """``open_ticket`` asks for DETAILS before its side effect (opening a
    ticket); ``ask_again`` makes it ask even when it has the data."""

    runs: Runs = dataclasses.field(default_factory=Runs)
    opened: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    ask_again: bool = False

    def tool(self) -> Tool:
        def open_ticket(arguments: dict[str, Any]) -> dict[str, str]:
            self.runs.record("open_ticket", arguments)
            submitted = ToolContext.current().submitted_form_data
            if not submitted or self.ask_again:
                raise FormRequired(DETAILS)
            self.opened.append(submitted)
            return {"ticketId": "HUD-1"}

        return Tool(name="open_ticket", description="Open a ticket", function=open_ticket)


async def waiting_for_details(desk: Helpdesk, **options: Any) -> tuple[Runner, Model]:
    """Turn ``t1``, whose call ``c1`` of ``open_ticket`` asked for DETAILS."""
    model = scripted(use(call("c1", "open_ticket", priority="high")), say("Opened HUD-1."))
    helper = agent(model, desk.tool(), **options)
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    await runner.run(helper, "Nobody can log in", turn_id="t1")
    return runner, model


async def test_a_tool_that_needs_a_form_waits_with_it_frozen_and_its_call_as_correlation() -> None:
    desk = Helpdesk()
    runner, _ = await waiting_for_details(desk)
    turn = await runner.store.load("t1")
    assert turn.status == TurnStatus.WAITING_FOR_USER
    assert turn.suspension is not None
    assert turn.suspension.type == SuspensionType.USER_INPUT
    assert turn.suspension.correlation_id == "c1"
    assert turn.suspension.form == FROZEN_DETAILS
    assert turn.suspension.resume_phase == Phase.TOOLS
    assert desk.opened == []


async def test_after_the_form_the_tool_runs_again_from_the_start_with_the_data_once() -> None:
    desk = Helpdesk()
    runner, model = await waiting_for_details(desk)
    done = await runner.resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert done.status == TurnStatus.COMPLETED
    assert [run.submitted_form_data for run in desk.runs.runs] == [{}, GOOD_DETAILS]
    assert desk.opened == [GOOD_DETAILS]
    assert model.tool_results() == {"c1": {"ticketId": "HUD-1"}}


async def test_a_second_form_required_after_the_data_fails_the_turn() -> None:
    desk = Helpdesk(ask_again=True)
    runner, _ = await waiting_for_details(desk)
    failed = await runner.resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert failed.status == TurnStatus.FAILED
    assert failed.error is not None
    assert "again" in failed.error
    assert desk.opened == []


async def test_the_interrupted_attempt_does_not_count_against_max_tool_calls() -> None:
    desk = Helpdesk()
    # One call allowed: counting the attempt that asked for the form would
    # leave nothing for the run with the data.
    runner, _ = await waiting_for_details(desk, max_tool_calls=1)
    done = await runner.resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert done.status == TurnStatus.COMPLETED
    assert done.tool_calls_made == 1
    assert desk.opened == [GOOD_DETAILS]


NOTE = FormDefinition(
    key="note",
    description="Anything to add (nothing is fine)",
    schema={"type": "object", "properties": {"note": {"type": "string"}}},
)


async def test_a_form_submitted_with_nothing_filled_in_lets_the_tool_run() -> None:
    # With every field optional, {} is an answer: asking whether the data
    # is empty took it for "not asked yet" and failed the turn as asked again.
    seen: list[tuple[bool, dict[str, Any]]] = []

    def annotate(arguments: dict[str, Any]) -> str:
        context = ToolContext.current()
        seen.append((context.form_submitted, context.submitted_form_data))
        if not context.form_submitted:
            raise FormRequired(NOTE)
        return "noted"

    model = scripted(use(call("c1", "annotate")), say("Done."))
    helper = agent(model, Tool(name="annotate", description="Annotate", function=annotate))
    runner = Runner(MemoryTurnStore(), [helper], clock=Clock())
    await runner.run(helper, "Annotate it", turn_id="t1")
    done = await runner.resume("t1", ResumeCommand.user_input("c1", {}))

    assert done.status == TurnStatus.COMPLETED
    assert seen == [(False, {}), (True, {})]
    assert model.tool_results() == {"c1": "noted"}


async def test_the_idempotency_key_is_turn_and_call_id_and_stable_across_the_replay() -> None:
    desk = Helpdesk()
    runner, _ = await waiting_for_details(desk)
    await runner.resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert [run.idempotency_key for run in desk.runs.runs] == ["t1:c1", "t1:c1"]


@pytest.mark.parametrize(("response", "status"), [("decline", "declined"), ("cancel", "cancelled")])
async def test_a_form_people_refuse_is_told_to_the_model_and_the_tool_never_runs_again(
    response: Literal["decline", "cancel"], status: str
) -> None:
    desk = Helpdesk()
    runner, model = await waiting_for_details(desk)
    done = await runner.resume("t1", ResumeCommand.user_input("c1", response=response))
    assert done.status == TurnStatus.COMPLETED
    assert model.tool_results() == {"c1": {"status": status, "formKey": DETAILS.key}}
    assert (len(desk.runs.runs), desk.opened) == (1, [])


# ─── request_user_input ──────────────────────────────────────────────────────

FEEDBACK = FormDefinition(
    key="feedback",
    description="How the fix went",
    schema={
        "type": "object",
        "properties": {"rating_out_of_five": {"type": "integer", "title": "Your rating"}},
    },
)


def asking(form_key: str = DETAILS.key) -> Model:
    """A model that asks for ``form_key`` (call ``c1``), then says thanks."""
    return scripted(use(call("c1", REQUEST_USER_INPUT, formKey=form_key)), say("Thanks."))


async def asked(
    model: Model, form: FormDefinition = DETAILS, store: MemoryTurnStore | None = None
) -> Runner:
    helper = agent(model, forms=(form, FEEDBACK))
    runner = Runner(store or MemoryTurnStore(), [helper], clock=Clock())
    await runner.run(helper, "Nobody can log in", turn_id="t1")
    return runner


async def test_the_model_is_given_form_keys_and_descriptions_but_never_a_schema() -> None:
    model = asking()
    await asked(model)
    specs = model.tool_lists[0]
    control = next(spec for spec in specs if spec.name == REQUEST_USER_INPUT)
    assert control.parameters["properties"]["formKey"]["enum"] == ["ticket_details", "feedback"]
    assert DETAILS.description in control.description
    assert FEEDBACK.description in control.description
    told = json.dumps([dataclasses.asdict(spec) for spec in specs])
    for secret in ("affected_system", "Affected system", "maxLength", "rating_out_of_five"):
        assert secret not in told


async def test_the_form_the_model_chose_is_frozen_into_the_suspension() -> None:
    runner = await asked(asking())
    turn = await runner.store.load("t1")
    assert turn.status == TurnStatus.WAITING_FOR_USER
    assert turn.suspension is not None
    assert turn.suspension.correlation_id == "c1"
    assert turn.suspension.form == FROZEN_DETAILS


DETAILS_V2 = FormDefinition(
    key=DETAILS.key,
    description=DETAILS.description,
    schema={
        "type": "object",
        "properties": {
            "affected_system": {"type": "string", "maxLength": 200},
            "contact_email": {"type": "string"},
        },
        "required": ["affected_system", "contact_email"],
    },
)


async def redeployed(store: MemoryTurnStore) -> Runner:
    """The same agent name, now with DETAILS_V2 (as after a deploy)."""
    helper = agent(asking(), forms=(DETAILS_V2,))
    return Runner(store, [helper], clock=Clock())


async def test_a_changed_form_leaves_a_waiting_turn_with_the_schema_it_froze() -> None:
    # The frozen schema is what the chat asks and the host checks people's
    # answers against (tests/test_runner_chat_authority.py); the runner
    # itself checks a resume's kind, not its data.
    store = MemoryTurnStore()
    await asked(asking(), store=store)
    runner = await redeployed(store)
    waiting = await store.load("t1")
    assert waiting.suspension is not None
    assert waiting.suspension.form == FROZEN_DETAILS
    accepted = await runner.submit_resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert accepted.status == TurnStatus.READY
    assert accepted.suspension is None


async def test_a_changed_form_is_what_new_turns_ask_for() -> None:
    store = MemoryTurnStore()
    await asked(asking(), store=store)
    runner = await redeployed(store)
    turn = await runner.run("helper", "Nobody can log in", turn_id="t2")
    assert turn.suspension is not None
    assert turn.suspension.form is not None
    assert turn.suspension.form.schema == DETAILS_V2.schema


async def test_a_plain_text_answer_to_a_form_is_refused_and_changes_nothing() -> None:
    runner = await asked(asking())
    before = await runner.store.load("t1")
    with pytest.raises(ResumeRejected, match="waits for form 'ticket_details'"):
        await runner.submit_resume("t1", ResumeCommand.user_input("SSO", question="c1"))
    assert await runner.store.load("t1") == before


async def test_a_form_answer_made_in_code_is_trusted_and_not_checked_against_the_schema() -> None:
    # The host is the one authority for people's answers (it refuses this
    # accept in a chat: tests/test_runner_chat_authority.py); a resume made
    # in code by the agent's own process is trusted code, like calling the
    # tool itself, and reaches the model as given.
    model = asking()
    runner = await asked(model)
    unfit = {"affected_system": "x" * 30, "impact_scope": "planet"}
    done = await runner.resume("t1", ResumeCommand.user_input("c1", unfit))
    assert done.status == TurnStatus.COMPLETED
    assert model.tool_results() == {
        "c1": {"status": "submitted", "formKey": DETAILS.key, "data": unfit}
    }


async def test_accepted_data_reaches_the_model_as_a_submitted_tool_message() -> None:
    model = asking()
    runner = await asked(model)
    done = await runner.resume("t1", ResumeCommand.user_input("c1", GOOD_DETAILS))
    assert done.status == TurnStatus.COMPLETED
    assert model.tool_results() == {
        "c1": {"status": "submitted", "formKey": DETAILS.key, "data": GOOD_DETAILS}
    }


@pytest.mark.parametrize(("response", "status"), [("decline", "declined"), ("cancel", "cancelled")])
async def test_a_declined_or_cancelled_form_reaches_the_model_as_such(
    response: Literal["decline", "cancel"], status: str
) -> None:
    model = asking()
    runner = await asked(model)
    done = await runner.resume("t1", ResumeCommand.user_input("c1", response=response))
    assert done.status == TurnStatus.COMPLETED
    assert model.tool_results() == {"c1": {"status": status, "formKey": DETAILS.key}}


async def test_an_unknown_form_key_is_an_error_the_model_reads_and_nobody_is_asked() -> None:
    model = asking("no_such_form")
    runner = await asked(model)
    turn = await runner.store.load("t1")
    assert turn.status == TurnStatus.COMPLETED
    result = model.tool_results()["c1"]
    assert result["status"] == "error"
    assert "ticket_details" in result["message"]
