"""The edge: HTTP and WebSocket, translating to the command layer (server.commands)."""
