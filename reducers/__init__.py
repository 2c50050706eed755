"""Pure reducers of the AHP root, session and chat channels, and the host's
validation rules as pure functions."""

from __future__ import annotations

from protocol.actions import StateAction, is_chat_action, is_root_action, is_session_action
from protocol.chat import ChatState
from protocol.messages import ChannelState
from protocol.session import SessionState
from reducers.chat import reduce_chat
from reducers.root import reduce_root
from reducers.session import reduce_session


def reduce(state: ChannelState, action: StateAction, now_ms: int) -> ChannelState:
    """Reduce any channel; an action of another channel's family is a no-op."""
    if isinstance(state, ChatState):
        return reduce_chat(state, action, now_ms) if is_chat_action(action) else state
    if isinstance(state, SessionState):
        return reduce_session(state, action) if is_session_action(action) else state
    return reduce_root(state, action) if is_root_action(action) else state
