"""Requests the frontend tests send, built as kio entities of one version each."""

from __future__ import annotations

import datetime

from kio.schema.fetch.v12 import request as fetch_v12
from kio.schema.metadata.v12.request import MetadataRequest as MetadataRequestV12
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.produce.v9 import request as produce_v9

from services.common.records.record_batch import BatchHeader, pack_batch


def metadata_v12(*topics: str) -> MetadataRequestV12:
    return MetadataRequestV12(
        topics=tuple(MetadataRequestTopic(topic_id=None, name=t) for t in topics) or None,
        allow_auto_topic_creation=True, include_topic_authorized_operations=False)


def produce_v9_request(acks: int = 1, partitions: int = 2,
                       producer_id: int | None = None) -> produce_v9.ProduceRequest:
    """A Produce to ``orders``: a few bytes per partition that the fake handler takes as
    they are, or, with a ``producer_id``, one idempotent record batch per partition."""
    return produce_v9.ProduceRequest(
        transactional_id=None, acks=acks, timeout=datetime.timedelta(milliseconds=1500),
        topic_data=(produce_v9.TopicProduceData(name="orders", partition_data=tuple(
            produce_v9.PartitionProduceData(index=i, records=b"batch-%d" % i
                                            if producer_id is None else idempotent_batch(
                                                producer_id, sequence=10 * i))
            for i in range(partitions))),))


def idempotent_batch(producer_id: int, sequence: int, records: int = 1) -> bytes:
    """A record batch with a producer id and sequence numbers (its records' bytes are not
    looked at here)."""
    return pack_batch(BatchHeader(producer_id=producer_id, producer_epoch=0,
                                  base_sequence=sequence, last_offset_delta=records - 1,
                                  record_count=records), b"\x00" * 8 * records)


def fetch_v12_request() -> fetch_v12.FetchRequest:
    return fetch_v12.FetchRequest(
        replica_id=-1, max_wait=datetime.timedelta(milliseconds=100), min_bytes=1,
        max_bytes=1 << 20, isolation_level=0, session_id=0, session_epoch=-1,
        topics=(fetch_v12.FetchTopic(topic="orders", partitions=(fetch_v12.FetchPartition(
            partition=0, current_leader_epoch=-1, fetch_offset=0, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=1 << 20),)),),
        forgotten_topics_data=(), rack_id="")
