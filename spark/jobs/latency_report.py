"""The request-latency report: one snapshot of every service's metrics, turned into tables, a
chart and a summary.

Read once (``kbroker_metrics``, cached, so every table comes from the same instant), then:

    metrics.parquet     every sample read (the raw snapshot)
    requests.parquet    per API: requests, request/response bytes, error responses (frontend)
    latency.parquet     per API and phase (request_queue, local, remote, response_queue,
                        response_send, total: Kafka's RequestMetrics): count, mean,
                        p50/p99/p999 seconds, interpolated inside the frontend histogram buckets
                        consistently with the observed mean (spark.histogram), summed over
                        frontend instances first
    topics.parquet      per topic: bytes in and out at the frontends (Kafka's BytesInPerSec /
                        BytesOutPerSec: produced records appended, records fetched), as totals
                        and as bytes per second averaged since each frontend started; bytes
                        and batches appended and bytes read on the log nodes (appends count
                        every replica: leader appends and follower fetches)
    purgatory.parquet   per operation kind: pending now, completed, expired, p99 park time
    consumer_lag.parquet  per consumer group and partition: committed offset, high watermark
                        and lag, from the group offsets (spark.group_offsets, asked of a
                        handler over gRPC)
    client_latency.parquet  client-side latency the clients pushed (KIP-714, handler flag
                        --client-telemetry-metrics): per metric (producer.node.request.latency.avg,
                        consumer.fetch.manager.fetch.latency.max, ...), client and broker
                        (node_id), in seconds; empty without a subscription
    latency.png         per API, linear scales: the mean time of each phase stacked (the phases
                        of a request add up to its total, so the stack is the mean total time),
                        and p50/p99/p999 of the total time; with client telemetry, a third
                        panel: the clients' own request latencies (mean over clients of their
                        averages, and the largest maximum) beside the broker's mean total time
                        of Produce and Fetch
    report.md           the tables above in Markdown

Run (local[*] by default; spark-submit: see spark/README.md)::

    python -m spark.jobs.latency_report --cluster local --output reports/latency
    python -m spark.jobs.latency_report --endpoints 127.0.0.1:19090,127.0.0.1:19100 ...
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark.histogram import parse_le, quantiles
from spark.jobs.cluster_args import add_cluster_arguments, cluster_options

QUANTILES = {"p50": 0.5, "p99": 0.99, "p999": 0.999}
PHASES = ("request_queue", "local", "remote", "response_queue", "response_send", "total")


@dataclass(frozen=True, slots=True)
class Report:
    """What the job wrote, and the small tables it computed (as plain rows)."""

    output: Path
    requests: list[dict[str, Any]]
    latency: list[dict[str, Any]]
    topics: list[dict[str, Any]]
    purgatory: list[dict[str, Any]]
    consumer_lag: list[dict[str, Any]]
    client_latency: list[dict[str, Any]]


def _quantiles(buckets: list[Any], total: float | None) -> tuple[float | None, ...]:
    pairs = [(parse_le(b["le"]), float(b["count"])) for b in buckets]
    return tuple(None if math.isnan(v) else v
                 for v in quantiles(list(QUANTILES.values()), pairs, total))


def _histogram_summary(
    raw: Any, family: str, keys: dict[str, Any], extra_filter: Any | None = None,
) -> Any:
    """Per group of ``keys`` (name -> column): count, mean and quantiles of a histogram family
    whose samples are summed over instances (and over any label not in ``keys``)."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import DoubleType, StructField, StructType

    quantile_type = StructType([StructField(k, DoubleType()) for k in QUANTILES])
    # A lambda: Spark would otherwise read _quantiles' type hints as a pandas UDF declaration.
    bucket_quantiles = F.udf(lambda buckets, total: _quantiles(buckets, total), quantile_type)
    rows = raw.filter(F.col("family") == family)
    if extra_filter is not None:
        rows = rows.filter(extra_filter)
    keyed = rows.select(
        *[col.alias(name) for name, col in keys.items()],
        F.col("sample"), F.col("labels")["le"].alias("le"), F.col("value"),
    )
    names = list(keys)
    buckets = (
        keyed.filter(F.col("sample") == f"{family}_bucket")
        .groupBy(*names, "le").agg(F.sum("value").alias("count"))
        .groupBy(*names).agg(F.collect_list(F.struct("le", "count")).alias("buckets"))
    )
    sums = (
        keyed.filter(F.col("sample").isin(f"{family}_sum", f"{family}_count"))
        .groupBy(*names).pivot("sample", [f"{family}_count", f"{family}_sum"]).sum("value")
        .withColumnRenamed(f"{family}_count", "count")
        .withColumnRenamed(f"{family}_sum", "sum_seconds")
    )
    return (
        buckets.join(sums, names, "left")
        .withColumn("q", bucket_quantiles("buckets", "sum_seconds"))
        .select(
            *names,
            F.col("count").cast("long").alias("count"),
            F.when(F.col("count") > 0, F.col("sum_seconds") / F.col("count"))
            .alias("mean_seconds"),
            *[F.col("q")[k].alias(f"{k}_seconds") for k in QUANTILES],
        )
    )


