"""The session channel reducer.

``reduce_session(state, action)`` is pure and total like the chat reducer.
It needs no clock: no session action stamps a time. Customizations are JSON
objects (see :mod:`protocol.session`); they are copied, never changed in place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

import msgspec
from msgspec.structs import replace

from protocol.actions import (
    SessionAction,
    SessionActiveClientRemoved,
    SessionActiveClientSet,
    SessionActivityChanged,
    SessionChangesetsChanged,
    SessionChatAdded,
    SessionChatRemoved,
    SessionChatUpdated,
    SessionConfigChanged,
    SessionCreationFailed,
    SessionCustomizationRemoved,
    SessionCustomizationsChanged,
    SessionCustomizationToggled,
    SessionCustomizationUpdated,
    SessionDefaultChatChanged,
    SessionInputNeededRemoved,
    SessionInputNeededSet,
    SessionIsArchivedChanged,
    SessionIsReadChanged,
    SessionMcpServerStartRequested,
    SessionMcpServerStateChanged,
    SessionMcpServerStopRequested,
    SessionMetaChanged,
    SessionReady,
    SessionServerToolsChanged,
    SessionTitleChanged,
    SessionWorkingDirectoryRemoved,
    SessionWorkingDirectorySet,
)
from protocol.chat import ChatSummary
from protocol.session import SessionInputRequest, SessionState
from protocol.status import SessionStatus, with_activity, with_flag
from protocol.wire import ConfigState, JsonObject
from reducers.lists import directory_removed, directory_set, merge_config, upsert

Customization = JsonObject


def input_needed_status(status: int, queue: list[SessionInputRequest]) -> int:
    """AHP: a non-empty input queue makes the activity InputNeeded; emptying
    it clears only the InputNeeded-specific bit, so a running session falls
    back to InProgress and an idle one stays idle. Flags are kept."""
    if queue:
        return with_activity(status, SessionStatus.INPUT_NEEDED)
    return status & ~(SessionStatus.INPUT_NEEDED & ~SessionStatus.IN_PROGRESS)


def _chat_updated(state: SessionState, action: SessionChatUpdated) -> SessionState:
    index = next((i for i, c in enumerate(state.chats) if c.resource == action.chat), -1)
    if index < 0:
        return state
    changes = {
        field: value
        for field in ChatSummary.__struct_fields__
        if field != "resource" and (value := getattr(action.changes, field)) is not msgspec.UNSET
    }
    chats = list(state.chats)
    chats[index] = replace(chats[index], **changes)
    return replace(state, chats=chats)


def _chat_removed(state: SessionState, chat: str) -> SessionState:
    kept = [c for c in state.chats if c.resource != chat]
    if len(kept) == len(state.chats):
        return state
    default = None if state.default_chat == chat else state.default_chat
    return replace(state, chats=kept, default_chat=default)


def _input_needed_set(state: SessionState, request: SessionInputRequest) -> SessionState:
    queue = upsert(state.input_needed or [], request, lambda r: r.id == request.id)
    return replace(state, input_needed=queue, status=input_needed_status(state.status, queue))


def _input_needed_removed(state: SessionState, request_id: str) -> SessionState:
    queue = state.input_needed
    if queue is None or all(r.id != request_id for r in queue):
        return state
    remaining = [r for r in queue if r.id != request_id]
    return replace(
        state,
        input_needed=remaining or None,
        status=input_needed_status(state.status, remaining),
    )


def _with_customizations(
    state: SessionState, update: Callable[[list[Customization]], list[Customization] | None]
) -> SessionState:
    """Apply ``update`` to the customization list; None means unchanged."""
    if state.customizations is None:
        return state
    updated = update(state.customizations)
    return state if updated is None else replace(state, customizations=updated)


def _find_child(
    items: list[Customization], item_id: str, change: Callable[[list[Customization], int], None]
) -> list[Customization] | None:
    """Find ``item_id`` at the top level, or else among the children of a
    container (plugin or directory), and apply ``change`` to a copy of the
    list that holds it. Returns the new top-level list, or None."""
    top = next((i for i, c in enumerate(items) if c.get("id") == item_id), -1)
    if top >= 0:
        copy = list(items)
        change(copy, top)
        return copy
    for index, container in enumerate(items):
        children = container.get("children")
        if container.get("type") == "mcpServer" or not isinstance(children, list):
            continue
        child = next((i for i, c in enumerate(children) if c.get("id") == item_id), -1)
        if child >= 0:
            new_children = list(children)
            change(new_children, child)
            copy = list(items)
            copy[index] = {**container, "children": new_children}
            return copy
    return None


def _toggled(items: list[Customization], item_id: str, enabled: bool) -> list[Customization] | None:
    def change(lst: list[Customization], i: int) -> None:
        lst[i] = {**lst[i], "enabled": enabled}

    return _find_child(items, item_id, change)


def _removed(items: list[Customization], item_id: str) -> list[Customization] | None:
    def change(lst: list[Customization], i: int) -> None:
        del lst[i]

    return _find_child(items, item_id, change)


def _mcp_server_changed(
    items: list[Customization], item_id: str, state: JsonObject, channel: str | None
) -> list[Customization] | None:
    """Set an MCP server's state (top level or child); AHP leaves any other
    kind of customization with that id alone."""
    refused = False

    def change(lst: list[Customization], i: int) -> None:
        nonlocal refused
        if lst[i].get("type") != "mcpServer":
            refused = True
            return
        entry: dict[str, Any] = {**lst[i], "state": state}
        entry.pop("channel", None)
        if channel is not None:
            entry["channel"] = channel
        lst[i] = entry

    updated = _find_child(items, item_id, change)
    return None if refused else updated


def reduce_session(state: SessionState, action: SessionAction) -> SessionState:
    """The session state after ``action``."""
    match action:
        case SessionReady():
            # AHP: a lifecycle transition only; status follows the chats.
            return replace(state, lifecycle="ready")
        case SessionCreationFailed():
            return replace(state, lifecycle="creationFailed", creation_error=action.error)
        case SessionChatAdded():
            summary = action.summary
            chats = upsert(state.chats, summary, lambda c: c.resource == summary.resource)
            return replace(state, chats=chats)
        case SessionChatRemoved():
            return _chat_removed(state, action.chat)
        case SessionChatUpdated():
            return _chat_updated(state, action)
        case SessionDefaultChatChanged():
            return replace(state, default_chat=action.default_chat)
        case SessionTitleChanged():
            return replace(state, title=action.title)
        case SessionIsReadChanged():
            return replace(
                state, status=with_flag(state.status, SessionStatus.IS_READ, action.is_read)
            )
        case SessionIsArchivedChanged():
            status = with_flag(state.status, SessionStatus.IS_ARCHIVED, action.is_archived)
            return replace(state, status=status)
        case SessionActivityChanged():
            return replace(state, activity=action.activity)
        case SessionChangesetsChanged():
            return replace(state, changesets=action.changesets)
        case SessionConfigChanged():
            if state.config is None:
                return state
            values = merge_config(state.config.values, action.config, action.replace)
            return replace(state, config=ConfigState(schema=state.config.schema, values=values))
        case SessionMetaChanged():
            return replace(state, meta=action.meta)
        case SessionServerToolsChanged():
            return replace(state, server_tools=action.tools)
        case SessionActiveClientSet():
            client = action.active_client
            clients = upsert(
                state.active_clients, client, lambda c: c.client_id == client.client_id
            )
            return replace(state, active_clients=clients)
        case SessionActiveClientRemoved():
            kept = [c for c in state.active_clients if c.client_id != action.client_id]
            if len(kept) == len(state.active_clients):
                return state
            return replace(state, active_clients=kept)
        case SessionWorkingDirectorySet():
            dirs = directory_set(state.working_directories, action.directory)
            return state if dirs is None else replace(state, working_directories=dirs)
        case SessionWorkingDirectoryRemoved():
            dirs = directory_removed(state.working_directories, action.directory)
            return state if dirs is None else replace(state, working_directories=dirs)
        case SessionInputNeededSet():
            return _input_needed_set(state, action.request)
        case SessionInputNeededRemoved():
            return _input_needed_removed(state, action.id)
        case SessionCustomizationsChanged():
            return replace(state, customizations=action.customizations)
        case SessionCustomizationToggled():
            return _with_customizations(
                state, lambda items: _toggled(items, action.id, action.enabled)
            )
        case SessionCustomizationUpdated():
            new = action.customization
            items = upsert(state.customizations or [], new, lambda c: c.get("id") == new.get("id"))
            return replace(state, customizations=items)
        case SessionCustomizationRemoved():
            return _with_customizations(state, lambda items: _removed(items, action.id))
        case SessionMcpServerStateChanged():
            return _with_customizations(
                state,
                lambda items: _mcp_server_changed(items, action.id, action.state, action.channel),
            )
        case SessionMcpServerStartRequested():
            return _with_customizations(
                state,
                lambda items: _mcp_server_changed(items, action.id, {"kind": "starting"}, None),
            )
        case SessionMcpServerStopRequested():
            return _with_customizations(
                state,
                lambda items: _mcp_server_changed(items, action.id, {"kind": "stopped"}, None),
            )
        case _:
            assert_never(action)
