"""Retention: finished sessions do not stay for ever.

With ``--retention DURATION`` a session that is finished (no turn running
or waiting in it) and was last changed longer ago than that is removed,
chats, audit and all; a disposed session's audit is kept that long after,
then removed too. With ``--audit-dir DIR`` the audit is exported there
first (``<session id>.jsonl``, as ``huddle audit export`` writes it, the
file complete before the audit goes). Every process sweeps every
``interval``; a session is retired by one of them (a claim in the store).
Without ``--retention`` nothing is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from pathlib import Path
from typing import Final

from protocol.status import SessionStatus
from protocol.uris import channel_id
from reducers.clock import iso_ms
from server.core.audit import GONE_RECORDS
from server.core.host import Host
from server.errors import ChannelGone, StoreError
from server.periodic import Periodic

log = logging.getLogger("huddle.retention")

CLAIM_SECONDS: Final = 300.0


class Retention:
    """See the module docstring."""

    def __init__(
        self,
        host: Host,
        keep: float,
        *,
        audit_dir: str | None = None,
        interval: float | None = None,
    ) -> None:
        self.host = host
        self.keep = keep
        self.audit_dir = Path(audit_dir) if audit_dir else None
        self._owner = secrets.token_hex(8)
        every = interval if interval is not None else min(600.0, max(1.0, keep / 10))
        self._periodic = Periodic(
            self.sweep, every, log=log, what="retention sweep", expected=(StoreError, OSError)
        )

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def sweep(self) -> list[str]:
        """Retire what is past its time; the sessions retired."""
        store = self.host.store
        cutoff = self.host.now_ms() - int(self.keep * 1000)
        retired: list[str] = []
        for summary in await self.host.aggregate.summaries():
            finished = not summary.status & SessionStatus.IN_PROGRESS
            old = iso_ms(summary.modified_at, cutoff) < cutoff
            if finished and old and await self._retire(summary.resource, dispose=True):
                retired.append(summary.resource)
        for session, raw in (await store.records(GONE_RECORDS)).items():
            if int(raw) < cutoff and await self._retire(session, dispose=False):
                retired.append(session)
        return retired

    async def _retire(self, session: str, *, dispose: bool) -> bool:
        store = self.host.store
        if await store.claim("retire:" + session, self._owner, CLAIM_SECONDS) is not None:
            return False
        if self.audit_dir is not None:
            lines = [line async for line in self.host.audit.export(session)]
            if len(lines) > 1:  # records, not the export's end alone
                await asyncio.to_thread(_write, self.audit_dir, channel_id(session), lines)
        if dispose:
            with contextlib.suppress(ChannelGone):
                await self.host.dispose_session(session)
        await store.delete_audit(session)
        await store.delete_record(GONE_RECORDS, session)
        log.info("retention: %s retired", session)
        return True


def _write(directory: Path, name: str, lines: list[bytes]) -> None:
    """Write ``lines`` to ``directory/<name>.jsonl`` whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name) or "session"
    target = directory / f"{safe}.jsonl"
    partial = target.with_suffix(".jsonl.partial")
    with open(partial, "wb") as out:
        out.write(b"".join(line + b"\n" for line in lines))
        out.flush()
        os.fsync(out.fileno())
    partial.replace(target)
