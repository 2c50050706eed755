"""Flat JSON Schema forms <-> AHP input-request questions and answers.

A form is MCP elicitation's restricted ``requestedSchema``: a top-level
``{"type": "object", "properties": {...}, "required": [...]}`` whose
properties are flat primitives. :func:`parse_form` checks a schema against
that subset once and returns a frozen :class:`FormSpec`; the questions of an
``InputRequest`` come from it, and submitted answers go back through
:func:`form_data_from_answers` to form data typed as the schema says.

Mapping rules (question id = property name, property order kept)::

    property schema                                   question
    ------------------------------------------------  ------------------------------------
    string (minLength, maxLength, format, default)    text (min, max, format, defaultValue)
    number / integer (minimum, maximum, default)      number / integer (min, max, defaultValue)
      exclusiveMinimum / exclusiveMaximum             integer: min / max one step inside;
                                                      number: min / max, and the message
                                                      says "more than" / "less than"
      multipleOf                                      the message says "a multiple of"
      const                                           min = max = defaultValue = const
    boolean (default; const)                          boolean (defaultValue; const)
    string + enum (+ enumNames) | oneOf [{const}]     single-select; default -> recommended
    string + const                                    single-select of that one option
    array, items enum | anyOf/oneOf [{const}]         multi-select (min/max from min/maxItems);
                                                      each default item -> recommended
    title / description                               title / message (message falls back
                                                      to the title, then the property name)
    listed in ``required``                            required: true

A select may leave out ``type`` (``{"title": ..., "oneOf": [...]}``, an
``enum`` or a ``const`` of strings): it is a string. ``default`` may sit on
every kind, and must fit the property's rules (exclusive bounds,
``multipleOf`` and ``const`` included).

Lenient, because MCP servers send these in practice: ``anyOf: [T, {"type":
"null"}]`` (only annotations beside it) and ``type: [T, "null"]`` make a
nullable T that is never a required question (a select with a type list is
nullable only when its enum lists null too, as JSON Schema would have it); a
nullable property listed in ``required`` is sent as ``None`` when nobody
answers it, so that the data still satisfies the schema; ``default: null``
on a nullable property means no default; ``pattern`` on strings is kept on
the :class:`FormField` (AHP's text question has no pattern field); no
properties is a plain confirm; the top-level ``type`` may be missing when
``properties`` is present. Keywords
that do not constrain values (``$schema``, ``examples``, ``x-*`` ...) are
ignored, as JSON Schema validators ignore them. Every other validation
keyword outside the subset (``$ref``, nested objects, ``allOf``, ``not``
...) is refused, naming the keyword, because the people answering could not
see the rule that the frozen schema will enforce. (The rules the subset
takes beyond AHP's question fields, ``multipleOf`` and exclusive bounds of
numbers, are written into the question's message for that reason.)

Exceptions::

    ValueError
    └── FormError              property (None: the schema as a whole), reason
        ├── FormSchemaError    the schema is outside the subset
        └── FormDataError      answers or data do not fit the form

A :class:`FormDataError` reason never contains an answer value, so it is safe
to log (form data can be sensitive).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, TypeAlias, TypedDict, TypeVar, assert_never

import msgspec

from protocol.chat import (
    AnswerValue,
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
from protocol.wire import MAX_ID_BYTES

JsonType: TypeAlias = Literal["string", "number", "integer", "boolean", "array"]
Kind: TypeAlias = Literal["text", "number", "integer", "boolean", "single-select", "multi-select"]

TEXT_FORMATS = ("email", "uri", "date", "date-time")
"""The string formats MCP elicitation allows; AHP passes them on as hints."""

# Every JSON Schema keyword that changes what validates. A keyword in here that
# the subset does not interpret where it appears is refused; anything else is
# an annotation and is ignored.
_VALIDATION_KEYWORDS = frozenset(
    {
        "$ref", "$dynamicRef", "$recursiveRef", "allOf", "anyOf", "oneOf", "not", "if",
        "then", "else", "dependentSchemas", "dependencies", "prefixItems", "items",
        "additionalItems", "contains", "properties", "patternProperties",
        "additionalProperties", "propertyNames", "unevaluatedItems", "unevaluatedProperties",
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems",
        "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties",
        "minProperties", "required", "dependentRequired",
    }
)  # fmt: skip

_NUMBER_KEYWORDS = frozenset(
    {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "const"}
)
_TOP_LEVEL_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})
_ITEMS_KEYWORDS = frozenset({"type", "enum", "anyOf", "oneOf"})
_KIND_KEYWORDS: dict[Kind, frozenset[str]] = {
    "text": frozenset({"type", "minLength", "maxLength", "format", "pattern"}),
    "number": frozenset(
        {
            "type",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
            "const",
        }
    ),
    "integer": frozenset(
        {
            "type",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
            "const",
        }
    ),
    "boolean": frozenset({"type", "const"}),
    "single-select": frozenset({"type", "enum", "oneOf", "const"}),
    "multi-select": frozenset({"type", "items", "minItems", "maxItems", "uniqueItems"}),
}
_JSON_TYPES: tuple[JsonType, ...] = ("string", "number", "integer", "boolean", "array")

# ─── Errors ──────────────────────────────────────────────────────────────────


class FormError(ValueError):
    """A form problem. ``property`` is the property at fault, or ``None``
    when the problem is the schema as a whole; ``reason`` says why."""

    def __init__(self, property: str | None, reason: str) -> None:
        super().__init__(property, reason)
        self.property = property
        self.reason = reason

    def __str__(self) -> str:
        if self.property is None:
            return self.reason
        return f"property {self.property!r}: {self.reason}"


class FormSchemaError(FormError):
    """The schema is outside the flat form subset; nothing can be asked."""


class FormDataError(FormError):
    """Answers or form data do not fit the form's types or options."""


