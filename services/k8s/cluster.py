"""Reading a kbroker release from the Kubernetes API: its pods, StatefulSets and Deployments
(by the chart's labels) and the replicator's Prometheus text through the API server's pod
proxy, so ``kbroker k8s status`` needs no port-forward. Answers are kept as the API's JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .status import COMPONENT_LABEL, INSTANCE_LABEL, ClusterStatus, summarize

PART_OF_SELECTOR = "app.kubernetes.io/part-of=kbroker"


class ReleaseReader:
    """One release (``--release``) in one namespace, through an API client."""

    def __init__(self, api_client: Any, namespace: str, release: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.namespace = namespace
        self.selector = f"{INSTANCE_LABEL}={release},{PART_OF_SELECTOR}"

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

    def pods(self) -> list[dict[str, Any]]:
        return self._json(self.core.list_namespaced_pod(
            self.namespace, label_selector=self.selector, _preload_content=False))["items"]

    def workloads(self) -> list[dict[str, Any]]:
        out = []
        for kind, lister in (("StatefulSet", self.apps.list_namespaced_stateful_set),
                             ("Deployment", self.apps.list_namespaced_deployment)):
            items = self._json(lister(self.namespace, label_selector=self.selector,
                                      _preload_content=False))["items"]
            # List answers leave out each item's kind.
            out.extend({**item, "kind": kind} for item in items)
        return out

    def replicator_metrics(self, pods: list[dict[str, Any]]) -> str | None:
        """The Prometheus text of a ready replicator pod, via the API server's pod proxy."""
        from kubernetes.client.exceptions import ApiException

        for pod in pods:
            if (pod["metadata"].get("labels") or {}).get(COMPONENT_LABEL) != "replicator":
                continue
            port = _named_port(pod, "metrics")
            if port is None:
                continue
            try:
                response = self.core.connect_get_namespaced_pod_proxy_with_path(
                    f"{pod['metadata']['name']}:{port}", self.namespace, "metrics",
                    _preload_content=False)
            except ApiException:
                continue
            if response.status != 200:
                continue
            return bytes(response.data).decode()
        return None

    def status(self) -> ClusterStatus:
        pods = self.pods()
        workloads = self.workloads()
        metrics = self.replicator_metrics(pods)
        problems = [] if workloads else [f"no kbroker workloads match {self.selector!r} in "
                                         f"namespace {self.namespace!r}"]
        return summarize(pods, workloads, metrics, problems)


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
    """Poll until every workload has rolled out or ``timeout`` seconds pass; the last status."""
    deadline = clock() + timeout
    while True:
        status = read()
        if on_poll is not None:
            on_poll(status)
        if status.rolled_out or clock() >= deadline:
            return status
        sleep(min(interval, max(0.0, deadline - clock())))
