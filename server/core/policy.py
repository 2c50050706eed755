"""Who may do what: the one authorisation policy every edge asks.

Pure functions of the token's grant, the channel, the session it belongs
to, the action and the channel's state: no I/O. The WebSocket and the HTTP
edge both ask them and answer a refusal each in its own transport's shape
(a rejection echo or a JSON-RPC error; an HTTP status), so each rule exists
once.

Threat model: ``agent`` tokens are trusted and may do everything;
``participant`` and ``observer`` tokens are not. A participant may dispatch
AHP's client-dispatchable actions (and only for its own client where the
action speaks for one), create chats, and create sessions when its token is
not scoped to particular sessions; an observer may only read. A token
scoped to sessions reaches only those sessions' channels: to it, a channel
outside them looks exactly like one that does not exist (:func:`reaches`),
and it may read the root channel (hearing only about its sessions) but not
change it.

Commands::

    command          allowed for
    ---------------  ------------------------------------------------
    read             any token that reaches the channel's session
    create-session   agent; participant with an unscoped token, while
                     the server holds fewer than nine tenths of its
                     sessions at most (the agent's while fewer than all
                     of them: :func:`cap_refusal`)
    dispose-session  agent
    create-chat      agent, participant (reaching the session), while
                     the session holds fewer than nine tenths of its chats
                     at most (the agent's while fewer than all of them)
    dispose-chat     agent; a participant, a chat it created (not the
                     session's default chat, no turn running:
                     :func:`chat_disposal_refusal`)
    mint-token       agent

Creating a session or a chat spends one action of the token's rate budget
(server.ratelimit), as a dispatch does; a chat's initial message is
dispatched as the ``chat/turnStarted`` it becomes, under the rules below.

Actions, checked top to bottom (the first refusal wins; a channel the token
does not reach never gets this far)::

    code           refused when
    -------------  ---------------------------------------------------
    wrong-channel  the action's family (root/session/chat) is not the
                   channel's kind
    forbidden      an observer dispatches; a token scoped to sessions
                   changes the root channel; a participant dispatches an
                   action only the server dispatches; a participant
                   sends a message (a turn's, a pending one, a draft, a
                   tool call's user suggestion) whose origin is not
                   ``user`` (``agent``, ``tool`` and
                   ``systemNotification`` are the agent's word); a
                   participant speaks for another client: completes or
                   updates a tool call its token does not execute (the
                   token that held the contributor's client id when the
                   call started, whoever holds the id now), sets or
                   removes another client's entry in the session's
                   active clients; a participant truncates away a turn
                   the agent started (its message's origin is not
                   ``user``)
    turn-in-progress  a participant truncates (``chat/truncated``) while
                   a turn is active
    no-change      a participant truncates and nothing would go (no
                   turn after ``turnId``, or ``turnId`` unknown)

Truncation: AHP lets either side truncate a chat (``chat/truncated``): a
user rewinds to edit a message and start over, and an active turn is
silently dropped. In a chat several people share, dropping the active turn
would erase the agent's work in progress for everyone, with whatever it
waits for (a form, an approval) and the runner's turn behind it; so a
participant ends it first (``chat/turnCancelled``, which stops the runner's
turn too), then truncates finished turns. The agent may truncate anything
(server.runner.bridge then ends a runner's turn it dropped). A truncation
that removes nothing is refused rather than recorded.
"""

from __future__ import annotations

import re
import secrets
from enum import StrEnum
from typing import Any, Final

from msgspec.structs import replace

from protocol.actions import (
    ChatDraftChanged,
    ChatPendingMessageSet,
    ChatToolCallAuthRequired,
    ChatToolCallAuthResolved,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallDelta,
    ChatToolCallReady,
    ChatToolCallResultConfirmed,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnStarted,
    SessionActiveClientRemoved,
    SessionActiveClientSet,
    StateAction,
    action_type,
    is_client_dispatchable,
)
from protocol.chat import ActiveTurn, ChatState, ClientContributor, Message, ToolCallState, Turn
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.uris import channel_kind
from reducers.chat import select_tool_call, select_truncated
from reducers.notes import HUDDLE, huddle_meta
from server.auth import Grant

_STAMP = re.compile(r"[0-9a-f]{8}")
EXECUTOR: Final = "executor"
"""``_meta.huddle.executor`` of a client's tool call: the token executing it
(:func:`executor`)."""


