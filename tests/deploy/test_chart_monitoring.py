"""The chart's monitoring, offline: a PodMonitor per role, the PrometheusRule (checked by
`promtool check rules`), the Grafana dashboard ConfigMap, all off by default and each on with
one value; topologySpreadConstraints on every role. Strict validation of the custom resources
is in test_chart.py (scenario 07); the metric names the dashboard and alerts use are checked
against a live cluster in tests/e2e/test_metric_names.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CHART, SCENARIOS, find, one, render

ROLES = ("frontend", "handler", "log", "purgatory", "replicator")
MONITORING = next(p for p in SCENARIOS if p.name.startswith("07-"))
ON = ("metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
      "metrics.grafanaDashboard.enabled=true")
PROMTOOL = shutil.which("promtool")


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in docs
            if d["kind"] in ("StatefulSet", "Deployment")}


def test_monitoring_is_off_by_default_and_each_piece_has_its_switch() -> None:
    kinds = ("PodMonitor", "PrometheusRule")
    assert not [d for d in render() if d["kind"] in kinds]
    assert not find(render(), "ConfigMap", "kb-kbroker-dashboard")
    assert len(find(render(sets=ON[:1]), "PodMonitor")) == len(ROLES)
    assert len(find(render(sets=ON[1:2]), "PrometheusRule")) == 1
    assert find(render(sets=ON[2:]), "ConfigMap", "kb-kbroker-dashboard")


def test_every_role_has_a_pod_monitor_on_its_metrics_port_naming_job_service_instance() -> None:
    docs = render(MONITORING)
    pods = workloads(docs)
    monitors = find(docs, "PodMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {f"kb-kbroker-{r}" for r in ROLES}
    for monitor in monitors:
        role = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        pod = pods[role]["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        endpoints = monitor["spec"]["podMetricsEndpoints"]
        # The frontend's external container is a process of its own, scraped on its own port.
        expected = {"metrics", "metrics-ext"} if role == "frontend" else {"metrics"}
        assert {e["port"] for e in endpoints} == expected <= ports
        for endpoint in endpoints:
            assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
            relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
            assert relabel["job"]["replacement"] == "kb-kbroker"
            assert relabel["service"]["replacement"] == role
            assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_name"]
        # The instance label is what the container calls itself (--instance).
        for container, endpoint in zip(
                sorted(pod["spec"]["containers"], key=lambda c: c["name"]),
                sorted(endpoints, key=lambda e: e["port"]), strict=True):
            replacement = {r["targetLabel"]: r for r in endpoint["relabelings"]}["instance"]
            assert f"--instance={replacement['replacement'].replace('${1}', '$(POD_NAME)')}" \
                in container["args"], container["name"]


def test_alerts_pass_promtool_and_cover_what_a_kafka_operator_watches(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.fail("promtool is missing: make test-deps installs it (Debian's prometheus)")
    (rule,) = find(render(MONITORING), "PrometheusRule")
    groups = rule["spec"]["groups"]
    alerts = {r["alert"]: r for g in groups for r in g["rules"]}
    assert {"KbrokerUnderReplicatedPartitions", "KbrokerOfflinePartitions",
            "KbrokerIsrShrinking", "KbrokerRequestLatencyHigh", "KbrokerPurgatoryGrowing",
            "KbrokerLogDiskNearlyFull", "KbrokerLogDirOffline", "KbrokerNoActiveReplicator",
            "KbrokerHandlerErrorRate"} <= alerts.keys()
    for alert in alerts.values():
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["summary"] and alert["annotations"]["description"]
    # Thresholds come from the values.
    assert alerts["KbrokerRequestLatencyHigh"]["expr"].endswith("> 0.5")
    assert 'job="kb-kbroker", namespace="kbroker"' in alerts["KbrokerOfflinePartitions"]["expr"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alerts)} rules found" in checked.stdout


def test_promtool_refuses_a_broken_expression(tmp_path: Path) -> None:
    if PROMTOOL is None:
        pytest.fail("promtool is missing: make test-deps installs it (Debian's prometheus)")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"alert": "Broken", "expr": "sum by (api (rate(x[5m]))"}]}]}))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode != 0


def test_the_dashboard_config_map_carries_the_json_for_the_grafana_sidecar() -> None:
    docs = render(MONITORING)
    config_map = one(docs, "ConfigMap", "kb-kbroker-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    dashboard = json.loads(config_map["data"]["kbroker.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "kbroker.json").read_text())
    titles = " / ".join(p["title"] for p in dashboard["panels"])
    for wanted in ("Request phases", "Bytes in per topic", "Follower lag", "Parked operations",
                   "Rebalances"):
        assert wanted in titles
    # Panels do not overlap on Grafana's 24-column grid.
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, panel["title"]
        cells |= mine
    # Every query is scoped to the chosen cluster.
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert 'namespace="$namespace"' in target["expr"], panel["title"]


@pytest.mark.parametrize("scenario_name", [p.name for p in SCENARIOS])
def test_every_role_spreads_over_zones_selecting_its_own_pods(scenario_name: str) -> None:
    scenario = CHART / "ci" / scenario_name
    for role, workload in workloads(render(scenario)).items():
        pod = workload["spec"]["template"]
        (constraint,) = pod["spec"]["topologySpreadConstraints"]
        assert constraint["topologyKey"] == "topology.kubernetes.io/zone"
        expected = ("DoNotSchedule" if role == "log" and scenario == MONITORING
                    else "ScheduleAnyway")
        assert constraint["whenUnsatisfiable"] == expected, role
        selector = constraint["labelSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == role
        assert selector.items() <= pod["metadata"]["labels"].items()


def test_spread_constraints_can_be_set_per_role_or_switched_off() -> None:
    sets = ("topologySpreadConstraints=null",
            "handler.topologySpreadConstraints[0].maxSkew=2",
            "handler.topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname",
            "handler.topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule")
    pods = {r: w["spec"]["template"]["spec"] for r, w in workloads(render(sets=sets)).items()}
    assert [c["topologyKey"] for c in pods["handler"]["topologySpreadConstraints"]] \
        == ["kubernetes.io/hostname"]
    assert not [r for r, p in pods.items() if r != "handler" and "topologySpreadConstraints" in p]
