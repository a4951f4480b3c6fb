"""The chaos suite, short version: a supervised local cluster (3 log nodes, 2 handlers) under
idempotent acks=all production (2 producers, a topic of 6 partitions, RF=3,
min.insync.replicas=2) and a consumer group of 2, while faults hit every role one after the
other; after each fault the cluster must settle (every replica back in its ISR, every
partition acknowledging again) before the next.

At the end: no acknowledged record lost, none stored twice or out of order, no divergent
read, the group read everything, no client and no partition without progress for
``STUCK_AFTER`` seconds, no record failed in the application, and no service exited beyond
the faults injected (the supervisor's restart counts). ``bench/chaos.py`` is the long version
(random faults for 30 minutes), with the ack pause per fault kind.

Log nodes are killed, paused and restarted, and one log node's disk fills (a tmpfs over its
data folder, held past ``STUCK_AFTER``: its partitions must move to in-sync followers).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.chaos.checker import findings_by_fault
from tests.chaos.faults import FaultSettings
from tests.chaos.harness import ChaosRun, ChaosSettings

pytestmark = pytest.mark.processes

# Longest time a client or a partition may go without progress; today's longest ack pause
# in these scenarios is about 5 s (a restarted frontend).
STUCK_AFTER = 12.0

PROCESS_FAULTS = [(kind, target)
                  for target in ("handler-0", "purgatory", "replicator", "frontend")
                  for kind in ("kill", "pause", "restart")]
LOG_NODE_FAULTS = [(kind, "log-0") for kind in ("kill", "pause", "restart")]
NETWORK_FAULTS = [("partition", "log-1"), ("partition", "handler-1"),
                  ("partition", "purgatory"), ("partition", "replicator"),
                  ("disconnect", "log-2"), ("disconnect", "handler-0")]


def settings(**overrides: object) -> ChaosSettings:
    # 60 records/s per producer: the pace a shared 2-core machine follows without produce
    # requests outliving the client's request timeout (see the duplicates above).
    base = ChaosSettings(stuck_after=STUCK_AFTER, settle_timeout=45.0, rate=60.0,
                         faults=FaultSettings(pause_seconds=1.5, partition_seconds=2.0,
                                              # held past STUCK_AFTER: leadership must move
                                              full_disk_seconds=STUCK_AFTER + 3,
                                              heal_timeout=45.0))
    return dataclasses.replace(base, **overrides)


def run_faults(data_dir: Path, faults: list[tuple[str, str]], **overrides: object) -> None:
    with ChaosRun(data_dir, settings(**overrides)) as run:
        for kind, target in faults:
            run.inject(kind, target)
        report = run.finish()
        print(report.describe())
        assert run.injector is not None
        assert run.workload is not None
        by_fault = findings_by_fault(report, run.workload.history)
        stuck_logs = "\n".join(f"--- client {name} ---\n{run.workload.client_log(name)}"
                               for name in sorted({s.client for s in report.stuck}))
        assert report.ok, (f"{report.describe()}\nby fault: {by_fault}\n{run.logs()}\n"
                           f"client errors: {run.workload.errors[:20]}\n{stuck_logs}")
        assert report.failed_deliveries == 0, run.workload.history.failed[:5]
        assert run.injector.unexpected_restarts() == {}, run.logs()
        assert run.injector.not_running() == [], run.logs()


def test_kill_pause_and_restart_of_every_role_lose_nothing(tmp_path: Path) -> None:
    run_faults(tmp_path, LOG_NODE_FAULTS + PROCESS_FAULTS, links=())


def test_a_full_disk_on_a_log_node_loses_nothing(tmp_path: Path) -> None:
    run_faults(tmp_path, [("full-disk", "log-1")], links=(), disk_mb=64)


def test_network_partitions_between_services_lose_nothing(tmp_path: Path) -> None:
    run_faults(tmp_path, NETWORK_FAULTS)
