"""Metric names on a live cluster, after a little real traffic (a replicated topic, acks=all
produce, a consumer group): every service's /metrics follows one naming scheme, each help text
names its Kafka JMX equivalent where Kafka has one, and every metric the chart's dashboard and
alerts query is served.

The scheme: every family the services define starts with ``kbroker_`` (prometheus_client's own
process_* and python_* collectors aside); a name carries its unit, last (``_seconds``,
``_bytes``; base units only), and a counter's samples end in ``_total``; histograms measure
seconds or bytes; no ``_created`` series; no sample labels of the scrape target's own
(``job``, ``instance``, ``service``, ``namespace``, ``pod``: Prometheus attaches those, see the
chart's PodMonitors); a family served by several services has one type and one help text."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from services.local_cluster import LocalCluster
from tests.deploy.conftest import CHART, SCENARIOS, find, render

PLATFORM_PREFIXES = ("process_", "python_")
UNITS = ("seconds", "bytes")
NON_BASE_UNITS = {"ms", "millis", "milliseconds", "micros", "microseconds", "minutes", "hours",
                  "kb", "kib", "mb", "mib", "percent"}
TARGET_LABELS = {"job", "instance", "service", "namespace", "pod"}

# Families with a Kafka JMX equivalent, and the JMX name their help text must give.
JMX_EQUIVALENTS = {
    "kbroker_frontend_requests": "RequestsPerSec",
    "kbroker_frontend_request_total_seconds": "TotalTimeMs",
    "kbroker_frontend_request_phase_seconds": "RequestQueueTimeMs",
    "kbroker_frontend_request_bytes": "RequestBytes",
    "kbroker_frontend_error_responses": "ErrorsPerSec",
    "kbroker_frontend_topic_produced_bytes": "BytesInPerSec",
    "kbroker_frontend_topic_fetched_bytes": "BytesOutPerSec",
    "kbroker_frontend_open_connections": "connection-count",
    "kbroker_frontend_successful_authentication": "successful-authentication-total",
    "kbroker_frontend_failed_authentication": "failed-authentication-total",
    "kbroker_frontend_quota_throttle_seconds": "throttle-time",
    "kbroker_frontend_memory_pool_used_bytes": "MemoryPoolUsed",
    "kbroker_frontend_memory_pool_available_bytes": "MemoryPoolAvailable",
    "kbroker_frontend_memory_pool_depleted_seconds": "MemoryPoolDepletedTimeTotal",
    "kbroker_frontend_fetch_sessions": "NumIncrementalFetchSessions",
    "kbroker_frontend_fetch_session_partitions": "NumIncrementalFetchPartitionsCached",
    "kbroker_frontend_fetch_session_evictions": "IncrementalFetchSessionEvictionsPerSec",
    "kbroker_handler_requests": "RequestsPerSec",
    "kbroker_handler_request_seconds": "LocalTimeMs",
    "kbroker_handler_purgatory_wait_seconds": "RemoteTimeMs",
    "kbroker_handler_group_rebalances": "rebalance-count",
    "kbroker_log_appended_bytes": "BytesInPerSec",
    "kbroker_log_read_bytes": "BytesOutPerSec",
    "kbroker_log_partitions": "PartitionCount",
    "kbroker_log_partition_segments": "NumLogSegments",
    "kbroker_log_partition_size_bytes": "Log Size",
    "kbroker_log_partition_log_end_offset": "LogEndOffset",
    "kbroker_log_partition_log_start_offset": "LogStartOffset",
    "kbroker_log_partition_last_stable_offset_lag": "LastStableOffsetLag",
    "kbroker_log_flush_seconds": "LogFlushRateAndTimeMs",
    "kbroker_log_offline_log_dirs": "OfflineLogDirectoryCount",
    "kbroker_log_offline_replicas": "OfflineReplicaCount",
    "kbroker_purgatory_pending_operations": "NumDelayedOperations",
    "kbroker_purgatory_watched_keys": "PurgatorySize",
    "kbroker_purgatory_expired": "ExpiresPerSec",
    "kbroker_replicator_under_replicated_partitions": "UnderReplicatedPartitions",
    "kbroker_replicator_offline_partitions": "OfflinePartitionsCount",
    "kbroker_replicator_isr_shrinks": "IsrShrinksPerSec",
    "kbroker_replicator_isr_expands": "IsrExpandsPerSec",
    "kbroker_log_follower_lag_messages": "ConsumerLag",
    "kbroker_log_replication_in_bytes": "ReplicationBytesInPerSec",
    "kbroker_log_replication_out_bytes": "ReplicationBytesOutPerSec",
    "kbroker_replicator_leader_elections": "LeaderElectionRateAndTimeMs",
    "kbroker_replicator_active": "ActiveControllerCount",
    "kbroker_replicator_live_log_nodes": "ActiveBrokerCount",
    "kbroker_replicator_topics": "GlobalTopicCount",
    "kbroker_replicator_partitions": "GlobalPartitionCount",
}


Scrape = dict[str, list[Metric]]


def traffic(cluster: LocalCluster, topic: str) -> None:
    """A replicated topic, acks=all records, and a consumer group reading them."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=3)],
                        request_timeout=15)[topic].result(timeout=20)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, key=str(i).encode(), value=b"x" * 100)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-group",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    read, deadline = 0, time.monotonic() + 30
    while read < 200 and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            read += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    assert read == 200


def scrape_all(cluster: LocalCluster) -> Scrape:
    out = {}
    for name, svc in cluster.services.items():
        url = f"http://127.0.0.1:{svc.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as reply:
            out[name] = list(text_string_to_metric_families(reply.read().decode()))
    return out


