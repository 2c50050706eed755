"""The key that signs every session's audit: an Ed25519 key of the server's.

With ``--audit-key PATH`` (``HUDDLE_AUDIT_KEY``) the key is the PEM private
key in that file (``openssl genpkey -algorithm ed25519 -out audit.pem``).
Without it the store keeps one: the first process to need it generates it
and keeps it unless another did first (:meth:`ChannelStore.keep_record`),
so every process of a deployment signs with the same key, restarts
included (on Redis; the memory store's key lives as long as its records).

A key is named by its id, the first 16 hex digits of the SHA-256 of its raw
public key (32 bytes). Every key a deployment has signed with stays listed
in the store (``KEYS``: id -> public key), so that ``GET /api/audit/key``
gives the keys of old records too after a rotation. What a key signs, and
how a signature is checked, is ``server.core.audit``'s.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from server.store.base import ChannelStore

KEPT: Final = ("audit-key", "signing")
"""The kind and key of the record holding the generated private key."""
KEYS: Final = "audit-keys"
"""The records of every public key the deployment signed with, by id."""
MAX_LISTED: Final = 64
"""Public keys ``GET /api/audit/key`` lists at most (the newest)."""
ALGORITHM: Final = "Ed25519"


def key_id(public: Ed25519PublicKey) -> str:
    """A public key's id: the first 16 hex digits of the SHA-256 of its raw bytes."""
    return hashlib.sha256(public.public_bytes_raw()).hexdigest()[:16]


def public_text(public: Ed25519PublicKey) -> str:
    """A public key as ``GET /api/audit/key`` gives it: its raw 32 bytes, base64."""
    return base64.b64encode(public.public_bytes_raw()).decode()


@dataclass(frozen=True)
class SigningKey:
    """The private key records are signed with, and its public key's id."""

    private: Ed25519PrivateKey
    id: str

    @classmethod
    def of(cls, private: Ed25519PrivateKey) -> SigningKey:
        return cls(private, key_id(private.public_key()))

    @property
    def public(self) -> Ed25519PublicKey:
        return self.private.public_key()

    def sign(self, message: bytes) -> str:
        """The signature of ``message``, base64."""
        return base64.b64encode(self.private.sign(message)).decode()


def read_private_key(path: str) -> Ed25519PrivateKey:
    """The Ed25519 private key of a PEM file (PKCS #8, unencrypted); ValueError."""
    try:
        loaded = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, TypeError, ValueError) as error:
        raise ValueError(f"--audit-key {path}: not a readable PEM private key ({error})") from None
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"--audit-key {path}: not an Ed25519 key")
    return loaded


def read_public_keys(text: str) -> dict[str, Ed25519PublicKey]:
    """The public keys ``text`` gives, by id: the answer of ``GET
    /api/audit/key`` (JSON: every key it lists), a PEM public key, or a
    raw key in base64; ValueError."""
    text = text.strip()
    if text.startswith("{"):
        try:
            answer = json.loads(text)
        except ValueError:
            raise ValueError("a public key: not the JSON of /api/audit/key") from None
        listed = answer.get("keys") if isinstance(answer, dict) else None
        if not isinstance(listed, list) or not listed:
            raise ValueError("a public key: the JSON of /api/audit/key lists its keys in 'keys'")
        keys: dict[str, Ed25519PublicKey] = {}
        for entry in listed:
            key = entry.get("publicKey") if isinstance(entry, dict) else None
            keys.update(read_public_keys(str(key)))
        return keys
    if text.startswith("-----BEGIN"):
        try:
            loaded = serialization.load_pem_public_key(text.encode())
        except ValueError as error:
            raise ValueError(f"a public key: not a readable PEM key ({error})") from None
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("a public key: not an Ed25519 key")
        return {key_id(loaded): loaded}
    try:
        raw = base64.b64decode(text, validate=True)
        public = Ed25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError):
        raise ValueError(
            "a public key is the JSON of /api/audit/key, a PEM key or 32 bytes in base64"
        ) from None
    return {key_id(public): public}


class AuditKeys:
    """The deployment's audit key (the file's, or the store's) and the
    public keys it signed with; see the module docstring."""

    def __init__(
        self, store: ChannelStore, path: str | None = None, *, now_ms: Callable[[], int]
    ) -> None:
        self.store = store
        self.now_ms = now_ms
        """The clock a key is listed with (since when it signs)."""
        self._file = None if path is None else read_private_key(path)
        self._signing: SigningKey | None = None
        """Once read (a cache: the key never changes while the process runs)."""

    async def signing(self) -> SigningKey:
        """The key to sign with, read (or made and kept) once and listed
        among the deployment's keys; raises StoreError."""
        if self._signing is not None:
            return self._signing
        private = self._file
        if private is None:
            mine = base64.b64encode(Ed25519PrivateKey.generate().private_bytes_raw())
            kept = await self.store.keep_record(*KEPT, mine)
            private = Ed25519PrivateKey.from_private_bytes(base64.b64decode(kept))
        key = SigningKey.of(private)
        if await self.store.get_record(KEYS, key.id) is None:
            # Listed once: its first listing says since when it signs.
            listed = {"publicKey": public_text(key.public), "listed": self.now_ms()}
            await self.store.keep_record(KEYS, key.id, msgspec.json.encode(listed))
        self._signing = key
        return key

    async def published(self) -> dict[str, Any]:
        """What ``GET /api/audit/key`` answers: the key signing now (``id``,
        ``publicKey``) and every key the deployment signed with (``keys``,
        the newest first, at most MAX_LISTED); raises StoreError."""
        key = await self.signing()
        listed: list[tuple[int, str, str]] = []
        for kid, raw in (await self.store.records(KEYS)).items():
            entry = msgspec.json.decode(raw)
            if kid != key.id and isinstance(entry, dict):
                listed.append((int(entry.get("listed", 0)), kid, str(entry.get("publicKey"))))
        listed.sort(reverse=True)
        others = [{"id": kid, "publicKey": text} for _, kid, text in listed[: MAX_LISTED - 1]]
        current = {"id": key.id, "publicKey": public_text(key.public)}
        return {"algorithm": ALGORITHM, **current, "keys": [current, *others]}
