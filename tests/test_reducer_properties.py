"""Properties of the root, session and chat reducers, checked with hypothesis.

Actions of every type are built from the wire types (see
:class:`tests.test_codec.WireStrategies`) with small id pools, so that random
sequences hit the same turns, tool calls, input requests and questions again
and again. States are either arbitrary well-typed values or reachable ones:
a small seed state followed by a random sequence of actions.

The reducers must be total, pure and deterministic on any well-typed input.
On top, for sequences where the host's validation
(:func:`reducers.validation.reject_reason`) runs first, the chat keeps two
invariants: answers only answer questions of their request, and the status
activity follows the live work as AHP derives it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from protocol.actions import (
    CHAT_ACTIONS,
    ROOT_ACTIONS,
    SESSION_ACTIONS,
    ChatAction,
    ChatError,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageRemoved,
    ChatPendingMessageSet,
    ChatResponsePart,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatToolCallResultConfirmed,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    ChatWorkingDirectorySet,
    SessionChatAdded,
    SessionCustomizationRemoved,
    SessionCustomizationsChanged,
    SessionCustomizationToggled,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
    SessionIsArchivedChanged,
    SessionIsReadChanged,
    SessionMcpServerStartRequested,
    SessionMcpServerStateChanged,
    SessionMcpServerStopRequested,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    BooleanQuestion,
    BooleanValue,
    ChatState,
    ChatSummary,
    ConfirmationOption,
    InputAnswer,
    InputAnswerValue,
    InputOption,
    InputQuestion,
    InputRequest,
    InputRequestPart,
    MarkdownPart,
    McpContributor,
    Message,
    MessageOrigin,
    MultiSelectQuestion,
    NumberQuestion,
    NumberValue,
    PendingMessage,
    ReasoningPart,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
    ToolCall,
    Turn,
)
from protocol.codec import convert_state, encode, to_builtins
from protocol.messages import ChannelState
from protocol.session import (
    ActiveClient,
    ChatInputNeeded,
    RootState,
    SessionInputNeeded,
    SessionState,
)
from protocol.status import ACTIVITY_MASK, SessionStatus
from reducers import reduce
from reducers.aggregate import (
    chat_summary,
    derive_session_actions,
    select_input_needed,
    session_summary,
)
from reducers.chat import reduce_chat, select_activity, select_tool_call
from reducers.root import reduce_root
from reducers.session import reduce_session
from reducers.validation import reject_reason
from tests.test_codec import wire_strategies

NOW = 9999
PROPERTIES = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ─── Id pools: small, so that random actions meet the same things ────────────

TURN_IDS = st.sampled_from(["turn-1", "turn-1", "turn-1", "turn-2"])
CALL_IDS = st.sampled_from(["call-1", "call-2"])
PART_IDS = st.sampled_from(["part-1", "part-2", "call-1"])
REQUEST_IDS = st.sampled_from(["req-1", "req-2"])
QUESTION_IDS = st.sampled_from(["q-text", "q-pick", "q-number", "q-many", "q-yes", "q-typo"])
MESSAGE_IDS = st.sampled_from(["queued-1", "queued-2", "steer-1"])
CHATS = st.sampled_from(["ahp-chat:/ticket-1", "ahp-chat:/ticket-2"])
CLIENT_IDS = st.sampled_from(["laptop", "phone"])
NEED_IDS = st.sampled_from(["req-1", "call-1", "call-2"])
CUSTOMIZATION_IDS = st.sampled_from(["plugin-1", "mcp-1", "prompt-1"])
DIRECTORIES = st.sampled_from(["file:///srv/a", "file:///srv/b"])
WORDS = st.sampled_from(["", "refund", "order #4821", "ok"])

OPTIONS = [InputOption(id=o, label=o.title()) for o in ("card", "credit", "cash")]
QUESTIONS: dict[str, list[InputQuestion]] = {
    "req-1": [
        TextQuestion(id="q-text", message="Note", required=True, max=20),
        SingleSelectQuestion(id="q-pick", message="Refund how?", options=OPTIONS, required=True),
        NumberQuestion(id="q-number", message="Amount", min=0, max=100),
    ],
    "req-2": [
        MultiSelectQuestion(id="q-many", message="Items", options=OPTIONS, max=2),
        BooleanQuestion(id="q-yes", message="Keep it?", required=True),
    ],
}
"""The questions of each request id.

