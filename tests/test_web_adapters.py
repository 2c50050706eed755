"""A LangGraph graph and an OpenAI Agents SDK app ask the room through the
framework adapters, and a person answers them live in the web client (a
real Chromium): a form, then an approval, each credited to that person."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    ModelResponse,
    ModelSettings,
    ModelTracing,
    Tool,
    Usage,
    function_tool,
)
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseStreamEvent
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.types import interrupt
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from playwright.async_api import Browser, Page

from server.client import HuddleClient
from server.integrations import langgraph as lg
from server.integrations import openai_agents as oa
from server.mcp.people import RemoteChat
from tests import test_web_client as web
from tests.conftest import RunningServer
from tests.people_kit import WITHIN
from tests.test_langgraph_adapter import State, human_interrupt, thread
from tests.test_openai_agents_adapter import QUIET
from tests.test_web_mcp import SYSTEM_FORM

pytestmark = pytest.mark.browser

browser = web.browser
plain_server = web.plain_server


class ScriptedCalls(Model):
    """A model that calls ``calls`` (tool name, arguments) one per turn,
    each after the last one's output came back, then says it is done; the
    outputs it got are kept in ``outputs``."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]]) -> None:
        self.calls = calls
        self.outputs: list[str] = []

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        self.outputs = [
            str(item.get("output"))
            for item in (input if isinstance(input, list) else [])
            if isinstance(item, dict) and item.get("type") == "function_call_output"
        ]
        step = len(self.outputs)
        if step < len(self.calls):
            name, arguments = self.calls[step]
            call = ResponseFunctionToolCall(
                type="function_call",
                name=name,
                call_id=f"call-{step}",
                arguments=json.dumps(arguments),
                id=f"fc-{step}",
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = ResponseOutputText(annotations=[], text="Done.", type="output_text")
        message = ResponseOutputMessage(
            id="msg", content=[text], role="assistant", status="completed", type="message"
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("run unstreamed")


async def nora_in(huddle: RunningServer, browser: Browser, title: str) -> tuple[Page, RemoteChat]:
    """A session made by the agent token, Nora's page open on it, and its
    chat's people as an adapter asks them."""
    agent = await HuddleClient.connect(huddle.ws, huddle.token("agent"))
    huddle.clients.append(agent)
    session = f"ahp-session:/{title.lower()}"
    await agent.create_session(session, title=title)
    chat = (await agent.subscribe(session)).state.default_chat  # type: ignore[union-attr]
    assert chat is not None
    token = huddle.token("participant", sessions=[session], name="Nora")
    _, page = await web.open_client(browser, huddle.http, token, session=session)
    return page, RemoteChat(agent, chat)


async def answer_in_the_page(page: Page) -> None:
    """Nora fills the form, submits, then approves the call."""
    await page.get_by_label("Affected system").fill("SSO")
    await page.get_by_role("button", name="Submit").click()
    await page.get_by_role("button", name="Approve").click()


async def test_a_person_answers_a_langgraph_graphs_form_and_approval_in_the_web_client(
    browser: Browser, plain_server: RunningServer
) -> None:
    page, people = await nora_in(plain_server, browser, "Graph")

    def triage(state: State) -> State:
        asked = interrupt({"message": "Which system fails?", "schema": SYSTEM_FORM})
        return {"answers": [asked]}

    def restart(state: State) -> State:
        [decided] = interrupt(human_interrupt("restart", {"region": "eu"}, allow_accept=True))
        return {"answers": [decided]}

    builder = StateGraph(State)
    builder.add_node("triage", triage)
    builder.add_node("restart", restart)
    builder.add_edge(START, "triage")
    builder.add_edge("triage", "restart")
    graph = builder.compile(checkpointer=InMemorySaver())
    run = asyncio.create_task(lg.run_with_people(graph, {}, thread("g"), people=people))

    await answer_in_the_page(page)
    async with asyncio.timeout(WITHIN):
        state = await run

    form, approval = state["answers"]
    assert (form["action"], form["content"], form["answered_by"]["name"]) == (
        "accept",
        {"system": "SSO"},
        "Nora",
    )
    assert (approval["type"], approval["answered_by"]["name"]) == ("accept", "Nora")


async def test_a_person_answers_an_agents_sdk_apps_form_and_approval_in_the_web_client(
    browser: Browser, plain_server: RunningServer
) -> None:
    page, people = await nora_in(plain_server, browser, "Agents")
    restarted: list[str] = []

    @function_tool(needs_approval=True)
    def restart(region: str) -> str:
        """Restart the service in a region."""
        restarted.append(region)
        return f"restarted in {region}"

    model = ScriptedCalls(
        [
            ("ask_people", {"message": "Which system fails?", "schema": SYSTEM_FORM}),
            ("restart", {"region": "eu"}),
        ]
    )
    agent = Agent(name="Ops", model=model, tools=[oa.ask_people_tool(people), restart])
    run = asyncio.create_task(
        oa.run_with_people(agent, "SSO is down", people=people, run_config=QUIET)
    )

    await answer_in_the_page(page)
    async with asyncio.timeout(WITHIN):
        result = await run

    asked = json.loads(model.outputs[0])
    assert (asked["action"], asked["content"], asked["answered_by"]["name"]) == (
        "accept",
        {"system": "SSO"},
        "Nora",
    )
    assert restarted == ["eu"]
    assert result.interruptions == []
    assert result.final_output == "Done."
