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


def _top_index(items: list[Customization], item_id: str) -> int:
    return next((i for i, c in enumerate(items) if c.get("id") == item_id), -1)


def _children(container: Customization) -> list[Customization] | None:
    """A container's children (plugins and directories have them; an MCP
    server at the top level never does)."""
    children = container.get("children")
    if container.get("type") == "mcpServer" or not isinstance(children, list):
        return None
    return children


def _toggled(items: list[Customization], item_id: str, enabled: bool) -> list[Customization] | None:
    """AHP: the top-level entry with the id, else the child in the first
    container that has one."""
    top = _top_index(items, item_id)
    if top >= 0:
        updated = list(items)
        updated[top] = {**items[top], "enabled": enabled}
        return updated
    for index, container in enumerate(items):
        children = _children(container)
        child = -1 if children is None else _top_index(children, item_id)
        if children is not None and child >= 0:
            new_children = list(children)
            new_children[child] = {**children[child], "enabled": enabled}
            updated = list(items)
            updated[index] = {**container, "children": new_children}
            return updated
    return None


def _in_every_container(
    items: list[Customization],
    item_id: str,
    change: Callable[[Customization], Customization | None],
) -> list[Customization] | None:
    """Apply ``change`` to the child ``item_id`` of every container; it
    returns the new child, None to remove it, or the child itself to leave it
    alone. Returns the new list, or None when nothing changed."""
    changed = False
    updated: list[Customization] = []
    for container in items:
        children = _children(container)
        child = -1 if children is None else _top_index(children, item_id)
        if children is None or child < 0:
            updated.append(container)
            continue
        new = change(children[child])
        if new is children[child]:
            updated.append(container)
            continue
        changed = True
        new_children = list(children)
        if new is None:
            del new_children[child]
        else:
            new_children[child] = new
        updated.append({**container, "children": new_children})
    return updated if changed else None


def _removed(items: list[Customization], item_id: str) -> list[Customization] | None:
    """AHP: the top-level entry with the id, else that child of every
    container."""
    top = _top_index(items, item_id)
    if top >= 0:
        return [c for i, c in enumerate(items) if i != top]
    return _in_every_container(items, item_id, lambda child: None)


def _mcp_server_changed(
    items: list[Customization], item_id: str, state: JsonObject, channel: str | None
) -> list[Customization] | None:
    """Set an MCP server's state: the top-level entry with the id (unless it
    is not an MCP server), else every MCP server child with the id."""

    def change(entry: Customization) -> Customization:
        if entry.get("type") != "mcpServer":
            return entry
        new: dict[str, Any] = {**entry, "state": state}
        new.pop("channel", None)
        if channel is not None:
            new["channel"] = channel
        return new

    top = _top_index(items, item_id)
    if top >= 0:
        new = change(items[top])
        if new is items[top]:
            return None
        updated = list(items)
        updated[top] = new
        return updated
    return _in_every_container(items, item_id, change)


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
