"""The replicated metadata log (Kafka's ``__cluster_metadata``, reduced): the default
:class:`~services.replicator.metadata_store.MetadataStore`, keeping the cluster metadata in
partition ``__cluster_metadata``-0 on every configured log node, through the log service's
ordinary gRPC API (DescribePartitions, CreatePartitions, Read and conditional Append). The
replicator keeps nothing on its own disk, so a standby (or a replicator whose disk is gone)
rebuilds the whole state from the log nodes.

Replicas. Every log node in ``--log-nodes`` holds one replica, so finding them needs no
metadata. Each replica is a plain partition the log service knows nothing special about: it is
created without a replica state (a standalone leader that keeps the partition leader epoch its
writer gives), with ``cleanup.policy=compact`` (the cleaner keeps the newest record of each
key), ``flush.messages=1`` (every record is fsynced before the append is answered) and room for
large images (:data:`TOPIC_CONFIGS`). The log service does not replicate it: the writer appends
to every replica itself and counts acknowledgements, as a quorum does.

Records. One v2 record batch per write, one uncompressed record whose value is UTF-8 JSON; the
batch's partition leader epoch is the record's controller epoch. Two kinds:

- image (key ``b"image"``), one per commit, the whole image encoded as metadata.json is::

    {"format": 1, "kind": "image", "controller_epoch": 4, "writer": "<hex id of the process>",
     "sequence": 118, "image": {...}}

- claim (key ``b"claim"``), written when a replicator takes over (a fence without data), with
  the offset of the last image record before it on that replica (-1: none)::

    {"format": 1, "kind": "claim", "controller_epoch": 5, "writer": "...", "sequence": 119,
     "image_offset": 117}

Records are ordered by ``(controller_epoch, sequence)``; ``sequence`` grows with every write
attempt, failed ones included, so an image written again after a failed save outranks the
failed one (the metadata version alone would not: bookkeeping saves keep it). Only the
replicator that won an epoch's claim writes images under that epoch, so images of one epoch
come from one writer. On a replica, epochs never go down: a writer appends only at the end it
saw (conditional append) and only after checking that nothing newer is there. So a replica's
newest image is its last image record: the last record, or the one the trailing claim points
to.

Write (:meth:`MetadataLog.save`). The image record is appended at every replica with
``expected_log_end_offset`` = the end this writer last saw there; the save succeeds once a
majority acknowledged it and raises :class:`MetadataLogError` (an OSError) otherwise, so the
controller keeps its previous image. Each replica has one write in flight at a time; a slow
replica gets only the newest image waiting for it (each record holds the whole image, so the
ones in between are not needed), and a replica that missed writes is repaired by appending
the current image at its end. When an append finds another end
(INVALID_UPDATE_VERSION), or the end is not known (a node that was down, or whose replica is
gone and is created again), the writer reads that replica's last record first: a newer
controller epoch there (a claim or an image) means this replicator is deposed
(:class:`DeposedError`; every later save fails at once); anything older, or a claim of its own
epoch left by a takeover that lost, is a replica that lagged, and the image is appended at its
end.

Load (:meth:`MetadataLog.load`, at start-up). Read every reachable replica's last record and
last image (creating missing replicas) and require a majority. The image is the newest of
those images: any majority shares a replica with the majority that took the last successful
save, and that replica's last image is at least as new, so a replica back with stale data
never wins. Then take over in two steps. First claim: controller epoch = the highest epoch
seen + 1, and a claim record appended at a majority, strictly: if a replica's end moved since
it was read, or it holds this epoch or a newer one, or an image newer than the one chosen,
another writer was still writing, and the load starts over. A claim that reached only some
replicas carries no image, so a takeover that lost can never make stale data look new. Once
the claim holds a majority, no writer of an older epoch can complete a save (each of its
majorities meets a claimed replica, where its append fails and it finds itself deposed), so
the image read is the last committed one. Second, write that image under the new epoch. If no
majority of the replicas answers, the load retries with backoff for ``start_timeout`` seconds,
saying why, then fails.

A save that failed (no majority) may still have reached some replicas; like an uncommitted
entry of any quorum log it can surface at the next load if one of those replicas is read.

Not thread-safe: one event loop. Saves are serialised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import PLAINTEXT, internal_channel
from services.common.errors import ErrorCode, error_name
from services.common.records.record import build_batch
from services.common.records.record import decode_records as records_of_batch
from services.common.records.record_batch import (
    MAGIC,
    BatchHeader,
    RecordError,
    compute_crc,
    iter_batches,
)
from services.common.tls import InternalTls

from .metadata import LogNode, MetadataImage
from .metadata_store import DeposedError, decode_image, encode_image

log = logging.getLogger(__name__)

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
# Kafka's Uuid.METADATA_TOPIC_ID (AAAAAAAAAAAAAAAAAAAAAQ) in canonical text form.
METADATA_TOPIC_ID = "00000000-0000-0000-0000-000000000001"
IMAGE_KEY = b"image"
CLAIM_KEY = b"claim"
RECORD_FORMAT = 1

# An image of tens of thousands of partitions is a few MB of JSON.
MAX_RECORD_BYTES = 64 * 1024 * 1024
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "flush.messages": "1",
    "max.message.bytes": str(MAX_RECORD_BYTES),
    "segment.bytes": str(MAX_RECORD_BYTES),
}

# Bounded retries of one replica's write when its end moved under it.
_WRITE_ATTEMPTS = 3
# Bounded retries of a load whose takeover met another writer.
_LOAD_CONFLICTS = 10


class MetadataLogError(OSError):
    """A save or load did not reach a majority of the metadata log's replicas."""


