"""Encoders and decoders for every message family, each built once.

Decoding is strict about types (no string-to-number coercion) and ignores
unknown keys, as AHP asks of forward-compatible peers. A frame that does not
decode raises :class:`MalformedFrame`, whose ``path`` names the bad field the
way JSON-RPC clients see it (``$.params.action.turnId``).
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from protocol.actions import StateAction
from protocol.chat import KNOWN_PART_KINDS, AsRead, ChatState, UnknownPart
from protocol.messages import (
    ActionEnvelope,
    ChannelParams,
    ChannelState,
    CreateChatParams,
    CreateSessionParams,
    DispatchActionParams,
    ErrorCode,
    ExpireParams,
    FetchTurnsParams,
    IncomingResponse,
    InitializeParams,
    ListSessionsParams,
    ReconnectParams,
    Request,
    Snapshot,
    SubscribeParams,
)
from protocol.session import RootState, SessionState
from protocol.uris import BadChannelUri, channel_kind
from protocol.wire import cut, quoted

T = TypeVar("T")


class MalformedFrame(Exception):
    """A frame that is not valid JSON-RPC or whose params do not fit.

    ``code`` is the JSON-RPC error code to answer with; ``path`` is the JSON
    path of the offending field, when there is one.
    """

    def __init__(self, code: int, reason: str, path: str | None = None) -> None:
        super().__init__(code, reason, path)
        self.code = code
        self.reason = reason
        self.path = path

    def __str__(self) -> str:
        return self.reason if self.path is None else f"{self.reason} - at `{self.path}`"


def _split(error: msgspec.ValidationError, prefix: str) -> tuple[str, str | None]:
    """msgspec's reason and path, each :func:`cut`: its reason quotes the
    value it refused (a 100 KB action type), its path the keys it went
    through."""
    text = str(error)
    reason, sep, path = text.rpartition(" - at `")
    if not sep:
        return cut(text), prefix
    return cut(reason), cut(prefix + path.rstrip("`")[1:])


MAX_DEPTH: Final = 64
"""How deeply JSON may nest in anything a peer sends (arrays and objects).
AHP's own messages nest far less; anything deeper is refused before it is
decoded, so that nothing stored can be too deep to read back."""

_STRINGS: Final = re.compile(rb'"(?:[^"\\]|\\.?)*+"?')
"""A JSON string, or from a stray quote to the end: never failing, every
match ends where the next search begins (one pass, however the quotes and
backslashes are arranged)."""
_OPENERS_AND_CLOSERS: Final = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS: Final = bytes(set(range(256)) - set(b"[]{}"))


def _balanced(depth: int) -> bytes:
    """A pattern for balanced brackets nesting at most ``depth`` deep; its
    quantifiers are possessive, so it reads each bracket once."""
    pattern = b""
    for _ in range(depth):
        pattern = rb"(?:\[" + pattern + rb"\])*+"
    return pattern


_WITHIN_MAX_DEPTH: Final = re.compile(_balanced(MAX_DEPTH))
_LONE_SURROGATE: Final = re.compile(
    r"(?<!\\)(?:\\\\)*\\u([dD][89abAB][0-9a-fA-F]{2})(?!\\u[dD][c-fC-F])"
    r"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})(?<!\\)(?:\\\\)*\\u([dD][c-fC-F][0-9a-fA-F]{2})"
)


def nested_too_deep(data: bytes | str | msgspec.Raw) -> bool:
    """Whether JSON text ``data`` nests arrays and objects deeper than
    :data:`MAX_DEPTH` (brackets inside strings do not count); False for
    text that is not JSON at all (the decoder says what is wrong with it).

    One pass over the text, in C: strings out, everything but brackets out,
    then one match of the brackets against a pattern of balanced brackets
    at most ``MAX_DEPTH`` deep. Free for text with few brackets."""
    text = data.encode(errors="surrogatepass") if isinstance(data, str) else bytes(data)
    if text.count(b"[") + text.count(b"{") <= MAX_DEPTH:
        return False
    brackets = _STRINGS.sub(b"", text).translate(_OPENERS_AND_CLOSERS, _NOT_BRACKETS)
    if _WITHIN_MAX_DEPTH.fullmatch(brackets) is not None:
        return False
    # Too deep, or unbalanced: only JSON that parses is too deep.
    try:
        msgspec.json.decode(text, type=msgspec.Raw)
    except msgspec.DecodeError:
        return False
    except RecursionError:
        return True
    return True


def _decode(
    decoder: msgspec.json.Decoder[T],
    data: bytes | str | msgspec.Raw,
    prefix: str,
    code: int,
    *,
    depth_checked: bool = False,
) -> T:
    if not depth_checked and nested_too_deep(data):
        raise MalformedFrame(ErrorCode.PARSE_ERROR, f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as error:
        reason, path = _split(error, prefix)
        raise MalformedFrame(code, reason, path) from None
    except msgspec.DecodeError as error:
        raise MalformedFrame(ErrorCode.PARSE_ERROR, _invalid_json(data, error)) from None
    except RecursionError:  # pragma: no cover - refused above
        raise MalformedFrame(ErrorCode.PARSE_ERROR, "JSON nested too deeply to read") from None


_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")
SURROGATE_WINDOW: Final = 16
"""Bytes either side of where the decoder stopped that are looked at for a
lone surrogate (never the whole text: a 1 MiB frame took 100 ms)."""


def _near_error(data: bytes | str | msgspec.Raw, error: msgspec.DecodeError) -> str:
    """The text around where the decoder stopped, if that may be a lone
    surrogate's doing ('' when it cannot be)."""
    said = str(error)
    raw = data.encode() if isinstance(data, str) else bytes(data)
    if "surrogate" in said and (at := _AT_BYTE.search(said)) is not None:
        spot = int(at.group(1))
    elif "truncated" in said:  # a high surrogate just before the end
        spot = len(raw)
    else:
        return ""
    window = raw[max(0, spot - SURROGATE_WINDOW) : spot + SURROGATE_WINDOW]
    return window.decode(errors="replace")


