"""Request metrics after real traffic against a real cluster, read from the services'
Prometheus endpoints over HTTP: an idle long-poll fetch is remote time (parked in the
purgatory) of about its max wait; a pipelined burst waits in the request queue; bytes in and
out per topic equal the record batches produced and fetched (a large one produced left in the
frontend's spool for the leader to read, those fetched sent by the frontend from the leader's
segment file with sendfile, all services being on one host); error responses are counted per
code; and an acks=all Produce's remote time is its wait for replication (at its leader, then
parked in the purgatory)."""

from __future__ import annotations

import datetime
import socket
import time
import urllib.request
from collections.abc import Iterable

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.fetch.v12.request import FetchRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
from kio.static.primitive import i16, i32, i32Timedelta
from prometheus_client.parser import text_string_to_metric_families

from services.local_cluster import LocalCluster
from tests.handler.batches import record_batch

from .test_confluent_kafka import create_topic
from .test_long_poll import connect, fetch_request
from .wire import encode_request, read_response

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(cluster: LocalCluster, service: str) -> Samples:
    port = cluster.services[service].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def summed(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def phase(samples: Samples, api: str, name: str) -> tuple[float, float]:
    """(count, sum) of a request phase."""
    labels = {"api": api, "phase": name}
    return (value(samples, "kbroker_frontend_request_phase_seconds_count", **labels),
            value(samples, "kbroker_frontend_request_phase_seconds_sum", **labels))


def moved(after: tuple[float, float], before: tuple[float, float]) -> tuple[float, float]:
    return after[0] - before[0], after[1] - before[1]


def settled(cluster: LocalCluster, apis: Iterable[str], timeout: float = 15.0) -> Samples:
    """The frontend's samples once its request counters of ``apis`` stop moving (a consumer
    closed by an earlier test may leave a long-poll fetch that answers later)."""
    deadline = time.monotonic() + timeout
    last = scrape(cluster, "frontend")

    def counts(samples: Samples) -> list[float]:
        return [value(samples, "kbroker_frontend_requests_total", api=a) for a in apis]

    while True:
        time.sleep(0.7)
        now = scrape(cluster, "frontend")
        if counts(now) == counts(last):
            return now
        assert time.monotonic() < deadline, "frontend request counters keep moving"
        last = now


def test_an_idle_long_poll_fetch_is_remote_time(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    with connect(cluster) as sock:
        before = settled(cluster, ["Fetch"])
        started = time.monotonic()
        sock.sendall(encode_request(fetch_request(topic_name, 0, 500), 1))
        _, response = read_response(sock, FetchRequest)
        elapsed = time.monotonic() - started
    assert response.responses[0].partitions[0].records in (None, b"")
    after = scrape(cluster, "frontend")
    remote = moved(phase(after, "Fetch", "remote"), phase(before, "Fetch", "remote"))
    local = moved(phase(after, "Fetch", "local"), phase(before, "Fetch", "local"))
    assert remote[0] == 1 and local[0] == 1
    # Parked for the max wait (the purgatory's timer fires on time, give or take a tick).
    assert 0.45 <= remote[1] <= min(elapsed, 0.9), (remote, elapsed)
    # The rest is work: reading the empty partition twice, conversions, the hops.
    assert local[1] < 0.2, local


def test_a_pipelined_burst_waits_in_the_request_queue(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    burst = 20
    request = MetadataRequest(
        topics=(MetadataRequestTopic(topic_id=None, name=topic_name),),
        allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    with connect(cluster) as sock:
        before = settled(cluster, ["Metadata"])
        # One write: every request is in the frontend's buffer while the first is served.
        sock.sendall(b"".join(encode_request(request, i) for i in range(burst)))
        for i in range(burst):
            correlation_id, _ = read_response(sock, MetadataRequest)
            assert correlation_id == i
    after = scrape(cluster, "frontend")
    queue = moved(phase(after, "Metadata", "request_queue"),
                  phase(before, "Metadata", "request_queue"))
    local = moved(phase(after, "Metadata", "local"), phase(before, "Metadata", "local"))
    assert queue[0] == burst
    # Request i waits for the i before it: about burst * (burst - 1) / 2 service times in all,
    # against burst service times of local work.
    assert queue[1] > 2 * local[1] > 0, (queue, local)


def raw_produce(sock: socket.socket, topic: str, partition: int, records: bytes,
                correlation_id: int) -> int:
    request = ProduceRequest(
        transactional_id=None, acks=i16(1),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=10)),
        topic_data=(TopicProduceData(name=topic, partition_data=(
            PartitionProduceData(index=i32(partition), records=records),)),))
    sock.sendall(encode_request(request, correlation_id))
    got, response = read_response(sock, ProduceRequest)
    assert got == correlation_id
    return int(response.responses[0].partition_responses[0].error_code)


def test_bytes_in_and_out_per_topic_are_the_record_batches(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    # The last one large enough for the frontend to leave it in its spool for the leader.
    batches = [*(record_batch([b"value-%d" % i] * (i + 1)) for i in range(2)),
               record_batch([b"v" * 1000] * 70)]
    spooled = value(scrape(cluster, "frontend"), "kbroker_frontend_records_spool_bytes_total")
    with connect(cluster, topic_name) as sock:
        for i, batch in enumerate(batches):
            assert raw_produce(sock, topic_name, 0, batch, i) == 0
        before = scrape(cluster, "frontend")
        assert value(before, "kbroker_frontend_records_spool_bytes_total") - spooled == len(
            batches[-1])
        from_files = value(before, "kbroker_frontend_file_records_bytes_total")
        sent = value(before, "kbroker_frontend_sendfile_bytes_total")
        sock.sendall(encode_request(fetch_request(topic_name, 0, 0), 10))
        _, response = read_response(sock, FetchRequest)
    fetched = response.responses[0].partitions[0].records
    assert len(fetched) == sum(map(len, batches))  # offsets patched in place: same sizes
    at = 0
    for batch in batches:  # from the magic byte on (the leader sets offsets and its epoch)
        assert fetched[at + 16:at + len(batch)] == batch[16:]
        at += len(batch)
    samples = scrape(cluster, "frontend")
    # On one host the frontend took them from the leader's segment file itself, and handed
    # them (over 32 KiB together) to the socket with sendfile.
    assert value(samples, "kbroker_frontend_file_records_bytes_total") - from_files == len(
        fetched)
    assert value(samples, "kbroker_frontend_sendfile_bytes_total") - sent == len(fetched)
    # A fresh topic: these counters started with this test.
    assert value(samples, "kbroker_frontend_topic_produced_bytes_total",
                 topic=topic_name) == sum(map(len, batches))
    assert value(samples, "kbroker_frontend_topic_fetched_bytes_total",
                 topic=topic_name) == len(fetched)


def test_error_responses_are_counted_per_code(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name, partitions=1)
    unknown = "3"  # UNKNOWN_TOPIC_OR_PARTITION
    before = scrape(cluster, "frontend")
    with connect(cluster, topic_name) as sock:
        for i in range(2):
            assert raw_produce(sock, topic_name, 7, record_batch([b"nowhere"]), i) == 3
        assert raw_produce(sock, topic_name, 0, record_batch([b"fine"]), 9) == 0
    after = scrape(cluster, "frontend")
    name = "kbroker_frontend_error_responses_total"
    assert value(after, name, api="Produce", error_code=unknown) \
        - value(before, name, api="Produce", error_code=unknown) == 2
    # Nothing of the failed produces was appended: only the good batch counts as bytes in.
    assert value(after, "kbroker_frontend_topic_produced_bytes_total", topic=topic_name) \
        == len(record_batch([b"fine"]))


def test_acks_all_produce_remote_time_is_its_wait_for_replication(cluster, topic_name):
    """acks=all on a topic replicated 3 ways: each produce waits until the followers have the
    records (the high watermark passes them), at the leader, which holds its answer for that
    (up to the handlers' acks_all_leader_wait_ms), or past that parked in the purgatory; the
    frontend's Produce remote time is those waits, as the log nodes and handlers report them."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=3)],
                                  request_timeout=15)
    futures[topic_name].result(timeout=20)
    handlers = [name for name in cluster.services if name.startswith("handler-")]
    log_nodes = [name for name in cluster.services if name.startswith("log-")]

    def waits(samples: list[Samples]) -> dict[str, tuple[float, float]]:
        """(count, seconds) of the leaders' commit waits by outcome, and of produce parks."""
        def of(name: str, **labels: str) -> tuple[float, float]:
            return (sum(summed(s, name + "_count", **labels) for s in samples),
                    sum(summed(s, name + "_sum", **labels) for s in samples))
        return {"committed": of("kbroker_log_commit_wait_seconds", outcome="committed"),
                "handed_on": of("kbroker_log_commit_wait_seconds", outcome="handed_on"),
                "parked": of("kbroker_handler_purgatory_wait_seconds", kind="produce")}

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 0, "max.in.flight": 1})
    failures: list[str] = []

    def produce(count: int) -> None:
        for i in range(count):
            producer.produce(topic_name, b"v%d" % i,
                             on_delivery=lambda err, _m: err and failures.append(str(err)))
            producer.flush(15)  # one request per message: many remote observations
        assert producer.flush(15) == 0 and failures == []

    produce(1)  # metadata and connections first
    frontend_before = settled(cluster, ["Produce"])
    before = waits([scrape(cluster, name) for name in handlers + log_nodes])
    produce(20)
    frontend_after = scrape(cluster, "frontend")
    after = waits([scrape(cluster, name) for name in handlers + log_nodes])

    requests = value(frontend_after, "kbroker_frontend_requests_total", api="Produce") \
        - value(frontend_before, "kbroker_frontend_requests_total", api="Produce")
    remote = moved(phase(frontend_after, "Produce", "remote"),
                   phase(frontend_before, "Produce", "remote"))
    waited = {kind: moved(after[kind], before[kind]) for kind in after}
    assert requests >= 20 and remote[0] == requests
    # Replication is asynchronous (the high watermark trails the append): every produce
    # waited, and on a healthy cluster its leader answered it committed, no purgatory needed.
    assert waited["committed"][0] >= 1 and remote[1] > 0, (remote, waited)
    assert waited["committed"][0] + waited["handed_on"][0] == requests, waited
    # Every second waited at a leader or parked in a handler is a second of the frontend's
    # remote phase (a handler's parked time also spans its gRPC call to the purgatory).
    total = sum(seconds for _, seconds in waited.values())
    assert abs(remote[1] - total) <= 0.005 * waited["parked"][0] + 0.05 * total, (
        remote, waited)
