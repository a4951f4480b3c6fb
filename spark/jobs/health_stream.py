"""The health watch: a streaming query over ``kbroker_metrics`` that flags, as they happen,

    under_replicated    the replicator reports partitions with a replica offline or out of ISR
                        (kbroker_replicator_under_replicated_partitions > 0)
    offline             partitions whose leader is not on a live log node
                        (kbroker_replicator_offline_partitions > 0)
    purgatory_growth    operations pending in the purgatory, per kind, grew by at least
                        ``growth_threshold`` since the previous micro-batch

The data source streams a snapshot from every endpoint each ``interval`` (``Metrics/Stream``,
offsets are the snapshots' cursors); a micro-batch evaluates the newest snapshot of each
endpoint it received. Alerts go to the console (one line each) and to the list :func:`watch`
returns. Replicator gauges are taken as the maximum over instances (a standby may lag the
active one), purgatory gauges are summed over instances (shards).

Run until Ctrl-C, or for a bounded number of batches::

    python -m spark.jobs.health_stream --cluster local --interval 5
    python -m spark.jobs.health_stream --endpoints 127.0.0.1:19300,127.0.0.1:19400 --batches 3
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from spark.jobs.cluster_args import add_cluster_arguments, cluster_options

PREFIXES = (
    "kbroker_replicator_under_replicated_partitions",
    "kbroker_replicator_offline_partitions",
    "kbroker_purgatory_pending_operations",
)


@dataclass(frozen=True, slots=True)
class Alert:
    batch: int
    kind: str  # under_replicated, offline, purgatory_growth
    subject: str  # "cluster" or the purgatory operation kind
    value: float
    previous: float | None = None

    def line(self) -> str:
        change = "" if self.previous is None else f" (was {self.previous:g})"
        return f"batch {self.batch}: {self.kind} {self.subject} = {self.value:g}{change}"


@dataclass(slots=True)
class HealthState:
    """What the watch carries from one micro-batch to the next."""

    growth_threshold: int = 1
    batches: int = 0
    pending: dict[str, float] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    # The latest reading of every watched gauge: (family, subject) -> value.
    latest: dict[tuple[str, str], float] = field(default_factory=dict)

    def evaluate(self, batch: int, samples: list[tuple[str, dict[str, str], float]]) -> list[Alert]:
        """Alerts for one snapshot given as (family, labels, value) samples."""
        replicator: dict[str, float] = {}
        pending: dict[str, float] = {}
        for family, labels, value in samples:
            if family.startswith("kbroker_purgatory_pending"):
                kind = labels.get("kind", "")
                pending[kind] = pending.get(kind, 0.0) + value
            else:
                replicator[family] = max(replicator.get(family, 0.0), value)
        alerts = []
        for family, kind in (
            ("kbroker_replicator_under_replicated_partitions", "under_replicated"),
            ("kbroker_replicator_offline_partitions", "offline"),
        ):
            if family in replicator:
                self.latest[(family, "cluster")] = replicator[family]
                if replicator[family] > 0:
                    alerts.append(Alert(batch, kind, "cluster", replicator[family]))
        for kind_name, value in sorted(pending.items()):
            self.latest[("kbroker_purgatory_pending_operations", kind_name)] = value
            before = self.pending.get(kind_name, 0.0)
            if value - before >= self.growth_threshold:
                alerts.append(Alert(batch, "purgatory_growth", kind_name, value, before))
        self.pending = pending
        self.batches += 1
        self.alerts.extend(alerts)
        return alerts


def newest_snapshot(rows: list[Any]) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) of the newest snapshot per endpoint among ``rows`` of
    (endpoint, timestamp, process_id, sequence, family, labels, value): a batch holds several
    snapshots of an endpoint when Spark falls behind the stream. Newest by the snapshot's time,
    then sequence (a restarted process numbers from 1 again)."""
    newest: dict[str, tuple[Any, int, str]] = {}
    for endpoint, timestamp, process_id, sequence, *_ in rows:
        key = (timestamp, sequence, process_id)
        if endpoint not in newest or key > newest[endpoint]:
            newest[endpoint] = key
    return [(family, labels, value)
            for endpoint, timestamp, process_id, sequence, family, labels, value in rows
            if newest[endpoint] == (timestamp, sequence, process_id)]


def watch(
    spark: Any,
    options: dict[str, str],
    *,
    interval: float = 5.0,
    max_batches: int | None = None,
    growth_threshold: int = 1,
    timeout: float | None = None,
    checkpoint: str | None = None,
) -> HealthState:
    """Run the streaming query until ``max_batches`` micro-batches ran (None: until stopped or
    ``timeout`` seconds passed). Returns the state: batches seen, alerts, latest readings.

    Without ``checkpoint`` the query checkpoints to a temporary folder removed at the end:
    replaying old snapshots after a restart has no value for a watch of the present."""
    state = HealthState(growth_threshold=growth_threshold)
    lock = threading.Lock()
    done = threading.Event()
    stream = (
        spark.readStream.format("kbroker_metrics")
        .options(**{**options, "prefixes": ",".join(PREFIXES),
                    "interval_ms": str(max(int(interval * 1000), 100))})
        .load()
    )

    def on_batch(frame: Any, batch_id: int) -> None:
        rows = frame.select("endpoint", "timestamp", "process_id", "sequence", "family",
                            "labels", "value").collect()
        with lock:
            for alert in state.evaluate(batch_id, newest_snapshot(rows)):
                print(alert.line(), flush=True)
            if max_batches is not None and state.batches >= max_batches:
                done.set()

    scratch = None if checkpoint else tempfile.mkdtemp(prefix="kbroker-health-")
    query = (
        stream.writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", checkpoint or scratch)
        .trigger(processingTime=f"{max(interval, 0.1)} seconds")
        .start()
    )
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not done.is_set():
            if query.exception() is not None:
                raise RuntimeError(f"health stream failed: {query.exception()}")
            if deadline is not None and time.monotonic() > deadline:
                break
            done.wait(0.2)
    finally:
        query.stop()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_cluster_arguments(parser)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between batches")
    parser.add_argument("--batches", type=int, default=None, help="stop after this many")
    parser.add_argument("--growth-threshold", type=int, default=1,
                        help="pending operations added between batches that raise an alert")
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    options = {**cluster_options(args), "skip_unavailable": "true"}
    from spark.session import get_session

    spark = get_session("kbroker-health-stream", master=args.master)
    try:
        state = watch(spark, options, interval=args.interval, max_batches=args.batches,
                      growth_threshold=args.growth_threshold)
    except KeyboardInterrupt:
        return 130
    finally:
        spark.stop()
    print(f"{state.batches} batches, {len(state.alerts)} alerts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