The server-only actions that carry requests (``chat/inputRequested``,
``chat/responsePart``, ``chat/turnsLoaded``) have no validation rule, so the
strategies below build their requests consistent: a request with a given id
always asks the same questions (an upsert never drops one; that case is the
xfail test at the bottom) and its answers only answer those. The client
actions (``chat/inputAnswerChanged``, ``chat/inputCompleted``) name any
question, and validation must refuse the ones the request does not have."""


QUESTION_KINDS: dict[str, type[InputQuestion]] = {
    q.id: type(q) for questions in QUESTIONS.values() for q in questions
}
FITTING_VALUES: dict[type[InputQuestion], st.SearchStrategy[InputAnswerValue]] = {
    TextQuestion: st.builds(TextValue, value=st.sampled_from(["ok", "cracked jar", "x" * 25])),
    NumberQuestion: st.builds(NumberValue, value=st.sampled_from([0, 42, 3.5, 150])),
    BooleanQuestion: st.builds(BooleanValue, value=st.booleans()),
    SingleSelectQuestion: st.builds(SelectedValue, value=st.sampled_from(["card", "gift"])),
    MultiSelectQuestion: st.builds(
        SelectedManyValue, value=st.lists(st.sampled_from(["card", "cash", "gift"]), max_size=3)
    ),
}
"""Values of the kind each question takes, some within its bounds and
options and some not, so that validation both accepts and refuses."""


def answers_to(question_id: str) -> st.SearchStrategy[InputAnswer]:
    """Answers to ``question_id``: mostly of the kind it takes, sometimes of
    any kind, sometimes without a value."""
    kind = QUESTION_KINDS.get(question_id)
    fitting = [FITTING_VALUES[kind]] * 3 if kind is not None else []
    value = st.one_of([*fitting, *FITTING_VALUES.values(), st.none()])
    state = st.sampled_from(["draft", "submitted", "submitted", "skipped"])
    return st.builds(InputAnswer, state=state, value=value)


def answer_sets(question_ids: list[str]) -> st.SearchStrategy[dict[str, InputAnswer]]:
    """Answers to some of ``question_ids``."""
    chosen = st.lists(st.sampled_from(question_ids), max_size=3, unique=True)
    return chosen.flatmap(lambda ids: st.fixed_dictionaries({q: answers_to(q) for q in ids}))


def question_ids_of(request_id: str) -> list[str]:
    return [q.id for q in QUESTIONS[request_id]]


def input_requests() -> st.SearchStrategy[InputRequest]:
    """Requests from the pool, with the questions of their id and, sometimes,
    answers to some of those questions."""

    def request(request_id: str) -> st.SearchStrategy[InputRequest]:
        return st.builds(
            InputRequest,
            id=st.just(request_id),
            message=st.none() | WORDS,
            url=st.none() | st.just("https://verify.example/4821"),
            questions=st.just(QUESTIONS[request_id]),
            answers=st.none() | answer_sets(question_ids_of(request_id)),
        )

    return REQUEST_IDS.flatmap(request)


def answer_changes() -> st.SearchStrategy[ChatInputAnswerChanged]:
    def change(question_id: str) -> st.SearchStrategy[ChatInputAnswerChanged]:
        return st.builds(
            ChatInputAnswerChanged,
            request_id=REQUEST_IDS,
            question_id=st.just(question_id),
            answer=st.none() | answers_to(question_id),
        )

    return QUESTION_IDS.flatmap(change)


def completions() -> st.SearchStrategy[ChatInputCompleted]:
    def complete(request_id: str) -> st.SearchStrategy[ChatInputCompleted]:
        return st.builds(
            ChatInputCompleted,
            request_id=st.just(request_id),
            response=st.sampled_from(["accept", "accept", "decline", "cancel"]),
            # Now and then an answer to a question the request does not have.
            answers=st.none() | answer_sets([*question_ids_of(request_id), "q-typo"]),
        )

    return REQUEST_IDS.flatmap(complete)


def customizations() -> st.SearchStrategy[dict[str, Any]]:
    """Customization entries as AHP shapes them: containers with children,
    MCP servers with a state; ids from a small pool."""
    child = st.fixed_dictionaries(
        {"id": CUSTOMIZATION_IDS, "type": st.sampled_from(["prompt", "mcpServer"])},
        optional={"enabled": st.booleans(), "state": st.just({"kind": "ready"})},
    )
    return st.fixed_dictionaries(
        {
            "id": CUSTOMIZATION_IDS,
            "type": st.sampled_from(["plugin", "directory", "mcpServer"]),
            "enabled": st.booleans(),
        },
        optional={
            "children": st.lists(child, max_size=2),
            "state": st.just({"kind": "stopped"}),
            "channel": st.just("ahp-mcp:/x"),
        },
    )


DOMAIN = wire_strategies(
    text=WORDS,
    names={
        "turn_id": TURN_IDS,
        "tool_call_id": CALL_IDS,
        "part_id": PART_IDS,
        "request_id": REQUEST_IDS,
        "question_id": QUESTION_IDS,
        "queued_message_id": st.none() | MESSAGE_IDS,
        "order": st.lists(MESSAGE_IDS, max_size=3),
        "directory": DIRECTORIES,
        "client_id": CLIENT_IDS,
        "chat": CHATS,
        "customization": customizations(),
        "customizations": st.none() | st.lists(customizations(), max_size=3),
        "meta": st.none() | st.just({"trace": "t"}),
    },
    fields={
        (Turn, "id"): TURN_IDS,
        (ActiveTurn, "id"): TURN_IDS,
        (MarkdownPart, "id"): PART_IDS,
        (ReasoningPart, "id"): PART_IDS,
        (PendingMessage, "id"): MESSAGE_IDS,
        (ChatPendingMessageSet, "id"): MESSAGE_IDS,
        (ChatPendingMessageRemoved, "id"): MESSAGE_IDS,
        (ChatSummary, "resource"): CHATS,
        (ActiveClient, "client_id"): CLIENT_IDS,
        (ChatToolCallConfirmed, "selected_option_id"): st.none() | st.sampled_from(["ok", "no"]),
        (ChatToolCallConfirmed, "edited_tool_input"): st.none() | st.just('{"amount": 10}'),
        (SessionInputNeededRemoved, "id"): NEED_IDS,
        (SessionCustomizationsChanged, "customizations"): st.lists(customizations(), max_size=3),
        (SessionCustomizationToggled, "id"): CUSTOMIZATION_IDS,
        (SessionCustomizationRemoved, "id"): CUSTOMIZATION_IDS,
        (SessionMcpServerStateChanged, "id"): CUSTOMIZATION_IDS,
        (SessionMcpServerStartRequested, "id"): CUSTOMIZATION_IDS,
        (SessionMcpServerStopRequested, "id"): CUSTOMIZATION_IDS,
    },
)
DOMAIN.classes[InputRequest] = input_requests()
DOMAIN.classes[ChatInputAnswerChanged] = answer_changes()
DOMAIN.classes[ChatInputCompleted] = completions()
for _need in (SessionInputNeeded, *SessionInputNeeded.__subclasses__()):
    DOMAIN.fields[(_need, "id")] = NEED_IDS
for _call in ToolCall.__subclasses__():
    DOMAIN.fields[(_call, "tool_call_id")] = CALL_IDS


def actions_of(classes: tuple[type[Any], ...]) -> st.SearchStrategy[Any]:
    return st.one_of([DOMAIN.of(cls) for cls in classes])


CHAT_WEIGHTS: dict[type[Any], int] = {
    ChatTurnStarted: 3,
    ChatToolCallStart: 4,
    ChatToolCallReady: 6,
    ChatToolCallConfirmed: 6,
    ChatToolCallComplete: 6,
    ChatToolCallResultConfirmed: 4,
    ChatToolCallAuthRequired: 3,
    ChatToolCallAuthResolved: 3,
    ChatInputRequested: 4,
    ChatInputAnswerChanged: 6,
    ChatInputCompleted: 4,
}
"""How much more often than the rest each chat action is drawn: the tool-call
and input-request lifecycles need several steps in a row to get anywhere,
while any of the turn-ending actions (weight 1) closes the turn."""


def chat_actions(classes: tuple[type[Any], ...]) -> st.SearchStrategy[Any]:
    return st.one_of([DOMAIN.of(c) for c in classes for _ in range(CHAT_WEIGHTS.get(c, 1))])


CHAT_ACTION = chat_actions(CHAT_ACTIONS)
SESSION_ACTION = actions_of(SESSION_ACTIONS)
ROOT_ACTION = actions_of(ROOT_ACTIONS)

# ─── Seed states ─────────────────────────────────────────────────────────────

CUSTOMER = Message(text="My blender arrived cracked", origin=MessageOrigin(kind="user"))
EMPTY_CHAT = ChatState(
    resource="ahp-chat:/ticket-1",
    title="Refund",
    status=SessionStatus.IDLE,
    modified_at="t0",
    turns=[],
)


def reduced(state: ChatState, *actions: ChatAction) -> ChatState:
    for action in actions:
        state = reduce_chat(state, action, NOW)
    return state


BUSY_CHAT = reduced(
    EMPTY_CHAT,
    ChatTurnStarted(turn_id="turn-1", started_at="t1", message=CUSTOMER),
    ChatToolCallStart(
        turn_id="turn-1", tool_call_id="call-1", tool_name="refund", display_name="Refund"
    ),
    ChatInputRequested(request=InputRequest(id="req-1", questions=QUESTIONS["req-1"])),
)
WAITING_CHAT = reduced(
    BUSY_CHAT,
    ChatToolCallReady(
        turn_id="turn-1",
        tool_call_id="call-1",
        invocation_message="Refund $59.90?",
        tool_input='{"amount": 59.9}',
        editable=True,
        options=[ConfirmationOption(id="ok", label="Refund", kind="approve")],
    ),
    ChatToolCallStart(
        turn_id="turn-1",
        tool_call_id="call-2",
        tool_name="tag_ticket",
        display_name="Tag ticket",
        contributor=McpContributor(customization_id="mcp-1"),
    ),
    ChatToolCallReady(
        turn_id="turn-1", tool_call_id="call-2", invocation_message="Tag", confirmed="setting"
    ),
    ChatInputRequested(request=InputRequest(id="req-2", questions=QUESTIONS["req-2"])),
)
"""A turn with a call waiting for confirmation, a running MCP call and two
open requests: most lifecycle actions have something to act on."""

EMPTY_SESSION = SessionState(
    provider="huddle",
    title="Queue",
    status=SessionStatus.IDLE,
    lifecycle="ready",
    active_clients=[],
    chats=[],
)
BUSY_SESSION = reduce_session(
    reduce_session(
        EMPTY_SESSION,
        SessionChatAdded(
            summary=ChatSummary(
                resource="ahp-chat:/ticket-1", title="Refund", status=8, modified_at="t"
            )
        ),
    ),
    SessionInputNeededSet(
        request=ChatInputNeeded(
            id="req-1", chat="ahp-chat:/ticket-1", request=InputRequest(id="req-1")
        )
    ),
)
EMPTY_ROOT = RootState(agents=[])

REACHABLE_CHAT_SEEDS = st.sampled_from([EMPTY_CHAT, BUSY_CHAT, WAITING_CHAT])
CHAT_SEQUENCES = st.lists(CHAT_ACTION, min_size=10, max_size=40)


@dataclass(frozen=True)
class Family:
    """One channel's reducer, with states and actions to feed it."""

    name: str
    reduce: Callable[[Any, Any], Any]
    states: st.SearchStrategy[Any]
    actions: st.SearchStrategy[Any]


