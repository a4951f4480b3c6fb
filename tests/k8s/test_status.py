"""``kbroker k8s status`` against recorded API answers: the real kubernetes client, with its
HTTP layer answering from fixtures."""

from __future__ import annotations

import argparse

from services.cli import main as kbroker_main
from services.k8s import cli
from services.k8s.release import ReleaseReader, wait_for_rollout
from services.k8s.status import (
    COMPONENT_LABEL,
    ClusterStatus,
    active_replicator,
    parse_prometheus,
    render,
    replicator_lease_name,
    rollout,
    summarize,
)

from .conftest import recorded_api_client


def status_of(recording: str) -> tuple[ClusterStatus, list]:
    api_client, pool = recorded_api_client(recording)
    return ReleaseReader(api_client, "kbroker", "kbroker").status(), pool.requests


def test_healthy_release_reports_every_role_rolled_out_and_no_partition_trouble() -> None:
    status, requests = status_of("healthy")
    roles = {}
    for pod in status.pods:
        roles.setdefault(pod.role, []).append(pod)
    assert {r: len(p) for r, p in roles.items()} == {
        "frontend": 1, "handler": 2, "log": 3, "purgatory": 1, "replicator": 1}
    assert all(p.ready and p.restarts == 0 for p in status.pods)
    assert [r.role for r in status.rollouts] == [
        "frontend", "handler", "log", "purgatory", "replicator"]
    assert status.rolled_out
    assert status.partitions is not None
    assert (status.partitions.under_replicated, status.partitions.offline,
            status.partitions.live_log_nodes) == (0, 0, 3)
    assert status.healthy
    # Every list is filtered to the release by the chart's labels.
    selectors = [q["labelSelector"][0] for _, path, q in requests if "proxy" not in path]
    assert selectors and all(s == "app.kubernetes.io/instance=kbroker,"
                                   "app.kubernetes.io/part-of=kbroker" for s in selectors)


def test_stuck_rollout_names_the_workload_the_pod_and_the_under_replicated_partitions() -> None:
    status, _ = status_of("rolling")
    log = next(r for r in status.rollouts if r.name == "kbroker-log")
    assert not log.complete and (log.ready, log.updated, log.desired) == (2, 1, 3)
    assert all(r.complete for r in status.rollouts if r.name != "kbroker-log")
    crashing = next(p for p in status.pods if p.name == "kbroker-log-2")
    assert (crashing.ready, crashing.reason, crashing.restarts) == (False, "CrashLoopBackOff", 4)
    assert status.partitions is not None and status.partitions.under_replicated == 2
    assert not status.rolled_out and not status.healthy


def test_unreachable_replicator_leaves_partition_health_unknown() -> None:
    status, _ = status_of("replicator_unreachable")
    assert status.rolled_out
    assert status.partitions is None
    assert not status.healthy


def test_command_prints_the_report_and_exits_by_health() -> None:
    lines: list[str] = []
    args = argparse.Namespace(k8s_command="status", namespace="kbroker", release="kbroker",
                              kubeconfig=None, context=None, wait=False, timeout=1.0,
                              interval=0.0)
    api_client, _ = recorded_api_client("healthy")
    assert cli.run(args, api_client=api_client, out=lines.append) == 0
    text = "\n".join(lines)
    assert "StatefulSet/kbroker-log" in text and "3/3" in text
    assert "partitions: 0 under-replicated, 0 offline; 3 live log node(s)" in text
    assert lines[-1] == "status: healthy"
    lines.clear()
    api_client, _ = recorded_api_client("rolling")
    assert cli.run(args, api_client=api_client, out=lines.append) == 1
    assert lines[-1] == "status: rollout in progress"
    assert any("kbroker-log-2" in line and "CrashLoopBackOff" in line for line in lines)


def test_kbroker_command_line_parses_the_k8s_status_subcommand(monkeypatch) -> None:
    seen = {}

    def fake_run(args: argparse.Namespace) -> int:
        seen.update(vars(args))
        return 7

    monkeypatch.setattr(cli, "run", fake_run)
    assert kbroker_main(["k8s", "status", "-n", "prod", "--release", "kb", "--wait",
                         "--timeout", "30"]) == 7
    assert (seen["namespace"], seen["release"], seen["wait"], seen["timeout"]) == (
        "prod", "kb", True, 30.0)


def test_wait_polls_until_the_rollout_completes_or_times_out() -> None:
    rolling, _ = status_of("rolling")
    healthy, _ = status_of("healthy")
    answers = [rolling, rolling, healthy]
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    result = wait_for_rollout(lambda: answers.pop(0), timeout=60, interval=2,
                              clock=lambda: now[0], sleep=sleep)
    assert result is healthy and slept == [2, 2]
    now[0] = 0.0
    slept.clear()
    stuck = wait_for_rollout(lambda: rolling, timeout=5, interval=2, clock=lambda: now[0],
                             sleep=sleep)
    assert stuck is rolling and sum(slept) == 5