# ─── The parsed form ─────────────────────────────────────────────────────────


class FormField(msgspec.Struct, frozen=True, kw_only=True):
    """One property of a form, checked against the subset.

    ``required`` is true when the property is listed in ``required`` and is
    not nullable; ``null_if_unanswered`` is true for a nullable property
    that is listed in ``required``: the schema needs the key, so form data
    carries ``None`` for it when nobody submitted an answer. ``pattern`` is
    the property's ``pattern``, unchecked here (AHP has no field for it).
    ``enum`` is the option ids of a select, in order, else ``None``.
    """

    name: str
    json_type: JsonType
    question: InputQuestion
    required: bool = False
    nullable: bool = False
    null_if_unanswered: bool = False
    pattern: str | None = None
    enum: tuple[str, ...] | None = None


class FormSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A form checked against the subset: its fields in property order.

    Build it with :func:`parse_form`; pass it (or the schema) to
    :func:`form_data_from_answers` and :func:`answers_from_form_data`.
    """

    fields: tuple[FormField, ...] = ()

    @property
    def questions(self) -> list[InputQuestion]:
        """The AHP questions, one per field in order (a new list each call)."""
        return [field.question for field in self.fields]

    def field(self, name: str) -> FormField | None:
        """The field of property ``name``, or ``None``."""
        return next((field for field in self.fields if field.name == name), None)


# ─── Schema -> questions ─────────────────────────────────────────────────────


def parse_form(schema: Mapping[str, Any]) -> FormSpec:
    """Check ``schema`` against the flat form subset and describe it.

    Raises :class:`FormSchemaError` for anything outside the subset; the
    returned spec is frozen and safe to share.
    """
    if not isinstance(schema, Mapping):
        raise FormSchemaError(None, "the schema must be a JSON object")
    properties = schema.get("properties")
    if "type" in schema:
        if schema["type"] != "object":
            raise FormSchemaError(None, "the schema's type must be 'object'")
    elif properties is None:
        raise FormSchemaError(None, "the schema needs type 'object' or properties")
    _refuse_keywords(None, schema, _TOP_LEVEL_KEYWORDS, "at the top level")
    if properties is None:
        properties = {}
    if not isinstance(properties, Mapping):
        raise FormSchemaError(None, "properties must be a JSON object")
    for name in properties:
        if (size := _id_bytes(name)) > MAX_ID_BYTES:
            raise FormSchemaError(
                None, f"a property name is {size:,} bytes; a question id is at most {MAX_ID_BYTES}"
            )
    required = _required_names(schema.get("required", []), properties)
    return FormSpec(
        fields=tuple(
            _parse_property(name, prop, name in required) for name, prop in properties.items()
        )
    )


def questions_from_schema(schema: Mapping[str, Any]) -> list[InputQuestion]:
    """The AHP questions for ``schema``: ``parse_form(schema).questions``."""
    return parse_form(schema).questions


def _required_names(required: Any, properties: Mapping[str, Any]) -> frozenset[str]:
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise FormSchemaError(None, "required must be a list of property names")
    for name in required:
        if name not in properties:
            raise FormSchemaError(name, "listed in required but not defined in properties")
    return frozenset(required)


class _Head(TypedDict):
    """The fields every question has."""

    id: str
    title: str | None
    message: str
    required: bool | None


class _Choice(NamedTuple):
    id: str
    label: str
    description: str | None


def _parse_property(name: str, raw: Any, listed_required: bool) -> FormField:
    if not isinstance(raw, Mapping):
        raise FormSchemaError(name, "the property schema must be a JSON object")
    prop, wrapped = _unwrap_nullable(name, raw)
    if "$ref" in prop:
        raise FormSchemaError(name, "$ref is not supported: inline the definition")
    json_type, null_in_type = _property_type(name, prop)
    kind = _kind(json_type, prop)
    if kind == "single-select" and null_in_type:
        # With type [string, null] the options still apply to null: null is
        # allowed only when the enum lists it too (never with oneOf consts).
        enum = prop.get("enum")
        null_in_type = isinstance(enum, list) and None in enum
    nullable = wrapped or null_in_type
    _refuse_keywords(name, prop, _KIND_KEYWORDS[kind], f"on {kind} properties")
    title = _optional_str(name, prop, "title")
    description = _optional_str(name, prop, "description")
    required = listed_required and not nullable
    head = _Head(
        id=name,
        title=title,
        message=description or title or name,
        required=True if required else None,
    )
    if prop.get("default", ...) is None and not nullable:
        raise FormSchemaError(name, f"default null does not fit a {kind} property")
    question, enum = _build_question(name, kind, prop, head, prop.get("default"), nullable)
    pattern = prop.get("pattern")
    if pattern is not None and not isinstance(pattern, str):
        raise FormSchemaError(name, "pattern must be a string")
    return FormField(
        name=name,
        json_type=json_type,
        question=question,
        required=required,
        nullable=nullable,
        null_if_unanswered=listed_required and nullable,
        pattern=pattern,
        enum=enum,
    )


def _unwrap_nullable(name: str, raw: Mapping[str, Any]) -> tuple[Mapping[str, Any], bool]:
    """``anyOf: [T, {"type": "null"}]`` -> (T with the outer keywords, True)."""
    branches = raw.get("anyOf")
    if branches is None:
        return raw, False
    if (
        not isinstance(branches, list)
        or len(branches) != 2
        or not all(isinstance(branch, Mapping) for branch in branches)
        or [branch.get("type") for branch in branches].count("null") != 1
    ):
        raise FormSchemaError(name, 'anyOf is only supported as [T, {"type": "null"}]')
    outer = {key: value for key, value in raw.items() if key != "anyOf"}
    # A rule beside anyOf would apply to null as well; only annotations
    # (title, description, default ...) may sit there, as pydantic puts them.
    _refuse_keywords(name, outer, frozenset(), "beside a nullable anyOf")
    inner = next(branch for branch in branches if branch.get("type") != "null")
    return {**inner, **outer}, True


def _property_type(name: str, prop: Mapping[str, Any]) -> tuple[JsonType, bool]:
    """The property's JSON type, and whether ``type`` also allows null."""
    declared = prop.get("type")
    nullable = False
    if isinstance(declared, list):
        others = [item for item in declared if item != "null"]
        nullable = len(others) < len(declared)
        if len(others) != 1:
            raise FormSchemaError(name, "a type list must be one type, optionally with 'null'")
        declared = others[0]
    if declared is None and _string_select(prop):
        declared = "string"  # a select with options but no type
    if declared is None:
        raise FormSchemaError(name, "the property has no type")
    if declared == "object":
        raise FormSchemaError(name, "'type' 'object' (a nested object) is not supported")
    for json_type in _JSON_TYPES:
        if declared == json_type:
            return json_type, nullable
    raise FormSchemaError(name, f"type {declared!r} is not supported")