def reduce_chat_now(state: ChatState, action: ChatAction) -> ChatState:
    return reduce_chat(state, action, NOW)


FAMILIES = [
    Family(
        "chat",
        reduce_chat_now,
        REACHABLE_CHAT_SEEDS | DOMAIN.of(ChatState),
        CHAT_ACTION,
    ),
    Family(
        "session",
        reduce_session,
        st.sampled_from([EMPTY_SESSION, BUSY_SESSION]) | DOMAIN.of(SessionState),
        SESSION_ACTION,
    ),
    Family(
        "root",
        reduce_root,
        st.just(EMPTY_ROOT) | DOMAIN.of(RootState),
        ROOT_ACTION,
    ),
]
BY_FAMILY = [pytest.param(f, id=f.name) for f in FAMILIES]


def steps(family: Family, data: st.DataObject) -> Iterator[tuple[Any, Any]]:
    """A drawn state, then each drawn action with the state it applies to;
    the caller reduces and the next state follows from the reducer."""
    state = data.draw(family.states, label="state")
    for action in data.draw(st.lists(family.actions, min_size=1, max_size=20), label="actions"):
        yield state, action
        state = family.reduce(state, action)


# ─── Total, pure, deterministic ──────────────────────────────────────────────


@pytest.mark.parametrize("family", BY_FAMILY)
@PROPERTIES
@given(data=st.data())
def test_reducer_returns_a_state_of_the_same_type_for_any_action(
    family: Family, data: st.DataObject
) -> None:
    for state, action in steps(family, data):
        assert type(family.reduce(state, action)) is type(state)


