"""Progress reports to a real purgatory (services.common.progress_reports): a log node sends
only the keys the purgatory watches, and an operation parked on a key the node had stopped
reporting still wakes at once (the node answers the key's add with its current position); the
replicator's reporter skips unwatched moves but never an error. Real LogService and purgatory
on 127.0.0.1 port 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from kbroker.log.v1 import log_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2 as pb
from kbroker.purgatory.v1 import purgatory_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode
from services.common.progress_reports import parse_key
from services.log.config import LogConfig
from services.log.server import LogService
from services.log.server import start as start_log
from services.purgatory.config import PurgatoryConfig
from services.purgatory.server import PurgatoryService
from services.purgatory.server import start as start_purgatory
from services.replicator.replication.progress import ProgressReporter

from ..record_batches import build_batch, values
from .test_replica_service import FOLLOWER, LEADER, become, create_with, state
from .test_service import append

TIMEOUT = 30


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


Body = Callable[[PurgatoryService, LogService, log_pb2_grpc.LogServiceStub,
                 purgatory_pb2_grpc.PurgatoryStub], Awaitable[None]]


def run(tmp_path: Path, body: Body) -> None:
    async def main() -> None:
        purgatory = await start_purgatory(PurgatoryConfig(grpc_address="127.0.0.1:0"))
        node = await start_log(LogConfig(
            data_dir=str(tmp_path / "data"), grpc_address="127.0.0.1:0",
            purgatory_address=f"127.0.0.1:{purgatory.port}"))
        log_channel = insecure_channel(f"127.0.0.1:{node.port}")
        purgatory_channel = insecure_channel(f"127.0.0.1:{purgatory.port}")
        try:
            await body(purgatory, node, log_pb2_grpc.LogServiceStub(log_channel),
                       purgatory_pb2_grpc.PurgatoryStub(purgatory_channel))
        finally:
            await log_channel.close()
            await purgatory_channel.close()
            await node.stop(0)
            await purgatory.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))


def fetch_wait(key: str, threshold: int, timeout_ms: int = 10_000) -> pb.AwaitRequest:
    return pb.AwaitRequest(kind=pb.OPERATION_KIND_FETCH, timeout_ms=timeout_ms,
                           keys=[pb.WatchedKey(key=key, threshold=threshold)])


def test_unwatched_keys_are_not_reported_and_a_new_watch_gets_the_current_position(
        tmp_path: Path) -> None:
    async def body(purgatory: PurgatoryService, node: LogService,
                   stub: log_pb2_grpc.LogServiceStub,
                   purgatory_stub: purgatory_pb2_grpc.PurgatoryStub) -> None:
        notifier = node.notifier
        assert notifier is not None
        await eventually(lambda: notifier.watched_keys == frozenset())
        await create_with(stub, "t", state("t", LEADER, 4, alone=True))
        for _ in range(3):
            await append(stub, "t", build_batch(values(2)))
        await asyncio.sleep(0.2)
        states = purgatory.purgatories.states
        assert states.get("t-0") is None and states.get("t-0@4@tid") is None

        # Parked on a position the node reached while it was not reporting the key.
        begin = time.monotonic()
        answer = await purgatory_stub.Await(fetch_wait("t-0", 5))
        assert answer.outcome == pb.OUTCOME_COMPLETED
        assert [(k.key, k.position) for k in answer.keys] == [("t-0", 6)]
        assert time.monotonic() - begin < 2.0
        # Watched now (for the linger time): every move is reported.
        assert notifier.watched_keys == frozenset({"t-0"})
        await append(stub, "t", build_batch(values(1)))
        await eventually(lambda: (states.get("t-0") or states.current("t-0")).position == 7)
        assert states.get("t-0@4@tid") is None

        # An acks=all producer waits on the epoch key: answered with the epoch's position, and
        # the leader's ISR at it (min.insync.replicas is checked against that).
        answer = await purgatory_stub.Await(pb.AwaitRequest(
            kind=pb.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=10_000,
            keys=[pb.WatchedKey(key="t-0@4@tid", threshold=7)]))
        assert answer.outcome == pb.OUTCOME_COMPLETED
        assert [(k.key, k.position, list(k.isr)) for k in answer.keys] == [("t-0@4@tid", 7, [0])]
        # A key of a later epoch, or of another topic of the same name, is not this leader's
        # to answer (one of an earlier epoch is over: see the test below).
        for key in ("t-0@5@tid", "t-0@4@other"):
            answer = await purgatory_stub.Await(pb.AwaitRequest(
                kind=pb.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=300,
                keys=[pb.WatchedKey(key=key, threshold=1)]))
            assert answer.outcome == pb.OUTCOME_EXPIRED

    run(tmp_path, body)


def test_a_produce_parked_after_its_epoch_ended_unwatched_fails_at_once(
        tmp_path: Path) -> None:
    """A leader that held an acks=all append's answer may step down meanwhile; its report of
    the epoch's end found nobody watching the key, so the produce that parks afterwards is
    answered by the node's answer to the new watch: NOT_LEADER_OR_FOLLOWER, not a timeout."""
    async def body(purgatory: PurgatoryService, node: LogService,
                   stub: log_pb2_grpc.LogServiceStub,
                   purgatory_stub: purgatory_pb2_grpc.PurgatoryStub) -> None:
        notifier = node.notifier
        assert notifier is not None
        await eventually(lambda: notifier.watched_keys == frozenset())
        await create_with(stub, "t", state("t", LEADER, 4))  # a follower in the ISR
        await append(stub, "t", build_batch(values(2)))
        assert await become(stub, state("t", FOLLOWER, 5)) == [0]
        await asyncio.sleep(0.2)
        assert purgatory.purgatories.states.get("t-0@4@tid") is None  # the end went unheard

        begin = time.monotonic()
        answer = await purgatory_stub.Await(pb.AwaitRequest(
            kind=pb.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=10_000,
            keys=[pb.WatchedKey(key="t-0@4@tid", threshold=2)]))
        assert answer.outcome == pb.OUTCOME_COMPLETED
        assert [(k.key, k.error_code) for k in answer.keys] == [
            ("t-0@4@tid", ErrorCode.not_leader_or_follower.value)]
        assert time.monotonic() - begin < 2.0
        # The epoch it follows at now is not over, and not this node's to answer.
        answer = await purgatory_stub.Await(pb.AwaitRequest(
            kind=pb.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=300,
            keys=[pb.WatchedKey(key="t-0@5@tid", threshold=1)]))
        assert answer.outcome == pb.OUTCOME_EXPIRED

    run(tmp_path, body)


