"""Forms an agent may ask people to fill in, as defined in code.

A turn never holds a definition: when it asks, the form is frozen into its
suspension (:class:`server.runner.turn.FrozenForm`), so later changes to the
definition affect only new turns. How a turn asks, and what people's answer
must fit and does, is :mod:`server.runner.user_input`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jsonschema
import msgspec

from server.cache import Lru
from server.expiry import Expiry

CACHED_VALIDATORS = 64
"""Validators kept, by schema: building one costs more than checking data
with it (about half of a form's resume check), and a process sees the few
schemas of its agents' forms and tools again and again. Each holds a copy of
its schema of its own, so that a dict changed later changes none."""

_validators: Lru[bytes, jsonschema.Draft202012Validator] = Lru(CACHED_VALIDATORS)


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
    key = msgspec.json.encode(schema, order="sorted")  # by content: a dict can change
    validator = _validators.get(key)
    if validator is None:
        validator = jsonschema.Draft202012Validator(msgspec.json.decode(key))
        _validators.put(key, validator)
    errors: dict[str, None] = {}
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        path = [str(p) for p in error.absolute_path]
        if error.validator == "required" and isinstance(error.instance, dict):
            # A missing field fails on the object that lacks it: name the field.
            for name in error.validator_value:
                if name not in error.instance:
                    errors["/".join([*path, str(name)]) + ": fails `required`"] = None
            continue
        errors[f"{'/'.join(path) or '(form)'}: fails `{error.validator}`"] = None
    return list(errors)
