"""Listener lists in Kafka's form, and what the frontend makes of its settings."""

from __future__ import annotations

import pytest

from services.frontend.listeners import (
    EndPoint,
    SecurityProtocol,
    listener_specs,
    parse_listeners,
)


def test_parse_kafka_listener_lists() -> None:
    assert parse_listeners("SASL_SSL://0.0.0.0:9093, PLAINTEXT://127.0.0.1:9092,"
                           "SSL://[::1]:9094,SASL_PLAINTEXT://:9095") == [
        EndPoint(SecurityProtocol.SASL_SSL, "0.0.0.0", 9093),
        EndPoint(SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092),
        EndPoint(SecurityProtocol.SSL, "::1", 9094),
        EndPoint(SecurityProtocol.SASL_PLAINTEXT, "", 9095)]
    assert parse_listeners("") == []


@pytest.mark.parametrize("text", ["PLAINTEXT://host", "FOO://h:1", "PLAINTEXT://h:70000",
                                  "PLAINTEXT://a:1,PLAINTEXT://b:2", "h:9092"])
def test_bad_listener_lists_are_refused(text) -> None:
    with pytest.raises(ValueError):
        parse_listeners(text)


def test_the_legacy_fields_make_one_plaintext_listener() -> None:
    (spec,) = listener_specs("", "", "127.0.0.1", 9092, "kafka.example", 19092)
    assert spec.protocol is SecurityProtocol.PLAINTEXT
    assert spec.advertised(9092) == "kafka.example:19092"
    (spec,) = listener_specs("", "", "127.0.0.1", 0, "", 0)
    assert spec.advertised(40000) == "127.0.0.1:40000"


def test_advertised_listeners_by_name() -> None:
    specs = listener_specs("SASL_SSL://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092",
                           "SASL_SSL://kafka.example:443", "", 0, "", 0)
    assert [s.name for s in specs] == ["SASL_SSL", "PLAINTEXT"]
    assert specs[0].advertised(9093) == "kafka.example:443"
    assert specs[1].advertised(9092) == "127.0.0.1:9092"
    with pytest.raises(ValueError, match="not configured"):
        listener_specs("PLAINTEXT://:9092", "SSL://h:1", "", 0, "", 0)
    with pytest.raises(ValueError, match="reach"):
        listener_specs("PLAINTEXT://:9092", "PLAINTEXT://0.0.0.0:1", "", 0, "", 0)
