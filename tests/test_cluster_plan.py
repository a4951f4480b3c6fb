"""The local cluster launcher passes each service only flags that service's config reads, and
wires the services to each other's addresses."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from services.common.config import load
from services.common.tls import InternalTls
from services.local_cluster import ClusterSpec, LocalCluster

from .tls_material import internal_tls_dir

CONFIGS = {
    "services.frontend": "FrontendConfig",
    "services.handler": "HandlerConfig",
    "services.log": "LogConfig",
    "services.purgatory": "PurgatoryConfig",
    "services.replicator": "ReplicatorConfig",
}


def config_class(module: str) -> type:
    return getattr(importlib.import_module(module + ".config"), CONFIGS[module])


def test_every_flag_is_read_by_the_service(tmp_path: Path):
    cluster = LocalCluster(ClusterSpec(data_dir=tmp_path, kafka_port=0, base_port=0))
    assert sorted(cluster.services) == sorted(
        ["frontend", "handler-0", "handler-1", "log-0", "log-1", "log-2", "purgatory",
         "replicator"])
    for svc in cluster.services.values():
        config = load(config_class(svc.module), svc.args, env={})
        assert config.grpc_address == svc.grpc_address
        assert config.metrics_port == svc.metrics_port


def test_services_are_wired_to_each_other(tmp_path: Path):
    cluster = LocalCluster(ClusterSpec(data_dir=tmp_path))
    s = cluster.services
    configs = {name: load(config_class(svc.module), svc.args, env={}) for name, svc in s.items()}
    assert configs["frontend"].listen_port == 9092
    assert tuple(configs["frontend"].handlers) == (s["handler-0"].grpc_address,
                                                   s["handler-1"].grpc_address)
    for i in range(3):
        log = configs[f"log-{i}"]
        assert log.node_id == i
        assert log.purgatory_address == s["purgatory"].grpc_address
        assert log.replicator_address == s["replicator"].grpc_address
    assert tuple(configs["replicator"].log_nodes) == tuple(
        f"{i}={s[f'log-{i}'].grpc_address}" for i in range(3))
    for i in range(2):
        handler = configs[f"handler-{i}"]
        assert handler.replicator_address == s["replicator"].grpc_address
        assert handler.purgatory_address == s["purgatory"].grpc_address
        assert handler.advertised == "127.0.0.1:9092"
        assert handler.broker_ports == configs["frontend"].broker_ports == 3


def test_no_port_is_planned_twice(tmp_path: Path):
    """Services bind their ports only once started, so the plan itself must not repeat one
    (a health check of one service would be answered by another)."""
    ports: list[int] = []
    for i in range(20):
        cluster = LocalCluster(ClusterSpec(data_dir=tmp_path / str(i), kafka_port=0,
                                           base_port=0, handlers=2, log_nodes=3))
        ports += [p for svc in cluster.services.values()
                  for p in (svc.grpc_port, svc.metrics_port)]
        ports += range(cluster.kafka_port, cluster.kafka_port + 3)
    assert len(ports) == len(set(ports))


def test_internal_tls_gives_each_service_its_kinds_certificate(tmp_path: Path):
    plain = LocalCluster(ClusterSpec(data_dir=tmp_path / "plain"))
    for svc in plain.services.values():
        assert not InternalTls.of(load(config_class(svc.module), svc.args, env={})).enabled
    assert "plaintext, loopback only" in list(plain.security_lines())[1]

    certs = tmp_path / "certs"
    internal_tls_dir(certs)
    cluster = LocalCluster(ClusterSpec(data_dir=tmp_path / "tls", internal_tls=certs))
    for svc in cluster.services.values():
        tls = InternalTls.of(load(config_class(svc.module), svc.args, env={}))
        assert tls == InternalTls(str(certs / "ca.crt"), str(certs / f"{svc.kind}.crt"),
                                  str(certs / f"{svc.kind}.key"))
        assert tls.common_name() == f"kbroker-{svc.kind}"

    (certs / "log.key").unlink()
    with pytest.raises(FileNotFoundError, match=r"log\.key"):
        LocalCluster(ClusterSpec(data_dir=tmp_path / "tls", internal_tls=certs))
