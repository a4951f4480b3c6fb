"""A rolling restart of every log node under load, as an operator (or Kubernetes, rolling the
log StatefulSet) does it: each node in turn is stopped with SIGTERM and started again, and the
next one only once the cluster is fully in sync and every partition acknowledges again.

Under idempotent acks=all production (2 producers, 6 partitions, RF=3, min.insync.replicas=2)
and a consumer group, each stopping node hands its leaderships over to in-sync followers before
it stops (a controlled shutdown), so: no acknowledged record is lost or stored twice, no
delivery report fails, and no leader is elected by fencing (every election is a controlled
one). The ack pause of each restart is printed (``bench/replication.py`` measures it beside a
kill -9). The auto leader rebalance keeps its default interval (5 minutes), so it gives the
restarted nodes their preferred leaderships back after the test
(tests/replicator/replication/test_controlled_shutdown.py sees it do so).
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import pytest

from services.local_cluster import LocalCluster
from tests.chaos.checker import findings_by_fault
from tests.chaos.faults import FaultSettings
from tests.chaos.harness import ChaosRun, ChaosSettings

pytestmark = pytest.mark.processes

STUCK_AFTER = 12.0
LOG_NODES = ("log-0", "log-1", "log-2")


def replicator_counts(cluster: LocalCluster, name: str) -> dict[str, float]:
    """The replicator's counter ``name`` by its label values (one entry "" without labels)."""
    port = cluster.services["replicator"].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {labels: float(value) for labels, value in re.findall(
        rf'^{name}(?:{{[a-z]+="([^"]*)"}})? (\S+)$', text, re.MULTILINE)}


def test_a_rolling_restart_of_every_log_node_loses_nothing_and_fails_no_produce(
        tmp_path: Path) -> None:
    settings = ChaosSettings(
        stuck_after=STUCK_AFTER, settle_timeout=45.0, rate=60.0, links=(),
        faults=FaultSettings(heal_timeout=45.0))
    started = time.monotonic()
    with ChaosRun(tmp_path, settings) as run:
        assert run.injector is not None and run.workload is not None
        for name in LOG_NODES:
            run.inject("restart", name)
        elections = replicator_counts(run.cluster, "kbroker_replicator_leader_elections_total")
        shutdowns = replicator_counts(run.cluster, "kbroker_replicator_controlled_shutdowns_total")
        report = run.finish()
        print(f"\n{report.describe()}\nelections {elections} controlled shutdowns {shutdowns}"
              f" in {time.monotonic() - started:.1f}s")
        for pause in report.pauses:
            print(f"ack pause {pause.fault.label}: {pause.seconds:.3f}s")
        workload = run.workload
        assert report.ok, (f"{report.describe()}\nby fault: "
                           f"{findings_by_fault(report, workload.history)}\n{run.logs()}")
        assert report.lost == [] and report.duplicates == []
        assert report.failed_deliveries == 0, workload.history.failed[:5]
        assert [e for e in workload.errors if " produce: " in e] == []
        assert run.injector.unexpected_restarts() == {}, run.logs()
        # Every leadership moved in a controlled shutdown, none by fencing a stopped node.
        assert shutdowns.get("") == len(LOG_NODES), shutdowns
        assert elections.get("controlled", 0) >= len(LOG_NODES), elections
        assert elections.get("clean", 0) == 0 and elections.get("unclean", 0) == 0, elections
