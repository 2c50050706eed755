"""What every framework adapter puts to people the same way: a form (a
JSON Schema and a message) as an input request, answered with data that
fits the schema and credited to the person who submitted it.

The request's id is the adapter's (:func:`~server.runner.ids.adapter_id`),
so a process started again asks under the same id and finds the request
again (:class:`~server.mcp.people.RemoteChat`): waited on while open, its
answer once answered. Answers that do not fit the schema (only a chat that
does not enforce it lets them through) are never returned: the form is
asked again, the answers kept, under the next id of the same sequence, at
most ``ATTEMPTS`` times, then the reply is ``cancel``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types
import msgspec

from protocol.chat import InputResponseKind
from server.core.expiry import Expiry
from server.mcp.elicitation import Question, form_content, question_for
from server.mcp.people import People, person

ATTEMPTS: Final = 3


@dataclass(frozen=True)
class FormAnswer:
    """How people resolved a form: ``content`` (the data, typed as the
    schema says) only on ``accept``; ``answered_by`` who answered as the
    server knows them (server.mcp.people.person; None: nobody did, it
    expired or was withdrawn)."""

    action: InputResponseKind
    content: dict[str, Any] | None = None
    answered_by: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """``{"action", "content", "answered_by"}``, as a graph resumes with it."""
        return {"action": self.action, "content": self.content, "answered_by": self.answered_by}


async def ask_form(
    people: People,
    request_id: str,
    *,
    asker: str,
    message: str,
    schema: dict[str, Any],
    expiry: Expiry | None = None,
) -> FormAnswer:
    """Ask the form ``schema`` in the chat (``asker`` names who asks) and
    wait until it is resolved with answers that fit. Raises
    :class:`~server.mcp.errors.Unaskable` for a schema the chat cannot ask
    (outside MCP's flat subset), and whatever ``people.ask`` raises."""
    params = types.ElicitRequestFormParams(message=message, requested_schema=schema)
    question = question_for(params, server=asker, request_id=request_id)
    for attempt in range(1, ATTEMPTS + 1):
        reply = await people.ask(question.request, question.schema, expiry)
        who = person(reply.answered_by)
        if reply.response != "accept":
            return FormAnswer(reply.response, answered_by=who)
        content = form_content(question, reply.answers)
        if isinstance(content, dict):
            return FormAnswer("accept", content, who)
        note = f"The answers did not fit: {'; '.join(content)}. Please check them."
        question = _again(question.again(note, reply.answers), f"{request_id}.{attempt}")
    return FormAnswer("cancel")


def _again(question: Question, request_id: str) -> Question:
    """``question`` under ``request_id``: asked again after a restart, the
    same retry is found, not a new one."""
    request = msgspec.structs.replace(question.request, id=request_id)
    return Question(request, question.schema, question.form)