def _string_select(prop: Mapping[str, Any]) -> bool:
    """Whether a property without ``type`` lists string options."""
    if isinstance(prop.get("const"), str):
        return True
    enum, one_of = prop.get("enum"), prop.get("oneOf")
    if isinstance(enum, list) and enum and all(isinstance(value, str) for value in enum):
        return True
    return (
        isinstance(one_of, list)
        and bool(one_of)
        and all(isinstance(e, Mapping) and isinstance(e.get("const"), str) for e in one_of)
    )


def _kind(json_type: JsonType, prop: Mapping[str, Any]) -> Kind:
    if json_type == "string":
        selects = "enum" in prop or "oneOf" in prop or "const" in prop
        return "single-select" if selects else "text"
    if json_type == "array":
        return "multi-select"
    return json_type


def _build_question(
    name: str,
    kind: Kind,
    prop: Mapping[str, Any],
    head: _Head,
    default: Any,
    nullable: bool,
) -> tuple[InputQuestion, tuple[str, ...] | None]:
    match kind:
        case "text":
            return _text_question(name, prop, head, default), None
        case "number" | "integer":
            return _number_question(name, kind, prop, head, default), None
        case "boolean":
            if default is not None and not isinstance(default, bool):
                raise FormSchemaError(name, f"default {default!r} is not a boolean")
            const = prop.get("const", ...)
            if const is not ...:
                if not isinstance(const, bool):
                    raise FormSchemaError(name, f"const {const!r} is not a boolean")
                if default is not None and default != const:
                    raise FormSchemaError(name, "default is not the const")
                default = const
            return BooleanQuestion(**head, default_value=default), None
        case "single-select":
            return _single_select_question(name, prop, head, default, nullable)
        case "multi-select":
            return _multi_select_question(name, prop, head, default)
        case _:
            assert_never(kind)


