"""The root channel reducer (``ahp-root://``): agents, counts, config."""

from __future__ import annotations

from typing import assert_never

from msgspec.structs import replace

from protocol.actions import (
    RootAction,
    RootActiveSessionsChanged,
    RootAgentsChanged,
    RootConfigChanged,
    RootTerminalsChanged,
)
from protocol.session import RootState
from protocol.wire import ConfigState
from reducers.lists import merge_config


def reduce_root(state: RootState, action: RootAction) -> RootState:
    """The root state after ``action``."""
    match action:
        case RootAgentsChanged():
            return replace(state, agents=action.agents)
        case RootActiveSessionsChanged():
            return replace(state, active_sessions=action.active_sessions)
        case RootTerminalsChanged():
            return replace(state, terminals=action.terminals)
        case RootConfigChanged():
            if state.config is None:
                return state
            values = merge_config(state.config.values, action.config, action.replace)
            return replace(state, config=ConfigState(schema=state.config.schema, values=values))
        case _:
            assert_never(action)
