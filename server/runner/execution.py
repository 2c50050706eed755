"""One turn's execution under its lease: the pump of the machine.

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

:class:`Execution` calls the model or the tool, feeds what happened to
:func:`server.runner.machine.advance` as an event, and runs the effects it
returns (the save first); it never sets a turn's field itself. A step that
blocks or ends the turn leaves the loop by raising the internal ``_Stop``
(with the turn as saved), caught where the execution began.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol, assert_never

from server.errors import HuddleError, StoreError
from server.runner import approvals, user_input
from server.runner.agent import Agent, Outcome, Tool
from server.runner.context import ToolContext, enter, leave, lender
from server.runner.errors import (
    Fenced,
    FormRequired,
    ModelUnavailable,
    TransientError,
    VersionConflict,
    WaitExpired,
)
from server.runner.events import EventType
from server.runner.ids import child_turn_id
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
from server.runner.port import ChatPort
from server.runner.turn import (
    ParentLink,
    PendingCall,
    Phase,
    Suspension,
    SuspensionType,
    ToolCall,
    Transition,
    Turn,
    TurnStatus,
    result_text,
)
from server.runner.turn_store import Lease, TurnStore
from server.runner.user_input import REQUEST_USER_INPUT


class Runner(Protocol):
    """What the execution needs of the runner it works for
    (server.runner.runner.Runner is one), named here so that the two
    modules do not import each other."""

    store: TurnStore
    port: ChatPort
    clock: Callable[[], float]
    max_attempts: int
    attempt_backoff: float
    lease_seconds: float

    def agent_for(self, turn: Turn) -> Agent: ...

    def emit(self, type_: EventType, turn: Turn, **data: Any) -> None: ...

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
    ) -> Turn: ...

    def in_background(self, work: Awaitable[None]) -> None: ...

    async def cancel(self, turn_id: str) -> Turn: ...

    async def wake_parent(self, child: Turn) -> None: ...


log = logging.getLogger("huddle.runner")


class _Stop(Exception):
    """Internal: the turn is blocked or terminal (``turn``, as saved); stop
    advancing."""

    def __init__(self, turn: Turn) -> None:
        super().__init__(turn.id)
        self.turn = turn


class Execution:
    """Advances the turns ``runner`` executes, each under its lease (see
    the module docstring): the runner's store, port, clock, listeners and
    limits, read from it as they are now."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    async def run_leased(
        self, turn: Turn, lease: Lease, cancelled: asyncio.Event, running: bool = False
    ) -> Turn:
        if turn.is_terminal:
            return turn
        if turn.status == TurnStatus.RETRY_SCHEDULED:
            due = turn.suspension.due_at if turn.suspension else None
            if due is not None and due > self.runner.clock() and not turn.cancel_requested:
                # Claimed early (by id, or as an expired lease), which took it
                # off the queue: put it back for its time and keep the backoff.
                await self.runner.store.make_runnable(turn.id, due)
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
            agent = self.runner.agent_for(turn)
            if taken_over:
                turn = await self._take_over(turn, lease)
            if not running:
                turn = await self.runner.store.save(self._start(turn), lease=lease)
            elif lease.until - self.runner.clock() < self.runner.lease_seconds * 2 / 3:
                # Handed over started, but taken up late (this process was
                # busy): make sure the lease is still ours before anything
                # happens (the save is fenced).
                turn = await self._apply(turn, lease, Touched(at=self.runner.clock()))
            self.runner.emit(EventType.TURN_STARTED, turn)
            await self.runner.port.turn_started(turn)
            if taken_over:
                await self.runner.port.turn_taken_over(turn)
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
        started, _ = advance(turn, Started(at=self.runner.clock()))
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
                return await self.runner.store.save(turn, lease=lease)
            case Notify(type=type_, data=data):
                self.runner.emit(type_, turn, **data)
            case MakeRunnable(at=at):
                await self.runner.store.make_runnable(turn.id, at)
            case ShowFinished():
                await self.runner.port.turn_finished(turn)
            case CancelChildren(children=children):
                for child_id in children:
                    with contextlib.suppress(HuddleError):
                        await self.runner.cancel(child_id)
            case WakeParent():
                await self.runner.wake_parent(turn)
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
        turn (raises _Stop), else it carries on here. A turn handed on by a
        worker that stopped (``lease.freed``: a rolling deploy) failed
        nothing: it carries on uncounted, however many deploys it spans
        (each hop needs a stop, so a crash loop still counts: a killed
        worker gives nothing up)."""
        if lease.freed:
            self.runner.emit(
                EventType.TURN_TAKEN_OVER,
                turn,
                attempt=turn.attempts,
                phase=turn.phase.value,
                handed_on=True,
            )
            return turn
        reason = "its worker stopped before the step was saved"
        turn, _ = advance(turn, AttemptFailed(at=self.runner.clock(), error=reason))
        self.runner.emit(
            EventType.TURN_TAKEN_OVER, turn, attempt=turn.attempts, phase=turn.phase.value
        )
        if turn.attempts >= self.runner.max_attempts:
            await self._finish(
                turn,
                lease,
                Transition.FAIL,
                f"gave up after {turn.attempts} attempts in a row: {reason}"
                + (f" (in {_running_call(turn)})" if _running_call(turn) else ""),
            )
        return turn

    async def attempt_failed(self, lease: Lease, error: Exception) -> Turn:
        """Record ``error`` as a failed attempt of the leased turn: schedule
        it again with backoff, or fail it at ``max_attempts``."""
        log.warning("turn %s: attempt failed: %s", lease.turn_id, error, exc_info=error)
        turn = await self.runner.store.load(lease.turn_id)
        if turn.is_terminal or (turn.is_blocked and turn.status != TurnStatus.RETRY_SCHEDULED):
            return turn  # it got where it was going; the error came after
        failed = AttemptFailed(at=self.runner.clock(), error=str(error) or type(error).__name__)
        turn, _ = advance(turn, failed)
        self.runner.emit(
            EventType.ATTEMPT_FAILED,
            turn,
            attempt=turn.attempts,
            error=turn.last_error,
            kind=type(error).__name__,
        )
        if turn.status != TurnStatus.RUNNING:
            turn = self._start(turn)
        try:
            if turn.attempts >= self.runner.max_attempts:
                await self._finish(
                    turn,
                    lease,
                    Transition.FAIL,
                    f"gave up after {turn.attempts} attempts in a row: {turn.last_error}",
                )
            delay = self.runner.attempt_backoff * 2 ** (turn.attempts - 1)
            suspension = Suspension(
                type=SuspensionType.RETRY,
                message=f"attempt {turn.attempts} failed: {turn.last_error}",
                resume_phase=turn.phase,
                due_at=self.runner.clock() + delay,
                metadata={"attempt": turn.attempts, "of": self.runner.max_attempts, "delay": delay},
            )
            await self._stop(turn, lease, Blocked(at=self.runner.clock(), suspension=suspension))
        except _Stop as stop:
            return stop.turn

    async def _finish(
        self, turn: Turn, lease: Lease, ending: Transition, error: str | None = None
    ) -> NoReturn:
        await self._stop(turn, lease, Finished(at=self.runner.clock(), ending=ending, error=error))

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
        self.runner.emit(EventType.RETRY_SCHEDULED, turn, delay=delay, error=error)
        now = self.runner.clock()
        await self._stop(turn, lease, RetryLater(at=now, error=error, due_at=now + delay))

    # ─── The model ───────────────────────────────────────────────────────

    async def _model_step(self, agent: Agent, turn: Turn, lease: Lease) -> Turn:
        if turn.iterations >= agent.max_iterations:
            await self._finish(turn, lease, Transition.REACH_MAX_ITERATIONS)

        async def on_text(delta: str) -> None:
            await self.runner.port.text(turn, delta)

        try:
            reply = await agent.model.complete(turn.messages, _tool_specs(agent), on_text)
        except TransientError as error:
            wait = retry_after_seconds(error, self.runner.clock())
            await self._retry_later(agent, turn, lease, f"model: {error}", wait)
        except StoreError:
            # Showing the streamed text failed, not the model: failing the
            # turn would save it failed and then fail to show that too (the
            # chat's store is away), leaving its chat turn active for good.
            # The lease runs out and the step is done again, as after a crash.
            raise
        except Exception as error:
            log.exception("model failed in turn %s", turn.id)
            await self._finish(turn, lease, Transition.FAIL, f"model failed: {error}")
        # With tool calls, every call is saved before any runs; with none,
        # the turn is complete.
        replied = ModelReplied(
            at=self.runner.clock(), text=reply.text, tool_calls=tuple(reply.tool_calls)
        )
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
                at=self.runner.clock(), call_id=pending.call.id, result=result, counted=counted
            )
            turn = await self._apply(turn, lease, finished)  # each result on its own
        # Not saved on its own: it follows from what is saved (every
        # result), and the model step's next save carries it. A crash before
        # that comes back here with every result and moves on the same way.
        collected, _ = advance(turn, ToolsCollected(at=self.runner.clock()))
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
            await self._ask_for_input(
                turn, lease, call, Blocked(at=self.runner.clock(), suspension=asked)
            )
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
        await self.runner.port.tool_started(turn, call, tool)
        self.runner.emit(EventType.TOOL_STARTED, turn, call_id=call.id, tool=tool.name)
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
        port = self.runner.port

        def progress(message: str, data: dict[str, Any]) -> None:
            self.runner.emit(EventType.TOOL_PROGRESS, turn, call_id=call.id, message=message)
            self.runner.in_background(port.tool_progress(turn, call, message, data))

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
            port=self.runner.port,
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
            event = FormAsked(at=self.runner.clock(), call=marked, suspension=asked)
            await self._ask_for_input(turn, lease, call, event)
        except WaitExpired as error:
            self.runner.emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=False)
            await self._finish(turn, lease, Transition.FAIL, str(error))
        except TransientError as error:
            await self._retry_later(agent, turn, lease, f"tool {tool.name}: {error}")
        except (_Stop, Fenced, VersionConflict):
            raise
        except Exception as error:
            self.runner.emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=False)
            result = result_text({"status": "error", "message": str(error)})
            await self.runner.port.tool_finished(turn, call, result, False)
            return result
        finally:
            leave(token)
        result = result_text(value)
        self.runner.emit(EventType.TOOL_COMPLETED, turn, call_id=call.id, success=True)
        await self.runner.port.tool_finished(turn, call, result, True)
        return result

    async def _spawn_child(
        self, turn: Turn, lease: Lease, call: ToolCall, child: Agent
    ) -> NoReturn:
        child_id = child_turn_id(turn.id, call.id)
        task = call.arguments.get("task")
        message = task if isinstance(task, str) else json.dumps(call.arguments)
        chat = await self.runner.port.child_chat(turn, call, child_id)
        link = ParentLink(turn_id=turn.id, call_id=call.id, root_turn_id=turn.root_turn_id)
        child_turn = self.runner.new_turn(
            child, message, turn_id=child_id, chat=chat, chat_turn=child_id, parent=link
        )
        with contextlib.suppress(HuddleError):
            await self.runner.store.create(child_turn)
        started = ChildStarted(
            at=self.runner.clock(),
            call_id=call.id,
            child_id=child_id,
            message=f"waiting for {child.name}",
        )
        try:
            await self._stop(turn, lease, started)
        finally:
            await self.runner.store.make_runnable(child_id, self.runner.clock())

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
            self.runner.emit(
                EventType.TOOL_APPROVAL_REQUESTED, turn, call_id=call.id, code=decision.code
            )

            async def show(saved: Turn) -> None:
                await self.runner.port.approval_requested(saved, call, tool, decision)

            blocked = Blocked(at=self.runner.clock(), suspension=suspension)
            await self._block_then_show(turn, lease, blocked, show)
        if decision.outcome == Outcome.DENY:
            self.runner.emit(EventType.TOOL_DENIED, turn, call_id=call.id, code=decision.code)
            await self.runner.port.tool_denied(turn, call, tool, decision)
            return approvals.denied_result(decision)
        return None

    async def _ask_for_input(
        self, turn: Turn, lease: Lease, call: ToolCall, event: Blocked | FormAsked
    ) -> NoReturn:
        """Wait on ``event``'s suspension for people to fill in the form of
        ``call`` (see :mod:`server.runner.user_input`)."""
        suspension = event.suspension
        assert suspension.form is not None
        self.runner.emit(
            EventType.TOOL_INPUT_REQUESTED, turn, call_id=call.id, form=suspension.form.key
        )

        async def show(saved: Turn) -> None:
            await self.runner.port.input_requested(saved, suspension)

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
            saved = await self.runner.store.load(turn.id)
            if saved.suspension == event.suspension:
                await show(saved)
            raise


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


def _running_call(turn: Turn) -> str | None:
    """The tool the turn was running when it stopped (its first pending call
    without a result), if any."""
    running = next((p for p in turn.pending if p.result is None), None)
    return None if running is None else f"tool {running.call.name}"
