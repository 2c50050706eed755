"""A runner's turns as AHP turns in chats, both ways: three jobs.

* :class:`~server.runner.showing.ChatShowing`, the runner's port, shows
  each turn in its chat (text, tool calls, approvals, forms, the end);
* :class:`~server.runner.resuming.ChatResuming`, a host hook and the
  append's rider, feeds people's actions back (a turn started, an answer,
  an approval, a cancel, an agent ending the chat turn);
* :class:`~server.runner.sweep.Sweep`, run periodically by the workers,
  recovers what a crash between a chat and the runner left undone.

What resumes a waiting turn is decided in one place for all three paths:
:func:`server.runner.resume.resume_for`, from the chat's state.
:class:`ChatBridge` puts the three together for one runner and one host.
"""

from __future__ import annotations

from server.core.host import Host
from server.runner.agent import Agent
from server.runner.resuming import ChatResuming
from server.runner.runner import Runner
from server.runner.showing import ChatShowing
from server.runner.sweep import Sweep


class ChatBridge:
    """The runner ``runner`` shown in, and resumed from, ``host``'s chats."""

    def __init__(
        self, host: Host, agent: Agent, runner: Runner, *, ask_again_after: float = 10.0
    ) -> None:
        self.host = host
        self.runner = runner
        self.showing = ChatShowing(host, agent, runner)
        self.resuming = ChatResuming(host, agent, runner)
        self.sweep = Sweep(self.showing, self.resuming, ask_again_after=ask_again_after)
        runner.port = self.showing
        host.add_hook(self.resuming.hook)
        host.add_rider(self.resuming.rider_for)
        host.add_ahead_of_append(self.resuming.write_ahead)

    async def reconcile(self) -> int:
        """Run the sweep once (server.runner.sweep); returns how many turns
        it resumed or ended."""
        return await self.sweep.reconcile()
