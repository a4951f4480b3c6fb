"""The replicated metadata log (Kafka's ``__cluster_metadata``, reduced): the default
:class:`~services.replicator.metadata_store.MetadataStore`, keeping the cluster metadata in
partition ``__cluster_metadata``-0 on every configured log node, through the log service's
ordinary gRPC API (DescribePartitions, CreatePartitions, Read and conditional Append). The
replicator keeps nothing on its own disk, so a standby (or a replicator whose disk is gone)
rebuilds the whole state from the log nodes.

Replicas. Every log node in ``--log-nodes`` holds one replica, so finding them needs no
metadata. Each replica is a plain partition the log service knows nothing special about: it is
created without a replica state (a standalone leader that keeps the partition leader epoch its
writer gives), with ``cleanup.policy=compact`` (the cleaner keeps the newest record),
``flush.messages=1`` (every record is fsynced before the append is answered) and room for large
images (:data:`TOPIC_CONFIGS`). The log service does not replicate it: the writer appends to
every replica itself and counts acknowledgements, as a quorum does.

Records. One v2 record batch per commit, one uncompressed record, key ``b"image"``, value a
UTF-8 JSON document::

    {"format": 1, "controller_epoch": 4, "writer": "<hex id of the replicator process>",
     "sequence": 118, "image": {<the image, encoded as metadata.json is>}}

The batch's partition leader epoch is the controller epoch too. Records are ordered by
``(controller_epoch, sequence)``; ``sequence`` grows with every write attempt, failed ones
included, so an image written again after a failed save always outranks the failed one (the
metadata version alone would not: bookkeeping saves keep it). The newest record of a replica is
its last one: a writer appends only at the end it saw (conditional append), and only after
checking that nothing newer is there.

Write (:meth:`MetadataLog.save`). The record is appended at every replica with
``expected_log_end_offset`` = the end this writer last saw there; the save succeeds once a
majority of the replicas acknowledged it, and raises :class:`MetadataLogError` (an OSError)
otherwise, so the controller keeps its previous image. A replica still busy with an earlier
write (a slow node) is skipped: each record holds the whole image, so a replica that missed
some writes is repaired by simply appending the current image at its end the next time. When an
append finds another end (INVALID_UPDATE_VERSION), or the end is not known (a node that was
down, or whose replica is gone and is created again), the writer reads that replica's last
record first: a record of a newer controller epoch, or of the same epoch from another writer,
means this replicator is deposed (:class:`DeposedError`; every later save fails at once);
anything older is a replica that lagged, and the record is appended at its end.

Load (:meth:`MetadataLog.load`, at start-up). Read the last record of every reachable replica
(creating missing replicas), require a majority, and take the newest by ``(controller_epoch,
sequence)``. Any majority shares a replica with the majority that acknowledged the last
successful save, and that replica's last record is at least as new, so a replica that comes
back with stale data never wins. Then take over: controller epoch = the highest one seen + 1,
and write the chosen image back at a majority under it (fencing). The takeover write is strict:
if any replica's end moved since it was read, or holds a record newer than the chosen one, an
older writer was still committing, and the load starts over, so nothing it committed is lost.
If no majority of the replicas answers, the load retries with backoff for ``start_timeout``
seconds, saying why, then fails. An empty log with a ``metadata.json`` in the replicator's data
directory takes that file's image once (migration; the file is renamed
``metadata.json.migrated`` after the takeover write).

Fencing rule: a write becomes the state only when a majority took it; after a takeover at epoch
E has reached a majority, every writer of an epoch below E finds that majority's ends moved and
a record of epoch E there, so it is deposed before any of its writes can reach a majority.
A save that failed (no majority) may still have reached some replicas; like an uncommitted
entry of any quorum log it can surface at the next load if one of those replicas is read.

Not thread-safe: one event loop. Saves are serialised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from crc32c import crc32c

from kbroker.log.v1 import log_pb2, log_pb2_grpc
from services.common.channels import insecure_channel
from services.common.errors import ErrorCode

from .metadata import LogNode, MetadataImage, NodeId
from .metadata_store import (
    FILE_NAME,
    DeposedError,
    JsonFileMetadataStore,
    decode_image,
    encode_image,
)

log = logging.getLogger(__name__)

METADATA_TOPIC = "__cluster_metadata"
METADATA_PARTITION = 0
# Kafka's Uuid.METADATA_TOPIC_ID (AAAAAAAAAAAAAAAAAAAAAQ) in canonical text form.
METADATA_TOPIC_ID = "00000000-0000-0000-0000-000000000001"
RECORD_KEY = b"image"
RECORD_FORMAT = 1
MIGRATED_SUFFIX = ".migrated"

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
    """One record of the metadata log: an image and who wrote it under which epoch."""

    controller_epoch: int
    writer: str
    sequence: int
    image: MetadataImage

    @property
    def order(self) -> tuple[int, int]:
        return (self.controller_epoch, self.sequence)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaView:
    """What a replica holds: its log end offset and its last record (None: empty)."""

    node_id: NodeId
    log_end_offset: int
    last: MetadataRecord | None


# --- record batches ------------------------------------------------------------------------
#
# RecordBatch => BaseOffset:int64 BatchLength:int32 PartitionLeaderEpoch:int32 Magic:int8 (2)
#                CRC:uint32 (CRC-32C of Attributes..end) Attributes:int16 LastOffsetDelta:int32
#                BaseTimestamp:int64 MaxTimestamp:int64 ProducerId:int64 ProducerEpoch:int16
#                BaseSequence:int32 RecordCount:int32 Records
# Record => Length:varint Attributes:int8 TimestampDelta:varint OffsetDelta:varint
#           KeyLength:varint Key ValueLength:varint Value HeadersCount:varint
# (varints zig-zag encoded, as in Kafka's DefaultRecord)

_HEADER = struct.Struct(">qiibIhiqqqhii")
_AFTER_CRC = struct.Struct(">hiqqqhii")
_LOG_OVERHEAD = 12  # base offset and batch length
_CRC_FROM = 21
_COMPRESSION_MASK = 0x07


def _varint(value: int) -> bytes:
    zigzag = (value << 1) ^ (value >> 63)
    out = bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def _read_varint(data: memoryview, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def encode_record(record: MetadataRecord, timestamp_ms: int) -> bytes:
    """The record batch of ``record`` (offsets are the log node's to assign)."""
    value = json.dumps({
        "format": RECORD_FORMAT,
        "controller_epoch": record.controller_epoch,
        "writer": record.writer,
        "sequence": record.sequence,
        "image": encode_image(record.image),
    }, sort_keys=True, separators=(",", ":")).encode()
    body = (b"\x00" + _varint(0) + _varint(0) + _varint(len(RECORD_KEY)) + RECORD_KEY
            + _varint(len(value)) + value + _varint(0))
    after_crc = _AFTER_CRC.pack(0, 0, timestamp_ms, timestamp_ms, -1, -1, -1, 1) \
        + _varint(len(body)) + body
    length = 4 + 1 + 4 + len(after_crc)  # partition leader epoch, magic, crc, the rest
    return struct.pack(">qiibI", 0, length, record.controller_epoch, 2,
                       crc32c(after_crc)) + after_crc


def decode_last_record(data: bytes) -> tuple[MetadataRecord | None, int]:
    """The record of the last whole batch in ``data`` and the offset after that batch
    (-1, with None, when ``data`` holds no whole batch). Raises ValueError for a batch that is
    not a metadata record."""
    view = memoryview(data)
    pos, last = 0, -1
    while pos + _HEADER.size <= len(view):
        length = _HEADER.unpack_from(view, pos)[1]
        end = pos + _LOG_OVERHEAD + length
        if end > len(view):
            break
        last, pos = pos, end
    if last < 0:
        return None, -1
    (base_offset, length, _epoch, magic, crc, attributes, last_delta, _ts, _max_ts, _pid,
     _pepoch, _seq, count) = _HEADER.unpack_from(view, last)
    end = last + _LOG_OVERHEAD + length
    if magic != 2 or crc32c(view[last + _CRC_FROM:end]) != crc:
        raise ValueError(f"batch at offset {base_offset}: not a valid v2 batch")
    if attributes & _COMPRESSION_MASK or count != 1:
        raise ValueError(f"batch at offset {base_offset}: not one uncompressed record")
    pos = last + _HEADER.size
    _size, pos = _read_varint(view, pos)
    pos += 1  # record attributes
    _ts_delta, pos = _read_varint(view, pos)
    _offset_delta, pos = _read_varint(view, pos)
    key_size, pos = _read_varint(view, pos)
    key = bytes(view[pos:pos + max(key_size, 0)])
    pos += max(key_size, 0)
    value_size, pos = _read_varint(view, pos)
    if key != RECORD_KEY or value_size < 0 or pos + value_size > end:
        raise ValueError(f"batch at offset {base_offset}: not a metadata image record")
    try:
        doc = json.loads(bytes(view[pos:pos + value_size]))
        if doc.get("format") != RECORD_FORMAT:
            raise ValueError(f"record format {doc.get('format')!r}")
        record = MetadataRecord(controller_epoch=int(doc["controller_epoch"]),
                                writer=str(doc["writer"]), sequence=int(doc["sequence"]),
                                image=decode_image(doc["image"]))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"batch at offset {base_offset}: {e}") from e
    return record, base_offset + last_delta + 1


