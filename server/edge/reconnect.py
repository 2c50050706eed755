"""``reconnect``: resuming after a dropped connection, both ways.

**AHP's way** (plain clients): ``{clientId, lastSeenServerSeq,
subscriptions}``, as the first request on a new socket (no ``initialize``)
or after one. The client's ``lastSeenServerSeq`` is a number of its last
connection's own sequence (:mod:`server.edge.numbering`); when this process
still holds that numbering, it says exactly which seq the client had reached
on each channel, and the answer is a ``replay`` of every envelope missed,
renumbered on from ``lastSeenServerSeq``, with the subscriptions that are
gone or no longer permitted as ``missing``. Otherwise (another process, a
restart, a gap larger than the replay window or than the frame budget) the
answer is ``snapshot``: a fresh snapshot of each subscription that still
exists. Nothing is lost, nothing applied twice.

**Huddle's way** (extension ``huddle.channelSeqs``, after ``initialize``):
one cursor per channel, answered per channel with ``replay``,
``snapshot`` or ``missing``.

Each snapshot a reconnect answers is a read (half an action of the token's
budget and one more per whole 64 KiB), charged as a debt its next requests
wait out; while the token is in debt a reconnect (and an ``initialize``)
is refused as ``rate-limited`` (-32011: try again later). Channels named twice are
answered once; naming more than twice ``--max-subscriptions`` is refused
before any is looked up; once a snapshot does not fit in one answer's budget
(what the client may leave unread) it and the rest are left out: no
snapshot (a plain client's) or ``missing`` (cursors); the client may
subscribe to them on its own.

Either way a reconnect is held to ``--max-subscriptions`` as ``subscribe``
is: when the channels it would subscribe to (those it reaches, besides the
connection's own) are too many, it is refused (-32009) before anything is
subscribed, numbered or labelled. A refused reconnect changes nothing, so a
plain client's fallback (AHP's reference client sends ``initialize`` with
the same subscriptions on the same socket) still works; ``initialize``
leaves out what is beyond the limit, as it does a gone channel.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from protocol.codec import MalformedFrame
from protocol.messages import (
    ActionEnvelope,
    ChannelCursor,
    ErrorCode,
    MissingResume,
    ReconnectParams,
    ReconnectReplay,
    ReconnectResult,
    ReconnectSnapshots,
    ReplayResume,
    Resume,
    Snapshot,
    SnapshotResume,
)
from server.auth import Grant
from server.commands import Commands
from server.config import Limits
from server.edge.connection import Connection
from server.edge.numbering import Numbering
from server.errors import ChannelGone, CommandError
from server.frames import AnswerBudget


class Rpc(Protocol):
    """What a reconnect needs of the connection it runs on: its methods'
    state (server.edge.rpc.Rpc is one), named here so that the two modules
    do not import each other."""

    connection: Connection
    commands: Commands
    grant: Grant
    client_id: str | None
    extensions: frozenset[str]
    subscriptions: set[str]

    @property
    def limits(self) -> Limits: ...

    @property
    def numbering(self) -> Numbering | None:
        """This connection's own serverSeq numbering (None: per channel)."""

    @property
    def frame_budget(self) -> int: ...

    @property
    def answer_budget(self) -> int: ...

    def retired_numbering(self, client_id: str) -> Numbering | None:
        """The numbering plain client ``client_id`` left behind, if any."""

    def label(self, client_id: str) -> None: ...

    def fitted(self, snapshot: Snapshot, turns: int | None = None, share: int = 1) -> Snapshot: ...

    def count_subscriptions(self, more: int) -> None: ...

    def add_subscription(self, uri: str) -> None: ...


NOT_THERE = (ErrorCode.SESSION_NOT_FOUND, ErrorCode.NOT_FOUND)


async def reconnect(
    rpc: Rpc, params: ReconnectParams
) -> ReconnectResult | ReconnectReplay | ReconnectSnapshots:
    """Answer ``reconnect`` on ``rpc``'s connection (see the module docstring)."""
    await rpc.commands.out_of_debt(rpc.grant)
    if params.cursors is not None:
        if rpc.client_id is None or rpc.numbering is not None:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                "per-channel cursors need the huddle.channelSeqs extension at initialize",
                "$.params.cursors",
            )
        _same_client(rpc, params)
        _at_most(rpc, len({c.channel for c in params.cursors}))
        return await resume_channels(rpc, params.cursors)
    if params.last_seen_server_seq is None or params.subscriptions is None:
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS,
            "reconnect needs lastSeenServerSeq and subscriptions",
            "$.params",
        )
    if rpc.client_id is not None:
        _same_client(rpc, params)
        if rpc.numbering is None:
            raise MalformedFrame(
                ErrorCode.INVALID_PARAMS,
                "this connection counts serverSeq per channel: reconnect with cursors",
                "$.params.lastSeenServerSeq",
            )
    _at_most(rpc, len(set(params.subscriptions)))
    if rpc.client_id is None:
        await rpc.commands.credentials.claim_client(rpc.grant, params.client_id)
    reached = await reach_all(rpc, ((uri, "$.subscriptions") for uri in params.subscriptions))
    if rpc.client_id is None:
        left = rpc.retired_numbering(params.client_id)
        rpc.label(params.client_id)
        rpc.extensions = frozenset()
    else:
        left = rpc.numbering
    return await resume_plain(rpc, left, params.last_seen_server_seq, params.subscriptions, reached)


