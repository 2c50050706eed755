"""Adapters that let agents written on other frameworks ask the people of a
chat, each an optional extra: :mod:`server.integrations.langgraph`
(``pip install huddle[langgraph]``) and :mod:`server.integrations.openai_agents`
(``pip install huddle[openai-agents]``). Each reaches a chat through
:class:`~server.mcp.people.People` (over an agent token:
:func:`server.integrations.remote.people_of`), so Huddle's guarantees hold
for them as for any outside agent; and each names its requests after the
framework's own state, so that a process started again finds them."""
