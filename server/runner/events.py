"""Runner events: what happened, for listeners that observe and never
decide (a listener that raises is logged and ignored)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("huddle.runner.events")


class EventType(enum.StrEnum):
    TURN_STARTED = "TURN_STARTED"
    MODEL_REPLIED = "MODEL_REPLIED"
    TOOL_APPROVAL_REQUESTED = "TOOL_APPROVAL_REQUESTED"
    TOOL_INPUT_REQUESTED = "TOOL_INPUT_REQUESTED"
    TURN_SUSPENDED = "TURN_SUSPENDED"
    TURN_RESUMED = "TURN_RESUMED"
    """A resume was taken: data ``command``, ``chat`` (the turn's chat, if
    any), ``resume`` (the turn's Audit entry for it)."""
    TOOL_STARTED = "TOOL_STARTED"
    TOOL_PROGRESS = "TOOL_PROGRESS"
    TOOL_COMPLETED = "TOOL_COMPLETED"
    TOOL_DENIED = "TOOL_DENIED"
    RETRY_SCHEDULED = "RETRY_SCHEDULED"
    TURN_TAKEN_OVER = "TURN_TAKEN_OVER"
    """A worker took over a RUNNING turn whose worker stopped (an attempt
    that failed): data ``attempt`` (how many in a row), ``phase``."""
    ATTEMPT_FAILED = "ATTEMPT_FAILED"
    """An execution ended in an error the runner could not turn into a
    result: data ``attempt``, ``error``, ``kind`` (the exception's class)."""
    TURN_COMPLETED = "TURN_COMPLETED"
    TURN_FAILED = "TURN_FAILED"
    TURN_CANCELLED = "TURN_CANCELLED"


@dataclass(frozen=True)
class RunnerEvent:
    type: EventType
    turn_id: str
    data: dict[str, Any] = field(default_factory=dict)


Listener = Callable[[RunnerEvent], None]


def notify(listeners: list[Listener], event: RunnerEvent) -> None:
    for listener in list(listeners):
        try:
            listener(event)
        except Exception:
            log.exception("runner listener failed on %s", event.type)
