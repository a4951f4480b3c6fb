"""What ``kbroker k8s status`` reports about a release: pods per role, whether every workload
has finished rolling out, and the partitions the replicator counts as under-replicated or
offline. Pure functions over the API's JSON objects (as the API server returns them), so the
report is tested against recorded answers; reading them is :mod:`services.k8s.cluster`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"

UNDER_REPLICATED_METRIC = "kbroker_replicator_under_replicated_partitions"
OFFLINE_METRIC = "kbroker_replicator_offline_partitions"
LIVE_NODES_METRIC = "kbroker_replicator_live_log_nodes"


@dataclass(frozen=True, slots=True)
class PodState:
    name: str
    role: str
    phase: str
    ready: bool
    restarts: int
    node: str
    reason: str  # why a container is not running (CrashLoopBackOff, ...), else ""


@dataclass(frozen=True, slots=True)
class Rollout:
    """One StatefulSet or Deployment and how far its rollout is."""

    kind: str
    name: str
    role: str
    desired: int
    ready: int
    updated: int
    current_generation: bool
    # StatefulSets: pods still on the previous revision.
    revision_done: bool = True

    @property
    def complete(self) -> bool:
        return (self.current_generation and self.revision_done
                and self.updated >= self.desired and self.ready >= self.desired)


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    under_replicated: int
    offline: int
    live_log_nodes: int


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    pods: tuple[PodState, ...]
    rollouts: tuple[Rollout, ...]
    partitions: PartitionHealth | None  # None: the replicator's metrics could not be read
    problems: tuple[str, ...] = field(default=())

    @property
    def rolled_out(self) -> bool:
        return bool(self.rollouts) and all(r.complete for r in self.rollouts)

    @property
    def healthy(self) -> bool:
        return (self.rolled_out and self.partitions is not None
                and self.partitions.under_replicated == 0 and self.partitions.offline == 0)


def pod_state(pod: Mapping[str, Any]) -> PodState:
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    containers = status.get("containerStatuses") or []
    reason = ""
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            reason = waiting["reason"]
            break
    ready = any(cond.get("type") == "Ready" and cond.get("status") == "True"
                for cond in status.get("conditions") or [])
    if meta.get("deletionTimestamp"):
        reason = reason or "Terminating"
    return PodState(
        name=meta["name"],
        role=(meta.get("labels") or {}).get(COMPONENT_LABEL, "?"),
        phase=status.get("phase", "Unknown"),
        ready=ready,
        restarts=sum(int(c.get("restartCount", 0)) for c in containers),
        node=spec.get("nodeName", ""),
        reason=reason,
    )


def rollout(workload: Mapping[str, Any]) -> Rollout:
    """Rollout progress of a StatefulSet or Deployment, judged as ``kubectl rollout status``
    does: the controller has seen the latest spec, every pod is updated and ready."""
    meta, spec, status = workload["metadata"], workload.get("spec", {}), workload.get("status", {})
    kind = workload.get("kind", "")
    desired = int(spec.get("replicas", 1))
    revision_done = True
    if kind == "StatefulSet" and status.get("updateRevision"):
        revision_done = status.get("currentRevision") == status["updateRevision"]
    return Rollout(
        kind=kind,
        name=meta["name"],
        role=(meta.get("labels") or {}).get(COMPONENT_LABEL, "?"),
        desired=desired,
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        current_generation=int(status.get("observedGeneration", 0))
        >= int(meta.get("generation", 0)),
        revision_done=revision_done,
    )


def parse_prometheus(text: str) -> dict[str, float]:
    """Unlabelled samples of a Prometheus text exposition (``name value`` lines)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        if "{" in name:
            continue
        try:
            out[name] = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
    return out


def partition_health(metrics_text: str) -> PartitionHealth | None:
    samples = parse_prometheus(metrics_text)
    if UNDER_REPLICATED_METRIC not in samples:
        return None
    return PartitionHealth(
        under_replicated=int(samples[UNDER_REPLICATED_METRIC]),
        offline=int(samples.get(OFFLINE_METRIC, 0)),
        live_log_nodes=int(samples.get(LIVE_NODES_METRIC, 0)),
    )


def summarize(pods: Iterable[Mapping[str, Any]], workloads: Iterable[Mapping[str, Any]],
              replicator_metrics: str | None, problems: Iterable[str] = ()) -> ClusterStatus:
    """The status from list answers (their ``items``) and the replicator's metrics text."""
    states = tuple(sorted((pod_state(p) for p in pods), key=lambda p: (_role_order(p.role),
                                                                       p.name)))
    rollouts = tuple(sorted((rollout(w) for w in workloads),
                            key=lambda r: (_role_order(r.role), r.name)))
    partitions = partition_health(replicator_metrics) if replicator_metrics else None
    return ClusterStatus(states, rollouts, partitions, tuple(problems))


def _role_order(role: str) -> int:
    return ROLES.index(role) if role in ROLES else len(ROLES)


def render(status: ClusterStatus) -> list[str]:
    """The report, one line each."""
    lines = [f"{'ROLE':<11} {'WORKLOAD':<34} {'READY':>7} {'UPDATED':>7}  ROLLOUT"]
    for r in status.rollouts:
        state = "complete" if r.complete else "in progress"
        lines.append(f"{r.role:<11} {r.kind + '/' + r.name:<34} "
                     f"{f'{r.ready}/{r.desired}':>7} {r.updated:>7}  {state}")
    lines.append("")
    lines.append(f"{'POD':<34} {'ROLE':<11} {'READY':<6} {'PHASE':<10} {'RESTARTS':>8}  NODE")
    for p in status.pods:
        phase = p.reason or p.phase
        lines.append(f"{p.name:<34} {p.role:<11} {'yes' if p.ready else 'no':<6} {phase:<10} "
                     f"{p.restarts:>8}  {p.node}")
    lines.append("")
    if status.partitions is None:
        lines.append("partitions: unknown (replicator metrics unavailable)")
    else:
        h = status.partitions
        lines.append(f"partitions: {h.under_replicated} under-replicated, {h.offline} offline; "
                     f"{h.live_log_nodes} live log node(s)")
    lines.extend(f"problem: {p}" for p in status.problems)
    verdict = ("healthy" if status.healthy
               else "rolled out, partitions need attention" if status.rolled_out
               else "rollout in progress")
    lines.append(f"status: {verdict}")
    return lines
