"""Forms an agent may ask people to fill in, as defined in code.

A turn never holds a definition: when it asks, the form is frozen into its
suspension (:class:`server.runner.turn.FrozenForm`), so later changes to the
definition affect only new turns. How a turn asks, and what people's answer
must fit and does, is :mod:`server.runner.user_input`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.core.expiry import Expiry
from server.core.schemas import SchemaCheck


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


def schema_errors(schema: dict[str, Any], data: dict[str, Any]) -> list[str]:
    """Field errors of ``data`` against ``schema`` (a frozen form, a tool's
    input schema), no values quoted."""
    return [
        f"{'/'.join(path) or '(form)'}: fails `{rule}`"
        for path, rule in SchemaCheck.of(schema).failures(data)
    ]
