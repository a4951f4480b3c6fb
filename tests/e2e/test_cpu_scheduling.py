"""The services of a running local cluster leave every thread of theirs (gRPC's, the metrics
server's, the event loop's) under the kernel's default scheduling policy, their default:
SCHED_BATCH is asked for, never taken unasked."""

from __future__ import annotations

import os


def test_every_thread_of_every_service_keeps_the_default_scheduling(cluster):
    policies = {}
    for name, service in cluster.services.items():
        assert service.proc is not None, name
        threads = [int(tid) for tid in os.listdir(f"/proc/{service.proc.pid}/task")]
        # A service runs its event loop, gRPC's threads and its metrics server at least.
        assert len(threads) >= 3, name
        policies[name] = {os.sched_getscheduler(tid) for tid in threads}
    assert len(policies) == len(cluster.services) >= 8
    assert policies == {name: {os.SCHED_OTHER} for name in cluster.services}
