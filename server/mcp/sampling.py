"""MCP sampling (``sampling/createMessage``) put to the people of a chat,
then to the agent's model; and the roots an MCP server may know.

Off unless :attr:`~server.mcp.tools.McpServerConfig.sampling` is set: a
client without a sampling callback declares no sampling capability, and the
MCP server gets an error if it asks anyway.

When on, each request becomes an input request in the chat (``mcp:<hex>``)
that shows what the server wants sent to a model (its system prompt and
messages) and asks the people to approve it, with the last message editable
(one required text question, ``message``, filled in with it):

    accept    the conversation, its last user message as the people left
              it, goes to the model of the agent whose tool is running; its
              reply is the ``CreateMessageResult`` (role ``assistant``, text)
    decline   error -1 ("the people declined ..."), as the spec suggests for
    cancel    a request the user rejects; nothing reaches a model

With an expiry (``expiry``, as for elicitations) nobody answering in time is
a decline (``cancel``, ``decline``), or with ``fail`` the chat's turn fails
and the server gets error -32001 (kept in ``expired``).

Only text is forwarded: other content shows, and is sent, as a placeholder
(``[image: image/png]``). Tool use in sampling is not offered (the
capability is declared without ``tools``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.client import ClientRequestContext

from protocol.chat import InputRequest
from protocol.forms import answers_from_form_data, parse_form
from server.core.expiry import Expiry
from server.errors import HuddleError, InputAbandoned
from server.mcp.elicitation import Question, expired_error, form_content, server_label
from server.mcp.errors import ElicitationExpired, Unaskable
from server.mcp.people import People
from server.runner.ids import mcp_request_id
from server.runner.model import ChatModel
from server.runner.turn import ModelMessage

log = logging.getLogger("huddle.mcp")

DECLINED = -1
"""The error code the spec's examples use for a sampling request the user
rejected."""
MESSAGE = "message"
"""The id of the one question: the message to send, as edited."""


def content_text(content: Any) -> str:
    """A sampling message's content as text (placeholders for the rest)."""
    blocks = content if isinstance(content, list) else [content]
    return "\n".join(_block_text(block) for block in blocks)


def _block_text(block: Any) -> str:
    if isinstance(block, types.TextContent):
        return block.text
    mime = getattr(block, "mime_type", None)
    return f"[{block.type}: {mime}]" if mime else f"[{block.type}]"


def sampling_question(params: types.CreateMessageRequestParams, *, server: str) -> Question:
    """The chat request that asks to approve ``params`` (see the module)."""
    lines = [f"{server} wants to send this to the agent's model:"]
    if params.system_prompt:
        lines.append(f"System: {params.system_prompt}")
    lines.extend(f"{m.role.capitalize()}: {content_text(m.content)}" for m in params.messages)
    last = _last_user(params)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            MESSAGE: {
                "type": "string",
                "title": "Message to the model",
                "description": "Approve it as it is, or edit it first",
                **({"default": last} if last else {}),
            }
        },
        "required": [MESSAGE],
    }
    form = parse_form(schema)
    answers = answers_from_form_data(form, {MESSAGE: last}) if last else None
    request = InputRequest(
        id=mcp_request_id(),
        message="\n\n".join(lines),
        questions=form.questions,
        answers=answers,
    )
    return Question(request, schema, form)


def _last_user(params: types.CreateMessageRequestParams) -> str:
    for message in reversed(params.messages):
        if message.role == "user":
            return content_text(message.content)
    return ""


def model_messages(params: types.CreateMessageRequestParams, edited: str) -> list[ModelMessage]:
    """The conversation for the model: the server's system prompt, its
    messages, the last user message replaced by ``edited``."""
    messages = []
    if params.system_prompt:
        messages.append(ModelMessage(role="system", content=params.system_prompt))
    last = max((i for i, m in enumerate(params.messages) if m.role == "user"), default=None)
    for index, message in enumerate(params.messages):
        text = edited if index == last else content_text(message.content)
        if message.role == "user":
            messages.append(ModelMessage(role="user", content=text))
        else:
            messages.append(ModelMessage(role="assistant", content=text))
    if last is None:
        messages.append(ModelMessage(role="user", content=edited))
    return messages


class ChatSampling:
    """A sampling callback (the SDK's ``SamplingFnT``): the people of the
    chat approve, the agent's model answers. ``route`` gives both for the
    call running now (None when there is no chat or no model)."""

    def __init__(
        self,
        route: Callable[[], tuple[People | None, ChatModel | None]],
        *,
        server: str | None = None,
        expiry: Expiry | None = None,
    ) -> None:
        self._route = route
        self.server = server
        self.expiry = expiry
        self.expired: ElicitationExpired | None = None

    async def __call__(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.ErrorData:
        people, model = self._route()
        if people is None or model is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="Huddle has no chat and model to sample with"
            )
        server = server_label(context.session, self.server)
        question = sampling_question(params, server=server)
        try:
            reply = await people.ask(question.request, question.schema, self.expiry)
        except ElicitationExpired as expired:
            self.expired = expired
            return expired_error(expired)
        except InputAbandoned:
            return types.ErrorData(code=DECLINED, message="nobody in the chat will answer this")
        except Unaskable as error:
            return types.ErrorData(code=types.INVALID_PARAMS, message=str(error))
        except HuddleError as error:
            log.warning("%s: could not ask to sample: %s", people.chat, error)
            return types.ErrorData(code=types.INTERNAL_ERROR, message="Huddle could not ask")
        if reply.response != "accept":
            return types.ErrorData(
                code=DECLINED, message="the people declined to send this to a model"
            )
        content = form_content(question, reply.answers)
        if not isinstance(content, dict):
            return types.ErrorData(code=types.INVALID_PARAMS, message="; ".join(content))
        answer = await model.complete(model_messages(params, str(content[MESSAGE])), [])
        return types.CreateMessageResult(
            role="assistant",
            content=types.TextContent(type="text", text=answer.text),
            model=model_name(model),
            stop_reason="endTurn",
        )


def model_name(model: ChatModel) -> str:
    """What a sampling result says the model was."""
    for attribute in ("name", "model"):
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    return type(model).__name__


class Roots:
    """A ``list_roots_callback`` answering with ``roots`` (``file://`` URIs)."""

    def __init__(self, roots: tuple[str, ...]) -> None:
        self.listed = types.ListRootsResult.model_validate(
            {"roots": [{"uri": uri} for uri in roots]}
        )

    async def __call__(self, context: ClientRequestContext) -> types.ListRootsResult:
        return self.listed
