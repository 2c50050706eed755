"""People's input to a turn: forms and plain-text questions. What a turn
waits on while people answer, what an answer must be, and what it does.

- ``request_user_input`` is a control tool: the model picks one of the
  agent's forms by key (an enum; it is told keys and descriptions, never a
  schema: :func:`request_user_input_spec`). A key the agent has no form for
  is an error the model reads, and nobody is asked (:func:`requested_form`).
- A tool may raise FormRequired before any side effect
  (:func:`required_form`): it runs again from the start with the data
  (``ToolContext.submitted_form_data``); raising it again after that fails
  the turn (:func:`asked_again`).
- Either way the turn waits (USER_INPUT, correlated by the call id) with the
  form's JSON Schema frozen into the suspension: later changes to the form
  (:mod:`server.runner.form_definitions`) affect only new turns. Its expiry is the
  request's own, else the form's, else the agent's ``input_expiry``.
- An answer must be the kind the wait expects (:func:`check_answer`): form
  data for a form, text for a plain question. Whether accepted data fits
  the frozen schema is the host's word, given before the answer reached the
  turn (:mod:`server.core.frozen_forms`); a resume made in code is trusted code.
- What it does (:func:`answered`): accepted data is the tool message
  ``{status: "submitted", formKey, data}`` of a ``request_user_input``
  call, or the data its tool runs again with; a declined or dismissed form
  (``decline``, ``cancel``; also what an expiry with that policy sends) is
  told to the model as ``{status: "declined" | "cancelled", formKey}``, and
  the tool never runs again. A plain question's answer is a user message
  (:func:`plain_answer`). A wait that expires with ``fail`` fails the turn,
  as any wait's failure does.

Pure rules: the runner saves the wait, tells the listeners and shows it in
the chat.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from server.core.expiry import Expiry
from server.runner.agent import Agent, Tool
from server.runner.errors import FormRequired, ResumeRejected
from server.runner.form_definitions import FormDefinition
from server.runner.model import ToolSpec
from server.runner.turn import (
    FrozenForm,
    ModelMessage,
    PendingCall,
    Phase,
    ResumeCommand,
    Suspension,
    SuspensionType,
    ToolCall,
    Turn,
    result_text,
)

REQUEST_USER_INPUT = "request_user_input"


def request_user_input_spec(forms: Sequence[FormDefinition]) -> ToolSpec | None:
    """The control tool as the model sees it (None for an agent without
    forms)."""
    if not forms:
        return None
    listing = "; ".join(f"{f.key}: {f.description}" for f in forms)
    return ToolSpec(
        REQUEST_USER_INPUT,
        "Ask the people in the chat to fill in a form when information is "
        f"missing; do not guess. Forms: {listing}",
        {
            "type": "object",
            "properties": {
                "formKey": {"type": "string", "enum": [f.key for f in forms]},
                "message": {"type": "string", "description": "Why you ask"},
            },
            "required": ["formKey"],
        },
    )


def requested_form(agent: Agent, call: ToolCall) -> Suspension | str:
    """What a ``request_user_input`` call waits on, or (an unknown form) the
    tool message that tells the model why nobody is asked."""
    key = call.arguments.get("formKey")
    form = agent.form(key) if isinstance(key, str) else None
    if form is None:
        known = ", ".join(f.key for f in agent.forms) or "none"
        return result_text(
            {"status": "error", "message": f"unknown form {key!r}; known forms: {known}"}
        )
    message = call.arguments.get("message")
    return _form_suspension(
        call,
        form,
        message if isinstance(message, str) else form.description,
        form.expiry or agent.input_expiry,
    )


def required_form(agent: Agent, call: ToolCall, needed: FormRequired) -> Suspension:
    """What the call of a tool that raised ``needed`` waits on."""
    expiry = needed.expiry or needed.form.expiry or agent.input_expiry
    return _form_suspension(call, needed.form, needed.message, expiry)


def form_asked(pending: PendingCall) -> PendingCall:
    """``pending`` as it waits for the form its tool asked for (once)."""
    return msgspec.structs.replace(pending, form_asked=True, form_data=None)


def asked_again(tool: Tool, needed: FormRequired) -> str:
    """Why the turn fails whose tool raised ``needed`` after its form was
    answered."""
    return (
        f"tool {tool.name} asked for form {needed.form.key!r} again after it "
        "was submitted (a protocol error)"
    )


def _form_suspension(
    call: ToolCall, form: FormDefinition, message: str, expiry: Expiry | None
) -> Suspension:
    frozen = FrozenForm(key=form.key, description=form.description, schema=form.schema)
    return Suspension(
        type=SuspensionType.USER_INPUT,
        correlation_id=call.id,
        message=message,
        resume_phase=Phase.TOOLS,
        form=frozen,
        expiry=expiry,
    )


def check_answer(turn: Turn, suspension: Suspension, command: ResumeCommand) -> None:
    """Raise ResumeRejected unless ``command`` (a USER_INPUT resume that
    fails nothing) is the kind of answer ``suspension`` waits for: form data
    for a form, text for a plain question. Its data is not checked against
    the frozen schema: people's answers reach a turn only as the host
    accepted them, and a resume made in code is trusted code."""
    form = suspension.form
    if form is None:
        if command.data is not None:
            raise ResumeRejected(turn.id, "the turn waits for a plain-text answer, not form data")
        return
    if command.content is not None:
        raise ResumeRejected(
            turn.id, f"the turn waits for form {form.key!r}, not a plain-text answer"
        )


def answered(pending: PendingCall, form: FrozenForm, command: ResumeCommand) -> PendingCall:
    """``pending`` as people's answer to its form leaves it."""
    if command.response != "accept":
        status = "declined" if command.response == "decline" else "cancelled"
        return pending.with_result({"status": status, "formKey": form.key})
    if pending.call.name == REQUEST_USER_INPUT:
        return pending.with_result(
            {"status": "submitted", "formKey": form.key, "data": command.data or {}}
        )
    return msgspec.structs.replace(pending, form_data=command.data or {})


def plain_answer(command: ResumeCommand) -> ModelMessage:
    """The user message the answer to a plain-text question becomes."""
    return ModelMessage(role="user", content=command.content or "")
