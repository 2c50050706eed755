"""The sweep: what a crash between a person and the runner left undone.

A turn waits on its chat (an input request, a call waiting for
confirmation), and two writes tie the two together: the runner's save of
the suspension, then the chat's request; the chat's answer, then the
runner's resume. A crash between either pair leaves a turn waiting on
something that already happened, or on a question nobody sees.
:meth:`Sweep.reconcile`, run periodically by the workers
(server.runner.worker), reads each waiting turn's chat, which is durable,
and recovers it:

* a turn whose chat already answered it (a crash lost the resume) is
  resumed from that answer (:func:`~server.runner.resume.resume_for`
  decides; an approval the expiry cancelled resumes as expired, going by
  the session's notes, server.core.expiry);
* a turn whose chat turn is over (an agent ended it, or a truncation took
  it away, and the reaction to that was lost) ends: failed with the chat's
  error when it has one, else cancelled;
* a chat turn a person started whose runner's turn was never started (the
  process that accepted the start died first) is started, going by the
  records written ahead of each start (server.runner.resuming.STARTS),
  once it has gone unstarted for ``ask_again_after`` seconds; a record
  whose start never landed in its chat, or whose chat turn is over, goes;
* a turn whose chat never showed its question (the worker died between
  saving the suspension and asking) is asked again, once it has gone unseen
  for the bridge's ``ask_again_after`` seconds (its worker may be asking
  right now).

The sweep acts through the bridge's other two jobs: what it shows is shown
as :class:`~server.runner.showing.ChatShowing` shows it, and what it resumes
or ends is resumed or ended as :class:`~server.runner.resuming.ChatResuming`
does for an action people sent (one rule: ``resume_for``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import msgspec

from protocol.chat import ChatState, ToolCallCancelled, ToolCallStreaming
from reducers import notes
from reducers.chat import select_input_settlement, select_latest_tool_call, select_tool_call
from server.errors import ChannelGone, StoreError
from server.runner.agent import ApprovalDecision
from server.runner.ids import input_request_id
from server.runner.resume import ended_turn, shows
from server.runner.resuming import STARTS, ChatResuming
from server.runner.showing import ChatShowing
from server.runner.turn import SuspensionType, Turn, TurnStatus

log = logging.getLogger("huddle.runner.bridge")
"""The bridge's logger, as before the sweep had a module of its own."""


