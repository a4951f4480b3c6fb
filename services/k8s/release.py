"""Reading a kbroker release from the Kubernetes API: its pods, StatefulSets and Deployments
(by the chart's labels), the replicator's Lease (coordination.k8s.io/v1, to name the active
replica) and the active replicator's Prometheus text through the API server's pod proxy, so
``kbroker k8s status`` needs no port-forward. Answers are kept as the API's JSON.

Rights used: list pods, statefulsets and deployments; get pods/proxy; get leases (optional:
without it the report leaves the Lease out)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .status import (
    INSTANCE_LABEL,
    ClusterStatus,
    active_replicator,
    replicator_lease_name,
    summarize,
)

PART_OF_SELECTOR = "app.kubernetes.io/part-of=kbroker"


class ReleaseReader:
    """One release (``--release``) in one namespace, through an API client."""

    def __init__(self, api_client: Any, namespace: str, release: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.selector = f"{INSTANCE_LABEL}={release},{PART_OF_SELECTOR}"

    def _items(self, lister: Callable[..., Any]) -> list[dict[str, Any]]:
        return json.loads(lister(self.namespace, label_selector=self.selector,
                                 _preload_content=False).data)["items"]

    def pods(self) -> list[dict[str, Any]]:
        return self._items(self.core.list_namespaced_pod)

    def workloads(self) -> list[dict[str, Any]]:
        # List answers leave out each item's kind.
        return [{**item, "kind": kind}
                for kind, lister in (("StatefulSet", self.apps.list_namespaced_stateful_set),
                                     ("Deployment", self.apps.list_namespaced_deployment))
                for item in self._items(lister)]

    def lease_holder(self, name: str) -> str | None:
        """The ``holderIdentity`` of Lease ``name`` ("" when released), or None when it cannot
        be read (absent, forbidden, unreachable)."""
        data = _read(self.coordination.read_namespaced_lease, name, self.namespace)
        if data is None:
            return None
        return (json.loads(data).get("spec") or {}).get("holderIdentity") or ""

    def metrics(self, pod: dict[str, Any]) -> str | None:
        """The Prometheus text of ``pod``, via the API server's pod proxy; None when it does
        not answer."""
        port = _named_port(pod, "metrics")
        if port is None:
            return None
        data = _read(self.core.connect_get_namespaced_pod_proxy_with_path,
                     f"{pod['metadata']['name']}:{port}", self.namespace, "metrics")
        return None if data is None else bytes(data).decode()

    def status(self) -> ClusterStatus:
        pods = self.pods()
        workloads = self.workloads()
        lease_name = replicator_lease_name(pods)
        holder = self.lease_holder(lease_name) if lease_name else None
        # Only the active (ready) replicator knows the partitions; never ask a standby.
        active = active_replicator(pods, holder)
        metrics = self.metrics(active) if active is not None else None
        problems = [] if workloads else [f"no kbroker workloads match {self.selector!r} in "
                                         f"namespace {self.namespace!r}"]
        return summarize(pods, workloads, metrics, problems, lease_name=lease_name,
                         lease_holder=holder)


def _read(call: Callable[..., Any], *args: str) -> Any:
    """The body of the API's answer to ``call(*args)``, or None when the call fails or does
    not answer 200."""
    from kubernetes.client.exceptions import ApiException

    try:
        response = call(*args, _preload_content=False)
    except ApiException:
        return None
    return response.data if response.status == 200 else None


def _named_port(pod: dict[str, Any], name: str) -> int | None:
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return None


def wait_for_rollout(read: Callable[[], ClusterStatus], timeout: float, interval: float = 2.0,
                     on_poll: Callable[[ClusterStatus], None] | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> ClusterStatus:
    """Poll until every workload has rolled out (and one replicator is active, the others
    standbys) or ``timeout`` seconds pass; the last status."""
    deadline = clock() + timeout
    while True:
        status = read()
        if on_poll is not None:
            on_poll(status)
        if status.rolled_out or clock() >= deadline:
            return status
        sleep(min(interval, max(0.0, deadline - clock())))
