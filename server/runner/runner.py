"""The durable runner: turns that wait for people and resume anywhere.

A turn advances in steps, MODEL and TOOLS, each that matters saved before
the next begins (compare-and-set on the turn's version; fenced by the lease
of whoever executes it): :mod:`server.runner.execution` runs them. Every
change of a turn's fields is an event of :mod:`server.runner.machine`, the
only writer of a turn; the runner and its execution feed it events, save
what it returns and run its effects.

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
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec

from server.errors import HuddleError, StoreError, StoreUnavailable
from server.runner import approvals, user_input
from server.runner.agent import Agent
from server.runner.errors import ResumeRejected as ResumeRejected
from server.runner.errors import TurnBusy as TurnBusy
from server.runner.errors import (
    UnknownAgent,
    VersionConflict,
)
from server.runner.events import EventType, Listener, RunnerEvent, notify
from server.runner.execution import Execution
from server.runner.execution import retry_after_seconds as retry_after_seconds
from server.runner.ids import child_turn_id
from server.runner.loader import AgentCatalog, AgentLoader, load_for_turn
from server.runner.machine import (
    Blocked,
    Resumed,
    Started,
    advance,
)
from server.runner.port import ChatPort, NullPort
from server.runner.turn import (
    Audit,
    ModelMessage,
    ParentLink,
    PendingCall,
    ResumeCommand,
    Suspension,
    SuspensionType,
    Turn,
    TurnStatus,
)
from server.runner.turn_store import Lease, TurnStore
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
        self.execution = Execution(self)

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

    def emit(self, type_: EventType, turn: Turn, **data: Any) -> None:
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
            messages=(
                ModelMessage(role="system", content=agent.instructions),
                ModelMessage(role="user", content=message),
            ),
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

        Validating checks that ``command`` is the kind the turn's wait
        expects (plain text, form data, an approval...) and carries its
        correlation id, never its data against a form or a tool's input
        schema: people's answers reach it only as the host accepted them
        (:mod:`server.core.frozen_forms`), and a resume made here in code, by the
        agent's own process, is trusted code, like calling the tool itself.

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
                self.in_background(self._read_back(turn_id, turn.audit[-1], command))
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
        self.in_background(self._read_back(turn_id, prepared.mark, prepared.command))

    def _resumed(self, saved: Turn, mark: Audit, command: ResumeCommand) -> None:
        self.emit(
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

    def in_background(self, work: Awaitable[None]) -> None:
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
        # The kind and the correlation id only: whether data fits a form or
        # a tool's input schema is the host's word (server.core.frozen_forms), given
        # before people's answers reach a turn; a resume made in code is
        # trusted code (see submit_resume).
        if command.type == SuspensionType.USER_INPUT:
            user_input.check_answer(turn, suspension, command)
        if command.type == SuspensionType.CHILD_AGENT:
            _child_call(turn, command.correlation_id)

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
        self.emit(EventType.TURN_SUSPENDED, saved, type=suspension.type.value)
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
        at once, as after a crash (the step that was running done again, but
        no attempt counted: ``Lease.freed``), instead of once the lease has
        expired.
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
                advanced = await self.execution.run_leased(turn, lease, cancelled, running)
            except (StoreError, asyncio.CancelledError):
                raise
            except Exception as error:
                advanced = await self.execution.attempt_failed(lease, error)
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

    async def wake_parent(self, child: Turn) -> None:
        """Resume the parent of ``child`` (ended) with its outcome."""
        assert child.parent is not None
        command = ResumeCommand.child_completed(child.id, child.status.value, child.output)
        with contextlib.suppress(ResumeRejected):
            await self.submit_resume(child.parent.turn_id, command)

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
                    await self.wake_parent(child)
                    woken += 1
        for turn_id in await self.store.by_status(TurnStatus.READY):
            await self.store.make_runnable(turn_id, self.clock())
            woken += 1
        return woken


def _started(turn: Turn, at: float) -> Turn:
    """A runnable ``turn`` as the worker it is handed to starts it (its RUN
    here); that worker saves no start of its own."""
    started, _ = advance(turn, Started(at=at))
    return started


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
