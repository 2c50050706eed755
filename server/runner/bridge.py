"""A runner's turns as AHP turns in chats, both ways.

Outward (:class:`ChatBridge` is the runner's port): model text streams as a
markdown part per model reply (``<turn>:md:<n>``) and ``chat/delta``; a tool
call shows its whole lifecycle (``toolCallStart``, ``toolCallReady``,
``toolCallComplete``); REQUIRE_APPROVAL shows as a ``pending-confirmation``
call with approve and deny options; a policy DENY as a call denied before it
ran; a form as an input request ``<turnId>:input:<callId>`` whose questions
come from the frozen schema (which the host then checks accepts against);
progress as the running call's content; the end of the turn as
``chat/turnComplete``, ``chat/error`` or ``chat/turnCancelled``.

Inward (:meth:`ChatBridge.hook`, a host hook acting only on what this
process accepted, so that one process acts on each action): a
participant's ``chat/turnStarted`` starts the session's agent;
``chat/inputCompleted`` of a request the runner opened becomes
``user_input``; ``chat/toolCallConfirmed`` becomes ``approve_tool``
or ``reject_tool``; ``chat/turnCancelled`` cancels; an agent's
``chat/error`` or ``chat/turnComplete`` of the turn's AHP turn fails it when
it waits (an error) and cancels it otherwise: nothing it does could show any
more (and should the reaction be lost, the turn's next output finds its chat
turn over and cancels it). Each resume carries who did it (name, role,
client id) for the turn's audit.

The sweep (:meth:`ChatBridge.reconcile`, run periodically by the workers)
lives in server.runner.sweep: it recovers what a crash between a chat and
the runner left undone (an answer the runner never heard, a chat turn's end
it never reacted to, a question its chat never showed), through this
bridge: its runner and host, :meth:`ChatBridge.chat_turn_ended`, and
showing a question again as a worker shows it.

A turn's AHP turn is ``runner_turn_id(chat, chatTurn)`` for a turn people
started; a child turn's AHP turn in its own chat has the child's id (see
:meth:`ChatBridge.turn_of`). AHP turn ids are the client's: one a truncation
took away may come back. The server stamps each turn a client starts
(``_meta.huddle.turn``, server.policy.turn_stamp), the runner's turn keeps
the stamp of the AHP turn it shows (a turn id used again gets the stamped
``runner_turn_id``), and the bridge matches the two by id and stamp: the
earlier turn, still winding down, reaches nothing of the later one (its
tools' questions neither: server.mcp.tools.people_of_current_call), and
the waits truncated away lose their notes and expiries (server.notes,
server.expiry).

A resume costs the chat's append alone: when a question of a turn shows in
a chat this process holds (``chat/inputRequested``, a call waiting for
confirmation), the turn is read ahead (its worker saved it as waiting
before it asked), and the person's answer resumes it from that copy with a
compare-and-set. On Redis that save rides on the answer's append, in its
script, once the entry landed (:meth:`ChatBridge.riding`); elsewhere it is
one save after it. A stale copy costs one more load and save, and a refusal
is decided on a fresh one (see ``Runner.submit_resume``). A coroutine tool's start is
shown while the tool runs (people cannot tell; the tool starts a round trip
or two sooner); everything the bridge shows of a turn is shown in order.

A turn taken over after its worker died (:meth:`ChatBridge.turn_taken_over`)
leaves nothing open that nobody waits for: the MCP questions the dead
worker's tool asked are withdrawn (the replayed tool asks again), results
it saved but never showed are shown, and text it streamed is marked as cut
off; the retried reply streams into a part of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import secrets
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any

from protocol.actions import (
    ChatDelta,
    ChatError,
    ChatInputCompleted,
    ChatInputRequested,
    ChatResponsePart,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTruncated,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionServerToolsChanged,
    StateAction,
)
from protocol.chat import (
    ActiveTurn,
    ChatState,
    ConfirmationOption,
    InputRequest,
    InputRequestPart,
    MarkdownPart,
    Message,
    MessageOrigin,
    TextContent,
    TextQuestion,
    ToolCallCancelled,
    ToolCallCompleted,
    ToolCallResult,
)
from protocol.chat import Turn as ChatTurn
from protocol.messages import ActionEnvelope, ChannelState
from protocol.session import SessionState, ToolDefinition
from protocol.uris import chat_uri
from protocol.wire import ErrorInfo
from reducers import notes
from reducers.chat import select_input_settlement, select_tool_call
from reducers.clock import iso_ms, iso_time
from server.auth import Identity
from server.cache import Lru
from server.channels import Applied, Step
from server.errors import ActionRejected, ChannelGone, HuddleError
from server.expiry import Expiry
from server.host import Host
from server.policy import turn_stamp
from server.runner.agent import Agent, ApprovalDecision, Tool
from server.runner.errors import TurnExists, TurnNotFound, VersionConflict
from server.runner.ids import (
    input_request_id,
    markdown_part_id,
    parse_input_request_id,
    parse_markdown_part_id,
    parse_mcp_request_id,
    runner_turn_id,
)
from server.runner.resume import (
    REPLY,
    decision_of,
    ended_turn,
    input_command,
    shows,
)
from server.runner.runner import PreparedResume, ResumeRejected, Runner
from server.runner.sweep import Sweep
from server.runner.turn import (
    ResumeCommand,
    Suspension,
    ToolCall,
    Turn,
    TurnStatus,
)
from server.store.base import Rider

log = logging.getLogger("huddle.runner.bridge")

APPROVE = ConfirmationOption(id="approve", label="Approve", kind="approve")
DENY = ConfirmationOption(id="deny", label="Deny", kind="deny")
INTERRUPTED = "\n\n*(Interrupted: this reply was cut off and is being retried.)*"
"""Appended to text whose stream a crash or a transient failure cut off."""
EXPIRY_AUDIT = {"by": None, "role": None, "clientId": None, "via": "expiry"}
"""Who resumed a turn whose wait expired: nobody; the expiry did."""
READ_AHEAD = 256
"""Turns read ahead (waiting for the people of a chat) kept in memory."""


class ChatBridge:
    """Shows a runner's turns in chats and feeds people's actions back."""

    def __init__(self, host: Host, agent: Agent, *, ask_again_after: float = 10.0) -> None:
        self.host = host
        self.agent = agent
        self.runner: Runner | None = None
        self.started_at: dict[str, float] = {}
        self.ask_again_after = ask_again_after
        """Seconds a suspension may go unseen in its chat before a sweep
        asks again (its worker may be showing it right now)."""
        self._read_ahead: Lru[str, Turn] = Lru(READ_AHEAD)
        """Turns whose question shows in a chat, as read then, by id; each
        is used once, by the resume that answers it."""
        self._showing: dict[str, asyncio.Task[None]] = {}
        """Per turn, what is being shown of it in the background; the rest
        of what is shown of that turn waits for it."""
        self._folds: Lru[str, _Fold] = Lru(READ_AHEAD)
        """Per chat, the resume that rode on this process's latest append
        there (:meth:`riding`), until the hook of that envelope takes it."""
        self._unstarted: Lru[str, None] = Lru(READ_AHEAD)
        """Turns whose start could not be shown here (tools unpublished, the
        chat turn not opened): their next execution here tries again."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping: set[str] = set()
        """Turns being cancelled because their chat turn ended without them."""
        self.sweep = Sweep(self)
        """The periodic sweep (:meth:`reconcile`)."""

    def attach(self, runner: Runner) -> None:
        self.runner = runner
        runner.port = self
        self.host.add_hook(self.hook)
        self.host.core.riding.append(self.riding)

    # ─── Outward ─────────────────────────────────────────────────────────

    def tool(self, turn: Turn, name: str) -> Tool | None:
        """Tool ``name`` of the agent version running ``turn``."""
        if self.runner is None:
            return self.agent.tool(name)
        return _tool_of(self.runner, turn, name)

    async def _chat(self, turn: Turn) -> ChatState | None:
        """The turn's chat, if its AHP turn is the active one."""
        if turn.chat is None:
            return None
        try:
            state = (await self.host.view(turn.chat)).state
        except ChannelGone:
            return None
        if not isinstance(state, ChatState):
            return None
        if state.active_turn is not None and shows(turn, state.active_turn):
            return state
        if not turn.is_terminal and ended_turn(state, turn) is not None:
            self._stop_later(turn)
        return None

    def _stop_later(self, turn: Turn) -> None:
        """Cancel ``turn``, in the background and once: the chat turn it
        shows ended without the runner (an agent ended it, and this
        process's reaction to that was lost to a crash), so nothing it does
        can show any more."""
        if self.runner is None or turn.id in self._stopping:
            return
        self._stopping.add(turn.id)
        log.info("turn %s: its chat turn ended without it; cancelling it", turn.id)
        task = asyncio.ensure_future(self.runner.cancel(turn.id))
        self._tasks.add(task)

        def done(task: asyncio.Task[Turn]) -> None:
            self._tasks.discard(task)
            self._stopping.discard(turn.id)
            if not task.cancelled() and (error := task.exception()) is not None:
                log.warning("turn %s: could not cancel it: %s", turn.id, error)

        task.add_done_callback(done)

    async def _send(self, turn: Turn, action: Any) -> bool:
        """Dispatch ``action`` on the turn's chat; False (logged) when refused."""
        assert turn.chat is not None
        try:
            await self.host.dispatch(turn.chat, action)
        except (ActionRejected, ChannelGone) as error:
            log.warning("turn %s: could not show %s: %s", turn.id, type(action).__name__, error)
            return False
        return True

    async def _in_order(self, turn: Turn) -> None:
        """Wait for what is being shown of ``turn`` in the background."""
        showing = self._showing.get(turn.id)
        if showing is not None:
            await asyncio.wait({showing})

    def _show_later(self, turn: Turn, showing: Coroutine[Any, Any, None]) -> None:
        """Show ``showing`` in the background, before anything else of ``turn``."""
        task = asyncio.ensure_future(showing)
        self._showing[turn.id] = task

        def done(task: asyncio.Task[None]) -> None:
            if self._showing.get(turn.id) is task:
                del self._showing[turn.id]
            if not task.cancelled() and (error := task.exception()) is not None:
                log.warning("turn %s: could not show a step: %s", turn.id, error)

        task.add_done_callback(done)

    async def turn_started(self, turn: Turn) -> None:
        await self._in_order(turn)
        if turn.chat is None or turn.chat_turn is None:
            return
        if turn.iterations == 0 or turn.id in self._unstarted:
            # Before its first model step (once one is saved, this was done:
            # it comes first, and a resume goes straight to the work), or
            # when it failed here before.
            self._unstarted.put(turn.id, None)  # until it is shown (it may raise)
            shown = await self._publish_tools(turn)
            if await self._open_chat_turn(turn, turn.chat, turn.chat_turn) and shown:
                self._unstarted.pop(turn.id)
        await self._mark_interrupted(turn)

    async def _open_chat_turn(self, turn: Turn, chat: str, chat_turn: str) -> bool:
        """Open the AHP turn of a turn the runner began itself (a child's)
        in its chat, unless it is open or was there already; False when it
        could not."""
        state = (await self.host.view(chat)).state
        if (
            isinstance(state, ChatState)
            and state.active_turn is None
            and not any(t.id == chat_turn for t in state.turns)
        ):
            origin = MessageOrigin(kind="agent")
            text = next((m.content for m in turn.messages if m.role == "user"), "") or ""
            message = Message(text=text, origin=origin)
            started = ChatTurnStarted(
                turn_id=chat_turn, started_at=iso_time(self.host.now_ms()), message=message
            )
            return await self._send(turn, started)
        return True

    async def _mark_interrupted(self, turn: Turn) -> None:
        """Mark the text of this iteration's earlier attempts as cut off
        (once): a crash or a transient failure ended its stream."""
        attempt = turn.attempts + turn.retry_attempts
        if attempt == 0:
            return  # the first attempt: nothing earlier to mark (no scan of the turn's parts)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        for part in state.active_turn.response_parts:
            ref = parse_markdown_part_id(part.id) if isinstance(part, MarkdownPart) else None
            if ref is None or ref.iteration != turn.iterations or ref.attempt >= attempt:
                continue
            assert isinstance(part, MarkdownPart)
            if not part.content.endswith(INTERRUPTED):
                active = state.active_turn.id
                await self._send(
                    turn, ChatDelta(turn_id=active, part_id=part.id, content=INTERRUPTED)
                )

    async def turn_taken_over(self, turn: Turn) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None or turn.chat is None:
            return
        for part in state.active_turn.response_parts:
            # The dead worker's MCP tool was waiting on these; nobody is now.
            # The replayed tool asks afresh.
            if (
                isinstance(part, InputRequestPart)
                and part.response is None
                and parse_mcp_request_id(part.request.id) is not None
            ):
                withdrawn = ChatInputCompleted(request_id=part.request.id, response="cancel")
                await self._send(turn, withdrawn)
        for pending in turn.pending:
            shown = select_tool_call(state, pending.call.id)
            unshown = shown is not None and not isinstance(
                shown, ToolCallCompleted | ToolCallCancelled
            )
            if pending.result is not None and unshown:
                ok = not _is_error_result(pending.result)
                await self.tool_finished(turn, pending.call, pending.result, ok)

    async def _publish_tools(self, turn: Turn) -> bool:
        """List the agent's tools as the session's server tools, so that
        edited tool input is checked against their schemas (False: they
        could not be)."""
        assert turn.chat is not None
        session = await self.host.session_of(turn.chat)
        if session is None:
            return True
        state = (await self.host.view(session)).state
        tools = [
            ToolDefinition(name=t.name, description=t.description, input_schema=t.input_schema)
            for t in self.agent.tools
        ]
        if isinstance(state, SessionState) and state.server_tools != tools:
            try:
                await self.host.dispatch(session, SessionServerToolsChanged(tools=tools))
            except ActionRejected as error:
                log.warning("could not publish tools: %s", error)
                return False
        return True

    async def text(self, turn: Turn, delta: str) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None or not delta:
            return
        attempt = turn.attempts + turn.retry_attempts
        part_id = markdown_part_id(state.active_turn.id, turn.iterations, attempt)
        exists = any(
            isinstance(p, MarkdownPart) and p.id == part_id
            for p in state.active_turn.response_parts
        )
        if exists:
            await self._send(
                turn, ChatDelta(turn_id=state.active_turn.id, part_id=part_id, content=delta)
            )
        else:
            part = MarkdownPart(id=part_id, content=delta)
            await self._send(turn, ChatResponsePart(turn_id=state.active_turn.id, part=part))

    async def _start_call(self, turn: Turn, state: ChatState, call: ToolCall, tool: Tool) -> bool:
        """Show the call (once); False when it is shown already."""
        if select_tool_call(state, call.id) is not None:
            return False
        assert state.active_turn is not None
        await self._send(
            turn,
            ChatToolCallStart(
                turn_id=state.active_turn.id,
                tool_call_id=call.id,
                tool_name=tool.name,
                display_name=tool.title,
            ),
        )
        return True

    async def tool_started(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        await self._in_order(turn)
        if inspect.iscoroutinefunction(tool.function):
            # It runs at once, and its call shows while it runs (a plain
            # function holds the event loop until it returns: shown first).
            self._show_later(turn, self._show_started(turn, call, tool))
        else:
            await self._show_started(turn, call, tool)

    async def _show_started(self, turn: Turn, call: ToolCall, tool: Tool) -> None:
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        if not await self._start_call(turn, state, call, tool):
            return  # approved in the chat: it shows as running already
        await self._send(
            turn,
            ChatToolCallReady(
                turn_id=state.active_turn.id,
                tool_call_id=call.id,
                invocation_message=_invocation(tool, call),
                tool_input=json.dumps(call.arguments),
                confirmed="not-needed",
            ),
        )

    async def approval_requested(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        await self._start_call(turn, state, call, tool)
        await self._send(
            turn,
            ChatToolCallReady(
                turn_id=state.active_turn.id,
                tool_call_id=call.id,
                invocation_message=_invocation(tool, call),
                tool_input=json.dumps(call.arguments),
                confirmation_title=decision.message or f"Allow {tool.title}?",
                editable=bool(tool.input_schema.get("properties")),
                options=[APPROVE, DENY],
                meta=_expiry_meta(decision.expiry),
            ),
        )

    async def tool_denied(
        self, turn: Turn, call: ToolCall, tool: Tool, decision: ApprovalDecision
    ) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        await self._start_call(turn, state, call, tool)
        turn_id = state.active_turn.id
        await self._send(
            turn,
            ChatToolCallReady(
                turn_id=turn_id,
                tool_call_id=call.id,
                invocation_message=_invocation(tool, call),
                tool_input=json.dumps(call.arguments),
            ),
        )
        await self._send(
            turn,
            ChatToolCallConfirmed(
                turn_id=turn_id,
                tool_call_id=call.id,
                approved=False,
                reason="denied",
                reason_message=decision.message or "Denied by policy",
            ),
        )

    async def tool_progress(
        self, turn: Turn, call: ToolCall, message: str, data: dict[str, Any]
    ) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        await self._send(
            turn,
            ChatToolCallContentChanged(
                turn_id=state.active_turn.id,
                tool_call_id=call.id,
                content=[TextContent(text=message)],
            ),
        )

    async def tool_finished(self, turn: Turn, call: ToolCall, result: str, success: bool) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        tool = self.tool(turn, call.name)
        title = tool.title if tool else call.name
        outcome = ToolCallResult(
            success=success,
            past_tense_message=f"{title}: done" if success else f"{title}: failed",
            content=[TextContent(text=result)],
        )
        await self._send(
            turn,
            ChatToolCallComplete(
                turn_id=state.active_turn.id, tool_call_id=call.id, result=outcome
            ),
        )

    async def input_requested(self, turn: Turn, suspension: Suspension) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or turn.chat is None or turn.chat_turn is None:
            log.warning("turn %s waits for input but its chat turn is not active", turn.id)
            return
        form = suspension.form
        rid = input_request_id(turn.chat_turn, suspension.correlation_id)
        if form is None:
            request = InputRequest(
                id=rid,
                message=suspension.message,
                questions=[TextQuestion(id=REPLY, message=suspension.message, required=True)],
            )
            schema = None
        else:
            request = InputRequest(id=rid, message=suspension.message)
            schema = form.schema
        try:
            await self.host.ask(turn.chat, request, schema=schema, expiry=suspension.expiry)
        except (ActionRejected, ChannelGone) as error:
            log.warning("turn %s: could not ask for input: %s", turn.id, error)

    async def child_chat(self, turn: Turn, call: ToolCall, child: str) -> str | None:
        if turn.chat is None:
            return None
        session = await self.host.session_of(turn.chat)
        if session is None:
            return None
        uri = chat_uri(secrets.token_hex(8))
        tool = self.tool(turn, call.name)
        await self.host.create_chat(session, uri, title=tool.title if tool else call.name)
        return uri

    async def turn_finished(self, turn: Turn) -> None:
        await self._in_order(turn)
        state = await self._chat(turn)
        if state is None or state.active_turn is None:
            return
        active = state.active_turn
        now = self.host.now_ms()
        duration = max(0, now - iso_ms(active.started_at, now))
        if turn.status == TurnStatus.COMPLETED:
            await self._send(turn, ChatTurnComplete(turn_id=active.id, duration=duration))
        elif turn.status == TurnStatus.CANCELLED:
            await self._send(turn, ChatTurnCancelled(turn_id=active.id, duration=duration))
        else:
            error = ErrorInfo(
                error_type=turn.status.value.lower(), message=turn.error or turn.status.value
            )
            await self._send(turn, ChatError(turn_id=active.id, duration=duration, error=error))

    # ─── Inward ──────────────────────────────────────────────────────────

    def hook(self, event: Applied) -> Awaitable[None] | None:
        """The host's hook: act on what this process accepted from a client
        (the server's own actions carry no origin; ours among them), and
        read ahead the turn whose question any process shows."""
        if self.runner is None:
            return None
        self._read_ahead_for(event)
        if not event.local:
            return None
        action = event.action
        if event.sender is None:
            # The server's own (who sent an action is the server's word, not
            # its origin: one sent over HTTP has none): ours (nothing to do),
            # or an expiry that settled one of our waits (server.expiry),
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
            fold = self._folds.pop(event.uri)
            if fold is not None and fold.seq != event.envelope.server_seq:
                fold = None
            return self.accepted(event.uri, action, audit, event.view.state, fold=fold)
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
        fold: _Fold | None = None,
    ) -> None:
        """React to a client's action on chat ``uri`` (``state`` the chat
        after it); ``audit`` says who; ``fold`` the resume that rode on its
        append, if one did."""
        assert self.runner is not None
        assert isinstance(state, ChatState)
        try:
            if fold is not None and self._folded(fold):
                pass
            elif isinstance(action, ChatTurnStarted):
                await self._start(uri, action)
            elif isinstance(action, ChatInputCompleted):
                settled = select_input_settlement(state, action.request_id)
                if settled.status == "resolved" and settled.part is not None:
                    await self._input_resolved(uri, settled.part, audit, state=state)
            elif isinstance(action, ChatToolCallConfirmed):
                # Only the server's own confirmation is the expiry's: a
                # person's _meta saying so proves nothing.
                expired = audit is EXPIRY_AUDIT and _expired(action) is not None
                command = decision_of(action, expired=expired)
                stamp = _stamp_in(state, action.turn_id)
                turn = await self._turn_of(uri, action.turn_id, stamp, read_ahead=True)
                if turn is not None:
                    await self.runner.submit_resume(
                        turn.id, command.with_metadata(**audit), loaded=turn
                    )
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

    def riding(self, uri: str, result: Step, sender: Identity | None) -> Rider | None:
        """The core's riding hook (server.channels.Riding): a person's answer
        to a question of a turn read ahead (an input request the runner
        opened, a call waiting for confirmation) resumes that turn in the
        answer's own append. The resume is applied here to the copy read
        ahead and saved by the chat store's script once the entry landed,
        compare-and-set on the turn's version and cancel flag as
        ``Runner.submit_resume`` saves it, and handed to a waiting worker
        the same way: the crossing of a second call and the hooks before it
        are saved. Nothing when the store carries no rider (the memory
        store, a cluster, two Redises), the answer needs a read (a form not
        held here) or the turn was not read ahead: the hook then resumes as
        without it. What the script did is read in :meth:`_folded`."""
        runner = self.runner
        action, state = result.envelope.action, result.after
        answer = ChatInputCompleted | ChatToolCallConfirmed
        if runner is None or sender is None or not isinstance(action, answer):
            return None  # most actions: nothing more is looked at
        if not isinstance(state, ChatState) or runner.store.rides_on is None:
            return None
        if not self.host.store.carries(runner.store.rides_on):
            return None
        if isinstance(action, ChatInputCompleted):
            settled = select_input_settlement(state, action.request_id)
            part = settled.part if settled.status == "resolved" else None
            opened = None if part is None else parse_input_request_id(part.request.id)
            if part is None or opened is None:
                return None
            data: dict[str, Any] | None = None
            if opened.call_id is not None and part.response == "accept":
                held, form = self.host.forms.held(uri, part.request.id)
                if not held:
                    return None
                data = None if form is None else form.data(dict(part.request.answers or {}))
            command, chat_turn = input_command(part, opened, data), opened.chat_turn
        else:
            command, chat_turn = decision_of(action), action.turn_id
        turn = self._read_ahead_turn(uri, chat_turn, _stamp_in(state, chat_turn))
        if turn is None:
            return None
        try:
            command = command.with_metadata(**_audit(sender, result.envelope))
            prepared = runner.prepare_resume(turn, command)
        except ResumeRejected:
            return None  # the copy may be stale: the hook decides on a fresh one
        rider = runner.store.runnable_rider(prepared.turn, runner.clock(), started=prepared.started)
        if rider is not None:
            self._folds.put(uri, _Fold(result.envelope.server_seq, rider, prepared))
        return rider

    def _folded(self, fold: _Fold) -> bool:
        """Whether the resume that rode on an append was saved (then its
        listeners are told here); False: resume as without it."""
        assert self.runner is not None
        rider, prepared = fold.rider, fold.prepared
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
        """Start the agent's turn for a person's chat turn ``action``: under
        ``runner_turn_id(uri, turnId)``, or, when a turn of that id was
        truncated away before (AHP lets a client use it again), under the
        stamped one. A start heard twice starts one turn."""
        assert self.runner is not None
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
        assert self.runner is not None
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

    async def _input_resolved(
        self,
        uri: str,
        part: InputRequestPart,
        audit: dict[str, Any],
        *,
        loaded: Turn | None = None,
        state: ChatState | None = None,
    ) -> None:
        """Resume the turn that asked ``part``'s request (if the runner did):
        ``loaded`` when the caller has it, else the one its chat turn in
        ``state`` shows."""
        assert self.runner is not None
        assert part.response is not None
        opened = parse_input_request_id(part.request.id)
        if opened is None:
            return  # not a request the runner opened
        data = None
        if opened.call_id is not None and part.response == "accept":
            answers = dict(part.request.answers or {})
            data = await self.host.form_data(uri, part.request.id, answers)
        command = input_command(part, opened, data)
        turn = loaded
        if turn is None and state is not None:
            stamp = _stamp_in(state, opened.chat_turn)
            turn = await self._turn_of(uri, opened.chat_turn, stamp, read_ahead=True)
        if turn is not None:
            await self.runner.submit_resume(turn.id, command.with_metadata(**audit), loaded=turn)

    async def chat_turn_ended(self, turn: Turn, error: str | None, audit: dict[str, Any]) -> None:
        """The chat turn ``turn`` shows is over, not by the runner (an agent
        ended it, with ``error`` or as complete): nothing the turn does can
        show any more, so it stops too. A turn waiting there fails with the
        chat's error; any other is cancelled (a running one at its next
        step: its tools see ``cancellation_requested``), as when people
        cancel."""
        assert self.runner is not None
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
        assert self.runner is not None
        suspension = turn.suspension
        if not turn.is_blocked or suspension is None:
            return
        command = ResumeCommand.fail(suspension.type, suspension.correlation_id, message)
        await self.runner.submit_resume(turn.id, command.with_metadata(**audit), loaded=turn)

    # ─── The sweep ───────────────────────────────────────────────────────

    async def reconcile(self) -> int:
        """Resume turns whose chat already answered them (a crash lost the
        resume), end those whose chat turn is over and ask again what their
        chat never showed (server.runner.sweep); returns how many were
        resumed or ended."""
        return await self.sweep.reconcile()


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
    chat ``uri`` may show, in the order :meth:`ChatBridge._turn_of` tries them."""
    candidates = [runner_turn_id(uri, chat_turn), chat_turn]
    if stamp is not None:
        candidates.insert(1, runner_turn_id(uri, chat_turn, stamp))
    return candidates


@dataclass(frozen=True, slots=True)
class _Fold:
    """A resume that rode on the append of ``seq`` (:meth:`ChatBridge.riding`)."""

    seq: int
    rider: Rider
    prepared: PreparedResume


def _tool_of(runner: Runner, turn: Turn, name: str) -> Tool | None:
    """Tool ``name`` of the agent version ``turn`` runs, if it still has one."""
    try:
        return runner.agent_for(turn).tool(name)
    except HuddleError:
        return None


def _is_error_result(result: str) -> bool:
    """Whether a saved tool result is the runner's record of a failure."""
    try:
        decoded = json.loads(result)
    except ValueError:
        return False
    return isinstance(decoded, dict) and decoded.get("status") == "error"


def _invocation(tool: Tool, call: ToolCall) -> str:
    return f"{tool.title} ({', '.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def _expiry_meta(expiry: Expiry | None) -> dict[str, Any] | None:
    """A tool call's ``_meta`` giving its approval ``expiry`` (server.expiry)."""
    if expiry is None:
        return None
    return {notes.HUDDLE: {"expiry": {"seconds": expiry.seconds, "onExpiry": expiry.on_expiry}}}


def _expired(action: StateAction) -> dict[str, Any] | None:
    """The wait (``{"family", "id"}``) whose expiry made ``action``, if it
    was server.expiry's."""
    expired = notes.huddle_meta(getattr(action, "meta", None), "expired")
    return expired if isinstance(expired, dict) else None
