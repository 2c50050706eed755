"""Flat JSON Schema forms <-> AHP questions, answers and form data."""

from __future__ import annotations

import math
import string
from typing import Any, assert_never

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from protocol.chat import (
    BooleanQuestion,
    BooleanValue,
    InputAnswer,
    InputAnswerValue,
    InputOption,
    InputQuestion,
    IntegerQuestion,
    MultiSelectQuestion,
    NumberQuestion,
    NumberValue,
    SelectedManyValue,
    SelectedValue,
    SingleSelectQuestion,
    TextQuestion,
    TextValue,
)
from protocol.forms import (
    FormDataError,
    FormError,
    FormField,
    FormSchemaError,
    FormSpec,
    answers_from_form_data,
    form_data_from_answers,
    parse_form,
    questions_from_schema,
)

JsonObject = dict[str, Any]


def form(required: list[str] | None = None, **properties: JsonObject) -> JsonObject:
    schema: JsonObject = {"type": "object", "properties": properties}
    if required is not None:
        schema["required"] = required
    return schema


def question_of(prop: JsonObject) -> InputQuestion:
    [question] = questions_from_schema(form(x=prop))
    return question


def field_of(prop: JsonObject, *, required: bool = False) -> FormField:
    [field] = parse_form(form(["x"] if required else None, x=prop)).fields
    return field


def submitted(value: InputAnswerValue) -> InputAnswer:
    return InputAnswer(state="submitted", value=value)


def with_freeform(schema: JsonObject) -> FormSpec:
    """The spec of ``schema`` with every select question allowing freeform input."""
    spec = parse_form(schema)
    fields = []
    for field in spec.fields:
        question = field.question
        if isinstance(question, SingleSelectQuestion | MultiSelectQuestion):
            question = replace(question, allow_freeform_input=True)
        fields.append(replace(field, question=question))
    return FormSpec(fields=tuple(fields))


COLOURS: JsonObject = {"type": "string", "enum": ["red", "green"]}
TAGS: JsonObject = {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}}

# ─── Schema -> questions ─────────────────────────────────────────────────────

MAPPINGS = [
    pytest.param(
        {"type": "string"},
        TextQuestion(id="x", message="x"),
        id="bare-string-is-text-with-name-as-message",
    ),
    pytest.param(
        {"type": "string", "title": "Name"},
        TextQuestion(id="x", title="Name", message="Name"),
        id="title-is-title-and-message-fallback",
    ),
    pytest.param(
        {"type": "string", "title": "Name", "description": "Your full name"},
        TextQuestion(id="x", title="Name", message="Your full name"),
        id="description-is-message",
    ),
    pytest.param(
        {"type": "string", "minLength": 2, "maxLength": 5, "format": "email", "default": "a@b"},
        TextQuestion(id="x", message="x", min=2, max=5, format="email", default_value="a@b"),
        id="string-bounds-format-default",
    ),
    pytest.param(
        {"type": "string", "minLength": 2.0},
        TextQuestion(id="x", message="x", min=2),
        id="integral-float-length-is-int",
    ),
    pytest.param(
        {"type": "number", "minimum": 0.5, "maximum": 10, "default": 2.5},
        NumberQuestion(id="x", message="x", min=0.5, max=10, default_value=2.5),
        id="number-bounds-default",
    ),
    pytest.param(
        {"type": "integer", "minimum": 1, "maximum": 9, "default": 3},
        IntegerQuestion(id="x", message="x", min=1, max=9, default_value=3),
        id="integer-bounds-default",
    ),
    pytest.param(
        {"type": "integer", "default": 3.0},
        IntegerQuestion(id="x", message="x", default_value=3),
        id="integral-float-integer-default-is-int",
    ),
    pytest.param(
        {"type": "boolean", "default": True},
        BooleanQuestion(id="x", message="x", default_value=True),
        id="boolean-default",
    ),
    pytest.param(
        {"type": "boolean"},
        BooleanQuestion(id="x", message="x"),
        id="boolean-without-default",
    ),
    pytest.param(
        COLOURS,
        SingleSelectQuestion(
            id="x",
            message="x",
            options=[InputOption(id="red", label="red"), InputOption(id="green", label="green")],
        ),
        id="enum-is-single-select-labelled-by-value",
    ),
    pytest.param(
        {**COLOURS, "enumNames": ["Red", "Green"], "default": "green"},
        SingleSelectQuestion(
            id="x",
            message="x",
            options=[
                InputOption(id="red", label="Red"),
                InputOption(id="green", label="Green", recommended=True),
            ],
        ),
        id="enum-names-are-labels-default-is-recommended",
    ),
    pytest.param(
        {
            "type": "string",
            "oneOf": [
                {"const": "s", "title": "Small", "description": "fits a pocket"},
                {"const": "l"},
            ],
        },
        SingleSelectQuestion(
            id="x",
            message="x",
            options=[
                InputOption(id="s", label="Small", description="fits a pocket"),
                InputOption(id="l", label="l"),
            ],
        ),
        id="one-of-consts-are-options",
    ),
    pytest.param(
        {**TAGS, "minItems": 1, "maxItems": 2, "default": ["b"]},
        MultiSelectQuestion(
            id="x",
            message="x",
            options=[
                InputOption(id="a", label="a"),
                InputOption(id="b", label="b", recommended=True),
                InputOption(id="c", label="c"),
            ],
            min=1,
            max=2,
        ),
        id="array-of-enum-is-multi-select",
    ),
    pytest.param(
        {"type": "array", "items": {"anyOf": [{"const": "a", "title": "A"}]}},
        MultiSelectQuestion(id="x", message="x", options=[InputOption(id="a", label="A")]),
        id="array-of-any-of-consts-is-multi-select",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "oneOf": [{"const": "a", "title": "A"}]}},
        MultiSelectQuestion(id="x", message="x", options=[InputOption(id="a", label="A")]),
        id="array-of-one-of-consts-is-multi-select",
    ),
    pytest.param(
        {**TAGS, "uniqueItems": True},
        MultiSelectQuestion(
            id="x",
            message="x",
            options=[InputOption(id=v, label=v) for v in ("a", "b", "c")],
        ),
        id="unique-items-is-accepted",
    ),
    pytest.param(
        {"type": "string", "examples": ["x"], "$comment": "c", "x-vendor": 1, "deprecated": False},
        TextQuestion(id="x", message="x"),
        id="annotations-are-ignored",
    ),
    # the rules real servers send (pydantic's gt/lt, multiple_of, Literal)
    pytest.param(
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 13},
        IntegerQuestion(id="x", message="x", min=1, max=12),
        id="integer-exclusive-bounds-are-a-step-inside",
    ),
    pytest.param(
        {"type": "integer", "exclusiveMinimum": 0.5, "minimum": 3, "exclusiveMaximum": 9.5},
        IntegerQuestion(id="x", message="x", min=3, max=9),
        id="integer-fractional-exclusive-bounds",
    ),
    pytest.param(
        {"type": "integer", "minimum": 0, "exclusiveMaximum": 10, "maximum": 5},
        IntegerQuestion(id="x", message="x", min=0, max=5),
        id="integer-the-tighter-bound-wins",
    ),
    pytest.param(
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1.5, "title": "Share"},
        NumberQuestion(
            id="x", title="Share", message="Share (more than 0; less than 1.5)", min=0, max=1.5
        ),
        id="number-exclusive-bounds-are-told",
    ),
    pytest.param(
        {
            "type": "number",
            "minimum": 1,
            "exclusiveMinimum": 0,
            "maximum": 2,
            "exclusiveMaximum": 3,
        },
        NumberQuestion(id="x", message="x (more than 0; less than 3)", min=1, max=2),
        id="number-inclusive-bounds-inside-the-exclusive-ones",
    ),
    pytest.param(
        {"type": "number", "multipleOf": 0.5, "default": 10.0, "description": "Budget"},
        NumberQuestion(id="x", message="Budget (a multiple of 0.5)", default_value=10.0),
        id="multiple-of-is-told",
    ),
    pytest.param(
        {"type": "integer", "multipleOf": 5, "default": 15},
        IntegerQuestion(id="x", message="x (a multiple of 5)", default_value=15),
        id="integer-multiple-of-is-told",
    ),
    pytest.param(
        {"type": "integer", "multipleOf": 1},
        IntegerQuestion(id="x", message="x"),
        id="integer-multiple-of-one-says-nothing",
    ),
    pytest.param(
        {"type": "integer", "const": 3},
        IntegerQuestion(id="x", message="x", min=3, max=3, default_value=3),
        id="integer-const",
    ),
    pytest.param(
        {"type": "number", "const": 2.5, "default": 2.5},
        NumberQuestion(id="x", message="x", min=2.5, max=2.5, default_value=2.5),
        id="number-const-with-its-default",
    ),
    pytest.param(
        {"type": "boolean", "const": True},
        BooleanQuestion(id="x", message="x", default_value=True),
        id="boolean-const",
    ),
    pytest.param(
        {"type": "string", "const": "yes", "default": "yes", "title": "Agree"},
        SingleSelectQuestion(
            id="x",
            title="Agree",
            message="Agree",
            options=[InputOption(id="yes", label="Agree", recommended=True)],
        ),
        id="string-const-is-a-select-of-one",
    ),
    pytest.param(
        {"title": "Level", "oneOf": [{"const": "lo", "title": "Low"}, {"const": "hi"}]},
        SingleSelectQuestion(
            id="x",
            title="Level",
            message="Level",
            options=[InputOption(id="lo", label="Low"), InputOption(id="hi", label="hi")],
        ),
        id="titled-options-without-a-type",
    ),
    pytest.param(
        {"enum": ["a", "b"]},
        SingleSelectQuestion(
            id="x",
            message="x",
            options=[InputOption(id="a", label="a"), InputOption(id="b", label="b")],
        ),
        id="enum-without-a-type",
    ),
    pytest.param(
        {"const": "only"},
        SingleSelectQuestion(id="x", message="x", options=[InputOption(id="only", label="only")]),
        id="const-without-a-type",
    ),
]


