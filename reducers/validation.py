from __future__ import annotations

from protocol.actions import StateAction
from protocol.messages import ChannelState


def reject_reason(state: ChannelState, action: StateAction) -> str | None:
    return None
