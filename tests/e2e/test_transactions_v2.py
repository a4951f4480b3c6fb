"""Transactions v2 (KIP-890 part 2) over the wire against a real local cluster, as a Kafka 4
client speaks it once ApiVersions finalizes ``transaction.version`` 2: InitProducerId, then
Produce v12 and TxnOffsetCommit v5 without AddPartitionsToTxn or AddOffsetsToTxn (the
partitions join the transaction implicitly), EndTxn v5 answering the bumped epoch, the next
transaction at that epoch. A read_committed consumer (confluent-kafka) sees the committed
records only, the group's offsets count once the transaction commits, and a producer still at
the epoch before the bump is fenced.

No Kafka 4 client is installed here, so requests are framed with kio (:mod:`.wire`), one
connection per broker port the cluster advertises.
"""

from __future__ import annotations

import datetime
import socket
import time
import uuid
from itertools import count

from confluent_kafka import Consumer, TopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.end_txn.v5.request import EndTxnRequest
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v5.request import InitProducerIdRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic
from kio.schema.produce.v11 import request as produce_v11
from kio.schema.produce.v12 import request as produce_v12
from kio.schema.txn_offset_commit.v5.request import (
    TxnOffsetCommitRequest,
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kio.static.primitive import i8, i16, i32, i32Timedelta, i64

from services.common.errors import ErrorCode
from services.common.records.record import Record, encode_batch
from services.common.records.record_batch import TRANSACTIONAL_BIT, BatchHeader

from .test_confluent_kafka import create_topic
from .test_transactions import read_all
from .wire import encode_request, read_response

PARTITIONS = 3
COORDINATOR_TRANSACTION = 1
COORDINATOR_GROUP = 0
# Answers a client retries (the coordinator is loading, or the last transaction is still
# being ended), with how long to try.
RETRIABLE = {ErrorCode.coordinator_load_in_progress, ErrorCode.coordinator_not_available,
             ErrorCode.not_coordinator, ErrorCode.concurrent_transactions,
             ErrorCode.not_enough_replicas, ErrorCode.not_leader_or_follower}
RETRY_FOR_S = 30.0


class Broker:
    """One connection to one broker port, requests answered in turn."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=30)
        self.correlation = count(1)

    def request(self, request: object) -> object:
        correlation_id = next(self.correlation)
        self.sock.sendall(encode_request(request, correlation_id, client_id="tv2-test"))
        got, response = read_response(self.sock, type(request))
        assert got == correlation_id
        return response

    def close(self) -> None:
        self.sock.close()


class Cluster:
    """Connections to every broker, opened on first use, and the leaders of one topic."""

    def __init__(self, bootstrap: str) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.bootstrap = Broker(host, int(port))
        self.brokers: dict[tuple[str, int], Broker] = {}

    def at(self, host: str, port: int) -> Broker:
        broker = self.brokers.get((host, port))
        if broker is None:
            broker = self.brokers[(host, port)] = Broker(host, port)
        return broker

    def leaders(self, topic: str) -> dict[int, Broker]:
        response = self.bootstrap.request(MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name=topic),),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False))
        nodes = {b.node_id: (b.host, b.port) for b in response.brokers}
        [answer] = response.topics
        return {p.partition_index: self.at(*nodes[p.leader_id]) for p in answer.partitions}

    def coordinator(self, key: str, key_type: int) -> Broker:
        deadline = time.monotonic() + RETRY_FOR_S
        while True:
            [found] = self.bootstrap.request(FindCoordinatorRequest(
                key_type=i8(key_type), coordinator_keys=(key,))).coordinators
            if found.error_code == ErrorCode.none:
                return self.at(found.host, found.port)
            assert found.error_code in RETRIABLE and time.monotonic() < deadline, found
            time.sleep(0.2)

    def close(self) -> None:
        self.bootstrap.close()
        for broker in self.brokers.values():
            broker.close()


def retried(send, error_of):
    """``send()`` again while its answer is an error clients retry."""
    deadline = time.monotonic() + RETRY_FOR_S
    while True:
        response = send()
        if error_of(response) not in RETRIABLE or time.monotonic() > deadline:
            return response
        time.sleep(0.1)


def transactional_batch(producer_id: int, epoch: int, sequence: int,
                        values: list[str]) -> bytes:
    now = int(time.time() * 1000)
    header = BatchHeader(attributes=TRANSACTIONAL_BIT, last_offset_delta=len(values) - 1,
                         base_timestamp=now, max_timestamp=now, producer_id=producer_id,
                         producer_epoch=epoch, base_sequence=sequence)
    return encode_batch(header, [Record(i, 0, None, v.encode()) for i, v in enumerate(values)])


class Producer:
    """A transactions v2 producer: one producer id and epoch, a sequence per partition."""

    def __init__(self, cluster: Cluster, transactional_id: str, topic: str) -> None:
        self.cluster, self.transactional_id, self.topic = cluster, transactional_id, topic
        self.coordinator = cluster.coordinator(transactional_id, COORDINATOR_TRANSACTION)
        self.leaders = cluster.leaders(topic)
        response = retried(lambda: self.coordinator.request(InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(seconds=60)))),
            lambda r: r.error_code)
        assert response.error_code == ErrorCode.none
        self.producer_id, self.epoch = int(response.producer_id), int(response.producer_epoch)
        self.sequences = dict.fromkeys(self.leaders, 0)

    def produce(self, partition: int, values: list[str], *, version: int = 12,
                epoch: int | None = None) -> ErrorCode:
        """One transactional batch to ``partition`` (retried while retriable); its error."""
        epoch = self.epoch if epoch is None else epoch
        module = produce_v12 if version == 12 else produce_v11
        records = transactional_batch(self.producer_id, epoch, self.sequences[partition],
                                      values)
        request = module.ProduceRequest(
            transactional_id=self.transactional_id, acks=i16(-1),
            timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
            topic_data=(module.TopicProduceData(name=self.topic, partition_data=(
                module.PartitionProduceData(index=i32(partition), records=records),)),))
        response = retried(lambda: self.leaders[partition].request(request),
                           lambda r: r.responses[0].partition_responses[0].error_code)
        error = response.responses[0].partition_responses[0].error_code
        if error == ErrorCode.none:
            self.sequences[partition] += len(values)
        return error

    def commit_offsets(self, group: str, offsets: dict[int, int]) -> ErrorCode:
        """TxnOffsetCommit v5 to the group's coordinator (no AddOffsetsToTxn first)."""
        coordinator = self.cluster.coordinator(group, COORDINATOR_GROUP)
        response = retried(lambda: coordinator.request(TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group,
            producer_id=i64(self.producer_id), producer_epoch=i16(self.epoch),
            topics=(TxnOffsetCommitRequestTopic(name=self.topic, partitions=tuple(
                TxnOffsetCommitRequestPartition(partition_index=i32(p),
                                                committed_offset=i64(o),
                                                committed_metadata="")
                for p, o in offsets.items())),))),
            lambda r: r.topics[0].partitions[0].error_code)
        errors = {p.error_code for t in response.topics for p in t.partitions}
        assert len(errors) == 1, response
        return errors.pop()

    def end(self, commit: bool, *, epoch: int | None = None) -> tuple[ErrorCode, int, int]:
        """EndTxn v5: (error, producer id, epoch) answered; the producer continues with them."""
        response = retried(lambda: self.coordinator.request(EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=i64(self.producer_id),
            producer_epoch=i16(self.epoch if epoch is None else epoch), committed=commit)),
            lambda r: r.error_code)
        answer = (response.error_code, int(response.producer_id), int(response.producer_epoch))
        if response.error_code == ErrorCode.none:
            self.producer_id, self.epoch = answer[1], answer[2]
            # A new epoch starts its sequences at 0.
            self.sequences = dict.fromkeys(self.leaders, 0)
            self.await_markers()
        return answer

    def await_markers(self) -> None:
        """Until the ended transaction is complete (its markers written): a partition leader
        lets a batch of the bumped epoch join a transaction still open there."""
        deadline = time.monotonic() + RETRY_FOR_S
        while time.monotonic() < deadline:
            [state] = self.coordinator.request(DescribeTransactionsRequest(
                transactional_ids=(self.transactional_id,))).transaction_states
            if state.transaction_state in ("CompleteCommit", "CompleteAbort"):
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.transactional_id}: markers not written in time")


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                   timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def fetch_offsets(cluster: Cluster, group: str, topic: str) -> dict[int, tuple[int, int]]:
    """OffsetFetch v7 with require_stable: (offset, error) of each partition."""
    response = cluster.coordinator(group, COORDINATOR_GROUP).request(OffsetFetchRequest(
        group_id=group, require_stable=True, topics=(OffsetFetchRequestTopic(
            name=topic, partition_indexes=tuple(i32(p) for p in range(PARTITIONS))),)))
    assert response.error_code == ErrorCode.none
    return {p.partition_index: (int(p.committed_offset), p.error_code)
            for t in response.topics for p in t.partitions}


