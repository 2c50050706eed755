"""A chat model behind an OpenAI-compatible Chat Completions API, streamed.

:class:`OpenAIChatModel` sends ``POST {base_url}/chat/completions`` with a
Bearer key, to OpenAI or to any server that copies its API (vLLM, Ollama,
llama.cpp, LiteLLM, ...). Text deltas reach ``on_text`` as they arrive;
tool calls are put together from their deltas and returned whole.

Failures raise the model errors of the tree in :mod:`server.errors`, all
importable from here: ``ModelUnavailable``, a ``TransientError`` (429, 408
or 5xx, a timeout, a dropped connection or stream: the turn is retried
later), and the ``ModelError`` subclasses ``ModelRequestRejected``,
``ModelReplyInvalid`` and ``ModelNotConfigured`` (the turn fails).

No message here holds the API key, the conversation or a tool's arguments:
they end up in the runner's log and in the turn's status.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx
import msgspec

from server.runner.errors import ModelError as ModelError
from server.runner.errors import ModelNotConfigured as ModelNotConfigured
from server.runner.errors import ModelReplyInvalid as ModelReplyInvalid
from server.runner.errors import ModelRequestRejected as ModelRequestRejected
from server.runner.errors import ModelUnavailable as ModelUnavailable
from server.runner.model import ModelReply, TextSink, ToolSpec
from server.runner.turn import ModelMessage, ToolCall

DEFAULT_BASE_URL = "https://api.openai.com/v1"
ENV_BASE_URL = "HUDDLE_MODEL_BASE_URL"
ENV_API_KEY = "HUDDLE_MODEL_API_KEY"
ENV_MODEL = "HUDDLE_MODEL_NAME"

TRANSIENT_STATUS = frozenset({408, 429})
"""Besides every 5xx: a request timeout and a rate limit."""

_MESSAGE_LIMIT = 300
"""Characters of an API error message kept (a proxy may answer with a page)."""


# ─── The request ─────────────────────────────────────────────────────────────


def chat_request(
    model: str, messages: Sequence[ModelMessage], tools: Sequence[ToolSpec]
) -> dict[str, Any]:
    """The JSON body of a streamed Chat Completions request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [_wire_message(message) for message in messages],
        "stream": True,
    }
    if tools:  # OpenAI refuses an empty "tools" array
        body["tools"] = [_wire_tool(tool) for tool in tools]
    return body


def _wire_message(message: ModelMessage) -> dict[str, Any]:
    match message.role:
        case "assistant" if message.tool_calls:
            # "content: Required unless tool_calls ... is specified"
            return {
                "role": "assistant",
                "content": message.content or None,
                "tool_calls": [_wire_call(call) for call in message.tool_calls],
            }
        case "tool":
            return {
                "role": "tool",
                "tool_call_id": message.tool_call_id,
                "content": message.content or "",
            }
        case _:
            return {"role": message.role, "content": message.content or ""}