def _text_question(name: str, prop: Mapping[str, Any], head: _Head, default: Any) -> TextQuestion:
    text_format = prop.get("format")
    if text_format is not None and text_format not in TEXT_FORMATS:
        raise FormSchemaError(
            name, f"format {text_format!r} is not supported (email, uri, date, date-time)"
        )
    low = _count(name, prop, "minLength")
    high = _count(name, prop, "maxLength")
    _check_order(name, "minLength", low, "maxLength", high)
    if default is not None:
        if not isinstance(default, str):
            raise FormSchemaError(name, f"default {default!r} is not a string")
        _check_default_within(name, len(default), "minLength", low, "maxLength", high)
    return TextQuestion(**head, format=text_format, min=low, max=high, default_value=default)


def _number_question(
    name: str,
    kind: Literal["number", "integer"],
    prop: Mapping[str, Any],
    head: _Head,
    default: Any,
) -> NumberQuestion | IntegerQuestion:
    integral = kind == "integer"
    rules = _number_rules(name, prop, integral)
    const = prop.get("const", ...)
    if const is not ...:
        if not _is_number(const) or (integral and not _is_integral(const)):
            raise FormSchemaError(name, f"const {const!r} is not {_a(kind)}")
        if default is not None and default != const:
            raise FormSchemaError(name, "default is not the const")
        default = int(const) if integral else const
        rules = rules._replace(low=default, high=default)
    _check_order(name, "minimum", rules.low, "maximum", rules.high)
    if default is not None:
        if not _is_number(default):
            raise FormSchemaError(name, f"default {default!r} is not a number")
        if integral:
            if not _is_integral(default):
                raise FormSchemaError(name, f"default {default!r} is not an integer")
            default = int(default)
        _check_default_within(name, default, "minimum", rules.low, "maximum", rules.high)
        rules.check_default(name, default)
    if rules.notes:
        head = _Head(**{**head, "message": f"{head['message']} ({'; '.join(rules.notes)})"})
    if integral:
        return IntegerQuestion(**head, min=rules.low, max=rules.high, default_value=default)
    return NumberQuestion(**head, min=rules.low, max=rules.high, default_value=default)


