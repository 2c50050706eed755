"""Ids with structure: each built by one function and parsed by one.

=============================  ===============================  ==========================
id                             looks like                       built by / parsed by
=============================  ===============================  ==========================
a turn's input request         ``<chatTurn>:input:<callId>``,   :func:`input_request_id`
                               ``<chatTurn>:input:text:<hex>``  :func:`parse_input_request_id`
                               for a plain-text question
a plain-text question's        ``text:<8 hex digits>``          :func:`plain_question_id`
correlation id                                                  :func:`parse_plain_question_id`
the runner's turn for an AHP   ``<chatId>.<chatTurn>``, and     :func:`runner_turn_id`
turn (AHP turn ids are unique  ``<chatId>.<chatTurn>~<stamp>``  (not parsed: the turn's
per chat only)                 for a turn id used again         record says its chat,
                               after a truncation               turn and stamp)
a child turn                   ``<parentTurnId>.<callId>``      :func:`child_turn_id`
                                                                :func:`parse_child_turn_id`
a tool call's idempotency key  ``<turnId>:<toolCallId>``        :func:`idempotency_key`
                                                                :func:`parse_idempotency_key`
a model reply's markdown part  ``<chatTurn>:md:<n>``, and       :func:`markdown_part_id`
                               ``<chatTurn>:md:<n>.<k>`` for    :func:`parse_markdown_part_id`
                               its k-th retried attempt
an MCP elicitation's request   ``mcp:<16 hex digits>``          :func:`mcp_request_id`
                                                                :func:`parse_mcp_request_id`
a framework adapter's request  ``<framework>:<32 hex digits>``,  :func:`adapter_id`
or call for approval           a digest of what names it in     (not parsed: the
                               the framework                    framework's own
                                                                state names it)
what an MCP client asks        ``ask:<32 hex digits>``: a       :func:`door_ask_id`
Huddle's MCP server (a         digest of the token, the tool    (not parsed: a digest)
request, an approval's call)   and the idempotency key
an MCP client's own session    ``ahp-session:/mcp-<16 hex>``: a :func:`door_session`
                               digest of the token and the      (not parsed: a digest)
                               client's name
=============================  ===============================  ==========================

A parser returns None for an id its builder could not have made (a foreign
id: another kind, another agent's request, a hand-made one). The parts are
joined as they are, not escaped, so the formats stay what chats and stores
already hold; a parser splits at the separator a part is least likely to
contain, and the round trip holds as long as that part does not contain it:
the call id of an input request (split at the first ``:input:``; a call id
``text``, or one starting ``text:``, reads as a plain-text question), the
call id of a child turn id or idempotency key (at the last ``.`` or ``:``).
Markdown part and
MCP request ids always round-trip. A runner turn id is looked up from its
chat and AHP turn, never parsed (an AHP turn id may hold any character).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import NamedTuple

from protocol.uris import BadChannelUri, channel_id, channel_kind, session_uri

_INPUT = ":input:"
_TEXT = "text"
"""The call part of a plain-text question's request id (alone: a question
asked before questions had correlation ids)."""
_QUESTION = re.compile(r"text:[0-9a-f]{8}")
_MARKDOWN = ":md:"
_MCP = "mcp:"
_MCP_TOKEN = re.compile(r"[0-9a-f]{16}")


# ─── Input requests ──────────────────────────────────────────────────────────


class InputRequestRef(NamedTuple):
    chat_turn: str
    call_id: str | None
    """The tool call the form answers; None for a plain-text question."""
    question_id: str | None = None
    """A plain-text question's correlation id (None: a form, or a question
    asked before questions had one)."""


def input_request_id(chat_turn: str, correlation_id: str | None) -> str:
    """The id of the input request a turn opens in its chat for the
    suspension whose correlation id is ``correlation_id``: a form's call id,
    or a plain-text question's :func:`plain_question_id` (None: a question
    without one)."""
    return f"{chat_turn}{_INPUT}{_TEXT if correlation_id is None else correlation_id}"


def parse_input_request_id(request_id: str) -> InputRequestRef | None:
    """The chat turn and call (or question) of a request the runner opened;
    None for any other request (an MCP server's, an agent's own)."""
    chat_turn, marker, call = request_id.partition(_INPUT)
    if not marker or not chat_turn or not call:
        return None
    if call == _TEXT:
        return InputRequestRef(chat_turn, None)
    if call.startswith(_TEXT + ":"):
        question = parse_plain_question_id(call)
        return None if question is None else InputRequestRef(chat_turn, None, question)
    return InputRequestRef(chat_turn, call)


def plain_question_id(token: str | None = None) -> str:
    """The correlation id of a plain-text question: ``text:`` and ``token``
    (8 hex digits), a new random one by default. Each question gets its
    own, so an answer to one can never resume the next."""
    token = secrets.token_hex(4) if token is None else token
    question = f"{_TEXT}:{token}"
    if not _QUESTION.fullmatch(question):
        raise ValueError(f"a question token is 8 hex digits, not {token!r}")
    return question


def parse_plain_question_id(correlation_id: str) -> str | None:
    """``correlation_id`` when it is a plain-text question's, else None."""
    return correlation_id if _QUESTION.fullmatch(correlation_id) else None