def compute(raw: Any) -> dict[str, Any]:
    """The report's DataFrames from a DataFrame of metric samples (the data source's schema)."""
    from pyspark.sql import functions as F  # noqa: N812

    def per_api(sample: str, name: str) -> Any:
        return (
            raw.filter(F.col("sample") == sample)
            .groupBy(F.col("labels")["api"].alias("api"))
            .agg(F.sum("value").cast("long").alias(name))
        )

    requests = per_api("kbroker_frontend_requests_total", "requests")
    for sample, name in (
        ("kbroker_frontend_request_bytes_total", "request_bytes"),
        ("kbroker_frontend_response_bytes_total", "response_bytes"),
        ("kbroker_frontend_error_responses_total", "error_responses"),
    ):
        requests = requests.join(per_api(sample, name), "api", "left")
    requests = requests.fillna(0).orderBy(F.desc("requests"), "api")

    phases = _histogram_summary(
        raw, "kbroker_frontend_request_phase_seconds",
        {"api": F.col("labels")["api"], "phase": F.col("labels")["phase"]},
    )
    totals = _histogram_summary(
        raw, "kbroker_frontend_request_total_seconds",
        {"api": F.col("labels")["api"], "phase": F.lit("total")},
    )
    # The frontend binds every API's children up front; APIs never called have no latency.
    phase_order = F.array_position(F.array(*[F.lit(p) for p in PHASES]), F.col("phase"))
    latency = (phases.unionByName(totals).filter(F.col("count") > 0)
               .orderBy("api", phase_order))

    def per_topic(sample: str, name: str) -> Any:
        return (
            raw.filter(F.col("sample") == sample)
            .groupBy(F.col("labels")["topic"].alias("topic"))
            .agg(F.sum("value").cast("long").alias(name))
        )

    def per_topic_rate(sample: str, name: str) -> Any:
        # Counters since each process started: bytes / uptime per instance, then summed.
        uptime = (F.unix_millis("timestamp") - F.unix_millis("process_start")) / 1000
        return (
            raw.filter(F.col("sample") == sample)
            .withColumn("rate", F.when(uptime > 0, F.col("value") / uptime).otherwise(0.0))
            .groupBy(F.col("labels")["topic"].alias("topic"))
            .agg(F.sum("rate").alias(name))
        )

    topics = per_topic("kbroker_frontend_topic_produced_bytes_total", "bytes_in")
    for sample, name in (
        ("kbroker_frontend_topic_fetched_bytes_total", "bytes_out"),
        ("kbroker_log_appended_bytes_total", "appended_bytes"),
        ("kbroker_log_appended_batches_total", "appended_batches"),
        ("kbroker_log_read_bytes_total", "read_bytes"),
    ):
        topics = topics.join(per_topic(sample, name), "topic", "full")
    for sample, name in (
        ("kbroker_frontend_topic_produced_bytes_total", "bytes_in_per_s"),
        ("kbroker_frontend_topic_fetched_bytes_total", "bytes_out_per_s"),
    ):
        topics = topics.join(per_topic_rate(sample, name), "topic", "full")
    topics = topics.fillna(0).orderBy(F.desc("bytes_in"), F.desc("appended_bytes"), "topic")

    def per_kind(sample: str, name: str) -> Any:
        return (
            raw.filter(F.col("sample") == sample)
            .groupBy(F.col("labels")["kind"].alias("kind"))
            .agg(F.sum("value").cast("long").alias(name))
        )

    purgatory = per_kind("kbroker_purgatory_pending_operations", "pending")
    for sample, name in (
        ("kbroker_purgatory_completed_total", "completed"),
        ("kbroker_purgatory_expired_total", "expired"),
    ):
        purgatory = purgatory.join(per_kind(sample, name), "kind", "full")
    delays = _histogram_summary(
        raw, "kbroker_purgatory_completion_delay_seconds", {"kind": F.col("labels")["kind"]},
    ).select("kind", F.col("p99_seconds").alias("p99_park_seconds"))
    purgatory = (
        purgatory.join(delays, "kind", "left")
        .fillna(0, subset=["pending", "completed", "expired"]).orderBy("kind")
    )
    return {"requests": requests, "latency": latency, "topics": topics, "purgatory": purgatory,
            "client_latency": client_latency(raw)}