@pytest.mark.parametrize(("prop", "expected"), MAPPINGS)
def test_property_maps_to_question(prop: JsonObject, expected: InputQuestion) -> None:
    assert question_of(prop) == expected


@pytest.mark.parametrize("text_format", ["email", "uri", "date", "date-time"])
def test_every_mcp_string_format_is_kept(text_format: str) -> None:
    assert question_of({"type": "string", "format": text_format}) == TextQuestion(
        id="x", message="x", format=text_format
    )


def test_required_property_becomes_required_question() -> None:
    questions = questions_from_schema(form(["a"], a={"type": "string"}, b={"type": "string"}))
    assert [q.required for q in questions] == [True, None]


def test_questions_keep_property_order() -> None:
    names = ["zeta", "alpha", "mid"]
    schema = {"type": "object", "properties": {name: {"type": "boolean"} for name in names}}
    assert [q.id for q in questions_from_schema(schema)] == names


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "object"}, id="missing-properties"),
        pytest.param({"type": "object", "properties": {}}, id="empty-properties"),
    ],
)
def test_schema_without_properties_is_a_plain_confirm(schema: JsonObject) -> None:
    assert parse_form(schema) == FormSpec(fields=())


def test_missing_top_level_type_is_tolerated_with_properties() -> None:
    assert [q.id for q in questions_from_schema({"properties": {"a": {"type": "string"}}})] == ["a"]


def test_top_level_annotations_and_additional_properties_are_ignored() -> None:
    schema = {
        **form(a={"type": "string"}),
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "T",
        "$defs": {},
        "additionalProperties": False,
    }
    assert [q.id for q in questions_from_schema(schema)] == ["a"]


def test_field_describes_the_property() -> None:
    field = field_of({**COLOURS, "title": "Colour"}, required=True)
    assert field == FormField(
        name="x",
        json_type="string",
        question=field.question,
        required=True,
        enum=("red", "green"),
    )


def test_multi_select_field_lists_its_enum() -> None:
    assert field_of(TAGS).enum == ("a", "b", "c")
    assert field_of(TAGS).json_type == "array"


def test_pattern_is_kept_on_the_field() -> None:
    field = field_of({"type": "string", "pattern": "^[a-z]+$"})
    assert field.pattern == "^[a-z]+$"
    assert field.question == TextQuestion(id="x", message="x")


def test_spec_finds_a_field_by_name() -> None:
    spec = parse_form(form(a={"type": "string"}, b={"type": "boolean"}))
    assert spec.field("b") is spec.fields[1]
    assert spec.field("c") is None


def test_spec_questions_is_a_fresh_list() -> None:
    spec = parse_form(form(a={"type": "string"}))
    spec.questions.clear()
    assert len(spec.questions) == 1


