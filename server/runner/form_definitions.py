"""Forms an agent may ask people to fill in, as defined in code.

A turn never holds a definition: when it asks, the form is frozen into its
suspension (:class:`server.runner.turn.FrozenForm`), so later changes to the
definition affect only new turns. How a turn asks, and what people's answer
must be and does, is :mod:`server.runner.user_input`; what it must fit is
the host's word (:mod:`server.core.frozen_forms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.core.expiry import Expiry


@dataclass(frozen=True)
class FormDefinition:
    """A form an agent may ask people to fill in. The model sees ``key`` and
    ``description``; the ``schema`` (MCP's flat JSON Schema subset) is frozen
    into the turn when it is asked. ``expiry`` is how long people have to
    fill it in, and what then applies (default: the agent's
    ``input_expiry``)."""

    key: str
    description: str
    schema: dict[str, Any]
    expiry: Expiry | None = None