@pytest.mark.parametrize("family", BY_FAMILY)
@PROPERTIES
@given(data=st.data())
def test_reducer_never_mutates_its_state_or_action(family: Family, data: st.DataObject) -> None:
    for state, action in steps(family, data):
        state_before, action_before = encode(state), encode(action)
        family.reduce(state, action)
        assert encode(state) == state_before
        assert encode(action) == action_before


@pytest.mark.parametrize("family", BY_FAMILY)
@PROPERTIES
@given(data=st.data())
def test_reducer_gives_equal_results_for_equal_inputs(family: Family, data: st.DataObject) -> None:
    for state, action in steps(family, data):
        copy = convert_state(to_builtins(state), family.name)
        assert family.reduce(state, action) == family.reduce(copy, action)


@pytest.mark.parametrize("family", BY_FAMILY)
@PROPERTIES
@given(data=st.data())
def test_reduce_dispatches_to_the_reducer_of_the_channel(
    family: Family, data: st.DataObject
) -> None:
    for state, action in steps(family, data):
        assert reduce(state, action, NOW) == family.reduce(state, action)


@pytest.mark.parametrize("family", BY_FAMILY)
@PROPERTIES
@given(data=st.data())
def test_reduce_ignores_an_action_of_another_channel(family: Family, data: st.DataObject) -> None:
    state: ChannelState = data.draw(family.states)
    others = st.one_of([f.actions for f in FAMILIES if f is not family])
    action: StateAction = data.draw(others)
    assert reduce(state, action, NOW) is state


