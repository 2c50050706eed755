"""The form registry: the JSON Schemas frozen with input requests, and the
schema checks the validation rules call.

The host is the one authority for people's answers and edited tool input:
what it accepts here reaches a waiting turn, and the runner checks only that
a resume is the kind its wait expects (:mod:`server.runner.user_input`).
Failures are worded by :meth:`server.core.schemas.SchemaCheck.failure_texts`.

An input request made from a JSON Schema form keeps that schema for good (a
store record, so every process checks an accept against the same one): an
accept must fit it, and the accepted answers become data with the schema's
types. A tool call's edited input must fit the input schema of the tool of
that name among the session's tools. jsonschema lives in the shell, not in
the pure rules: :mod:`reducers.validation` receives these checks as
functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from protocol.actions import ChatToolCallConfirmed, ChatWorkingDirectorySet, StateAction
from protocol.chat import ChatState, InputAnswer, InputRequest, ToolCallPendingConfirmation
from protocol.codec import encode
from protocol.forms import FormError, FormSpec, form_data_from_answers, parse_form
from protocol.messages import ChannelState
from protocol.session import SessionState
from reducers import notes
from reducers.validation import FormCheck, ToolInputCheck
from server.cache import Lru
from server.core.schemas import SchemaCheck
from server.store.base import ChannelStore

FORM_RECORDS = "form"
HUDDLE_META = notes.HUDDLE
CACHED_FORMS = 1024
"""Frozen forms kept in memory (the store holds them all)."""


def chat_session(chat: ChatState) -> str | None:
    """The session a chat belongs to (Huddle's ``_meta.huddle.session``)."""
    session = notes.huddle_meta(chat.meta, "session")
    return session if isinstance(session, str) else None


@dataclass(frozen=True)
class Form:
    """A request's frozen form: the schema as given, its parsed spec and its
    check, built once (building a validator costs more than checking data)."""

    schema: dict[str, Any]
    spec: FormSpec
    check: SchemaCheck

    @classmethod
    def of(cls, schema: dict[str, Any], spec: FormSpec | None = None) -> Form:
        return cls(schema, spec or parse_form(schema), SchemaCheck.of(schema))

    def data(self, answers: dict[str, InputAnswer]) -> dict[str, Any]:
        """The answers as form data, with the schema's types."""
        return form_data_from_answers(self.spec, answers)


class FormRegistry:
    """Frozen forms by (chat, request id), and the checks that read them.
    ``session_state`` gives the session state this process holds (for the
    tools whose input schemas edited input must fit)."""

    def __init__(
        self, store: ChannelStore, session_state: Callable[[str], ChannelState | None]
    ) -> None:
        self.store = store
        self.session_state = session_state
        self._forms: Lru[tuple[str, str], Form | None] = Lru(CACHED_FORMS)

    async def freeze(self, chat: str, request_id: str, schema: dict[str, Any]) -> Form:
        """Freeze ``schema`` as the form of request ``request_id`` of ``chat``
        (before the request is opened). Raises FormSchemaError for a schema
        Huddle cannot ask."""
        form = Form.of(schema)
        await self.store.put_record(FORM_RECORDS, _record_key(chat, request_id), encode(schema))
        self._forms.put((chat, request_id), form)
        return form

    async def load(self, chat: str, request_id: str) -> Form | None:
        """The request's frozen form, or None when it was not made from one."""
        key = (chat, request_id)
        if key in self._forms:
            return self._forms.get(key)
        raw = await self.store.get_record(FORM_RECORDS, _record_key(chat, request_id))
        form = None if raw is None else Form.of(json.loads(raw))
        self._forms.put(key, form)
        return form

    def held(self, chat: str, request_id: str) -> tuple[bool, Form | None]:
        """Whether this process holds the request's frozen form (read or
        frozen here, not forgotten since), and the form (None: the request
        was not made from one)."""
        key = (chat, request_id)
        return (True, self._forms.get(key)) if key in self._forms else (False, None)

    async def data(
        self, chat: str, request_id: str, answers: dict[str, InputAnswer]
    ) -> dict[str, Any] | None:
        """The data ``answers`` give for the request's frozen form (with the
        schema's types), or None when the request had no form."""
        form = await self.load(chat, request_id)
        return None if form is None else form.data(answers)

    @staticmethod
    def form_check(form: Form | None) -> FormCheck:
        """Checks an accept against ``form``, the request's frozen form
        (None: the request has none)."""

        def check(request: InputRequest, answers: dict[str, InputAnswer]) -> str | None:
            if form is None:
                return None
            try:
                failures = form.check.failure_texts(form.data(answers))
            except FormError as unfit:
                return str(unfit)  # worded as MCP elicitation words it
            return "; ".join(failures) or None

        return check

    def tool_input_check(self, state: ChannelState) -> ToolInputCheck:
        """Check edited tool input against the input schema of the tool of
        that name among the session's server tools and its clients' tools."""

        def check(call: ToolCallPendingConfirmation, edited: Any) -> str | None:
            if not isinstance(state, ChatState):
                return None
            session_uri = chat_session(state)
            session = self.session_state(session_uri) if session_uri else None
            if not isinstance(session, SessionState):
                return None
            tools = list(session.server_tools or [])
            for client in session.active_clients:
                tools.extend(client.tools)
            tool = next((t for t in tools if t.name == call.tool_name), None)
            if tool is None or tool.input_schema is None:
                return None
            schema = SchemaCheck.of(tool.input_schema)
            if not schema.schema_is_valid:
                return None  # a tool's broken schema says nothing of its input
            return "; ".join(schema.failure_texts(edited)) or None

        return check


def needs_session(action: StateAction) -> bool:
    """Whether checking ``action`` reads its chat's session (its tools, its
    working directories)."""
    if isinstance(action, ChatWorkingDirectorySet):
        return True
    return isinstance(action, ChatToolCallConfirmed) and action.edited_tool_input is not None


def _record_key(chat: str, request_id: str) -> str:
    return f"{chat} {request_id}"