class _NumberRules(NamedTuple):
    """A number property's rules as a question can hold them: inclusive
    bounds, and notes for the message about what AHP has no field for."""

    low: int | float | None
    high: int | float | None
    above: int | float | None
    below: int | float | None
    step: int | float | None
    notes: tuple[str, ...]

    def check_default(self, name: str, default: int | float) -> None:
        outside_above = self.above is not None and default <= self.above
        if outside_above or (self.below is not None and default >= self.below):
            raise FormSchemaError(name, "default is outside the exclusive bounds")
        if self.step is not None and not _is_multiple(default, self.step):
            raise FormSchemaError(name, f"default is not a multiple of {_number_text(self.step)}")


def _number_rules(name: str, prop: Mapping[str, Any], integral: bool) -> _NumberRules:
    low = _schema_number(name, prop, "minimum")
    high = _schema_number(name, prop, "maximum")
    notes: list[str] = []
    # An integer's exclusive bound is an inclusive one a step inside; a
    # number's can only be told.
    above = _schema_number(name, prop, "exclusiveMinimum")
    if above is not None:
        inside = math.floor(above) + 1 if integral else above
        low = inside if low is None else max(low, inside)
        if not integral:
            notes.append(f"more than {_number_text(above)}")
    below = _schema_number(name, prop, "exclusiveMaximum")
    if below is not None:
        inside = math.ceil(below) - 1 if integral else below
        high = inside if high is None else min(high, inside)
        if not integral:
            notes.append(f"less than {_number_text(below)}")
    empty_above = above is not None and high is not None and high <= above
    if empty_above or (below is not None and low is not None and low >= below):
        raise FormSchemaError(name, "the exclusive bounds leave no value to choose")
    step = _schema_number(name, prop, "multipleOf")
    if step is not None:
        if step <= 0:
            raise FormSchemaError(name, "multipleOf must be greater than 0")
        if not (integral and step == 1):
            notes.append(f"a multiple of {_number_text(step)}")
    return _NumberRules(low, high, above, below, step, tuple(notes))


def _a(kind: str) -> str:
    return "an integer" if kind == "integer" else "a number"


def _number_text(value: int | float) -> str:
    """A bound as people read it: ``0.5``, ``3`` (not ``3.0``)."""
    return str(int(value)) if _is_integral(value) and abs(value) < 2**53 else repr(value)


def _is_multiple(value: int | float, step: int | float) -> bool:
    """Whether ``value`` is a multiple of ``step``, within float rounding."""
    if isinstance(value, int) and isinstance(step, int):
        return value % step == 0
    quotient = value / step
    return math.isclose(quotient, round(quotient), rel_tol=1e-9, abs_tol=1e-9)


def _single_select_question(
    name: str, prop: Mapping[str, Any], head: _Head, default: Any, nullable: bool
) -> tuple[SingleSelectQuestion, tuple[str, ...]]:
    listed = [keyword for keyword in ("enum", "oneOf", "const") if keyword in prop]
    if len(listed) > 1:
        raise FormSchemaError(name, f"{' and '.join(listed)} cannot be combined")
    if "enum" in prop:
        choices = _enum_choices(name, prop, drop_null=nullable)
    elif "oneOf" in prop:
        choices = _const_choices(name, prop["oneOf"], "oneOf")
    else:
        const = prop["const"]
        if not isinstance(const, str):
            raise FormSchemaError(name, f"const {const!r} is not a string")
        label = _optional_str(name, prop, "title") or const
        choices = [_Choice(const, label, None)]
    ids = tuple(choice.id for choice in choices)
    if default is not None and default not in ids:
        raise FormSchemaError(name, f"default {default!r} is not one of the options")
    options = _options(choices, {default})
    return SingleSelectQuestion(**head, options=options), ids


