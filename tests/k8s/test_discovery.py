"""Service discovery: static addresses, headless-Service DNS, and the Kubernetes API's
EndpointSlices (against a recorded answer)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from services.common.discovery import (
    DnsResolver,
    KubernetesResolver,
    StaticResolver,
    changes,
    ready_addresses,
    resolver_for,
    split_host_port,
)

from .conftest import recorded_api_client


def test_static_addresses_resolve_to_themselves() -> None:
    resolver = resolver_for("127.0.0.1:19101,127.0.0.1:19100")
    assert isinstance(resolver, StaticResolver)
    assert asyncio.run(resolver.resolve()) == ("127.0.0.1:19100", "127.0.0.1:19101")
    assert asyncio.run(resolver_for(["a:1", "b:2"]).resolve()) == ("a:1", "b:2")


@pytest.mark.parametrize("bad", ["", "nohost", "host:port", "dns:///a:1,b:2", "udp:///x:1"])
def test_malformed_addresses_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        resolver_for(bad)


def test_headless_service_dns_name_resolves_to_every_pod() -> None:
    async def lookup(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        assert (host, port) == ("kb-handler-headless.ns.svc.cluster.local", 19100)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.2", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::5", port, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", port))]

    resolver = resolver_for("dns:///kb-handler-headless.ns.svc.cluster.local:19100")
    assert isinstance(resolver, DnsResolver)
    resolver = DnsResolver(resolver.host, resolver.port, lookup)
    assert asyncio.run(resolver.resolve()) == (
        "10.0.0.1:19100", "10.0.0.2:19100", "[fd00::5]:19100")


def test_dns_resolution_of_localhost_works_for_real() -> None:
    addresses = asyncio.run(DnsResolver("localhost", 5).resolve())
    assert "127.0.0.1:5" in addresses or "[::1]:5" in addresses


def test_unknown_name_resolves_to_nobody() -> None:
    async def lookup(*_: Any, **__: Any) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    assert asyncio.run(DnsResolver("gone.invalid", 1, lookup).resolve()) == ()


def test_split_host_port_handles_ipv6() -> None:
    assert split_host_port("[fd00::1]:9092") == ("fd00::1", 9092)
    assert split_host_port("kb-log-0.kb-log-headless:19200") == ("kb-log-0.kb-log-headless", 19200)


def test_changes_yields_first_answer_then_only_changes_and_survives_errors() -> None:
    class Flaky:
        def __init__(self) -> None:
            self.answers: list[Any] = [("a:1",), ("a:1",), OSError("api down"), ("a:1", "b:1")]

        async def resolve(self) -> tuple[str, ...]:
            answer = self.answers.pop(0) if self.answers else ("a:1", "b:1")
            if isinstance(answer, Exception):
                raise answer
            return answer

    async def collect() -> list[tuple[str, ...]]:
        seen = []
        async for addresses in changes(Flaky(), interval=0):
            seen.append(addresses)
            if len(seen) == 2:
                break
        return seen

    assert asyncio.run(asyncio.wait_for(collect(), 5)) == [("a:1",), ("a:1", "b:1")]


def test_kubernetes_resolver_lists_ready_endpoints_of_the_service() -> None:
    api_client, pool = recorded_api_client("handler_endpointslices")
    resolver = KubernetesResolver.from_target(
        "k8s:///kbroker-handler-headless.kbroker:19100", api_client)
    assert (resolver.service, resolver.namespace, resolver.port) == (
        "kbroker-handler-headless", "kbroker", 19100)
    # Not ready (starting) and terminating endpoints are left out.
    assert asyncio.run(resolver.resolve()) == ("10.244.1.6:19100", "10.244.2.6:19100")
    (_, path, query), = pool.requests
    assert path == "/apis/discovery.k8s.io/v1/namespaces/kbroker/endpointslices"
    assert query["labelSelector"] == ["kubernetes.io/service-name=kbroker-handler-headless"]


def test_k8s_scheme_builds_a_kubernetes_resolver() -> None:
    resolver = resolver_for("k8s:///kb-handler-headless.prod:19100")
    assert isinstance(resolver, KubernetesResolver)
    assert (resolver.namespace, resolver.port) == ("prod", 19100)


def test_endpoint_without_conditions_counts_as_ready() -> None:
    slices = [{"endpoints": [{"addresses": ["10.1.1.1"]}, {"addresses": ["fd00::2"],
                                                          "conditions": {"ready": True}}]}]
    assert ready_addresses(slices, 7) == ("10.1.1.1:7", "[fd00::2]:7")
