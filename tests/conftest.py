"""Shared fixtures: one real local cluster (every service as its own process, free loopback
ports, data in a temporary folder), started on first use and shared by every test of the
session that asks for it (end-to-end, deployment and Spark tests).

Tests that start processes (the local cluster, a service as a process, helm, kubectl,
grpcurl, node, kcat, Spark) carry the ``processes`` marker: every test under ``tests/e2e``,
``tests/deploy`` and ``tests/spark``, every test using the ``cluster`` fixture, and the others
marked by hand. ``make test-unit`` runs the rest (``-m "not processes"``)."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.local_cluster import ClusterSpec, LocalCluster


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("cluster")
    spec = ClusterSpec(
        data_dir=data,
        kafka_port=0,
        base_port=0,
        handlers=2,
        log_nodes=3,
        num_partitions=3,
        # Consumer groups settle in a second instead of Kafka's 3 s initial delay.
        group_initial_rebalance_delay_ms=1000,
        log_level=os.environ.get("KBROKER_TEST_LOG_LEVEL", "INFO"),
        # Retention and compaction tests wait for these rounds.
        retention_check_interval_ms=500,
        cleaner_backoff_ms=300,
        # Consumer groups of the KIP-848 protocol: sessions and heartbeats as short as the
        # classic groups' tests use (Kafka's defaults: 45 s and 5 s).
        service_flags={"handler": {
            "group_consumer_session_timeout_ms": 6000,
            "group_consumer_min_session_timeout_ms": 6000,
            "group_consumer_heartbeat_interval_ms": 500,
            "group_consumer_min_heartbeat_interval_ms": 500}},
    )
    local = LocalCluster(spec)
    local.start()
    try:
        yield local
    finally:
        local.stop()
        for name in local.services:
            # Leave the service logs beside the data for a failing run.
            Path(data / "logs" / f"{name}.log").touch()


PROCESS_DIRS = ("e2e", "deploy", "spark")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(Path(__file__).parent).parts
        if parts[0] in PROCESS_DIRS or "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.processes)


_counter = itertools.count()


@pytest.fixture()
def topic_name(request: pytest.FixtureRequest) -> str:
    """A fresh topic name per test (names stay valid Kafka topic names)."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:60]
    return f"{base}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