# ─── Lenient cases ───────────────────────────────────────────────────────────

NULLABLE = [
    pytest.param(
        {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Nick"},
        TextQuestion(id="x", title="Nick", message="Nick"),
        id="any-of-null-last",
    ),
    pytest.param(
        {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": 1}], "default": None},
        IntegerQuestion(id="x", message="x", min=1),
        id="any-of-null-first-with-null-default",
    ),
    pytest.param(
        {"type": ["string", "null"], "default": None},
        TextQuestion(id="x", message="x"),
        id="type-list-with-null",
    ),
    pytest.param(
        {"type": ["null", "string"], "enum": ["a", None]},
        SingleSelectQuestion(id="x", message="x", options=[InputOption(id="a", label="a")]),
        id="type-list-enum-drops-null",
    ),
    pytest.param(
        {"type": ["string", "null"], "enum": [None, "a"], "enumNames": ["None", "A"]},
        SingleSelectQuestion(id="x", message="x", options=[InputOption(id="a", label="A")]),
        id="type-list-enum-names-drop-the-null-label",
    ),
    pytest.param(
        {"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}], "default": "a"},
        SingleSelectQuestion(
            id="x", message="x", options=[InputOption(id="a", label="a", recommended=True)]
        ),
        id="any-of-enum-with-default",
    ),
]


@pytest.mark.parametrize(("prop", "expected"), NULLABLE)
def test_nullable_property_is_an_optional_question_even_when_listed(
    prop: JsonObject, expected: InputQuestion
) -> None:
    field = field_of(prop, required=True)
    assert field.question == expected
    assert (field.nullable, field.required, field.null_if_unanswered) == (True, False, True)


def test_nullable_property_not_listed_is_not_sent_as_null() -> None:
    field = field_of({"type": ["boolean", "null"]})
    assert (field.nullable, field.null_if_unanswered) == (True, False)


@pytest.mark.parametrize(
    "prop",
    [
        pytest.param({"type": ["string", "null"], "enum": ["a"]}, id="enum-without-null"),
        pytest.param({"type": ["string", "null"], "oneOf": [{"const": "a"}]}, id="one-of"),
    ],
)
def test_type_list_select_is_not_nullable_unless_null_is_an_option(prop: JsonObject) -> None:
    field = field_of(prop, required=True)
    assert (field.nullable, field.required, field.enum) == (False, True, ("a",))


def test_form_shaped_like_pydantic_output_is_accepted() -> None:
    schema = {
        "title": "Booking",
        "type": "object",
        "properties": {
            "name": {"title": "Name", "type": "string"},
            "seats": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
            "when": {"enum": ["today", "tomorrow"], "title": "When", "type": "string"},
        },
        "required": ["name", "seats", "when"],
    }
    spec = parse_form(schema)
    assert [(f.name, f.required, f.null_if_unanswered) for f in spec.fields] == [
        ("name", True, False),
        ("seats", False, True),
        ("when", True, False),
    ]


def test_single_type_list_is_that_type() -> None:
    field = field_of({"type": ["integer"]})
    assert (field.json_type, field.nullable) == ("integer", False)


# ─── Refusals ────────────────────────────────────────────────────────────────

TOP_LEVEL_REFUSALS = [
    pytest.param([], "must be a JSON object", id="schema-not-an-object"),
    pytest.param({"type": "array", "items": {}}, "type must be 'object'", id="not-an-object-type"),
    pytest.param({}, "needs type 'object' or properties", id="no-type-no-properties"),
    pytest.param({"type": "object", "properties": []}, "properties must be", id="bad-properties"),
    pytest.param({**form(), "required": "a"}, "required must be a list", id="required-not-list"),
    pytest.param({**form(), "required": [1]}, "required must be a list", id="required-not-names"),
    pytest.param({**form(), "$ref": "#/$defs/F"}, "'$ref' is not supported", id="top-level-ref"),
    pytest.param({**form(), "allOf": []}, "'allOf' is not supported", id="top-level-all-of"),
    pytest.param({**form(), "minProperties": 1}, "'minProperties'", id="top-level-min-properties"),
]


@pytest.mark.parametrize(("schema", "reason"), TOP_LEVEL_REFUSALS)
def test_schema_outside_the_subset_is_refused_as_a_whole(schema: Any, reason: str) -> None:
    with pytest.raises(FormSchemaError) as caught:
        parse_form(schema)
    assert caught.value.property is None
    assert reason in caught.value.reason


def test_ids_the_limits_would_refuse_are_refused_with_the_schema() -> None:
    # A property name becomes a question id, an option an option id: one
    # over the id limit would make the request itself too large to show.
    longest = "x" * 256
    parse_form({"type": "object", "properties": {longest: {"type": "string", "enum": [longest]}}})
    with pytest.raises(FormSchemaError) as named:
        parse_form({"type": "object", "properties": {"x" * 257: {"type": "string"}}})
    assert named.value.property is None
    assert named.value.reason == "a property name is 257 bytes; a question id is at most 256"
    for prop in (
        {"type": "string", "enum": ["a", "é" * 129]},
        {"type": "string", "oneOf": [{"const": "\n" * 129}]},
        {"type": "array", "items": {"enum": ["y" * 300]}},
    ):
        with pytest.raises(FormSchemaError) as option:
            parse_form(form(pick=prop))
        assert option.value.property == "pick"
        assert "an option id is at most 256" in option.value.reason


def test_required_name_without_a_property_is_refused() -> None:
    with pytest.raises(FormSchemaError) as caught:
        parse_form(form(["ghost"], a={"type": "string"}))
    assert caught.value.property == "ghost"
    assert "not defined in properties" in caught.value.reason


PROPERTY_REFUSALS = [
    # shape and type
    pytest.param("string", "must be a JSON object", id="property-not-an-object"),
    pytest.param(
        {"type": "object", "properties": {"a": {"type": "string"}}},
        "'type' 'object' (a nested object) is not supported",
        id="nested-object",
    ),
    pytest.param({"enum": [1, 2]}, "has no type", id="untyped-enum-of-numbers"),
    pytest.param({"enum": []}, "has no type", id="untyped-empty-enum"),
    pytest.param({"oneOf": [{"const": 1}]}, "has no type", id="untyped-one-of-numbers"),
    pytest.param({"oneOf": "x"}, "has no type", id="untyped-one-of-not-a-list"),
    pytest.param({"$ref": "#/$defs/Colour"}, "$ref is not supported", id="ref"),
    pytest.param(
        {"anyOf": [{"$ref": "#/$defs/Colour"}, {"type": "null"}]},
        "$ref is not supported",
        id="nullable-ref",
    ),
    pytest.param({"title": "No type"}, "has no type", id="missing-type"),
    pytest.param({"type": "date"}, "type 'date' is not supported", id="unknown-type"),
    pytest.param({"type": "null"}, "type 'null' is not supported", id="null-type"),
    pytest.param({"type": ["string", "integer"]}, "a type list must be", id="two-types"),
    pytest.param({"type": ["null"]}, "a type list must be", id="type-list-only-null"),
    pytest.param({"anyOf": {"type": "string"}}, "anyOf is only supported", id="any-of-not-list"),
    pytest.param(
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
        "anyOf is only supported",
        id="any-of-without-null",
    ),
    pytest.param(
        {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "integer"}]},
        "anyOf is only supported",
        id="any-of-three-branches",
    ),
    pytest.param(
        {"anyOf": ["string", {"type": "null"}]},
        "anyOf is only supported",
        id="any-of-branch-not-object",
    ),
    pytest.param(
        {"type": "string", "anyOf": [{"type": "string"}, {"type": "null"}]},
        "'type' is not supported beside a nullable anyOf",
        id="type-beside-any-of",
    ),
    pytest.param(
        {"anyOf": [{"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "null"}]},
        "has no type",
        id="nested-any-of",
    ),
    # keywords outside the subset
    pytest.param(
        {"type": "integer", "enum": [1, 2]},
        "'enum' is not supported on integer",
        id="enum-of-integers",
    ),
    pytest.param(
        {"type": "string", "multipleOf": 2},
        "'multipleOf' is not supported on text",
        id="multiple-of-on-text",
    ),
    pytest.param(
        {"type": "string", "exclusiveMinimum": 0},
        "'exclusiveMinimum' is not supported on text",
        id="exclusive-minimum-on-text",
    ),
    pytest.param({"type": "number", "multipleOf": 0}, "greater than 0", id="multiple-of-zero"),
    pytest.param(
        {"type": "number", "multipleOf": "2"}, "multipleOf must be a number", id="multiple-of-text"
    ),
    pytest.param(
        {"type": "number", "exclusiveMinimum": 5, "exclusiveMaximum": 5},
        "leave no value",
        id="empty-exclusive-range",
    ),
    pytest.param(
        {"type": "number", "exclusiveMinimum": 5, "maximum": 5},
        "leave no value",
        id="exclusive-minimum-at-the-maximum",
    ),
    pytest.param(
        {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 6},
        "leave no value",
        id="empty-integer-range",
    ),
    pytest.param({"type": "integer", "const": 2.5}, "is not an integer", id="fractional-const"),
    pytest.param({"type": "number", "const": "2"}, "is not a number", id="text-const"),
    pytest.param(
        {"type": "number", "const": 2, "default": 3}, "default is not the const", id="off-const"
    ),
    pytest.param({"type": "boolean", "const": 1}, "is not a boolean", id="boolean-const-number"),
    pytest.param(
        {"type": "boolean", "const": True, "default": False},
        "default is not the const",
        id="boolean-off-const",
    ),
    pytest.param({"type": "string", "const": 1}, "const 1 is not a string", id="string-const-int"),
    pytest.param(
        {"type": "string", "const": "a", "enum": ["a"]},
        "enum and const cannot be combined",
        id="const-and-enum",
    ),
    pytest.param(
        {"type": "number", "exclusiveMinimum": 0, "default": 0},
        "outside the exclusive bounds",
        id="default-on-exclusive-minimum",
    ),
    pytest.param(
        {"type": "number", "exclusiveMaximum": 1, "default": 1},
        "outside the exclusive bounds",
        id="default-on-exclusive-maximum",
    ),
    pytest.param(
        {"type": "number", "multipleOf": 0.5, "default": 0.7},
        "default is not a multiple of 0.5",
        id="default-off-step",
    ),
    pytest.param(
        {"type": "integer", "multipleOf": 2, "default": 3},
        "default is not a multiple of 2",
        id="integer-default-off-step",
    ),
    pytest.param(
        {"type": "number", "pattern": "x"},
        "'pattern' is not supported on number",
        id="pattern-on-number",
    ),
    pytest.param(
        {"type": "string", "format": "email", "const": "a"},
        "'format' is not supported on single-select",
        id="const-with-a-format",
    ),
    pytest.param({"type": "string", "allOf": []}, "'allOf' is not supported", id="all-of"),
    pytest.param(
        {"type": "boolean", "enum": [True]},
        "'enum' is not supported on boolean",
        id="enum-of-booleans",
    ),
    pytest.param(
        {**COLOURS, "minLength": 1},
        "'minLength' is not supported on single-select",
        id="length-on-select",
    ),
    pytest.param(
        {**TAGS, "contains": {}}, "'contains' is not supported on multi-select", id="contains"
    ),
    pytest.param(
        {"anyOf": [{"type": "string", "not": {}}, {"type": "null"}]},
        "'not' is not supported on text",
        id="nullable-text-with-one-of",
    ),
    # annotations of the wrong type
    pytest.param({"type": "string", "title": 1}, "title must be a string", id="title-not-string"),
    pytest.param(
        {"type": "string", "description": []},
        "description must be a string",
        id="description-not-string",
    ),
    pytest.param(
        {"type": "string", "pattern": 1}, "pattern must be a string", id="pattern-not-string"
    ),
    # defaults
    pytest.param(
        {"type": "string", "default": 3}, "default 3 is not a string", id="string-default-number"
    ),
    pytest.param(
        {"type": "number", "default": "3"},
        "default '3' is not a number",
        id="number-default-string",
    ),
    pytest.param(
        {"type": "number", "default": True},
        "default True is not a number",
        id="number-default-bool",
    ),
    pytest.param(
        {"type": "integer", "default": 3.5},
        "default 3.5 is not an integer",
        id="integer-default-fraction",
    ),
    pytest.param(
        {"type": "boolean", "default": "yes"},
        "default 'yes' is not a boolean",
        id="boolean-default-string",
    ),
    pytest.param(
        {"type": "string", "default": None},
        "default null does not fit a text",
        id="null-default-not-nullable",
    ),
    pytest.param(
        {**COLOURS, "default": "blue"},
        "default 'blue' is not one of the options",
        id="select-default-unknown",
    ),
    pytest.param(
        {**TAGS, "default": "a"}, "is not a list of the options", id="multi-default-not-list"
    ),
    pytest.param(
        {**TAGS, "default": ["a", "z"]}, "is not a list of the options", id="multi-default-unknown"
    ),
    pytest.param(
        {"type": "string", "minLength": 3, "default": "ab"},
        "default is below minLength 3",
        id="string-default-too-short",
    ),
    pytest.param(
        {"type": "string", "maxLength": 1, "default": "ab"},
        "default is above maxLength 1",
        id="string-default-too-long",
    ),
    pytest.param(
        {"type": "number", "minimum": 1, "default": 0},
        "default is below minimum 1",
        id="number-default-too-small",
    ),
    pytest.param(
        {"type": "integer", "maximum": 1, "default": 2},
        "default is above maximum 1",
        id="integer-default-too-big",
    ),
    pytest.param(
        {**TAGS, "minItems": 2, "default": ["a"]},
        "default is below minItems 2",
        id="multi-default-too-few",
    ),
    pytest.param(
        {**TAGS, "maxItems": 1, "default": ["a", "b"]},
        "default is above maxItems 1",
        id="multi-default-too-many",
    ),
    # bounds and formats
    pytest.param(
        {"type": "string", "format": "uuid"}, "format 'uuid' is not supported", id="unknown-format"
    ),
    pytest.param(
        {"type": "string", "format": ["email"]}, "is not supported", id="format-not-string"
    ),
    pytest.param(
        {"type": "string", "minLength": -1},
        "minLength must be a non-negative integer",
        id="negative-length",
    ),
    pytest.param(
        {"type": "string", "maxLength": 1.5},
        "maxLength must be a non-negative integer",
        id="fractional-length",
    ),
    pytest.param(
        {"type": "string", "minLength": "2"},
        "minLength must be a non-negative integer",
        id="string-length",
    ),
    pytest.param(
        {"type": "string", "minLength": True},
        "minLength must be a non-negative integer",
        id="bool-length",
    ),
    pytest.param(
        {"type": "string", "minLength": 3, "maxLength": 2},
        "minLength 3 is greater than maxLength 2",
        id="lengths-crossed",
    ),
    pytest.param(
        {"type": "number", "minimum": 3, "maximum": 2.5},
        "minimum 3 is greater than maximum 2.5",
        id="range-crossed",
    ),
    pytest.param(
        {**TAGS, "minItems": 3, "maxItems": 2},
        "minItems 3 is greater than maxItems 2",
        id="item-counts-crossed",
    ),
    pytest.param(
        {"type": "number", "minimum": "0"}, "minimum must be a number", id="minimum-string"
    ),
    pytest.param(
        {"type": "number", "maximum": math.inf}, "maximum must be a number", id="maximum-infinite"
    ),
    pytest.param(
        {**TAGS, "maxItems": -2},
        "maxItems must be a non-negative integer",
        id="negative-item-count",
    ),
    # single-select options
    pytest.param(
        {"type": "string", "enum": "red"}, "enum must be a list of strings", id="enum-not-list"
    ),
    pytest.param({"type": "string", "enum": []}, "enum must be a non-empty list", id="enum-empty"),
    pytest.param(
        {"type": "string", "enum": ["a", 1]},
        "enum must be a non-empty list of strings",
        id="enum-of-non-strings",
    ),
    pytest.param(
        {"type": "string", "enum": [None]},
        "enum must be a non-empty list of strings",
        id="enum-null-not-nullable",
    ),
    pytest.param(
        {"type": "string", "enum": ["a", "a"]}, "option 'a' is listed twice", id="enum-duplicate"
    ),
    pytest.param(
        {**COLOURS, "enumNames": ["Red"]}, "one per enum value", id="enum-names-too-short"
    ),
    pytest.param({**COLOURS, "enumNames": "Red"}, "one per enum value", id="enum-names-not-list"),
    pytest.param(
        {**COLOURS, "enumNames": ["Red", 2]}, "one per enum value", id="enum-names-not-strings"
    ),
    pytest.param(
        {**COLOURS, "oneOf": [{"const": "a"}]},
        "enum and oneOf cannot be combined",
        id="enum-and-one-of",
    ),
    pytest.param(
        {"type": "string", "oneOf": {"const": "a"}},
        "oneOf must be a non-empty list",
        id="one-of-not-list",
    ),
    pytest.param(
        {"type": "string", "oneOf": []}, "oneOf must be a non-empty list", id="one-of-empty"
    ),
    pytest.param(
        {"type": "string", "oneOf": ["a"]},
        "every oneOf entry needs a string const",
        id="one-of-entry-not-object",
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"title": "A"}]},
        "every oneOf entry needs a string const",
        id="one-of-entry-without-const",
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"const": 1}]},
        "every oneOf entry needs a string const",
        id="one-of-entry-const-not-string",
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"const": "a", "title": 1}]},
        "title must be a string",
        id="one-of-title-not-string",
    ),
    pytest.param(
        {"type": "string", "oneOf": [{"const": "a"}, {"const": "a"}]},
        "option 'a' is listed twice",
        id="one-of-duplicate",
    ),
    # multi-select items
    pytest.param(
        {"type": "array"}, "only supported with string enum items", id="array-without-items"
    ),
    pytest.param(
        {"type": "array", "items": {"type": "integer"}},
        "only supported with string enum items",
        id="array-of-integers",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "object"}},
        "only supported with string enum items",
        id="array-of-objects",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string"}},
        "items must list the options",
        id="array-of-free-strings",
    ),
    pytest.param(
        {"type": "array", "items": {"enum": ["a"], "anyOf": [{"const": "b"}]}},
        "items must list the options in one of",
        id="items-two-option-lists",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "enum": ["a"], "minLength": 1}},
        "'minLength' is not supported in multi-select items",
        id="items-extra-keyword",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string", "enum": [1]}},
        "enum must be a non-empty list of strings",
        id="items-enum-of-integers",
    ),
    pytest.param(
        {"type": "array", "items": {"anyOf": []}},
        "anyOf must be a non-empty list",
        id="items-any-of-empty",
    ),
]


