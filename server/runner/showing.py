"""A runner's turns shown in chats as AHP turns: the runner's port.

:class:`ChatShowing` is what the runner calls as a turn goes
(server.runner.port.ChatPort): model text streams as a markdown part per
model reply (``<turn>:md:<n>``) and ``chat/delta``; a tool call shows its
whole lifecycle (``toolCallStart``, ``toolCallReady``,
``toolCallComplete``); REQUIRE_APPROVAL shows as a ``pending-confirmation``
call with approve and deny options; a policy DENY as a call denied before it
ran; a form as an input request ``<turnId>:input:<callId>`` whose questions
come from the frozen schema (which the host then checks accepts against);
progress as the running call's content; the end of the turn as
``chat/turnComplete``, ``chat/error`` or ``chat/turnCancelled``.

A coroutine tool's start is shown while the tool runs (people cannot tell;
the tool starts a round trip or two sooner); everything shown of a turn is
shown in order. A turn whose chat turn ended without it (an agent ended it,
and the reaction was lost) is cancelled when its next output finds that.

A turn taken over after its worker died (:meth:`ChatShowing.turn_taken_over`)
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
from collections.abc import Coroutine
from typing import Any

from protocol.actions import (
    ChatDelta,
    ChatError,
    ChatInputCompleted,
    ChatResponsePart,
    ChatToolCallComplete,
    ChatToolCallConfirmed,
    ChatToolCallContentChanged,
    ChatToolCallReady,
    ChatToolCallStart,
    ChatTurnCancelled,
    ChatTurnComplete,
    ChatTurnStarted,
    SessionServerToolsChanged,
)
from protocol.chat import (
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
from protocol.session import SessionState, ToolDefinition
from protocol.uris import chat_uri
from protocol.wire import ErrorInfo
from reducers import notes
from reducers.chat import select_tool_call
from reducers.clock import iso_ms, iso_time
from server.cache import Lru
from server.core.expiry import Expiry
from server.core.host import Host
from server.errors import ActionRejected, ChannelGone, HuddleError
from server.runner.agent import Agent, ApprovalDecision, Tool
from server.runner.ids import (
    input_request_id,
    markdown_part_id,
    parse_markdown_part_id,
    parse_mcp_request_id,
)
from server.runner.resume import (
    REPLY,
    ended_turn,
    shows,
)
from server.runner.runner import Runner
from server.runner.turn import (
    Suspension,
    ToolCall,
    Turn,
    TurnStatus,
)

log = logging.getLogger("huddle.runner.bridge")

APPROVE = ConfirmationOption(id="approve", label="Approve", kind="approve")
DENY = ConfirmationOption(id="deny", label="Deny", kind="deny")
INTERRUPTED = "\n\n*(Interrupted: this reply was cut off and is being retried.)*"
"""Appended to text whose stream a crash or a transient failure cut off."""
UNSTARTED_KEPT = 256
"""Turns whose start could not be shown, remembered to try again."""


class ChatShowing:
    """Shows a runner's turns in chats (the runner's port)."""

    def __init__(self, host: Host, agent: Agent, runner: Runner) -> None:
        self.host = host
        self.agent = agent
        self.runner = runner
        self._showing: dict[str, asyncio.Task[None]] = {}
        """Per turn, what is being shown of it in the background; the rest
        of what is shown of that turn waits for it."""
        self._unstarted: Lru[str, None] = Lru(UNSTARTED_KEPT)
        """Turns whose start could not be shown here (tools unpublished, the
        chat turn not opened): their next execution here tries again."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping: set[str] = set()
        """Turns being cancelled because their chat turn ended without them."""

    def tool(self, turn: Turn, name: str) -> Tool | None:
        """Tool ``name`` of the agent version running ``turn``."""
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
        if turn.id in self._stopping:
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
    """A tool call's ``_meta`` giving its approval ``expiry`` (server.core.expiry)."""
    if expiry is None:
        return None
    return {notes.HUDDLE: {"expiry": {"seconds": expiry.seconds, "onExpiry": expiry.on_expiry}}}
