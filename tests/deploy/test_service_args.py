"""Every argument and environment variable the rendered manifests give a service is one the
service reads: each container's command names a service module, and its flags plus its
KBROKER_* variables (its own and its ConfigMap's) load into that service's config class with
services.common.config.load, unknown flags being errors there. The loaded addresses are then
checked against the Services and ports they must reach."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from typing import Any

import pytest

from services.common.config import ENV_PREFIX, env_name, load

from .conftest import ROOT, SCENARIOS, find, one, probe_check, render

REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# Variables read outside the config classes, and where.
RUNTIME_VARIABLES = {name: ROOT / "services" / "common" / "runtime.py"
                     for name in ("KBROKER_LOG_LEVEL", "KBROKER_CPU_SCHEDULING")}
POD_INDEX = 2
NAMESPACE = "kbroker"
HOST_IP = "10.1.2.3"


@dataclasses.dataclass
class Launch:
    """One container as the kubelet would start it: module, arguments, environment."""

    where: str
    module: str
    args: list[str]
    env: dict[str, str]
    container: dict[str, Any]
    pod_name: str


def config_class(module: str) -> type:
    config_module = importlib.import_module(f"{module}.config")
    classes = [c for c in vars(config_module).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c)
               and c.__module__ == config_module.__name__ and c.__name__.endswith("Config")]
    assert len(classes) == 1, f"{module}.config: {classes}"
    return classes[0]


def field_value(pod_name: str, source: dict[str, Any]) -> str:
    path = source["fieldRef"]["fieldPath"]
    values = {
        "metadata.name": pod_name,
        "metadata.namespace": NAMESPACE,
        "status.hostIP": HOST_IP,
        "metadata.labels['apps.kubernetes.io/pod-index']": str(POD_INDEX),
    }
    assert path in values, f"unexpected downward API field {path}"
    return values[path]


def expand(text: str, env: dict[str, str], where: str) -> str:
    def sub(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"{where}: $({match.group(1)}) is not defined"
        return env[match.group(1)]
    return REFERENCE.sub(sub, text)


def launches(docs: list[dict[str, Any]]) -> list[Launch]:
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in find(docs, "ConfigMap")}
    out = []
    for workload in [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]:
        name = workload["metadata"]["name"]
        pod_name = f"{name}-{POD_INDEX}" if workload["kind"] == "StatefulSet" else f"{name}-x1"
        for c in workload["spec"]["template"]["spec"]["containers"]:
            where = f"{name}/{c['name']}"
            command = c["command"]
            assert command[:2] == ["python", "-m"] and len(command) == 3, where
            env: dict[str, str] = {}
            for source in c.get("envFrom", []):
                env.update(config_maps[source["configMapRef"]["name"]])
            for var in c.get("env", []):
                if "valueFrom" in var:
                    env[var["name"]] = field_value(pod_name, var["valueFrom"])
                else:
                    env[var["name"]] = expand(var["value"], env, where)
            args = [expand(a, env, where) for a in c.get("args", [])]
            out.append(Launch(where, command[2], args, env, c, pod_name))
    return out


@pytest.fixture(params=SCENARIOS, ids=[p.name.removesuffix("-values.yaml") for p in SCENARIOS])
def rendered(request: pytest.FixtureRequest) -> tuple[list[dict[str, Any]], list[Launch]]:
    docs = render(request.param)
    return docs, launches(docs)


def test_every_container_runs_a_service_module(rendered: Any) -> None:
    _, all_launches = rendered
    modules = {launch.module for launch in all_launches}
    assert modules == {f"services.{s}" for s in
                       ("frontend", "handler", "log", "purgatory", "replicator")}
    for launch in all_launches:
        assert (ROOT / launch.module.replace(".", "/") / "__main__.py").exists(), launch.where


def test_every_kbroker_variable_is_a_config_field_or_read_by_the_runtime(rendered: Any) -> None:
    _, all_launches = rendered
    for launch in all_launches:
        fields = {env_name(f.name) for f in dataclasses.fields(config_class(launch.module))}
        for var in launch.env:
            if not var.startswith(ENV_PREFIX):
                continue
            if var in RUNTIME_VARIABLES:
                assert var in RUNTIME_VARIABLES[var].read_text()
                continue
            assert var in fields, f"{launch.where}: {var} is read by nobody"


def test_other_variables_only_feed_argument_references(rendered: Any) -> None:
    _, all_launches = rendered
    for launch in all_launches:
        raw = " ".join([*launch.container.get("args", []),
                        *(v.get("value", "") for v in launch.container.get("env", []))])
        used = set(REFERENCE.findall(raw))
        for var in launch.env:
            if not var.startswith(ENV_PREFIX):
                assert var in used, f"{launch.where}: {var} is set but never used"


def test_arguments_and_environment_load_into_the_service_config(rendered: Any) -> None:
    _, all_launches = rendered
    for launch in all_launches:
        cls = config_class(launch.module)
        try:
            config = load(cls, launch.args, env=launch.env)
        except SystemExit:
            pytest.fail(f"{launch.where}: {cls.__name__} rejects {launch.args}")
        for var, raw in launch.env.items():
            field = var.removeprefix(ENV_PREFIX).lower()
            if var.startswith(ENV_PREFIX) and var not in RUNTIME_VARIABLES:
                value = getattr(config, field)
                shown = ",".join(value) if isinstance(value, tuple) else str(value)
                assert shown.lower() == raw.lower(), f"{launch.where}: {var}"


def test_a_flag_no_service_reads_is_caught() -> None:
    launch = launches(render(SCENARIOS[0]))[0]
    with pytest.raises(SystemExit):
        load(config_class(launch.module), [*launch.args, "--no-such-setting=1"],
             env=launch.env)


def _configs(all_launches: list[Launch], module: str) -> list[Any]:
    return [load(config_class(launch.module), launch.args, env=launch.env)
            for launch in all_launches if launch.module == module]


def _port_of(container: dict[str, Any], name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def _service_port(docs: list[dict[str, Any]], host: str, port: int) -> dict[str, Any]:
    """The Service a cluster DNS name resolves to, and its port entry for ``port``."""
    service_name, namespace, svc, *_ = host.split(".")
    assert (namespace, svc) == (NAMESPACE, "svc"), host
    service = one(docs, "Service", service_name)
    return next(p for p in service["spec"]["ports"] if p["port"] == port)


def test_bind_addresses_match_the_declared_ports_and_probes(rendered: Any) -> None:
    _, all_launches = rendered
    for launch in all_launches:
        config = load(config_class(launch.module), launch.args, env=launch.env)
        grpc_port = int(config.grpc_address.rsplit(":", 1)[1])
        c = launch.container
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert grpc_port == probe_check(c[probe])[0], launch.where
        declared = {p["containerPort"] for p in c["ports"]}
        assert {grpc_port, config.metrics_port} <= declared, launch.where


def test_addresses_between_services_reach_the_right_services(rendered: Any) -> None:
    docs, all_launches = rendered
    log_sts = one(docs, "StatefulSet", "kb-kbroker-log")
    log_container = log_sts["spec"]["template"]["spec"]["containers"][0]
    (replicator,) = _configs(all_launches, "services.replicator")
    assert len(replicator.log_nodes) == log_sts["spec"]["replicas"]
    # The replicator tells the purgatory about high watermark moves, as the log nodes do.
    host, port = replicator.purgatory_address.rsplit(":", 1)
    assert _service_port(docs, host, int(port))["targetPort"] == "grpc"
    assert host.split(".")[0] == "kb-kbroker-purgatory"
    # Each replica competes for the Lease under its own pod name, in its namespace.
    (launch,) = [x for x in all_launches if x.module == "services.replicator"]
    assert replicator.leader_election_identity == launch.pod_name
    assert replicator.leader_election_namespace == NAMESPACE
    assert replicator.leader_election_lease == "kb-kbroker-replicator"
    for i, entry in enumerate(replicator.log_nodes):
        node_id, address = entry.split("=")
        host, port = address.rsplit(":", 1)
        assert node_id == str(i)
        pod, service, *_ = host.split(".")
        assert pod == f"kb-kbroker-log-{i}" and service == log_sts["spec"]["serviceName"]
        assert int(port) == _port_of(log_container, "grpc")
    for log in _configs(all_launches, "services.log"):
        assert log.node_id == POD_INDEX
        assert log.data_dir.startswith("/var/lib/kbroker/")
        for address in (log.purgatory_address, log.replicator_address):
            host, port = address.rsplit(":", 1)
            assert _service_port(docs, host, int(port))["targetPort"] == "grpc"
        assert log.replicator_address.split(".")[0] == "kb-kbroker-replicator"
    for handler in _configs(all_launches, "services.handler"):
        for address in (handler.purgatory_address, handler.replicator_address):
            host, port = address.rsplit(":", 1)
            assert _service_port(docs, host, int(port))["targetPort"] == "grpc"
    handler_port = _port_of(
        one(docs, "Deployment", "kb-kbroker-handler")["spec"]["template"]["spec"]
        ["containers"][0], "grpc")
    for frontend in _configs(all_launches, "services.frontend"):
        assert frontend.broker_ports == log_sts["spec"]["replicas"]
        (target,) = frontend.handlers
        host, port = target.removeprefix("dns:///").rsplit(":", 1)
        service = _service_port(docs, host, int(port))
        assert service["targetPort"] == "grpc" and int(port) == handler_port


def test_internal_advertised_address_is_the_pods_own_dns_name(rendered: Any) -> None:
    docs, all_launches = rendered
    for launch in all_launches:
        if launch.where != "kb-kbroker-frontend/kafka":
            continue
        config = load(config_class(launch.module), launch.args, env=launch.env)
        bound = _listeners(config.listeners)
        advertised = _listeners(config.advertised_listeners)
        assert bound.keys() == advertised.keys()
        for protocol, (host, port) in advertised.items():
            pod, service, namespace, *_ = host.split(".")
            assert pod == launch.pod_name
            assert one(docs, "StatefulSet", "kb-kbroker-frontend")["spec"][
                "serviceName"] == service
            assert namespace == NAMESPACE
            # Broker N on the bound port + N, declared, advertised at the same port.
            first = bound[protocol][1]
            declared = sorted(p["containerPort"] for p in launch.container["ports"]
                              if p["containerPort"] in range(first, first + config.broker_ports))
            assert declared == [first + n for n in range(config.broker_ports)]
            assert port == first


def _listeners(text: str) -> dict[str, tuple[str, int]]:
    """Kafka's listener list form, PROTOCOL://host:port,... by protocol."""
    out = {}
    for entry in text.split(","):
        protocol, address = entry.split("://")
        host, port = address.rsplit(":", 1)
        out[protocol] = (host, int(port))
    return out


def test_config_keys_in_the_schema_are_config_fields() -> None:
    schema = json.loads((ROOT / "deploy/k8s/values.schema.json").read_text())
    for role in ("frontend", "handler", "log", "purgatory", "replicator"):
        keys = set(schema["properties"][role]["properties"]["config"]["properties"])
        fields = {f.name for f in dataclasses.fields(config_class(f"services.{role}"))}
        assert keys <= fields, f"{role}: {keys - fields}"
