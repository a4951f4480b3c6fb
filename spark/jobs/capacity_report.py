"""The capacity report: growth per topic and partition, retention headroom and skew across log
nodes, with what to do about them (spark.capacity: which partitions to move where, how many log
nodes to add).

Reads the log nodes' per-partition gauges (``kbroker_log_partition_size_bytes``,
``..._log_end_offset``) and disk gauges (``kbroker_log_dir_total_bytes``, ``..._free_bytes``)
twice, ``--window`` seconds apart (``kbroker_metrics``), and the cluster metadata (replicas,
leaders, topic configs) from the active replicator over gRPC
(``kbroker.replicator.v1.Replicator/GetMetadata``). A log node's metrics are matched to its id
by its gRPC address as the replicator knows it, else by the number its instance name ends with
(``log-2``, ``kbroker-log-2``). Writes:

    partitions.parquet  per partition: leader, replicas, size, growth (bytes/s, records/s of
                        the leader's replica), retention.bytes / retention.ms, the bytes
                        retention will hold it at, headroom to retention.bytes
    topics.parquet      per topic: partitions, bytes, growth, retained bytes, partition skew
                        (largest partition over the mean)
    nodes.parquet       per log node: replicas, leaders, bytes, growth, projected bytes, disk
                        total and free, days to full, skew (bytes over the mean)
    moves.parquet       suggested replica moves (topic, partition, from, to, bytes)
    capacity.png        bytes per log node stacked by topic, with the projection and the disk;
                        growth per log node
    report.md           the tables and the advice

Run (local[*] by default; spark-submit as the latency report)::

    python -m spark.jobs.capacity_report --cluster local --window 30 --output reports/capacity
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from spark.capacity import (
    Move,
    NodeCapacity,
    NodeDisk,
    PartitionCapacity,
    PartitionPlacement,
    Plan,
    ReplicaSample,
    TopicCapacity,
    plan,
    topic_capacity,
)
from spark.jobs.cluster_args import add_cluster_arguments, cluster_options

PREFIXES = "kbroker_log_partition_,kbroker_log_dir_"
SIZE = "kbroker_log_partition_size_bytes"
LEO = "kbroker_log_partition_log_end_offset"
DISK_TOTAL = "kbroker_log_dir_total_bytes"
DISK_FREE = "kbroker_log_dir_free_bytes"
METADATA_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class CapacityReport:
    output: Path
    plan: Plan
    topics: list[dict[str, Any]]


def read_snapshot(spark: Any, options: dict[str, str]) -> list[Any]:
    """The log nodes' partition and disk samples, now."""
    from pyspark.sql import functions as F  # noqa: N812

    frame = (spark.read.format("kbroker_metrics").options(**{**options, "prefixes": PREFIXES})
             .load().filter(F.col("service") == "log"))
    return frame.select("endpoint", "instance", "timestamp", "sample", "labels",
                        "value").collect()


def read_metadata(endpoints: list[str], options: dict[str, str]) -> Any:
    """The cluster metadata from whichever endpoint answers GetMetadata (the active
    replicator; standbys and other services refuse)."""
    import grpc

    from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
    from spark.datasource import ReadSettings, open_channel, server_names

    settings = ReadSettings.from_options(options)
    errors = []
    for endpoint in endpoints:
        for name in server_names(endpoint, settings):
            with open_channel(endpoint, settings, name) as channel:
                try:
                    return replicator_pb2_grpc.ReplicatorStub(channel).GetMetadata(
                        replicator_pb2.GetMetadataRequest(), timeout=METADATA_TIMEOUT_S)
                except grpc.RpcError as error:
                    errors.append(f"{endpoint}: {error.code().name}")
    raise RuntimeError(f"no replicator answered GetMetadata: {errors}")


def node_of(endpoint: str, instance: str, addresses: dict[str, int]) -> int | None:
    """The log node id of a metrics endpoint (see the module docstring)."""
    if endpoint in addresses:
        return addresses[endpoint]
    found = re.search(r"(\d+)$", instance)
    return int(found.group(1)) if found else None