# ─── Orthogonal status flags ─────────────────────────────────────────────────

FLAGS = SessionStatus.IS_READ | SessionStatus.IS_ARCHIVED
FLAG_OWNERS: dict[str, tuple[type[Any], ...]] = {
    "chat": (ChatTurnStarted, ChatInputRequested),
    "session": (SessionIsReadChanged, SessionIsArchivedChanged),
}
"""The actions that may change IsRead or IsArchived: AHP clears a chat's
IsRead when a turn starts or input is requested; a session's flags change
only by their own actions (the inputNeeded queue keeps them)."""


@pytest.mark.parametrize("family", [p for p in BY_FAMILY if p.id in FLAG_OWNERS])
@PROPERTIES
@given(data=st.data())
def test_only_their_own_actions_change_the_read_and_archived_flags(
    family: Family, data: st.DataObject
) -> None:
    for state, action in steps(family, data):
        after = family.reduce(state, action)
        if not isinstance(action, FLAG_OWNERS[family.name]):
            assert after.status & FLAGS == state.status & FLAGS


# ─── Chat invariants under the host's validation ─────────────────────────────

RECOMPUTES_STATUS = (
    ChatTurnStarted,
    ChatTurnComplete,
    ChatTurnCancelled,
    ChatError,
    ChatTruncated,
    ChatInputRequested,
    ChatInputCompleted,
    ChatToolCallReady,
    ChatToolCallConfirmed,
    ChatToolCallComplete,
    ChatToolCallResultConfirmed,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
)
"""The chat actions after which AHP derives the status again.

AHP does not recompute status on every action: ``chat/inputAnswerChanged``,
``chat/toolCallDelta``, ``chat/toolCallContentChanged``,
``chat/responsePart`` and the rest leave it alone (none of them but
``chat/responsePart`` can open or close a blocker). And where AHP refreshes
the status after a tool-call action that matched no call, our reducer
returns the state unchanged, so the rule below applies only to actions that
changed the state."""