class Command(StrEnum):
    READ = "read"
    CREATE_SESSION = "create-session"
    DISPOSE_SESSION = "dispose-session"
    CREATE_CHAT = "create-chat"
    DISPOSE_CHAT = "dispose-chat"
    MINT_TOKEN = "mint-token"
    READ_AUDIT = "read-audit"
    SET_EXPIRY = "set-expiry"
    MANAGE_WEBHOOKS = "manage-webhooks"


def reaches(grant: Grant, session: str | None) -> bool:
    """Whether the token reaches a channel of ``session`` (None: the root
    channel, which every token may read). A channel it does not reach must
    look to it as one that does not exist."""
    return grant.sessions is None or session is None or session in grant.sessions


def command_refusal(grant: Grant, command: Command) -> str | None:
    """Why ``grant`` may not run ``command``, or None (reaching the channel
    is :func:`reaches`)."""
    match command:
        case Command.READ:
            return None
        case Command.CREATE_SESSION:
            if grant.role == "agent" or (grant.role == "participant" and grant.sessions is None):
                return None
            return "creating sessions needs an agent or unscoped participant token"
        case Command.DISPOSE_SESSION:
            return None if grant.role == "agent" else "only an agent token may dispose sessions"
        case Command.CREATE_CHAT:
            return None if grant.may_dispatch else "observers may not create chats"
        case Command.DISPOSE_CHAT:
            return None if grant.may_dispatch else "observers may not dispose chats"
        case Command.MINT_TOKEN:
            return None if grant.role == "agent" else "only an agent token may mint tokens"
        case Command.READ_AUDIT:
            return None if grant.may_dispatch else "observers may not read the audit"
        case Command.SET_EXPIRY:
            return None if grant.role == "agent" else "only an agent token may set an expiry"
        case Command.MANAGE_WEBHOOKS:
            # A webhook hears of every session it names: agents are trusted,
            # people are not (and an invite by email mints tokens).
            return None if grant.role == "agent" else "only an agent token may manage webhooks"


def chat_disposal_refusal(grant: Grant, state: ChatState) -> Rejection | None:
    """Why ``grant`` may not dispose the chat in ``state`` (the session's
    default chat is nobody's to dispose: server.core.sessions), or None.
    The agent may dispose any; a person only one they created (its
    ``_meta.huddle.creator``: server.core.sessions.new_chat), and not while a
    turn runs in it: that would pull the agent's work from under it."""
    if grant.role == "agent":
        return None
    if huddle_meta(state.meta, "creator") != grant.token_id:
        return _refusal(
            RejectionCode.FORBIDDEN, "only the agent, or whoever created it, may dispose a chat"
        )
    if state.active_turn is not None:
        return _refusal(
            RejectionCode.TURN_IN_PROGRESS,
            f"turn '{state.active_turn.id}' is running; cancel it before disposing the chat",
        )
    return None


def admission_refusal(grant: Grant) -> Rejection | None:
    """Why ``grant`` may send no action at all (asked before an action is
    read), or None."""
    if not grant.may_dispatch:
        return _refusal(RejectionCode.FORBIDDEN, "observers may not dispatch actions")
    return None


def dispatch_refusal(
    grant: Grant,
    uri: str,
    action: StateAction,
    state: ChannelState,
    client_id: str | None,
) -> Rejection | None:
    """Why ``grant`` may not dispatch ``action`` to channel ``uri`` (which it
    reaches, in ``state``) as the client ``client_id``; None when it may
    (the validation rules come next)."""
    family, kind = action_type(action).split("/", 1)[0], channel_kind(uri)
    if family != kind:
        return _refusal(
            RejectionCode.WRONG_CHANNEL, f"a {family} action cannot go to a {kind} channel"
        )
    admission = admission_refusal(grant)
    if admission is not None:
        return admission
    if kind == "root" and grant.sessions is not None:
        return _refusal(
            RejectionCode.FORBIDDEN, "a token scoped to sessions may not change the root channel"
        )
    if grant.role == "agent":
        return None
    if not is_client_dispatchable(action):
        return _refusal(
            RejectionCode.FORBIDDEN, f"{action_type(action)} is dispatched only by the server"
        )
    for message in _messages(action):
        if message.origin.kind != "user":
            return _refusal(
                RejectionCode.FORBIDDEN,
                f"a {grant.role} token's message comes from the user: origin "
                f"'{message.origin.kind}' is only the agent's to send",
            )
    if isinstance(action, ChatToolCallConfirmed) and action.confirmed == "not-needed":
        # "not-needed" says nobody had to approve: the host's word (a call
        # that ran without a confirmation), never a person's approval.
        return _refusal(
            RejectionCode.FORBIDDEN,
            f"a {grant.role} token approves a call as 'user-action' or 'setting': "
            "'not-needed' says nobody had to",
        )
    if isinstance(action, ChatTruncated) and isinstance(state, ChatState):
        return _truncation_refusal(state, action, grant)
    return _speaks_for_another(state, action, client_id, grant)