# --- replicas ------------------------------------------------------------------------------


class _Replica:
    """One log node's replica: its stub, the end this writer last saw there (None: unknown,
    read it before writing) and a lock that keeps one write at a time in flight."""

    def __init__(self, node: LogNode, timeout: float) -> None:
        self.node_id = node.node_id
        self.address = node.address
        self._channel = insecure_channel(node.address)
        self._stub = log_pb2_grpc.LogServiceStub(self._channel)
        self._timeout = timeout
        self.end: int | None = None
        self.lock = asyncio.Lock()

    def __str__(self) -> str:
        return f"log node {self.node_id} ({self.address})"

    async def inspect(self) -> ReplicaView:
        """The replica's end and last record; creates the replica if the node has none.
        Raises MetadataLogError when the node cannot answer, ValueError for a last record
        that is not one."""
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
                return ReplicaView(node_id=self.node_id, log_end_offset=end, last=None)
            read = await self._call(self._stub.Read, log_pb2.ReadRequest(
                limit=log_pb2.READ_LIMIT_LOG_END, partitions=[log_pb2.PartitionRead(
                    topic=METADATA_TOPIC, partition=METADATA_PARTITION, offset=end - 1,
                    max_bytes=MAX_RECORD_BYTES)]))
            result = read.results[0]
            if result.error_code in (ErrorCode.offset_out_of_range.value,
                                     ErrorCode.unknown_topic_or_partition.value):
                continue  # cut or deleted meanwhile
            self._check(result.error_code, "read")
            record, next_offset = decode_last_record(result.records)
            if record is not None and next_offset == result.log_end_offset:
                return ReplicaView(node_id=self.node_id, log_end_offset=next_offset,
                                   last=record)
            # Appended to meanwhile (the last batch is not the one read): look again.
        raise MetadataLogError(f"{self}: the metadata log kept moving while being read")

    async def append(self, batch: bytes, expected_end: int) -> int:
        """Append ``batch`` if the log still ends at ``expected_end``; returns the new end.
        Raises _MismatchError (another end, or no replica), MetadataLogError (any other failure)."""
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
            try:
                name = ErrorCode(code).name.upper()
            except ValueError:
                name = str(code)
            raise MetadataLogError(f"{self}: could not {what} the metadata log: {name} "
                                   f"{message}".rstrip())

    async def _call(self, method, request):  # type: ignore[no-untyped-def]
        try:
            return await method(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            raise MetadataLogError(f"{self}: {e.code().name} {e.details()}") from e

    async def close(self) -> None:
        await self._channel.close()


# --- the store -----------------------------------------------------------------------------


class MetadataLog:
    """:class:`~services.replicator.metadata_store.MetadataStore` over the metadata log on
    ``nodes`` (see the module docstring). ``legacy_dir``: where a ``metadata.json`` to migrate
    may be. ``call_timeout``: seconds per call to a log node; ``start_timeout``: how long
    :meth:`load` waits for a majority of the replicas."""

    def __init__(
        self,
        nodes: Sequence[LogNode],
        *,
        legacy_dir: str | os.PathLike[str] | None = None,
        call_timeout: float = 5.0,
        start_timeout: float = 60.0,
        writer_id: str | None = None,
    ) -> None:
        if not nodes:
            raise ValueError("the metadata log needs at least one log node")
        self._replicas = [_Replica(n, call_timeout) for n in nodes]
        self.majority = len(self._replicas) // 2 + 1
        self._legacy_dir = Path(legacy_dir) if legacy_dir is not None else None
        self._start_timeout = start_timeout
        self.writer_id = writer_id or uuid.uuid4().hex
        # 0 until load() took over: saves then start at epoch 1 (a fresh log).
        self._epoch = 0
        self._sequence = 0
        self._deposed: DeposedError | None = None
        self._save_lock = asyncio.Lock()
        self._stragglers: set[asyncio.Task[bool]] = set()

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
        controller epoch (see the module docstring). None: the log is empty and there is no
        ``metadata.json`` to migrate (a new cluster; the first save starts it)."""
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
            except _ConflictError as e:
                conflicts += 1
                if conflicts >= _LOAD_CONFLICTS:
                    raise MetadataLogError(f"another writer kept writing: {e}") from None
                log.warning("metadata log: %s; reading it again", e)

    async def _load_once(self) -> MetadataImage | None:
        outcomes = await asyncio.gather(*(r.inspect() for r in self._replicas),
                                        return_exceptions=True)
        views: list[ReplicaView] = []
        problems: list[str] = []
        for replica, outcome in zip(self._replicas, outcomes, strict=True):
            if isinstance(outcome, ReplicaView):
                replica.end = outcome.log_end_offset
                views.append(outcome)
            else:
                replica.end = None
                if not isinstance(outcome, (OSError, ValueError)):
                    raise outcome
                problems.append(str(outcome))
        if len(views) < self.majority:
            raise _NoMajorityError(f"{len(views)} of {len(self._replicas)} log nodes answered, "
                              f"{self.majority} needed ({'; '.join(problems)})")
        records = [v.last for v in views if v.last is not None]
        best = max(records, key=lambda r: r.order) if records else None
        self._epoch = max((r.controller_epoch for r in records), default=0) + 1
        self._sequence = max((r.sequence for r in records), default=0)
        self._deposed = None
        migrated = False
        if best is not None:
            image = best.image
        else:
            image = await self._legacy_image()
            if image is None:
                log.info("metadata log: empty on %d of %d log nodes; a new cluster starts",
                         len(views), len(self._replicas))
                return None
            migrated = True
        await self._write(image, newest=best)
        if migrated:
            self._retire_legacy_file()
        log.info("metadata log: took over at controller epoch %d with metadata version %d "
                 "(cluster %s), read from %d of %d log nodes%s", self._epoch, image.version,
                 image.cluster_id, len(views), len(self._replicas),
                 " (migrated from metadata.json)" if migrated else "")
        return image

    async def _legacy_image(self) -> MetadataImage | None:
        if self._legacy_dir is None:
            return None
        return await JsonFileMetadataStore(self._legacy_dir).load()

    def _retire_legacy_file(self) -> None:
        assert self._legacy_dir is not None
        path = self._legacy_dir / FILE_NAME
        with contextlib.suppress(FileNotFoundError):
            path.replace(path.with_name(FILE_NAME + MIGRATED_SUFFIX))

    # -- save -------------------------------------------------------------------------------

    async def save(self, image: MetadataImage) -> None:
        """Append ``image`` at a majority of the replicas. Raises DeposedError when a newer
        writer is found, MetadataLogError when no majority took it."""
        await self._write(image)

    async def _write(self, image: MetadataImage, newest: MetadataRecord | None = None,
                     ) -> None:
        """One write at every replica not busy with an earlier one; returns once a majority
        acknowledged. ``newest`` (a takeover: the record the image was chosen from) makes the
        write strict: a moved end or a newer record raises _ConflictError."""
        async with self._save_lock:
            if self._deposed is not None:
                raise self._deposed
            if self._epoch == 0:
                self._epoch = 1  # a new cluster's first write
            self._sequence += 1
            record = MetadataRecord(controller_epoch=self._epoch, writer=self.writer_id,
                                    sequence=self._sequence, image=image)
            batch = encode_record(record, int(time.time() * 1000))
            strict = newest is not None
            # A replica still busy with an earlier write is left to catch up later, unless
            # the others cannot make a majority without it.
            targets = [r for r in self._replicas if not r.lock.locked()]
            if len(targets) < self.majority:
                targets = list(self._replicas)
            writes = [asyncio.create_task(self._write_replica(r, batch, record, newest, strict))
                      for r in targets]
            skipped = len(self._replicas) - len(writes)
            acked, failures = 0, []
            pending = set(writes)
            try:
                while pending and acked < self.majority:
                    done, pending = await asyncio.wait(pending,
                                                       return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        error = task.exception()
                        if isinstance(error, (DeposedError, _ConflictError)):
                            raise error
                        if error is not None:
                            failures.append(str(error))
                        elif task.result():
                            acked += 1
            finally:
                for task in pending:  # slow replicas finish in the background
                    self._stragglers.add(task)
                    task.add_done_callback(self._straggler_done)
            if acked < self.majority:
                if skipped:
                    failures.append(f"{skipped} log node(s) busy with an earlier write")
                raise _NoMajorityError(
                    f"metadata version {image.version} reached {acked} of "
                    f"{len(self._replicas)} log nodes, {self.majority} needed "
                    f"({'; '.join(failures)})")

    async def _write_replica(self, replica: _Replica, batch: bytes, record: MetadataRecord,
                             newest: MetadataRecord | None, strict: bool) -> bool:
        """Append ``batch`` at ``replica``'s end; True once stored."""
        async with replica.lock:
            for _ in range(_WRITE_ATTEMPTS):
                if replica.end is None:
                    view = await replica.inspect()
                    self._check_not_newer(replica, view.last, record, newest)
                    replica.end = view.log_end_offset
                try:
                    replica.end = await replica.append(batch, replica.end)
                    return True
                except _MismatchError as e:
                    replica.end = None
                    if strict:
                        raise _ConflictError(f"{replica}: written meanwhile ({e})") from None
                except BaseException:
                    replica.end = None
                    raise
            raise MetadataLogError(f"{replica}: its end kept moving")

    def _check_not_newer(self, replica: _Replica, found: MetadataRecord | None,
                         mine: MetadataRecord, newest: MetadataRecord | None) -> None:
        if found is None:
            return
        if (found.controller_epoch > mine.controller_epoch
                or (found.controller_epoch == mine.controller_epoch
                    and found.writer != mine.writer)):
            if newest is not None:
                raise _ConflictError(f"{replica} holds controller epoch {found.controller_epoch} "
                                f"of another writer")
            error = DeposedError(
                f"{replica} holds the metadata of controller epoch {found.controller_epoch} "
                f"(writer {found.writer}); this replicator (epoch {mine.controller_epoch}) "
                f"is deposed")
            self._deposed = error
            log.error("metadata log: %s", error)
            raise error
        if newest is not None and found.order > newest.order:
            raise _ConflictError(f"{replica} holds a record newer than the one read "
                            f"({found.order} > {newest.order})")

    def _straggler_done(self, task: asyncio.Task[bool]) -> None:
        self._stragglers.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None and not isinstance(error, (DeposedError, _ConflictError)):
            log.info("metadata log: a late write failed: %s", error)

    async def close(self) -> None:
        for task in list(self._stragglers):
            task.cancel()
        for task in list(self._stragglers):
            with contextlib.suppress(BaseException):
                await task
        await asyncio.gather(*(r.close() for r in self._replicas))