def samples_between(then: list[Any], now: list[Any], addresses: dict[str, int]
                    ) -> tuple[list[ReplicaSample], list[NodeDisk], float]:
    """Replica samples present in both snapshots, disks from the newer, and the seconds
    between them."""

    def index(rows: list[Any]) -> tuple[dict[tuple[int, str, str, int], float],
                                        dict[tuple[int, str], float], float]:
        values: dict[tuple[int, str, str, int], float] = {}
        disks: dict[tuple[int, str], float] = {}
        stamps = []
        for row in rows:
            node = node_of(row.endpoint, row.instance, addresses)
            if node is None:
                continue
            stamps.append(row.timestamp.timestamp())
            if row.sample in (SIZE, LEO):
                key = (node, row.sample, row.labels["topic"], int(row.labels["partition"]))
                values[key] = row.value
            elif row.sample in (DISK_TOTAL, DISK_FREE):
                disks[(node, row.sample)] = disks.get((node, row.sample), 0.0) + row.value
        return values, disks, (sum(stamps) / len(stamps) if stamps else 0.0)

    before, _, t0 = index(then)
    after, disks, t1 = index(now)
    replicas = []
    for (node, sample, topic, partition), size in after.items():
        if sample != SIZE or (node, SIZE, topic, partition) not in before:
            continue
        replicas.append(ReplicaSample(
            node=node, topic=topic, partition=partition,
            size_then=before[(node, SIZE, topic, partition)], size_now=size,
            leo_then=before.get((node, LEO, topic, partition), 0.0),
            leo_now=after.get((node, LEO, topic, partition), 0.0)))
    nodes = sorted({node for node, _ in disks})
    node_disks = [NodeDisk(n, disks.get((n, DISK_TOTAL), 0.0), disks.get((n, DISK_FREE), 0.0))
                  for n in nodes if (n, DISK_TOTAL) in disks]
    return replicas, node_disks, max(t1 - t0, 0.0)


def placements_of(metadata: Any) -> list[PartitionPlacement]:
    return [PartitionPlacement(topic.name, p.partition, p.leader, tuple(p.replicas),
                               dict(topic.configs))
            for topic in metadata.topics for p in topic.partitions]


def write_parquet(spark: Any, rows: list[dict[str, Any]], path: Path,
                  item: type | None = None) -> None:
    """``rows`` as Parquet; an empty table keeps the columns of dataclass ``item``."""
    import pandas as pd

    if not rows and item is not None:
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

        types = {"str": StringType(), "int": LongType()}
        schema = StructType([StructField(f.name, types.get(str(f.type), DoubleType()))
                             for f in dataclasses.fields(item)])
        frame = spark.createDataFrame([], schema)
    else:
        table = pd.DataFrame(rows)
        for column in table.columns:
            # Numbers with gaps (None) become floats with NaN: Spark cannot type None.
            if all(v is None or isinstance(v, int | float) for v in table[column]):
                table[column] = table[column].astype("float64")
        frame = spark.createDataFrame(table)
    frame.coalesce(1).write.mode("overwrite").parquet(str(path))


