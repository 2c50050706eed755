"""Base classes and small shared shapes of AHP wire types.

Every wire type derives from :class:`Wire`: a frozen, keyword-only msgspec
Struct whose Python fields are snake_case and whose JSON names are AHP's
camelCase. Optional fields default to ``None`` and are left out of the JSON
when absent (AHP never sends ``null`` for an absent field). ``_meta`` fields
are spelled out with ``msgspec.field(name="_meta")`` because camel-casing
cannot produce a leading underscore.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object we carry without interpreting (provider metadata, schemas)."""

Number: TypeAlias = int | float
"""A JSON number; ints stay ints so that large integers round-trip exactly."""

URI: TypeAlias = str

QUOTED = 160
"""At most this many characters of a client's string go into an error (a
channel URI of the longest id, 141, whole)."""


MAX_ID_BYTES = 256
"""The most an id may take (bytes of JSON, a string's without its quotes):
an id in an action, a connection's clientId, and so a form's property
names and option values, which become question and option ids."""


def cut(text: str, at_most: int = 2 * QUOTED) -> str:
    """``text`` (a message that may hold what a client sent) whole up to
    ``at_most`` characters, cut and sized beyond."""
    if len(text) <= at_most:
        return text
    return f"{text[:at_most]}... ({len(text):,} characters)"


def quoted(text: str) -> str:
    """``text`` as an error message shows it (its ``repr``): whole up to
    :data:`QUOTED` characters, cut and sized beyond, so that an error never
    echoes a frame's worth of what a client sent."""
    if len(text) <= QUOTED:
        return repr(text)
    return f"{text[:QUOTED]!r}... ({len(text):,} characters)"


class Wire(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    omit_defaults=True,
    rename="camel",
    gc=False,
):
    """Base of every wire Struct: frozen, keyword-only, camelCase on the wire."""


def meta_field() -> Any:
    """The ``_meta`` field shared by many AHP shapes: provider metadata."""
    return msgspec.field(default=None, name="_meta")


class Markdown(Wire, frozen=True, kw_only=True):
    """The object form of AHP's ``StringOrMarkdown``: rendered as Markdown."""

    markdown: str


StringOrMarkdown: TypeAlias = str | Markdown
"""A plain string (rendered as-is) or ``{"markdown": ...}`` (rendered)."""


class TextPosition(Wire, frozen=True, kw_only=True):
    line: int
    character: int


class TextRange(Wire, frozen=True, kw_only=True):
    start: TextPosition
    end: TextPosition


class TextSelection(Wire, frozen=True, kw_only=True):
    range: TextRange


class ContentRef(Wire, frozen=True, kw_only=True):
    """A reference to large content stored outside the state tree."""

    uri: URI
    size_hint: Number | None = None
    content_type: str | None = None
    nonce: str | None = None


class FileEditSide(Wire, frozen=True, kw_only=True):
    uri: URI
    content: ContentRef


class FileDiff(Wire, frozen=True, kw_only=True):
    added: int | None = None
    removed: int | None = None


class ErrorInfo(Wire, frozen=True, kw_only=True):
    error_type: str
    message: str
    stack: str | None = None
    meta: JsonObject | None = meta_field()


class UsageInfo(Wire, frozen=True, kw_only=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    model: str | None = None
    cache_read_tokens: int | None = None
    meta: JsonObject | None = meta_field()


class ConfigState(Wire, frozen=True, kw_only=True):
    """``RootConfigState`` / ``SessionConfigState``: a schema and its values."""

    schema: JsonObject
    values: JsonObject


class FileEdit(Wire, frozen=True, kw_only=True):
    """A file modification: create (only ``after``), delete, rename or edit."""

    before: FileEditSide | None = None
    after: FileEditSide | None = None
    diff: FileDiff | None = None