# ─── Turns ───────────────────────────────────────────────────────────────────


def runner_turn_id(chat: str, chat_turn: str, stamp: str | None = None) -> str:
    """The runner's turn id for the AHP turn ``chat_turn`` of the chat whose
    URI is ``chat``: the first turn of that id, or (with its ``stamp``, see
    server.core.policy.turn_stamp) a later one, after a truncation took the
    first away. Raises BadChannelUri for a URI that names no chat."""
    if channel_kind(chat) != "chat":
        raise BadChannelUri(chat)
    again = "" if stamp is None else f"~{stamp}"
    return f"{channel_id(chat)}.{chat_turn}{again}"


class CallRef(NamedTuple):
    turn_id: str
    call_id: str


def child_turn_id(parent_turn_id: str, call_id: str) -> str:
    """The id of the child turn that the tool call ``call_id`` of the parent
    turn runs: the same every time the call runs, so a replay after a crash
    finds the child it started."""
    return f"{parent_turn_id}.{call_id}"


def parse_child_turn_id(turn_id: str) -> CallRef | None:
    """The parent turn and the call of a child turn id; None when the id has
    no parent part."""
    return _split_call(turn_id, ".")


def idempotency_key(turn_id: str, call_id: str) -> str:
    """The key of a tool call's external side effects: the same every time
    the call runs (a retry, a replay after a form, another worker)."""
    return f"{turn_id}:{call_id}"


def parse_idempotency_key(key: str) -> CallRef | None:
    """The turn and the tool call an idempotency key names; None for a key
    with no call part."""
    return _split_call(key, ":")


def _split_call(text: str, separator: str) -> CallRef | None:
    turn_id, found, call_id = text.rpartition(separator)
    return CallRef(turn_id, call_id) if found and turn_id and call_id else None


# ─── Chat parts ──────────────────────────────────────────────────────────────


class MarkdownPartRef(NamedTuple):
    chat_turn: str
    iteration: int
    """The turn's model iteration whose reply the part shows."""
    attempt: int = 0
    """Which attempt at that reply (0: the first; more after a crash or a
    retry cut an earlier one off)."""


def markdown_part_id(chat_turn: str, iteration: int, attempt: int = 0) -> str:
    """The id of the markdown part that shows the model's reply in
    ``iteration`` of the AHP turn ``chat_turn``, at its ``attempt``: a
    retried reply gets a part of its own, after the one that was cut off."""
    suffix = f".{attempt}" if attempt else ""
    return f"{chat_turn}{_MARKDOWN}{iteration}{suffix}"


def parse_markdown_part_id(part_id: str) -> MarkdownPartRef | None:
    chat_turn, marker, tail = part_id.rpartition(_MARKDOWN)
    iteration, dot, attempt = tail.partition(".")
    if not marker or not chat_turn or not _canonical(iteration):
        return None
    if dot and (not _canonical(attempt) or attempt == "0"):
        return None  # the first attempt has no suffix
    return MarkdownPartRef(chat_turn, int(iteration), int(attempt) if dot else 0)


def _canonical(number: str) -> bool:
    """Whether ``number`` is a count as the builders write it ("007" is not)."""
    return number.isdecimal() and number.isascii() and str(int(number)) == number


# ─── MCP ─────────────────────────────────────────────────────────────────────


def mcp_request_id(token: str | None = None) -> str:
    """The id of an input request that asks an MCP server's elicitation:
    ``token`` (16 hex digits), a new random one by default."""
    token = secrets.token_hex(8) if token is None else token
    if not _MCP_TOKEN.fullmatch(token):
        raise ValueError(f"an MCP request token is 16 hex digits, not {token!r}")
    return f"{_MCP}{token}"


def parse_mcp_request_id(request_id: str) -> str | None:
    """The token of an MCP elicitation's request id; None for any other."""
    prefix, token = request_id[: len(_MCP)], request_id[len(_MCP) :]
    return token if prefix == _MCP and _MCP_TOKEN.fullmatch(token) else None


# ─── Framework adapters and Huddle's MCP server ────────────────────────────


def adapter_id(framework: str, *names: str) -> str:
    """The id of the request (or call for approval) a framework adapter puts
    to a chat for what ``names`` name in ``framework`` (a thread, its
    checkpoint and interrupt; a tool call): the same names give the same id,
    so a process started again finds its request instead of asking twice.
    A digest, so that the id stays short whatever the names hold."""
    return f"{framework}:{_digest(*names)[:32]}"


def door_ask_id(token_id: str, tool: str, key: str | None) -> str:
    """The id of what a tool of Huddle's MCP server asks (server.mcp.door):
    with an idempotency ``key``, the same for the same token, tool and key
    (a call made again after a restart finds its request), else a new one."""
    if key is None:
        return f"ask:{secrets.token_hex(16)}"
    return adapter_id("ask", token_id, tool, key)


def door_session(token_id: str, client: str) -> str:
    """The session of one MCP client of Huddle's MCP server: the same for
    the same token and client name, in every process and after restarts."""
    return session_uri(f"mcp-{_digest(token_id, client)[:16]}")


def _digest(*names: str) -> str:
    return hashlib.sha256("\x00".join(names).encode()).hexdigest()