def test_a_node_reports_every_key_while_the_purgatory_is_away(tmp_path: Path) -> None:
    async def body(purgatory: PurgatoryService, node: LogService,
                   stub: log_pb2_grpc.LogServiceStub,
                   purgatory_stub: purgatory_pb2_grpc.PurgatoryStub) -> None:
        notifier = node.notifier
        assert notifier is not None
        await eventually(lambda: notifier.watched_keys == frozenset())
        await purgatory.stop(0)
        await eventually(lambda: notifier.watched_keys is None)

    run(tmp_path, body)


@pytest.mark.parametrize(("key", "parsed"), [
    ("t-0", ("t", 0, None, None)),
    ("my-topic-12@7@3b4d6a10-8f1e-4bd2-9c55-6e0f3f2d6a01",
     ("my-topic", 12, 7, "3b4d6a10-8f1e-4bd2-9c55-6e0f3f2d6a01")),
    ("a.b_c-3@0@", ("a.b_c", 3, 0, "")),
    ("group", None),
    ("t-x", None),
    ("-1", None),
    ("t-1@", None),
    ("t-1@e", None),
])
def test_parse_key(key: str, parsed: tuple[str, int, int | None, str | None] | None,
                   ) -> None:
    assert parse_key(key) == parsed


def test_a_reporter_without_positions_skips_unwatched_keys_and_reports_watched_ones() -> None:
    """The replicator's reporter: no position source, so newly watched keys are left to the
    leader's log node; the end of a leader epoch nobody waits on is skipped, a watched one
    fails what waits on it (NOT_LEADER_OR_FOLLOWER)."""
    async def main() -> None:
        purgatory = await start_purgatory(PurgatoryConfig(grpc_address="127.0.0.1:0"))
        reporter = ProgressReporter(f"127.0.0.1:{purgatory.port}")
        channel = insecure_channel(f"127.0.0.1:{purgatory.port}")
        stub = purgatory_pb2_grpc.PurgatoryStub(channel)
        try:
            states = purgatory.purgatories.states
            await eventually(lambda: reporter.watched_keys == frozenset())
            reporter.leader_changed("t", 0, 1, "tid")
            await asyncio.sleep(0.2)
            assert len(states) == 0
            produce = asyncio.ensure_future(stub.Await(pb.AwaitRequest(
                kind=pb.OPERATION_KIND_PRODUCE, require_all=True, timeout_ms=10_000,
                keys=[pb.WatchedKey(key="t-0@1@tid", threshold=11)])))
            await eventually(lambda: "t-0@1@tid" in (reporter.watched_keys or set()))
            reporter.leader_changed("t", 0, 1, "tid")
            reporter.leader_changed("t", 0, 2, "tid")
            answer = await asyncio.wait_for(produce, 5)
            assert [(k.key, k.error_code) for k in answer.keys] == [("t-0@1@tid", 6)]
            assert states.get("t-0@2@tid") is None
        finally:
            await channel.close()
            await reporter.close()
            await purgatory.stop(0)

    asyncio.run(asyncio.wait_for(main(), TIMEOUT))
