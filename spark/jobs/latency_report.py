"""The request-latency report: one snapshot of every service's metrics, turned into tables, a
chart and a summary.

Read once (``kbroker_metrics``, cached, so every table comes from the same instant), then:

    metrics.parquet     every sample read (the raw snapshot)
    requests.parquet    per API: requests, request/response bytes, error responses (frontend)
    latency.parquet     per API and phase (request_queue, local, remote, response_queue,
                        response_send, total: Kafka's RequestMetrics): count, mean,
                        p50/p99/p999 seconds, interpolated inside the frontend histogram buckets
                        (Prometheus histogram_quantile), summed over frontend instances first
    topics.parquet      per topic: bytes in and out at the frontends (Kafka's BytesInPerSec /
                        BytesOutPerSec: produced records appended, records fetched), as totals
                        and as bytes per second averaged since each frontend started; bytes
                        and batches appended and bytes read on the log nodes (appends count
                        every replica: leader appends and follower fetches)
    purgatory.parquet   per operation kind: pending now, completed, expired, p99 park time
    latency.png         p50/p99/p999 total time per API (log scale), and p99 per phase
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

from spark.histogram import histogram_quantile, parse_le
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


def _quantiles(buckets: list[Any]) -> tuple[float | None, ...]:
    pairs = [(parse_le(b["le"]), float(b["count"])) for b in buckets]
    out = []
    for q in QUANTILES.values():
        value = histogram_quantile(q, pairs)
        out.append(None if math.isnan(value) else value)
    return tuple(out)


def _histogram_summary(
    raw: Any, family: str, keys: dict[str, Any], extra_filter: Any | None = None,
) -> Any:
    """Per group of ``keys`` (name -> column): count, mean and quantiles of a histogram family
    whose samples are summed over instances (and over any label not in ``keys``)."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import DoubleType, StructField, StructType

    quantile_type = StructType([StructField(k, DoubleType()) for k in QUANTILES])
    # A lambda: Spark would otherwise read _quantiles' type hints as a pandas UDF declaration.
    quantiles = F.udf(lambda buckets: _quantiles(buckets), quantile_type)
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
        .withColumn("q", quantiles("buckets"))
        .select(
            *names,
            F.col("count").cast("long").alias("count"),
            F.when(F.col("count") > 0, F.col("sum_seconds") / F.col("count"))
            .alias("mean_seconds"),
            # Every observation 0 (a phase that never happened, e.g. no purgatory wait):
            # every quantile is 0, not a point interpolated inside the first bucket.
            *[F.when(F.col("sum_seconds") == 0, F.lit(0.0)).otherwise(F.col("q")[k])
              .alias(f"{k}_seconds") for k in QUANTILES],
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
    return {"requests": requests, "latency": latency, "topics": topics, "purgatory": purgatory}


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


def write_chart(latency: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals = [r for r in latency if r["phase"] == "total" and r["count"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5 + len(totals) * 0.1))
    apis = [r["api"] for r in totals]
    width = 0.27
    for i, key in enumerate(QUANTILES):
        values = [(r[f"{key}_seconds"] or 0.0) * 1000 for r in totals]
        left.bar([x + (i - 1) * width for x in range(len(apis))], values, width, label=key)
    left.set_xticks(range(len(apis)), apis, rotation=45, ha="right")
    left.set_ylabel("total time (ms)")
    left.set_title("Request total time per API")
    if totals:
        left.set_yscale("log")
        left.legend()
    phases = [p for p in PHASES if p != "total"]
    phase_width = 0.8 / len(phases)
    for i, phase in enumerate(phases):
        by_api = {r["api"]: r for r in latency if r["phase"] == phase}
        values = [((by_api.get(a) or {}).get("p99_seconds") or 0.0) * 1000 for a in apis]
        offset = (i - (len(phases) - 1) / 2) * phase_width
        right.bar([x + offset for x in range(len(apis))], values, phase_width, label=phase)
    right.set_xticks(range(len(apis)), apis, rotation=45, ha="right")
    right.set_ylabel("p99 (ms)")
    right.set_title("p99 per request phase")
    if totals:
        right.set_yscale("log")
        right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_markdown(report: Report, path: Path) -> None:
    parts = [
        "# kbroker request-latency report\n",
        "Quantiles are interpolated inside histogram buckets, so they are estimates bounded "
        "by the bucket edges; the last finite bucket is 30 s.\n",
        "## Requests per API (frontend)\n", _markdown_counts(report.requests),
        "## Latency per API and phase\n", _markdown_table(report.latency),
        "## Throughput per topic\n",
        "bytes_in / bytes_out: record bytes produced (appended) and fetched through the "
        "frontends (BytesInPerSec / BytesOutPerSec), totals and per second averaged since "
        "each frontend started; appended / read: on the log nodes, every replica.\n",
        _markdown_counts(report.topics),
        "## Purgatory pressure\n", _markdown_table(report.purgatory),
        "![latency](latency.png)\n",
    ]
    path.write_text("\n".join(parts))


def run(spark: Any, options: dict[str, str], output: Path) -> Report:
    """Read one snapshot with ``options`` (data source options) and write the report."""
    output.mkdir(parents=True, exist_ok=True)
    raw = spark.read.format("kbroker_metrics").options(**options).load().cache()
    try:
        raw.coalesce(1).write.mode("overwrite").parquet(str(output / "metrics.parquet"))
        tables = compute(raw)
        collected: dict[str, list[dict[str, Any]]] = {}
        for name, frame in tables.items():
            frame = frame.cache()
            frame.coalesce(1).write.mode("overwrite").parquet(str(output / f"{name}.parquet"))
            collected[name] = [row.asDict() for row in frame.collect()]
            frame.unpersist()
    finally:
        raw.unpersist()
    report = Report(output=output, **collected)
    write_chart(report.latency, output / "latency.png")
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
