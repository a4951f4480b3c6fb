"""Service discovery through the Kubernetes API: the ready endpoints of a Service, read from its
EndpointSlices (discovery.k8s.io/v1), for ``k8s:///service.namespace:port`` addresses (see
services.common.discovery)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.common.discovery import K8S_SCHEME, join_host_port, split_host_port

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def ready_addresses(slices: Iterable[dict[str, Any]], port: int) -> tuple[str, ...]:
    """``host:port`` of every ready endpoint in EndpointSlice objects (as the API returns them).

    An endpoint without ``conditions.ready`` counts as ready, as the API defines it; terminating
    endpoints are never ready."""
    out = set()
    for endpoint_slice in slices:
        for endpoint in endpoint_slice.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            if conditions.get("ready", True) is False or conditions.get("terminating"):
                continue
            for address in endpoint.get("addresses") or []:
                out.add(join_host_port(address, port))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class KubernetesResolver:
    """The ready pods behind a Service, from the API server (needs list on endpointslices)."""

    service: str
    namespace: str
    port: int
    api_client: Any = None

    @classmethod
    def from_target(cls, target: str, api_client: Any = None) -> KubernetesResolver:
        """``k8s:///service.namespace:port``; a bare ``service`` is in this pod's namespace."""
        host, port = split_host_port(target.removeprefix(K8S_SCHEME))
        service, _, namespace = host.partition(".")
        return cls(service, namespace or current_namespace(), port, api_client)

    def list_slices(self) -> list[dict[str, Any]]:
        from kubernetes import client

        api = client.DiscoveryV1Api(self.api_client or default_api_client())
        response = api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.service}",
            _preload_content=False)
        return json.loads(response.data)["items"]

    async def resolve(self) -> tuple[str, ...]:
        # The kubernetes client blocks: keep it off the event loop.
        slices = await asyncio.to_thread(self.list_slices)
        return ready_addresses(slices, self.port)


NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def current_namespace(default: str = "default") -> str:
    try:
        with open(NAMESPACE_FILE) as f:
            return f.read().strip() or default
    except OSError:
        return default


def default_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An API client from the pod's service account, else from a kubeconfig file."""
    from kubernetes import client, config

    try:
        if kubeconfig is None and context is None:
            config.load_incluster_config()
            return client.ApiClient()
    except config.ConfigException:
        pass
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context,
                            client_configuration=configuration)
    return client.ApiClient(configuration)
