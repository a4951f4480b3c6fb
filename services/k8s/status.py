"""What ``kbroker k8s status`` reports about a release: pods per role, whether every workload
has finished rolling out, which replicator pod is active, and the partitions the replicator
counts as under-replicated or offline. Pure functions over the API's JSON objects (as the API
server returns them), so the report is tested against recorded answers; reading them is
:mod:`services.k8s.release`'s job.

The replicator is active/standby: one pod holds the Lease and is ready (its Replicator service
SERVING); the others run as standbys that are never ready. So its workload is rolled out when
every pod is updated and exactly one is ready, not when all are, and its metrics come from the
ready pod only (a standby reports no partitions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"

UNDER_REPLICATED_METRIC = "kbroker_replicator_under_replicated_partitions"
OFFLINE_METRIC = "kbroker_replicator_offline_partitions"
LIVE_NODES_METRIC = "kbroker_replicator_live_log_nodes"

REPLICATOR = "replicator"
# The replicator flag naming its Lease (the chart sets it to <fullname>-replicator).
LEASE_FLAG = "--leader-election-lease"


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
    """One StatefulSet or Deployment and how far its rollout is (see :func:`rollout`)."""

    kind: str
    name: str
    role: str
    desired: int
    ready: int
    updated: int
    # One ready pod is the goal (the replicator: the others are standbys, never ready).
    active_standby: bool
    complete: bool

    @property
    def ready_goal(self) -> int:
        """How many pods must be ready: all of them, or one for an active/standby role."""
        return min(1, self.desired) if self.active_standby else self.desired


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    under_replicated: int
    offline: int
    live_log_nodes: int


@dataclass(frozen=True, slots=True)
class ReplicatorLeadership:
    """Which replicator pods act: the ready one(s) are active, running unready ones standbys.

    ``lease_holder`` is the Lease's ``holderIdentity`` (a pod name; "" released), or None when
    the Lease was not read (no name known, absent, or not readable with the caller's rights).
    """

    active: tuple[str, ...]
    standbys: tuple[str, ...]
    # Neither: pending, crash-looping, terminating, failed.
    down: tuple[str, ...]
    lease_name: str | None = None
    lease_holder: str | None = None

    @property
    def settled(self) -> bool:
        """Exactly one active pod, every other one a running standby, and the Lease (when
        read) naming the active pod."""
        return (len(self.active) == 1 and not self.down
                and self.lease_holder in (None, self.active[0]))

    def problems(self) -> list[str]:
        out = []
        lease = f"Lease {self.lease_name}" if self.lease_name else "the Lease"
        if not self.active:
            if self.lease_holder:
                out.append(f"no active replicator: {lease} is held by {self.lease_holder}, "
                           f"which is not ready (taking over, or stopped without releasing it)")
            else:
                out.append("no active replicator: no replicator pod is ready")
        elif len(self.active) > 1:
            count = "two" if len(self.active) == 2 else str(len(self.active))
            holder = (f"{lease} names {self.lease_holder or 'nobody'}"
                      if self.lease_holder is not None else f"{lease} could not be read")
            both = "both" if len(self.active) == 2 else "all"
            out.append(f"{count} active replicators: {', '.join(self.active)} are {both} ready; "
                       f"only one may act ({holder}). This must never happen: the others "
                       f"should have stopped serving when they lost the Lease")
        elif self.lease_holder is not None and self.lease_holder != self.active[0]:
            out.append(f"active replicator {self.active[0]} does not hold {lease} "
                       f"(holder: {self.lease_holder or 'nobody'})")
        if self.down:
            out.append(f"replicator pod(s) neither active nor standby: {', '.join(self.down)}")
        return out


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    pods: tuple[PodState, ...]
    rollouts: tuple[Rollout, ...]
    partitions: PartitionHealth | None  # None: the replicator's metrics could not be read
    problems: tuple[str, ...]
    replicator: ReplicatorLeadership

    @property
    def rolled_out(self) -> bool:
        """Every workload rolled out and the replicator settled (one active, the rest
        standbys): what ``--wait`` waits for."""
        return (bool(self.rollouts) and all(r.complete for r in self.rollouts)
                and self.replicator.settled)

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
    does: the controller has seen the latest spec, every pod is updated and ready; for the
    replicator, every pod updated, no old one left (no stale active or standby) and exactly
    one ready (a second ready replicator is not a finished rollout)."""
    meta, spec, status = workload["metadata"], workload.get("spec", {}), workload.get("status", {})
    kind = workload.get("kind", "")
    role = (meta.get("labels") or {}).get(COMPONENT_LABEL, "?")
    desired = int(spec.get("replicas", 1))
    ready = int(status.get("readyReplicas", 0))
    updated = int(status.get("updatedReplicas", 0))
    # StatefulSets name their revisions: none of the pods may be left on the previous one.
    revision_done = kind != "StatefulSet" or not status.get("updateRevision") or (
        status.get("currentRevision") == status["updateRevision"])
    rolled = (int(status.get("observedGeneration", 0)) >= int(meta.get("generation", 0))
              and revision_done and updated >= desired)
    if role == REPLICATOR:
        # status.replicas: pods not terminated, of any revision.
        complete = (rolled and int(status.get("replicas", -1)) <= desired
                    and ready == min(1, desired))
    else:
        complete = rolled and ready >= desired
    return Rollout(kind=kind, name=meta["name"], role=role, desired=desired, ready=ready,
                   updated=updated, active_standby=role == REPLICATOR, complete=complete)


def _is_replicator(pod: Mapping[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(COMPONENT_LABEL) == REPLICATOR


def replicator_lease_name(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """The Lease the replicator pods compete for, from their ``--leader-election-lease``
    argument (``--flag=NAME`` or ``--flag NAME``); None when no replicator pod has one (a
    single replicator without leader election)."""
    for pod in pods:
        if not _is_replicator(pod):
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            args = [*(container.get("command") or []), *(container.get("args") or [])]
            for i, arg in enumerate(args):
                if arg.startswith(LEASE_FLAG + "="):
                    return arg.partition("=")[2] or None
                if arg == LEASE_FLAG and i + 1 < len(args):
                    return args[i + 1]
    return None


def active_replicator(pods: Iterable[Mapping[str, Any]],
                      lease_holder: str | None = None) -> Mapping[str, Any] | None:
    """The replicator pod to ask for partition health: the ready one. Should several be
    ready, the Lease holder among them, else the first by name; None when none is ready (a
    standby has no partition state to report)."""
    ready = sorted((p for p in pods if _is_replicator(p) and _acting(pod_state(p))),
                   key=lambda p: p["metadata"]["name"])
    for pod in ready:
        if lease_holder and pod["metadata"]["name"] == lease_holder:
            return pod
    return ready[0] if ready else None


def _acting(pod: PodState) -> bool:
    """Ready and not on its way out (a terminating pod is no longer behind the Service)."""
    return pod.ready and not pod.reason


def leadership(pods: Iterable[PodState], lease_name: str | None = None,
               lease_holder: str | None = None) -> ReplicatorLeadership:
    """Sort the replicator pods into active (ready), standbys (running, no waiting container,
    not terminating) and down."""
    active, standbys, down = [], [], []
    for p in sorted((p for p in pods if p.role == REPLICATOR), key=lambda p: p.name):
        if _acting(p):
            active.append(p.name)
        elif p.phase == "Running" and not p.reason:
            standbys.append(p.name)
        else:
            down.append(p.name)
    return ReplicatorLeadership(tuple(active), tuple(standbys), tuple(down), lease_name,
                                lease_holder)


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
              replicator_metrics: str | None, problems: Iterable[str] = (),
              lease_name: str | None = None, lease_holder: str | None = None) -> ClusterStatus:
    """The status from list answers (their ``items``), the active replicator's metrics text
    and the replicator Lease's holder (None: not read)."""
    states = tuple(sorted((pod_state(p) for p in pods), key=lambda p: (_role_order(p.role),
                                                                       p.name)))
    rollouts = tuple(sorted((rollout(w) for w in workloads),
                            key=lambda r: (_role_order(r.role), r.name)))
    partitions = partition_health(replicator_metrics) if replicator_metrics else None
    replicator = leadership(states, lease_name, lease_holder)
    found = (*problems, *(replicator.problems() if states else ()))
    return ClusterStatus(states, rollouts, partitions, found, replicator)


def _role_order(role: str) -> int:
    return ROLES.index(role) if role in ROLES else len(ROLES)


def render(status: ClusterStatus) -> list[str]:
    """The report, one line each."""
    lines = [f"{'ROLE':<11} {'WORKLOAD':<34} {'READY':>7} {'UPDATED':>7}  ROLLOUT"]
    for r in status.rollouts:
        state = "complete" if r.complete else "in progress"
        if r.active_standby and r.desired > 1:
            state += f" (active/standby: {r.ready_goal} ready wanted)"
        lines.append(f"{r.role:<11} {r.kind + '/' + r.name:<34} "
                     f"{f'{r.ready}/{r.desired}':>7} {r.updated:>7}  {state}")
    lines.append("")
    width = max([34, *(len(p.name) for p in status.pods)])
    lines.append(f"{'POD':<{width}} {'ROLE':<11} {'READY':<6} {'PHASE':<10} {'RESTARTS':>8}  "
                 "NODE")
    for p in status.pods:
        phase = p.reason or p.phase
        lines.append(f"{p.name:<{width}} {p.role:<11} {'yes' if p.ready else 'no':<6} "
                     f"{phase:<10} {p.restarts:>8}  {p.node}")
    lines.append("")
    lines.append(_leadership_line(status.replicator))
    if status.partitions is None:
        why = ("replicator metrics unavailable" if status.replicator.active
               else "no active replicator to ask")
        lines.append(f"partitions: unknown ({why})")
    else:
        h = status.partitions
        lines.append(f"partitions: {h.under_replicated} under-replicated, {h.offline} offline; "
                     f"{h.live_log_nodes} live log node(s)")
    lines.extend(f"problem: {p}" for p in status.problems)
    lines.append(f"status: {_verdict(status)}")
    return lines


def _leadership_line(r: ReplicatorLeadership) -> str:
    if r.lease_holder is None:
        lease = "Lease not read"
    else:
        lease = f"Lease {r.lease_name} held by {r.lease_holder or 'nobody'}"
    active = ", ".join(r.active) or "none"
    standbys = ", ".join(r.standbys) or "none"
    line = f"replicator: active {active} ({lease}); standby {standbys}"
    if r.down:
        line += f"; down {', '.join(r.down)}"
    return line


def _verdict(status: ClusterStatus) -> str:
    if status.healthy:
        return "healthy"
    if status.pods and len(status.replicator.active) > 1:
        return "TWO ACTIVE REPLICATORS" if len(status.replicator.active) == 2 else (
            f"{len(status.replicator.active)} ACTIVE REPLICATORS")
    if status.pods and not status.replicator.active:
        return "no active replicator"
    if status.rolled_out:
        return "rolled out, partitions need attention"
    return "rollout in progress"
