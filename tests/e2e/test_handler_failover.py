"""Handlers are stateless: with one of the two killed (SIGKILL), clients keep producing and
consuming through the frontend, and the restarted handler serves again. An idempotent
producer's requests caught in the killed handler are finished on the other one: its
connections stay open and every record is stored once."""

from __future__ import annotations

import signal
import time

from confluent_kafka import Producer

from .records import assert_same, make_messages
from .test_confluent_kafka import consume_all, create_topic, produce
from .test_request_metrics import scrape

RESENT = ("kbroker_frontend_produce_resends_total", frozenset({("outcome", "answered")}))
CLOSED_UNKNOWN = ("kbroker_frontend_connections_closed_total",
                  frozenset({("reason", "produce_outcome_unknown")}))


def test_clients_carry_on_when_a_handler_is_killed(cluster, topic_name):
    create_topic(cluster.bootstrap, topic_name)
    first = make_messages("before", 60, 3)
    produce(cluster.bootstrap, topic_name, first, "none")
    cluster.kill("handler-0")
    try:
        second = make_messages("during", 60, 3)
        produce(cluster.bootstrap, topic_name, second, "lz4")
        assert_same(first + second, consume_all(cluster.bootstrap, topic_name, 120))
    finally:
        cluster.start_service("handler-0")
    third = make_messages("after", 60, 3)
    produce(cluster.bootstrap, topic_name, third, "gzip")
    assert_same(first + second + third, consume_all(cluster.bootstrap, topic_name, 180))


def test_an_idempotent_producers_requests_on_a_killed_handler_are_resent_not_cut_off(
        cluster, topic_name):
    """The handler is paused (SIGSTOP), so requests the frontend gives it wait there, then
    killed: the frontend sends those requests again to the other handler (every batch has a
    producer id, so the leaders would recognise a copy already stored) and answers them,
    rather than close the client's connection over an unknown outcome."""
    create_topic(cluster.bootstrap, topic_name)
    before = scrape(cluster, "frontend")
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000})
    failures: list[str] = []

    def on_delivery(err, _msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            failures.append(str(err))

    messages = make_messages("resent", 240, 3)
    for m in messages[:30]:  # the producer id first: InitProducerId is resent in any case
        producer.produce(topic_name, value=m.value, key=m.key, partition=m.partition,
                         headers=list(m.headers), timestamp=m.timestamp_ms,
                         on_delivery=on_delivery)
    assert producer.flush(30) == 0
    process = cluster.services["handler-0"].proc
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        # A few requests per connection (the frontend takes turns between the handlers),
        # until each waits on the paused handler.
        for start in (30, 60, 90):
            for m in messages[start:start + 30]:
                producer.produce(topic_name, value=m.value, key=m.key, partition=m.partition,
                                 headers=list(m.headers), timestamp=m.timestamp_ms,
                                 on_delivery=on_delivery)
            producer.poll(0.4)
        time.sleep(0.5)
    finally:
        cluster.kill("handler-0")
    try:
        for m in messages[120:]:
            producer.produce(topic_name, value=m.value, key=m.key, partition=m.partition,
                             headers=list(m.headers), timestamp=m.timestamp_ms,
                             on_delivery=on_delivery)
        assert producer.flush(30) == 0
        assert failures == []
        after = scrape(cluster, "frontend")
        assert after.get(RESENT, 0) > before.get(RESENT, 0), "no request was resent"
        assert after.get(CLOSED_UNKNOWN, 0) == before.get(CLOSED_UNKNOWN, 0)
        assert_same(messages, consume_all(cluster.bootstrap, topic_name, len(messages)))
    finally:
        cluster.start_service("handler-0")
