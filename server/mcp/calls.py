"""Calling an MCP tool whose server may need people first.

:func:`call_tool` runs one ``tools/call`` to its end, whichever way the
server asks for input:

- 2025-11-25 request flow: the server sends ``elicitation/create`` while the
  call is open; the client's elicitation callback answers it (nothing to
  drive here).
- 2026-07-28 ``input_required`` flow: the call returns ``inputRequests`` and
  an opaque ``requestState``; every request is answered (elicitations by the
  given :class:`~server.mcp.elicitation.ChatElicitation`, anything else by
  the client's callbacks) and the call is sent again with the responses and
  the state, byte for byte, until a final result (at most ``max_rounds``).
- People may take longer than the server keeps its ``requestState``: a retry
  that carried state and is refused with -32602 (invalid params: the state
  failed verification) is not an error for the caller. The call is sent
  afresh, without state or responses, and the questions it brings are asked
  again, an accepted answer filled in (at most ``reissues`` times).
- A server may refuse the call with -32042 (2025-11-25: URL elicitation
  required): the links it names are put to the people; when they agree to
  open them all, the call waits for the servers'
  ``notifications/elicitation/complete`` (at most ``link_wait`` seconds) and
  is sent again (at most ``link_rounds`` times). Meanwhile the chat asks
  the people to say when they are done there (delivery of the notification
  is not guaranteed): their accept sends the call again at once, a decline
  gives up. A link people decline or dismiss raises
  :class:`~server.mcp.errors.LinkRefused`.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client import Client, ClientRequestContext, ClientSession, InputRequiredRoundsExceededError
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from server.mcp.elicitation import ChatElicitation, UrlCompletions, server_label
from server.mcp.errors import LinkRefused

log = logging.getLogger("huddle.mcp")

MAX_ROUNDS = 10
"""Input rounds of one call before giving up (the SDK's default)."""

STATE_ONLY_BACKOFF = (0.05, 0.25)
"""First and longest pause before retrying a result that carries only a
``requestState`` (the server is busy; the spec lets the client retry)."""


async def call_tool(
    client: Client,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    elicitation: ChatElicitation | None = None,
    completions: UrlCompletions | None = None,
    max_rounds: int = MAX_ROUNDS,
    reissues: int = 2,
    link_rounds: int = 3,
    link_wait: float = 300.0,
    read_timeout: float | None = None,
) -> types.CallToolResult:
    """Call tool ``name`` and return its result; see the module docstring.

    ``elicitation`` answers the elicitations of ``input_required`` results
    and -32042 errors (else the client's own callbacks do, and nothing is
    filled in when a question is asked again); ``completions`` is where the
    client records completion notifications (its ``message_handler``).

    Raises ``MCPError`` (the server's errors, and a callback's refusal),
    :class:`LinkRefused`, ``InputRequiredRoundsExceededError``.
    """
    call = _Call(client, name, arguments, elicitation, completions, read_timeout)
    rounds = reissued = linked = 0
    responses: types.InputResponses | None = None
    state: str | None = None
    backoff = STATE_ONLY_BACKOFF[0]
    while True:
        try:
            result = await call.send(responses, state)
        except MCPError as error:
            if state is not None and error.code == types.INVALID_PARAMS and reissued < reissues:
                # The spec has servers reject state that fails verification
                # (expired, most likely, while people answered): start over.
                reissued += 1
                log.info("%s: the server refused its requestState; calling again", name)
                call.remember(responses)
                responses, state, rounds = None, None, 0
                continue
            if error.code == types.URL_ELICITATION_REQUIRED and linked < link_rounds:
                linked += 1
                await call.open_links(
                    UrlElicitationRequiredError.from_error(error.error), link_wait
                )
                responses, state, rounds = None, None, 0
                continue
            raise
        if not isinstance(result, types.InputRequiredResult):
            return result
        rounds += 1
        if rounds > max_rounds:
            raise InputRequiredRoundsExceededError(max_rounds)
        if result.input_requests:
            backoff = STATE_ONLY_BACKOFF[0]
            responses = await call.fulfil(result.input_requests)
        else:
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, STATE_ONLY_BACKOFF[1])
            responses = None
        state = result.request_state


