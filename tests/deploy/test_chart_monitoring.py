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


# Series as the PodMonitors label them, for the alert unit tests.
TARGET = 'job="kb-kbroker", namespace="kbroker"'

ALERT_CASES = {
    # Offline partitions from minute 2: firing one minute later.
    "offline": ([
        (f'kbroker_replicator_offline_partitions{{{TARGET}, instance="r-0"}}', "0 0 2x20"),
        (f'kbroker_replicator_offline_partitions{{{TARGET}, instance="r-1"}}', "0x22"),
    ], [("1m", "KbrokerOfflinePartitions", []),
        ("4m", "KbrokerOfflinePartitions", [{"severity": "critical"}])]),
    # The active replicator steps down at minute 5; the standby never takes over.
    "no active replicator": ([
        (f'kbroker_replicator_active{{{TARGET}, instance="r-0"}}', "1x5 0x10"),
        (f'kbroker_replicator_active{{{TARGET}, instance="r-1"}}', "0x15"),
    ], [("4m", "KbrokerNoActiveReplicator", []),
        ("8m", "KbrokerNoActiveReplicator", [{"severity": "critical"}]),
        ("8m", "KbrokerSeveralActiveReplicators", [])]),
    # No replicator scraped at all.
    "no replicator": ([
        ('kbroker_replicator_offline_partitions{job="other", namespace="kbroker"}', "0x10"),
    ], [("5m", "KbrokerNoActiveReplicator",
         [{"severity": "critical", "job": "kb-kbroker", "namespace": "kbroker"}])]),
    # Long-poll fetches hold a steady, large count: no alarm. Parked produces keep growing.
    "purgatory": ([
        (f'kbroker_purgatory_pending_operations{{{TARGET}, kind="fetch"}}', "5000x60"),
        (f'kbroker_purgatory_pending_operations{{{TARGET}, kind="produce"}}', "1000+100x60"),
    ], [("45m", "KbrokerPurgatoryGrowing", [{"severity": "warning", "kind": "produce"}])]),
    # Produce and Fetch both take 2.5-5 s; Fetch waits by design and is left out.
    "latency": ([
        *((f'kbroker_frontend_request_total_seconds_bucket{{{TARGET}, api="{api}", le="{le}"}}',
           values) for api in ("Produce", "Fetch")
          for le, values in (("2.5", "0x30"), ("5.0", "0+100x30"), ("+Inf", "0+100x30"))),
    ], [("25m", "KbrokerRequestLatencyHigh", [{"severity": "warning", "api": "Produce"}])]),
    # 10 of 110 Produce answers fail, 1 of 1001 Fetch answers.
    "handler errors": ([
        (f'kbroker_handler_requests_total{{{TARGET}, api="Produce", error_code="0"}}',
         "0+100x30"),
        (f'kbroker_handler_requests_total{{{TARGET}, api="Produce", error_code="6"}}',
         "0+10x30"),
        (f'kbroker_handler_requests_total{{{TARGET}, api="Fetch", error_code="0"}}',
         "0+1000x30"),
        (f'kbroker_handler_requests_total{{{TARGET}, api="Fetch", error_code="1"}}', "0+1x30"),
    ], [("25m", "KbrokerHandlerErrorRate", [{"severity": "warning", "api": "Produce"}])]),
    # log-1's disk fills up; log-0's directory failed.
    "disks": ([
        (f'kbroker_log_dir_total_bytes{{{TARGET}, instance="log-1", log_dir="/d"}}', "1000x20"),
        (f'kbroker_log_dir_free_bytes{{{TARGET}, instance="log-1", log_dir="/d"}}',
         "500-50x20"),
        (f'kbroker_log_dir_total_bytes{{{TARGET}, instance="log-0", log_dir="/d"}}', "1000x20"),
        (f'kbroker_log_dir_free_bytes{{{TARGET}, instance="log-0", log_dir="/d"}}', "900x20"),
        (f'kbroker_log_offline_log_dirs{{{TARGET}, instance="log-0", log_dir="/d"}}', "0 1x19"),
    ], [("6m", "KbrokerLogDiskNearlyFull", []),
        ("15m", "KbrokerLogDiskNearlyFull",
         [{"severity": "warning", "instance": "log-1", "log_dir": "/d"}]),
        ("2m", "KbrokerLogDirOffline",
         [{"severity": "critical", "instance": "log-0", "log_dir": "/d"}])]),
}


@pytest.mark.parametrize("case", sorted(ALERT_CASES))
def test_alerts_fire_when_they_should_and_only_then(case: str, tmp_path: Path) -> None:
    """promtool's rule unit tests over synthetic series (annotations left out: they are
    templates of the value)."""
    if PROMTOOL is None:
        pytest.fail("promtool is missing: make test-deps installs it (Debian's prometheus)")
    (rule,) = find(render(MONITORING), "PrometheusRule")
    groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"}
                              for r in g["rules"]]} for g in rule["spec"]["groups"]]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    series, expectations = ALERT_CASES[case]
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m",
                   "input_series": [{"series": s, "values": v} for s, v in series],
                   "alert_rule_test": [{"eval_time": at, "alertname": name,
                                        "exp_alerts": [{"exp_labels": labels}
                                                       for labels in alerts]}
                                       for at, name, alerts in expectations]}]}))
    tested = subprocess.run([PROMTOOL, "test", "rules", "tests.yaml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert tested.returncode == 0, tested.stdout + tested.stderr