LAST_PUSH = "kbroker_handler_client_last_push_timestamp_seconds"


def client_latency(raw: Any) -> Any:
    """Client-side latency pushed by clients (KIP-714, ``kbroker_client_*`` on the handlers):
    every gauge in seconds whose name speaks of latency or time (request latency per broker,
    produce and fetch latency, queue time, ...), per metric, client and broker (``node_id``),
    each client's value taken from the handler that heard from it last."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F  # noqa: N812

    client = F.col("labels")["client_instance_id"]
    pushes = (raw.filter(F.col("sample") == LAST_PUSH)
              .select("endpoint", client.alias("client_instance_id"),
                      F.col("value").alias("pushed_at")))
    newest = (pushes.withColumn("rank", F.row_number().over(
        Window.partitionBy("client_instance_id").orderBy(F.desc("pushed_at"), "endpoint")))
        .filter(F.col("rank") == 1).select("endpoint", "client_instance_id"))
    gauges = (raw.filter((F.col("type") == "gauge") & F.col("sample").startswith("kbroker_client_")
                         & F.col("sample").endswith("_seconds")
                         & F.col("sample").rlike("_(latency|time)_"))
              .select("endpoint", "sample", client.alias("client_instance_id"),
                      F.col("labels")["client_id"].alias("client_id"),
                      F.coalesce(F.col("labels")["node_id"], F.lit("")).alias("node_id"),
                      F.col("value").alias("latency_seconds")))
    return (gauges.join(newest, ["endpoint", "client_instance_id"])
            .select(F.regexp_replace("sample", "^kbroker_client_", "").alias("metric"),
                    "client_id", "client_instance_id", "node_id", "latency_seconds")
            .orderBy("metric", "client_id", "client_instance_id", "node_id"))


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_(none)_\n"
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value * 1000:.3f} ms" if math.isfinite(value) else "-"
        return "-" if value is None else str(value)

    header = [c.replace("_seconds", " (ms)") for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _markdown_counts(rows: list[dict[str, Any]]) -> str:
    # Counts and bytes tables: no float formatting as milliseconds.
    def text(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    return _markdown_table([{k: text(v) for k, v in r.items()} for r in rows])


def client_summary(latency: list[dict[str, Any]], clients: list[dict[str, Any]]
                   ) -> list[tuple[str, float]]:
    """(label, milliseconds) for the client panel: per client metric the mean over clients and
    brokers (``_avg``) or the largest (``_max``), and the broker's mean total time of the APIs
    those clients call."""
    by_metric: dict[str, list[float]] = {}
    for row in clients:
        by_metric.setdefault(row["metric"].removesuffix("_seconds"), []).append(
            row["latency_seconds"] * 1000)
    out = []
    for metric, values in sorted(by_metric.items()):
        value = max(values) if metric.endswith("_max") else sum(values) / len(values)
        out.append((f"client {metric}", value))
    totals = {r["api"]: r for r in latency if r["phase"] == "total" and r["count"]}
    for api in ("Produce", "Fetch"):
        if api in totals and totals[api]["mean_seconds"] is not None:
            out.append((f"broker {api} total (mean)", totals[api]["mean_seconds"] * 1000))
    return out


def write_chart(latency: list[dict[str, Any]], path: Path,
                clients: list[dict[str, Any]] | None = None) -> None:
    """Two panels per API, linear scales: the phases' mean times stacked (adding up to the mean
    total time, marked by a dot), and p50/p99/p999 of the total time; a third with the
    clients' own latencies when they pushed any."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = sorted((r for r in latency if r["phase"] == "total" and r["count"]),
                    key=lambda r: -(r["mean_seconds"] or 0.0))
    apis = [r["api"] for r in totals]
    summary = client_summary(latency, clients or []) if clients else []
    if summary:
        fig, (left, right, third) = plt.subplots(
            1, 3, figsize=(22, 5.5 + len(apis) * 0.05),
            gridspec_kw={"width_ratios": [1, 1, 0.9]})
        labels = [label for label, _ in summary]
        colors = ["tab:blue" if label.startswith("client") else "tab:gray" for label in labels]
        third.barh(range(len(summary)), [v for _, v in summary], color=colors)
        third.set_yticks(range(len(summary)), labels, fontsize=8)
        third.invert_yaxis()
        third.set_xlabel("ms")
        third.set_xlim(left=0)
        third.set_title("Client-side latency (KIP-714) beside the broker's")
        third.grid(axis="x", alpha=0.3)
    else:
        fig, (left, right) = plt.subplots(1, 2, figsize=(15, 5.5 + len(apis) * 0.05))
    phases = [p for p in PHASES if p != "total"]
    bottoms = [0.0] * len(apis)
    for phase in phases:
        by_api = {r["api"]: r for r in latency if r["phase"] == phase}
        values = [((by_api.get(a) or {}).get("mean_seconds") or 0.0) * 1000 for a in apis]
        left.bar(range(len(apis)), values, 0.7, bottom=bottoms, label=phase)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    means = [(r["mean_seconds"] or 0.0) * 1000 for r in totals]
    left.scatter(range(len(apis)), means, color="black", marker="_", s=300, zorder=3,
                 label="total (mean)")
    for x, mean in enumerate(means):
        # Small totals vanish on a linear scale: their number stays readable above the bar.
        left.annotate(f"{mean:.3g}", (x, mean), textcoords="offset points", xytext=(0, 3),
                      ha="center", fontsize=8)
    left.set_xticks(range(len(apis)), apis, rotation=45, ha="right")
    left.set_ylabel("mean time (ms)")
    left.set_title("Mean time per request phase (stacked = total)")
    width = 0.27
    for i, key in enumerate(QUANTILES):
        values = [(r[f"{key}_seconds"] or 0.0) * 1000 for r in totals]
        right.bar([x + (i - 1) * width for x in range(len(apis))], values, width, label=key)
    right.set_xticks(range(len(apis)), apis, rotation=45, ha="right")
    right.set_ylabel("total time (ms)")
    right.set_title("Request total time per API")
    for axis in (left, right):
        axis.set_ylim(bottom=0)
        axis.grid(axis="y", alpha=0.3)
        if apis:
            axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_markdown(report: Report, path: Path) -> None:
    parts = [
        "# kbroker request-latency report\n",
        "Quantiles are interpolated inside histogram buckets consistently with the observed "
        "mean, so they are estimates bounded by the bucket edges; the last finite bucket is "
        "30 s. The phases of a request add up to its total time, and so do their means.\n",
        "## Requests per API (frontend)\n", _markdown_counts(report.requests),
        "## Latency per API and phase\n", _markdown_table(report.latency),
        "## Throughput per topic\n",
        "bytes_in / bytes_out: record bytes produced (appended) and fetched through the "
        "frontends (BytesInPerSec / BytesOutPerSec), totals and per second averaged since "
        "each frontend started; appended / read: on the log nodes, every replica.\n",
        _markdown_counts(report.topics),
        "## Purgatory pressure\n", _markdown_table(report.purgatory),
        "## Client-side latency (pushed by clients, KIP-714)\n",
        "What the clients measured themselves, per broker (node_id) where they report one; "
        "compare with the broker's total time per API above.\n",
        _markdown_table(report.client_latency),
        "## Consumer lag per group and partition\n",
        "Committed offset against the partition's high watermark (kafka-consumer-groups LAG).\n",
        _markdown_counts(report.consumer_lag),
        "![latency](latency.png)\n",
    ]
    path.write_text("\n".join(parts))