def stamped(message: Message, grant: Grant | None, *, turn: str | None = None) -> Message:
    """``message`` as the server records it: ``_meta.huddle.by`` names the
    token of ``grant``'s person (None: the agent, whose word it keeps), so
    that a turn says whose it is (:func:`starter`), and, for a turn's
    message, ``_meta.huddle.turn`` is ``turn``, which of the turns that ever
    bore its id it is (:func:`turn_stamp`). Both are the server's word:
    whatever a person's client put there is replaced, or dropped."""
    meta = dict(message.meta or {})
    huddle = meta.get(HUDDLE)
    ours = {k: v for k, v in (huddle if isinstance(huddle, dict) else {}).items() if k != "turn"}
    if grant is not None:
        ours["by"] = grant.token_id
    if turn is not None:
        ours["turn"] = turn
    meta[HUDDLE] = ours
    return replace(message, meta=meta)


def new_turn_stamp() -> str:
    """A fresh ``_meta.huddle.turn`` for a person's ``chat/turnStarted``."""
    return secrets.token_hex(4)


def turn_stamp(message: Message) -> str | None:
    """The server's stamp on a turn's ``message`` (:func:`stamped`): AHP turn
    ids are the client's choice, and one truncated away may be used again;
    the stamp tells the turns that bore it apart. None on a turn the server
    did not stamp (the agent's own, or one from before stamps)."""
    stamp = huddle_meta(message.meta, "turn")
    return stamp if isinstance(stamp, str) and _STAMP.fullmatch(stamp) else None


def active_turn_stamp(state: ChannelState) -> str | None:
    """The stamp of a chat's active turn (:func:`turn_stamp`); None when it
    has none, or is no chat."""
    turn = state.active_turn if isinstance(state, ChatState) else None
    return None if turn is None else turn_stamp(turn.message)


def same_turn(chat_turn: Turn | ActiveTurn, turn_id: str | None, stamp: str | None) -> bool:
    """Whether ``chat_turn`` is the AHP turn ``turn_id`` stamped ``stamp``
    (None: unstamped), not another that bore its id (:func:`turn_stamp`)."""
    return chat_turn.id == turn_id and turn_stamp(chat_turn.message) == stamp


def starter(message: Message) -> str | None:
    """The token that started a turn with ``message``, if a person's did
    (:func:`stamped`)."""
    by = huddle_meta(message.meta, "by")
    return by if isinstance(by, str) else None


def _truncation_refusal(state: ChatState, action: ChatTruncated, grant: Grant) -> Rejection | None:
    """Why a participant may not truncate ``state`` so (see the module
    docstring), or None."""
    active = state.active_turn
    if active is not None:
        return _refusal(
            RejectionCode.TURN_IN_PROGRESS,
            f"turn '{active.id}' is active; cancel it (chat/turnCancelled) before truncating",
        )
    removed = select_truncated(state, action)  # the active turn is none of them here
    if not removed:
        return _refusal(RejectionCode.NO_CHANGE, "no turn would be truncated")
    agents = next((turn for turn in removed if turn.message.origin.kind != "user"), None)
    if agents is not None:
        return _refusal(
            RejectionCode.FORBIDDEN,
            f"turn '{agents.id}' was started by the agent; only the agent may truncate it away",
        )
    others = next((t for t in removed if starter(t.message) != grant.token_id), None)
    if others is not None:
        return _refusal(
            RejectionCode.FORBIDDEN,
            f"turn '{others.id}' was started by someone else; only the agent may truncate it away",
        )
    return None


def _messages(action: StateAction) -> list[Message]:
    """The messages ``action`` puts into the chat. AHP's ``MessageOrigin``
    says who produced each (``user``, ``agent``, ``tool``,
    ``systemNotification``): a person may not pass theirs off as the
    agent's or the system's."""
    match action:
        case ChatTurnStarted() | ChatPendingMessageSet():
            return [action.message]
        case ChatDraftChanged() if action.draft is not None:
            return [action.draft]
        case ChatToolCallConfirmed() if action.user_suggestion is not None:
            return [action.user_suggestion]
    return []


