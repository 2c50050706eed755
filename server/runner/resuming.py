"""People's actions in chats, fed back to the runner's turns.

:meth:`ChatResuming.hook` is a host hook acting only on what this process
accepted, so that one process acts on each action: a participant's
``chat/turnStarted`` starts the session's agent; an answer to a question a
turn waits on (``chat/inputCompleted`` of a request the runner opened,
``chat/toolCallConfirmed`` of a call waiting for confirmation) resumes it
with what the chat's state then says (:func:`server.runner.resume.resume_for`,
the one rule the append's rider and the sweep follow too);
``chat/turnCancelled`` cancels; an agent's ``chat/error`` or
``chat/turnComplete`` of the turn's AHP turn fails it when it waits (an
error) and cancels it otherwise: nothing it does could show any more. Each
resume carries who did it (name, role, token, client id) for the turn's
audit.

A turn's AHP turn is ``runner_turn_id(chat, chatTurn)`` for a turn people
started; a child turn's AHP turn in its own chat has the child's id (see
:meth:`ChatResuming.turn_of`). AHP turn ids are the client's: one a
truncation took away may come back. The server stamps each turn a client
starts (``_meta.huddle.turn``, server.core.policy.turn_stamp), the runner's turn
keeps the stamp of the AHP turn it shows (a turn id used again gets the
stamped ``runner_turn_id``), and the two are matched by id and stamp: the
earlier turn, still winding down, reaches nothing of the later one (its
tools' questions neither: server.mcp.tools.people_of_current_call), and
the waits truncated away lose their notes and expiries (server.core.session_notes,
server.core.expiry).

A resume costs the chat's append alone: when a question of a turn shows in
a chat this process holds (``chat/inputRequested``, a call waiting for
confirmation), the turn is read ahead (its worker saved it as waiting
before it asked), and the person's answer resumes it from that copy with a
compare-and-set. On Redis that save rides on the answer's append, in its
script, once the entry landed (:meth:`ChatResuming.rider_for`: it decides
nothing of its own, it saves what ``resume_for`` says if the append lands);
elsewhere it is one save after it. A stale copy costs one more load and
save, and a refusal is decided on a fresh one (see ``Runner.submit_resume``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from protocol.actions import (
    ChatError,
    ChatInputCompleted,
    ChatInputRequested,
    ChatToolCallConfirmed,
    ChatToolCallReady,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    InputRequestPart,
)
from protocol.chat import Turn as ChatTurn
from protocol.messages import ActionEnvelope, ChannelState
from reducers import notes
from server.auth import Identity
from server.cache import Lru
from server.core.channels import Applied, Step
from server.core.host import Host
from server.core.policy import turn_stamp
from server.errors import HuddleError
from server.runner.agent import Agent
from server.runner.errors import TurnExists, TurnNotFound, VersionConflict
from server.runner.ids import (
    parse_input_request_id,
    runner_turn_id,
)
from server.runner.resume import answered_input, awaits, resume_for
from server.runner.runner import PreparedResume, ResumeRejected, Runner
from server.runner.turn import (
    ResumeCommand,
    Turn,
)
from server.store.base import Rider

log = logging.getLogger("huddle.runner.bridge")

EXPIRY_AUDIT = {"by": None, "role": None, "clientId": None, "via": "expiry"}
"""Who resumed a turn whose wait expired: nobody; the expiry did."""
STARTS = "turn-starts"
"""The store's records of chat turns people are starting (one per chat, by
its URI), written ahead of the ``chat/turnStarted`` append and removed once
the runner's turn exists: what a crash between the two left undone is found
there by the sweep (server.runner.sweep). One per chat bounds them by the
chats, whatever a client sends."""
READ_AHEAD = 256
"""Turns read ahead (waiting for the people of a chat) kept in memory."""


class ChatResuming:
    """Feeds people's actions in chats back to the runner's turns."""

    def __init__(self, host: Host, agent: Agent, runner: Runner) -> None:
        self.host = host
        self.agent = agent
        self.runner = runner
        self._read_ahead: Lru[str, Turn] = Lru(READ_AHEAD)
        """Turns whose question shows in a chat, as read then, by id; each
        is used once, by the resume that answers it."""
        self._ridden: Lru[str, _RiddenResume] = Lru(READ_AHEAD)
        """Per chat, the resume that rode on this process's latest append
        there (:meth:`rider_for`), until the hook of that envelope takes it."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def hook(self, event: Applied) -> Awaitable[None] | None:
        """The host's hook: act on what this process accepted from a client
        (the server's own actions carry no origin; ours among them), and
        read ahead the turn whose question any process shows."""
        self._read_ahead_for(event)
        if not event.local:
            return None
        action = event.action
        if event.sender is None:
            # The server's own (who sent an action is the server's word, not
            # its origin: one sent over HTTP has none): ours (nothing to do),
            # or an expiry that settled one of our waits (server.core.expiry),
            # which resumes it.
            if _expired(action) is not None or _expired_request(action):
                return self.accepted(event.uri, action, EXPIRY_AUDIT, event.view.state)
            return None
        if isinstance(
            action,
            ChatTurnStarted
            | ChatInputCompleted
            | ChatToolCallConfirmed
            | ChatTurnCancelled
            | ChatError
            | ChatTurnComplete,
        ):
            audit = _audit(event.sender, event.envelope)
            ridden = self._ridden.pop(event.uri)
            if ridden is not None and ridden.seq != event.envelope.server_seq:
                ridden = None
            return self.accepted(event.uri, action, audit, event.view.state, ridden=ridden)
        if isinstance(action, ChatTruncated) and isinstance(event.before, ChatState):
            dropped = event.before.active_turn
            if dropped is not None:  # AHP: always dropped, never kept
                audit = _audit(event.sender, event.envelope)
                return self._truncated(event.uri, dropped, audit)
        return None

    async def _truncated(self, uri: str, dropped: ActiveTurn, audit: dict[str, Any]) -> None:
        """Chat ``uri`` was truncated, its active turn ``dropped`` with it
        (AHP drops it silently): the runner's turn it showed can show
        nothing any more, so it is cancelled, as when an agent ends it."""
        try:
            turn = await self._turn_of(uri, dropped.id, turn_stamp(dropped.message))
            if turn is not None:
                await self.chat_turn_ended(turn, None, audit)
        except HuddleError as error:
            log.warning("could not end the turn truncated away: %s", error)

    async def accepted(
        self,
        uri: str,
        action: StateAction,
        audit: dict[str, Any],
        state: ChannelState,
        *,
        ridden: _RiddenResume | None = None,
    ) -> None:
        """React to a client's action on chat ``uri`` (``state`` the chat
        after it); ``audit`` says who; ``ridden`` the resume that rode on its
        append, if one did."""
        assert isinstance(state, ChatState)
        try:
            if ridden is not None and self._saved_by_rider(ridden):
                pass
            elif isinstance(action, ChatTurnStarted):
                # A turn an outside agent opened to ask its own questions in
                # (server.mcp.remote_calls) is that agent's: the session's
                # agent starts for people's turns.
                if action.message.origin.kind != "agent":
                    await self._start(uri, action)
            elif isinstance(action, ChatInputCompleted | ChatToolCallConfirmed):
                # Only the server's own confirmation is the expiry's: a
                # person's _meta saying so proves nothing.
                expired = audit is EXPIRY_AUDIT and _expired(action) is not None
                turn = await self._waiting_on(uri, action, state)
                if turn is not None:
                    await self.resume_from(turn, state, audit, expired=expired)
            elif isinstance(action, ChatTurnCancelled):
                turn_id = await self.turn_of(uri, action.turn_id, state)
                if turn_id is not None:
                    await self.runner.cancel(turn_id)
            elif isinstance(action, ChatError | ChatTurnComplete):
                # An agent ended the chat turn a runner's turn shows.
                turn = await self._turn_of(uri, action.turn_id, _stamp_in(state, action.turn_id))
                if turn is not None:
                    error = action.error.message if isinstance(action, ChatError) else None
                    await self.chat_turn_ended(turn, error, audit)
        except ResumeRejected as error:
            log.info("%s", error)
        except HuddleError as error:
            log.warning("could not act on %s: %s", type(action).__name__, error)
        # One turn of the event loop: a worker task of this process takes up
        # the turn just started or resumed before the action's later
        # follow-ups (the session's bookkeeping) run.
        await asyncio.sleep(0)

    def write_ahead(
        self, uri: str, result: Step, sender: Identity | None
    ) -> Awaitable[None] | None:
        """The core's write ahead of an append (server.core.channels.Ahead):
        a person's ``chat/turnStarted``, validated, is recorded as starting
        before it is appended, so that a crash before its runner's turn
        exists leaves the sweep a record of it: the chat's one record. The
        sweep drops a record whose start never landed."""
        action = result.envelope.action
        if sender is None or not isinstance(action, ChatTurnStarted):
            return None
        if action.message.origin.kind == "agent":
            return None
        record = {"turn": action.turn_id, "at": self.runner.clock()}
        return self.host.store.put_record(STARTS, uri, json.dumps(record).encode())

    def rider_for(self, uri: str, result: Step, sender: Identity | None) -> Rider | None:
        """The core's riding hook (server.core.channels.Riding): a person's answer
        to a question of a turn read ahead (an input request the runner
        opened, a call waiting for confirmation) resumes that turn in the
        answer's own append. The resume is applied here to the copy read
        ahead and saved by the chat store's script once the entry landed,
        compare-and-set on the turn's version and cancel flag as
        ``Runner.submit_resume`` saves it, and handed to a waiting worker
        the same way: the crossing of a second call and the hooks before it
        are saved. Nothing when the store carries no rider (the memory
        store, two Redises, a cluster where the turn's keys are not in the
        chat's slot), the answer needs a read (a form not
        held here) or the turn was not read ahead: the hook then resumes as
        without it. What the script did is read in :meth:`_saved_by_rider`."""
        runner = self.runner
        action, state = result.envelope.action, result.after
        answer = ChatInputCompleted | ChatToolCallConfirmed
        if sender is None or not isinstance(action, answer):
            return None  # most actions: nothing more is looked at
        if not isinstance(state, ChatState) or runner.store.rides_on is None:
            return None
        if not self.host.store.carries(runner.store.rides_on):
            return None
        chat_turn, awaited = _awaited_by(action)
        if chat_turn is None:
            return None
        turn = self._read_ahead_turn(uri, chat_turn, _stamp_in(state, chat_turn))
        if turn is None or awaits(turn) != awaited:
            return None
        data: dict[str, Any] | None = None
        part = answered_input(turn, state)
        if part is not None and _has_form(part):
            held, form = self.host.forms.held(uri, part.request.id)
            if not held:
                return None  # the hook reads it
            data = None if form is None else form.data(dict(part.request.answers or {}))
        command = resume_for(turn, state, data=data)
        if command is None:
            return None
        try:
            command = command.with_metadata(**_audit(sender, result.envelope))
            prepared = runner.prepare_resume(turn, command)
        except ResumeRejected:
            return None  # the copy may be stale: the hook decides on a fresh one
        rider = runner.store.runnable_rider(prepared.turn, runner.clock(), started=prepared.started)
        if rider is None or not self.host.store.carries(rider.store, uri, rider.keys):
            return None  # on a cluster: the turn's keys are not in the chat's slot
        self._ridden.put(uri, _RiddenResume(result.envelope.server_seq, rider, prepared))
        return rider

    def _saved_by_rider(self, ridden: _RiddenResume) -> bool:
        """Whether the resume that rode on an append was saved (then its
        listeners are told here); False: resume as without it."""
        rider, prepared = ridden.rider, ridden.prepared
        if rider.unknown:
            # The entry landed (it is being applied), so the script ran, but
            # its answer was lost: the rider saved the resume, or a conflict
            # kept it from saving. The resume is submitted again (refused if
            # it was saved) and its listeners hear of the first if it was.
            self.runner.read_back(prepared.turn.id, prepared)
            return False
        if not rider.ran:
            return False
        try:
            saved = self.runner.store.rider_saved(rider, prepared.turn)
        except (VersionConflict, TurnNotFound):
            return False  # the copy read ahead was stale: decide on a fresh one
        except Exception:
            log.exception("could not read what the resume of %s did", prepared.turn.id)
            return False
        self.runner.resumed(saved, prepared)
        return True

    async def _start(self, uri: str, action: ChatTurnStarted) -> None:
        """Start the agent's turn for a person's chat turn ``action``
        (:meth:`_start_turn`), then drop the record written ahead of it
        (:meth:`write_ahead`); a start that failed keeps it, for the sweep."""
        try:
            await self._start_turn(uri, action)
        except TurnExists:
            await self.drop_start(uri, action.turn_id)
            raise
        await self.drop_start(uri, action.turn_id)

    async def drop_start(self, uri: str, chat_turn: str) -> None:
        """Drop chat ``uri``'s record of starting ``chat_turn`` (not that of
        a later turn, which only a turn of ``chat_turn``'s ending lets in)."""
        store = self.host.store
        record = await store.get_record(STARTS, uri)
        if record is not None and json.loads(record).get("turn") == chat_turn:
            await store.delete_record(STARTS, uri)

    async def start_again(self, uri: str, active: ActiveTurn) -> bool:
        """Start the agent's turn for chat ``uri``'s active turn ``active``,
        which a person started, if it has none (the process that accepted
        the start died before starting it); True if it started one."""
        if await self.turn_of(uri, active.id) is not None:
            return False
        started = ChatTurnStarted(
            turn_id=active.id, started_at=active.started_at, message=active.message
        )
        try:
            await self._start(uri, started)
        except TurnExists:
            return False
        return True

    async def _start_turn(self, uri: str, action: ChatTurnStarted) -> None:
        """Start the agent's turn for a person's chat turn ``action``: under
        ``runner_turn_id(uri, turnId)``, or, when a turn of that id was
        truncated away before (AHP lets a client use it again), under the
        stamped one. A start heard twice starts one turn."""
        stamp = turn_stamp(action.message)
        turn_id = runner_turn_id(uri, action.turn_id)
        for attempt in (turn_id, runner_turn_id(uri, action.turn_id, stamp)):
            try:
                await self.runner.start(
                    self.agent,
                    action.message.text,
                    turn_id=attempt,
                    chat=uri,
                    chat_turn=action.turn_id,
                    chat_turn_stamp=stamp,
                )
                return
            except TurnExists:
                earlier = await self.runner.store.load(attempt)
                if stamp is None or earlier.chat_turn_stamp == stamp:
                    raise
        raise TurnExists(turn_id)

    async def turn_of(self, uri: str, chat_turn: str, state: ChatState | None = None) -> str | None:
        """The runner's turn that AHP turn ``chat_turn`` of chat ``uri``
        (whose state is ``state``, read when not given) shows, or None (no such turn: the chat's
        own, or an agent's that is not ours). A turn people started is
        ``runner_turn_id(uri, chatTurn)``, or the stamped one for a turn id
        used again (:meth:`_start`); a child turn shows in a chat of its own
        under its own id. Each is checked against the chat, its turn and
        the turn's stamp, so that no chat's people can reach another chat's
        turn, nor a chat turn the turn of an earlier one of its id."""
        if state is None:
            read = (await self.host.view(uri)).state
            assert isinstance(read, ChatState)
            state = read
        turn = await self._turn_of(uri, chat_turn, _stamp_in(state, chat_turn))
        return None if turn is None else turn.id

    async def _turn_of(
        self, uri: str, chat_turn: str, stamp: str | None, *, read_ahead: bool = False
    ) -> Turn | None:
        """The turn :meth:`turn_of` names, for the chat turn stamped
        ``stamp``, loaded (with ``read_ahead``, the copy read ahead when
        there is one: it may be stale)."""
        store = self.runner.store
        for candidate in _candidates(uri, chat_turn, stamp):
            turn = self._read_ahead.pop(candidate) if read_ahead else None
            if turn is None:
                try:
                    turn = await store.load(candidate)
                except TurnNotFound:
                    continue
            if (turn.chat, turn.chat_turn, turn.chat_turn_stamp) == (uri, chat_turn, stamp):
                return turn
        return None

    def _read_ahead_turn(self, uri: str, chat_turn: str, stamp: str | None) -> Turn | None:
        """The copy read ahead of the turn :meth:`_turn_of` names (taken:
        each copy serves one resume), or None."""
        for candidate in _candidates(uri, chat_turn, stamp):
            turn = self._read_ahead.pop(candidate)
            if turn is not None and (turn.chat, turn.chat_turn, turn.chat_turn_stamp) == (
                uri,
                chat_turn,
                stamp,
            ):
                return turn
        return None

    def _read_ahead_for(self, event: Applied) -> None:
        """When ``event`` shows a question of a runner's turn (an input
        request it opened, a call waiting for confirmation), read that turn
        now, in the background, for the resume that answers it."""
        action = event.action
        chat_turn: str | None = None
        if isinstance(action, ChatInputRequested):
            opened = parse_input_request_id(action.request.id)
            chat_turn = None if opened is None else opened.chat_turn
        elif isinstance(action, ChatToolCallReady) and action.confirmed is None:
            chat_turn = action.turn_id
        if chat_turn is None:
            return

        state = event.view.state
        stamp = _stamp_in(state, chat_turn) if isinstance(state, ChatState) else None

        async def read(uri: str, chat_turn: str) -> None:
            try:
                turn = await self._turn_of(uri, chat_turn, stamp)
            except HuddleError as error:
                log.info("could not read ahead the turn of %s in %s: %s", chat_turn, uri, error)
                return
            if turn is not None and turn.is_blocked:
                self._read_ahead.put(turn.id, turn)

        task = asyncio.ensure_future(read(event.uri, chat_turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _waiting_on(self, uri: str, action: Answer, state: ChatState) -> Turn | None:
        """The runner's turn that ``action`` (an answer in chat ``uri``, now
        in ``state``) answers, if it waits on that question: the copy read
        ahead when it does (it may be stale, costing a compare-and-set),
        else a fresh one."""
        chat_turn, awaited = _awaited_by(action)
        if chat_turn is None:
            return None  # not a request the runner opened
        stamp = _stamp_in(state, chat_turn)
        turn = await self._turn_of(uri, chat_turn, stamp, read_ahead=True)
        if turn is not None and awaits(turn) != awaited:
            turn = await self._turn_of(uri, chat_turn, stamp)  # the copy was of another wait
        return turn if turn is not None and awaits(turn) == awaited else None

    async def resume_from(
        self, turn: Turn, state: ChatState, audit: dict[str, Any], *, expired: bool = False
    ) -> bool:
        """Resume waiting ``turn`` as its chat's ``state`` says
        (:func:`~server.runner.resume.resume_for`; an accepted form's data
        read from the host, which checked it); ``expired``: the approval it
        waits on was cancelled by the expiry. False while its wait is
        unanswered there."""
        assert turn.chat is not None
        data: dict[str, Any] | None = None
        part = answered_input(turn, state)
        if part is not None and _has_form(part):
            answers = dict(part.request.answers or {})
            data = await self.host.form_data(turn.chat, part.request.id, answers)
        command = resume_for(turn, state, data=data, expired=expired)
        if command is None:
            return False
        try:
            await self.runner.submit_resume(turn.id, command.with_metadata(**audit), loaded=turn)
        except ResumeRejected as error:
            log.info("%s", error)
        return True

    async def chat_turn_ended(self, turn: Turn, error: str | None, audit: dict[str, Any]) -> None:
        """The chat turn ``turn`` shows is over, not by the runner (an agent
        ended it, with ``error`` or as complete): nothing the turn does can
        show any more, so it stops too. A turn waiting there fails with the
        chat's error; any other is cancelled (a running one at its next
        step: its tools see ``cancellation_requested``), as when people
        cancel."""
        if turn.is_terminal:
            return
        if error is not None and turn.is_blocked:
            try:
                await self._fail_waiting(turn, error, audit)
                return
            except ResumeRejected:
                pass  # it is no longer waiting: it runs on, so it is cancelled
        await self.runner.cancel(turn.id)

    async def _fail_waiting(self, turn: Turn, message: str, audit: dict[str, Any]) -> None:
        """The chat turn ``turn`` shows failed (a wait expired with the
        ``fail`` policy, or an agent ended it with an error): a turn waiting
        there can never be answered, so it fails with ``message``. A turn
        that runs ends by itself (a tool whose wait expired raises
        WaitExpired)."""
        suspension = turn.suspension
        if not turn.is_blocked or suspension is None:
            return
        command = ResumeCommand.fail(suspension.type, suspension.correlation_id, message)
        await self.runner.submit_resume(turn.id, command.with_metadata(**audit), loaded=turn)

    # ─── The sweep ───────────────────────────────────────────────────────


Answer = ChatInputCompleted | ChatToolCallConfirmed
"""The actions that answer a question a turn waits on."""


def _awaited_by(action: Answer) -> tuple[str | None, str]:
    """The AHP turn whose question ``action`` answers (None: not a question
    the runner asked) and that question's id, as :func:`awaits` names it."""
    if isinstance(action, ChatToolCallConfirmed):
        return action.turn_id, action.tool_call_id
    opened = parse_input_request_id(action.request_id)
    return (None if opened is None else opened.chat_turn), action.request_id


def _has_form(part: InputRequestPart) -> bool:
    """Whether accepted request ``part`` asked a form (its answers are data)."""
    opened = parse_input_request_id(part.request.id)
    return part.response == "accept" and opened is not None and opened.call_id is not None


def _stamp_in(state: ChatState, chat_turn: str) -> str | None:
    """The stamp of AHP turn ``chat_turn`` of ``state`` (active or over), if
    it has one."""
    active = state.active_turn
    found: ChatTurn | ActiveTurn | None = (
        active
        if active is not None and active.id == chat_turn
        else next((t for t in state.turns if t.id == chat_turn), None)
    )
    return None if found is None else turn_stamp(found.message)


def _expired_request(action: StateAction) -> bool:
    """Whether ``action`` is the server settling a request the runner opened:
    only an expiry does that (people's answers have an origin, and the
    server withdraws only MCP servers' requests)."""
    return (
        isinstance(action, ChatInputCompleted)
        and parse_input_request_id(action.request_id) is not None
    )


def _audit(sender: Identity | None, envelope: ActionEnvelope) -> dict[str, Any]:
    """Who did it, for the turn's audit: the server's identity of the sender."""
    origin = envelope.origin
    audit: dict[str, Any] = {
        "by": sender.name if sender else None,
        "role": sender.role if sender else None,
        "token": sender.token if sender else None,
        "clientId": origin.client_id if origin else None,
        "via": "chat",
    }
    if sender is not None and sender.declared:
        audit["declared"] = True  # a name typed in with a shared link
    return audit


def _candidates(uri: str, chat_turn: str, stamp: str | None) -> list[str]:
    """The runner's turn ids AHP turn ``chat_turn`` (stamped ``stamp``) of
    chat ``uri`` may show, in the order :meth:`ChatResuming._turn_of` tries them."""
    candidates = [runner_turn_id(uri, chat_turn), chat_turn]
    if stamp is not None:
        candidates.insert(1, runner_turn_id(uri, chat_turn, stamp))
    return candidates


@dataclass(frozen=True, slots=True)
class _RiddenResume:
    """A resume that rode on the append of ``seq`` (:meth:`ChatResuming.rider_for`)."""

    seq: int
    rider: Rider
    prepared: PreparedResume


def _expired(action: StateAction) -> dict[str, Any] | None:
    """The wait (``{"family", "id"}``) whose expiry made ``action``, if it
    was server.core.expiry's."""
    expired = notes.huddle_meta(getattr(action, "meta", None), "expired")
    return expired if isinstance(expired, dict) else None
