"""The AHP session status bitset, shared by sessions and chats.

Bits 0-4 hold the activity, which is exactly one of Idle, Error, InProgress
and InputNeeded (InputNeeded implies InProgress: it is InProgress plus bit 4).
IsRead and IsArchived are orthogonal flags that no activity change touches.
"""

from __future__ import annotations

from typing import Final


class SessionStatus:
    """Bit values of AHP's ``SessionStatus``; state carries the plain int so
    that bits from a newer peer are preserved."""

    IDLE: Final = 1
    ERROR: Final = 1 << 1
    IN_PROGRESS: Final = 1 << 3
    INPUT_NEEDED: Final = (1 << 3) | (1 << 4)
    IS_READ: Final = 1 << 5
    IS_ARCHIVED: Final = 1 << 6


ACTIVITY_MASK = (1 << 5) - 1
"""The mutually exclusive activity bits (0-4)."""


def with_activity(status: int, activity: int) -> int:
    """Replace the activity bits of ``status``, keeping the orthogonal flags."""
    return (status & ~ACTIVITY_MASK) | activity


def with_flag(status: int, flag: int, on: bool) -> int:
    """Set or clear one orthogonal flag."""
    return status | flag if on else status & ~flag
