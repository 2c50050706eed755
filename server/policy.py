"""Who may do what: the one authorisation policy every edge asks.

Pure functions of the token's grant, the channel, the session it belongs
to, the action and the channel's state: no I/O. The WebSocket and the HTTP
edge both ask them and answer a refusal each in its own transport's shape
(a rejection echo or a JSON-RPC error; an HTTP status), so each rule exists
once.

Roles: ``agent`` tokens are trusted and may do everything; ``participant``
may dispatch AHP's client-dispatchable actions, create chats, and create
sessions when its token is not scoped to particular sessions; ``observer``
may only read. A token scoped to sessions reaches only those sessions'
channels.

Commands::

    command          allowed for
    ---------------  ------------------------------------------------
    read             any token that reaches the channel's session
    create-session   agent; participant with an unscoped token
    dispose-session  agent
    create-chat      agent, participant (reaching the session)
    mint-token       agent

Actions, checked top to bottom (the first refusal wins)::

    code           refused when
    -------------  ---------------------------------------------------
    wrong-channel  the action's family (root/session/chat) is not the
                   channel's kind
    forbidden      an observer dispatches; the token does not reach the
                   channel's session; a participant dispatches an action
                   only the server dispatches; a participant completes or
                   updates a tool call another client executes
"""

from __future__ import annotations

from enum import StrEnum

from protocol.actions import StateAction, action_type, is_client_dispatchable
from protocol.messages import ChannelState
from protocol.rejections import Rejection, RejectionCode
from protocol.uris import channel_kind
from reducers.validation import client_action_problem
from server.auth import Grant


class Command(StrEnum):
    READ = "read"
    CREATE_SESSION = "create-session"
    DISPOSE_SESSION = "dispose-session"
    CREATE_CHAT = "create-chat"
    MINT_TOKEN = "mint-token"


def command_refusal(
    grant: Grant, command: Command, uri: str | None = None, session: str | None = None
) -> str | None:
    """Why ``grant`` may not run ``command`` (on channel ``uri`` of
    ``session``), or None."""
    if not grant.may_touch(session):
        return f"this token does not reach {uri or session}"
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
        case Command.MINT_TOKEN:
            return None if grant.role == "agent" else "only an agent token may mint tokens"


def dispatch_refusal(
    grant: Grant,
    uri: str,
    session: str | None,
    action: StateAction,
    state: ChannelState,
    client_id: str | None,
) -> Rejection | None:
    """Why ``grant`` may not dispatch ``action`` to channel ``uri`` (of
    ``session``, in ``state``) as the client ``client_id``; None when it may
    (the validation rules come next)."""
    family, kind = action_type(action).split("/", 1)[0], channel_kind(uri)
    if family != kind:
        return Rejection(
            RejectionCode.WRONG_CHANNEL, f"a {family} action cannot go to a {kind} channel"
        )
    if not grant.may_dispatch:
        return Rejection(RejectionCode.FORBIDDEN, "observers may not dispatch actions")
    if not grant.may_touch(session):
        return Rejection(RejectionCode.FORBIDDEN, f"this token does not reach {uri}")
    if grant.role == "agent":
        return None
    if not is_client_dispatchable(action):
        return Rejection(
            RejectionCode.FORBIDDEN, f"{action_type(action)} is dispatched only by the server"
        )
    return client_action_problem(state, action, client_id)
