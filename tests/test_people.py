"""The people's side: who typed what, who is here, names people can trust;
over a real server."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from protocol.actions import (
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    SessionActiveClientSet,
)
from protocol.chat import InputAnswer, InputRequest, TextQuestion, TextValue
from protocol.messages import ErrorCode
from protocol.session import ActiveClient, SessionState
from reducers import notes
from server.auth import TokenAuthority
from server.cli import main
from server.core import presence
from tests.conftest import AGENT_TOKEN, UNIT, RunningServer, session_chat_with_turn
from tests.edge import Frame, Peer, eventually, http, initialize_params
from tests.test_trust import TURN

SESSION = "ahp-session:/people"
FORM = InputRequest(
    id="details",
    questions=[
        TextQuestion(id="system", message="Which?"),
        TextQuestion(id="scope", message="Who?"),
    ],
)


def text(value: str, state: str = "draft") -> InputAnswer:
    return InputAnswer(state=state, value=TextValue(value=value))  # type: ignore[arg-type]


async def asked(huddle: RunningServer) -> tuple[Any, str]:
    agent = await huddle.client("agent", name="agent")
    chat = await session_chat_with_turn(agent, SESSION, TURN)
    await agent.dispatch_and_wait(chat, ChatInputRequested(request=FORM))
    return agent, chat


async def eventually_noted(huddle: RunningServer, chat: str, check: Any) -> Any:
    """The session's note on request ``details`` once ``check`` holds (the
    note follows the answer's echo by one session action)."""
    session = huddle.clients[0].mirrors[SESSION]

    def noted(state: Any) -> bool:
        return bool(check(notes.note_of(state.meta, "requests", chat, "details")))

    async with asyncio.timeout(5 * UNIT):
        state = await session.wait_for(noted)
    return notes.note_of(state.meta, "requests", chat, "details")


async def test_each_answer_is_credited_to_the_token_that_wrote_it(huddle: RunningServer) -> None:
    _, chat = await asked(huddle)
    dana = await huddle.client(name="Dana")
    lee = await huddle.client(name="Lee")

    await dana.dispatch_and_wait(
        chat, ChatInputAnswerChanged(request_id="details", question_id="system", answer=text("SS"))
    )
    await lee.dispatch_and_wait(
        chat,
        ChatInputAnswerChanged(request_id="details", question_id="scope", answer=text("all")),
    )
    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id="details", response="accept", answers={"system": text("SSO", "submitted")}
        ),
    )

    note = await eventually_noted(huddle, chat, lambda n: n and "completed" in n)
    answers = note["answers"]
    assert answers["scope"]["by"]["name"] == "Lee"
    assert answers["system"] == {"by": answers["system"]["by"], "state": "submitted"}
    assert answers["system"]["by"]["name"] == "Lee"  # Lee's submit overwrote Dana's draft
    assert note["completed"]["by"]["name"] == "Lee"
    assert note["completed"]["response"] == "accept"


def shared_link(huddle: RunningServer) -> str:
    """A shared link's token: its holders name themselves."""
    return huddle.authority.mint(
        "participant", name="participant", expires_at=time.time() + 60, shared=True
    )


async def test_a_shared_links_holder_goes_by_the_name_they_typed_marked_as_such(
    huddle: RunningServer,
) -> None:
    _, chat = await asked(huddle)
    shared = shared_link(huddle)
    peer = await Peer.open(huddle.ws, shared, "dana-tab")
    params = initialize_params("dana-tab")
    params["capabilities"]["huddle.identity"] = {"name": "  Dana  "}
    result = (await peer.request("initialize", params))["result"]
    await peer.subscribe(chat)

    await peer.dispatch(
        chat, ChatInputAnswerChanged(request_id="details", question_id="system", answer=text("x"))
    )

    identity = result["_meta"]["huddle"]["identity"]
    assert identity["name"] == "Dana"
    assert identity["declared"] is True
    assert identity["display"] == "Dana · shared link"
    note = await eventually_noted(huddle, chat, lambda n: n and "answers" in n)
    assert note["answers"]["system"]["by"]["declared"] is True
    assert note["answers"]["system"]["by"]["token"] == huddle.authority.verify(shared, 0).token_id


NAMES = json.loads((Path(__file__).parent / "fixtures/names/typed-names.json").read_text())
"""Typed names and what becomes of them, shared with web/test/people.test.mjs."""


