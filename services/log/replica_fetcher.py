"""A follower log node's fetching (Kafka's ``ReplicaFetcherManager`` and
``ReplicaFetcherThread``): one fetch session per leader node, carrying every partition this
node follows there.

A session's round:

1. partitions new to their leader epoch are first checked against the leader's log and cut
   where they part (Kafka's truncation by leader epoch, KIP-101/279): the leader says where
   the follower's latest epoch ends (``OffsetForLeaderEpoch``); if it knows only an older
   epoch, the follower's own end of that one counts too; a leader that knows none keeps what
   was committed (the high watermark). A follower that must start over (its log ends below the
   leader's log start) drops its log and continues empty there (``truncateFullyAndStartAt``);
2. one fetch covers every other partition with this node's log end offset and leader epoch
   (the leader records the offset as this follower's position, which moves its high
   watermark); the leader answers at once when it has batches, else as soon as one of the
   partitions gets an append, or after ``replica.fetch.wait.max.ms``. On a stream, after its
   first request, the fetch is incremental (KIP-227, :mod:`services.log.replica_fetch_session`):
   it names only the partitions whose offset, epoch or byte limit changed since the stream's
   last request and lists those left out now as forgotten, and the answer carries only the
   partitions with something new. While every partition is fetched and nothing changes which
   ones or how (no backoff, check, throttle, new partition or settings), the follower builds
   its next request from the partitions it appended to alone, looking at all of them again at
   least every second;
3. the batches are appended exactly as the leader has them, the high watermark follows the
   leader's (within this log), the log start offset too (within the high watermark); then the
   next fetch goes out at once, reporting the new log end offsets.

Fetches travel on one long-lived ``ReplicaFetch`` stream per leader (requests and answers in
turn), or, with the ``unary`` transport, as one ``ReplicaFetchOnce`` call each. A follower on
its leader's host (same kernel and mount namespace) offers its host key: the leader then names
the batches as ranges of its segment files and the follower reads them from there
(:mod:`services.common.file_records`); a range that no longer reads as named (the segment
deleted, replaced or cut meanwhile) is skipped, fetched again with the batches carried, and the
follower fetches so from that leader for a minute. When the
partitions change (a partition added or moved to another epoch), a fetch in flight is
abandoned (the stream closed; reads change nothing on the leader but the recorded position,
which stays true) and the round starts over.

Failures: a partition whose fetch or append failed backs off for ``replica.fetch.backoff.ms``
(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH: the states have not met yet;
another error is logged), the others go on; a session that fails as a whole backs off, doubling
up to eight times. A leader address this node may not dial (plaintext gRPC off loopback) is
logged once, and nothing is fetched from it until the settings change. OFFSET_OUT_OF_RANGE from
the leader either finds this log ending below the leader's log start (it starts over there) or
past the leader's end (it is checked against the leader's log again, with a warning).
Replication throttles: a partition whose replica is throttled on the follower side and not
caught up is left out of fetches while the follower's bucket is empty
(:mod:`services.log.replication_quota`).

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import internal_channel
from services.common.errors import ErrorCode, KafkaError, error_name
from services.common.file_records import CARRIED_AFTER_REFUSAL_SECONDS, FileRecordsReader
from services.common.tls import InternalTls, InternalTlsError

from . import metrics
from .log_manager import LogManager
from .partition_log import NO_OFFSET, PartitionLog
from .replica_fetch_codec import decode_fetch_response
from .replica_state import FOLLOWER
from .replication_quota import ReplicationQuota
from .replication_settings import ReplicationSettings

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# A fetch's answer: each partition's result and its records (a view of the answer's bytes).
FetchResults = list[tuple[log_pb2.ReplicaFetchResult, memoryview]]

STREAM, UNARY = "stream", "unary"
_SERVICE = log_pb2.DESCRIPTOR.services_by_name["LogService"].full_name
_FETCH_SESSION = f"/{_SERVICE}/ReplicaFetch"
_FETCH_ONCE = f"/{_SERVICE}/ReplicaFetchOnce"
TRANSPORTS = (STREAM, UNARY)
# Calls other than the long poll (OffsetForLeaderEpoch) and the slack on a long poll's answer.
CALL_TIMEOUT = 10.0
_FAILURE_LOG_INTERVAL_S = 30.0
# A steady session (see _Steady) looks at every partition again at least this often.
STEADY_SECONDS = 1.0
_EXPECTED = frozenset(e.value for e in (
    ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch,
    ErrorCode.unknown_leader_epoch, ErrorCode.unknown_topic_or_partition))
_OUT_OF_RANGE = ErrorCode.offset_out_of_range.value


@dataclass(slots=True)
class PartitionFetchState:
    """One partition this node follows (Kafka's ``PartitionFetchState``)."""

    leader_epoch: int
    # Not yet checked against the leader's log at this epoch: no fetch before it is.
    truncating: bool = True
    # Its log ends below the leader's log start: it starts over empty at this offset.
    start_over_at: int = NO_OFFSET
    retry_at: float = 0.0
    # Its log end reached the leader's high watermark at the last fetch (Kafka's in-sync
    # fetch state: such a replica is never throttled).
    caught_up: bool = False


class FetchSessionError(Exception):
    """A fetch session failed as a whole."""


@dataclass(slots=True)
class _Steady:
    """A round that fetched every partition followed (none backing off, being checked against
    the leader or open to a throttle): until ``until``, and while neither the partitions, their
    states nor the settings change (``layout``), the next rounds fetch the same ones, naming
    only those whose log end moved."""

    layout: int
    settings: ReplicationSettings
    fetched: dict[TopicPartition, PartitionFetchState]
    until: float


class _LeaderCalls:
    """The calls a follower makes on its leader's node; fetch answers come as bytes, read by
    :func:`~services.log.replica_fetch_codec.decode_fetch_response`."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.log = log_pb2_grpc.LogServiceStub(channel)
        serialize = log_pb2.ReplicaFetchRequest.SerializeToString
        self.fetch_session = channel.stream_stream(_FETCH_SESSION, request_serializer=serialize)
        self.fetch_once = channel.unary_unary(_FETCH_ONCE, request_serializer=serialize)


class ReplicaFetcher:
    """The fetch session of this node with one leader node."""

    def __init__(self, *, node_id: int, leader: int, manager: LogManager,
                 settings: Callable[[], ReplicationSettings], quota: ReplicationQuota,
                 tls: InternalTls, transport: str = STREAM, local_reader: str = "",
                 files: FileRecordsReader | None = None) -> None:
        self.node_id = node_id
        self.leader = leader
        self._manager = manager
        self._settings = settings
        self._quota = quota
        self._tls = tls
        self._transport = transport
        # This host's key, offered to the leader: its batches are then read from its segment
        # files (services.common.file_records) - unless one of its ranges could not be, until
        # then.
        self._local_reader = local_reader
        self._files = files if files is not None else FileRecordsReader()
        self._files_refused_until = 0.0
        self._partitions: dict[TopicPartition, PartitionFetchState] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._address: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._stub: _LeaderCalls | None = None
        self._stream: Any = None
        # What the leader holds of this stream's fetch session: each partition's leader epoch,
        # fetch offset and byte limit as last named (empty: the next request is a full one).
        self._session: dict[TopicPartition, tuple[int, int, int]] = {}
        # Counts the changes to which partitions are fetched and how (see _Steady), and the
        # partitions appended to since the last request.
        self._layout = 0
        self._steady: _Steady | None = None
        self._appended: set[TopicPartition] = set()
        self._in_flight: asyncio.Future[FetchResults] | None = None
        self._last_failure_log = 0.0

    @property
    def partitions(self) -> Mapping[TopicPartition, PartitionFetchState]:
        return self._partitions

    def add(self, key: TopicPartition, leader_epoch: int) -> None:
        """Follow ``key`` here at ``leader_epoch`` (checked against the leader's log first,
        unless it is already followed at that epoch)."""
        current = self._partitions.get(key)
        if current is not None and current.leader_epoch == leader_epoch:
            return
        self._partitions[key] = PartitionFetchState(leader_epoch=leader_epoch)
        self._layout += 1
        self._abandon()

    def remove(self, key: TopicPartition) -> None:
        if self._partitions.pop(key, None) is not None:
            self._layout += 1
            self._abandon()

    def wake(self) -> None:
        """Start a new round now (new settings, a partition's state fixed)."""
        for state in self._partitions.values():
            state.retry_at = 0.0
        self._layout += 1
        self._changed.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"replica-fetcher-{self.leader}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._close_stream()
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    # -- the loop --------------------------------------------------------------------------

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                await self._round()
                failures = 0
                continue
            except FetchSessionError as exc:
                self._log_failure(str(exc))
            except Exception:  # the loop must survive anything one round does
                log.exception("fetcher of leader %d: round failed", self.leader)
            self._close_stream()
            failures += 1
            backoff = self._settings().fetch_backoff_ms / 1000
            await self._wait_for_change(backoff * 2 ** min(failures - 1, 3))

    def _log_failure(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_failure_log >= _FAILURE_LOG_INTERVAL_S:
            self._last_failure_log = now
            log.warning("fetcher of leader %d: %s", self.leader, message)

    async def _wait_for_change(self, time_limit: float | None) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the event is set, and the loop would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(time_limit):
                await self._changed.wait()

    def _back_off(self, key: TopicPartition) -> None:
        state = self._partitions.get(key)
        if state is not None:
            state.retry_at = time.monotonic() + self._settings().fetch_backoff_ms / 1000
            self._layout += 1

    def _connect(self, settings: ReplicationSettings) -> _LeaderCalls | None:
        address = settings.log_nodes.get(self.leader)
        if address != self._address:
            self._close_stream()
            if self._channel is not None:
                channel = self._channel
                asyncio.get_running_loop().create_task(channel.close())
            self._address, self._channel, self._stub = address, None, None
            if address is not None:
                try:
                    self._channel = internal_channel(address, self._tls, "log")
                except InternalTlsError as exc:
                    # Not an address this node may dial (plaintext off loopback): nothing is
                    # fetched from this leader until the settings name another.
                    log.error("fetcher of leader %d: cannot reach it at %r: %s", self.leader,
                              address, exc)
                else:
                    self._stub = _LeaderCalls(self._channel)
        return self._stub

    def _close_stream(self) -> None:
        self._session = {}
        self._steady = None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    async def _round(self) -> None:
        self._changed.clear()
        settings = self._settings()
        stub = self._connect(settings)
        now = time.monotonic()
        steady = self._steady
        if (steady is not None and stub is not None and self._stream is not None
                and steady.layout == self._layout and steady.settings is settings
                and now < steady.until):
            response = await self._fetch(stub, self._steady_request(steady, settings, now),
                                         settings)
            if response is not None:
                await self._process(response, steady.fetched)
            return
        self._steady = None
        self._appended.clear()
        layout = self._layout
        ready = {k: s for k, s in self._partitions.items() if s.retry_at <= now}
        if stub is None or not ready:
            waits = [s.retry_at - now for s in self._partitions.values()]
            await self._wait_for_change(
                None if stub is None or not waits else max(min(waits), 0))
            return
        checking = [k for k, s in ready.items() if s.truncating]
        if checking:
            await self._check_against_leader(stub, checking)
            if self._changed.is_set():
                return
        fetched: dict[TopicPartition, PartitionFetchState] = {}
        # On a stream already open, only what changed since its last request is named.
        incremental = self._transport == STREAM and self._stream is not None
        request = self._new_request(settings, now, incremental)
        session: dict[TopicPartition, tuple[int, int, int]] = {}
        throttled = throttle_open = False
        for key, state in ready.items():
            partition_log = self._manager.find(*key)
            if state.truncating or partition_log is None or state.retry_at > now:
                continue
            if self._quota.is_throttled(partition_log.topic_configs, key[1]):
                throttle_open = True
                if not state.caught_up and self._quota.exceeded():
                    throttled = True
                    continue
            fetched[key] = state
            named = session[key] = (state.leader_epoch, partition_log.log_end_offset,
                                    settings.fetch_max_bytes)
            if not incremental or self._session.get(key) != named:
                _name(request, key, named)
        if not fetched:
            waits = [s.retry_at - now for s in self._partitions.values() if s.retry_at > now]
            if throttled:
                waits.append(self._quota.delay())
            await self._wait_for_change(max(min(waits), 0.001) if waits else None)
            return
        if incremental:
            for topic, partition in self._session.keys() - session.keys():
                request.forgotten.add(topic=topic, partition=partition)
        self._session = session
        if (self._transport == STREAM and not throttle_open and layout == self._layout
                and len(fetched) == len(self._partitions)):
            self._steady = _Steady(layout, settings, fetched, now + STEADY_SECONDS)
        response = await self._fetch(stub, request, settings)
        if response is not None:
            await self._process(response, fetched)

    def _steady_request(self, steady: _Steady, settings: ReplicationSettings,
                        now: float) -> log_pb2.ReplicaFetchRequest:
        """The next incremental request of a steady session: the partitions appended to since
        the last one, at their new log end."""
        request = self._new_request(settings, now, incremental=True)
        appended, self._appended = self._appended, set()
        for key in appended:
            state = steady.fetched.get(key)
            partition_log = self._manager.find(*key)
            if state is None or partition_log is None:
                continue
            named = (state.leader_epoch, partition_log.log_end_offset, settings.fetch_max_bytes)
            if self._session.get(key) != named:
                self._session[key] = named
                _name(request, key, named)
        return request

    def _new_request(self, settings: ReplicationSettings, now: float,
                     incremental: bool) -> log_pb2.ReplicaFetchRequest:
        """A request naming no partition yet."""
        return log_pb2.ReplicaFetchRequest(
            replica_id=self.node_id, max_wait_ms=settings.fetch_wait_max_ms,
            max_bytes=settings.fetch_response_max_bytes,
            local_reader=self._local_reader if now >= self._files_refused_until else "",
            incremental=incremental)

    async def _fetch(self, stub: _LeaderCalls,
                     request: log_pb2.ReplicaFetchRequest, settings: ReplicationSettings
                     ) -> FetchResults | None:
        """The leader's answer, None when the partitions changed meanwhile (the fetch was
        abandoned). Raises FetchSessionError."""
        time_limit = settings.fetch_wait_max_ms / 1000 + CALL_TIMEOUT
        if self._transport == UNARY:
            fetching = asyncio.ensure_future(self._once(stub, request, time_limit))
        else:
            if self._stream is None:
                self._stream = stub.fetch_session()
            fetching = asyncio.ensure_future(self._exchange(self._stream, request, time_limit))
        # A change of the partitions cancels the fetch (see _abandon).
        self._in_flight = fetching
        try:
            return await fetching
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the fetcher stops
            self._close_stream()  # its answer, when it comes, is for the old partitions
            return None
        except FetchSessionError:
            raise
        except grpc.aio.AioRpcError as e:
            raise FetchSessionError(f"fetch from {self._address}: {e.code().name} "
                                    f"{e.details()}") from e
        except TimeoutError as e:
            raise FetchSessionError(f"fetch from {self._address}: no answer in time") from e
        except Exception as e:  # a stream that broke while written to
            raise FetchSessionError(f"fetch from {self._address}: {e!r}") from e
        finally:
            self._in_flight = None

    def _abandon(self) -> None:
        """The partitions changed: a fetch in flight is for the old ones."""
        self._changed.set()
        if self._in_flight is not None:
            self._in_flight.cancel()

    @staticmethod
    async def _exchange(stream: Any, request: log_pb2.ReplicaFetchRequest,
                        time_limit: float) -> FetchResults:
        async with asyncio.timeout(time_limit):
            await stream.write(request)
            response = await stream.read()
        if response is grpc.aio.EOF:
            raise FetchSessionError("the leader ended the fetch session")
        return decode_fetch_response(response)

    @staticmethod
    async def _once(stub: _LeaderCalls, request: log_pb2.ReplicaFetchRequest,
                    time_limit: float) -> FetchResults:
        return decode_fetch_response(await stub.fetch_once(request, timeout=time_limit))

    # -- answers ---------------------------------------------------------------------------

    async def _process(self, response: FetchResults,
                       fetched: Mapping[TopicPartition, PartitionFetchState]) -> None:
        for result, records in response:
            key = (result.topic, result.partition)
            state = fetched.get(key)
            if state is None or self._partitions.get(key) is not state:
                continue  # no longer followed here, or at another epoch
            partition_log = self._manager.find(*key)
            if partition_log is None:
                continue
            if result.error_code:
                self._fetch_failed(key, state, partition_log, result)
                continue
            if result.HasField("file_records"):
                files = result.file_records
                read = self._files.read(files.path, files.inode, files.position, files.size)
                if read is None:
                    # Deleted, replaced or cut meanwhile: fetched again, carried.
                    self._files_refused_until = time.monotonic() + CARRIED_AFTER_REFUSAL_SECONDS
                    continue
                records = memoryview(read)
            try:
                await self._apply(key, state, partition_log, result, records)
            except KafkaError as exc:
                self._back_off(key)
                if exc.errno == _OUT_OF_RANGE:
                    continue  # the log end moved (it was cut): the next fetch says where
                if exc.errno not in _EXPECTED:
                    self._log_failure(f"appending {key[0]}-{key[1]}: {exc}")
            except OSError as exc:
                self._manager.storage_failed(exc, f"replicating {key[0]}-{key[1]}")
                self._back_off(key)

    async def _apply(self, key: TopicPartition, state: PartitionFetchState,
                     partition_log: PartitionLog, result: log_pb2.ReplicaFetchResult,
                     records: memoryview) -> None:
        await partition_log.append_as_follower(records, state.leader_epoch,
                                               result.high_watermark)
        # Kafka's maybeIncrementLogStartOffset: what the leader deleted goes here too.
        start = min(result.log_start_offset, partition_log.high_watermark)
        if start > partition_log.log_start_offset:
            await self._manager.delete_records(key[0], key[1], start)
        state.caught_up = partition_log.log_end_offset >= result.high_watermark
        if records:
            self._appended.add(key)
            metrics.REPLICATION_BYTES_IN.inc(len(records))
            if self._quota.is_throttled(partition_log.topic_configs, key[1]):
                self._quota.record(len(records))

    def _fetch_failed(self, key: TopicPartition, state: PartitionFetchState,
                      partition_log: PartitionLog, result: log_pb2.ReplicaFetchResult) -> None:
        self._back_off(key)
        end = partition_log.log_end_offset
        if result.error_code == _OUT_OF_RANGE and 0 <= end < result.log_start_offset:
            # Behind what the leader still has: copying cannot catch it up.
            state.start_over_at = result.log_start_offset
            state.truncating = True
            state.retry_at = 0.0
        elif result.error_code == _OUT_OF_RANGE and end > result.log_end_offset >= 0:
            log.warning("%s-%d: log end %d is past leader %d's end %d; checking it against "
                        "the leader's log again", key[0], key[1], end, self.leader,
                        result.log_end_offset)
            state.truncating = True
        elif result.error_code not in _EXPECTED:
            self._log_failure(f"fetching {key[0]}-{key[1]}: {error_name(result.error_code)} "
                              f"{result.error_message}")

    # -- truncation by leader epoch --------------------------------------------------------

    async def _check_against_leader(self, stub: _LeaderCalls,
                                    keys: list[TopicPartition]) -> None:
        """Check the logs of ``keys`` against the leader's and cut them where they part; a
        checked partition is fetched from then on."""
        latest: dict[TopicPartition, int] = {}
        for key in keys:
            state = self._partitions[key]
            partition_log = self._manager.find(*key)
            if partition_log is None:
                continue
            if (partition_log.state.role != FOLLOWER
                    or partition_log.state.leader_epoch != state.leader_epoch):
                self._back_off(key)  # its state moves on: it comes back through add()
                continue
            try:
                if state.start_over_at >= 0:
                    offset, state.start_over_at = state.start_over_at, NO_OFFSET
                    await partition_log.start_over_at(offset)
                    log.warning("%s-%d: this follower was behind leader %d's log start; it "
                                "starts over at %d", key[0], key[1], self.leader, offset)
                    state.truncating = False
                    continue
            except (KafkaError, OSError) as exc:
                self._local_failure(key, exc)
                continue
            epoch = partition_log.leader_epochs.latest_epoch
            if epoch < 0 or partition_log.log_end_offset <= 0:
                state.truncating = False  # nothing to compare: taken as it is
            else:
                latest[key] = epoch
        if not latest:
            return
        request = log_pb2.OffsetForLeaderEpochRequest(partitions=[
            log_pb2.PartitionLeaderEpoch(topic=t, partition=p, leader_epoch=epoch)
            for (t, p), epoch in latest.items()])
        try:
            answers = await stub.log.OffsetForLeaderEpoch(request, timeout=CALL_TIMEOUT)
        except grpc.aio.AioRpcError as e:
            raise FetchSessionError(f"OffsetForLeaderEpoch on {self._address}: "
                                    f"{e.code().name} {e.details()}") from e
        for answer in answers.results:
            key = (answer.topic, answer.partition)
            state = self._partitions.get(key)
            partition_log = self._manager.find(*key)
            if key not in latest or state is None or partition_log is None:
                continue
            if answer.error_code:
                self._back_off(key)
                if answer.error_code not in _EXPECTED:
                    self._log_failure(f"OffsetForLeaderEpoch of {key[0]}-{key[1]}: "
                                      f"{error_name(answer.error_code)}")
                continue
            end = partition_log.log_end_offset
            if answer.end_offset < 0:
                # The leader knows no epoch that old: keep what was committed (Kafka's
                # fallback to the high watermark).
                target = max(partition_log.high_watermark, 0)
            elif answer.leader_epoch == latest[key]:
                target = answer.end_offset
            else:
                _, own = partition_log.leader_epochs.end_offset_for(answer.leader_epoch, end)
                target = answer.end_offset if own < 0 else min(answer.end_offset, own)
            try:
                if target < end:
                    cut = await partition_log.truncate_to(target)
                    log.warning("%s-%d: follower cut from offset %d to %d to match leader %d "
                                "at epoch %d", key[0], key[1], end, cut, self.leader,
                                state.leader_epoch)
            except (KafkaError, OSError) as exc:
                self._local_failure(key, exc)
                continue
            state.truncating = False

    def _local_failure(self, key: TopicPartition, exc: Exception) -> None:
        self._back_off(key)
        if isinstance(exc, OSError):
            self._manager.storage_failed(exc, f"cutting {key[0]}-{key[1]}")
        elif isinstance(exc, KafkaError) and exc.errno not in _EXPECTED:
            self._log_failure(f"{key[0]}-{key[1]}: {exc}")


def _name(request: log_pb2.ReplicaFetchRequest, key: TopicPartition,
          named: tuple[int, int, int]) -> None:
    """Name ``key`` in ``request`` at (leader epoch, fetch offset, byte limit) ``named``."""
    request.partitions.add(topic=key[0], partition=key[1], leader_epoch=named[0],
                           fetch_offset=named[1], max_bytes=named[2])


class ReplicaFetcherManager:
    """The fetch sessions of this node, one per leader node it follows partitions on."""

    def __init__(self, *, node_id: int, manager: LogManager,
                 settings: Callable[[], ReplicationSettings], quota: ReplicationQuota,
                 tls: InternalTls, transport: str = STREAM, local_reader: str = "") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"unknown replica fetch transport {transport!r}")
        self._node_id = node_id
        self._manager = manager
        self._settings = settings
        self._quota = quota
        self._tls = tls
        self._transport = transport
        self._local_reader = local_reader
        self._files = FileRecordsReader()
        self._fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[TopicPartition, int] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def fetchers(self) -> Mapping[int, ReplicaFetcher]:
        return self._fetchers

    def follow(self, key: TopicPartition, leader: int, leader_epoch: int) -> None:
        """Fetch ``key`` from node ``leader`` at ``leader_epoch``."""
        current = self._leader_of.get(key)
        if current is not None and current != leader:
            self.unfollow(key)
        fetcher = self._fetchers.get(leader)
        if fetcher is None:
            fetcher = self._fetchers[leader] = ReplicaFetcher(
                node_id=self._node_id, leader=leader, manager=self._manager,
                settings=self._settings, quota=self._quota, tls=self._tls,
                transport=self._transport, local_reader=self._local_reader,
                files=self._files)
            fetcher.start()
        fetcher.add(key, leader_epoch)
        self._leader_of[key] = leader

    def unfollow(self, key: TopicPartition) -> None:
        leader = self._leader_of.pop(key, None)
        fetcher = self._fetchers.get(leader) if leader is not None else None
        if fetcher is None:
            return
        fetcher.remove(key)
        if not fetcher.partitions:
            del self._fetchers[fetcher.leader]
            task = asyncio.ensure_future(fetcher.stop())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    def wake(self) -> None:
        for fetcher in self._fetchers.values():
            fetcher.wake()

    async def stop(self) -> None:
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        self._leader_of.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), *self._stopping,
                             return_exceptions=True)
