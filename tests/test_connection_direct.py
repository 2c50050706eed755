"""A connection with the server's direct writer keeps no queue and runs no
task (idle connections are many): frames go straight to the writer, and a
shut closes the socket by itself."""

from __future__ import annotations

import asyncio

import pytest
from websockets.frames import Frame, Opcode

from protocol.codec import encode
from server.edge.connection import CLOSE_NORMAL, CLOSE_TRY_AGAIN, Connection
from server.edge.numbering import Numbering
from server.frames import ACTION_FRAME_HEAD, OVERLOADED, WRITTEN, OutFrame, action_frame
from tests.conftest import UNIT


class Socket:
    """The direct writer and the close of a socket, recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed: list[tuple[int, str]] = []
        self.aborted = False
        self.full = False

    def write(self, frame: bytes, limit: int) -> int:
        if self.full:
            return OVERLOADED
        self.written.append(frame)
        return WRITTEN

    def abort(self) -> None:
        self.aborted = True

    async def close(self, code: int, reason: str) -> None:
        self.closed.append((code, reason))

    async def send(self, text: str) -> None:
        raise AssertionError("the direct writer sends every frame")


def connection_on(socket: Socket) -> Connection:
    return Connection(send=socket.send, close=socket.close, direct=socket)


async def test_frames_go_straight_to_the_socket_and_a_shut_closes_it() -> None:
    socket = Socket()
    connection = connection_on(socket)
    assert connection.queue is None
    done = connection.start_writer()
    connection.send_frame(OutFrame(b'{"a":1}'))
    assert socket.written == [OutFrame(b'{"a":1}').wire]
    connection.shut(CLOSE_NORMAL, "bye")
    async with asyncio.timeout(UNIT):
        await done
    assert socket.closed == [(CLOSE_NORMAL, "bye")]
    connection.send_frame(OutFrame(b'{"a":2}'))
    assert len(socket.written) == 1  # nothing after the shut


async def test_a_peer_that_does_not_read_is_dropped() -> None:
    socket = Socket()
    connection = connection_on(socket)
    done = connection.start_writer()
    socket.full = True
    connection.send_frame(OutFrame(b"{}"))
    async with asyncio.timeout(UNIT):
        await done
    assert socket.aborted
    assert socket.closed[0][0] == CLOSE_TRY_AGAIN


async def test_a_connection_shut_before_its_writer_started_is_done_at_once() -> None:
    socket = Socket()
    connection = connection_on(socket)
    connection.shut(CLOSE_NORMAL, "")
    await asyncio.sleep(0)  # the close runs
    async with asyncio.timeout(UNIT):
        await connection.start_writer()
    assert socket.closed == [(CLOSE_NORMAL, "")]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000], ids=lambda n: f"{n}-bytes")
def test_a_frame_on_the_wire_is_what_websockets_writes_for_a_server_text_frame(size: int) -> None:
    payload = b'"' + b"x" * max(0, size - 2) + b'"' if size >= 2 else b"x" * size
    expected = Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[])
    assert OutFrame(payload).wire == expected


@pytest.mark.parametrize("seq", [9, 10, 99_999, 100_000], ids=lambda n: f"seq-{n}")
def test_a_renumbered_frame_is_the_frame_websockets_writes_for_its_envelope(seq: int) -> None:
    # A plain AHP connection's own number, spliced in: around the 125-byte
    # edge (seq 9 to 10, with the padding below) the length's encoding grows.
    envelope = {"channel": "ahp-chat:/c", "action": {"type": "x"}, "serverSeq": 1}
    padding = 125 - len(encode({**envelope, "origin": ""})) - len(ACTION_FRAME_HEAD) - 1
    envelope["origin"] = "o" * (padding + 1 if seq >= 99_999 else padding)
    frame = action_frame(encode(envelope), "ahp-chat:/c", 1)
    expected = ACTION_FRAME_HEAD + encode({**envelope, "serverSeq": seq}) + b"}"
    renumbered = frame.numbered(seq)
    assert renumbered.payload == expected
    assert renumbered.wire == Frame(Opcode.TEXT, expected).serialize(mask=False, extensions=[])
    assert frame.numbered(seq + 1).payload == expected.replace(b"%d" % seq, b"%d" % (seq + 1))


async def test_plain_connections_at_one_number_are_sent_one_copy_of_a_frame() -> None:
    # The bytes of a renumbered frame are made once per distinct number, not
    # once per connection: the subscribers of one chat are mostly at one.
    sockets = [Socket() for _ in range(3)]
    connections = [connection_on(socket) for socket in sockets]
    for connection, start in zip(connections, [4, 4, 7], strict=True):
        connection.numbering = Numbering(start)
        connection.start_writer()
    envelope = {"channel": "ahp-chat:/c", "action": {"type": "x"}, "serverSeq": 1}
    frame = action_frame(encode(envelope), "ahp-chat:/c", 1)
    for connection in connections:
        connection.send_frame(frame)
    first, second, third = (socket.written[-1] for socket in sockets)
    assert first is second
    assert first.endswith(b'"serverSeq":5}}')
    assert third.endswith(b'"serverSeq":8}}')