@pytest.mark.parametrize(("prop", "reason"), PROPERTY_REFUSALS)
def test_property_outside_the_subset_is_refused(prop: Any, reason: str) -> None:
    with pytest.raises(FormSchemaError) as caught:
        parse_form(form(x=prop))
    assert caught.value.property == "x"
    assert reason in caught.value.reason


# ─── Errors ──────────────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("error", "text"),
    [
        pytest.param(
            FormSchemaError("x", "nested objects are not supported"),
            "property 'x': nested objects are not supported",
            id="schema-error-on-property",
        ),
        pytest.param(
            FormSchemaError(None, "properties must be a JSON object"),
            "properties must be a JSON object",
            id="schema-error-on-schema",
        ),
        pytest.param(
            FormDataError("age", "expected a finite number"),
            "property 'age': expected a finite number",
            id="data-error",
        ),
    ],
)
def test_error_message_names_property_and_reason(error: FormError, text: str) -> None:
    assert str(error) == text
    assert isinstance(error, ValueError)


# ─── Answers -> form data ────────────────────────────────────────────────────

COERCIONS = [
    pytest.param({"type": "string"}, TextValue(value="hi"), "hi", id="text"),
    pytest.param({"type": "integer"}, NumberValue(value=3), 3, id="integer"),
    pytest.param({"type": "integer"}, NumberValue(value=3.0), 3, id="integral-float-integer"),
    pytest.param({"type": "number"}, NumberValue(value=2), 2, id="number-int-stays-int"),
    pytest.param({"type": "number"}, NumberValue(value=2.5), 2.5, id="number-float"),
    pytest.param({"type": "boolean"}, BooleanValue(value=False), False, id="boolean"),
    pytest.param(COLOURS, SelectedValue(value="green"), "green", id="single-select"),
    pytest.param(TAGS, SelectedManyValue(value=["c", "a"]), ["c", "a"], id="multi-select"),
    pytest.param(TAGS, SelectedManyValue(value=[]), [], id="multi-select-none-chosen"),
]