def test_prometheus_text_keeps_unlabelled_samples_only() -> None:
    samples = parse_prometheus("# HELP x y\nx 1.0\ny{a=\"b\"} 2\nz 3e2\nbroken\n")
    assert samples == {"x": 1.0, "z": 300.0}


def test_a_release_with_no_workloads_is_not_healthy() -> None:
    status = summarize([], [], None, ["nothing found"])
    assert not status.rolled_out and not status.healthy


# The replicator as the chart runs it: a Deployment of 2, one active (ready, Lease holder) and
# standbys (running, never ready).

LEASE_PATH = "/apis/coordination.k8s.io/v1/namespaces/kbroker/leases/kbroker-replicator"
ACTIVE = "kbroker-replicator-7f9c6d5b84-vx8mw"
STANDBY = "kbroker-replicator-7f9c6d5b84-2kqzt"


def metrics_requests(requests: list) -> list[str]:
    return [path for _, path, _ in requests if path.endswith("/proxy/metrics")]


def test_one_active_replicator_and_a_standby_is_a_healthy_rolled_out_release() -> None:
    status, requests = status_of("active_standby")
    replicator = next(r for r in status.rollouts if r.role == "replicator")
    assert (replicator.kind, replicator.ready, replicator.desired) == ("Deployment", 1, 2)
    assert replicator.complete
    assert status.replicator.active == (ACTIVE,)
    assert status.replicator.standbys == (STANDBY,)
    assert status.replicator.down == ()
    assert (status.replicator.lease_name, status.replicator.lease_holder) == (
        "kbroker-replicator", ACTIVE)
    assert status.problems == ()
    assert status.rolled_out and status.healthy
    # The Lease is read by the name the pods were given (--leader-election-lease).
    assert ("GET", LEASE_PATH) in [(m, p) for m, p, _ in requests]


def test_partition_health_is_read_from_the_active_replicator_only() -> None:
    # The standby's name sorts first, and the recording holds no metrics answer for it: an
    # attempt to read it fails the test as an unrecorded request.
    assert STANDBY < ACTIVE
    status, requests = status_of("active_standby")
    assert metrics_requests(requests) == [
        f"/api/v1/namespaces/kbroker/pods/{ACTIVE}:9464/proxy/metrics"]
    assert status.partitions is not None
    assert (status.partitions.under_replicated, status.partitions.offline,
            status.partitions.live_log_nodes) == (0, 0, 3)


def test_without_a_ready_replicator_there_is_no_active_one_and_no_partition_health() -> None:
    status, requests = status_of("no_active")
    assert status.replicator.active == ()
    assert status.replicator.lease_holder == STANDBY
    assert metrics_requests(requests) == []
    assert status.partitions is None
    replicator = next(r for r in status.rollouts if r.role == "replicator")
    assert not replicator.complete
    assert any(p.startswith("no active replicator") and STANDBY in p for p in status.problems)
    assert not status.rolled_out and not status.healthy
    lines = render(status)
    assert lines[-1] == "status: no active replicator"
    assert "partitions: unknown (no active replicator to ask)" in lines


def test_two_ready_replicators_are_reported_loudly_and_metrics_come_from_the_lease_holder() -> None:
    status, requests = status_of("two_active")
    assert status.replicator.active == (STANDBY, ACTIVE)
    # Not the first by name: the one the Lease names.
    assert metrics_requests(requests) == [
        f"/api/v1/namespaces/kbroker/pods/{ACTIVE}:9464/proxy/metrics"]
    replicator = next(r for r in status.rollouts if r.role == "replicator")
    assert replicator.ready == 2 and not replicator.complete
    assert any(p.startswith("two active replicators") and STANDBY in p and ACTIVE in p
               for p in status.problems)
    assert not status.rolled_out and not status.healthy
    assert render(status)[-1] == "status: TWO ACTIVE REPLICATORS"


def test_an_unreadable_lease_leaves_the_holder_out_but_the_ready_pod_is_still_active() -> None:
    forbidden = {f"GET {LEASE_PATH}": {"status": 403, "body": {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
        "code": 403}}}
    api_client, pool = recorded_api_client("active_standby", forbidden)
    status = ReleaseReader(api_client, "kbroker", "kbroker").status()
    assert status.replicator.lease_holder is None
    assert status.replicator.active == (ACTIVE,)
    assert metrics_requests(pool.requests) == [
        f"/api/v1/namespaces/kbroker/pods/{ACTIVE}:9464/proxy/metrics"]
    assert status.healthy
    assert any(line.startswith(f"replicator: active {ACTIVE} (Lease not read)")
               for line in render(status))


