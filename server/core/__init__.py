"""The host: channels, sessions, their rules and records, over the store."""