@pytest.mark.parametrize(("prop", "value", "expected"), COERCIONS)
def test_submitted_answer_is_coerced_to_the_schema_type(
    prop: JsonObject, value: InputAnswerValue, expected: Any
) -> None:
    data = form_data_from_answers(form(x=prop), {"x": submitted(value)})
    assert data == {"x": expected}
    assert type(data["x"]) is type(expected)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(InputAnswer(state="draft", value=TextValue(value="half")), id="draft"),
        pytest.param(InputAnswer(state="skipped"), id="skipped"),
        pytest.param(None, id="missing"),
    ],
)
def test_optional_field_without_submitted_answer_is_left_out(answer: InputAnswer | None) -> None:
    answers = {} if answer is None else {"x": answer}
    assert form_data_from_answers(form(x={"type": "string"}), answers) == {}


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(InputAnswer(state="draft", value=TextValue(value="half")), id="draft"),
        pytest.param(InputAnswer(state="skipped"), id="skipped"),
        pytest.param(None, id="missing"),
    ],
)
def test_required_field_without_submitted_answer_is_refused(answer: InputAnswer | None) -> None:
    answers = {} if answer is None else {"x": answer}
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(form(["x"], x={"type": "string"}), answers)
    assert caught.value.property == "x"
    assert "required" in caught.value.reason


