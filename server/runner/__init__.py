"""The durable agent runner (Agents-Flex semantics): turns, their store,
workers, the chat bridge and the agent loader. Import from the modules."""