def _multi_select_question(
    name: str, prop: Mapping[str, Any], head: _Head, default: Any
) -> tuple[MultiSelectQuestion, tuple[str, ...]]:
    items = prop.get("items")
    if not isinstance(items, Mapping) or items.get("type", "string") != "string":
        raise FormSchemaError(name, "arrays are only supported with string enum items")
    _refuse_keywords(name, items, _ITEMS_KEYWORDS, "in multi-select items")
    listed = [keyword for keyword in ("enum", "anyOf", "oneOf") if keyword in items]
    if len(listed) != 1:
        raise FormSchemaError(name, "items must list the options in one of enum, anyOf or oneOf")
    if listed[0] == "enum":
        choices = _enum_choices(name, items, drop_null=False)
    else:
        choices = _const_choices(name, items[listed[0]], listed[0])
    ids = tuple(choice.id for choice in choices)
    low = _count(name, prop, "minItems")
    high = _count(name, prop, "maxItems")
    _check_order(name, "minItems", low, "maxItems", high)
    defaults: list[str] = []
    if default is not None:
        if not isinstance(default, list) or not all(item in ids for item in default):
            raise FormSchemaError(name, f"default {default!r} is not a list of the options")
        _check_default_within(name, len(default), "minItems", low, "maxItems", high)
        defaults = default
    question = MultiSelectQuestion(
        **head, options=_options(choices, set(defaults)), min=low, max=high
    )
    return question, ids


def _enum_choices(name: str, holder: Mapping[str, Any], *, drop_null: bool) -> list[_Choice]:
    values = holder["enum"]
    if not isinstance(values, list):
        raise FormSchemaError(name, "enum must be a list of strings")
    labels = holder.get("enumNames", values)
    if not isinstance(labels, list) or len(labels) != len(values):
        raise FormSchemaError(name, "enumNames must be a list of strings, one per enum value")
    # A nullable select lists null among its values (type [string, null] needs
    # it there for null to validate); null is the unanswered state, not an option.
    pairs = [
        (v, label)
        for v, label in zip(values, labels, strict=True)
        if v is not None or not drop_null
    ]
    if not pairs or not all(isinstance(value, str) for value, _ in pairs):
        raise FormSchemaError(name, "enum must be a non-empty list of strings")
    if not all(isinstance(label, str) for _, label in pairs):
        raise FormSchemaError(name, "enumNames must be a list of strings, one per enum value")
    return _unique(name, [_Choice(value, label, None) for value, label in pairs])


def _const_choices(name: str, entries: Any, keyword: str) -> list[_Choice]:
    if not isinstance(entries, list) or not entries:
        raise FormSchemaError(name, f"{keyword} must be a non-empty list of {{const, title}}")
    choices = []
    for entry in entries:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("const"), str):
            raise FormSchemaError(name, f"every {keyword} entry needs a string const")
        label = _optional_str(name, entry, "title") or entry["const"]
        choices.append(_Choice(entry["const"], label, _optional_str(name, entry, "description")))
    return _unique(name, choices)


def _unique(name: str, choices: list[_Choice]) -> list[_Choice]:
    seen: set[str] = set()
    for choice in choices:
        if (size := _id_bytes(choice.id)) > MAX_ID_BYTES:
            raise FormSchemaError(
                name, f"an option is {size:,} bytes; an option id is at most {MAX_ID_BYTES}"
            )
        if choice.id in seen:
            raise FormSchemaError(name, f"option {choice.id!r} is listed twice")
        seen.add(choice.id)
    return choices


def _id_bytes(value: str) -> int:
    """An id's size as the limits measure it (JSON, without the quotes)."""
    return len(msgspec.json.encode(value)) - 2


def _options(choices: list[_Choice], recommended: set[Any]) -> list[InputOption]:
    return [
        InputOption(
            id=choice.id,
            label=choice.label,
            description=choice.description,
            recommended=True if choice.id in recommended else None,
        )
        for choice in choices
    ]


def _refuse_keywords(
    name: str | None, schema: Mapping[str, Any], allowed: frozenset[str], where: str
) -> None:
    for keyword in schema:
        if keyword in _VALIDATION_KEYWORDS and keyword not in allowed:
            raise FormSchemaError(name, f"{keyword!r} is not supported {where}")


def _optional_str(name: str, schema: Mapping[str, Any], key: str) -> str | None:
    value = schema.get(key)
    if value is not None and not isinstance(value, str):
        raise FormSchemaError(name, f"{key} must be a string")
    return value


