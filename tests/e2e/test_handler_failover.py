"""Handlers are stateless: with one of the two killed (SIGKILL), clients keep producing and
consuming through the frontend, and the restarted handler serves again."""

from __future__ import annotations

from .records import assert_same, make_messages
from .test_confluent_kafka import consume_all, create_topic, produce


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
