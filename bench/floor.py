"""The floor of a resume: its crossings between processes, with nothing else.

    .venv/bin/python -m bench.floor relay REDIS_URL INBOX
    .venv/bin/python -m bench.floor worker REDIS_URL INBOX STAMPS

Set-up (3) of ``bench.runner``. A resume through Redis crosses between
processes the same way whatever runs at each stop: the participant to the
server, the server's append to Redis, whose script also saves the turn and
hands it to the waiting worker (three crossings before an approved tool,
or a tool that asked its own form, starts again; the append's answer back
to the server is off that path), and for a form the model asked the
worker's save of the model's next call, to Redis and back (five). Here each stop does only that:

- the relay is a bare ``websockets`` server; for each text frame it makes
  one Redis round trip, a script that writes a key and ``LPUSH``es the
  frame on ``INBOX`` (as the chat's append saves the turn and hands it
  over in its script);
- the worker waits on ``INBOX`` with ``BLPOP`` (as a waiting worker does);
  for a form's frame (:data:`FORM_TOOL`) it makes one more round trip (a
  one-key script, as its save is), then ``RPUSH``es ``time.time_ns()`` on
  ``STAMPS``, as the bench agent's tools do.

Both talk to Redis as the stores do (``server.store.redis_link.RedisLink``:
its scripts and its blocking read, on connections of its own), over the
same socket. A frame is ``"<tool> <id>"``, the bench agent's tool
that the resume would start; a stamp is ``"<tool> <id> <ns>"``, as the
tool's. What (2) takes beyond (3) is what Huddle does at the stops:
decoding, validation, reducing, the hooks, the turn's transitions.
"""

from __future__ import annotations

import asyncio
import sys
import time

from websockets.asyncio.server import ServerConnection, serve

from server.store.redis_link import RedisLink, Script

FORM_TOOL = "stamp_after_form"
"""The bench agent's tool that a ``request_user_input`` form resumes: its
frames save once more in the worker, before the stamp."""
ROUND_TRIP = Script("redis.call('SET', KEYS[1], ARGV[1]) return 1")
"""A script of one key: the shape of a save."""
HAND_OVER = Script(
    "redis.call('SET', KEYS[1], ARGV[1]) redis.call('LPUSH', KEYS[2], ARGV[1]) return 1"
)
"""The shape of an append that saves the turn it resumes and hands it over."""
TIMEOUT = 2.0
"""Seconds a command may take (the stores' default)."""


async def relay(url: str, inbox: str) -> None:
    link = RedisLink(url, TIMEOUT)

    async def handle(ws: ServerConnection) -> None:
        async for frame in ws:
            text = frame if isinstance(frame, str) else frame.decode()
            await link.run(HAND_OVER, [f"{inbox}:chat", inbox], [text])

    async with serve(handle, "127.0.0.1", 0, compression=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"bench.floor relay: listening on {port}", flush=True)
        await asyncio.Future()


async def worker(url: str, inbox: str, stamps: str) -> None:
    link = RedisLink(url, TIMEOUT)
    await link.run(ROUND_TRIP, [f"{inbox}:turn"], ["ready"])  # loaded before the first
    print("bench.floor worker: ready", flush=True)
    while True:
        popped = await link.blpop([inbox], 0)
        assert popped is not None  # no timeout: it returns an item
        item = popped[1]
        text = item.decode() if isinstance(item, bytes) else item
        if text.split()[0] == FORM_TOOL:
            await link.run(ROUND_TRIP, [f"{inbox}:turn"], [text])
        await link.call(link.client.rpush(stamps, f"{text} {time.time_ns()}"))


def main(argv: list[str]) -> int:
    match argv:
        case ["relay", url, inbox]:
            asyncio.run(relay(url, inbox))
        case ["worker", url, inbox, stamps]:
            asyncio.run(worker(url, inbox, stamps))
        case _:
            print(__doc__, file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
