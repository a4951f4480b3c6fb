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


def test_metrics_snapshots_are_readable_through_grpcurl(cluster):
    """Filtered by name and without empty series a snapshot is a screenful; -emit-defaults
    shows the zeros that matter (a gauge at 0), which grpcurl's JSON otherwise omits."""
    frontend = cluster.services["frontend"].grpc_address
    prefixes = ["kbroker_frontend_request_"]
    everything = grpcurl("-emit-defaults", "-d", json.dumps({"prefixes": prefixes}),
                         frontend, "kbroker.metrics.v1.Metrics/Snapshot")
    lean = grpcurl("-emit-defaults", "-d", json.dumps(
        {"prefixes": prefixes, "drop_empty": True}),
        frontend, "kbroker.metrics.v1.Metrics/Snapshot")
    # How much drop_empty leaves out depends on how many APIs the cluster served before (the
    # session's cluster serves every test): at least two thirds of the request histograms'
    # lines, whatever came before.
    assert len(lean.splitlines()) * 3 < len(everything.splitlines())
    families = json.loads(lean)["families"]
    assert {f["name"] for f in families} <= {
        "kbroker_frontend_request_total_seconds", "kbroker_frontend_request_phase_seconds",
        "kbroker_frontend_request_bytes"}
    # Every histogram series left observed something.
    for family in families:
        for sample in family["samples"]:
            if sample["name"].endswith("_count"):
                assert sample["value"] > 0

    replicator = cluster.services["replicator"].grpc_address
    request = json.dumps({"names": ["kbroker_replicator_offline_partitions"]})
    (offline,) = json.loads(grpcurl("-emit-defaults", "-d", request, replicator,
                                    "kbroker.metrics.v1.Metrics/Snapshot"))["families"]
    assert offline["samples"] == [{"name": "kbroker_replicator_offline_partitions",
                                   "labels": {}, "value": 0}]
    (bare,) = json.loads(grpcurl("-d", request, replicator,
                                 "kbroker.metrics.v1.Metrics/Snapshot"))["families"]
    assert "value" not in bare["samples"][0]


@pytest.mark.parametrize("name", ["frontend", "handler-1", "log-2", "purgatory", "replicator"])
def test_every_service_names_itself_kind_and_ordinal(cluster, name):
    snapshot = json.loads(grpcurl("-d", '{"names": ["none"]}', cluster.services[name].grpc_address,
                                  "kbroker.metrics.v1.Metrics/Snapshot"))
    kind = name.split("-")[0]
    assert snapshot["service"] == kind
    assert snapshot["instance"] == (name if "-" in name else f"{name}-0")