@pytest.fixture(scope="module")
def scraped(cluster: LocalCluster) -> Scrape:
    traffic(cluster, f"metric-names-{time.time_ns()}")
    time.sleep(1.5)  # a replication round: follower lag gauges are set
    return scrape_all(cluster)


def families(scraped: Scrape) -> dict[str, Metric]:
    return {f.name: f for fams in scraped.values() for f in fams}


def served_sample_names(scraped: Scrape) -> set[str]:
    """Every sample name /metrics serves, including those of families without samples yet
    (a labelled family is served as its HELP and TYPE until a label set is used)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count", ""), "info": ("_info",)}
    names = set()
    for family in families(scraped).values():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def convention_breaches(scraped: Scrape) -> list[str]:
    breaches = []
    seen: dict[str, tuple[str, str, str]] = {}
    for service, fams in scraped.items():
        for family in fams:
            name, where = family.name, f"{service}: {family.name}"
            words = name.split("_")
            if not name.startswith(("kbroker_", *PLATFORM_PREFIXES)):
                breaches.append(f"{where}: no kbroker_ prefix")
            if set(words) & NON_BASE_UNITS:
                breaches.append(f"{where}: not a base unit")
            for unit in UNITS:
                if unit in words and words[-1] != unit:
                    breaches.append(f"{where}: unit {unit} not last")
            if family.type in ("histogram", "summary") and words[-1] not in UNITS:
                breaches.append(f"{where}: a {family.type} without its unit")
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    breaches.append(f"{where}: {sample.name}")
                if family.type == "counter" and not sample.name.endswith("_total"):
                    breaches.append(f"{where}: counter sample {sample.name}")
                if TARGET_LABELS & sample.labels.keys():
                    breaches.append(f"{where}: target labels {sample.labels}")
            other = seen.setdefault(name, (family.type, family.documentation, service))
            if other[:2] != (family.type, family.documentation):
                breaches.append(f"{where}: type or help differs from {other[2]}'s")
    return breaches


def test_every_service_follows_one_naming_scheme(scraped: Scrape) -> None:
    assert {n.split("-")[0] for n in scraped} == {"frontend", "handler", "log", "purgatory",
                                                   "replicator"}
    assert convention_breaches(scraped) == []


def test_the_convention_check_finds_what_it_checks(scraped: Scrape) -> None:
    broken = Metric("handler_requests", "x", "counter")
    broken.add_sample("handler_requests_total", {"instance": "a"}, 1.0)
    broken.add_sample("handler_requests_created", {}, 1.0)
    slow = Metric("kbroker_x_latency_ms", "x", "histogram")
    found = convention_breaches({"handler-0": [broken], "log-0": [slow]})
    for breach in ("no kbroker_ prefix", "target labels", "handler_requests_created",
                   "counter sample handler_requests_created", "not a base unit",
                   "a histogram without its unit"):
        assert any(breach in f for f in found), breach
    assert len(found) == 6


def test_help_texts_name_their_kafka_jmx_equivalent(scraped: Scrape) -> None:
    served = families(scraped)
    missing = [name for name in JMX_EQUIVALENTS if name not in served]
    assert missing == []
    unnamed = {name: served[name].documentation for name, jmx in JMX_EQUIVALENTS.items()
               if jmx not in served[name].documentation}
    assert unnamed == {}


# -- the chart's dashboard and alerts ---------------------------------------------------------

_FUNCTION_OR_AGGREGATION = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\s*\(")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)        # strings (label values, regexes)
    expr = re.sub(r"\{[^}]*\}", " ", expr)                   # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)                  # ranges and subqueries
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)                # Grafana variables
    expr = _FUNCTION_OR_AGGREGATION.sub("(", expr)
    return {t for t in re.findall(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", expr)
            if t.lower() not in _KEYWORDS}


def test_metric_names_are_found_in_promql() -> None:
    expr = ('histogram_quantile(0.99, sum by (api, le) (rate(a_seconds_bucket{job="$job", '
            'api!~"Fetch|x"}[5m]))) > 1 and deriv(sum by (kind) (b_ops{k="v"})[15m:1m]) > 0 '
            'or absent(c) / ignoring(phase) group_left d_total')
    assert metric_names(expr) == {"a_seconds_bucket", "b_ops", "c", "d_total"}


def chart_queries() -> dict[str, str]:
    """Every PromQL expression of the chart: alert expressions and dashboard queries, by where
    they are."""
    monitoring = next(p for p in SCENARIOS if p.name.startswith("07-"))
    docs = render(monitoring)
    (rule,) = find(docs, "PrometheusRule")
    out = {f"alert {r['alert']}": r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    dashboard: dict[str, Any] = json.loads((CHART / "dashboards" / "kbroker.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"panel {panel['title']} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            out[f"variable {variable['name']}"] = re.sub(
                r"^label_values\((.*),\s*\w+\)$", r"\1", query)
    return out


def test_every_metric_the_dashboard_and_alerts_use_is_served(scraped: Scrape) -> None:
    served = served_sample_names(scraped)
    queries = chart_queries()
    assert len([q for q in queries if q.startswith("alert")]) >= 8
    assert len([q for q in queries if q.startswith("panel")]) >= 20
    unknown = {where: sorted(metric_names(expr) - served) for where, expr in queries.items()
               if metric_names(expr) - served}
    assert unknown == {}
    used = set().union(*(metric_names(e) for e in queries.values()))
    assert {"kbroker_frontend_request_phase_seconds_bucket",
            "kbroker_replicator_under_replicated_partitions",
            "kbroker_handler_requests_total"} <= used


def test_the_replicator_reports_itself_active(scraped: Scrape) -> None:
    """What the no-active-replicator alert adds up: 1 over the cluster."""
    active = [s.value for f in scraped["replicator"] if f.name == "kbroker_replicator_active"
              for s in f.samples]
    assert active == [1.0]
