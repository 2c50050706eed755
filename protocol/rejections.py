"""Why an action was rejected: the one list of codes, and a reason's parts.

AHP carries a rejection as the envelope's ``rejectionReason``, a string.
Huddle's reads ``"<code>: <sentence>"``: the code is stable (clients and
fixtures match on it), the sentence says what broke in words and never
quotes an answer value or a tool input. :class:`Rejection` holds the two
parts; :meth:`Rejection.parse` is the one place a reason received from the
wire is split again.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class RejectionCode(StrEnum):
    """Every code a Huddle host puts before the colon of a rejection."""

    # The validation rules of the chat and session channels (reducers.validation).
    NO_OPEN_INPUT_REQUEST = "no-open-input-request"
    UNKNOWN_QUESTION = "unknown-question"
    ANSWER_MISSING_VALUE = "answer-missing-value"
    ANSWER_KIND_MISMATCH = "answer-kind-mismatch"
    INVALID_ANSWER = "invalid-answer"
    REQUIRED_UNANSWERED = "required-unanswered"
    FORM_INVALID = "form-invalid"
    TOOL_CALL_NOT_PENDING = "tool-call-not-pending"
    UNKNOWN_OPTION = "unknown-option"
    INVALID_OPTIONS = "invalid-options"
    NOT_EDITABLE = "not-editable"
    INVALID_TOOL_INPUT = "invalid-tool-input"
    NO_ACTIVE_TURN = "no-active-turn"
    TURN_IN_PROGRESS = "turn-in-progress"
    TURN_ID_REUSED = "turn-id-reused"
    NO_PENDING_MESSAGE = "no-pending-message"
    UNKNOWN_CHAT = "unknown-chat"
    UNKNOWN_DIRECTORY = "unknown-directory"
    ANSWERED_QUESTION_DROPPED = "answered-question-dropped"
    # The limits on what goes into state (reducers.limits).
    TOO_LARGE = "too-large"
    TOO_MANY = "too-many"
    CHAT_FULL = "chat-full"
    # The host.
    NO_CHANGE = "no-change"
    DUPLICATE = "duplicate"
    CLIENT_SEQ_REUSED = "client-seq-reused"
    EXPIRED = "expired"
    INVALID_ACTION = "invalid-action"
    # The audit's shares (server.core.audit).
    AUDIT_SHARE_USED = "audit-share-used"
    AUDIT_FULL = "audit-full"
    # The authorisation policy (server.core.policy).
    FORBIDDEN = "forbidden"
    WRONG_CHANNEL = "wrong-channel"
    # The host and the network edge.
    RATE_LIMITED = "rate-limited"
    STORE_UNAVAILABLE = "store-unavailable"
    CONFLICT = "conflict"


class Rejection(msgspec.Struct, frozen=True):
    """A rejection's stable ``code`` and its ``sentence``."""

    code: RejectionCode
    sentence: str

    @property
    def reason(self) -> str:
        """The ``rejectionReason`` as sent on the wire."""
        return f"{self.code}: {self.sentence}"