def _count(name: str, prop: Mapping[str, Any], key: str) -> int | None:
    """A length or item-count bound: a non-negative integer (``2.0`` is 2)."""
    value = prop.get(key)
    if value is None:
        return None
    if not _is_number(value) or value < 0 or not _is_integral(value):
        raise FormSchemaError(name, f"{key} must be a non-negative integer")
    return int(value)


def _schema_number(name: str, prop: Mapping[str, Any], key: str) -> int | float | None:
    value = prop.get(key)
    if value is not None and not _is_number(value):
        raise FormSchemaError(name, f"{key} must be a number")
    return value


def _is_number(value: Any) -> bool:
    """A finite JSON number; ``bool`` is not one, although Python says it is an int."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _is_integral(value: int | float) -> bool:
    """Whether a number is whole; ints are never turned into floats (they may be huge)."""
    return isinstance(value, int) or value.is_integer()


def _check_order(
    name: str, low_key: str, low: float | None, high_key: str, high: float | None
) -> None:
    if low is not None and high is not None and low > high:
        raise FormSchemaError(name, f"{low_key} {low} is greater than {high_key} {high}")


def _check_default_within(
    name: str, measure: float, low_key: str, low: float | None, high_key: str, high: float | None
) -> None:
    if low is not None and measure < low:
        raise FormSchemaError(name, f"default is below {low_key} {low}")
    if high is not None and measure > high:
        raise FormSchemaError(name, f"default is above {high_key} {high}")


# ─── Answers -> form data ────────────────────────────────────────────────────


def form_data_from_answers(
    form: FormSpec | Mapping[str, Any], answers: Mapping[str, InputAnswer]
) -> dict[str, Any]:
    """Form data from the answers of an accepted request, keys in field order.

    Only ``submitted`` answers count. A field with no submitted answer is
    left out, except that a ``null_if_unanswered`` field gets ``None``; a
    ``required`` field without one raises. Values take the schema's types:
    ``int`` for integers (``3.0`` becomes 3), ``int`` or ``float`` as given for
    numbers, ``bool``, ``str``, the option id (or the one freeform value, when
    the question allows freeform input) for a single select, and the option
    ids followed by the freeform values for a multi select. Bounds, lengths,
    formats and patterns are not checked here: the host checks submitted
    answers, and data against the frozen schema, before a request resolves.

    Raises :class:`FormDataError` for an answer to an unknown question, an
    answer of the wrong kind, or a value that does not fit the field.
    """
    spec = _spec(form)
    names = {field.name for field in spec.fields}
    for question_id in answers:
        if question_id not in names:
            raise FormDataError(question_id, "answers a question this form does not have")
    data: dict[str, Any] = {}
    for field in spec.fields:
        answer = answers.get(field.name)
        if answer is None or answer.state != "submitted":
            if field.required:
                raise FormDataError(field.name, "required, but has no submitted answer")
            if field.null_if_unanswered:
                data[field.name] = None
            continue
        if answer.value is None:
            raise FormDataError(field.name, "the submitted answer has no value")
        data[field.name] = _value_to_data(field.name, field.question, answer.value)
    return data


_V = TypeVar("_V", bound=AnswerValue)


def _value_to_data(name: str, question: InputQuestion, value: InputAnswerValue) -> Any:
    match question:
        case TextQuestion():
            return _expect(name, value, TextValue).value
        case IntegerQuestion():
            return _data_number(name, _expect(name, value, NumberValue).value, integral=True)
        case NumberQuestion():
            return _data_number(name, _expect(name, value, NumberValue).value, integral=False)
        case BooleanQuestion():
            return _expect(name, value, BooleanValue).value
        case SingleSelectQuestion():
            return _selected_one(name, question, _expect(name, value, SelectedValue))
        case MultiSelectQuestion():
            return _selected_many(name, question, _expect(name, value, SelectedManyValue))
        case _:
            assert_never(question)


def _expect(name: str, value: InputAnswerValue, kind: type[_V]) -> _V:
    if not isinstance(value, kind):
        expected = kind.__struct_config__.tag
        got = type(value).__struct_config__.tag
        raise FormDataError(name, f"expected a {expected} answer, got a {got} answer")
    return value


def _selected_one(name: str, question: SingleSelectQuestion, value: SelectedValue) -> str:
    freeform = value.freeform_values or []
    if question.allow_freeform_input:
        if len(freeform) > 1:
            raise FormDataError(name, "a single select takes at most one freeform value")
        return freeform[0] if freeform else value.value
    if freeform:
        raise FormDataError(name, "the question does not accept freeform input")
    if value.value not in _option_ids(question):
        raise FormDataError(name, "the selected option is not one of the options")
    return value.value


def _selected_many(name: str, question: MultiSelectQuestion, value: SelectedManyValue) -> list[str]:
    freeform = value.freeform_values or []
    if not question.allow_freeform_input:
        if freeform:
            raise FormDataError(name, "the question does not accept freeform input")
        ids = _option_ids(question)
        if not all(item in ids for item in value.value):
            raise FormDataError(name, "a selected option is not one of the options")
    return [*value.value, *freeform]


def _option_ids(question: SingleSelectQuestion | MultiSelectQuestion) -> set[str]:
    return {option.id for option in question.options}


def _data_number(name: str, value: Any, *, integral: bool) -> int | float:
    """``value`` as a JSON number of the field's type, or FormDataError."""
    if not _is_number(value):
        raise FormDataError(name, "expected a finite number")
    number: int | float = value
    if not integral:
        return number
    if not _is_integral(number):
        raise FormDataError(name, "expected an integer, got a fractional number")
    return int(number)


