"""Logs never carry a token.

uvicorn logs every request line (``GET /?token=hud1.... HTTP/1.1``) and
every WebSocket path; :class:`RedactTokens` rewrites a record's message and
arguments before any handler formats them: ``token=`` query values, bearer
credentials and the ``huddle.token.`` subprotocol all become ``***``.
:func:`install` puts it on the loggers that could see one and on their
handlers (a filter on a logger does not see its children's records; one on
a handler sees everything it prints).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

SECRET: Final = re.compile(
    r"(?P<key>[?&;]token=|\bBearer\s+|\bhuddle\.token\.)(?P<value>[^\s&;\"',)\]]+)", re.IGNORECASE
)
LOGGERS: Final = ("", "uvicorn", "uvicorn.access", "uvicorn.error", "huddle")
"""The loggers (root included) whose handlers print what Huddle logs."""


def redact(text: str) -> str:
    """``text`` with every token in it replaced by ``***``."""
    return SECRET.sub(lambda m: m.group("key") + "***", text)


def _redacted(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else value


class RedactTokens(logging.Filter):
    """Masks tokens in a record's message and string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redacted(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _redacted(v) for k, v in record.args.items()}
        return True


_FILTER: Final = RedactTokens()


def install() -> None:
    """Redact tokens in every record these loggers and their handlers see
    (call it once logging is configured; idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        for target in (logger, *logger.handlers):
            if _FILTER not in target.filters:
                target.addFilter(_FILTER)
