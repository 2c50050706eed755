"""OpenAIChatModel against a Chat Completions API of the test's own: a
Starlette app under uvicorn on port 0, reached by the real httpx client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from server.config import Settings
from server.edge.serve import UvicornServer, uvicorn_config
from server.runner.agent import TransientError
from server.runner.model import ToolSpec
from server.runner.openai import (
    DEFAULT_BASE_URL,
    ModelNotConfigured,
    ModelReplyInvalid,
    ModelRequestRejected,
    OpenAIChatModel,
)
from server.runner.turn import ModelMessage, ToolCall
from tests.conftest import UNIT

KEY = "sk-test-0123456789abcdef"
MODEL = "gpt-test"
HELLO = [ModelMessage(role="user", content="Hello")]

Step = dict[str, Any] | str | asyncio.Event
"""What a streamed answer sends next: a chunk, raw event data, or an event
to wait for before going on."""


@dataclass
class Received:
    path: str
    authorization: str | None
    body: Any


@dataclass
class FakeAPI:
    """The API: records every request and answers with ``answer``.
    ``release`` frees any answer still waiting when the test ends."""

    url: str
    answer: Callable[[], Awaitable[Response]]
    release: asyncio.Event
    received: list[Received] = field(default_factory=list)

    def stream(self, *steps: Step) -> None:
        """Answer with these steps as server-sent events."""

        async def events() -> AsyncIterator[bytes]:
            for step in steps:
                if isinstance(step, asyncio.Event):
                    await step.wait()
                else:
                    data = step if isinstance(step, str) else json.dumps(step)
                    yield f"data: {data}\n\n".encode()

        async def answer() -> Response:
            return StreamingResponse(events(), media_type="text/event-stream")

        self.answer = answer

    def respond(self, response: Response) -> None:
        async def answer() -> Response:
            return response

        self.answer = answer

    def hang(self) -> None:
        """Answer only when the test ends."""

        async def answer() -> Response:
            await self.release.wait()
            return Response()

        self.answer = answer


@pytest.fixture
async def api() -> AsyncIterator[FakeAPI]:
    async def unset() -> Response:
        return Response(status_code=500)

    async def chat_completions(request: Request) -> Response:
        body = await request.json()
        fake.received.append(Received(request.url.path, request.headers.get("authorization"), body))
        return await fake.answer()

    app = Starlette(routes=[Route("/v1/chat/completions", chat_completions, methods=["POST"])])
    server = UvicornServer(uvicorn_config(app, Settings(port=0), port=0, log_level="warning"))
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10 * UNIT):
        await server.listening.wait()
    fake = FakeAPI(f"http://127.0.0.1:{server.port}/v1", unset, asyncio.Event())
    try:
        yield fake
    finally:
        fake.release.set()
        server.should_exit = True
        async with asyncio.timeout(10 * UNIT):
            await task


@pytest.fixture
async def model(api: FakeAPI) -> AsyncIterator[OpenAIChatModel]:
    async with OpenAIChatModel(api.url, KEY, MODEL, timeout=5 * UNIT) as model:
        yield model


class Pieces(list[str]):
    """An ``on_text`` sink keeping what it was given, in order."""

    def __init__(self, seen: asyncio.Event | None = None) -> None:
        super().__init__()
        self.seen = seen

    async def __call__(self, piece: str) -> None:
        self.append(piece)
        if self.seen is not None:
            self.seen.set()


def text(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


def call(
    index: int, arguments: str, *, id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    part: dict[str, Any] = {"index": index, "function": function}
    if id is not None:
        part.update(id=id, type="function")
    if name is not None:
        function["name"] = name
    return {"choices": [{"index": 0, "delta": {"tool_calls": [part]}, "finish_reason": None}]}


def finish(reason: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


# ─── Replies ─────────────────────────────────────────────────────────────────


async def test_model_streams_text_to_on_text_as_it_arrives(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    first_seen = asyncio.Event()
    # The API holds the rest until on_text has the first piece: a model that
    # waited for the whole reply would time out here.
    api.stream(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        text("Hel"),
        first_seen,
        text("lo, "),
        text("world"),
        finish("stop"),
        "[DONE]",
    )
    pieces = Pieces(first_seen)

    reply = await model.complete(HELLO, [], pieces)

    assert pieces == ["Hel", "lo, ", "world"]
    assert reply.text == "Hello, world"
    assert reply.tool_calls == []


async def test_model_assembles_tool_calls_from_fragments(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    api.stream(
        text("Checking both."),
        call(0, "", id="call_a", name="lookup"),
        call(0, '{"ci'),
        call(1, "", id="call_b", name="convert"),
        call(0, 'ty": "Os'),
        call(1, '{"amount": 3, "units": ["C", '),
        call(0, 'lo"}'),
        call(1, '"F"]}'),
        finish("tool_calls"),
        "[DONE]",
    )

    reply = await model.complete(HELLO, [], None)

    assert reply.text == "Checking both."
    assert reply.tool_calls == [
        ToolCall(id="call_a", name="lookup", arguments={"city": "Oslo"}),
        ToolCall(id="call_b", name="convert", arguments={"amount": 3, "units": ["C", "F"]}),
    ]


async def test_model_sends_model_messages_and_tools(api: FakeAPI, model: OpenAIChatModel) -> None:
    api.stream(text("3 degrees."), finish("stop"), "[DONE]")
    lookup = ToolSpec(
        name="lookup",
        description="The weather in a city.",
        parameters={"type": "object", "properties": {"city": {"type": "string"}}},
    )
    messages = [
        ModelMessage(role="system", content="Be brief."),
        ModelMessage(role="user", content="Weather in Oslo?"),
        ModelMessage(
            role="assistant",
            content="",
            tool_calls=(ToolCall(id="call_1", name="lookup", arguments={"city": "Oslo"}),),
        ),
        ModelMessage(role="tool", content='{"celsius": 3}', tool_call_id="call_1"),
    ]

    await model.complete(messages, [lookup], None)

    [request] = api.received
    assert request.path == "/v1/chat/completions"
    assert request.authorization == f"Bearer {KEY}"
    assert request.body == {
        "model": MODEL,
        "stream": True,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 3}'},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "The weather in a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ],
    }


async def test_model_sends_no_tools_when_it_has_none(api: FakeAPI, model: OpenAIChatModel) -> None:
    api.stream(text("Hi."), "[DONE]")

    await model.complete(HELLO, [], None)

    assert "tools" not in api.received[0].body


async def test_model_accepts_a_stream_that_ends_with_a_finish_reason_but_no_done(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    api.stream(text("Hi."), finish("stop"))

    reply = await model.complete(HELLO, [], None)

    assert reply.text == "Hi."


# ─── Failures worth retrying ─────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        pytest.param(429, {"Retry-After": "7"}, "429: Slow down (retry after 7 s)", id="429"),
        pytest.param(503, {}, "503: Slow down", id="503"),
    ],
)
async def test_model_busy_answers_are_transient(
    api: FakeAPI, model: OpenAIChatModel, status: int, headers: dict[str, str], expected: str
) -> None:
    body = {"error": {"message": "Slow down", "type": "rate_limit"}}
    api.respond(JSONResponse(body, status_code=status, headers=headers))

    with pytest.raises(TransientError) as raised:
        await model.complete(HELLO, [], None)

    assert expected in str(raised.value)


@pytest.mark.parametrize(
    ("steps", "expected_pieces"),
    [
        pytest.param((), [], id="before-the-answer"),
        pytest.param((text("Hel"),), ["Hel"], id="in-the-middle-of-the-stream"),
    ],
)
async def test_model_that_stops_answering_times_out_as_transient(
    api: FakeAPI, steps: tuple[Step, ...], expected_pieces: list[str]
) -> None:
    if steps:
        api.stream(*steps, api.release)
    else:
        api.hang()
    pieces = Pieces()

    async with OpenAIChatModel(api.url, KEY, MODEL, timeout=0.25 * UNIT) as model:
        with pytest.raises(TransientError, match="did not answer within"):
            await model.complete(HELLO, [], pieces)

    assert pieces == expected_pieces


async def test_model_unreachable_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The port is free again: nothing listens there.

    async with OpenAIChatModel(f"http://127.0.0.1:{port}/v1", KEY, MODEL) as model:
        with pytest.raises(TransientError, match="connection to the model API failed"):
            await model.complete(HELLO, [], None)


async def test_model_stream_that_ends_early_is_transient(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    api.stream(text("Hel"))

    with pytest.raises(TransientError, match="ended before the reply did"):
        await model.complete(HELLO, [], None)


# ─── Failures that retrying will not fix ─────────────────────────────────────


async def test_model_rejection_carries_the_api_message_but_not_the_key(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    async def answer() -> Response:
        # An API that quotes the request's key back in its error.
        authorization = api.received[-1].authorization or ""
        message = f"Unknown model {MODEL!r} for {authorization}"
        return JSONResponse({"error": {"message": message}}, status_code=400)

    api.answer = answer

    with pytest.raises(ModelRequestRejected) as raised:
        await model.complete(HELLO, [], None)

    assert not isinstance(raised.value, TransientError)
    assert raised.value.status == 400
    assert f"400: Unknown model {MODEL!r} for Bearer [key]" in str(raised.value)
    assert KEY not in str(raised.value)
    assert KEY not in repr(raised.value)


async def test_model_fails_on_tool_arguments_that_are_not_json_naming_the_tool(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    api.stream(call(0, '{"city": "Os', id="call_a", name="lookup"), finish("length"), "[DONE]")

    with pytest.raises(ModelReplyInvalid) as raised:
        await model.complete(HELLO, [], None)

    assert not isinstance(raised.value, TransientError)
    assert raised.value.tool == "lookup"
    assert "'lookup'" in str(raised.value)
    assert "token limit" in str(raised.value)
    assert "Os" not in str(raised.value)


async def test_model_fails_on_an_answer_that_is_not_a_stream(
    api: FakeAPI, model: OpenAIChatModel
) -> None:
    api.respond(JSONResponse({"choices": [{"message": {"content": "Hi."}}]}))

    with pytest.raises(ModelReplyInvalid, match="not an event stream"):
        await model.complete(HELLO, [], None)


# ─── Configuration ───────────────────────────────────────────────────────────


async def test_model_from_env_reads_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUDDLE_MODEL_BASE_URL", "http://models.internal/v1/")
    monkeypatch.setenv("HUDDLE_MODEL_API_KEY", KEY)
    monkeypatch.setenv("HUDDLE_MODEL_NAME", MODEL)

    async with OpenAIChatModel.from_env() as model:
        assert (model.base_url, model.model) == ("http://models.internal/v1", MODEL)
        assert KEY not in repr(model)


async def test_model_from_env_defaults_to_openai(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HUDDLE_MODEL_BASE_URL", raising=False)
    monkeypatch.setenv("HUDDLE_MODEL_API_KEY", KEY)
    monkeypatch.setenv("HUDDLE_MODEL_NAME", MODEL)

    async with OpenAIChatModel.from_env() as model:
        assert model.base_url == DEFAULT_BASE_URL


@pytest.mark.parametrize("missing", ["HUDDLE_MODEL_API_KEY", "HUDDLE_MODEL_NAME"])
def test_model_from_env_names_a_missing_variable(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.setenv("HUDDLE_MODEL_API_KEY", KEY)
    monkeypatch.setenv("HUDDLE_MODEL_NAME", MODEL)
    monkeypatch.delenv(missing)

    with pytest.raises(ModelNotConfigured, match=missing) as raised:
        OpenAIChatModel.from_env()

    assert raised.value.missing == (missing,)
