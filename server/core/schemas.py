"""JSON Schema checks built once per schema, with a fast accept for MCP's
flat forms, and the one wording of a schema failure.

Every place that tells someone their data fails a schema (the host's check
of an accept against its frozen form and of edited tool input against the
tool's input schema, MCP elicitation asking again) words it with
:meth:`SchemaCheck.failure_texts`: ``<field path> fails the schema's
`<rule>` rule``, the field and the rule, never the value.

A form answer is checked on its way to a waiting turn once, by the host's
rule before the answer is accepted, and each check through jsonschema walks
a dozen of its functions: after a person's pause, with the caches cold,
that is a tenth of a millisecond on the resume's path. Most forms are MCP
elicitation's flat subset (an object of strings, numbers, integers,
booleans and string enums, with lengths and bounds), whose rules take a few
lines to check. :class:`SchemaCheck` answers "valid" from those lines when
the schema is entirely made of keywords they know and the data passes every
one; anything else (a keyword they do not know, any failure) goes to
jsonschema, which alone gives errors. The fast path never rejects, so it
cannot say no where jsonschema says yes; it says yes only where jsonschema
does (its types are exact: a ``bool`` is no integer, ``1.0`` goes to
jsonschema).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
import msgspec

from server.cache import Lru

CACHED_CHECKS = 256
"""Checks kept, by schema content: building a validator costs more than
checking data with it, and a process sees the few schemas of its forms and
tools again and again."""

WHOLE = "the data"
"""Where a failure of the data as a whole is, in a failure's text."""

_checks: Lru[bytes, SchemaCheck] = Lru(CACHED_CHECKS)

_Rule = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "enumNames"})
_PROPERTY_KEYWORDS = _ANNOTATIONS | {
    "type", "enum", "minLength", "maxLength", "minimum", "maximum", "format"
}  # fmt: skip
"""What the fast path knows on a property (``format`` is an annotation to
the validators built here: no format checker)."""
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


class SchemaCheck:
    """One schema's validator (its ``$schema``'s draft, the latest without
    one; formats are annotations, as jsonschema's default) and its fast
    accept, when the schema is flat enough to have one."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.schema = schema
        self.validator: jsonschema.protocols.Validator = jsonschema.validators.validator_for(
            schema
        )(schema)
        self._fast = _flat_object(schema) if "$schema" not in schema else None

    @classmethod
    def of(cls, schema: Mapping[str, Any]) -> SchemaCheck:
        """The check of ``schema`` as it reads now (kept by content: a dict
        changed in place is a new schema)."""
        key = msgspec.json.encode(schema, order="sorted")
        check = _checks.get(key)
        if check is None:
            check = cls(msgspec.json.decode(key))  # a copy of its own
            _checks.put(key, check)
        return check

    def accepts(self, data: Any) -> bool:
        """Whether ``data`` fits the schema."""
        return self.first_error(data) is None

    def first_error(self, data: Any) -> jsonschema.ValidationError | None:
        """The error jsonschema's ``validate`` would raise for ``data``, or
        None when it fits."""
        if self._fast is not None and self._fast(data):
            return None
        return next(iter(self.validator.iter_errors(data)), None)

    def failures(self, data: Any) -> Iterator[tuple[list[str], str]]:
        """Each failure as (path, rule), in path order; a missing field
        fails ``required`` at its own path. Never the value (form data can
        be sensitive; jsonschema's messages quote it)."""
        if self._fast is not None and self._fast(data):
            return
        seen: set[tuple[tuple[str, ...], str]] = set()
        errors = sorted(self.validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        for error in errors:
            path = [str(p) for p in error.absolute_path]
            rule = str(error.validator)
            if rule == "required" and isinstance(error.instance, dict):
                names: Any = error.validator_value or ()
                missing = [[*path, str(n)] for n in names if n not in error.instance]
            else:
                missing = [path]
            for where in missing:
                if (tuple(where), rule) not in seen:
                    seen.add((tuple(where), rule))
                    yield where, rule

    def failure_texts(self, data: Any) -> list[str]:
        """Each failure of ``data`` (:meth:`failures`) as people read it,
        ``<field path> fails the schema's `<rule>` rule`` (``the data`` for
        the whole): the one wording of a schema failure. Empty when it fits."""
        return [
            f"{'/'.join(path) or WHOLE} fails the schema's `{rule}` rule"
            for path, rule in self.failures(data)
        ]

    @functools.cached_property
    def schema_is_valid(self) -> bool:
        """Whether the schema itself is valid JSON Schema for its draft (a
        check of data against an invalid one says nothing)."""
        try:
            type(self.validator).check_schema(dict(self.schema))
        except jsonschema.SchemaError:
            return False
        return True


def _flat_object(schema: Mapping[str, Any]) -> _Rule | None:
    """The fast accept of a flat object schema, or None when it holds a
    keyword the fast path does not know."""
    if not set(schema) <= {"type", "properties", "required"} | _ANNOTATIONS:
        return None
    if schema.get("type", "object") != "object":
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict) or not isinstance(required, list):
        return None
    if not all(isinstance(name, str) for name in required):
        return None
    rules: dict[str, _Rule] = {}
    for name, prop in properties.items():
        rule = _flat_property(prop)
        if rule is None:
            return None
        rules[name] = rule
    needed = tuple(required)

    def accept(data: Any) -> bool:
        if type(data) is not dict:
            return False
        for name in needed:
            if name not in data:
                return False
        for name, value in data.items():
            rule = rules.get(name)
            if rule is not None and not rule(value):
                return False
        return True

    return accept


def _flat_property(prop: Any) -> _Rule | None:
    if not isinstance(prop, dict):
        return None
    if not set(prop) <= _PROPERTY_KEYWORDS:
        return None
    kind = prop.get("type")
    types = _TYPES.get(kind) if isinstance(kind, str) else None
    if types is None:
        return None
    enum = prop.get("enum")
    if enum is not None and not (
        kind == "string" and isinstance(enum, list) and all(type(e) is str for e in enum)
    ):
        return None
    lengths = [prop.get("minLength"), prop.get("maxLength")]
    bounds = [prop.get("minimum"), prop.get("maximum")]
    if kind != "string" and lengths != [None, None]:
        return None
    if kind not in ("number", "integer") and bounds != [None, None]:
        return None
    if not all(v is None or type(v) is int for v in lengths):
        return None
    if not all(v is None or type(v) in (int, float) for v in bounds):
        return None
    low, high = lengths if kind == "string" else bounds
    choices = frozenset(enum) if enum is not None else None
    text = kind == "string"

    def accept(value: Any) -> bool:
        if type(value) not in types:
            return False
        if choices is not None and value not in choices:
            return False
        if low is None and high is None:
            return True
        size = len(value) if text else value
        return (low is None or size >= low) and (high is None or size <= high)

    return accept
