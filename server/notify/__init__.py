"""Telling people when they are needed: events, the outbox, webhooks and email."""