def test_api_versions_finalizes_transaction_version_2(cluster):
    client = Cluster(cluster.bootstrap)
    try:
        response = client.bootstrap.request(ApiVersionsRequest(
            client_software_name="tv2-test", client_software_version="1.0"))
        assert {f.name: (f.min_version_level, f.max_version_level)
                for f in response.finalized_features} == {"transaction.version": (2, 2)}
        assert response.finalized_features_epoch >= 0
        produce = next(a for a in response.api_keys if a.api_key == 0)
        assert (produce.min_version, produce.max_version) == (3, 12)
    finally:
        client.close()


def test_implicit_partitions_epoch_bump_and_read_committed(cluster):
    topic = f"tv2-{uuid.uuid4().hex[:8]}"
    group = f"tv2-group-{topic}"
    create_topic(cluster.bootstrap, topic, PARTITIONS)
    client = Cluster(cluster.bootstrap)
    try:
        producer = Producer(client, f"tv2-{topic}", topic)
        first_epoch = producer.epoch
        # A transaction begun by its first batch: two partitions, no AddPartitionsToTxn.
        assert producer.produce(0, ["c0", "c1"]) == ErrorCode.none
        assert producer.produce(1, ["c2"]) == ErrorCode.none
        # Offsets in it, no AddOffsetsToTxn: pending until it commits.
        assert producer.commit_offsets(group, {0: 7, 1: 3}) == ErrorCode.none
        unstable = ErrorCode.unstable_offset_commit
        assert fetch_offsets(client, group, topic) == {
            0: (-1, unstable), 1: (-1, unstable), 2: (-1, ErrorCode.none)}
        error, producer_id, epoch = producer.end(commit=True)
        assert (error, producer_id, epoch) == (ErrorCode.none, producer.producer_id,
                                               first_epoch + 1)
        # A retried EndTxn (the epoch before the bump) gets the same answer.
        assert producer.end(commit=True, epoch=first_epoch) == (
            ErrorCode.none, producer_id, first_epoch + 1)

        # The next transaction at the bumped epoch, aborted.
        assert producer.produce(0, ["a0"]) == ErrorCode.none
        assert producer.produce(2, ["a1"]) == ErrorCode.none
        assert producer.commit_offsets(group, {0: 100}) == ErrorCode.none
        assert producer.end(commit=False) == (ErrorCode.none, producer_id, first_epoch + 2)

        # And one more, committed: partition 0 again, after its abort marker.
        assert producer.produce(0, ["c3"]) == ErrorCode.none
        assert producer.produce(2, ["c4"]) == ErrorCode.none
        assert producer.end(commit=True) == (ErrorCode.none, producer_id, first_epoch + 3)

        assert read_all(cluster.bootstrap, topic, "read_committed") == {
            0: ["c0", "c1", "c3"], 1: ["c2"], 2: ["c4"]}
        assert read_all(cluster.bootstrap, topic, "read_uncommitted") == {
            0: ["c0", "c1", "a0", "c3"], 1: ["c2"], 2: ["a1", "c4"]}
        # The first transaction's offsets count; the aborted one's do not.
        assert committed_offsets(cluster.bootstrap, group, topic) == {0: 7, 1: 3}

        # An epoch older than the last bump is fenced everywhere (the one just before it
        # is an EndTxn retry, answered as above).
        stale = first_epoch + 1
        assert producer.produce(1, ["zombie"], epoch=stale) == ErrorCode.invalid_producer_epoch
        assert producer.end(commit=True, epoch=stale)[0] == ErrorCode.producer_fenced
        producer.epoch = stale
        assert producer.commit_offsets(group, {2: 1}) == ErrorCode.invalid_producer_epoch
        assert read_all(cluster.bootstrap, topic, "read_uncommitted")[1] == ["c2"]
    finally:
        client.close()


def test_v11_produce_still_needs_the_partition_added(cluster):
    """Before v12 a batch that would begin a transaction is only verified: the partition
    must have been added (TRANSACTION_ABORTABLE from v11)."""
    topic = f"tv2-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.bootstrap, topic, PARTITIONS)
    client = Cluster(cluster.bootstrap)
    try:
        producer = Producer(client, f"tv1-{topic}", topic)
        assert producer.produce(0, ["x"], version=11) == ErrorCode.transaction_abortable
        assert read_all(cluster.bootstrap, topic, "read_uncommitted") == {0: [], 1: [], 2: []}
    finally:
        client.close()
