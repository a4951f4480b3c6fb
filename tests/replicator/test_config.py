"""Replicator configuration and the log node list."""

from __future__ import annotations

import pytest

from services.common.config import load
from services.replicator.config import ReplicatorConfig
from services.replicator.log_nodes import parse_log_nodes


def test_defaults():
    config = load(ReplicatorConfig, [], env={})
    assert config.grpc_address == "127.0.0.1:19400"
    assert config.metrics_port == 0
    assert config.data_dir == "data/replicator"
    assert config.log_nodes == ("0=127.0.0.1:19200",)
    assert (config.num_partitions, config.default_replication_factor) == (1, 1)
    assert config.cluster_id == "" and config.node_check_interval_ms == 1000


def test_flags_and_environment():
    config = load(ReplicatorConfig, ["--log-nodes", "0=127.0.0.1:1, 2=host:2"],
                  env={"KBROKER_NUM_PARTITIONS": "3", "KBROKER_LOG_NODES": "9=x:9"})
    assert config.log_nodes == ("0=127.0.0.1:1", "2=host:2")
    assert config.num_partitions == 3
    nodes = parse_log_nodes(config.log_nodes)
    assert [(n.node_id, n.address, n.alive) for n in nodes] == [
        (0, "127.0.0.1:1", False), (2, "host:2", False)]


def test_log_nodes_are_sorted_by_id():
    assert [n.node_id for n in parse_log_nodes(["2=a:1", "0=b:1", "1=c:1"])] == [0, 1, 2]


def test_log_nodes_may_name_their_rack():
    nodes = parse_log_nodes(["0=a:1@rack-a", "1=b:1"])
    assert [(n.address, n.rack) for n in nodes] == [("a:1", "rack-a"), ("b:1", "")]


@pytest.mark.parametrize("entries", [["x=a:1"], ["0"], ["0=a"], ["0=a:b"], ["0=:1"],
                                     ["0=a:1", "0=b:2"], ["-1=a:1"]])
def test_bad_log_node_entries(entries):
    with pytest.raises(ValueError):
        parse_log_nodes(entries)