def cap_refusal(
    grant: Grant, held: int, most: int, *, holder: str = "the server", what: str = "sessions"
) -> str | None:
    """Why ``grant`` may not create one more of ``what`` while ``holder``
    holds ``held`` of at most ``most`` (the server its sessions, a session
    its chats), or None. The last tenth is the agent's: a person's token
    filling the server, or a session, cannot lock the agent out (its child
    agents open chats of their own)."""
    cap = most if grant.role == "agent" else most - most // 10
    if held < cap:
        return None
    return (
        f"{holder} holds {held:,} {what}; {grant.role} tokens may create one "
        f"while it holds fewer than {cap:,}"
    )


def _speaks_for_another(
    state: ChannelState, action: StateAction, client_id: str | None, grant: Grant
) -> Rejection | None:
    """Actions that speak for a client may be sent only by that client. AHP
    lets clients complete and update the tool calls they execute ("the
    server SHOULD reject this action if the dispatching client does not
    match the tool call's contributor.clientId"); the client here is the
    token that held that client id when the call started
    (:func:`executor`), never whoever holds the id now: any other would let
    a person skip an approval or invent a tool's result. A client keeps its
    own entry in the session's active clients."""
    match action:
        case ChatToolCallComplete() | ChatToolCallContentChanged():
            call = (
                select_tool_call(state, action.tool_call_id)
                if isinstance(state, ChatState)
                else None
            )
            if call is not None and executor(call) == grant.token_id:
                return None
            return _refusal(
                RejectionCode.FORBIDDEN,
                f"tool call '{action.tool_call_id}' is not executed by this client, "
                "so it may not complete or update it",
            )
        case SessionActiveClientSet() if action.active_client.client_id != client_id:
            return _refusal(
                RejectionCode.FORBIDDEN,
                f"a client may set only its own active-client entry, not "
                f"'{action.active_client.client_id}'",
            )
        case SessionActiveClientRemoved() if action.client_id != client_id:
            return _refusal(
                RejectionCode.FORBIDDEN,
                f"a client may remove only its own active-client entry, not '{action.client_id}'",
            )
    return None


def executor(call: ToolCallState) -> str | None:
    """The token that executes a client's tool call: the one that held the
    contributor's client id when the call started, as the server recorded it
    then (:func:`keeping_executor`). None: no person's token may complete or
    update the call (nobody held the id, or the call is no client's)."""
    if not isinstance(call.contributor, ClientContributor):
        return None
    by = huddle_meta(call.meta, EXECUTOR)
    return by if isinstance(by, str) else None


def keeping_executor(
    action: StateAction, state: ChannelState, holder: str | None = None
) -> StateAction:
    """``action`` as the server records it, so that a client's tool call
    keeps its :func:`executor`: a ``chat/toolCallStart`` of a client's tool
    names the token that holds that client id now (``holder``: the server's
    word, whatever the sender put there), and an action on the call that
    carries a ``_meta`` (AHP: it replaces the call's) carries it on."""
    match action:
        case ChatToolCallStart(contributor=ClientContributor()):
            return replace(action, meta=_with_executor(action.meta, holder))
        case (
            ChatToolCallDelta()
            | ChatToolCallReady()
            | ChatToolCallConfirmed()
            | ChatToolCallComplete()
            | ChatToolCallResultConfirmed()
            | ChatToolCallContentChanged()
            | ChatToolCallAuthRequired()
            | ChatToolCallAuthResolved()
        ) if action.meta is not None and isinstance(state, ChatState):
            call = select_tool_call(state, action.tool_call_id)
            if call is None or not isinstance(call.contributor, ClientContributor):
                return action
            return replace(action, meta=_with_executor(action.meta, executor(call)))
    return action


def _with_executor(meta: dict[str, Any] | None, token: str | None) -> dict[str, Any] | None:
    """``meta`` with ``_meta.huddle.executor`` set to ``token`` (taken out
    for None)."""
    new = dict(meta or {})
    huddle = new.get(HUDDLE)
    ours = {k: v for k, v in (huddle if isinstance(huddle, dict) else {}).items() if k != EXECUTOR}
    if token is not None:
        ours[EXECUTOR] = token
    if ours:
        new[HUDDLE] = ours
    else:
        new.pop(HUDDLE, None)
    return new or None


def _refusal(code: RejectionCode, sentence: str) -> Rejection:
    return Rejection(code, sentence)
