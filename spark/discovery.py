"""Which gRPC Metrics endpoints a Spark job reads: from explicit addresses, from the port plan
of a local cluster (``kbroker up``), or from DNS / the Kubernetes API.

Every kbroker process serves ``kbroker.metrics.v1.Metrics`` on its gRPC port, so an endpoint is
simply a service's gRPC ``host:port``. The forms understood:

    endpoints = "127.0.0.1:19090,127.0.0.1:19100"       static addresses
    endpoints = "dns:///kbroker-log.kafka:9090"           every pod behind a headless Service
    endpoints = "k8s:///kbroker-handler.kafka:9090"      ready endpoints from the Kubernetes API
    cluster   = "local"                                   the default plan of ``kbroker up``
    cluster   = "local:29090"                             the same plan from another base port

Several forms may be mixed in ``endpoints`` (comma separated); ``dns:///`` and ``k8s:///``
entries are resolved one by one through :mod:`services.common.discovery`, on the driver, when
the job plans its partitions. A local cluster started with free ports (``base_port=0``, as the
tests do) has no fixed plan: pass its addresses as ``endpoints`` (see :func:`cluster_endpoints`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from services.common.discovery import resolver_for, split_host_port
from services.local_cluster import ClusterSpec, LocalCluster

DEFAULT_BASE_PORT = 19090


def cluster_endpoints(cluster: LocalCluster) -> list[str]:
    """The gRPC address of every service of a planned or running local cluster."""
    return [svc.grpc_address for svc in cluster.services.values()]


def local_plan_endpoints(cluster: str, handlers: int = 2, log_nodes: int = 3) -> list[str]:
    """The addresses ``kbroker up`` uses for ``cluster`` = ``local`` or ``local:<base port>``.

    Nothing is started or contacted: the port plan is a pure function of the spec.
    """
    name, _, port = cluster.partition(":")
    if name != "local":
        raise ValueError(f"unknown cluster {cluster!r}: expected 'local' or 'local:<base port>'")
    base_port = int(port) if port else DEFAULT_BASE_PORT
    if base_port <= 0:
        raise ValueError("a local cluster on free ports has no plan; pass its endpoints instead")
    spec = ClusterSpec(base_port=base_port, handlers=handlers, log_nodes=log_nodes)
    return cluster_endpoints(LocalCluster(spec))


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


def endpoints_from_options(options: dict[str, str]) -> list[str]:
    """The endpoints a data source's options name (``endpoints`` and/or ``cluster``)."""
    entries: list[str] = []
    if options.get("endpoints"):
        entries.extend(options["endpoints"].split(","))
    if options.get("cluster"):
        entries.extend(local_plan_endpoints(
            options["cluster"],
            handlers=int(options.get("handlers", 2)),
            log_nodes=int(options.get("log_nodes", 3)),
        ))
    if not entries:
        raise ValueError("kbroker_metrics needs option 'endpoints' or 'cluster'")
    endpoints = resolve_endpoints(entries)
    if not endpoints:
        raise ValueError(f"no metrics endpoint found for {entries}")
    return endpoints
