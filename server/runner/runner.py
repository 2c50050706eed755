"""The durable runner: turns that wait for people and resume anywhere.

A turn advances in steps, and every step that matters is saved before the
next begins (compare-and-set on the turn's version; fenced by the lease of
whoever executes it):

- MODEL: the model is asked; its reply is saved with every tool call it
  makes as pending, before any of them runs;
- TOOLS: each pending call runs in order and its result is saved on its own,
  so a crash never runs a finished tool again. ``request_user_input`` is a
  control tool: it suspends the turn for a form (USER_INPUT) instead of
  running. The approval policy may suspend a call (TOOL_APPROVAL) or deny
  it. A tool may raise FormRequired (USER_INPUT, then it runs again from the
  start with the data) or TransientError (RETRY, with backoff). A tool with
  a child agent starts a child turn and the parent waits (CHILD_AGENT).

What a wait for people is, what an answer must fit and what it does are
the rules of :mod:`server.runner.approvals` and :mod:`server.runner.user_input`
(forms and questions); the runner saves the wait, tells the listeners,
shows it through its port, and dispatches each resume to those rules.

``run`` and ``resume`` continue in the caller until the turn is blocked or
terminal; ``submit_resume`` validates, saves the turn as runnable and
returns: in the same store step the turn is handed, started and leased, to
a worker that waits for work (which then runs it without claiming, loading
or saving its start), or queued for a Worker to claim. Every resume is
checked against the suspension's type and correlation id before anything
changes; a late, duplicate or mismatched one raises ResumeRejected and
reopens nothing.

Faults are bounded, never retried forever: an execution that ends in an
error the runner cannot turn into a result (an unknown agent, an agent
version that is gone, a bug) is an attempt that failed; so is one whose
worker died or stalled (its turn is taken over once its lease expires).
Attempts in a row are counted on the turn (reset by every saved step): a
failed one schedules the turn again with backoff (RETRY_SCHEDULED), and
the ``max_attempts``-th fails it, with the error shown in its chat. A turn
taken over is told to the port first (the chat withdraws what the dead
worker left open and marks its cut-off text), and its tool replays with
the same idempotency key.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, assert_never

import msgspec

from server.errors import HuddleError, StoreError, StoreUnavailable
from server.runner import approvals, user_input
from server.runner.agent import Agent, Outcome, Tool
from server.runner.context import ToolContext, enter, leave, lender
from server.runner.errors import (
    AgentVersionGone,
    Fenced,
    FormRequired,
    ModelUnavailable,
    TransientError,
    UnknownAgent,
    VersionConflict,
    WaitExpired,
)
from server.runner.errors import ResumeRejected as ResumeRejected
from server.runner.errors import TurnBusy as TurnBusy
from server.runner.events import EventType, Listener, RunnerEvent, notify
from server.runner.ids import child_turn_id
from server.runner.loader import AgentCatalog, AgentLoader, load_for_turn
from server.runner.machine import (
    AttemptFailed,
    Blocked,
    CancelChildren,
    ChildStarted,
    Finished,
    FormAsked,
    MakeRunnable,
    ModelReplied,
    Notify,
    Resumed,
    RetryLater,
    Save,
    ShowFinished,
    Started,
    ToolFinished,
    ToolsCollected,
    Touched,
    TurnEffect,
    TurnEvent,
    WakeParent,
    advance,
)
from server.runner.model import ToolSpec
from server.runner.port import ChatPort, NullPort
from server.runner.store import Lease, TurnStore
from server.runner.turn import (
    Audit,
    ModelMessage,
    ParentLink,
    PendingCall,
    Phase,
    ResumeCommand,
    Suspension,
    SuspensionType,
    ToolCall,
    Transition,
    Turn,
    TurnStatus,
    result_text,
)
from server.runner.user_input import REQUEST_USER_INPUT as REQUEST_USER_INPUT

log = logging.getLogger("huddle.runner")

READ_BACK_SECONDS = 30.0
"""How long a resume whose save's answer was lost is asked after while the
store refuses (whether it landed: its listeners hear of it if it did)."""


@dataclass(frozen=True, slots=True)
class PreparedResume:
    """A resume applied to a turn, not yet saved (:meth:`Runner.prepare_resume`):
    the turn to save as runnable, the same turn ``started`` (for a worker it
    is handed to), the audit ``mark`` it adds, and the ``command``."""

    turn: Turn
    started: Turn
    mark: Audit
    command: ResumeCommand


class _Stop(Exception):
    """Internal: the turn is blocked or terminal (``turn``, as saved); stop
    advancing."""

    def __init__(self, turn: Turn) -> None:
        super().__init__(turn.id)
        self.turn = turn


class Runner:
    """Runs the turns of ``agents`` against ``store``; see the module
    docstring. ``owner`` names this runner in leases.

    ``loader`` finds a turn's agent by name and version (default: an
    :class:`~server.runner.loader.AgentCatalog` of ``agents``, their older
    versions and their child agents). ``max_attempts`` bounds failed
    attempts in a row (see the module docstring); the n-th failed one waits
    ``attempt_backoff * 2**(n-1)`` seconds before the next.
    """

    def __init__(
        self,
        store: TurnStore,
        agents: Iterable[Agent] = (),
        *,
        loader: AgentLoader | None = None,
        port: ChatPort | None = None,
        clock: Callable[[], float] = time.time,
        owner: str | None = None,
        lease_seconds: float = 30.0,
        max_attempts: int = 5,
        attempt_backoff: float = 1.0,
    ) -> None:
        self.store = store
        catalog = AgentCatalog(agents)
        self.loader: AgentLoader = loader or catalog
        self.agents = catalog.active()
        """The active version of every agent given, by name."""
        self.max_attempts = max_attempts
        self.attempt_backoff = attempt_backoff
        self.port: ChatPort = port or NullPort()
        self.clock = clock
        self.owner = owner or f"runner-{secrets.token_hex(4)}"
        self.lease_seconds = lease_seconds
        self.listeners: list[Listener] = []
        self._background: set[asyncio.Task[None]] = set()
        self._cancelled: dict[str, asyncio.Event] = {}
        """The cancel signal of each turn this runner executes now."""

    def agent(self, name: str) -> Agent:
        """The active version of agent ``name`` (what new turns get)."""
        found = self.loader.load_active(name)
        if found is None:
            raise UnknownAgent(name)
        return found

    def agent_for(self, turn: Turn) -> Agent:
        """The version of its agent ``turn`` started with. Raises
        UnknownAgent or AgentVersionGone."""
        return load_for_turn(self.loader, turn.agent, turn.agent_version)

    def _emit(self, type_: EventType, turn: Turn, **data: Any) -> None:
        notify(self.listeners, RunnerEvent(type_, turn.id, data))

    # ─── Starting ────────────────────────────────────────────────────────

    def new_turn(
        self,
        agent: Agent | str,
        message: str,
        *,
        turn_id: str | None = None,
        chat: str | None = None,
        chat_turn: str | None = None,
        chat_turn_stamp: str | None = None,
        parent: ParentLink | None = None,
    ) -> Turn:
        agent = agent if isinstance(agent, Agent) else self.agent(agent)
        now = self.clock()
        return Turn(
            id=turn_id or secrets.token_hex(8),
            agent=agent.name,
            agent_version=agent.version,
            chat=chat,
            chat_turn=chat_turn,
            chat_turn_stamp=chat_turn_stamp,
            messages=[
                ModelMessage(role="system", content=agent.instructions),
                ModelMessage(role="user", content=message),
            ],
            parent=parent,
            created_at=now,
            updated_at=now,
        )

    async def start(
        self,
        agent: Agent | str,
        message: str,
        *,
        turn_id: str | None = None,
        chat: str | None = None,
        chat_turn: str | None = None,
        chat_turn_stamp: str | None = None,
    ) -> Turn:
        """Create a turn and queue it for a worker; returns at once."""
        new = self.new_turn(
            agent,
            message,
            turn_id=turn_id,
            chat=chat,
            chat_turn=chat_turn,
            chat_turn_stamp=chat_turn_stamp,
        )
        turn = await self.store.create(new)
        await self.store.make_runnable(turn.id, self.clock())
        return turn

    async def run(
        self,
        agent: Agent | str,
        message: str,
        *,
        turn_id: str | None = None,
        chat: str | None = None,
        chat_turn: str | None = None,
    ) -> Turn:
        """Create a turn and advance it in the caller until it is blocked or
        terminal."""
        new = self.new_turn(agent, message, turn_id=turn_id, chat=chat, chat_turn=chat_turn)
        turn = await self.store.create(new)
        return await self.execute(turn.id)

    # ─── Resuming ────────────────────────────────────────────────────────

    async def resume(self, turn_id: str, command: ResumeCommand) -> Turn:
        """Apply ``command`` and continue in the caller until blocked or
        terminal. Raises ResumeRejected."""
        await self._apply_resume(turn_id, command)
        return await self.execute(turn_id)

    async def submit_resume(
        self, turn_id: str, command: ResumeCommand, *, loaded: Turn | None = None
    ) -> Turn:
        """Validate and apply ``command``, save the turn as runnable (handed
        to a waiting worker, or queued) and return; a worker continues it.
        Raises ResumeRejected.

        ``loaded`` is the turn as the caller last read it (it may be
        stale): it spares a load when it is still current;
        a save of a stale one fails and the resume is decided again on the
        turn as it is, and a refusal is only ever decided on a fresh load."""
        return await self._apply_resume(turn_id, command, loaded=loaded, runnable=True)

    async def _apply_resume(
        self,
        turn_id: str,
        command: ResumeCommand,
        *,
        loaded: Turn | None = None,
        runnable: bool = False,
    ) -> Turn:
        while True:
            fresh = loaded is None
            turn = await self.store.load(turn_id) if loaded is None else loaded
            loaded = None
            try:
                self._check_resume(turn, command)
                turn = self._resume_changes(turn, command)
            except ResumeRejected:
                if fresh:
                    raise
                continue  # the caller's copy may be stale: refuse only on what is there
            try:
                if runnable:
                    started = _started(turn, self.clock())
                    saved = await self.store.save_runnable(turn, self.clock(), started=started)
                else:
                    saved = await self.store.save(turn)
            except VersionConflict:
                continue  # someone else changed it: decide again on what is there now
            except StoreUnavailable:
                # The save may have landed all the same (its answer lost):
                # the turn then resumes, and its listeners must hear of it.
                self._in_background(self._read_back(turn_id, turn.audit[-1], command))
                raise
            self._resumed(saved, turn.audit[-1], command)
            return saved

    def prepare_resume(self, turn: Turn, command: ResumeCommand) -> PreparedResume:
        """``command`` applied to ``turn`` (a copy read ahead), as
        :meth:`submit_resume` would save it, for a caller that saves it
        another way (a rider on the chat's append: server.runner.bridge)
        and then tells :meth:`resumed`. Raises ResumeRejected, which on a
        copy read ahead may be stale: decide again with submit_resume."""
        self._check_resume(turn, command)
        resumed = self._resume_changes(turn, command)
        started = _started(resumed, self.clock())
        return PreparedResume(resumed, started, resumed.audit[-1], command)

    def resumed(self, saved: Turn, prepared: PreparedResume) -> None:
        """``prepared`` was saved (as ``saved``) by its caller."""
        self._resumed(saved, prepared.mark, prepared.command)

    def read_back(self, turn_id: str, prepared: PreparedResume) -> None:
        """Whether ``prepared`` was saved is unknown (the answer lost): its
        listeners hear of it if the turn shows it saved."""
        self._in_background(self._read_back(turn_id, prepared.mark, prepared.command))

    def _resumed(self, saved: Turn, mark: Audit, command: ResumeCommand) -> None:
        self._emit(
            EventType.TURN_RESUMED, saved, command=command.type.value, chat=saved.chat, resume=mark
        )

    async def _read_back(self, turn_id: str, mark: Audit, command: ResumeCommand) -> None:
        """A resume whose save's answer was lost: its listeners hear of it
        once the turn shows it saved (its ``mark`` in the turn's record),
        asked again while the store refuses, for up to READ_BACK_SECONDS
        (or until :meth:`settled` at a stop)."""
        until, pause = time.monotonic() + READ_BACK_SECONDS, 0.05
        while True:
            try:
                turn = await self.store.load(turn_id)
                break
            except StoreUnavailable as error:
                if time.monotonic() + pause >= until:
                    log.warning("whether %s's resume was saved is unknown: %s", turn_id, error)
                    return
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)
            except HuddleError as error:
                log.warning("could not read back %s's resume: %s", turn_id, error)
                return
        if mark in turn.audit:
            self._resumed(turn, mark, command)

    def _in_background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Future[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("the runner's background work failed", exc_info=error)

    async def settled(self, until: float) -> None:
        """At a stop: what the runner does in the background (a resume's
        save read back, a tool's progress told) may finish up to ``until``
        (``time.monotonic()``); what is left then is cancelled, logged."""
        if not self._background:
            return
        _, left = await asyncio.wait(
            list(self._background), timeout=max(0.0, until - time.monotonic())
        )
        if left:
            log.error("%d of the runner's background tasks cut off at the stop", len(left))
        for task in left:
            task.cancel()

    def _check_resume(self, turn: Turn, command: ResumeCommand) -> None:
        def refuse(reason: str, errors: list[str] | None = None) -> None:
            raise ResumeRejected(turn.id, reason, errors)

        if turn.is_terminal:
            refuse(f"the turn is {turn.status.value}: a late resume reopens nothing")
        if turn.cancel_requested and command.type != SuspensionType.RETRY:
            refuse("the turn is being cancelled: a resume changes nothing")
        suspension = turn.suspension
        if not turn.is_blocked or suspension is None:
            refuse(f"the turn is {turn.status.value}, not waiting: a duplicate resume?")
            return
        if command.type != suspension.type:
            refuse(f"the turn waits for {suspension.type.value}, not {command.type.value}")
        if command.correlation_id != suspension.correlation_id:
            refuse(
                f"the turn waits on {suspension.correlation_id!r}, not {command.correlation_id!r}"
            )
        if command.failure is not None:
            return  # it ends the turn: nothing of it needs to fit the wait
        if command.type == SuspensionType.RETRY:
            due = suspension.due_at or 0.0
            if due > self.clock():
                refuse(f"the retry is not due for {due - self.clock():.1f} s")
        if command.type == SuspensionType.USER_INPUT:
            user_input.check_answer(turn, suspension, command)
        if command.type == SuspensionType.TOOL_APPROVAL:
            approvals.check_edit(turn, self._tool_of(turn, command.correlation_id), command)
        if command.type == SuspensionType.CHILD_AGENT:
            _child_call(turn, command.correlation_id)

    def _tool_of(self, turn: Turn, call_id: str | None) -> Tool | None:
        """The tool of ``turn``'s pending call ``call_id`` (None: no such
        call, or its agent is gone: the resume fails on that later)."""
        pending = next((p for p in turn.pending if p.call.id == call_id), None)
        if pending is None:
            return None
        try:
            return self.agent_for(turn).tool(pending.call.name)
        except (UnknownAgent, AgentVersionGone):
            return None

    def _resume_changes(self, turn: Turn, command: ResumeCommand) -> Turn:
        """``turn`` as ``command`` (checked) resumes it: READY again."""
        suspension = turn.suspension
        assert suspension is not None
        at = self.clock()
        mark = Audit(
            command=command.type.value,
            correlation_id=command.correlation_id,
            metadata=command.metadata,
            at=at,
        )
        call_id = command.correlation_id
        event = Resumed(at=at, mark=mark)
        if command.failure is not None:
            event = Resumed(at=at, mark=mark, failing=command.failure)
        elif suspension.is_plain_question:
            event = Resumed(at=at, mark=mark, message=user_input.plain_answer(command))
        elif command.type == SuspensionType.USER_INPUT:
            form = suspension.form
            assert form is not None
            answered = user_input.answered(_require_call(turn, call_id), form, command)
            event = Resumed(at=at, mark=mark, call=answered)
        elif command.type == SuspensionType.TOOL_APPROVAL:
            answered = approvals.answered(_require_call(turn, call_id), command)
            event = Resumed(at=at, mark=mark, call=answered)
        elif command.type == SuspensionType.CHILD_AGENT:
            pending = _child_call(turn, call_id)
            finished = {"status": command.child_status, "output": command.child_output}
            event = Resumed(at=at, mark=mark, call=pending.with_result(finished))
        resumed, _ = advance(turn, event)
        return resumed

    async def cancel(self, turn_id: str) -> Turn:
        """Ask to cancel: a flag no save clears. A blocked turn is ended by
        a worker at once; a running one at its next step (and its tools see
        ``cancellation_requested``). Its child turns, and theirs, are
        cancelled too; a child that ends after that changes nothing."""
        turn = await self._request_cancel(turn_id)
        waiting = list(turn.children)
        seen = {turn_id}
        while waiting:
            child_id = waiting.pop()
            if child_id in seen:
                continue
            seen.add(child_id)
            with contextlib.suppress(HuddleError):
                child = await self._request_cancel(child_id)
                waiting.extend(child.children)
        return turn

    async def _request_cancel(self, turn_id: str) -> Turn:
        await self.store.request_cancel(turn_id)
        executing = self._cancelled.get(turn_id)
        if executing is not None:
            executing.set()  # its tools see it now, not at the lease keeper's next poll
        turn = await self.store.load(turn_id)
        if turn.is_blocked or turn.status == TurnStatus.READY:
            await self.store.make_runnable(turn_id, self.clock())
        return turn

    async def suspend(self, turn: Turn, suspension: Suspension) -> Turn:
        """Block ``turn`` on ``suspension`` (custom control flow; the
        plain-text ``Suspension.user_input(...)`` path). Returns it saved.
        Raises IllegalTransition unless the turn is READY or RUNNING. A
        question without an expiry gets the agent's ``input_expiry``."""
        if suspension.type == SuspensionType.USER_INPUT and suspension.expiry is None:
            with contextlib.suppress(HuddleError):
                default = self.agent_for(turn).input_expiry
                suspension = msgspec.structs.replace(suspension, expiry=default)
        # Not through the executing pump's effects: no lease to save under,
        # and a question is shown at once (a RETRY is not queued here).
        turn, _ = advance(turn, Blocked(at=self.clock(), suspension=suspension))
        saved = await self.store.save(turn)
        self._emit(EventType.TURN_SUSPENDED, saved, type=suspension.type.value)
        await self.port.input_requested(saved, suspension)
        return saved

    # ─── Executing ───────────────────────────────────────────────────────

    async def execute(self, turn_id: str | None = None) -> Turn:
        """Claim ``turn_id`` (or the next due turn) and advance it until it
        is blocked or terminal. Raises TurnBusy (held elsewhere), Fenced
        (taken over meanwhile)."""
        claim = await self.store.claim_turn(self.owner, self.clock(), self.lease_seconds, turn_id)
        if claim is None:
            raise TurnBusy(turn_id or "(any)")
        return await self.execute_claimed(claim.lease, claim.turn, running=claim.running)

    async def execute_claimed(
        self, lease: Lease, turn: Turn | None = None, *, running: bool = False
    ) -> Turn:
        """Advance the turn ``lease`` holds (from ``store.claim``; ``turn``
        as loaded with it, from ``store.claim_turn`` or a hand-over, else it
        is loaded) until it is blocked or terminal, then give the lease up.
        ``running``: it was handed over started (``Claim.running``).

        An error the runner cannot turn into a result is a failed attempt:
        recorded on the turn, which is scheduled again with backoff or, at
        ``max_attempts``, failed. When even that cannot be saved (the store
        is down, the lease was taken over) the error propagates and the
        lease is kept to expire, so that a worker takes the turn over as
        after a crash (released alone, a RUNNING turn would be claimed by
        nobody).

        Cancelled (its worker stopping: server.runner.worker.Crew.stop), it
        hands the turn on (``store.give_up``): another worker takes it over
        at once, as after a crash (one attempt counted, the step that was
        running done again), instead of once the lease has expired.
        """
        try:
            advanced = await self._advance_leased(lease, turn, running)
            await self.store.release(lease)
        except asyncio.CancelledError:
            # Also in the release: a turn handed on as it blocked is only
            # claimed and found blocked; a lease kept would hold an answer's
            # resume back until it expired.
            with contextlib.suppress(StoreError):
                await self.store.give_up(lease, self.clock())
            raise
        return advanced

    async def _advance_leased(self, lease: Lease, turn: Turn | None, running: bool) -> Turn:
        """:meth:`execute_claimed`'s work, under the lease and its keeper."""
        cancelled = asyncio.Event()
        self._cancelled[lease.turn_id] = cancelled
        keeper = asyncio.create_task(self._keep_lease(lease, cancelled))
        try:
            if turn is None:
                turn = await self.store.load(lease.turn_id)
            if turn.cancel_requested:
                cancelled.set()
            try:
                advanced = await self._advance(turn, lease, cancelled, running)
            except (StoreError, asyncio.CancelledError):
                raise
            except Exception as error:
                advanced = await self._attempt_failed(lease, error)
        finally:
            if self._cancelled.get(lease.turn_id) is cancelled:
                del self._cancelled[lease.turn_id]
            keeper.cancel()
            # asyncio.wait, not suppressing CancelledError: a cancel of the
            # caller (a worker stopping) arriving now must not be swallowed.
            await asyncio.wait({keeper})
            if not keeper.cancelled() and keeper.exception() is not None:
                log.warning("lease keeper of turn %s failed: %s", lease.turn_id, keeper.exception())
        return advanced

    async def _keep_lease(self, lease: Lease, cancelled: asyncio.Event) -> None:
        """Renew the lease while the turn runs; watch the cancel flag (the
        flag alone: the turn is not loaded)."""
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            renewed = await self.store.renew(lease, self.clock(), self.lease_seconds)
            if renewed is None:
                return  # fenced: the next save fails
            if await self.store.cancel_requested(lease.turn_id):
                cancelled.set()

    async def _advance(
        self, turn: Turn, lease: Lease, cancelled: asyncio.Event, running: bool = False
    ) -> Turn:
        if turn.is_terminal:
            return turn
        if turn.status == TurnStatus.RETRY_SCHEDULED:
            due = turn.suspension.due_at if turn.suspension else None
            if due is not None and due > self.clock() and not turn.cancel_requested:
                # Claimed early (by id, or as an expired lease), which took it
                # off the queue: put it back for its time and keep the backoff.
                await self.store.make_runnable(turn.id, due)
                return turn
        elif turn.is_blocked and not turn.cancel_requested:
            return turn
        taken_over = turn.status == TurnStatus.RUNNING and not running
        try:
            if turn.cancel_requested:
                # A cancel needs no agent: end it before looking one up.
                await self._finish(self._start(turn), lease, Transition.CANCEL)
            if turn.failing is not None:
                # A wait that can never be answered: nothing runs.
                await self._finish(self._start(turn), lease, Transition.FAIL, turn.failing)
            agent = self.agent_for(turn)
            if taken_over:
                turn = await self._take_over(turn, lease)
            if not running:
                turn = await self.store.save(self._start(turn), lease=lease)
            elif lease.until - self.clock() < self.lease_seconds * 2 / 3:
                # Handed over started, but taken up late (this process was
                # busy): make sure the lease is still ours before anything
                # happens (the save is fenced).
                turn = await self._apply(turn, lease, Touched(at=self.clock()))
            self._emit(EventType.TURN_STARTED, turn)
            await self.port.turn_started(turn)
            if taken_over:
                await self.port.turn_taken_over(turn)
            while True:
                if cancelled.is_set() or turn.cancel_requested:
                    await self._finish(turn, lease, Transition.CANCEL)
                if turn.phase == Phase.MODEL:
                    turn = await self._model_step(agent, turn, lease)
                else:
                    turn = await self._tools_step(agent, turn, lease, cancelled)
        except _Stop as stop:
            return stop.turn

    # ─── The pump ────────────────────────────────────────────────────────

    def _start(self, turn: Turn) -> Turn:
        started, _ = advance(turn, Started(at=self.clock()))
        return started

    async def _apply(self, turn: Turn, lease: Lease, event: TurnEvent) -> Turn:
        """Feed ``event`` to the machine and run the effects it asks for (a
        save under ``lease`` first); returns the turn as saved, or raises
        _Stop when it is blocked or terminal."""
        turn, effects = advance(turn, event)
        for effect in effects:
            turn = await self._run_effect(turn, lease, effect)
        if turn.is_blocked or turn.is_terminal:
            raise _Stop(turn)
        return turn

    async def _run_effect(self, turn: Turn, lease: Lease, effect: TurnEffect) -> Turn:
        match effect:
            case Save():
                return await self.store.save(turn, lease=lease)
            case Notify(type=type_, data=data):
                self._emit(type_, turn, **data)
            case MakeRunnable(at=at):
                await self.store.make_runnable(turn.id, at)
            case ShowFinished():
                await self.port.turn_finished(turn)
            case CancelChildren(children=children):
                for child_id in children:
                    with contextlib.suppress(HuddleError):
                        await self.cancel(child_id)
            case WakeParent():
                await self._wake_parent(turn)
            case _:
                assert_never(effect)
        return turn

    async def _stop(self, turn: Turn, lease: Lease, event: TurnEvent) -> NoReturn:
        """:meth:`_apply` an event that blocks or ends the turn."""
        await self._apply(turn, lease, event)
        raise AssertionError(f"turn {turn.id}: {type(event).__name__} left it running")

    # ─── Failed attempts ─────────────────────────────────────────────────

    async def _take_over(self, turn: Turn, lease: Lease) -> Turn:
        """``turn`` was RUNNING when claimed: the worker that ran it died or
        stalled. That is a failed attempt; the max_attempts-th fails the
        turn (raises _Stop), else it carries on here."""
        reason = "its worker stopped before the step was saved"
        turn, _ = advance(turn, AttemptFailed(at=self.clock(), error=reason))
        self._emit(EventType.TURN_TAKEN_OVER, turn, attempt=turn.attempts, phase=turn.phase.value)
        if turn.attempts >= self.max_attempts:
            await self._finish(
                turn,
                lease,
                Transition.FAIL,
                f"gave up after {turn.attempts} attempts in a row: {reason}"
                + (f" (in {_running_call(turn)})" if _running_call(turn) else ""),
            )
        return turn

    async def _attempt_failed(self, lease: Lease, error: Exception) -> Turn:
        """Record ``error`` as a failed attempt of the leased turn: schedule
        it again with backoff, or fail it at ``max_attempts``."""
        log.warning("turn %s: attempt failed: %s", lease.turn_id, error, exc_info=error)
        turn = await self.store.load(lease.turn_id)
        if turn.is_terminal or (turn.is_blocked and turn.status != TurnStatus.RETRY_SCHEDULED):
            return turn  # it got where it was going; the error came after
        failed = AttemptFailed(at=self.clock(), error=str(error) or type(error).__name__)
        turn, _ = advance(turn, failed)
        self._emit(
            EventType.ATTEMPT_FAILED,
            turn,
            attempt=turn.attempts,
            error=turn.last_error,
            kind=type(error).__name__,
        )
        if turn.status != TurnStatus.RUNNING:
            turn = self._start(turn)
        try:
            if turn.attempts >= self.max_attempts:
                await self._finish(
                    turn,
                    lease,
                    Transition.FAIL,
                    f"gave up after {turn.attempts} attempts in a row: {turn.last_error}",
                )
            delay = self.attempt_backoff * 2 ** (turn.attempts - 1)
            suspension = Suspension(
                type=SuspensionType.RETRY,
                message=f"attempt {turn.attempts} failed: {turn.last_error}",
                resume_phase=turn.phase,
                due_at=self.clock() + delay,
                metadata={"attempt": turn.attempts, "of": self.max_attempts, "delay": delay},
            )
            await self._stop(turn, lease, Blocked(at=self.clock(), suspension=suspension))
        except _Stop as stop:
            return stop.turn

    async def _finish(
        self, turn: Turn, lease: Lease, ending: Transition, error: str | None = None
    ) -> NoReturn:
        await self._stop(turn, lease, Finished(at=self.clock(), ending=ending, error=error))

    async def _wake_parent(self, child: Turn) -> None:
        assert child.parent is not None
        command = ResumeCommand.child_completed(child.id, child.status.value, child.output)
        with contextlib.suppress(ResumeRejected):
            await self.submit_resume(child.parent.turn_id, command)

    async def _retry_later(
        self,
        agent: Agent,
        turn: Turn,
        lease: Lease,
        error: str,
        not_before: float | None = None,
    ) -> NoReturn:
        """Schedule a transient failure's retry with backoff, or, out of
        retries, fail the turn. ``not_before`` is a wait the failure asked
        for (a model API's ``Retry-After``): the backoff is never shorter."""
        if turn.retry_attempts >= agent.max_retries:
            await self._finish(turn, lease, Transition.FAIL, f"gave up: {error}")
        delay = max(agent.retry_backoff * (2**turn.retry_attempts), not_before or 0.0)
        self._emit(EventType.RETRY_SCHEDULED, turn, delay=delay, error=error)
        now = self.clock()
        await self._stop(turn, lease, RetryLater(at=now, error=error, due_at=now + delay))

    # ─── The model ───────────────────────────────────────────────────────

    async def _model_step(self, agent: Agent, turn: Turn, lease: Lease) -> Turn:
        if turn.iterations >= agent.max_iterations:
            await self._finish(turn, lease, Transition.REACH_MAX_ITERATIONS)

        async def on_text(delta: str) -> None:
            await self.port.text(turn, delta)

        try:
            reply = await agent.model.complete(turn.messages, _tool_specs(agent), on_text)
        except TransientError as error:
            wait = retry_after_seconds(error, self.clock())
            await self._retry_later(agent, turn, lease, f"model: {error}", wait)
        except Exception as error:
            log.exception("model failed in turn %s", turn.id)
            await self._finish(turn, lease, Transition.FAIL, f"model failed: {error}")
        # With tool calls, every call is saved before any runs; with none,
        # the turn is complete.
        replied = ModelReplied(at=self.clock(), text=reply.text, tool_calls=reply.tool_calls)
        return await self._apply(turn, lease, replied)

    # ─── Tools ───────────────────────────────────────────────────────────

    async def _tools_step(
        self, agent: Agent, turn: Turn, lease: Lease, cancelled: asyncio.Event
    ) -> Turn:
        for pending in turn.pending:
            if pending.result is not None:
                continue
            if cancelled.is_set():
                return turn  # the loop ends it
            result, counted = await self._call(agent, turn, lease, pending, cancelled)
            finished = ToolFinished(
                at=self.clock(), call_id=pending.call.id, result=result, counted=counted
            )
            turn = await self._apply(turn, lease, finished)  # each result on its own
        # Not saved on its own: it follows from what is saved (every
        # result), and the model step's next save carries it. A crash before
        # that comes back here with every result and moves on the same way.
        collected, _ = advance(turn, ToolsCollected(at=self.clock()))
        return collected

    async def _call(
        self,
        agent: Agent,
        turn: Turn,
        lease: Lease,
        pending: PendingCall,
        cancelled: asyncio.Event,
    ) -> tuple[str, bool]:
        """Run one pending call and return its result, and whether it ran
        (counted against ``max_tool_calls``); suspends (raises _Stop) when
        it must wait."""
        call = pending.call
        if call.name == REQUEST_USER_INPUT:
            asked = user_input.requested_form(agent, call)
            if isinstance(asked, str):
                return asked, False  # no such form: the model reads why
            await self._ask_for_input(turn, lease, call, Blocked(at=self.clock(), suspension=asked))
        tool = agent.tool(call.name)
        if tool is None:
            missing = {"status": "error", "message": f"there is no tool {call.name!r}"}
            return result_text(missing), False
        # The budget first: nobody is asked to approve a call that would not run.
        if turn.tool_calls_made >= agent.max_tool_calls:
            await self._finish(turn, lease, Transition.EXCEED_BUDGET)
        denied = await self._approve(agent, turn, lease, pending, tool)
        if denied is not None:
            return denied, False
        if tool.child is not None:
            await self._spawn_child(turn, lease, call, tool.child)  # a call, counted as it starts
        await self.port.tool_started(turn, call, tool)
        self._emit(EventType.TOOL_STARTED, turn, call_id=call.id, tool=tool.name)
        return await self._run_tool(agent, turn, lease, pending, tool, cancelled), True

    async def _run_tool(
        self,
        agent: Agent,
        turn: Turn,
        lease: Lease,
        pending: PendingCall,
        tool: Tool,
        cancelled: asyncio.Event,
    ) -> str:
        call = pending.call
        port = self.port

        def progress(message: str, data: dict[str, Any]) -> None:
            self._emit(EventType.TOOL_PROGRESS, turn, call_id=call.id, message=message)
            self._in_background(port.tool_progress(turn, call, message, data))

        context = ToolContext(
            turn_id=turn.id,
            root_turn_id=turn.root_turn_id,
            parent_turn_id=turn.parent.turn_id if turn.parent else None,
            agent_id=agent.name,
            agent_version=turn.agent_version,
            tool=tool,
            tool_call=call,
            submitted_form_data=dict(pending.form_data or {}),
            form_submitted=pending.form_data is not None,
            chat=turn.chat,
            chat_turn=turn.chat_turn,
            chat_turn_stamp=turn.chat_turn_stamp,
            port=self.port,
            model=agent.model,
            input_expiry=agent.input_expiry,
            _progress=progress,
            _cancelled=cancelled.is_set,
            _lend=lender(),
        )
        token = enter(context)
        try:
            assert tool.function is not None, f"tool {tool.name} has no function"
            value = tool.function(dict(call.arguments))
            if inspect.isawaitable(value):
                value = await value
        except FormRequired as needed:
            if pending.form_asked:
                again = user_input.asked_again(tool, needed)
                await self._finish(turn, lease, Transition.FAIL, again)
            asked = user_input.required_form(agent, call, needed)
            marked = user_input.form_asked(pending)
            event = FormAsked(at=self.clock(), call=marked, suspension=asked)
            await self._ask_for_input(turn, lease, call, event)
        except WaitExpired as error:
            self._emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=False)
            await self._finish(turn, lease, Transition.FAIL, str(error))
        except TransientError as error:
            await self._retry_later(agent, turn, lease, f"tool {tool.name}: {error}")
        except (_Stop, Fenced, VersionConflict):
            raise
        except Exception as error:
            self._emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=False)
            result = result_text({"status": "error", "message": str(error)})
            await self.port.tool_finished(turn, call, result, False)
            return result
        finally:
            leave(token)
        result = result_text(value)
        self._emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=True)
        await self.port.tool_finished(turn, call, result, True)
        return result

    async def _spawn_child(
        self, turn: Turn, lease: Lease, call: ToolCall, child: Agent
    ) -> NoReturn:
        child_id = child_turn_id(turn.id, call.id)
        task = call.arguments.get("task")
        message = task if isinstance(task, str) else json.dumps(call.arguments)
        chat = await self.port.child_chat(turn, call, child_id)
        link = ParentLink(turn_id=turn.id, call_id=call.id, root_turn_id=turn.root_turn_id)
        child_turn = self.new_turn(
            child, message, turn_id=child_id, chat=chat, chat_turn=child_id, parent=link
        )
        with contextlib.suppress(HuddleError):
            await self.store.create(child_turn)
        started = ChildStarted(
            at=self.clock(),
            call_id=call.id,
            child_id=child_id,
            message=f"waiting for {child.name}",
        )
        try:
            await self._stop(turn, lease, started)
        finally:
            await self.store.make_runnable(child_id, self.clock())

    # ─── Waiting for people ──────────────────────────────────────────────

    async def _approve(
        self, agent: Agent, turn: Turn, lease: Lease, pending: PendingCall, tool: Tool
    ) -> str | None:
        """What the approval policy says of ``pending`` (see
        :mod:`server.runner.approvals`): None when it may run, the tool
        message when it is denied; suspends (raises _Stop) to ask a person."""
        call = pending.call
        decision = approvals.decide(agent, turn, pending, tool)
        if decision.outcome == Outcome.REQUIRE_APPROVAL:
            suspension = approvals.approval_suspension(call, tool, decision)
            self._emit(EventType.TOOL_APPROVAL_REQUESTED, turn, call_id=call.id, code=decision.code)

            async def show(saved: Turn) -> None:
                await self.port.approval_requested(saved, call, tool, decision)

            blocked = Blocked(at=self.clock(), suspension=suspension)
            await self._block_then_show(turn, lease, blocked, show)
        if decision.outcome == Outcome.DENY:
            self._emit(EventType.TOOL_DENIED, turn, call_id=call.id, code=decision.code)
            await self.port.tool_denied(turn, call, tool, decision)
            return approvals.denied_result(decision)
        return None

    async def _ask_for_input(
        self, turn: Turn, lease: Lease, call: ToolCall, event: Blocked | FormAsked
    ) -> NoReturn:
        """Wait on ``event``'s suspension for people to fill in the form of
        ``call`` (see :mod:`server.runner.user_input`)."""
        suspension = event.suspension
        assert suspension.form is not None
        self._emit(EventType.TOOL_INPUT_REQUESTED, turn, call_id=call.id, form=suspension.form.key)

        async def show(saved: Turn) -> None:
            await self.port.input_requested(saved, suspension)

        await self._block_then_show(turn, lease, event, show)

    async def _block_then_show(
        self,
        turn: Turn,
        lease: Lease,
        event: Blocked | FormAsked,
        show: Callable[[Turn], Awaitable[None]],
    ) -> NoReturn:
        """Block on ``event``'s suspension, then show it to people: saved as
        waiting before people see the question, so that an answer that comes
        at once finds the turn waiting for it. When the save failed it is
        shown anyway if it was made (a timeout can hide a save that
        happened)."""
        try:
            await self._stop(turn, lease, event)
        except _Stop as stop:
            await show(stop.turn)
            raise
        except BaseException:
            saved = await self.store.load(turn.id)
            if saved.suspension == event.suspension:
                await show(saved)
            raise

    # ─── Recovery ────────────────────────────────────────────────────────

    async def recover(self) -> int:
        """Wake what a crash may have left asleep: parents whose child has
        finished, and READY turns nobody queued. Returns how many."""
        woken = 0
        for parent_id in await self.store.by_status(TurnStatus.WAITING_FOR_CHILD):
            parent = await self.store.load(parent_id)
            suspension = parent.suspension
            if suspension is None or suspension.correlation_id is None:
                continue
            child = await self.store.load(suspension.correlation_id)
            if child.is_terminal:
                with contextlib.suppress(ResumeRejected):
                    await self._wake_parent(child)
                    woken += 1
        for turn_id in await self.store.by_status(TurnStatus.READY):
            await self.store.make_runnable(turn_id, self.clock())
            woken += 1
        return woken


