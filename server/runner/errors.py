"""Exceptions of the runner: its turns, its store, its chat models.

They are branches of the one tree that :mod:`server.errors` draws whole;
each is also importable where the runner's users meet it
(``server.runner.agent``, ``server.runner.openai``, ``server.runner.runner``,
``server.runner.turn_store``).
"""

from __future__ import annotations

from collections.abc import Sequence

from server.core.expiry import Expiry
from server.errors import HuddleError, InternalError, StoreError
from server.runner.form_definitions import FormDefinition


class RunnerError(HuddleError):
    """Base of the runner's exceptions, but for its store's (those are
    :class:`~server.errors.StoreError` subclasses)."""


class UnknownAgent(RunnerError):
    """The runner has no agent named ``name``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"no agent named {self.name!r} in this runner"


class AgentVersionGone(RunnerError):
    """A turn started with version ``version`` of agent ``name``, which this
    runner no longer has (``active`` is the version it has): the turn is not
    run with other code than it started with."""

    def __init__(self, name: str, version: str, active: str) -> None:
        super().__init__(name, version, active)
        self.name, self.version, self.active = name, version, active

    def __str__(self) -> str:
        return (
            f"agent {self.name!r} version {self.version} is no longer deployed (this worker "
            f"has version {self.active}); a turn runs only the version it started with"
        )


class ResumeRejected(RunnerError):
    """A resume that does not fit the turn: late, duplicate, mismatched (not
    the kind its wait expects, another correlation id) or not due yet.
    Nothing changed."""

    def __init__(self, turn_id: str, reason: str, errors: list[str] | None = None) -> None:
        super().__init__(turn_id, reason)
        self.turn_id, self.reason, self.errors = turn_id, reason, errors or []

    def __str__(self) -> str:
        extra = f" ({'; '.join(self.errors)})" if self.errors else ""
        return f"turn {self.turn_id}: {self.reason}{extra}"


class TurnBusy(RunnerError):
    """Another worker holds the turn's lease."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id

    def __str__(self) -> str:
        return f"turn {self.turn_id} is being executed elsewhere"


# ─── Raised by tools and models ──────────────────────────────────────────────


class FormRequired(RunnerError):
    """Raised by a tool, before any side effect, when it needs a form filled
    in first. The turn waits for the people; then the tool runs again from
    the start with ``ToolContext.current().submitted_form_data``. Raising it
    again after data was submitted is a protocol error that fails the turn.
    ``expiry`` is this request's (default: the form's, else the agent's
    ``input_expiry``)."""

    def __init__(
        self, form: FormDefinition, message: str | None = None, *, expiry: Expiry | None = None
    ) -> None:
        super().__init__(form.key)
        self.form = form
        self.message = message or form.description
        self.expiry = expiry

    def __str__(self) -> str:
        return f"form {self.form.key!r} required"


class WaitExpired(RunnerError):
    """Raised by a tool whose wait for people (an MCP server's question)
    expired with the ``fail`` policy: the turn fails with ``message``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class TransientError(RunnerError):
    """A model or tool failure worth retrying later (rate limits, timeouts):
    the turn is scheduled for retry with backoff instead of failing."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason or "a transient failure"


class ModelUnavailable(TransientError):
    """The model could not answer now; ``status`` is the HTTP status when
    there was one, ``retry_after`` the API's ``Retry-After`` as sent."""

    def __init__(
        self, reason: str, *, status: int | None = None, retry_after: str | None = None
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.retry_after = retry_after

    def __str__(self) -> str:
        text = self.reason
        if self.retry_after is not None:
            unit = " s" if self.retry_after.isdigit() else ""
            text += f" (retry after {self.retry_after}{unit})"
        return text


class ModelError(RunnerError):
    """A model failure that retrying will not fix."""


class ModelRequestRejected(ModelError):
    """The API refused the request: ``status`` and the API's ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        text = f"the model API answered {self.status}"
        return f"{text}: {self.message}" if self.message else text


class ModelReplyInvalid(ModelError):
    """The reply does not follow the API; ``tool`` names the tool whose
    call is broken, when it is one."""

    def __init__(self, reason: str, *, tool: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tool = tool

    def __str__(self) -> str:
        if self.tool is None:
            return f"the model's reply is invalid: {self.reason}"
        return f"the model's call to tool {self.tool!r} is invalid: {self.reason}"


class ModelNotConfigured(ModelError):
    """``from_env`` found these variables unset or empty."""

    def __init__(self, missing: Sequence[str]) -> None:
        super().__init__(*missing)
        self.missing = tuple(missing)

    def __str__(self) -> str:
        names = " and ".join(self.missing)
        verb = "is" if len(self.missing) == 1 else "are"
        return f"{names} {verb} not set: the OpenAI-compatible model needs {names}"


# ─── The turn store ──────────────────────────────────────────────────────────


class TurnNotFound(StoreError):
    """The store has no turn ``turn_id``."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id

    def __str__(self) -> str:
        return f"no turn {self.turn_id}"


class TurnExists(StoreError):
    """``create`` was given a turn whose id the store holds already."""

    def __init__(self, turn_id: str) -> None:
        super().__init__(turn_id)
        self.turn_id = turn_id

    def __str__(self) -> str:
        return f"turn {self.turn_id} exists"


class VersionConflict(StoreError):
    """Someone saved the turn since it was loaded: reload and decide again."""

    def __init__(self, turn_id: str, expected: int, current: int) -> None:
        super().__init__(turn_id, expected, current)
        self.turn_id, self.expected, self.current = turn_id, expected, current

    def __str__(self) -> str:
        return f"turn {self.turn_id} is at version {self.current}, not {self.expected}"


class Fenced(StoreError):
    """The lease was taken over: this worker must stop working on the turn."""

    def __init__(self, turn_id: str, token: int) -> None:
        super().__init__(turn_id, token)
        self.turn_id, self.token = turn_id, token

    def __str__(self) -> str:
        return f"turn {self.turn_id}: lease token {self.token} is no longer current"


# ─── Our bugs ────────────────────────────────────────────────────────────────


class IllegalTransition(InternalError):
    """The runner fed a turn in ``status`` a ``transition`` (or an event of
    :mod:`server.runner.machine`, by name) that
    :data:`server.runner.turn.TRANSITIONS` or the machine's table does not
    allow: a bug in the runner (or in a caller of ``Runner.suspend``), never
    the peer's fault. The turn is unchanged."""

    def __init__(self, turn_id: str, status: str, transition: str) -> None:
        super().__init__(turn_id, status, transition)
        self.turn_id, self.status, self.transition = turn_id, status, transition

    def __str__(self) -> str:
        return (
            f"turn {self.turn_id}: no transition {self.transition} from status {self.status} "
            "(a bug in the runner)"
        )