async def initialize_as_typed(
    huddle: RunningServer, typed: str, token: str | None = None, client_id: str = "tab"
) -> Frame:
    """``initialize`` by a shared link's holder who typed ``typed``: its answer."""
    peer = await Peer.open(huddle.ws, token or shared_link(huddle), client_id)
    params = initialize_params(client_id)
    params["capabilities"]["huddle.identity"] = {"name": typed}
    try:
        return await peer.request("initialize", params)
    finally:
        await peer.close()


@pytest.mark.parametrize("case", NAMES["accepted"], ids=[c["id"] for c in NAMES["accepted"]])
async def test_a_typed_name_is_shown_composed_and_a_blank_one_is_the_tokens(
    huddle: RunningServer, case: dict[str, str]
) -> None:
    reply = await initialize_as_typed(huddle, case["typed"])

    identity = reply["result"]["_meta"]["huddle"]["identity"]
    assert identity["name"] == (case["name"] or "participant")
    assert identity.get("declared", False) is bool(case["name"])


@pytest.mark.parametrize("case", NAMES["refused"], ids=[c["id"] for c in NAMES["refused"]])
async def test_a_typed_name_that_hides_or_reorders_text_is_refused_saying_which_character(
    huddle: RunningServer, case: dict[str, str]
) -> None:
    reply = await initialize_as_typed(huddle, case["typed"])

    assert reply["error"]["code"] == ErrorCode.INVALID_PARAMS
    assert reply["error"]["message"].startswith(case["reason"])
    assert reply["error"]["data"]["path"] == '$.params.capabilities["huddle.identity"].name'


async def test_a_refused_name_claims_no_client_id(huddle: RunningServer) -> None:
    link = shared_link(huddle)
    for n in range(40):  # more than the 30 new client ids a token may start at once
        refused = await initialize_as_typed(huddle, "\u202eanaD", link, f"tab-{n}")
        assert refused["error"]["code"] == ErrorCode.INVALID_PARAMS

    named = await initialize_as_typed(huddle, "Dana", link, "tab-named")

    assert named["result"]["_meta"]["huddle"]["identity"]["name"] == "Dana"


async def test_the_long_poll_says_a_typed_in_name_is_declared(huddle: RunningServer) -> None:
    _, chat = await asked(huddle)
    poll = asyncio.create_task(
        http(
            "GET",
            f"{huddle.http}/api/input/wait?chat={chat}&request=details&timeout={5 * UNIT}",
            token=huddle.token(name="agent-poller"),
        )
    )
    await eventually(lambda: huddle.server.parts.host.waiters.waiting_on(chat) > 0)
    shared = shared_link(huddle)
    peer = await Peer.open(huddle.ws, shared, "dana-tab")
    params = initialize_params("dana-tab")
    params["capabilities"]["huddle.identity"] = {"name": "alice"}
    await peer.request("initialize", params)

    await peer.dispatch(chat, ChatInputCompleted(request_id="details", response="cancel"))

    reply = (await poll).json()
    assert reply["by"] == "alice"
    assert reply["who"]["declared"] is True
    assert reply["who"]["token"] == huddle.authority.verify(shared, 0).token_id


async def test_a_typed_name_is_ignored_for_a_token_of_ones_own(huddle: RunningServer) -> None:
    peer = await Peer.open(huddle.ws, huddle.token(name="Lee"), "lee-tab")
    params = initialize_params("lee-tab")
    params["capabilities"]["huddle.identity"] = {"name": "The Boss"}

    result = (await peer.request("initialize", params))["result"]

    assert result["_meta"]["huddle"]["identity"]["name"] == "Lee"
    assert "declared" not in result["_meta"]["huddle"]["identity"]


async def test_the_session_shows_who_is_here(huddle: RunningServer) -> None:
    agent, _ = await asked(huddle)
    session = agent.mirrors[SESSION]
    dana = await Peer.ready(huddle.ws, huddle.token(name="Dana"), "dana-laptop")
    await dana.subscribe(SESSION)
    entry = ActiveClient(client_id="dana-laptop", display_name="The CEO", tools=[])
    await dana.dispatch(SESSION, SessionActiveClientSet(active_client=entry))

    async with asyncio.timeout(5 * UNIT):
        state = await session.wait_for(lambda s: bool(s.active_clients))
    assert [(c.client_id, c.display_name) for c in state.active_clients] == [
        ("dana-laptop", "Dana")
    ]

    await dana.close()  # without taking itself out: the server does

    async with asyncio.timeout(5 * UNIT):
        await session.wait_for(lambda s: not s.active_clients)