LAG_COLUMNS = ("group", "topic", "partition", "committed_offset", "high_watermark", "lag")


def consumer_lag(spark: Any, handlers: list[str], options: dict[str, str],
                 output: Path) -> list[dict[str, Any]]:
    """The consumer-lag rows, asked of the first handler that answers, written as Parquet."""
    import grpc
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark.datasource import ReadSettings
    from spark.group_offsets import read_group_lag

    settings = ReadSettings.from_options(options)
    rows: list[dict[str, Any]] = []
    for endpoint in handlers:
        try:
            rows = [lag.row() for lag in read_group_lag(endpoint, settings)]
            break
        except grpc.RpcError:
            continue
    schema = StructType([StructField(c, StringType() if c in ("group", "topic") else LongType())
                         for c in LAG_COLUMNS])
    frame = spark.createDataFrame([tuple(r[c] for c in LAG_COLUMNS) for r in rows], schema)
    frame.coalesce(1).write.mode("overwrite").parquet(str(output / "consumer_lag.parquet"))
    return rows


def run(spark: Any, options: dict[str, str], output: Path) -> Report:
    """Read one snapshot with ``options`` (data source options) and write the report."""
    output.mkdir(parents=True, exist_ok=True)
    raw = spark.read.format("kbroker_metrics").options(**options).load().cache()
    try:
        raw.coalesce(1).write.mode("overwrite").parquet(str(output / "metrics.parquet"))
        raw_handlers = sorted(r.endpoint for r in raw.filter("service = 'handler'")
                              .select("endpoint").distinct().collect())
        tables = compute(raw)
        collected: dict[str, list[dict[str, Any]]] = {}
        for name, frame in tables.items():
            frame = frame.cache()
            frame.coalesce(1).write.mode("overwrite").parquet(str(output / f"{name}.parquet"))
            collected[name] = [row.asDict() for row in frame.collect()]
            frame.unpersist()
    finally:
        raw.unpersist()
    collected["consumer_lag"] = consumer_lag(spark, raw_handlers, options, output)
    report = Report(output=output, **collected)
    write_chart(report.latency, output / "latency.png", report.client_latency)
    write_markdown(report, output / "report.md")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--output", type=Path, default=Path("reports/latency"))
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, "
                        "else local[*])")
    args = parser.parse_args(argv)
    options = cluster_options(args)
    from spark.session import get_session

    spark = get_session("kbroker-latency-report", master=args.master)
    try:
        report = run(spark, options, args.output)
    finally:
        spark.stop()
    print(f"report written to {report.output}/report.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
