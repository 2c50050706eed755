"""Tokens: who may connect, in which role, to which sessions.

The agent token is a shared secret (``huddle serve --token``); whoever holds
it has the ``agent`` role on every session. Every other token is minted by
the server: a JSON payload (role, sessions, name, expiry) and an HMAC-SHA256
signature with a key derived from the agent token, both base64url, joined by
a dot. Processes that share the agent token therefore accept each other's
tokens, and changing the agent token revokes every minted one.

Roles: ``agent`` may dispatch every action and create sessions;
``participant`` may dispatch client-dispatchable actions; ``observer`` may
only subscribe. ``sessions`` of None means every session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import unicodedata
from dataclasses import dataclass
from typing import Literal

import msgspec

from protocol.codec import MalformedFrame
from protocol.messages import ErrorCode
from server.errors import AuthError

Role = Literal["agent", "participant", "observer"]
ROLES: tuple[Role, ...] = ("agent", "participant", "observer")
TOKEN_PREFIX = "hud1."


AGENT_TOKEN_ID = "agent"
MAX_DECLARED_NAME = 60
"""Characters of a name typed in for a shared link."""
MAX_MARKS = 3
"""Combining marks a typed-in name keeps on one character (enough for any
script's stacked vowel and tone marks; "Zalgo" text stacks dozens)."""
INVISIBLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0\u2800\U0001d159"
)
"""Characters a name never holds although Unicode files them as letters,
marks or symbols, not as format characters: they show as nothing (the
grapheme joiner, the Hangul fillers, Khmer inherent vowels, Mongolian free
variation selectors, the blank Braille pattern, the musical null notehead)."""
SPACES = frozenset("\t\n\v\f\r")
"""Control characters that are spacing, not hidden: a name's runs of them
become one space, as of every space separator."""
NAME_PATH = '$.capabilities["huddle.identity"].name'
"""Where ``initialize`` carries a typed-in name."""


def _is_space(c: str) -> bool:
    return c in SPACES or unicodedata.category(c) in ("Zs", "Zl", "Zp")


HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co"})
"""Categories a name never holds: control, format (a right-to-left override,
a zero-width space), surrogate and private-use characters. Unassigned code
points (Cn) are let through: a newer Unicode than ours (the browser's) may
have assigned one, a new emoji, and both sides must agree on a name."""


def name_problem(typed: str) -> str | None:
    """Why a name typed in for a shared link is refused, or None: it holds
    a character that shows as nothing or reorders the text around it (one
    of the :data:`HIDDEN` categories, other than spacing, or of
    :data:`INVISIBLE`). The sentence names it by its code point, so that the
    person can see what to take out (web/people.js says the same)."""
    for c in unicodedata.normalize("NFC", typed):
        if (unicodedata.category(c) in HIDDEN and not _is_space(c)) or c in INVISIBLE:
            return (
                f"a name cannot hold U+{ord(c):04X}: it shows as nothing or reorders the "
                "text around it"
            )
    return None


def typed_name(typed: str) -> str:
    """A name as someone typed it (that :func:`name_problem` lets through),
    made fit to show: composed (NFC), at most :data:`MAX_MARKS` combining
    marks on a character and none on a space or on nothing, runs of spaces
    made one, cut to :data:`MAX_DECLARED_NAME` characters; empty when no
    name was typed (only spaces and stray marks)."""
    kept: list[str] = []
    marks = 0
    for c in unicodedata.normalize("NFC", typed):
        if unicodedata.category(c)[0] == "M":
            marks += 1
            if marks > MAX_MARKS or not kept or kept[-1] == " ":
                continue
        else:
            marks = 0
        kept.append(" " if _is_space(c) else c)
    return " ".join("".join(kept).split())[:MAX_DECLARED_NAME].rstrip(" ")


class Identity(msgspec.Struct, frozen=True, omit_defaults=True):
    """Who did something, as the server knows it: the subject of the token
    it came with (its role, its name and its id; never the token).
    ``declared`` when the name is one its holder typed in (a shared link's
    token carries none of its own)."""

    role: Role
    name: str
    token: str
    declared: bool = False

    @property
    def display(self) -> str:
        """The name to show: a typed-in one says so."""
        return f"{self.name} · shared link" if self.declared else self.name

    def who(self) -> dict[str, object]:
        """As the session's notes record it (reducers.notes)."""
        note: dict[str, object] = {"name": self.name, "role": self.role, "token": self.token}
        if self.declared:
            note["declared"] = True
        return note