def test_unanswered_nullable_listed_field_is_sent_as_null() -> None:
    schema = form(["x"], x={"type": ["string", "null"]})
    answers = {"x": InputAnswer(state="skipped")}
    assert form_data_from_answers(schema, answers) == {"x": None}


def test_form_data_follows_field_order() -> None:
    schema = form(b={"type": "boolean"}, a={"type": "string"})
    answers = {"a": submitted(TextValue(value="x")), "b": submitted(BooleanValue(value=True))}
    assert list(form_data_from_answers(schema, answers)) == ["b", "a"]


def test_parsed_spec_is_accepted_in_place_of_the_schema() -> None:
    spec = parse_form(form(x={"type": "integer"}))
    assert form_data_from_answers(spec, {"x": submitted(NumberValue(value=1.0))}) == {"x": 1}


COERCION_FAILURES = [
    pytest.param(
        {"type": "integer"}, NumberValue(value=3.5), "expected an integer", id="fractional-integer"
    ),
    pytest.param(
        {"type": "integer"},
        NumberValue(value=math.inf),
        "expected a finite number",
        id="infinite-integer",
    ),
    pytest.param(
        {"type": "number"}, NumberValue(value=math.nan), "expected a finite number", id="nan-number"
    ),
    pytest.param(
        {"type": "number"}, NumberValue(value=True), "expected a finite number", id="bool-as-number"
    ),
    pytest.param(
        {"type": "string"},
        NumberValue(value=1),
        "expected a text answer, got a number answer",
        id="number-for-string",
    ),
    pytest.param(
        {"type": "number"},
        TextValue(value="1"),
        "expected a number answer, got a text answer",
        id="text-for-number",
    ),
    pytest.param(
        {"type": "integer"},
        BooleanValue(value=True),
        "expected a number answer, got a boolean answer",
        id="boolean-for-integer",
    ),
    pytest.param(
        {"type": "boolean"},
        SelectedValue(value="yes"),
        "expected a boolean answer, got a selected answer",
        id="selected-for-boolean",
    ),
    pytest.param(
        COLOURS,
        TextValue(value="red"),
        "expected a selected answer, got a text answer",
        id="text-for-single-select",
    ),
    pytest.param(
        COLOURS,
        SelectedManyValue(value=["red"]),
        "expected a selected answer, got a selected-many answer",
        id="many-for-single-select",
    ),
    pytest.param(
        TAGS,
        SelectedValue(value="a"),
        "expected a selected-many answer, got a selected answer",
        id="one-for-multi-select",
    ),
    pytest.param(
        COLOURS, SelectedValue(value="blue"), "not one of the options", id="unknown-option"
    ),
    pytest.param(
        TAGS, SelectedManyValue(value=["a", "z"]), "not one of the options", id="unknown-options"
    ),
    pytest.param(
        COLOURS,
        SelectedValue(value="red", freeform_values=["pink"]),
        "does not accept freeform input",
        id="single-freeform-not-allowed",
    ),
    pytest.param(
        TAGS,
        SelectedManyValue(value=["a"], freeform_values=["pink"]),
        "does not accept freeform input",
        id="multi-freeform-not-allowed",
    ),
]


