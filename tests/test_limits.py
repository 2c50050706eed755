"""The limits on what an action may put into state: a table of actions that
fit, one that are too large or too many."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from protocol.actions import (
    ChatDelta,
    ChatDraftChanged,
    ChatInputAnswerChanged,
    ChatInputCompleted,
    ChatInputRequested,
    ChatPendingMessageSet,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatTurnStarted,
    ChatWorkingDirectorySet,
    RootConfigChanged,
    SessionActiveClientSet,
    SessionChatAdded,
    SessionTitleChanged,
    SessionWorkingDirectorySet,
    StateAction,
)
from protocol.chat import (
    AnnotationsAttachment,
    ChatState,
    ChatSummary,
    InputAnswer,
    InputOption,
    InputRequest,
    Message,
    MessageOrigin,
    PendingMessage,
    SingleSelectQuestion,
    TextContent,
    TextValue,
    ToolCallResult,
)
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.session import ActiveClient, RootState, SessionState
from protocol.status import SessionStatus
from reducers.limits import SizeLimits, limit_problem

LIMITS = SizeLimits(
    title=10,
    message=100,
    answer=60,
    tool_data=80,
    action=300,
    queued_messages=2,
    active_clients=2,
    working_directories=2,
    id=12,
    turn_id=6,
    uri=20,
    chats=2,
)
CHAT = ChatState(
    resource="ahp-chat:/c", title="c", status=SessionStatus.IDLE, modified_at="t", turns=[]
)
SESSION = SessionState(
    provider="huddle",
    title="s",
    status=SessionStatus.IDLE,
    lifecycle="ready",
    active_clients=[],
    chats=[],
)
ROOT = RootState(agents=[], active_sessions=0)


def message(text: str) -> Message:
    return Message(text=text, origin=MessageOrigin(kind="user"))


def answer(text: str) -> InputAnswer:
    return InputAnswer(state="draft", value=TextValue(value=text))


def client(client_id: str, name: str = "") -> ActiveClient:
    return ActiveClient(client_id=client_id, display_name=name or None, tools=[])


def queued(*ids: str) -> ChatState:
    pending = [PendingMessage(id=i, message=message("hi")) for i in ids]
    return ChatState(
        resource="ahp-chat:/c",
        title="c",
        status=SessionStatus.IDLE,
        modified_at="t",
        turns=[],
        queued_messages=pending,
        working_directories=["file:///a", "file:///b"],
    )


FULL_SESSION = SessionState(
    provider="huddle",
    title="s",
    status=SessionStatus.IDLE,
    lifecycle="ready",
    active_clients=[client("a"), client("b")],
    chats=[],
    working_directories=["file:///a", "file:///b"],
)


def summary(chat: str) -> ChatSummary:
    return ChatSummary(resource=chat, title="c", status=SessionStatus.IDLE, modified_at="t")


TWO_CHATS = SessionState(
    provider="huddle",
    title="s",
    status=SessionStatus.IDLE,
    lifecycle="ready",
    active_clients=[],
    chats=[summary("ahp-chat:/a"), summary("ahp-chat:/b")],
)
RESULT = ToolCallResult(success=True, past_tense_message="Done")


def result(text: str) -> ToolCallResult:
    return ToolCallResult(success=True, past_tense_message="Done", content=[TextContent(text=text)])


FITS = [
    pytest.param(SESSION, SessionTitleChanged(title="short"), id="title"),
    pytest.param(
        CHAT, ChatTurnStarted(turn_id="t", started_at="t", message=message("hi")), id="message"
    ),
    pytest.param(CHAT, ChatDraftChanged(), id="cleared-draft"),
    pytest.param(
        CHAT, ChatInputAnswerChanged(request_id="r", question_id="q"), id="cleared-answer"
    ),
    pytest.param(
        CHAT,
        ChatToolCallReady(turn_id="t", tool_call_id="c", invocation_message="x"),
        id="ready-without-input",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t", tool_call_id="c", approved=True, confirmed="user-action"
        ),
        id="confirmed-without-edit",
    ),
    pytest.param(
        queued("a", "b"),
        ChatPendingMessageSet(kind="queued", id="a", message=message("x")),
        id="replaces-a-queued-message",
    ),
    pytest.param(
        queued("a", "b"),
        ChatPendingMessageSet(kind="steering", id="s", message=message("x")),
        id="steering-is-one",
    ),
    pytest.param(
        FULL_SESSION,
        SessionActiveClientSet(active_client=client("a", "Ann")),
        id="updates-its-entry",
    ),
    pytest.param(
        FULL_SESSION, SessionWorkingDirectorySet(directory="file:///a"), id="known-directory"
    ),
    pytest.param(ROOT, RootConfigChanged(config={"a": 1}), id="root-config"),
    pytest.param(
        CHAT,
        ChatInputCompleted(request_id="r" * 12, response="accept", answers={"q" * 12: answer("y")}),
        id="ids-at-the-limit",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(turn_id="t" * 6, started_at="t" * 12, message=message("hi")),
        id="turn-id-at-its-limit",
    ),
    pytest.param(
        CHAT, ChatWorkingDirectorySet(directory="file:///" + "d" * 12), id="directory-at-the-limit"
    ),
    pytest.param(
        CHAT,
        ChatToolCallComplete(turn_id="t", tool_call_id="c", result=RESULT, meta={"id": "x" * 20}),
        id="json-is-not-searched-for-ids",
    ),
    pytest.param(
        ROOT, RootConfigChanged(config={"requestId": "x" * 20}), id="config-is-not-searched"
    ),
    pytest.param(SESSION, SessionTitleChanged(title="x" * 10), id="title-at-the-limit"),
    pytest.param(
        TWO_CHATS, SessionChatAdded(summary=summary("ahp-chat:/a")), id="updates-a-catalog-entry"
    ),
]

TOO_LARGE = [
    pytest.param(
        SESSION,
        SessionTitleChanged(title="x" * 11),
        "the title is 11 bytes; the limit is 10",
        id="title",
    ),
    pytest.param(
        SESSION,
        SessionTitleChanged(title="é" * 6),
        "the title is 12 bytes; the limit is 10",
        id="title-in-utf8-bytes",
    ),
    pytest.param(
        SESSION,
        SessionTitleChanged(title='"' * 6),
        "the title is 12 bytes; the limit is 10",
        id="title-in-json-escapes",
    ),
    pytest.param(
        SESSION,
        SessionTitleChanged(title="\x01\x02"),
        "the title is 12 bytes; the limit is 10",
        id="title-of-control-characters",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(turn_id="t", started_at="t", message=message("x" * 100)),
        "the message is 136 bytes; the limit is 100",
        id="turn-message",
    ),
    pytest.param(
        CHAT,
        ChatPendingMessageSet(kind="queued", id="m", message=message("x" * 100)),
        "the message is 136 bytes; the limit is 100",
        id="pending-message",
    ),
    pytest.param(
        CHAT,
        ChatDraftChanged(draft=message("x" * 100)),
        "the draft is 136 bytes; the limit is 100",
        id="draft",
    ),
    pytest.param(
        CHAT,
        ChatDelta(turn_id="t", part_id="p", content="x" * 101),
        "the delta is 101 bytes; the limit is 100",
        id="delta",
    ),
    pytest.param(
        CHAT,
        ChatInputAnswerChanged(request_id="r", question_id="q", answer=answer("x" * 50)),
        "the answer to 'q' is 102 bytes; the limit is 60",
        id="answer",
    ),
    pytest.param(
        CHAT,
        ChatInputCompleted(
            request_id="r", response="accept", answers={"ok": answer("y"), "q": answer("x" * 50)}
        ),
        "the answer to 'q' is 102 bytes; the limit is 60",
        id="completion-answers",
    ),
    pytest.param(
        CHAT,
        ChatToolCallReady(
            turn_id="t", tool_call_id="c", invocation_message="x", tool_input="x" * 81
        ),
        "the tool input is 81 bytes; the limit is 80",
        id="tool-input",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t",
            tool_call_id="c",
            approved=True,
            confirmed="user-action",
            edited_tool_input="x" * 81,
        ),
        "the edited tool input is 81 bytes; the limit is 80",
        id="edited-input",
    ),
    pytest.param(
        CHAT,
        ChatToolCallComplete(turn_id="t", tool_call_id="c", result=result("x" * 80)),
        "the tool result is 160 bytes; the limit is 80",
        id="tool-result",
    ),
    pytest.param(
        CHAT,
        ChatToolCallContentChanged(
            turn_id="t", tool_call_id="c", content=[TextContent(text="x" * 80)]
        ),
        "the tool call's content is 107 bytes; the limit is 80",
        id="tool-content",
    ),
    pytest.param(
        CHAT,
        ChatToolCallDelta(turn_id="t", tool_call_id="c", content="x" * 81),
        "the tool input delta is 81 bytes; the limit is 80",
        id="tool-delta",
    ),
    pytest.param(
        SESSION,
        SessionActiveClientSet(active_client=client("a", "x" * 80)),
        "the active client's entry is 124 bytes; the limit is 80",
        id="active-client",
    ),
    pytest.param(
        ROOT,
        RootConfigChanged(config={"a": "x" * 300}),
        "the root/configChanged action is 347 bytes; the limit is 300",
        id="any-action",
    ),
    pytest.param(
        CHAT,
        ChatInputCompleted(request_id="r" * 13, response="cancel"),
        "the requestId is 13 bytes; the limit is 12",
        id="request-id",
    ),
    pytest.param(
        CHAT,
        ChatInputCompleted(request_id="é" * 7, response="cancel"),
        "the requestId is 14 bytes; the limit is 12",
        id="id-in-utf8-bytes",
    ),
    pytest.param(
        CHAT,
        ChatInputAnswerChanged(request_id="r", question_id="q" * 13),
        "the questionId is 13 bytes; the limit is 12",
        id="question-id",
    ),
    pytest.param(
        CHAT,
        ChatInputCompleted(request_id="r", response="accept", answers={"q" * 13: answer("y")}),
        "a key of answers is 13 bytes; the limit is 12",
        id="question-id-as-a-key",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(turn_id="t" * 7, started_at="t", message=message("hi")),
        "the turnId is 7 bytes; the limit is 6",
        id="turn-id",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(turn_id="t", started_at="2026-11-30T10:00:00Z", message=message("hi")),
        "the startedAt is 20 bytes; the limit is 12",
        id="timestamp",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(
            turn_id="t", started_at="t", message=message("hi"), queued_message_id="m" * 13
        ),
        "the queuedMessageId is 13 bytes; the limit is 12",
        id="queued-message-id",
    ),
    pytest.param(
        CHAT,
        ChatPendingMessageSet(kind="queued", id="m" * 13, message=message("x")),
        "the id is 13 bytes; the limit is 12",
        id="pending-message-id",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t", tool_call_id="c" * 13, approved=True, confirmed="user-action"
        ),
        "the toolCallId is 13 bytes; the limit is 12",
        id="tool-call-id",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t",
            tool_call_id="c",
            approved=True,
            confirmed="user-action",
            selected_option_id="o" * 13,
        ),
        "the selectedOptionId is 13 bytes; the limit is 12",
        id="selected-option-id",
    ),
    pytest.param(
        SESSION,
        SessionActiveClientSet(active_client=client("a" * 13)),
        "the activeClient.clientId is 13 bytes; the limit is 12",
        id="client-id",
    ),
    pytest.param(
        CHAT,
        ChatInputRequested(
            request=InputRequest(
                id="r",
                questions=[
                    SingleSelectQuestion(
                        id="q",
                        message="?",
                        options=[
                            InputOption(id="a", label="A"),
                            InputOption(id="o" * 13, label="O"),
                        ],
                    )
                ],
            )
        ),
        "the request.questions[0].options[1].id is 13 bytes; the limit is 12",
        id="id-deep-in-a-list",
    ),
    pytest.param(
        CHAT,
        ChatInputRequested(
            request=InputRequest(id="r", answers={"q": answer("y"), "q" * 13: answer("y")})
        ),
        "a key of request.answers is 13 bytes; the limit is 12",
        id="key-deep-in-a-map",
    ),
    pytest.param(
        CHAT,
        ChatTurnStarted(
            turn_id="t",
            started_at="t",
            message=Message(
                text="hi",
                origin=MessageOrigin(kind="user"),
                attachments=[
                    AnnotationsAttachment(
                        label="a", resource="ahp-x:/a", annotation_ids=["a", "b" * 13]
                    )
                ],
            ),
        ),
        "the message.attachments[0].annotationIds[1] is 13 bytes; the limit is 12",
        id="entry-of-an-id-list",
    ),
    pytest.param(
        CHAT,
        ChatWorkingDirectorySet(directory="file:///" + "d" * 13),
        "the working directory is 21 bytes; the limit is 20",
        id="chat-directory",
    ),
    pytest.param(
        SESSION,
        SessionWorkingDirectorySet(directory="file:///" + "d" * 13),
        "the working directory is 21 bytes; the limit is 20",
        id="session-directory",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t",
            tool_call_id="c",
            approved=False,
            reason="denied",
            reason_message="x" * 101,
        ),
        "the reason is 101 bytes; the limit is 100",
        id="denial-reason",
    ),
    pytest.param(
        CHAT,
        ChatToolCallConfirmed(
            turn_id="t",
            tool_call_id="c",
            approved=False,
            reason="denied",
            user_suggestion=message("x" * 100),
        ),
        "the suggestion is 136 bytes; the limit is 100",
        id="denial-suggestion",
    ),
    pytest.param(
        CHAT,
        ChatToolCallComplete(turn_id="t", tool_call_id="c", result=RESULT, meta={"a": "x" * 80}),
        "the tool call's _meta is 88 bytes; the limit is 80",
        id="tool-call-meta",
    ),
]

TOO_MANY = [
    pytest.param(
        queued("a", "b"),
        ChatPendingMessageSet(kind="queued", id="c", message=message("x")),
        "the chat has 2 queued messages; the limit is 2",
        id="queued-messages",
    ),
    pytest.param(
        FULL_SESSION,
        SessionActiveClientSet(active_client=client("c")),
        "the session has 2 active clients; the limit is 2",
        id="active-clients",
    ),
    pytest.param(
        FULL_SESSION,
        SessionWorkingDirectorySet(directory="file:///c"),
        "there are 2 working directories; the limit is 2",
        id="session-directories",
    ),
    pytest.param(
        queued(),
        ChatWorkingDirectorySet(directory="file:///c"),
        "there are 2 working directories; the limit is 2",
        id="chat-directories",
    ),
    pytest.param(
        TWO_CHATS,
        SessionChatAdded(summary=summary("ahp-chat:/c")),
        "the session has 2 chats; the limit is 2",
        id="session-chats",
    ),
]


@pytest.mark.parametrize(("state", "action"), FITS)
def test_an_action_within_the_limits_fits(state: ChannelState, action: StateAction) -> None:
    assert limit_problem(state, action, LIMITS) is None


@pytest.mark.parametrize(("state", "action", "sentence"), TOO_LARGE)
def test_too_large(state: ChannelState, action: StateAction, sentence: str) -> None:
    assert limit_problem(state, action, LIMITS) == Rejection(RejectionCode.TOO_LARGE, sentence)


@pytest.mark.parametrize(("state", "action", "sentence"), TOO_MANY)
def test_too_many(state: ChannelState, action: StateAction, sentence: str) -> None:
    assert limit_problem(state, action, LIMITS) == Rejection(RejectionCode.TOO_MANY, sentence)


def test_ids_are_checked_before_what_a_sentence_names_them_by() -> None:
    # The answer's sentence names its question: that id must be short first.
    action = ChatInputAnswerChanged(request_id="r", question_id="q" * 13, answer=answer("x" * 50))

    rejection = limit_problem(CHAT, action, LIMITS)

    assert rejection == Rejection(
        RejectionCode.TOO_LARGE, "the questionId is 13 bytes; the limit is 12"
    )


def test_no_sentence_quotes_what_was_sent() -> None:
    secret = "hunter2" * 20
    rejection = limit_problem(CHAT, ChatDraftChanged(draft=message(secret)), LIMITS)
    assert rejection is not None
    assert "hunter2" not in rejection.sentence


FULL = SizeLimits(chat_bytes=1000)
NEW_CONTENT: list[StateAction] = [
    ChatTurnStarted(turn_id="t", started_at="t", message=message("hi")),
    ChatPendingMessageSet(kind="steering", id="p", message=message("hi")),
]


@pytest.mark.parametrize("action", NEW_CONTENT)
def test_a_full_chat_takes_no_new_turn_or_message(action: StateAction) -> None:
    assert limit_problem(CHAT, action, FULL, state_bytes=999) is None
    assert limit_problem(CHAT, action, FULL, state_bytes=1000) == Rejection(
        RejectionCode.CHAT_FULL,
        "the chat holds about 1,000 bytes; the limit is 1,000: start a new chat",
    )


def test_what_is_under_way_in_a_full_chat_still_goes_on() -> None:
    answering = ChatInputAnswerChanged(request_id="r", question_id="q", answer=answer("x"))
    assert limit_problem(CHAT, answering, FULL, state_bytes=10**9) is None


def test_only_a_chat_is_ever_full() -> None:
    # A chat action sent to a session is refused as such elsewhere
    # (server.core.policy); the fullness rule is the chat's alone.
    started = NEW_CONTENT[0]
    assert limit_problem(SESSION, started, FULL, state_bytes=10**9) is None


TOGETHER = SizeLimits(queued_bytes=300, active_client_bytes=300)


def test_queued_messages_together_take_at_most_their_bytes() -> None:
    chat = replace(CHAT, queued_messages=[PendingMessage(id="a", message=message("x" * 100))])
    fits = ChatPendingMessageSet(kind="queued", id="b", message=message("y" * 100))
    too_much = ChatPendingMessageSet(kind="queued", id="b", message=message("y" * 200))
    assert limit_problem(chat, fits, TOGETHER) is None
    assert limit_problem(chat, too_much, TOGETHER) == Rejection(
        RejectionCode.TOO_LARGE,
        "the chat's queued messages together is 395 bytes; the limit is 300",
    )
    # Replacing one counts it once.
    again = ChatPendingMessageSet(kind="queued", id="a", message=message("y" * 200))
    assert limit_problem(chat, again, TOGETHER) is None


def test_active_clients_together_take_at_most_their_bytes() -> None:
    session = replace(SESSION, active_clients=[client("a", "x" * 100)])
    assert (
        limit_problem(session, SessionActiveClientSet(active_client=client("b", "y")), TOGETHER)
        is None
    )
    assert limit_problem(
        session, SessionActiveClientSet(active_client=client("b", "y" * 200)), TOGETHER
    ) == Rejection(
        RejectionCode.TOO_LARGE,
        "the session's active clients together is 390 bytes; the limit is 300",
    )
    # An entry set again replaces its old self.
    mine = SessionActiveClientSet(active_client=client("a", "y" * 200))
    assert limit_problem(session, mine, TOGETHER) is None