def validated_steps(
    seed: ChatState, actions: list[ChatAction]
) -> Iterator[tuple[ChatState, ChatAction, ChatState]]:
    """Each action the host accepts, with the state before and after it;
    rejected actions are skipped, as the host skips them. The chat's session
    works in every directory the actions name, so that the reducers get to
    see them."""
    named = [a.directory for a in actions if isinstance(a, ChatWorkingDirectorySet)]
    session = replace(EMPTY_SESSION, working_directories=named)
    state = seed
    for action in actions:
        if reject_reason(state, action, session=session) is not None:
            continue
        after = reduce_chat(state, action, NOW)
        yield state, action, after
        state = after


def input_requests_in(state: ChatState) -> Iterator[InputRequest]:
    turns: list[Turn | ActiveTurn] = [*state.turns]
    if state.active_turn is not None:
        turns.append(state.active_turn)
    for turn in turns:
        for part in turn.response_parts:
            if isinstance(part, InputRequestPart):
                yield part.request


def activity(state: ChatState) -> int:
    return state.status & ACTIVITY_MASK


@PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_validated_answers_only_answer_questions_of_their_request(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for _, _, after in validated_steps(seed, actions):
        for request in input_requests_in(after):
            questions = {q.id for q in request.questions or []}
            assert set(request.answers or {}) <= questions, request.id


@PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_status_is_derived_again_after_actions_that_change_live_work(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for before, action, after in validated_steps(seed, actions):
        if isinstance(action, RECOMPUTES_STATUS) and after is not before:
            wanted = (
                SessionStatus.ERROR if isinstance(action, ChatError) else select_activity(after)
            )
            assert activity(after) == wanted, type(action).__name__


@PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_other_actions_leave_the_status_activity_alone(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for before, action, after in validated_steps(seed, actions):
        if not isinstance(action, RECOMPUTES_STATUS) or after is before:
            assert activity(after) == activity(before), type(action).__name__


WITHOUT_RESPONSE_PART = chat_actions(tuple(c for c in CHAT_ACTIONS if c is not ChatResponsePart))


@PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=st.lists(WITHOUT_RESPONSE_PART, min_size=10, max_size=40))
def test_status_activity_agrees_with_the_live_work(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    """Without ``chat/responsePart`` (which may append an open request or a
    waiting tool call and is not followed by a recompute), the activity is
    always what the live work implies; Error stays until the next turn."""
    for _, _, after in validated_steps(seed, actions):
        ended_in_error = after.active_turn is None and activity(after) == SessionStatus.ERROR
        assert ended_in_error or activity(after) == select_activity(after)


def test_select_activity_of_a_chat_without_a_turn_is_idle() -> None:
    assert select_activity(EMPTY_CHAT) == SessionStatus.IDLE


def test_select_tool_call_finds_nothing_without_an_active_turn() -> None:
    assert select_tool_call(EMPTY_CHAT, "call-1") is None


def test_select_tool_call_finds_the_call_of_the_active_turn() -> None:
    call = select_tool_call(WAITING_CHAT, "call-2")
    assert call is not None
    assert call.tool_name == "tag_ticket"


# ─── Upserts that drop questions ───────────────────────────────────────────────────────────────


def test_upsert_that_drops_a_question_leaves_no_answer_to_it() -> None:
    note = InputAnswer(state="draft", value=TextValue(value="cracked jar"))
    actions: list[ChatAction] = [
        ChatInputAnswerChanged(request_id="req-1", question_id="q-text", answer=note),
        ChatInputRequested(request=InputRequest(id="req-1", questions=QUESTIONS["req-1"][1:])),
    ]
    for _, _, after in validated_steps(BUSY_CHAT, actions):
        for request in input_requests_in(after):
            assert set(request.answers or {}) <= {q.id for q in request.questions or []}


# ─── The session's mirror of a chat (reducers.aggregate) ─────────────────────

MIRROR_PROPERTIES = settings(PROPERTIES, max_examples=100)
"""Each step also derives and reduces session actions: fewer examples."""


def mirrored_steps(
    seed: ChatState, actions: list[ChatAction]
) -> Iterator[tuple[ChatState, SessionState]]:
    """Each accepted chat state with the session that mirrors it: the host
    reduces the session actions :func:`derive_session_actions` derives from
    every chat change."""
    session = reduce_session(EMPTY_SESSION, SessionChatAdded(summary=chat_summary(EMPTY_CHAT)))
    steps = [(EMPTY_CHAT, seed)]
    steps += [(before, after) for before, _, after in validated_steps(seed, actions)]
    for before, after in steps:
        for session_action in derive_session_actions(before, after):
            session = reduce_session(session, session_action)
        yield after, session


@MIRROR_PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_session_input_queue_lists_exactly_the_open_blockers_of_its_chat(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for chat, session in mirrored_steps(seed, actions):
        queued = {entry.id: entry for entry in session.input_needed or []}
        assert queued == select_input_needed(chat)


@MIRROR_PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_session_catalog_entry_mirrors_the_chat_summary(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for chat, session in mirrored_steps(seed, actions):
        assert session.chats == [chat_summary(chat)]
        # Never the chat's working directories: 1,000 chats' of them would
        # make the session's snapshot too large to receive.
        assert session.chats[0].working_directories is None


@MIRROR_PROPERTIES
@given(seed=REACHABLE_CHAT_SEEDS, actions=CHAT_SEQUENCES)
def test_sessions_list_shows_input_needed_while_anything_waits(
    seed: ChatState, actions: list[ChatAction]
) -> None:
    for _, session in mirrored_steps(seed, actions):
        summary = session_summary("ahp-session:/acme", session, "t0")
        needs_input = summary.status & ACTIVITY_MASK == SessionStatus.INPUT_NEEDED
        assert needs_input == bool(session.input_needed)
