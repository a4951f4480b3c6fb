"""aiokafka against a real local cluster: every codec, keys, headers, timestamps."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from .records import COMPRESSION_CODECS, Message, assert_same, make_messages

PARTITIONS = 3


async def roundtrip(bootstrap: str, topic: str, codec: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    sent = make_messages(codec, 200, PARTITIONS)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                compression_type=None if codec == "none" else codec)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=m.value, key=m.key, partition=m.partition,
                                       headers=list(m.headers), timestamp_ms=m.timestamp_ms)
                   for m in sent]
        await asyncio.wait_for(asyncio.gather(*futures), 30)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=200)
    await consumer.start()
    got: list[Message] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(got) < len(sent) and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for tp, records in batches.items():
                got.extend(Message(tp.partition, r.key, r.value, tuple(r.headers), r.timestamp)
                           for r in records)
    finally:
        await consumer.stop()
    assert_same(sent, got)


@pytest.mark.parametrize("codec", COMPRESSION_CODECS)
def test_roundtrip_every_codec(cluster, topic_name, codec):
    asyncio.run(roundtrip(cluster.bootstrap, topic_name, codec))