@pytest.mark.parametrize(("prop", "value", "reason"), COERCION_FAILURES)
def test_answer_that_cannot_be_coerced_is_refused(
    prop: JsonObject, value: InputAnswerValue, reason: str
) -> None:
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(form(x=prop), {"x": submitted(value)})
    assert caught.value.property == "x"
    assert reason in caught.value.reason


def test_answer_to_an_unknown_question_is_refused() -> None:
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(form(x={"type": "string"}), {"y": submitted(TextValue(value="v"))})
    assert caught.value.property == "y"
    assert "does not have" in caught.value.reason


def test_submitted_answer_without_a_value_is_refused() -> None:
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(form(x={"type": "string"}), {"x": InputAnswer(state="submitted")})
    assert caught.value.property == "x"
    assert "has no value" in caught.value.reason


def test_data_error_never_repeats_the_answer_value() -> None:
    secret = "hunter2-secret"
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(form(x=COLOURS), {"x": submitted(SelectedValue(value=secret))})
    assert secret not in str(caught.value)


FREEFORM = [
    pytest.param(
        COLOURS,
        SelectedValue(value="", freeform_values=["pink"]),
        "pink",
        id="single-freeform-wins",
    ),
    pytest.param(
        COLOURS,
        SelectedValue(value="red", freeform_values=[]),
        "red",
        id="single-option-without-freeform",
    ),
    pytest.param(COLOURS, SelectedValue(value="teal"), "teal", id="single-value-outside-options"),
    pytest.param(
        TAGS,
        SelectedManyValue(value=["a"], freeform_values=["x", "y"]),
        ["a", "x", "y"],
        id="multi-options-then-freeform",
    ),
    pytest.param(
        TAGS, SelectedManyValue(value=["a", "q"]), ["a", "q"], id="multi-ids-outside-options"
    ),
]


@pytest.mark.parametrize(("prop", "value", "expected"), FREEFORM)
def test_freeform_question_takes_typed_values(
    prop: JsonObject, value: InputAnswerValue, expected: Any
) -> None:
    spec = with_freeform(form(x=prop))
    assert form_data_from_answers(spec, {"x": submitted(value)}) == {"x": expected}


def test_single_select_takes_at_most_one_freeform_value() -> None:
    spec = with_freeform(form(x=COLOURS))
    value = SelectedValue(value="", freeform_values=["pink", "teal"])
    with pytest.raises(FormDataError) as caught:
        form_data_from_answers(spec, {"x": submitted(value)})
    assert caught.value.property == "x"
    assert "at most one freeform value" in caught.value.reason


# ─── Form data -> answers ────────────────────────────────────────────────────

PREFILLS = [
    pytest.param({"type": "string"}, "hi", TextValue(value="hi"), id="text"),
    pytest.param({"type": "integer"}, 4.0, NumberValue(value=4), id="integral-float-integer"),
    pytest.param({"type": "number"}, 0.25, NumberValue(value=0.25), id="number"),
    pytest.param({"type": "boolean"}, True, BooleanValue(value=True), id="boolean"),
    pytest.param(COLOURS, "red", SelectedValue(value="red"), id="single-select"),
    pytest.param(TAGS, ["b"], SelectedManyValue(value=["b"]), id="multi-select"),
]


@pytest.mark.parametrize(("prop", "item", "value"), PREFILLS)
def test_form_data_becomes_submitted_answer(
    prop: JsonObject, item: Any, value: InputAnswerValue
) -> None:
    assert answers_from_form_data(form(x=prop), {"x": item}) == {"x": submitted(value)}


def test_null_for_nullable_field_becomes_skipped_answer() -> None:
    schema = form(x={"type": ["string", "null"]})
    assert answers_from_form_data(schema, {"x": None}) == {"x": InputAnswer(state="skipped")}


def test_absent_field_gets_no_answer() -> None:
    assert answers_from_form_data(form(["x"], x={"type": "string"}), {}) == {}


def test_freeform_data_becomes_freeform_values() -> None:
    spec = with_freeform(form(one=COLOURS, many=TAGS))
    assert answers_from_form_data(spec, {"one": "pink", "many": ["a", "x"]}) == {
        "one": submitted(SelectedValue(value="", freeform_values=["pink"])),
        "many": submitted(SelectedManyValue(value=["a"], freeform_values=["x"])),
    }


PREFILL_FAILURES = [
    pytest.param({"type": "string"}, 3, "expected a string", id="number-for-text"),
    pytest.param({"type": "string"}, None, "null is only allowed", id="null-not-nullable"),
    pytest.param({"type": "integer"}, 3.5, "expected an integer", id="fractional-integer"),
    pytest.param({"type": "integer"}, True, "expected a finite number", id="bool-for-integer"),
    pytest.param({"type": "number"}, "1", "expected a finite number", id="string-for-number"),
    pytest.param({"type": "boolean"}, 1, "expected a boolean", id="int-for-boolean"),
    pytest.param(COLOURS, 1, "expected an option id", id="int-for-single-select"),
    pytest.param(COLOURS, "blue", "not one of the options", id="unknown-option"),
    pytest.param(TAGS, "a", "expected a list of option ids", id="string-for-multi-select"),
    pytest.param(TAGS, ["a", 1], "expected a list of option ids", id="non-string-item"),
    pytest.param(TAGS, ["a", "z"], "not one of the options", id="unknown-options"),
]


@pytest.mark.parametrize(("prop", "item", "reason"), PREFILL_FAILURES)
def test_form_data_that_does_not_fit_is_refused(prop: JsonObject, item: Any, reason: str) -> None:
    with pytest.raises(FormDataError) as caught:
        answers_from_form_data(form(x=prop), {"x": item})
    assert caught.value.property == "x"
    assert reason in caught.value.reason


def test_form_data_for_an_unknown_property_is_refused() -> None:
    with pytest.raises(FormDataError) as caught:
        answers_from_form_data(form(x={"type": "string"}), {"y": "v"})
    assert caught.value.property == "y"
    assert "not a property of this form" in caught.value.reason


# ─── Round trips ─────────────────────────────────────────────────────────────

