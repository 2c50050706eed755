"""server.core.schemas: the fast accept of flat forms says yes exactly where
jsonschema does, and never decides a no."""

from __future__ import annotations

import itertools
import math
from typing import Any

import jsonschema
import pytest

from server.core.schemas import SchemaCheck

FLAT: dict[str, Any] = {
    "type": "object",
    "title": "Incident",
    "properties": {
        "system": {"type": "string", "title": "System", "minLength": 2, "maxLength": 5},
        "mail": {"type": "string", "format": "email"},
        "severity": {"type": "string", "enum": ["low", "high"], "enumNames": ["Low", "High"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1.5},
        "urgent": {"type": "boolean", "default": False},
    },
    "required": ["system", "count"],
}

VALUES: list[Any] = [
    None, True, False, 0, 1, 3, 10, 11, -1, 1.0, 0.5, 2.5, math.nan, math.inf,
    "", "a", "db", "mysql", "postgres", "low", "high", "LOW", "é" * 5, "😀" * 5, [], {},
]  # fmt: skip
FIELDS = ["system", "mail", "severity", "count", "ratio", "urgent", "other"]


def _datas() -> list[Any]:
    base = {"system": "db", "count": 3}
    datas: list[Any] = [base, {}, {"system": "db"}, {"count": 3}, [], "x", None, 1]
    for name, value in itertools.product(FIELDS, VALUES):
        datas.append({**base, name: value})
    return datas


@pytest.mark.parametrize("data", _datas())
def test_the_flat_check_agrees_with_jsonschema(data: Any) -> None:
    check = SchemaCheck(FLAT)
    assert check._fast is not None  # the fast path is the one under test
    validator = jsonschema.Draft202012Validator(FLAT)
    expected = validator.is_valid(data)
    assert check.accepts(data) is expected
    error = check.first_error(data)
    if expected:
        assert error is None
    else:
        with pytest.raises(jsonschema.ValidationError) as raised:
            validator.validate(data)
        assert error is not None
        assert (error.validator, error.absolute_path) == (
            raised.value.validator,
            raised.value.absolute_path,
        )
    assert (list(check.failures(data)) == []) is expected
    if check._fast(data):
        assert expected  # the fast path never says yes where jsonschema says no


def test_the_fast_path_takes_no_integer_it_cannot_be_sure_of() -> None:
    check = SchemaCheck(FLAT)
    assert check._fast is not None
    assert not check._fast({"system": "db", "count": True})  # a bool is no integer
    assert not check._fast({"system": "db", "count": 3.0})  # left to jsonschema...
    assert check.accepts({"system": "db", "count": 3.0})  # ...which takes it


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}},
        {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
        {"type": "object", "properties": {"a": {"type": ["string", "null"]}}},
        {"type": "object", "properties": {"a": {"type": "array", "items": {"enum": ["x"]}}}},
        {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
        {"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 1}}},
        {"type": "object", "properties": {"a": {"enum": [1, True]}}},
        {"$schema": "http://json-schema.org/draft-04/schema#", "properties": {}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {}}},
    ],
)
def test_a_keyword_the_fast_path_does_not_know_leaves_it_all_to_jsonschema(
    schema: dict[str, Any],
) -> None:
    assert SchemaCheck(schema)._fast is None


def test_failures_name_field_and_rule_in_path_order() -> None:
    check = SchemaCheck.of(FLAT)
    failures = list(check.failures({"system": "x", "ratio": "high"}))
    assert failures == [
        (["count"], "required"),
        (["ratio"], "type"),
        (["system"], "minLength"),
    ]


def test_checks_are_kept_by_content() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    first = SchemaCheck.of(schema)
    assert SchemaCheck.of(dict(schema)) is first
    schema["required"] = ["n"]
    assert SchemaCheck.of(schema) is not first
    assert not SchemaCheck.of(schema).accepts({})
    assert first.accepts({})  # built from a copy: the change did not reach it