def test_a_ready_replicator_the_lease_does_not_name_is_not_settled() -> None:
    other = {f"GET {LEASE_PATH}": {"status": 200, "body": {
        "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": "kbroker-replicator"},
        "spec": {"holderIdentity": STANDBY, "leaseDurationSeconds": 15}}}}
    api_client, _ = recorded_api_client("active_standby", other)
    status = ReleaseReader(api_client, "kbroker", "kbroker").status()
    assert not status.replicator.settled and not status.rolled_out and not status.healthy
    assert any(f"{ACTIVE} does not hold Lease kbroker-replicator" in p
               for p in status.problems)


def test_command_names_the_active_replicator_with_its_lease_holder() -> None:
    lines: list[str] = []
    args = argparse.Namespace(k8s_command="status", namespace="kbroker", release="kbroker",
                              kubeconfig=None, context=None, wait=False, timeout=1.0,
                              interval=0.0)
    api_client, _ = recorded_api_client("active_standby")
    assert cli.run(args, api_client=api_client, out=lines.append) == 0
    assert (f"replicator: active {ACTIVE} (Lease kbroker-replicator held by {ACTIVE}); "
            f"standby {STANDBY}") in lines
    row = next(line for line in lines if "Deployment/kbroker-replicator" in line)
    assert "1/2" in row and "complete (active/standby: 1 ready wanted)" in row
    assert lines[-1] == "status: healthy"
    lines.clear()
    api_client, _ = recorded_api_client("no_active")
    assert cli.run(args, api_client=api_client, out=lines.append) == 1
    assert lines[-1] == "status: no active replicator"


def test_wait_completes_once_a_standby_release_has_its_active_replicator() -> None:
    no_active, _ = status_of("no_active")
    settled, _ = status_of("active_standby")
    answers = [no_active, no_active, settled]
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert wait_for_rollout(lambda: answers.pop(0), timeout=60, interval=1,
                            clock=lambda: now[0], sleep=sleep) is settled
    assert now[0] == 2


def test_a_crash_looping_or_terminating_replicator_is_neither_active_nor_standby() -> None:
    pods = [
        _replicator_pod("r-a", ready=True),
        _replicator_pod("r-b", ready=False, waiting="CrashLoopBackOff"),
        _replicator_pod("r-c", ready=True, terminating=True),
        _replicator_pod("r-d", ready=False, phase="Pending"),
    ]
    status = summarize(pods, [], None)
    assert status.replicator.active == ("r-a",)
    assert status.replicator.down == ("r-b", "r-c", "r-d")
    assert not status.replicator.settled
    assert any(p.startswith("replicator pod(s) neither active nor standby: r-b, r-c, r-d")
               for p in status.problems)
    # A terminating active is not asked for metrics: it is leaving the Service.
    assert active_replicator([pods[2]]) is None


def test_lease_name_comes_from_either_flag_spelling_and_only_from_replicator_pods() -> None:
    def named(*args: str) -> str | None:
        return replicator_lease_name([_replicator_pod("r", args=list(args))])

    assert named("--leader-election-lease=x") == "x"
    assert named("--grpc-address=:1", "--leader-election-lease", "y") == "y"
    assert named("--grpc-address=:1") is None
    not_replicator = _replicator_pod("h", args=["--leader-election-lease=z"])
    not_replicator["metadata"]["labels"][COMPONENT_LABEL] = "handler"
    assert replicator_lease_name([not_replicator]) is None


def test_a_single_replicator_without_leader_election_still_counts_by_readiness() -> None:
    # Replicas 1: the ready goal is that one pod, as before active/standby.
    one = rollout({"kind": "Deployment",
                   "metadata": {"name": "r", "generation": 1,
                                "labels": {COMPONENT_LABEL: "replicator"}},
                   "spec": {"replicas": 1},
                   "status": {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                              "observedGeneration": 1}})
    assert one.active_standby and one.ready_goal == 1 and one.complete
    # An old pod still running beside the updated ones is not a finished rollout.
    lingering = rollout({"kind": "Deployment",
                         "metadata": {"name": "r", "generation": 2,
                                      "labels": {COMPONENT_LABEL: "replicator"}},
                         "spec": {"replicas": 2},
                         "status": {"replicas": 3, "readyReplicas": 1, "updatedReplicas": 2,
                                    "observedGeneration": 2}})
    assert not lingering.complete


def _replicator_pod(name: str, ready: bool = True, phase: str = "Running", waiting: str = "",
                    terminating: bool = False, args: list[str] | None = None) -> dict:
    metadata: dict = {"name": name, "labels": {COMPONENT_LABEL: "replicator"}}
    if terminating:
        metadata["deletionTimestamp"] = "2025-11-20T10:30:00Z"
    state = {"waiting": {"reason": waiting}} if waiting else {"running": {}}
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "replicator", "args": args or []}]},
        "status": {"phase": phase,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                   "containerStatuses": [{"name": "replicator", "ready": ready,
                                          "restartCount": 0, "state": state}]},
    }
