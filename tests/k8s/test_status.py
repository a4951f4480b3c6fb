"""``kbroker k8s status`` against recorded API answers: the real kubernetes client, with its
HTTP layer answering from fixtures."""

from __future__ import annotations

import argparse

from services.cli import main as kbroker_main
from services.k8s import cli
from services.k8s.cluster import ReleaseReader, wait_for_rollout
from services.k8s.status import ClusterStatus, parse_prometheus, summarize

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
