"""Which gRPC Metrics endpoints a Spark job reads: any cluster address, resolved on the driver.

Every kbroker process serves ``kbroker.metrics.v1.Metrics`` on its gRPC port, so an endpoint is
simply a service's gRPC ``host:port``. A cluster is named in one of these forms (the ``cluster``
option of the data source, ``--cluster`` of the jobs, ``CLUSTER=`` of ``make spark-report``):

    local                                 a ``kbroker up`` cluster on the default ports
    local:29090                           the same at another base port (``--base-port``)
    k8s:kbroker/kbroker                   a Helm release: namespace/release, every running pod's
                                          container port named ``grpc``, from the Kubernetes API
    k8s:kbroker                           release ``kbroker`` in the current namespace
    127.0.0.1:19090,127.0.0.1:19100       explicit endpoints (anything else: see below)

and explicit endpoints (the ``endpoints`` option, or a ``cluster`` that is none of the forms
above) in these, mixed and comma separated:

    127.0.0.1:19090,127.0.0.1:19100       static addresses
    dns:///kbroker-log.kafka:9090         every pod behind a headless Service
    k8s:///kbroker-handler.kafka:9090     ready endpoints of a Service, from the Kubernetes API

A local cluster's composition is found, not assumed: ``kbroker up`` places handler ``i`` at the
base port + 10 + i and log node ``i`` at + 110 + i, so the ports of those ranges that accept a
TCP connection on 127.0.0.1 are its handlers and log nodes (``handlers`` / ``log_nodes`` options
fix the counts instead; nothing listening at all gives the default plan, 2 and 3, so an error
names the ports expected). A local cluster started on free ports (``base_port=0``, as the tests
do) has no plan: pass its addresses (see :func:`cluster_endpoints`).

A release is read through :class:`services.k8s.release.ReleaseReader` (the pods of the release
by the chart's labels; rights: list pods), with the pod's service account inside a cluster or
the kubeconfig (options ``kubeconfig`` and ``kube_context``) outside one. Pods are addressed by
their IP, so the job must run where pod IPs are reachable (in the cluster, or over a VPN);
standby replicators are read too (they answer with no partitions), pods not running or being
deleted are left out.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from typing import Any

from services.common.discovery import join_host_port, resolver_for, split_host_port
from services.local_cluster import ClusterSpec, LocalCluster

DEFAULT_BASE_PORT = 19090
# Where ``kbroker up`` puts handlers and log nodes, from the base port (services.local_cluster).
HANDLER_OFFSET = 10
LOG_NODE_OFFSET = 110
# How many instances of a kind a plan has room for (the next kind's offset).
MAX_PER_KIND = 100
DEFAULT_HANDLERS = 2
DEFAULT_LOG_NODES = 3
K8S_RELEASE_PREFIX = "k8s:"
GRPC_PORT_NAME = "grpc"

Probe = Callable[[str, int], bool]


def listening(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def cluster_endpoints(cluster: LocalCluster) -> list[str]:
    """The gRPC address of every service of a planned or running local cluster."""
    return [svc.grpc_address for svc in cluster.services.values()]


def local_base_port(cluster: str) -> int:
    """The base port of ``local`` or ``local:<base port>``; ValueError for anything else."""
    name, _, port = cluster.partition(":")
    if name != "local" or (port and not port.isdigit()):
        raise ValueError(f"unknown cluster {cluster!r}: expected 'local' or 'local:<base port>'")
    base_port = int(port) if port else DEFAULT_BASE_PORT
    if base_port <= 0:
        raise ValueError("a local cluster on free ports has no plan; pass its endpoints instead")
    return base_port


def local_plan_endpoints(cluster: str, handlers: int = DEFAULT_HANDLERS,
                         log_nodes: int = DEFAULT_LOG_NODES) -> list[str]:
    """The addresses ``kbroker up`` uses for ``cluster`` = ``local`` or ``local:<base port>``
    with these counts. Nothing is started or contacted: the plan is a pure function of the spec.
    """
    spec = ClusterSpec(base_port=local_base_port(cluster), handlers=handlers,
                       log_nodes=log_nodes)
    return cluster_endpoints(LocalCluster(spec))


def local_endpoints(cluster: str, handlers: int | None = None, log_nodes: int | None = None,
                    probe: Probe = listening, host: str = "127.0.0.1") -> list[str]:
    """The endpoints of a running local cluster: counts not given are found by probing the
    plan's ranges (see the module docstring); a kind with nothing listening keeps its default
    count, so the endpoints named are those the default plan expects."""
    base = local_base_port(cluster)

    def found(offset: int, default: int) -> list[int]:
        ports = [base + offset + i for i in range(MAX_PER_KIND) if base + offset + i < 65536]
        up = [port for port in ports if probe(host, port)]
        return up or ports[:default]

    plan = local_plan_endpoints(cluster, handlers=handlers or DEFAULT_HANDLERS,
                                log_nodes=log_nodes or DEFAULT_LOG_NODES)
    fixed = [e for e in plan if not _in_range(e, base + HANDLER_OFFSET, 2 * MAX_PER_KIND)]
    handler_ports = ([base + HANDLER_OFFSET + i for i in range(handlers)] if handlers
                     else found(HANDLER_OFFSET, DEFAULT_HANDLERS))
    log_ports = ([base + LOG_NODE_OFFSET + i for i in range(log_nodes)] if log_nodes
                 else found(LOG_NODE_OFFSET, DEFAULT_LOG_NODES))
    return [*fixed, *(join_host_port(host, p) for p in (*handler_ports, *log_ports))]


def _in_range(endpoint: str, first: int, count: int) -> bool:
    return first <= split_host_port(endpoint)[1] < first + count


def release_endpoints(namespace: str, release: str, api_client: Any = None) -> list[str]:
    """``podIP:grpc port`` of every running pod of a Helm release (see the module docstring),
    ordered by pod name."""
    from services.common.kubernetes_api import default_api_client
    from services.k8s.release import ReleaseReader

    reader = ReleaseReader(api_client or default_api_client(), namespace, release)
    out = []
    for pod in sorted(reader.pods(), key=lambda p: p["metadata"]["name"]):
        status = pod.get("status") or {}
        if (status.get("phase") != "Running" or not status.get("podIP")
                or pod["metadata"].get("deletionTimestamp")):
            continue
        for container in pod.get("spec", {}).get("containers", []):
            for port in container.get("ports") or []:
                if port.get("name") == GRPC_PORT_NAME:
                    out.append(join_host_port(status["podIP"], int(port["containerPort"])))
    return out


def parse_release(cluster: str) -> tuple[str, str]:
    """(namespace, release) of ``k8s:<namespace>/<release>`` or ``k8s:<release>`` (the
    current namespace)."""
    from services.common.kubernetes_api import current_namespace

    target = cluster.removeprefix(K8S_RELEASE_PREFIX)
    namespace, sep, release = target.rpartition("/")
    if not release or (sep and not namespace):
        raise ValueError(f"not k8s:<namespace>/<release>: {cluster!r}")
    return (namespace if sep else current_namespace()), release


def is_release(cluster: str) -> bool:
    return cluster.startswith(K8S_RELEASE_PREFIX) and not cluster.startswith("k8s:/")


def cluster_address_endpoints(cluster: str, options: dict[str, str] | None = None,
                              api_client: Any = None, probe: Probe = listening) -> list[str]:
    """The entries (endpoints or resolvable addresses) one cluster address names."""
    options = options or {}
    cluster = cluster.strip()
    if cluster == "local" or cluster.startswith("local:"):
        counts = {k: int(options[k]) for k in ("handlers", "log_nodes") if options.get(k)}
        return local_endpoints(cluster, probe=probe, **counts)
    if is_release(cluster):
        namespace, release = parse_release(cluster)
        if api_client is None and (options.get("kubeconfig") or options.get("kube_context")):
            from services.common.kubernetes_api import default_api_client

            api_client = default_api_client(options.get("kubeconfig") or None,
                                            options.get("kube_context") or None)
        found = release_endpoints(namespace, release, api_client)
        if not found:
            raise ValueError(f"no running pod of release {release!r} in namespace "
                             f"{namespace!r} has a container port named {GRPC_PORT_NAME!r}")
        return found
    return [e for e in cluster.split(",") if e.strip()]


def resolve_endpoints(entries: Iterable[str]) -> list[str]:
    """Every ``host:port`` the entries name, in order, without duplicates."""
    out: list[str] = []
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        if "://" in entry:
            out.extend(asyncio.run(resolver_for(entry).resolve()))
        else:
            split_host_port(entry)  # ValueError without a port
            out.append(entry)
    return list(dict.fromkeys(out))


def endpoints_from_options(options: dict[str, str], api_client: Any = None,
                           probe: Probe = listening) -> list[str]:
    """The endpoints a data source's options name (``endpoints`` and/or ``cluster``)."""
    entries: list[str] = []
    if options.get("endpoints"):
        entries.extend(options["endpoints"].split(","))
    if options.get("cluster"):
        entries.extend(cluster_address_endpoints(options["cluster"], options, api_client,
                                                 probe))
    if not entries:
        raise ValueError("kbroker_metrics needs option 'endpoints' or 'cluster'")
    endpoints = resolve_endpoints(entries)
    if not endpoints:
        raise ValueError(f"no metrics endpoint found for {entries}")
    return endpoints