def test_invite_prints_a_link_with_a_token_of_that_name(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "invite",
            "Dana",
            "--session",
            "ticket-42",
            "--role",
            "observer",
            "--token",
            AGENT_TOKEN,
            "--url",
            "http://huddle.example:8765/",
        ]
    )

    link = capsys.readouterr().out.strip()
    assert code == 0
    assert link.startswith("http://huddle.example:8765/?token=hud1.")
    grant = TokenAuthority(AGENT_TOKEN).verify(link.split("token=", 1)[1], time.time())
    assert (grant.name, grant.role, grant.sessions, grant.shared) == (
        "Dana",
        "observer",
        frozenset({"ahp-session:/ticket-42"}),
        False,
    )


def test_invite_refuses_a_name_that_hides_or_reorders_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["invite", "Da\u200bna", "--token", AGENT_TOKEN]) == 2
    assert "a name cannot hold U+200B" in capsys.readouterr().err


def test_invite_needs_the_agent_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HUDDLE_TOKEN", raising=False)
    assert main(["invite", "Dana"]) == 2
    assert "needs the agent token" in capsys.readouterr().err


async def test_a_client_back_on_a_new_connection_keeps_its_entry(huddle: RunningServer) -> None:
    agent, _ = await asked(huddle)
    session = agent.mirrors[SESSION]
    dana = await Peer.ready(huddle.ws, huddle.token(name="Dana"), "dana-laptop")
    await dana.subscribe(SESSION)
    entry = ActiveClient(client_id="dana-laptop", display_name="Dana", tools=[])
    await dana.dispatch(SESSION, SessionActiveClientSet(active_client=entry))
    async with asyncio.timeout(5 * UNIT):
        await session.wait_for(lambda s: bool(s.active_clients))

    await presence.leave(huddle.server.parts.host, SESSION, "dana-laptop", back=lambda: True)
    kept = (await huddle.server.parts.host.view(SESSION)).state
    await presence.leave(huddle.server.parts.host, SESSION, "dana-laptop")
    gone = (await huddle.server.parts.host.view(SESSION)).state

    assert isinstance(kept, SessionState)
    assert isinstance(gone, SessionState)
    assert [c.client_id for c in kept.active_clients] == ["dana-laptop"]
    assert gone.active_clients == []
    await dana.close()


async def test_submitting_what_someone_else_wrote_leaves_it_theirs(huddle: RunningServer) -> None:
    _, chat = await asked(huddle)
    dana = await huddle.client(name="Dana")
    lee = await huddle.client(name="Lee")
    await dana.dispatch_and_wait(
        chat, ChatInputAnswerChanged(request_id="details", question_id="system", answer=text("SSO"))
    )
    await lee.dispatch_and_wait(
        chat, ChatInputAnswerChanged(request_id="details", question_id="scope", answer=text("al"))
    )

    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id="details",
            response="accept",
            answers={"system": text("SSO", "submitted"), "scope": text("all", "submitted")},
        ),
    )

    note = await eventually_noted(huddle, chat, lambda n: n and "completed" in n)
    assert note["answers"]["system"]["by"]["name"] == "Dana"  # Lee only submitted it
    assert note["answers"]["system"]["state"] == "submitted"
    assert note["answers"]["scope"]["by"]["name"] == "Lee"
    assert note["completed"]["by"]["name"] == "Lee"


@pytest.mark.parametrize("kept_value", [True, False], ids=["value kept", "value dropped"])
async def test_skipping_what_someone_else_wrote_is_credited_to_who_skipped(
    huddle: RunningServer, kept_value: bool
) -> None:
    _, chat = await asked(huddle)
    dana = await huddle.client(name="Dana")
    lee = await huddle.client(name="Lee")
    await dana.dispatch_and_wait(
        chat, ChatInputAnswerChanged(request_id="details", question_id="system", answer=text("SSO"))
    )
    skipped = InputAnswer(state="skipped", value=TextValue(value="SSO") if kept_value else None)

    await lee.dispatch_and_wait(
        chat,
        ChatInputCompleted(
            request_id="details",
            response="accept",
            answers={"system": skipped, "scope": text("all", "submitted")},
        ),
    )

    note = await eventually_noted(huddle, chat, lambda n: n and "completed" in n)
    assert note["answers"]["system"] == {"by": note["completed"]["by"], "state": "skipped"}
    assert note["answers"]["system"]["by"]["name"] == "Lee"  # Dana never skipped it