# ─── Form data -> answers ────────────────────────────────────────────────────


def answers_from_form_data(
    form: FormSpec | Mapping[str, Any], data: Mapping[str, Any]
) -> dict[str, InputAnswer]:
    """Submitted answers that carry ``data``: the reverse of
    :func:`form_data_from_answers` (pre-filled requests, tests).

    ``None`` for a nullable field becomes a ``skipped`` answer; fields absent
    from ``data`` get no answer; required fields are not checked. A select
    value outside the options is a freeform value when the question allows
    freeform input (a single select's ``value`` is then ``""``). Raises
    :class:`FormDataError` for an unknown key or a value that does not fit.
    """
    spec = _spec(form)
    answers: dict[str, InputAnswer] = {}
    for name, item in data.items():
        field = spec.field(name)
        if field is None:
            raise FormDataError(name, "is not a property of this form")
        if item is None:
            if not field.nullable:
                raise FormDataError(name, "null is only allowed for a nullable property")
            answers[name] = InputAnswer(state="skipped")
        else:
            answers[name] = InputAnswer(
                state="submitted", value=_data_to_value(name, field.question, item)
            )
    return answers


def _data_to_value(name: str, question: InputQuestion, item: Any) -> InputAnswerValue:
    match question:
        case TextQuestion():
            if not isinstance(item, str):
                raise FormDataError(name, "expected a string")
            return TextValue(value=item)
        case IntegerQuestion():
            return NumberValue(value=_data_number(name, item, integral=True))
        case NumberQuestion():
            return NumberValue(value=_data_number(name, item, integral=False))
        case BooleanQuestion():
            if not isinstance(item, bool):
                raise FormDataError(name, "expected a boolean")
            return BooleanValue(value=item)
        case SingleSelectQuestion():
            if not isinstance(item, str):
                raise FormDataError(name, "expected an option id")
            if item in _option_ids(question):
                return SelectedValue(value=item)
            if not question.allow_freeform_input:
                raise FormDataError(name, "the value is not one of the options")
            return SelectedValue(value="", freeform_values=[item])
        case MultiSelectQuestion():
            if not isinstance(item, list) or not all(isinstance(one, str) for one in item):
                raise FormDataError(name, "expected a list of option ids")
            ids = _option_ids(question)
            chosen = [one for one in item if one in ids]
            extra = [one for one in item if one not in ids]
            if extra and not question.allow_freeform_input:
                raise FormDataError(name, "a value is not one of the options")
            return SelectedManyValue(value=chosen, freeform_values=extra or None)
        case _:
            assert_never(question)


def _spec(form: FormSpec | Mapping[str, Any]) -> FormSpec:
    return form if isinstance(form, FormSpec) else parse_form(form)