class _NoMajorityError(MetadataLogError):
    """Fewer than a majority of the replicas answered or took a write."""


class _ConflictError(Exception):
    """Another writer wrote while a takeover was under way: read everything again."""


class _MismatchError(Exception):
    """A conditional append found another log end."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MetadataRecord:
    """One record of the metadata log: an image (or, for a claim, none) and who wrote it
    under which epoch. ``image_offset``: a claim's pointer to the last image record before
    it on its replica (-1: none)."""

    controller_epoch: int
    writer: str
    sequence: int
    image: MetadataImage | None = None
    image_offset: int = -1

    @property
    def is_claim(self) -> bool:
        return self.image is None

    @property
    def order(self) -> tuple[int, int]:
        return (self.controller_epoch, self.sequence)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaView:
    """What a replica holds: its log end offset, its last record (None: empty) and its last
    image record with that record's offset (None, -1: no image yet)."""

    log_end_offset: int
    last: MetadataRecord | None = None
    image: MetadataRecord | None = None
    image_offset: int = -1


# --- records ------------------------------------------------------------------------------


def encode_record(record: MetadataRecord, timestamp_ms: int) -> bytes:
    """The record batch of ``record`` (offsets are the log node's to assign)."""
    document: dict[str, object] = {
        "format": RECORD_FORMAT,
        "kind": "claim" if record.is_claim else "image",
        "controller_epoch": record.controller_epoch,
        "writer": record.writer,
        "sequence": record.sequence,
    }
    if record.image is None:
        document["image_offset"] = record.image_offset
    else:
        document["image"] = encode_image(record.image)
    key = CLAIM_KEY if record.is_claim else IMAGE_KEY
    value = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
    return build_batch([(key, value)], timestamp_ms,
                       partition_leader_epoch=record.controller_epoch)


def decode_records(data: bytes) -> list[tuple[int, MetadataRecord]]:
    """(offset, record) of every whole batch in ``data``; a torn tail is left out. Raises
    ValueError for a batch that is not a metadata record."""
    view = memoryview(data)
    return [_decode_batch(view[position:position + header.size], header)
            for position, header in iter_batches(view)]


def _decode_batch(batch: memoryview, header: BatchHeader) -> tuple[int, MetadataRecord]:
    base_offset = header.base_offset
    if header.magic != MAGIC or compute_crc(batch, 0, header.size) != header.crc:
        raise ValueError(f"batch at offset {base_offset}: not a valid v2 batch")
    if header.compression or header.record_count != 1 or header.last_offset_delta != 0:
        raise ValueError(f"batch at offset {base_offset}: not one uncompressed record")
    try:
        [stored] = records_of_batch(batch, header)
    except RecordError as e:
        raise ValueError(f"batch at offset {base_offset}: {e}") from e
    key, value = stored.key, stored.value
    if key not in (IMAGE_KEY, CLAIM_KEY) or value is None:
        raise ValueError(f"batch at offset {base_offset}: not a metadata record")
    try:
        doc = json.loads(value)
        if doc.get("format") != RECORD_FORMAT:
            raise ValueError(f"record format {doc.get('format')!r}")
        claim = doc["kind"] == "claim"
        if claim != (key == CLAIM_KEY):
            raise ValueError(f"a {doc['kind']} record under key {key!r}")
        record = MetadataRecord(
            controller_epoch=int(doc["controller_epoch"]), writer=str(doc["writer"]),
            sequence=int(doc["sequence"]),
            image=None if claim else decode_image(doc["image"]),
            image_offset=int(doc["image_offset"]) if claim else -1)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"batch at offset {base_offset}: {e}") from e
    return base_offset, record


