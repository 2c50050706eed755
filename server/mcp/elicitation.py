"""MCP elicitations put to the people of a chat.

:class:`ChatElicitation` is an elicitation callback for the ``mcp`` SDK's
``Client`` / ``ClientSession`` (``elicitation_callback=``). Each
``elicitation/create`` becomes one AHP input request in the chat, named
``mcp:<hex>``, whose message names the MCP server that asks::

    form (mode "form" or no mode)   questions from the requested schema
                                    (protocol.forms.parse_form), the schema
                                    frozen with the request
    url (mode "url")                a URL request; accept means a person
                                    agreed to open it

and the people's resolution becomes the ``ElicitResult`` the spec wants::

    accept (form)   content: the data with the schema's types (integers as
                    int, selections as option ids), skipped optional fields
                    left out; checked against the requested schema first
    accept (url)    no content
    decline         no content
    cancel          no content: dismissed, the turn ended, the chat was
                    truncated, or the request was withdrawn

An elicitation may be given an expiry (:class:`~server.core.expiry.Expiry`: the
callback's ``expiry``, set per bridge or per call): when nobody answers in
time the server gets ``cancel`` or ``decline`` as the policy says, and with
``fail`` the chat's turn fails and the server gets error -32001 (request
timeout) saying nobody answered in time (kept in ``expired`` for the caller,
whose call then fails with it: see :mod:`server.mcp.tools`).

What cannot be asked (a schema outside MCP's flat subset, an invalid schema,
a link that is not http(s)) gets a JSON-RPC error (-32602, the spec's code
for a request the client cannot serve) whose message says why. When the MCP
side gives up on an elicitation (the request is cancelled), the open chat
request is withdrawn: resolved as ``cancel``.

The same callback serves the 2025-11-25 request flow (the server sends
``elicitation/create``) and the 2026-07-28 ``input_required`` flow (see
:mod:`server.mcp.calls`, which drives the retries). :class:`UrlCompletions`
records ``notifications/elicitation/complete``; while a call waits for
one, :meth:`ChatElicitation.confirm_done` lets the people say they are done
at the link instead (the notification may never come).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import anyio
import jsonschema
import jsonschema.validators
import mcp_types as types
import msgspec
from mcp.client import ClientRequestContext, ClientSession, IncomingMessage
from mcp.client.session import MessageHandlerFnT

from protocol.chat import InputAnswer, InputRequest
from protocol.forms import (
    FormDataError,
    FormSchemaError,
    FormSpec,
    answers_from_form_data,
    form_data_from_answers,
    parse_form,
)
from server.core.expiry import Expiry
from server.core.schemas import SchemaCheck
from server.errors import HuddleError, InputAbandoned
from server.mcp.errors import ElicitationExpired, Unaskable
from server.mcp.people import People, Reply
from server.runner.ids import mcp_request_id

log = logging.getLogger("huddle.mcp")

WITHDRAW_WITHIN = 5.0
"""Seconds a withdrawal may take while the MCP side is already gone."""

LINK_SCHEMES = ("https", "http")


def asked_by(server: str, message: str) -> str:
    """The chat message of an elicitation: who asks, then what."""
    return f"{server} asks: {message}"


def server_label(session: ClientSession | None, override: str | None = None) -> str:
    """How the chat names an MCP server: ``override``, else the title or
    name the server gave about itself."""
    if override:
        return override
    info = session.server_info if session is not None else None
    if info is not None:
        return info.title or info.name
    return "An MCP server"


# ─── Elicitation -> chat request ─────────────────────────────────────────────


@dataclass(frozen=True)
class Question:
    """An elicitation made ready for a chat: the request to open, and for a
    form the requested schema and its parsed form."""

    request: InputRequest
    schema: dict[str, Any] | None = None
    form: FormSpec | None = None

    def again(self, note: str, answers: dict[str, InputAnswer]) -> Question:
        """The same question under a new id, ``note`` after its first
        paragraph, ``answers`` filled in (people fix what did not fit)."""
        asked = (self.request.message or "").split("\n\n", 1)[0]
        request = msgspec.structs.replace(
            self.request,
            id=mcp_request_id(),
            message=f"{asked}\n\n{note}",
            answers=answers or None,
        )
        return replace(self, request=request)


def question_for(
    params: types.ElicitRequestParams,
    *,
    server: str,
    request_id: str | None = None,
    prefill: Mapping[str, Any] | None = None,
    note: str | None = None,
) -> Question:
    """The chat request for ``params``. ``prefill`` is form data to start
    from (an earlier accepted answer to the same question); ``note`` is a
    paragraph added to the message. Raises :class:`Unaskable`."""
    rid = request_id or mcp_request_id()
    message = asked_by(server, params.message)
    if note:
        message = f"{message}\n\n{note}"
    if isinstance(params, types.ElicitRequestURLParams):
        _check_link(params.url)
        return Question(InputRequest(id=rid, message=message, url=params.url))
    schema = dict(params.requested_schema)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        where = "/".join(str(p) for p in error.absolute_path) or "the schema"
        raise Unaskable(f"{where} is not valid JSON Schema (`{error.validator}`)") from None
    try:
        form = parse_form(schema)
    except FormSchemaError as error:
        raise Unaskable(str(error)) from None
    answers = _prefilled(form, prefill)
    request = InputRequest(id=rid, message=message, questions=form.questions, answers=answers)
    return Question(request, schema, form)


def _check_link(url: str) -> None:
    # DESIGN: URL requests only ever carry http(s) links, shown in full.
    try:
        parts = urlsplit(url)
    except ValueError:
        raise Unaskable("the link is not a valid URL") from None
    if parts.scheme.lower() not in LINK_SCHEMES or not parts.hostname:
        raise Unaskable("the link must be an http or https URL with a host")


def _prefilled(form: FormSpec, data: Mapping[str, Any] | None) -> dict[str, InputAnswer] | None:
    if not data:
        return None
    try:
        return answers_from_form_data(form, {k: v for k, v in data.items() if v is not None})
    except FormDataError:
        return None  # the earlier answer does not fit this form: start empty


# ─── Chat resolution -> ElicitResult ─────────────────────────────────────────


def form_content(question: Question, answers: dict[str, InputAnswer]) -> dict[str, Any] | list[str]:
    """The content an accept of ``question`` sends, or the problems that
    keep it from fitting the requested schema (no values quoted)."""
    assert question.form is not None
    assert question.schema is not None
    try:
        data = form_data_from_answers(question.form, answers)
    except FormDataError as error:
        return [str(error)]
    problems = SchemaCheck.of(question.schema).failure_texts(data)
    return problems or data


# ─── The callback ────────────────────────────────────────────────────────────


class ChatElicitation:
    """An elicitation callback (the SDK's ``ElicitationFnT``) that asks the
    people of a chat; see the module docstring.

    ``people`` is where every elicitation goes; ``route`` instead picks the
    people per elicitation (None: there is no chat to ask in, and the server
    gets an error). ``server`` names the MCP server in the chat (default: the
    name it gives). When an accept does not fit the requested schema (which
    only a :class:`~server.mcp.people.RemoteChat` lets through: the host
    refuses it) the question is asked again with the answers kept, at most
    ``attempts`` times, then the result is ``cancel``.

    ``expiry`` applies to every question it puts (change it between calls
    as needed); ``expired`` is the latest question that ran out of time
    with ``fail`` (None until one does; the caller may reset it).
    """

    def __init__(
        self,
        people: People | None = None,
        *,
        route: Callable[[], People | None] | None = None,
        server: str | None = None,
        attempts: int = 3,
        expiry: Expiry | None = None,
    ) -> None:
        if (people is None) == (route is None):
            raise ValueError("ChatElicitation takes exactly one of people= or route=")
        self._route: Callable[[], People | None] = route or (lambda: people)
        self.server = server
        self.attempts = attempts
        self.expiry = expiry
        self.expired: ElicitationExpired | None = None

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        return await self.answer(context, params)

    async def answer(
        self,
        context: ClientRequestContext,
        params: types.ElicitRequestParams,
        *,
        previous: types.ElicitResult | None = None,
    ) -> types.ElicitResult | types.ErrorData:
        """Ask the people and return the result for the MCP server.

        ``previous`` is the answer people gave to this same question before
        the server lost it (its ``requestState`` expired): an accepted form's
        data fills the new request in, and the message says it is asked
        again.
        """
        people = self._route()
        if people is None:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message="Huddle has no chat to ask this in"
            )
        server = server_label(context.session, self.server)
        prefill, note = None, None
        if previous is not None:
            prefill = previous.content if previous.action == "accept" else None
            note = f"Asked again: {server} no longer had the earlier answer."
        try:
            question = question_for(params, server=server, prefill=prefill, note=note)
        except Unaskable as error:
            log.info("%s: not asking %s: %s", people.chat, server, error.reason)
            return types.ErrorData(code=types.INVALID_PARAMS, message=str(error))
        return await self.put(people, question)

    async def put(self, people: People, question: Question) -> types.ElicitResult | types.ErrorData:
        """Ask ``question`` until it is resolved with an answer that fits."""
        for _ in range(max(1, self.attempts)):
            try:
                reply = await ask_once(people, question, self.expiry)
            except ElicitationExpired as expired:
                log.info("%s: %s: %s", people.chat, question.request.id, expired)
                self.expired = expired
                return expired_error(expired)
            except InputAbandoned as why:
                log.info("%s: %s: %s", people.chat, question.request.id, why.reason)
                return types.ElicitResult(action="cancel")
            except Unaskable as error:
                log.info("%s: the chat refused %s: %s", people.chat, question.request.id, error)
                return types.ErrorData(code=types.INVALID_PARAMS, message=str(error))
            except HuddleError as error:
                log.warning("%s: could not ask: %s", people.chat, error)
                message = "Huddle could not reach the chat to ask this"
                return types.ErrorData(code=types.INTERNAL_ERROR, message=message)
            if reply.response != "accept":
                return types.ElicitResult(action=reply.response)
            if question.form is None:
                return types.ElicitResult(action="accept")  # a URL: no content
            content = form_content(question, reply.answers)
            if isinstance(content, dict):
                return types.ElicitResult(action="accept", content=content)
            log.info(
                "%s: %s: the answers do not fit: %s", people.chat, question.request.id, content
            )
            question = question.again(
                f"The answers did not fit: {'; '.join(content)}. Please check them.",
                reply.answers,
            )
        return types.ElicitResult(action="cancel")

    async def confirm_done(
        self, context: ClientRequestContext, links: list[types.ElicitRequestURLParams]
    ) -> str | None:
        """Ask the people to say when they are done at ``links`` (which
        they agreed to open): a confirm whose accept means done. Returns
        ``accept``, ``decline`` or ``cancel``, or None when there is no chat
        to ask in. Cancelled (the completion came first), it is withdrawn."""
        people = self._route()
        if people is None:
            return None
        server = server_label(context.session, self.server)
        hosts = ", ".join(sorted({urlsplit(link.url).hostname or link.url for link in links}))
        request = InputRequest(
            id=mcp_request_id(),
            message=asked_by(
                server,
                f"waiting until you are done at {hosts}. Accept once you have finished there "
                "(decline if you will not).",
            ),
            questions=[],
        )
        result = await self.put(people, Question(request, DONE_SCHEMA, parse_form(DONE_SCHEMA)))
        return result.action if isinstance(result, types.ElicitResult) else "cancel"


DONE_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
"""The form of a "done" confirm: nothing to fill in."""


def expired_error(expired: ElicitationExpired) -> types.ErrorData:
    """What an MCP server gets for a question nobody answered in time when
    the policy is ``fail``."""
    return types.ErrorData(code=types.REQUEST_TIMEOUT, message=str(expired))


async def ask_once(
    people: People,
    question: Question,
    expiry: Expiry | None,
    *,
    withdrawing: Callable[[], bool] = lambda: True,
) -> Reply:
    """Ask once; a cancelled wait (the MCP side, or our caller, gave up)
    withdraws the request from the chat before it propagates, unless
    ``withdrawing()`` says not to (a server stopping keeps it open for the
    call made again after the restart)."""
    try:
        return await people.ask(question.request, question.schema, expiry)
    except (InputAbandoned, ElicitationExpired):
        raise
    except BaseException:
        if not withdrawing():
            raise
        # The cancellation is delivered again at every await of a cancelled
        # anyio scope: only a shielded scope can still talk to the chat.
        with anyio.CancelScope(shield=True), anyio.move_on_after(WITHDRAW_WITHIN):
            await people.withdraw(question.request.id)
        raise


# ─── URL completions ─────────────────────────────────────────────────────────


class UrlCompletions:
    """The ``notifications/elicitation/complete`` an MCP server sent
    (2025-11-25): by elicitation id, the last ``keep`` of them.

    Pass :meth:`message_handler` as the ``Client``'s ``message_handler``
    (it forwards every message to ``forward``, when given).
    """

    def __init__(self, *, forward: MessageHandlerFnT | None = None, keep: int = 1000) -> None:
        self.forward = forward
        self.keep = keep
        self._done: OrderedDict[str, None] = OrderedDict()
        self._changed = asyncio.Event()

    async def message_handler(self, message: IncomingMessage) -> None:
        if isinstance(message, types.ElicitCompleteNotification):
            self.complete(message.params.elicitation_id)
        if self.forward is not None:
            await self.forward(message)

    def complete(self, elicitation_id: str) -> None:
        log.info("URL elicitation %s is complete", elicitation_id)
        self._done[elicitation_id] = None
        while len(self._done) > self.keep:
            self._done.popitem(last=False)
        self._changed.set()
        self._changed = asyncio.Event()

    def is_complete(self, elicitation_id: str) -> bool:
        return elicitation_id in self._done

    async def wait(self, elicitation_ids: Iterable[str], within: float) -> bool:
        """Wait until every id is complete, at most ``within`` seconds (the
        spec: delivery is not guaranteed, so never wait forever). Returns
        whether they all are."""
        pending = set(elicitation_ids)
        with anyio.move_on_after(within):
            while not all(self.is_complete(i) for i in pending):
                await self._changed.wait()
        return all(self.is_complete(i) for i in pending)