def _invalid_json(data: bytes | str | msgspec.Raw, error: msgspec.DecodeError) -> str:
    """What is wrong with JSON that does not parse, in words."""
    lone = _LONE_SURROGATE.search(_near_error(data, error))
    if lone is not None:
        code = lone.group(1) or lone.group(2)
        return (
            f"invalid JSON: \\u{code} is half of a UTF-16 surrogate pair with no other half, "
            "so it is no character"
        )
    return f"invalid JSON: {error}"


def decode_json(data: bytes | str) -> Any:
    """Any JSON a peer sent (an HTTP body), as plain values; raises
    MalformedFrame (parse error) for JSON that does not parse or nests too
    deeply."""
    if nested_too_deep(data):
        raise MalformedFrame(ErrorCode.PARSE_ERROR, f"JSON nested deeper than {MAX_DEPTH} levels")
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise MalformedFrame(ErrorCode.PARSE_ERROR, _invalid_json(data, error)) from None
    except RecursionError:  # pragma: no cover - refused above
        raise MalformedFrame(ErrorCode.PARSE_ERROR, "JSON nested too deeply to read") from None


UNKNOWN_KIND: Final = str(UnknownPart.__struct_config__.tag)
_request: Final = msgspec.json.Decoder(Request)
_response: Final = msgspec.json.Decoder(IncomingResponse)
_action: Final[msgspec.json.Decoder[StateAction]] = msgspec.json.Decoder(StateAction)
_envelope: Final = msgspec.json.Decoder(ActionEnvelope)
STATE_TYPES: Final[dict[str, type[Any]]] = {
    "root": RootState,
    "session": SessionState,
    "chat": ChatState,
}

PARAMS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "initialize": msgspec.json.Decoder(InitializeParams),
    "ping": msgspec.json.Decoder(ChannelParams),
    "subscribe": msgspec.json.Decoder(SubscribeParams),
    "unsubscribe": msgspec.json.Decoder(ChannelParams),
    "dispatchAction": msgspec.json.Decoder(DispatchActionParams),
    "reconnect": msgspec.json.Decoder(ReconnectParams),
    "createSession": msgspec.json.Decoder(CreateSessionParams),
    "disposeSession": msgspec.json.Decoder(ChannelParams),
    "createChat": msgspec.json.Decoder(CreateChatParams),
    "disposeChat": msgspec.json.Decoder(ChannelParams),
    "listSessions": msgspec.json.Decoder(ListSessionsParams),
    "fetchTurns": msgspec.json.Decoder(FetchTurnsParams),
    "huddle/expire": msgspec.json.Decoder(ExpireParams),
}
"""The params decoder of every method the host serves."""


class _HoldsUnknownParts(Exception):
    """Raised by the encoders' hook on meeting an unknown part's JSON."""


def _spot_unknown_parts(value: Any) -> Any:
    if isinstance(value, AsRead):
        raise _HoldsUnknownParts
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


_encoder: Final = msgspec.json.Encoder(enc_hook=_spot_unknown_parts)
_NUL: Final = b"\x00"
_HOLE: Final = msgspec.Raw(_NUL)
"""Written where an unknown part's JSON goes: JSON text never holds a raw NUL."""
_WRAPPER: Final = msgspec.json.encode(UnknownPart(raw=AsRead({})), enc_hook=lambda _: _HOLE)
_WRAPPER_OPENING, _WRAPPER_CLOSING = _WRAPPER.split(_NUL)


def encode(value: Any) -> bytes:
    """Encode any wire value as JSON (absent optional fields left out), a
    part of an unknown kind written back as it was read."""
    # msgspec calls the hook only for a type it does not know, so a value
    # without unknown parts costs nothing more than a plain encode.
    try:
        return _encoder.encode(value)
    except _HoldsUnknownParts:
        return _encode_as_read(value)


def to_builtins(value: Any) -> Any:
    """A wire value as plain JSON-compatible Python objects: what
    :func:`encode` writes, parsed."""
    try:
        return msgspec.to_builtins(value, enc_hook=_spot_unknown_parts)
    except _HoldsUnknownParts:
        return msgspec.json.decode(_encode_as_read(value))


