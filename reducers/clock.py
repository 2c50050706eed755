"""Timestamps from the caller's clock, formatted as AHP writes them."""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_time(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 with milliseconds and ``Z``, exactly
    like JavaScript's ``Date.prototype.toISOString``."""
    seconds, millis = divmod(ms, 1000)
    return f"{_second(seconds)}{millis:03d}Z"


@functools.lru_cache(maxsize=64)
def _second(seconds: int) -> str:
    """The ISO 8601 text of a second, up to its dot: actions and records of
    one second share it (``strftime`` is most of what a stamp costs)."""
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.")


def iso_ms(text: str, fallback: int) -> int:
    """An ISO 8601 time as ``ms`` since the epoch (``fallback`` when it is
    not one)."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return fallback
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int((moment - _EPOCH).total_seconds() * 1000)
