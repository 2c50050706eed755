"""Small list and mapping updates the reducers share; none mutates its input."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from protocol.wire import JsonObject

T = TypeVar("T")


def upsert(items: list[T], item: T, matches: Callable[[T], bool]) -> list[T]:
    """A copy of ``items`` with the first match replaced by ``item``, or with
    ``item`` appended when nothing matches."""
    updated = list(items)
    for index, existing in enumerate(updated):
        if matches(existing):
            updated[index] = item
            return updated
    updated.append(item)
    return updated


def directory_set(directories: list[str] | None, directory: str) -> list[str] | None:
    """The list with ``directory`` added, or None when it is already there."""
    current = directories or []
    return None if directory in current else [*current, directory]


def directory_removed(directories: list[str] | None, directory: str) -> list[str] | None:
    """The list without ``directory``, or None when it is not there."""
    if directories is None or directory not in directories:
        return None
    remaining = list(directories)
    remaining.remove(directory)
    return remaining


def merge_config(values: JsonObject, config: JsonObject, replace: bool | None) -> JsonObject:
    """AHP ``configChanged``: merge into the values, or replace them all."""
    return dict(config) if replace else {**values, **config}