# --- replicas ------------------------------------------------------------------------------


class _Replica:
    """One log node's replica as this writer knows it: the end it last saw there and the
    offset of the last image record (``end`` None: unknown, read the replica before writing).
    Writes go through one worker per replica, one at a time: ``next`` is the newest record
    waiting (a newer one replaces it), ``waiters`` the saves waiting for theirs."""

    def __init__(self, node: LogNode, timeout: float, tls: InternalTls) -> None:
        self.node_id = node.node_id
        self.address = node.address
        self._channel = internal_channel(node.address, tls, "log")
        self._stub = log_pb2_grpc.LogServiceStub(self._channel)
        self._timeout = timeout
        self.end: int | None = None
        self.image_offset = -1
        # The newest record this writer stored here: an older one never follows it.
        self.written_sequence = 0
        self.next: _Write | None = None
        self.waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self.worker: asyncio.Task[None] | None = None

    def __str__(self) -> str:
        return f"log node {self.node_id} ({self.address})"

    def saw(self, view: ReplicaView) -> None:
        self.end = view.log_end_offset
        self.image_offset = view.image_offset

    async def inspect(self) -> ReplicaView:
        """The replica's end, last record and last image; creates the replica if the node
        has none. Raises MetadataLogError when the node cannot answer, ValueError for records
        that are not metadata records (or a claim pointing at no image)."""
        for _ in range(5):
            described = await self._call(self._stub.DescribePartitions,
                                         log_pb2.DescribePartitionsRequest(partitions=[
                                             log_pb2.TopicPartition(
                                                 topic=METADATA_TOPIC,
                                                 partition=METADATA_PARTITION)]))
            state = described.partitions[0]
            if state.error_code == ErrorCode.unknown_topic_or_partition.value:
                await self._create()
                continue
            self._check(state.error_code, "describe")
            end = state.log_end_offset
            if end <= max(state.log_start_offset, 0):
                return ReplicaView(log_end_offset=end)
            found = await self._read_one(end - 1)
            if found is None or found[0] != end - 1 or found[2] != end:
                continue  # appended to, cut or deleted meanwhile: look again
            _, last, _ = found
            if not last.is_claim:
                return ReplicaView(log_end_offset=end, last=last, image=last,
                                   image_offset=end - 1)
            if last.image_offset < 0:
                return ReplicaView(log_end_offset=end, last=last)
            # A trailing claim: the image before it is the newest record of its key, which
            # the cleaner keeps.
            pointed = await self._read_one(last.image_offset)
            if pointed is None or pointed[0] != last.image_offset or pointed[1].is_claim:
                raise ValueError(f"{self}: the claim at offset {end - 1} points at offset "
                                 f"{last.image_offset}, which holds no image")
            return ReplicaView(log_end_offset=end, last=last, image=pointed[1],
                               image_offset=last.image_offset)
        raise MetadataLogError(f"{self}: the metadata log kept moving while being read")

    async def _read_one(self, offset: int) -> tuple[int, MetadataRecord, int] | None:
        """The batch holding ``offset`` (or the first after it): its offset, record and the
        replica's log end offset; None if the offset is out of range or the replica gone."""
        read = await self._call(self._stub.Read, log_pb2.ReadRequest(
            limit=log_pb2.READ_LIMIT_LOG_END, partitions=[log_pb2.PartitionRead(
                topic=METADATA_TOPIC, partition=METADATA_PARTITION, offset=offset,
                max_bytes=1)]))  # the first batch comes whole whatever its size
        result = read.results[0]
        if result.error_code in (ErrorCode.offset_out_of_range.value,
                                 ErrorCode.unknown_topic_or_partition.value):
            return None
        self._check(result.error_code, "read")
        records = decode_records(result.records)
        if not records:
            return None
        offset_found, record = records[0]
        return offset_found, record, int(result.log_end_offset)

    async def append(self, batch: bytes, expected_end: int) -> int:
        """Append ``batch`` if the log still ends at ``expected_end``; returns the new end.
        Raises _MismatchError (another end, or no replica), MetadataLogError (any other
        failure)."""
        reply = await self._call(self._stub.Append, log_pb2.AppendRequest(partitions=[
            log_pb2.PartitionAppend(topic=METADATA_TOPIC, partition=METADATA_PARTITION,
                                    records=batch, expected_log_end_offset=expected_end)]))
        result = reply.results[0]
        if result.error_code in (ErrorCode.invalid_update_version.value,
                                 ErrorCode.unknown_topic_or_partition.value):
            raise _MismatchError(result.error_message)
        self._check(result.error_code, "append", result.error_message)
        return int(result.log_end_offset)

    async def _create(self) -> None:
        reply = await self._call(self._stub.CreatePartitions, log_pb2.CreatePartitionsRequest(
            partitions=[log_pb2.PartitionSpec(topic=METADATA_TOPIC, partition=METADATA_PARTITION,
                                              topic_id=METADATA_TOPIC_ID,
                                              configs=TOPIC_CONFIGS)]))
        self._check(reply.results[0].error_code, "create", reply.results[0].error_message)
        log.info("%s: created the metadata log replica %s-%d", self, METADATA_TOPIC,
                 METADATA_PARTITION)

    def _check(self, code: int, what: str, message: str = "") -> None:
        if code:
            raise MetadataLogError(f"{self}: could not {what} the metadata log: "
                                   f"{error_name(code)} {message}".rstrip())

    async def _call(self, method, request):  # type: ignore[no-untyped-def]
        try:
            return await method(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            raise MetadataLogError(f"{self}: {e.code().name} {e.details()}") from e

    async def close(self) -> None:
        await self._channel.close()


# --- the store -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Write:
    """A record to write at a replica: its batch (a claim's depends on the replica). A claim
    is a strict write: ``chosen`` is the image record the load picked (None: none), and
    anything newer found on a replica is a conflict."""

    batch_for: Callable[[_Replica], bytes]
    record: MetadataRecord
    chosen: MetadataRecord | None = None


class MetadataLog:
    """:class:`~services.replicator.metadata_store.MetadataStore` over the metadata log on
    ``nodes`` (see the module docstring). ``call_timeout``: seconds per call to a log node;
    ``start_timeout``: how long :meth:`load` waits for a majority of the replicas."""

    def __init__(
        self,
        nodes: Sequence[LogNode],
        *,
        call_timeout: float = 5.0,
        start_timeout: float = 60.0,
        tls: InternalTls = PLAINTEXT,
    ) -> None:
        if not nodes:
            raise ValueError("the metadata log needs at least one log node")
        self._replicas = [_Replica(n, call_timeout, tls) for n in nodes]
        self.majority = len(self._replicas) // 2 + 1
        self._start_timeout = start_timeout
        self.writer_id = uuid.uuid4().hex
        # 0 until load() took over: a save without a load writes at epoch 1.
        self._epoch = 0
        self._sequence = 0
        self._deposed: DeposedError | None = None
        self._save_lock = asyncio.Lock()
        self._closing = False

    @property
    def controller_epoch(self) -> int:
        """The epoch this writer writes under (0 before :meth:`load`)."""
        return self._epoch

    @property
    def deposed(self) -> bool:
        return self._deposed is not None

    # -- load -------------------------------------------------------------------------------

    async def load(self) -> MetadataImage | None:
        """Rebuild the image from a majority of the replicas and take over under a new
        controller epoch (see the module docstring). None: the log is empty (a new cluster;
        the first save starts it)."""
        deadline = time.monotonic() + self._start_timeout
        delay, conflicts = 0.1, 0
        while True:
            try:
                return await self._load_once()
            except _NoMajorityError as e:
                if time.monotonic() + delay > deadline:
                    raise MetadataLogError(
                        f"gave up after {self._start_timeout:g}s: {e}") from None
                log.warning("metadata log: %s; retrying in %.1fs", e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except (_ConflictError, DeposedError) as e:
                conflicts += 1
                if conflicts >= _LOAD_CONFLICTS:
                    raise MetadataLogError(f"another writer kept writing: {e}") from None
                log.warning("metadata log: another writer is taking over too (%s); reading "
                            "it again", e)
                # A random pause, so that two replicators taking over at once stop taking
                # turns at deposing each other.
                await asyncio.sleep(random.uniform(0, min(0.05 * 2 ** conflicts, 1.0)))

    async def _load_once(self) -> MetadataImage | None:
        outcomes = await asyncio.gather(*(r.inspect() for r in self._replicas),
                                        return_exceptions=True)
        views: list[ReplicaView] = []
        problems: list[str] = []
        for replica, outcome in zip(self._replicas, outcomes, strict=True):
            if isinstance(outcome, ReplicaView):
                replica.saw(outcome)
                views.append(outcome)
            else:
                replica.end = None
                if not isinstance(outcome, (OSError, ValueError)):
                    raise outcome
                problems.append(str(outcome))
        if len(views) < self.majority:
            raise _NoMajorityError(
                f"{len(views)} of {len(self._replicas)} log nodes answered, {self.majority} "
                f"needed ({'; '.join(problems)})")
        images = [v.image for v in views if v.image is not None]
        chosen = max(images, key=lambda r: r.order) if images else None
        lasts = [v.last for v in views if v.last is not None]
        self._epoch = max([self._epoch, *(r.controller_epoch for r in lasts)]) + 1
        # Never below what this writer used itself in an earlier attempt.
        self._sequence = max([self._sequence, *(r.sequence for r in lasts + images)])
        self._deposed = None
        await self._write(None, chosen)
        if chosen is None or chosen.image is None:
            log.info("metadata log: empty on %d of %d log nodes; a new cluster starts at "
                     "controller epoch %d", len(views), len(self._replicas), self._epoch)
            return None
        image = chosen.image
        await self._write(image)
        log.info("metadata log: took over at controller epoch %d with metadata version %d "
                 "(cluster %s), read from %d of %d log nodes", self._epoch, image.version,
                 image.cluster_id, len(views), len(self._replicas))
        return image

    # -- save -------------------------------------------------------------------------------

    async def save(self, image: MetadataImage) -> None:
        """Append ``image`` at a majority of the replicas. Raises DeposedError when a newer
        writer is found, MetadataLogError when no majority took it."""
        await self._write(image)

    async def _write(self, image: MetadataImage | None, chosen: MetadataRecord | None = None
                     ) -> None:
        """One record (an image, or without one a claim over ``chosen``) at every replica;
        returns once a majority acknowledged it."""
        async with self._save_lock:
            if self._deposed is not None:
                raise self._deposed
            if self._epoch == 0:
                self._epoch = 1
            self._sequence += 1
            record = MetadataRecord(controller_epoch=self._epoch, writer=self.writer_id,
                                    sequence=self._sequence, image=image)
            now = int(time.time() * 1000)
            shared = encode_record(record, now) if image is not None else b""

            def batch_for(replica: _Replica) -> bytes:
                if image is not None:
                    return shared
                return encode_record(MetadataRecord(
                    controller_epoch=record.controller_epoch, writer=record.writer,
                    sequence=record.sequence, image_offset=replica.image_offset), now)

            # Every replica gets the record through its worker; the save waits for a
            # majority only, and a slow replica's worker carries on without it.
            write = _Write(batch_for, record, chosen)
            waits = [self._submit(replica, write) for replica in self._replicas]
            acked, failures = 0, []
            pending = set(waits)
            while pending and acked < self.majority:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    error = future.exception()
                    if isinstance(error, (DeposedError, _ConflictError)):
                        raise error
                    if error is not None:
                        failures.append(str(error))
                    elif future.result():
                        acked += 1
            if acked < self.majority:
                what = (f"metadata version {image.version}" if image is not None
                        else f"the claim of controller epoch {record.controller_epoch}")
                raise _NoMajorityError(
                    f"{what} reached {acked} of {len(self._replicas)} log nodes, "
                    f"{self.majority} needed ({'; '.join(failures)})")

    def _submit(self, replica: _Replica, write: _Write) -> asyncio.Future[bool]:
        """Queue ``write`` at ``replica`` (replacing an older one still waiting); the future
        is True once it is stored, False if a newer record took its place, and fails with
        the reason otherwise."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        # Nobody may be waiting any more when it fails: the error is logged, not lost.
        future.add_done_callback(_settled)
        replica.next = write
        replica.waiters.append((write.record.sequence, future))
        if replica.worker is None or replica.worker.done():
            replica.worker = asyncio.create_task(self._drain(replica),
                                                 name=f"metadata-log-{replica.node_id}")
        return future

    async def _drain(self, replica: _Replica) -> None:
        """The replica's worker: write the newest waiting record until none is left."""
        while replica.next is not None and not self._closing:
            write, replica.next = replica.next, None
            error: BaseException | None = None
            stored = False
            try:
                if self._deposed is not None and not write.record.is_claim:
                    raise self._deposed
                stored = await self._write_replica(replica, write)
            except asyncio.CancelledError as e:
                error = e
            except Exception as e:  # noqa: BLE001 - handed to the waiting saves
                error = e
            sequence = write.record.sequence
            settled = [w for w in replica.waiters if w[0] <= sequence]
            replica.waiters = [w for w in replica.waiters if w[0] > sequence]
            for waited, future in settled:
                if future.done():
                    continue
                if error is not None and waited == sequence:
                    future.set_exception(error if isinstance(error, Exception)
                                         else MetadataLogError(f"{replica}: cancelled"))
                else:
                    future.set_result(stored and waited == sequence)
            if isinstance(error, asyncio.CancelledError):
                raise error

    async def _write_replica(self, replica: _Replica, write: _Write) -> bool:
        """Append the record at ``replica``'s end; True once stored, False when a newer
        record of this writer is there already."""
        record = write.record
        if record.sequence <= replica.written_sequence:
            return False
        for _ in range(_WRITE_ATTEMPTS):
            if replica.end is None:
                view = await replica.inspect()
                self._check_found(replica, view, record, write.chosen)
                replica.saw(view)
            expected = replica.end
            assert expected is not None
            try:
                replica.end = await replica.append(write.batch_for(replica), expected)
            except _MismatchError as e:
                replica.end = None
                if record.is_claim:
                    raise _ConflictError(f"{replica}: written meanwhile ({e})") from None
                continue
            except BaseException:
                replica.end = None
                raise
            if not record.is_claim:
                replica.image_offset = expected
            replica.written_sequence = record.sequence
            return True
        raise MetadataLogError(f"{replica}: its end kept moving")

    def _check_found(self, replica: _Replica, view: ReplicaView, mine: MetadataRecord,
                     chosen: MetadataRecord | None) -> None:
        """What a replica holds must not be newer than what this writer writes there."""
        found = view.last
        if mine.is_claim:
            if found is not None and found.controller_epoch >= mine.controller_epoch:
                raise _ConflictError(f"{replica} holds controller epoch "
                                     f"{found.controller_epoch} already")
            if view.image is not None and (chosen is None or view.image.order > chosen.order):
                raise _ConflictError(f"{replica} holds an image newer than the one read")
            return
        if found is None:
            return
        # A claim of this epoch from another writer is a takeover that lost: older.
        if found.controller_epoch > mine.controller_epoch or (
                found.controller_epoch == mine.controller_epoch
                and found.writer != mine.writer and not found.is_claim):
            error = DeposedError(
                f"{replica} holds controller epoch {found.controller_epoch} (writer "
                f"{found.writer}); this replicator (epoch {mine.controller_epoch}) is deposed")
            self._deposed = error
            log.error("metadata log: %s", error)
            raise error

    async def close(self, grace: float = 1.0) -> None:
        """Let writes still under way on slow replicas finish for up to ``grace`` seconds,
        then cancel them and close the channels."""
        workers = [r.worker for r in self._replicas if r.worker is not None]
        if workers:
            await asyncio.wait(workers, timeout=grace)
        self._closing = True
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(BaseException):
                await worker
        for replica in self._replicas:
            for _, future in replica.waiters:
                future.cancel()
            replica.waiters.clear()
        await asyncio.gather(*(r.close() for r in self._replicas))


def _settled(future: asyncio.Future[bool]) -> None:
    if future.cancelled():
        return
    error = future.exception()
    if error is not None and not isinstance(error, (DeposedError, _ConflictError)):
        log.debug("metadata log: a write failed: %s", error)