def _wire_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def _wire_tool(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


# ─── The reply: server-sent events of chunks (no I/O here) ───────────────────


class _Lenient(msgspec.Struct, frozen=True, kw_only=True):
    """A shape the API sends; unknown fields are ignored."""


class _FunctionDelta(_Lenient, frozen=True):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(_Lenient, frozen=True):
    index: int | None = None
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(_Lenient, frozen=True):
    content: str | None = None
    tool_calls: tuple[_ToolCallDelta, ...] | None = None


class _Choice(_Lenient, frozen=True):
    index: int = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _StreamError(_Lenient, frozen=True):
    message: str | None = None


class _Chunk(_Lenient, frozen=True):
    choices: tuple[_Choice, ...] | None = None
    error: _StreamError | str | None = None


_chunk_decoder = msgspec.json.Decoder(_Chunk)

DONE = "[DONE]"


class EventStream:
    """Server-sent events from lines: :meth:`feed_line` returns an event's
    data when the blank line ending it arrives, else None; :meth:`end`
    returns a last event the stream did not end with a blank line."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed_line(self, line: str) -> str | None:
        if not line:
            return self.end()
        name, _, value = line.partition(":")
        # SSE: "If value starts with a U+0020 SPACE character, remove it"
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None  # comments (":...") and other fields (event, id, retry)

    def end(self) -> str | None:
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


@dataclass
class _CallDraft:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class ReplyAssembler:
    """A reply put together from the data of the stream's events.

    :meth:`feed` takes one event's data and returns the text it adds;
    :attr:`complete` says whether the reply ended (``[DONE]`` or a finish
    reason); :meth:`reply` builds the whole reply.
    """

    def __init__(self) -> None:
        self._text: list[str] = []
        self._calls: dict[int, _CallDraft] = {}
        self._last_index: int | None = None
        self.done = False
        self.finish_reason: str | None = None

    @property
    def complete(self) -> bool:
        return self.done or self.finish_reason is not None

    def feed(self, data: str) -> str:
        if data == DONE:
            self.done = True
            return ""
        try:
            chunk = _chunk_decoder.decode(data)
        except msgspec.DecodeError as error:  # msgspec's message quotes no values
            raise ModelReplyInvalid(f"a chunk does not decode ({error})") from None
        if chunk.error is not None:
            reported = chunk.error if isinstance(chunk.error, str) else chunk.error.message
            raise ModelUnavailable(_truncate(f"the stream reported an error: {reported or '?'}"))
        text: list[str] = []
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue  # we ask for one choice
            if choice.finish_reason:
                self.finish_reason = choice.finish_reason
            if choice.delta is None:
                continue
            if choice.delta.content:
                text.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                self._feed_call(call)
        self._text.extend(text)
        return "".join(text)

    def _feed_call(self, delta: _ToolCallDelta) -> None:
        index = delta.index
        if index is None:
            # A few servers omit the index: a new id opens a new call, and
            # anything else continues the last one.
            known = self._calls.get(self._last_index) if self._last_index is not None else None
            fresh = delta.id is not None and (known is None or known.id != delta.id)
            index = len(self._calls) if fresh or self._last_index is None else self._last_index
        draft = self._calls.setdefault(index, _CallDraft())
        self._last_index = index
        # id and name arrive whole in a call's first delta; only the
        # arguments come in pieces.
        if delta.id:
            draft.id = delta.id
        if delta.function is not None:
            if delta.function.name:
                draft.name = delta.function.name
            if delta.function.arguments:
                draft.arguments.append(delta.function.arguments)

    def reply(self) -> ModelReply:
        calls = [self._call(self._calls[index]) for index in sorted(self._calls)]
        return ModelReply(text="".join(self._text), tool_calls=calls)

    def _call(self, draft: _CallDraft) -> ToolCall:
        if not draft.name:
            raise ModelReplyInvalid("a tool call has no name")
        source = "".join(draft.arguments).strip() or "{}"
        try:
            arguments = json.loads(source)
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            reason = "its arguments are not a JSON object"
            if self.finish_reason == "length":
                reason += " (the reply was cut off at the model's token limit)"
            raise ModelReplyInvalid(reason, tool=draft.name)
        # The turn needs an id for every call; make one if the server sent none.
        call_id = draft.id or f"call_{uuid.uuid4().hex}"
        return ToolCall(id=call_id, name=draft.name, arguments=arguments)


def _truncate(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 3] + "..."


def api_error_message(body: bytes) -> str:
    """The message of an error answer: OpenAI's ``{"error": {"message"}}``,
    the ``error``, ``message`` or ``detail`` other servers send, or the body
    as text."""
    try:
        document = json.loads(body)
    except ValueError:
        return _truncate(body.decode("utf-8", "replace"))
    candidates: list[Any] = []
    if isinstance(document, dict):
        error = document.get("error")
        if isinstance(error, dict):
            candidates.append(error.get("message"))
        candidates += [error, document.get("message"), document.get("detail")]
    for candidate in candidates:
        if isinstance(candidate, str) and candidate.strip():
            return _truncate(candidate)
    return _truncate(body.decode("utf-8", "replace"))


# ─── The model ───────────────────────────────────────────────────────────────


class OpenAIChatModel:
    """A :class:`~server.runner.model.ChatModel` speaking the OpenAI Chat
    Completions API, streamed.

    ``timeout`` bounds connecting and each wait for the next piece of the
    answer, not the whole reply, so a long reply that keeps streaming is
    not cut. Without ``client`` the model makes its own; :meth:`aclose` (or
    ``async with``) closes it, and never closes a client given to it.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = timeout
        self._api_key = api_key
        self._client = client if client is not None else httpx.AsyncClient()
        self._owns_client = client is None

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        timeout: float = 60.0,
        client: httpx.AsyncClient | None = None,
    ) -> OpenAIChatModel:
        """The model named by ``HUDDLE_MODEL_NAME`` at
        ``HUDDLE_MODEL_BASE_URL`` (OpenAI's by default) with
        ``HUDDLE_MODEL_API_KEY``; raises :class:`ModelNotConfigured` naming
        each unset one. ``environ`` defaults to ``os.environ``."""
        env = os.environ if environ is None else environ
        missing = [name for name in (ENV_API_KEY, ENV_MODEL) if not env.get(name)]
        if missing:
            raise ModelNotConfigured(missing)
        return cls(
            env.get(ENV_BASE_URL) or DEFAULT_BASE_URL,
            env[ENV_API_KEY],
            env[ENV_MODEL],
            timeout=timeout,
            client=client,
        )

    def __repr__(self) -> str:
        return f"OpenAIChatModel({self.base_url!r}, model={self.model!r})"

    async def complete(
        self,
        messages: Sequence[ModelMessage],
        tools: Sequence[ToolSpec],
        on_text: TextSink | None = None,
    ) -> ModelReply:
        """The model's reply; its text also goes to ``on_text`` piece by
        piece as it arrives. If this raises after some text was sent, the
        text sent is all there is of that reply."""
        try:
            return await self._complete(chat_request(self.model, messages, tools), on_text)
        except ModelUnavailable as error:
            error.reason = self._redact(error.reason)
            raise
        except httpx.TimeoutException as error:
            raise ModelUnavailable(
                f"the model API did not answer within {self.timeout:g} s"
            ) from error
        except (httpx.NetworkError, httpx.RemoteProtocolError) as error:
            reason = self._redact(str(error)) or type(error).__name__
            raise ModelUnavailable(f"the connection to the model API failed: {reason}") from error

    async def _complete(self, body: dict[str, Any], on_text: TextSink | None) -> ModelReply:
        headers = {"Authorization": f"Bearer {self._api_key}", "Accept": "text/event-stream"}
        url = f"{self.base_url}/chat/completions"
        async with self._client.stream(
            "POST", url, json=body, headers=headers, timeout=self.timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                raise self._status_error(response)
            media_type = response.headers.get("content-type", "").partition(";")[0].strip()
            if media_type != "text/event-stream":
                raise ModelReplyInvalid(
                    f"the API answered {media_type or 'no content type'}, not an event stream"
                )
            events, assembler = EventStream(), ReplyAssembler()
            async for line in response.aiter_lines():
                data = events.feed_line(line)
                if data is not None:
                    await _deliver(assembler.feed(data), on_text)
                if assembler.done:
                    break
            last = events.end()
            if last is not None and not assembler.done:
                await _deliver(assembler.feed(last), on_text)
        if not assembler.complete:
            raise ModelUnavailable("the model API's stream ended before the reply did")
        return assembler.reply()

    def _status_error(self, response: httpx.Response) -> Exception:
        status = response.status_code
        message = self._redact(api_error_message(response.content))
        if status in TRANSIENT_STATUS or status >= 500:
            return ModelUnavailable(
                str(ModelRequestRejected(status, message)),  # worded alike
                status=status,
                retry_after=response.headers.get("retry-after"),
            )
        return ModelRequestRejected(status, message)

    def _redact(self, text: str) -> str:
        return text.replace(self._api_key, "[key]") if self._api_key else text

    async def aclose(self) -> None:
        """Close the HTTP client, if the model made it."""
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> OpenAIChatModel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _deliver(text: str, on_text: TextSink | None) -> None:
    if text and on_text is not None:
        await on_text(text)
