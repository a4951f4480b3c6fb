"""The Helm chart, offline: lint, render every numbered CI scenario, validate each resource
against the Kubernetes API schemas (strict: unknown fields are errors), and check what the
deployment relies on: stable identities and volumes for log nodes, probes, pod security,
per-pod advertised addresses and the values schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from .conftest import (
    CHART,
    KUBE_VERSION,
    SCENARIOS,
    RenderError,
    find,
    helm,
    one,
    probe_check,
    render,
    validate_strictly,
)

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("StatefulSet", "Deployment")]


def values_of(scenario: Path) -> dict[str, Any]:
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    override = yaml.safe_load(scenario.read_text()) or {}

    def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
        return out

    return merge(defaults, override)


def test_there_are_the_numbered_scenarios() -> None:
    names = [p.name for p in SCENARIOS]
    assert names[:3] == ["01-single-node-values.yaml", "02-three-log-nodes-values.yaml",
                         "03-external-values.yaml"]


def test_helm_lint_passes_for_every_scenario() -> None:
    for scenario in [None, *SCENARIOS]:
        args = ["lint", "--strict", str(CHART)]
        if scenario is not None:
            args += ["-f", str(scenario)]
        result = helm(*args, check=False)
        assert result.returncode == 0, f"{scenario}: {result.stdout}{result.stderr}"


def test_helm_lint_rejects_a_broken_chart(tmp_path: Path) -> None:
    broken = tmp_path / "values.yaml"
    broken.write_text("log:\n  replicas: many\n")
    result = helm("lint", "--strict", str(CHART), "-f", str(broken), check=False)
    assert result.returncode != 0


def test_every_rendered_resource_is_valid_kubernetes_strictly(scenario: Path) -> None:
    docs = render(scenario)
    assert len(docs) >= 20
    for doc in docs:
        try:
            validate_strictly(doc)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at "
                        f"{'.'.join(map(str, exc.path))}")


def test_strict_validation_catches_a_misplaced_field() -> None:
    docs = render(SCENARIOS[0])
    sts = dict(find(docs, "StatefulSet")[0])
    sts["spec"] = {**sts["spec"], "replica": 3}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBE_VERSION, strict=True)


def test_log_nodes_are_a_statefulset_with_volumes_headless_service_pdb_and_spread(
        scenario: Path) -> None:
    values = values_of(scenario)
    docs = render(scenario)
    sts = one(docs, "StatefulSet", "kb-kbroker-log")
    assert sts["spec"]["replicas"] == values["log"]["replicas"]
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == values["log"]["persistence"]["size"]
    pod = sts["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/lib/kbroker"
    headless = one(docs, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    anti = pod["affinity"]["podAntiAffinity"]
    if values["log"]["antiAffinity"] == "hard":
        assert anti["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        assert anti["preferredDuringSchedulingIgnoredDuringExecution"]
    pdbs = find(docs, "PodDisruptionBudget", "kb-kbroker-log")
    assert len(pdbs) == (1 if values["log"]["pdb"]["enabled"] else 0)
    if pdbs:
        selector = pdbs[0]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_every_container_is_probed_over_grpc_runs_unprivileged_and_requests_resources(
        scenario: Path) -> None:
    for workload in workloads(render(scenario)):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        for c in pod["containers"]:
            where = f"{workload['metadata']['name']}/{c['name']}"
            grpc_ports = {p["containerPort"] for p in c["ports"] if p["name"].startswith("grpc")}
            assert len(grpc_ports) == 1, where
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe_check(c[probe])[0] in grpc_ports, f"{where} {probe}"
            ctx = c["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True, where
            assert ctx["allowPrivilegeEscalation"] is False, where
            assert ctx["capabilities"]["drop"] == ["ALL"], where
            assert {"cpu", "memory"} <= c["resources"]["requests"].keys(), where


def test_every_role_has_a_network_policy_and_its_own_config_map(scenario: Path) -> None:
    values = values_of(scenario)
    docs = render(scenario)
    policies = {d["metadata"]["name"] for d in find(docs, "NetworkPolicy")}
    expected = {f"kb-kbroker-{r}" for r in ROLES} if values["networkPolicy"]["enabled"] else set()
    assert policies == expected
    for role in ROLES:
        cm = one(docs, "ConfigMap", f"kb-kbroker-{role}")
        assert cm["data"]["KBROKER_LOG_LEVEL"] == values["logLevel"]
        assert cm["data"]["KBROKER_CPU_SCHEDULING"] == values["cpuScheduling"]


def test_log_nodes_accept_grpc_only_from_handlers_and_the_replicator() -> None:
    docs = render(SCENARIOS[1])
    policy = one(docs, "NetworkPolicy", "kb-kbroker-log")
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 19200)
    callers = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for p in grpc_rule["from"] if "podSelector" in p}
    assert callers == {"handler", "replicator"}
    # Operators' namespaces from the scenario's grpcClients come on top.
    assert any("namespaceSelector" in p for p in grpc_rule["from"])


def test_the_replicator_accepts_grpc_from_the_log_nodes_asking_for_their_shutdown() -> None:
    docs = render(SCENARIOS[1])
    policy = one(docs, "NetworkPolicy", "kb-kbroker-replicator")
    grpc_rule = next(r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == 19400)
    callers = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
               for p in grpc_rule["from"] if "podSelector" in p}
    assert callers == {"handler", "frontend", "log"}


def test_a_stopping_log_node_has_time_for_its_controlled_shutdown(scenario: Path) -> None:
    """The log pods stop with a controlled shutdown bounded well within their grace period,
    one at a time: rolling updates replace one pod at a time and the PodDisruptionBudget lets
    one be evicted at once."""
    values = values_of(scenario)
    docs = render(scenario)
    sts = one(docs, "StatefulSet", "kb-kbroker-log")
    assert sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    pod = sts["spec"]["template"]["spec"]
    args = _args(pod["containers"][0])
    timeout_ms = int(args["controlled-shutdown-timeout-ms"])
    assert args["controlled-shutdown-enable"] == "true"
    assert timeout_ms == values["log"]["controlledShutdown"]["timeoutSeconds"] * 1000
    assert pod["terminationGracePeriodSeconds"] * 1000 >= timeout_ms + 15_000
    if values["log"]["pdb"]["enabled"]:
        pdb = one(docs, "PodDisruptionBudget", "kb-kbroker-log")
        assert pdb["spec"]["maxUnavailable"] == 1


def test_handlers_scale_with_an_hpa_on_their_deployment() -> None:
    docs = render(SCENARIOS[1])
    hpa = one(docs, "HorizontalPodAutoscaler", "kb-kbroker-handler")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "kb-kbroker-handler"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    # The autoscaler owns the replica count.
    assert "replicas" not in one(docs, "Deployment", "kb-kbroker-handler")["spec"]
    single = render(SCENARIOS[0])
    assert not find(single, "HorizontalPodAutoscaler")
    assert one(single, "Deployment", "kb-kbroker-handler")["spec"]["replicas"] == 1


def test_replicator_may_manage_its_lease_only_and_mounts_its_token() -> None:
    docs = render(SCENARIOS[0])
    role = one(docs, "Role", "kb-kbroker-replicator")
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["coordination.k8s.io"]
        assert rule["resources"] == ["leases"]
        for verb in rule["verbs"]:
            granted.setdefault(verb, set()).update(rule.get("resourceNames", ["*"]))
    assert granted == {"create": {"*"}, "get": {"kb-kbroker-replicator"},
                       "update": {"kb-kbroker-replicator"}}
    binding = one(docs, "RoleBinding", "kb-kbroker-replicator")
    pod = one(docs, "Deployment", "kb-kbroker-replicator")["spec"]["template"]["spec"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    assert pod["automountServiceAccountToken"] is True
    for workload in workloads(docs):
        if workload["metadata"]["name"] != "kb-kbroker-replicator":
            assert workload["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_replicator_is_active_standby_behind_a_service_of_the_ready_one(scenario: Path) -> None:
    values = values_of(scenario)
    docs = render(scenario)
    assert not find(docs, "StatefulSet", "kb-kbroker-replicator")
    deployment = one(docs, "Deployment", "kb-kbroker-replicator")
    assert deployment["spec"]["replicas"] == values["replicator"]["replicas"] == 2
    # Standbys never become ready: a rollout must not wait for them before stopping old pods.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    pod = deployment["spec"]["template"]["spec"]
    assert not pod.get("volumes") or all("persistentVolumeClaim" not in v for v in pod["volumes"])
    assert pod["affinity"]["podAntiAffinity"]
    (container,) = pod["containers"]
    # Ready only while serving the Replicator service (the active replica); alive as a standby.
    assert probe_check(container["readinessProbe"])[1] == "kbroker.replicator.v1.Replicator"
    assert probe_check(container["livenessProbe"])[1] == "liveness"
    assert probe_check(container["startupProbe"])[1] == "liveness"
    args = _args(container)
    assert args["leader-election-lease"] == "kb-kbroker-replicator"
    assert args["leader-election-identity"] == "$(POD_NAME)"
    assert args["leader-election-namespace"] == "$(POD_NAMESPACE)"
    lease = values["replicator"]["leaderElection"]
    assert args["leader-election-lease-duration-ms"] == str(lease["leaseDurationSeconds"] * 1000)
    assert args["leader-election-renew-deadline-ms"] == str(lease["renewDeadlineSeconds"] * 1000)
    assert args["leader-election-retry-period-ms"] == str(lease["retryPeriodSeconds"] * 1000)
    service = one(docs, "Service", "kb-kbroker-replicator")
    assert service["spec"].get("clusterIP") != "None"
    assert not service["spec"].get("publishNotReadyAddresses")
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items())
    # For the other roles, readiness is the server's overall health.
    for workload in workloads(docs):
        if workload["metadata"]["name"] != "kb-kbroker-replicator":
            for c in workload["spec"]["template"]["spec"]["containers"]:
                assert probe_check(c["readinessProbe"])[1] == ""


def test_replicator_routing_is_by_readiness_alone(scenario: Path) -> None:
    # Only the active pod is ever ready: a budget counting ready pods would block evicting it
    # forever, and routing by a label would need the replicator to patch pods. Neither exists.
    docs = render(scenario)
    labels = one(docs, "Deployment", "kb-kbroker-replicator")["spec"]["template"]["metadata"][
        "labels"]
    for pdb in find(docs, "PodDisruptionBudget"):
        assert not pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), (
            pdb["metadata"]["name"])
    service = one(docs, "Service", "kb-kbroker-replicator")
    assert service["spec"]["selector"].items() <= labels.items()
    for role in find(docs, "Role", "kb-kbroker-replicator"):
        assert all("pods" not in rule["resources"] for rule in role["rules"])


def test_only_rendered_probe_services_are_health_names_the_replicator_sets() -> None:
    from services.replicator.server import PROCESS_HEALTH, SERVICE_NAME

    container = one(render(SCENARIOS[0]), "Deployment", "kb-kbroker-replicator")[
        "spec"]["template"]["spec"]["containers"][0]
    assert probe_check(container["readinessProbe"])[1] == SERVICE_NAME
    assert probe_check(container["livenessProbe"])[1] == PROCESS_HEALTH


def _args(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in container["args"])


def test_internal_listener_advertises_pod_dns_names_only() -> None:
    docs = render(SCENARIOS[0])
    sts = one(docs, "StatefulSet", "kb-kbroker-frontend")
    containers = sts["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["kafka"]
    args = _args(containers[0])
    assert args["listeners"] == "PLAINTEXT://0.0.0.0:9092"
    assert args["advertised-listeners"] == (
        "PLAINTEXT://$(POD_NAME).kb-kbroker-frontend-headless.$(POD_NAMESPACE).svc.cluster.local"
        ":9092")
    assert sts["spec"]["serviceName"] == "kb-kbroker-frontend-headless"
    bootstrap = one(docs, "Service", "kb-kbroker-frontend")
    assert [p["port"] for p in bootstrap["spec"]["ports"]] == [9092]
    assert not [s for s in find(docs, "Service") if s["spec"].get("type") == "LoadBalancer"]


def test_external_listener_gets_a_load_balancer_and_a_dns_name_per_pod() -> None:
    docs = render(SCENARIOS[2])
    sts = one(docs, "StatefulSet", "kb-kbroker-frontend")
    containers = {c["name"]: c for c in sts["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"kafka", "kafka-external"}
    internal, external = _args(containers["kafka"]), _args(containers["kafka-external"])
    assert external["advertised-listeners"] == "PLAINTEXT://$(POD_NAME).kafka.example.com:9094"
    assert internal["advertised-listeners"].endswith(".svc.cluster.local:9092")
    assert external["listeners"] == "PLAINTEXT://0.0.0.0:9192"
    lbs = [s for s in find(docs, "Service") if s["spec"].get("type") == "LoadBalancer"]
    assert len(lbs) == 3
    for i in range(3):
        svc = one(docs, "Service", f"kb-kbroker-frontend-{i}-external")
        assert svc["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == (
            f"kb-kbroker-frontend-{i}")
        assert svc["metadata"]["annotations"]["external-dns.alpha.kubernetes.io/hostname"] == (
            f"kb-kbroker-frontend-{i}.kafka.example.com")
        # Broker N: advertised port + N outside, external container port + N inside.
        ports = [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]]
        assert ports == [(9094, "external-0"), (9095, "external-1"), (9096, "external-2")]
        named = {p["name"]: p["containerPort"] for p in containers["kafka-external"]["ports"]}
        assert [named[f"external-{n}"] for n in range(3)] == [9192, 9193, 9194]


def test_external_listener_on_host_ports_advertises_the_node_ip() -> None:
    docs = render(SCENARIOS[3])
    sts = one(docs, "StatefulSet", "kb-kbroker-frontend")
    pod = sts["spec"]["template"]["spec"]
    external = next(c for c in pod["containers"] if c["name"] == "kafka-external")
    assert _args(external)["advertised-listeners"] == "PLAINTEXT://$(HOST_IP):9094"
    host_ports = [p.get("hostPort") for p in external["ports"] if p["name"].startswith("external")]
    assert host_ports == [9094, 9095, 9096]
    assert pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


@pytest.mark.parametrize(("sets", "message"), [
    (("log.replicas=two",), "want integer"),
    (("log.segmentBytes=1",), "additional properties"),
    (("frontend.external.type=NodePort",), "must be one of"),
    (("log.replicas=2",), "default_replication_factor"),
    (("frontend.external.enabled=true",), "frontend.external.domain is required"),
    (("frontend.external.enabled=true", "frontend.external.domain=x.example",
      "frontend.external.containerPort=9093"), "overlap"),
    (("replicator.config.replica_lag=5",), "additional properties"),
    (("replicator.leaderElection.renewDeadlineSeconds=15",), "must exceed renewDeadlineSeconds"),
    (("replicator.leaderElection.retryPeriodSeconds=9",), "1.2 x retryPeriodSeconds"),
    (("log.terminationGracePeriodSeconds=40",), "must exceed log.controlledShutdown"),
])
def test_bad_values_are_refused_with_a_reason(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(RenderError, match=message):
        render(sets=sets)


def test_every_value_is_typed_and_described_in_the_schema() -> None:
    """values.schema.json covers every key of values.yaml, each with a description."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing: list[str] = []

    def walk(node: dict[str, Any], spec: dict[str, Any], path: str) -> None:
        for key, value in node.items():
            prop = spec.get("properties", {}).get(key)
            if prop is None or "description" not in prop:
                missing.append(f"{path}{key}")
                continue
            if isinstance(value, dict) and "properties" in prop:
                walk(value, prop, f"{path}{key}.")

    walk(values, schema, "")
    assert not missing


def test_values_yaml_comments_every_top_level_and_role_key() -> None:
    undocumented = []
    section = ""
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith(("#", "-")):
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            section = line.split(":")[0]
        checked = indent == 0 or (indent == 2 and section in ROLES)
        if checked and not lines[i - 1].lstrip().startswith("#"):
            undocumented.append(f"{section}: {line.strip()}")
    assert not undocumented