@dataclass(frozen=True)
class Grant:
    """What a verified token allows, and whose it is."""

    role: Role
    sessions: frozenset[str] | None
    name: str
    token_id: str
    expires_at: float | None = None
    """When the token expires (Unix time); None for the agent token."""
    shared: bool = False
    """A link's token several people may share: each names themselves."""
    link: str | None = None
    """For a token a shared link's browser got (server.edge.app.index): the
    link's token id. Its rate budget is the link's, shared with every other
    browser of the link, so that opening the link again buys no more."""

    @property
    def budget_key(self) -> str:
        """Whose rate budget this token spends: its own, or its link's."""
        return self.link or self.token_id

    @property
    def identity(self) -> Identity:
        return Identity(role=self.role, name=self.name, token=self.token_id)

    def identity_as(self, declared: str | None) -> Identity:
        """The identity of this token's holder: a shared token's holder goes
        by the name they typed in (``declared``), marked as such; any other
        token by its own name, whatever was typed. Raises MalformedFrame
        (-32602) for a typed name :func:`name_problem` refuses: a name is
        refused, not quietly changed into one its holder did not type."""
        if self.shared and declared:
            if (problem := name_problem(declared)) is not None:
                raise MalformedFrame(ErrorCode.INVALID_PARAMS, problem, NAME_PATH)
            name = typed_name(declared)  # what is shown is what was typed
            if name:
                return Identity(role=self.role, name=name, token=self.token_id, declared=True)
        return self.identity

    @property
    def may_dispatch(self) -> bool:
        return self.role != "observer"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenAuthority:
    """Mints and verifies tokens for one agent token."""

    def __init__(self, agent_token: str) -> None:
        if len(agent_token) < 16:
            raise ValueError("the agent token must be at least 16 characters")
        self.agent_token = agent_token
        self._key = hashlib.sha256(b"huddle token key\0" + agent_token.encode()).digest()

    @staticmethod
    def generate_agent_token() -> str:
        return secrets.token_urlsafe(32)

    def mint(
        self,
        role: Role,
        *,
        sessions: list[str] | None = None,
        name: str | None = None,
        expires_at: float,
        shared: bool = False,
        link: str | None = None,
    ) -> str:
        """A token for ``role`` on ``sessions`` (all when None) until
        ``expires_at`` (Unix time), in the name of ``name``. A ``shared``
        token is for a link several people may open: its holders type in the
        names they go by, which are shown marked as such."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        payload: dict[str, object] = {
            "role": role,
            "sessions": sessions,
            "name": name or role,
            "exp": int(expires_at),
            "n": secrets.token_hex(4),
        }
        if shared:
            payload["shared"] = True
        if link is not None:
            payload["link"] = link
        body = _b64(json.dumps(payload, separators=(",", ":")).encode())
        signature = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        return f"{TOKEN_PREFIX}{body}.{signature}"

    def verify(self, token: str | None, now: float) -> Grant:
        """The grant of ``token``; raises AuthError(401) when it is missing,
        forged, malformed or expired."""
        if not token:
            raise AuthError(401, "a token is required")
        if hmac.compare_digest(token.encode(), self.agent_token.encode()):
            return Grant(role="agent", sessions=None, name="agent", token_id=AGENT_TOKEN_ID)
        if not token.startswith(TOKEN_PREFIX):
            raise AuthError(401, "unknown token")
        body, _, signature = token[len(TOKEN_PREFIX) :].partition(".")
        expected = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(signature.encode(), expected.encode()):
            raise AuthError(401, "invalid token signature")
        try:
            payload = json.loads(_unb64(body))
            role, sessions, name, exp = (
                payload["role"],
                payload["sessions"],
                payload["name"],
                payload["exp"],
            )
        except (ValueError, KeyError, TypeError):
            raise AuthError(401, "malformed token") from None
        if role not in ROLES:
            raise AuthError(401, "malformed token")
        if not isinstance(exp, int) or exp <= now:
            raise AuthError(401, "the token has expired")
        scope = None if sessions is None else frozenset(str(s) for s in sessions)
        return Grant(
            role=role,
            sessions=scope,
            name=str(name),
            token_id=token_id(token),
            expires_at=exp,
            shared=payload.get("shared") is True,
            link=str(payload["link"]) if "link" in payload else None,
        )


def token_id(token: str) -> str:
    """A minted token's id: a digest that names it in records and logs
    without revealing it."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]
