"""Where the instances of a role are: one interface over the ways a deployment names them.

A role's address is written as one of

    host:port[,host:port...]        static addresses (the local cluster, tests)
    dns:///name:port                every address a DNS name resolves to: a Kubernetes
                                    headless Service names each ready pod
    k8s:///service.namespace:port   the ready endpoints of a Service, from the Kubernetes API
                                    (EndpointSlices)

and a :class:`Resolver` turns it into the current ``host:port`` of every instance. Callers that
keep one channel per instance (load balancing over handlers) re-resolve with :func:`changes` and
open or close channels as instances come and go. A resolver never raises for "nothing found":
an empty tuple means no instance is there right now.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .kubernetes_api import current_namespace, default_api_client

DNS_SCHEME = "dns:///"
K8S_SCHEME = "k8s:///"

# loop.getaddrinfo's signature: (host, port, family=..., type=..., ...).
Lookup = Callable[..., Awaitable[list[tuple[Any, ...]]]]


class Resolver(Protocol):
    """The current addresses of a role's instances."""

    async def resolve(self) -> tuple[str, ...]:
        """Every instance's ``host:port``, sorted; empty when none is there."""
        ...


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its parts; ValueError without a port."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not host:port: {address!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


@dataclass(frozen=True, slots=True)
class StaticResolver:
    """Fixed addresses, as given."""

    addresses: tuple[str, ...]

    async def resolve(self) -> tuple[str, ...]:
        return tuple(sorted(self.addresses))


@dataclass(frozen=True, slots=True)
class DnsResolver:
    """Every A/AAAA record of ``host``: a headless Service resolves to each ready pod's IP."""

    host: str
    port: int
    lookup: Lookup | None = None

    async def resolve(self) -> tuple[str, ...]:
        lookup = self.lookup or asyncio.get_running_loop().getaddrinfo
        try:
            infos = await lookup(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            return ()
        return tuple(sorted({join_host_port(info[4][0], self.port) for info in infos}))


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


def resolver_for(targets: str | Sequence[str]) -> Resolver:
    """The resolver for a role's address (see the module docstring for the forms)."""
    entries = [targets] if isinstance(targets, str) else list(targets)
    entries = [e.strip() for entry in entries for e in entry.split(",") if e.strip()]
    if not entries:
        raise ValueError("no address given")
    schemes = [e for e in entries if "://" in e]
    if not schemes:
        for entry in entries:
            split_host_port(entry)
        return StaticResolver(tuple(entries))
    if len(entries) > 1:
        raise ValueError(f"a dns:/// or k8s:/// address stands alone: {entries}")
    (target,) = entries
    if target.startswith(DNS_SCHEME):
        host, port = split_host_port(target.removeprefix(DNS_SCHEME))
        return DnsResolver(host, port)
    if target.startswith(K8S_SCHEME):
        return KubernetesResolver.from_target(target)
    raise ValueError(f"unknown address scheme: {target!r}")


async def changes(resolver: Resolver, interval: float) -> AsyncIterator[tuple[str, ...]]:
    """The resolver's addresses now, then again each time they change (checked every
    ``interval`` seconds). A failed resolution keeps the last answer rather than dropping every
    instance on a transient DNS or API error."""
    last: tuple[str, ...] | None = None
    while True:
        try:
            current = await resolver.resolve()
        except (OSError, RuntimeError):
            current = last if last is not None else ()
        if current != last:
            last = current
            yield current
        await asyncio.sleep(interval)