def _tool_specs(agent: Agent) -> list[ToolSpec]:
    specs = [ToolSpec(t.name, t.description, t.input_schema) for t in agent.tools]
    control = user_input.request_user_input_spec(agent.forms)
    return specs if control is None else [*specs, control]


def retry_after_seconds(error: Exception, now: float) -> float | None:
    """The seconds a model's ``Retry-After`` asks to wait (delta-seconds or
    an HTTP date, RFC 9110), or None when it sent none or one that does not
    parse."""
    if not isinstance(error, ModelUnavailable) or error.retry_after is None:
        return None
    text = error.retry_after.strip()
    if text.isdecimal():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _started(turn: Turn, at: float) -> Turn:
    """A runnable ``turn`` as the worker it is handed to starts it (its RUN
    here); that worker saves no start of its own."""
    started, _ = advance(turn, Started(at=at))
    return started


def _running_call(turn: Turn) -> str | None:
    """The tool the turn was running when it stopped (its first pending call
    without a result), if any."""
    running = next((p for p in turn.pending if p.result is None), None)
    return None if running is None else f"tool {running.call.name}"


def _require_call(turn: Turn, call_id: str | None) -> PendingCall:
    pending = turn.call(call_id or "")
    if pending is None:
        raise ResumeRejected(turn.id, f"the turn has no pending tool call {call_id!r}")
    return pending


def _child_call(turn: Turn, child_id: str | None) -> PendingCall:
    """The pending call of ``turn`` that started child turn ``child_id``
    and waits for its result; ResumeRejected when there is none (a record
    that says it waits for a child no call of it waits for)."""
    for pending in turn.pending:
        if pending.result is None and child_turn_id(turn.id, pending.call.id) == child_id:
            return pending
    raise ResumeRejected(turn.id, f"no call of the turn waits for child turn {child_id!r}")