class _Call:
    """One tool call's sending and answering."""

    def __init__(
        self,
        client: Client,
        name: str,
        arguments: dict[str, Any] | None,
        elicitation: ChatElicitation | None,
        completions: UrlCompletions | None,
        read_timeout: float | None,
    ) -> None:
        self.client = client
        self.session: ClientSession = client.session
        self.name = name
        self.arguments = arguments
        self.elicitation = elicitation
        self.completions = completions
        self.read_timeout = read_timeout
        self.asked: dict[str, types.InputRequest] = {}
        """The requests of the latest round, by key."""
        self.earlier: dict[str, tuple[types.InputRequest, types.InputResponse]] = {}
        """What people answered before the server lost its state, by key."""

    async def send(
        self, responses: types.InputResponses | None, state: str | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            return await self._send(responses, state)
        except MCPError as error:
            modern = self.client.protocol_version in MODERN_PROTOCOL_VERSIONS
            if error.code != types.HEADER_MISMATCH or not modern:
                raise
            # 2026-07-28: the tool's listing is missing or stale; list, send once more.
            await self.client.list_tools(cache_mode="refresh")
            return await self._send(responses, state)

    async def _send(
        self, responses: types.InputResponses | None, state: str | None
    ) -> types.CallToolResult | types.InputRequiredResult:
        return await self.session.call_tool(
            self.name,
            self.arguments,
            read_timeout_seconds=self.read_timeout,
            input_responses=responses,
            request_state=state,
            allow_input_required=True,
        )

    def remember(self, responses: types.InputResponses | None) -> None:
        for key, response in (responses or {}).items():
            request = self.asked.get(key)
            if request is not None:
                self.earlier[key] = (request, response)

    async def fulfil(self, requests: dict[str, types.InputRequest]) -> types.InputResponses:
        """Answer every request of a round at once; raises MCPError when a
        callback refuses one (the others are cancelled: withdrawn)."""
        self.asked = dict(requests)
        responses: types.InputResponses = {}
        refused: list[types.ErrorData] = []

        async def answer(scope: anyio.abc.TaskGroup, key: str, request: types.InputRequest) -> None:
            result = await self._answer(key, request)
            if isinstance(result, types.ErrorData):
                refused.append(result)
                scope.cancel_scope.cancel()
            else:
                responses[key] = result

        async with anyio.create_task_group() as group:
            for key, request in requests.items():
                group.start_soon(answer, group, key, request)
        if refused:
            raise MCPError.from_error_data(refused[0])
        return responses

    async def _answer(
        self, key: str, request: types.InputRequest
    ) -> types.InputResponse | types.ErrorData:
        meta = request.params.meta if request.params else None
        context = ClientRequestContext(session=self.session, request_id=key, meta=meta)
        if self.elicitation is None or not isinstance(request, types.ElicitRequest):
            return await self.session.dispatch_input_request(context, request)
        previous = None
        earlier = self.earlier.pop(key, None)
        if earlier is not None and _same(earlier[0], request):
            answer = earlier[1]
            previous = answer if isinstance(answer, types.ElicitResult) else None
        return await self.elicitation.answer(context, request.params, previous=previous)

    async def open_links(self, required: UrlElicitationRequiredError, wait: float) -> None:
        """Put the links of a -32042 error to the people; wait for their
        completion when all are accepted."""
        links = required.elicitations
        results: list[types.InputResponse | types.ErrorData] = [
            types.ElicitResult(action="cancel") for _ in links
        ]

        async def ask(index: int, params: types.ElicitRequestURLParams) -> None:
            request = types.ElicitRequest(params=params)
            results[index] = await self._answer(params.elicitation_id or f"link-{index}", request)

        async with anyio.create_task_group() as group:
            for index, params in enumerate(links):
                group.start_soon(ask, index, params)
        server = server_label(self.session, self.elicitation.server if self.elicitation else None)
        for params, result in zip(links, results, strict=True):
            if isinstance(result, types.ErrorData):
                raise MCPError.from_error_data(result)
            action = result.action if isinstance(result, types.ElicitResult) else "cancel"
            if action != "accept":
                raise LinkRefused(server, params.url, action)
        ids = [p.elicitation_id for p in links if p.elicitation_id]
        if self.completions is None or not ids:
            return
        said = await self._completed_or_done(ids, links, wait)
        if said in ("decline", "cancel"):
            raise LinkRefused(server, links[0].url, said)
        if said == "timeout":
            log.info("%s: no completion for %s; calling again anyway", self.name, ids)

    async def _completed_or_done(
        self, ids: list[str], links: list[types.ElicitRequestURLParams], wait: float
    ) -> str:
        """Wait for the links' completion or the people's word, whichever
        comes first: ``complete``, ``timeout``, or the people's ``accept``
        (done), ``decline`` or ``cancel``."""
        assert self.completions is not None
        completions = self.completions
        first: list[str] = []

        async def completed(scope: anyio.CancelScope) -> None:
            first.append("complete" if await completions.wait(ids, wait) else "timeout")
            scope.cancel()

        async def said_done(scope: anyio.CancelScope) -> None:
            assert self.elicitation is not None
            context = ClientRequestContext(session=self.session, request_id="links", meta=None)
            action = await self.elicitation.confirm_done(context, links)
            if action is not None:  # None: no chat; the completion alone decides
                first.append(action)
                scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(completed, group.cancel_scope)
            if self.elicitation is not None:
                group.start_soon(said_done, group.cancel_scope)
        return first[0]


def _same(before: types.InputRequest, now: types.InputRequest) -> bool:
    """Whether two input requests ask the same thing."""
    return _wire(before) == _wire(now)


def _wire(request: types.InputRequest) -> dict[str, Any]:
    return request.model_dump(by_alias=True, mode="json", exclude_none=True)
