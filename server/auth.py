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

A person the organisation's identity vouches for (:class:`Person`: signed
in through OIDC, or named by a trusted auth proxy: server.edge.signin) gets
a token whose subject is that person: their name, email and issuer ride in
it, and its id is the person's (:func:`person_id`), the same for every
token they get, so that their budget, client ids and chats stay theirs
across browsers and sign-ins. Any other minted token is a link's: its
identity is marked so (``link``) in records.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import unicodedata
from collections.abc import Iterable
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
MAX_SUBJECT = 255
"""Characters of a person's subject (an OIDC ``sub``, a proxy's email)."""
MAX_EMAIL = 254
"""Characters of an email address (RFC 5321's path less its brackets)."""
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
        if _hidden(c):
            return (
                f"a name cannot hold U+{ord(c):04X}: it shows as nothing or reorders the "
                "text around it"
            )
    return None


def _hidden(c: str) -> bool:
    """Whether ``c`` shows as nothing or reorders the text around it."""
    return (unicodedata.category(c) in HIDDEN and not _is_space(c)) or c in INVISIBLE


def shown_name(given: str) -> str:
    """A name someone else gave (an identity provider's, a proxy's: its
    holder cannot be asked to take a character out), made fit to show as
    :func:`typed_name` makes one, with what :func:`name_problem` refuses in
    a typed one dropped."""
    return typed_name("".join(c for c in unicodedata.normalize("NFC", given) if not _hidden(c)))


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


@dataclass(frozen=True)
class Person:
    """Someone the organisation's identity vouches for: ``subject`` as
    ``issuer`` names them (an OIDC ``sub``; the email an auth proxy sends),
    their name and email as it says, and the groups its roles come from
    (:class:`RoleMap`)."""

    issuer: str
    subject: str
    name: str
    email: str | None = None
    groups: tuple[str, ...] = ()

    @classmethod
    def vouched(
        cls, issuer: str, subject: str, name: str | None, email: str | None, groups: Iterable[str]
    ) -> Person:
        """The person as ``issuer`` describes them, made fit to record: the
        name made fit to show (:func:`shown_name`: a provider's
        directory may hold a right-to-left override too), else the email,
        else the subject; an email over :data:`MAX_EMAIL` characters or with
        a control character is none. ValueError for a subject that is empty
        or over :data:`MAX_SUBJECT` characters (OIDC: 255 ASCII at most)."""
        if not subject or len(subject) > MAX_SUBJECT:
            raise ValueError(f"a person's subject is 1 to {MAX_SUBJECT} characters")
        if email is not None and (len(email) > MAX_EMAIL or not email.isprintable()):
            email = None
        shown = shown_name(name or "") or shown_name(email or "") or shown_name(subject)
        return cls(issuer, subject, shown or "someone", email or None, tuple(groups))


def person_id(issuer: str, subject: str) -> str:
    """The token id of every token of the person ``subject`` of ``issuer``:
    a digest that names them in records without being a credential."""
    return hashlib.sha256(f"person\0{issuer}\0{subject}".encode()).hexdigest()[:16]


SIGNED_IN_ROLES: tuple[Role, ...] = ("participant", "observer")
"""The roles a group may give a person: the agent's stays a secret's."""


@dataclass(frozen=True)
class RoleMap:
    """Which role a person's groups give them: ``role=group`` rules, the
    first that matches wins; ``*`` matches anyone (even with no groups)."""

    rules: tuple[tuple[Role, str], ...] = (("participant", "*"),)

    @classmethod
    def parse(cls, entries: Iterable[str]) -> RoleMap:
        """From ``participant=eng-oncall``-like entries (none: everyone a
        participant); ValueError for one that is not ``role=group`` with a
        role a group may give (:data:`SIGNED_IN_ROLES`)."""
        rules: list[tuple[Role, str]] = []
        for entry in entries:
            role, _, group = entry.partition("=")
            role, group = role.strip(), group.strip()
            known = next((r for r in SIGNED_IN_ROLES if r == role), None)
            if known is None or not group:
                raise ValueError(
                    f"a role rule is participant=GROUP or observer=GROUP ('*': anyone), "
                    f"not {entry!r}"
                )
            rules.append((known, group))
        return cls(tuple(rules)) if rules else cls()

    def role_of(self, groups: Iterable[str]) -> Role | None:
        """The role of someone in ``groups``, or None: no rule gives one."""
        held = frozenset(groups)
        return next((r for r, g in self.rules if g == "*" or g in held), None)


class Identity(msgspec.Struct, frozen=True, omit_defaults=True):
    """Who did something, as the server knows it: the subject of the token
    it came with (its role, its name and its id; never the token).
    ``declared`` when the name is one its holder typed in (a shared link's
    token carries none of its own); ``email`` and ``issuer`` for a person
    the organisation's identity vouches for (:class:`Person`)."""

    role: Role
    name: str
    token: str
    declared: bool = False
    email: str | None = None
    issuer: str | None = None

    @property
    def display(self) -> str:
        """The name to show: a typed-in one says so; a person's shows their
        email too."""
        if self.declared:
            return f"{self.name} · shared link"
        if self.email and self.email != self.name:
            return f"{self.name} ({self.email})"
        return self.name

    def who(self) -> dict[str, object]:
        """As the session's notes and the audit record it (reducers.notes):
        a person with their email and issuer, a link's token marked
        ``link``."""
        note: dict[str, object] = {"name": self.name, "role": self.role, "token": self.token}
        if self.declared:
            note["declared"] = True
        if self.issuer is not None:
            note["issuer"] = self.issuer
            if self.email is not None:
                note["email"] = self.email
        elif self.role != "agent":
            note["link"] = True
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
    email: str | None = None
    issuer: str | None = None
    """A person's token (:class:`Person`): who vouches for them."""

    @classmethod
    def of_person(cls, person: Person, role: Role, expires_at: float | None) -> Grant:
        """What a token of ``person`` allows: ``role`` on every session."""
        return cls(
            role=role,
            sessions=None,
            name=person.name,
            token_id=person_id(person.issuer, person.subject),
            expires_at=expires_at,
            email=person.email,
            issuer=person.issuer,
        )

    @property
    def budget_key(self) -> str:
        """Whose rate budget this token spends: its own, or its link's."""
        return self.link or self.token_id

    @property
    def identity(self) -> Identity:
        return Identity(
            role=self.role,
            name=self.name,
            token=self.token_id,
            email=self.email,
            issuer=self.issuer,
        )

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

    def derived_key(self, purpose: str) -> str:
        """A secret for ``purpose`` (the signed-in browsers' session cookie)
        that every process with this agent token derives alike, and that
        changing the agent token changes."""
        return hashlib.sha256(f"huddle {purpose} key\0{self.agent_token}".encode()).hexdigest()

    def mint_person(self, person: Person, role: Role, *, expires_at: float) -> str:
        """A token whose subject is ``person`` (its id theirs:
        :func:`person_id`), for ``role`` on every session."""
        return self.mint(role, name=person.name, expires_at=expires_at, person=person)

    def mint(
        self,
        role: Role,
        *,
        sessions: list[str] | None = None,
        name: str | None = None,
        expires_at: float,
        shared: bool = False,
        link: str | None = None,
        person: Person | None = None,
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
        if person is not None:
            payload.update(iss=person.issuer, sub=person.subject, email=person.email)
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
        if isinstance(payload.get("iss"), str) and isinstance(payload.get("sub"), str):
            email = payload.get("email")
            person = Person(
                payload["iss"], payload["sub"], str(name), email if isinstance(email, str) else None
            )
            return Grant.of_person(person, role, exp)
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