def _encode_as_read(value: Any) -> bytes:
    """``value`` as JSON, each unknown part written as the JSON it was read
    from: encoded with a hole in its place, then the hole and the wrapper
    around it replaced by the part."""
    held: list[bytes] = []

    def hold(member: Any) -> Any:
        if isinstance(member, AsRead):
            held.append(_encoder.encode(member.json))
            return _HOLE
        return _spot_unknown_parts(member)

    before, *after = msgspec.json.encode(value, enc_hook=hold).split(_NUL)
    out = [before]
    for part, rest in zip(held, after, strict=True):
        if out[-1].endswith(_WRAPPER_OPENING) and rest.startswith(_WRAPPER_CLOSING):
            out[-1] = out[-1].removesuffix(_WRAPPER_OPENING)
            rest = rest.removeprefix(_WRAPPER_CLOSING)
        out += (part, rest)
    return b"".join(out)


def decode_request(data: bytes | str) -> Request:
    """Decode one JSON-RPC request or notification frame."""
    return _decode(_request, data, "$", ErrorCode.INVALID_REQUEST)


def unknown_method(method: str) -> MalformedFrame:
    """The error for a request or notification of no method we know."""
    return MalformedFrame(ErrorCode.METHOD_NOT_FOUND, f"unknown method {quoted(method)}")


def decode_params(method: str, params: msgspec.Raw) -> Any:
    """Decode the params of ``method``, a request's from
    :func:`decode_request` (which checked their depth with the whole frame:
    it is not checked twice); raises :class:`MalformedFrame` with
    ``METHOD_NOT_FOUND`` for an unknown method."""
    decoder = PARAMS.get(method)
    if decoder is None:
        raise unknown_method(method)
    if not params:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "missing params", "$.params")
    return _decode(decoder, params, "$.params", ErrorCode.INVALID_PARAMS, depth_checked=True)


def decode_response(data: bytes | str) -> IncomingResponse:
    return _decode(_response, data, "$", ErrorCode.INVALID_REQUEST)


def decode_action(data: bytes | str) -> StateAction:
    return _decode(_action, data, "$", ErrorCode.INVALID_PARAMS)


def decode_envelope(data: bytes | str) -> ActionEnvelope:
    return _decode(_envelope, data, "$", ErrorCode.INVALID_PARAMS)


def decode_state(channel: str, data: bytes | str) -> ChannelState:
    """Decode the state of ``channel`` by its kind (root, session or chat)."""
    try:
        kind = channel_kind(channel)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.resource") from None
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as error:
        raise MalformedFrame(ErrorCode.PARSE_ERROR, f"invalid JSON: {error}") from None
    return convert_state(value, kind, "$.state")


def _map_parts(state: Any, mapper: Any) -> Any:
    """Apply ``mapper`` to every response part of a chat state in builtins."""
    if not isinstance(state, dict):
        return state
    out = dict(state)
    turns = out.get("turns")
    if isinstance(turns, list):
        out["turns"] = [
            {**t, "responseParts": [mapper(p) for p in t.get("responseParts") or []]}
            if isinstance(t, dict)
            else t
            for t in turns
        ]
    active = out.get("activeTurn")
    if isinstance(active, dict):
        parts = active.get("responseParts") or []
        out["activeTurn"] = {**active, "responseParts": [mapper(p) for p in parts]}
    return out


def _wrap_unknown(part: Any) -> Any:
    if isinstance(part, dict) and part.get("kind") not in KNOWN_PART_KINDS:
        return {"kind": UNKNOWN_KIND, "raw": AsRead(part)}
    return part


def convert_state(value: Any, kind: str, path: str = "$") -> ChannelState:
    """Stored or received state (plain JSON objects) as a typed state.

    Lenient where AHP expects growth: a response part of an unknown kind
    is kept as an :class:`~protocol.chat.UnknownPart` (and written back as
    read by :func:`encode` and :func:`to_builtins`).
    """
    if kind == "chat":
        value = _map_parts(value, _wrap_unknown)
    state: ChannelState = convert(value, STATE_TYPES[kind], path)
    return state


def convert(value: Any, type_: type[T], path: str = "$") -> T:
    """Convert plain JSON objects (already parsed) into a wire type."""
    try:
        return msgspec.convert(value, type_)
    except msgspec.ValidationError as error:
        reason, where = _split(error, path)
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, reason, where) from None


def decode_snapshot(value: Any) -> Snapshot:
    """A snapshot from plain JSON, its state typed by the channel it names."""
    if not isinstance(value, dict) or not isinstance(value.get("resource"), str):
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "expected a snapshot", "$")
    resource = value["resource"]
    try:
        kind = channel_kind(resource)
    except BadChannelUri as error:
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, str(error), "$.resource") from None
    state = convert_state(value.get("state"), kind, "$.state")
    from_seq = value.get("fromSeq")
    if not isinstance(from_seq, int) or isinstance(from_seq, bool):
        raise MalformedFrame(ErrorCode.INVALID_PARAMS, "Expected `int`", "$.fromSeq")
    return Snapshot(resource=resource, state=state, from_seq=from_seq)
