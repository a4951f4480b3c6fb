"""Every gRPC port of a real cluster answers grpcurl: list, describe and a JSON call."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")

SERVICES = {
    "frontend": None,
    "handler-0": "kbroker.handler.v1.KafkaHandler",
    "handler-1": "kbroker.handler.v1.KafkaHandler",
    "log-0": "kbroker.log.v1.LogService",
    "purgatory": "kbroker.purgatory.v1.Purgatory",
    "replicator": "kbroker.replicator.v1.Replicator",
}


def grpcurl(*args: str) -> str:
    done = subprocess.run([GRPCURL, "-plaintext", *args], capture_output=True, text=True,
                          timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_list_describe_and_call(cluster, name):
    address = cluster.services[name].grpc_address
    listed = set(grpcurl(address, "list").split())
    expected = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                "kbroker.metrics.v1.Metrics"}
    if SERVICES[name]:
        expected.add(SERVICES[name])
        assert "rpc " in grpcurl(address, "describe", SERVICES[name])
    assert expected <= listed
    health = json.loads(grpcurl("-d", '{"service": ""}', address, "grpc.health.v1.Health/Check"))
    assert health == {"status": "SERVING"}
    snapshot = json.loads(grpcurl("-d", '{"prefixes": ["kbroker_grpc_server"]}', address,
                                  "kbroker.metrics.v1.Metrics/Snapshot"))
    assert snapshot["families"]


def test_handler_answers_json_kafka_requests(cluster, topic_name):
    address = cluster.services["handler-0"].grpc_address
    created = json.loads(grpcurl(
        "-d", json.dumps({"topics": [{"name": topic_name, "num_partitions": 2,
                                      "replication_factor": 1}], "timeout_ms": 10000}),
        address, "kbroker.handler.v1.KafkaHandler/CreateTopics"))
    (topic,) = created["topics"]
    assert topic["name"] == topic_name and topic.get("errorCode", 0) == 0
    metadata = json.loads(grpcurl(
        "-d", json.dumps({"topics": [{"name": topic_name}], "allow_auto_topic_creation": False}),
        address, "kbroker.handler.v1.KafkaHandler/Metadata"))
    (described,) = metadata["topics"]
    assert len(described["partitions"]) == 2
