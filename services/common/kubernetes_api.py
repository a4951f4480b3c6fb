"""The Kubernetes API as a pod or an operator's machine reaches it: an API client from the
pod's service account, else from a kubeconfig, and the pod's own namespace. The kubernetes
package is imported only when called: only deployments on Kubernetes need it."""

from __future__ import annotations

from typing import Any

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def current_namespace(default: str = "default") -> str:
    """The namespace this pod runs in (``default`` outside a pod)."""
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
