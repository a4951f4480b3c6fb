"""The services of a running local cluster schedule every thread of theirs (gRPC's, the
metrics server's, the event loop's) under Linux's SCHED_BATCH, their default."""

from __future__ import annotations

import os


def test_every_thread_of_every_service_runs_under_batch_scheduling(cluster):
    policies = {}
    for name, service in cluster.services.items():
        assert service.proc is not None, name
        threads = [int(tid) for tid in os.listdir(f"/proc/{service.proc.pid}/task")]
        # A service runs its event loop, gRPC's threads and its metrics server at least.
        assert len(threads) >= 3, name
        policies[name] = {os.sched_getscheduler(tid) for tid in threads}
    assert len(policies) == len(cluster.services) >= 8
    assert policies == {name: {os.SCHED_BATCH} for name in cluster.services}