EVERY_KIND = form(
    ["name", "age", "tier", "maybe"],
    name={"type": "string", "title": "Name", "minLength": 1, "format": "email"},
    age={"type": "integer", "minimum": 0},
    ratio={"type": "number"},
    agree={"type": "boolean", "default": False},
    colour={**COLOURS, "enumNames": ["Red", "Green"]},
    tier={"type": "string", "oneOf": [{"const": "gold", "title": "Gold"}, {"const": "free"}]},
    tags=TAGS,
    labels={"type": "array", "items": {"anyOf": [{"const": "x", "title": "X"}]}},
    nick={"anyOf": [{"type": "string"}, {"type": "null"}]},
    maybe={"type": ["integer", "null"]},
)

EVERY_KIND_DATA = {
    "name": "a@b.c",
    "age": 41,
    "ratio": 0.5,
    "agree": True,
    "colour": "green",
    "tier": "free",
    "tags": ["c", "a"],
    "labels": ["x"],
    "nick": "al",
    "maybe": None,
}


def test_form_data_round_trips_through_answers_for_every_field_kind() -> None:
    answers = answers_from_form_data(EVERY_KIND, EVERY_KIND_DATA)
    assert form_data_from_answers(EVERY_KIND, answers) == EVERY_KIND_DATA


TEXTS = st.text(max_size=8)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def options(draw: st.DrawFn) -> list[str]:
    return draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=5, unique=True))


@st.composite
def option_list_schema(draw: st.DrawFn, values: list[str], *, for_items: bool) -> JsonObject:
    style = draw(st.sampled_from(["enum", "enumNames", "anyOf" if for_items else "oneOf"]))
    if style == "enum":
        return {"enum": values}
    if style == "enumNames":
        return {"enum": values, "enumNames": [v.upper() for v in values]}
    return {style: [{"const": v, "title": v.title()} for v in values]}


@st.composite
def property_schemas(draw: st.DrawFn) -> JsonObject:
    kind = draw(st.sampled_from(["text", "number", "integer", "boolean", "single", "multi"]))
    prop: JsonObject
    if kind == "text":
        low = draw(st.none() | st.integers(0, 3))
        high = draw(st.none() | st.integers(low or 0, 8))
        prop = {"type": "string", "minLength": low, "maxLength": high}
        prop["format"] = draw(st.none() | st.sampled_from(["email", "uri", "date", "date-time"]))
        prop["pattern"] = draw(st.none() | st.just(".*"))
        prop["default"] = draw(st.none() | st.text(min_size=low or 0, max_size=high))
    elif kind == "integer":
        low = draw(st.none() | st.integers(-100, 100))
        high = draw(st.none() | st.integers(-100 if low is None else low, 100))
        prop = {"type": "integer", "minimum": low, "maximum": high}
        prop["default"] = draw(st.none() | st.integers(low, high))
    elif kind == "number":
        bottom = draw(st.none() | FINITE)
        top = draw(st.none() | st.floats(bottom, allow_nan=False, allow_infinity=False))
        prop = {"type": "number", "minimum": bottom, "maximum": top}
        prop["default"] = draw(
            st.none() | st.floats(bottom, top, allow_nan=False, allow_infinity=False)
        )
    elif kind == "boolean":
        prop = {"type": "boolean", "default": draw(st.none() | st.booleans())}
    elif kind == "single":
        values = draw(options())
        prop = {"type": "string", **draw(option_list_schema(values, for_items=False))}
        prop["default"] = draw(st.none() | st.sampled_from(values))
    else:
        values = draw(options())
        items = {"type": "string", **draw(option_list_schema(values, for_items=True))}
        low = draw(st.none() | st.integers(0, len(values)))
        high = draw(st.none() | st.integers(low or 0, len(values)))
        prop = {"type": "array", "items": items, "minItems": low, "maxItems": high}
        prop["default"] = draw(
            st.none()
            | st.lists(st.sampled_from(values), min_size=low or 0, max_size=high, unique=True)
        )
    prop["title"] = draw(st.none() | TEXTS)
    prop["description"] = draw(st.none() | TEXTS)
    prop = {key: value for key, value in prop.items() if value is not None}
    if draw(st.booleans()):
        return prop
    if draw(st.booleans()):
        return {"anyOf": [prop, {"type": "null"}]}
    nullable = {**prop, "type": [prop["type"], "null"]}
    if "enum" in prop:
        nullable["enum"] = [*prop["enum"], None]  # or null fails the enum
        if "enumNames" in prop:
            nullable["enumNames"] = [*prop["enumNames"], "None"]
    return nullable


NAMES = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=6)


@st.composite
def form_schemas(draw: st.DrawFn) -> JsonObject:
    properties = draw(st.dictionaries(NAMES, property_schemas(), max_size=6))
    required = (
        draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
    )
    return {"type": "object", "properties": properties, "required": required}


def field_values(field: FormField) -> st.SearchStrategy[Any]:
    question = field.question
    match question:
        case TextQuestion():
            return st.text(min_size=question.min or 0, max_size=question.max)
        case IntegerQuestion():
            return st.integers(whole(question.min), whole(question.max))
        case NumberQuestion():
            return st.floats(question.min, question.max, allow_nan=False, allow_infinity=False)
        case BooleanQuestion():
            return st.booleans()
        case SingleSelectQuestion():
            return st.sampled_from(field.enum or ())
        case MultiSelectQuestion():
            return st.lists(
                st.sampled_from(field.enum or ()),
                min_size=question.min or 0,
                max_size=question.max,
                unique=True,
            )
        case _:
            assert_never(question)


def whole(bound: float | None) -> int | None:
    return None if bound is None else int(bound)


@st.composite
def forms_with_data(draw: st.DrawFn) -> tuple[JsonObject, JsonObject]:
    schema = draw(form_schemas())
    data: JsonObject = {}
    for field in parse_form(schema).fields:
        values = field_values(field)
        if field.null_if_unanswered:
            values = st.none() | values
        if field.required or field.null_if_unanswered or draw(st.booleans()):
            data[field.name] = draw(values)
    return schema, data


@settings(deadline=None)
@given(forms_with_data())
def test_valid_form_data_round_trips_through_answers(case: tuple[JsonObject, JsonObject]) -> None:
    schema, data = case
    assert form_data_from_answers(schema, answers_from_form_data(schema, data)) == data


@settings(deadline=None)
@given(forms_with_data())
def test_form_data_from_answers_satisfies_the_schema(case: tuple[JsonObject, JsonObject]) -> None:
    schema, data = case
    jsonschema.Draft202012Validator.check_schema(schema)
    answers = answers_from_form_data(schema, data)
    jsonschema.validate(form_data_from_answers(schema, answers), schema)