class Sweep:
    """Recovers waiting turns from their chats."""

    def __init__(
        self, showing: ChatShowing, resuming: ChatResuming, *, ask_again_after: float = 10.0
    ) -> None:
        self.showing = showing
        self.resuming = resuming
        self.host = resuming.host
        self.runner = resuming.runner
        self.ask_again_after = ask_again_after
        """Seconds a suspension may go unseen in its chat before a sweep
        asks again (its worker may be showing it right now)."""

    async def reconcile(self) -> int:
        """Resume turns whose chat already answered them (a crash lost the
        resume), start those a crash left unstarted; returns how many."""
        store, resumed = self.runner.store, await self._start_unstarted()
        audit = {"by": None, "role": None, "clientId": None, "via": "reconcile"}
        for status in (TurnStatus.WAITING_FOR_USER, TurnStatus.WAITING_FOR_APPROVAL):
            for turn_id in await store.by_status(status):
                try:
                    resumed += await self._reconcile(turn_id, audit)
                except StoreError:
                    raise  # the next sweep tries again
                except Exception:  # one turn's fault must not end the sweep for the others
                    log.exception("turn %s: the sweep could not reconcile it", turn_id)
        return resumed

    async def _start_unstarted(self) -> int:
        """Start the chat turns people started that have no runner's turn
        (see the module docstring); returns how many."""
        started = 0
        for chat, value in (await self.host.store.records(STARTS)).items():
            record = json.loads(value)
            if self.runner.clock() - float(record["at"]) < self.ask_again_after:
                continue  # its process may be starting it right now
            chat_turn = str(record["turn"])
            try:
                state = (await self.host.view(chat)).state
                assert isinstance(state, ChatState)
                active = state.active_turn
                if active is not None and active.id == chat_turn:
                    log.info("%s: turn %s was never started; starting it", chat, chat_turn)
                    if await self.resuming.start_again(chat, active):
                        started += 1
                        continue  # the start dropped its record
            except ChannelGone:
                pass
            except StoreError:
                raise  # the next sweep tries again
            except Exception:  # one chat's fault must not end the sweep for the others
                log.exception("%s: the sweep could not start turn %s", chat, chat_turn)
                continue
            await self.resuming.drop_start(chat, chat_turn)
        return started

    async def _reconcile(self, turn_id: str, audit: dict[str, Any]) -> bool:
        """Resume or end waiting turn ``turn_id`` if its chat says so, else
        show its suspension again if the chat never showed it; True if it
        was resumed or ended."""
        turn = await self.runner.store.load(turn_id)
        if turn.chat is None or turn.suspension is None:
            return False
        try:
            state = (await self.host.view(turn.chat)).state
        except ChannelGone:
            return False
        assert isinstance(state, ChatState)
        if await self._resume_answered(turn, state, audit) or await self._end_if_ended(
            turn, state, audit
        ):
            return True
        await self._ask_again_if_unseen(turn, state)
        return False

    async def _end_if_ended(self, turn: Turn, state: ChatState, audit: dict[str, Any]) -> bool:
        """End ``turn`` if the chat turn it waits in is over (a crash lost
        the reaction to its end): failed with the chat's error, else
        cancelled. False while the chat turn is active."""
        active = state.active_turn
        if turn.chat_turn is None or (active is not None and shows(turn, active)):
            return False
        # Over, or truncated away (then it is in no turn of the chat, or in
        # one of its id that is not its own).
        ended = ended_turn(state, turn)
        error = ended.error.message if ended is not None and ended.error is not None else None
        await self.resuming.chat_turn_ended(turn, error, audit)
        return True

    async def _ask_again_if_unseen(self, turn: Turn, state: ChatState) -> None:
        """Show ``turn``'s suspension in its chat if the chat never got it
        (the worker died between saving the suspension and asking), with
        only the time its expiry has left: a blocked turn is not saved again
        until it resumes, so ``updated_at`` is when it began to wait."""
        suspension = turn.suspension
        active = state.active_turn
        if suspension is None or active is None or not shows(turn, active):
            return
        waited = self.runner.clock() - turn.updated_at
        if waited < self.ask_again_after:
            return  # just suspended: its worker is likely showing it now
        if suspension.expiry is not None:
            suspension = msgspec.structs.replace(
                suspension, expiry=suspension.expiry.left_after(waited)
            )
        if suspension.type == SuspensionType.USER_INPUT:
            rid = input_request_id(active.id, suspension.correlation_id)
            if select_input_settlement(state, rid).part is None:
                log.info("turn %s: its chat never showed %s; asking again", turn.id, rid)
                await self.showing.input_requested(turn, suspension)
            return
        pending = turn.call(suspension.correlation_id or "")
        if pending is None:
            return
        # A call its chat shows only as started (streaming) was not asked:
        # its worker died between the call's start and its confirmation.
        shown = select_tool_call(state, pending.call.id)
        if shown is not None and not isinstance(shown, ToolCallStreaming):
            return
        tool = self.showing.tool(turn, pending.call.name)
        if tool is None:
            return
        log.info("turn %s: its chat never showed the approval; asking again", turn.id)
        meta = suspension.metadata
        decision = ApprovalDecision.require_approval(
            code=meta.get("code"),
            message=suspension.message,
            reason=meta.get("reason"),
            expiry=suspension.expiry,
        )
        await self.showing.approval_requested(turn, pending.call, tool, decision)

    async def _approval_expired(self, chat: str, call_id: str, turn: str | None) -> bool:
        """Whether the session's notes say the approval of ``call_id`` in
        ``chat`` (in the chat turn stamped ``turn``) expired (server.core.expiry)."""
        session = await self.host.session_of(chat)
        if session is None:
            return False
        state = (await self.host.view(session)).state
        note = notes.note_for(getattr(state, "meta", None), "toolCalls", chat, call_id, turn)
        return bool(note and note.get("expired"))

    async def _resume_answered(self, turn: Turn, state: ChatState, audit: dict[str, Any]) -> bool:
        """Resume ``turn`` from the chat's answer to its suspension
        (:func:`~server.runner.resume.resume_for` decides); False while it is
        unanswered."""
        suspension = turn.suspension
        assert suspension is not None
        assert turn.chat is not None
        expired = False
        if suspension.type == SuspensionType.TOOL_APPROVAL:
            call_id = suspension.correlation_id or ""
            call = select_latest_tool_call(state, turn.chat_turn or "", call_id)
            if isinstance(call, ToolCallCancelled):
                expired = await self._approval_expired(turn.chat, call_id, turn.chat_turn_stamp)
        return await self.resuming.resume_from(turn, state, audit, expired=expired)