def write_chart(report: CapacityReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nodes = report.plan.nodes
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.5))
    labels = [f"log {n.node}" for n in nodes]
    topics = [r["topic"] for r in report.topics][:8]
    per_node_topic: dict[tuple[int, str], float] = {}
    # The replica bytes each node holds per topic: partitions' sizes on their replicas.
    for p in report.plan.partitions:
        for replica in (int(r) for r in p.replicas.split(",") if r):
            key = (replica, p.topic if p.topic in topics else "other")
            per_node_topic[key] = per_node_topic.get(key, 0.0) + p.size_bytes
    bottoms = [0.0] * len(nodes)
    for topic in [*topics, "other"]:
        values = [per_node_topic.get((n.node, topic), 0.0) / 2**20 for n in nodes]
        if any(values):
            left.bar(range(len(nodes)), values, 0.6, bottom=bottoms, label=topic)
            bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    projected = [(n.projected_bytes or 0.0) / 2**20 for n in nodes]
    left.scatter(range(len(nodes)), projected, color="black", marker="_", s=400, zorder=3,
                 label="retained (projected)")
    left.set_xticks(range(len(nodes)), labels)
    left.set_ylabel("MiB")
    left.set_title("Replica bytes per log node, by topic")
    left.legend(fontsize=8)
    right.bar(range(len(nodes)), [n.growth_bytes_per_s / 1024 for n in nodes], 0.6,
              color="tab:orange")
    right.set_xticks(range(len(nodes)), labels)
    right.set_ylabel("KiB/s")
    right.set_title("Growth per log node (bytes per second into its replicas)")
    for axis in (left, right):
        axis.set_ylim(bottom=0)
        axis.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_(none)_\n"
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_markdown(report: CapacityReport, window_s: float, path: Path) -> None:
    capacity_plan = report.plan
    advice = capacity_plan.advice or ["nothing to do: the log nodes are even and have room"]
    parts = [
        "# kbroker capacity report\n",
        f"Growth measured over {window_s:.1f} s; retention as each topic configures it "
        "(Kafka's defaults otherwise: retention.ms 7 days, no byte limit).\n",
        "## Advice\n", "\n".join(f"- {line}" for line in advice) + "\n",
        "## Log nodes\n", _table(capacity_plan.rows("nodes")),
        "## Suggested moves\n", _table(capacity_plan.rows("moves")),
        "## Topics\n", _table(report.topics),
        "## Partitions\n", _table(capacity_plan.rows("partitions")),
        "![capacity](capacity.png)\n",
    ]
    path.write_text("\n".join(parts))


def run(spark: Any, options: dict[str, str], output: Path, window_s: float = 30.0,
        tolerance: float = 0.2, target_use: float = 0.8,
        horizon_days: float = 7.0) -> CapacityReport:
    from spark.discovery import endpoints_from_options

    output.mkdir(parents=True, exist_ok=True)
    endpoints = endpoints_from_options(options)
    fixed = {**options, "endpoints": ",".join(endpoints)}
    fixed.pop("cluster", None)
    then = read_snapshot(spark, fixed)
    time.sleep(window_s)
    now = read_snapshot(spark, fixed)
    metadata = read_metadata(endpoints, options)
    addresses = {node.address: node.node_id for node in metadata.log_nodes}
    replicas, disks, measured = samples_between(then, now, addresses)
    capacity_plan = plan(placements_of(metadata), replicas, disks,
                         [n.node_id for n in metadata.log_nodes], measured,
                         tolerance=tolerance, target_use=target_use,
                         horizon_days=horizon_days)
    report = CapacityReport(output, capacity_plan,
                            [asdict(t) for t in topic_capacity(capacity_plan.partitions)])
    for name, item in (("partitions", PartitionCapacity), ("nodes", NodeCapacity),
                       ("moves", Move)):
        write_parquet(spark, capacity_plan.rows(name), output / f"{name}.parquet", item)
    write_parquet(spark, report.topics, output / "topics.parquet", TopicCapacity)
    write_chart(report, output / "capacity.png")
    write_markdown(report, measured, output / "report.md")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds between the two readings growth is measured over")
    parser.add_argument("--tolerance", type=float, default=0.2,
                        help="how far above the mean bytes a log node may hold before moves "
                        "are suggested")
    parser.add_argument("--target-use", type=float, default=0.8,
                        help="share of the log nodes' disks the retained bytes may fill")
    parser.add_argument("--horizon-days", type=float, default=7.0,
                        help="a node filling its disk sooner asks for a log node more")
    parser.add_argument("--output", type=Path, default=Path("reports/capacity"))
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    from spark.session import get_session

    spark = get_session("kbroker-capacity-report", master=args.master)
    try:
        report = run(spark, cluster_options(args), args.output, args.window, args.tolerance,
                     args.target_use, args.horizon_days)
    finally:
        spark.stop()
    print(f"report written to {report.output}/report.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
