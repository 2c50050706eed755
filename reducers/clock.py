"""Timestamps from the caller's clock, formatted as AHP writes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_time(ms: int) -> str:
    """``ms`` since the epoch as ISO 8601 with milliseconds and ``Z``, exactly
    like JavaScript's ``Date.prototype.toISOString``."""
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


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