def _at_most(rpc: Rpc, named: int) -> None:
    """CommandError (-32009) when a reconnect names more than twice the
    channels a connection may subscribe to (it held at most that many, and
    those gone since do not count against it): refused before any is
    looked up (a frame may name 40,000)."""
    limit = rpc.limits.max_subscriptions
    if named > 2 * limit:
        raise CommandError(
            ErrorCode.PERMISSION_DENIED,
            f"at most {limit} subscriptions per connection; this reconnect names {named:,}",
        )


def _same_client(rpc: Rpc, params: ReconnectParams) -> None:
    if params.client_id != rpc.client_id:
        raise MalformedFrame(
            ErrorCode.INVALID_PARAMS, "clientId differs from initialize", "$.params.clientId"
        )


async def reach_all(rpc: Rpc, channels: Iterable[tuple[str, str]]) -> set[str]:
    """Which of ``channels`` (each with the path of its field in the params)
    the connection's token reaches; the others are gone or not permitted.
    Raises CommandError (-32009) as soon as subscribing to every one reached
    would take the connection past its limit, before anything is subscribed."""
    reached: set[str] = set()
    asked: set[str] = set()
    more = 0
    for uri, path in channels:
        if uri in asked:
            continue
        asked.add(uri)
        try:
            await rpc.commands.reach(rpc.grant, uri, path)
        except CommandError as error:
            if error.code not in NOT_THERE:
                raise
            continue
        reached.add(uri)
        if uri not in rpc.subscriptions:
            more += 1
            rpc.count_subscriptions(more)
    return reached


async def resume_plain(
    rpc: Rpc, left: Numbering | None, seen: int, subscriptions: list[str], reached: set[str]
) -> ReconnectReplay | ReconnectSnapshots:
    """AHP's reconnect from ``left`` (the client's last numbering, if this
    process holds it) at number ``seen``, ``reached`` being the
    subscriptions the token reaches (:func:`reach_all`)."""
    reachable = [uri for uri in dict.fromkeys(subscriptions) if uri in reached]
    missing = [uri for uri in dict.fromkeys(subscriptions) if uri not in reached]
    cursors = {uri: left.cursor(uri, seen) if left else None for uri in reachable}
    share = rpc.frame_budget // max(1, len(reachable))
    replayed: list[ActionEnvelope] = []
    exact = all(cursor is not None for cursor in cursors.values())
    for uri, cursor in cursors.items():
        rpc.connection.park(uri)
        if not exact or cursor is None:
            continue
        resume = await rpc.commands.resume(uri, cursor, rpc.connection, max_bytes=share)
        if isinstance(resume, ReplayResume):
            replayed.extend(resume.actions)
        elif isinstance(resume, MissingResume):
            missing.append(uri)
        else:
            exact = False
    # From here the client's numbers go on from what it has seen.
    rpc.connection.numbering = (
        left.rewound(seen) if left is not None and exact else Numbering(start=seen)
    )
    if exact:
        for uri in reachable:
            if uri not in missing:
                rpc.add_subscription(uri)
        return ReconnectReplay(actions=replayed, missing=missing)
    snapshots: list[Snapshot] = []
    room = AnswerBudget(rpc.answer_budget)
    for uri in reachable:
        try:
            snapshot = await rpc.commands.subscribe(uri, rpc.connection)
        except ChannelGone:
            continue  # gone: no snapshot says so
        snapshot = rpc.fitted(snapshot, share=len(reachable))
        if not room.takes(snapshot):  # beyond what one answer may take: left out
            rpc.commands.unsubscribe(uri, rpc.connection)
            rpc.connection.unpark(uri)
            break
        rpc.add_subscription(uri)
        snapshots.append(snapshot)
    rpc.commands.charge_snapshots(rpc.grant, room.count, room.read)
    return ReconnectSnapshots(snapshots=snapshots)


async def resume_channels(rpc: Rpc, cursors: list[ChannelCursor]) -> ReconnectResult:
    """Huddle's reconnect: per channel, the envelopes after its cursor, a
    snapshot, or missing."""
    cursors = list({c.channel: c for c in reversed(cursors)}.values())[::-1]  # first of each
    paths = ((c.channel, f"$.cursors[{index}].channel") for index, c in enumerate(cursors))
    reached = await reach_all(rpc, paths)
    resumes: list[Resume] = []
    share = rpc.frame_budget // max(1, len(cursors))
    room = AnswerBudget(rpc.answer_budget)
    for cursor in cursors:
        uri = cursor.channel
        if uri not in reached or room.full:
            resumes.append(MissingResume(channel=uri))
            continue
        rpc.connection.park(uri)
        resume = await rpc.commands.resume(
            uri, cursor.last_seen_server_seq, rpc.connection, max_bytes=share
        )
        if isinstance(resume, SnapshotResume):
            snapshot = rpc.fitted(resume.snapshot, share=len(cursors))
            if not room.takes(snapshot):  # beyond what one answer may take: left out
                rpc.commands.unsubscribe(uri, rpc.connection)
                rpc.connection.unpark(uri)
                resumes.append(MissingResume(channel=uri))
                continue
            resume = SnapshotResume(channel=uri, snapshot=snapshot)
        rpc.add_subscription(uri)
        resumes.append(resume)
    rpc.commands.charge_snapshots(rpc.grant, room.count, room.read)
    return ReconnectResult(channels=resumes)
