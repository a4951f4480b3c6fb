"""The health watch: a streaming query over ``kbroker_metrics`` that flags, as they happen,

    under_replicated    the replicator reports partitions with a replica offline or out of ISR
                        (kbroker_replicator_under_replicated_partitions > 0)
    offline             partitions whose leader is not on a live log node
                        (kbroker_replicator_offline_partitions > 0)
    purgatory_growth    operations pending in the purgatory, per kind, grew since the previous
                        micro-batch by more than the load explains (below)

Purgatory growth is judged against the load, so ordinary long polls never alarm. Every idle
consumer keeps one Fetch parked (up to ``fetch.max.wait.ms``), so the pending count follows the
number of consumers, not trouble; what matters is whether operations leave the purgatory as
fast as they enter. Per kind, over one micro-batch:

    growth   = pending now - pending at the previous batch
    turnover = max(operations that left: completed + expired,
                   requests of the APIs that park operations of that kind, at the frontends)
    alarm when growth >= min_growth and growth > growth_ratio * turnover

(defaults ``min_growth`` 10, ``growth_ratio`` 0.5). Consumers that join raise the pending count
once, by one each, while each of them sends a Fetch (and has one leave) every max wait; a
stuck purgatory (acks=all produces waiting on replication that does not move, expiry that does
not run) keeps its growth near the requests that park while nothing leaves, and alarms. The
APIs per kind: fetch <- Fetch; produce <- Produce; join <- JoinGroup, SyncGroup; heartbeat <-
Heartbeat, JoinGroup, SyncGroup.

The data source streams a snapshot from every endpoint each ``interval`` (``Metrics/Stream``,
offsets are the snapshots' cursors); a micro-batch evaluates the newest snapshot of each
endpoint it received. Alerts go to the console (one line each) and to the list :func:`watch`
returns. Replicator gauges are taken as the maximum over instances (a standby may lag the
active one), purgatory gauges and all counters are summed over instances (shards, frontends);
a sum of counters that went down (a process restarted) counts from zero again.

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
    "kbroker_purgatory_completed",
    "kbroker_purgatory_expired",
    "kbroker_frontend_requests",
)
PENDING = "kbroker_purgatory_pending_operations"
LEFT = ("kbroker_purgatory_completed_total", "kbroker_purgatory_expired_total")
REQUESTS = "kbroker_frontend_requests_total"
# The APIs whose requests park operations of each purgatory kind.
PARKING_APIS = {
    "fetch": ("Fetch",),
    "produce": ("Produce",),
    "join": ("JoinGroup", "SyncGroup"),
    "heartbeat": ("Heartbeat", "JoinGroup", "SyncGroup"),
}
DEFAULT_MIN_GROWTH = 10
DEFAULT_GROWTH_RATIO = 0.5


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

    min_growth: float = DEFAULT_MIN_GROWTH
    growth_ratio: float = DEFAULT_GROWTH_RATIO
    batches: int = 0
    pending: dict[str, float] = field(default_factory=dict)
    # Counter sums at the previous batch: operations that left per kind, requests per API.
    left: dict[str, float] = field(default_factory=dict)
    requests: dict[str, float] = field(default_factory=dict)
    alerts: list[Alert] = field(default_factory=list)
    # The latest reading of every watched gauge: (family, subject) -> value.
    latest: dict[tuple[str, str], float] = field(default_factory=dict)

    def evaluate(self, batch: int, samples: list[tuple[str, dict[str, str], float]]) -> list[Alert]:
        """Alerts for one snapshot given as (sample name, labels, value) samples."""
        replicator: dict[str, float] = {}
        pending: dict[str, float] = {}
        left: dict[str, float] = {}
        requests: dict[str, float] = {}
        for name, labels, value in samples:
            if name == PENDING:
                kind = labels.get("kind", "")
                pending[kind] = pending.get(kind, 0.0) + value
            elif name in LEFT:
                kind = labels.get("kind", "")
                left[kind] = left.get(kind, 0.0) + value
            elif name == REQUESTS:
                api = labels.get("api", "")
                requests[api] = requests.get(api, 0.0) + value
            elif name.startswith("kbroker_replicator_"):
                replicator[name] = max(replicator.get(name, 0.0), value)
        alerts = []
        for family, kind in (
            ("kbroker_replicator_under_replicated_partitions", "under_replicated"),
            ("kbroker_replicator_offline_partitions", "offline"),
        ):
            if family in replicator:
                self.latest[(family, "cluster")] = replicator[family]
                if replicator[family] > 0:
                    alerts.append(Alert(batch, kind, "cluster", replicator[family]))
        first = self.batches == 0
        for kind_name, value in sorted(pending.items()):
            self.latest[(PENDING, kind_name)] = value
            if first:
                continue
            before = self.pending.get(kind_name, 0.0)
            turnover = max(_increase(left, self.left, kind_name),
                           sum(_increase(requests, self.requests, api)
                               for api in PARKING_APIS.get(kind_name, ())))
            growth = value - before
            if growth >= self.min_growth and growth > self.growth_ratio * turnover:
                alerts.append(Alert(batch, "purgatory_growth", kind_name, value, before))
        self.pending, self.left, self.requests = pending, left, requests
        self.batches += 1
        self.alerts.extend(alerts)
        return alerts


def _increase(now: dict[str, float], before: dict[str, float], key: str) -> float:
    """How much a summed counter rose; from zero when it went down (a restart)."""
    current, previous = now.get(key, 0.0), before.get(key, 0.0)
    return current - previous if current >= previous else current


def newest_snapshot(rows: list[Any]) -> list[tuple[str, dict[str, str], float]]:
    """(sample, labels, value) of the newest snapshot per endpoint among ``rows`` of
    (endpoint, timestamp, process_id, sequence, sample, labels, value): a batch holds several
    snapshots of an endpoint when Spark falls behind the stream. Newest by the snapshot's time,
    then sequence (a restarted process numbers from 1 again)."""
    newest: dict[str, tuple[Any, int, str]] = {}
    for endpoint, timestamp, process_id, sequence, *_ in rows:
        key = (timestamp, sequence, process_id)
        if endpoint not in newest or key > newest[endpoint]:
            newest[endpoint] = key
    return [(sample, labels, value)
            for endpoint, timestamp, process_id, sequence, sample, labels, value in rows
            if newest[endpoint] == (timestamp, sequence, process_id)]


def watch(
    spark: Any,
    options: dict[str, str],
    *,
    interval: float = 5.0,
    max_batches: int | None = None,
    min_growth: float = DEFAULT_MIN_GROWTH,
    growth_ratio: float = DEFAULT_GROWTH_RATIO,
    timeout: float | None = None,
    checkpoint: str | None = None,
) -> HealthState:
    """Run the streaming query until ``max_batches`` micro-batches ran (None: until stopped or
    ``timeout`` seconds passed). Returns the state: batches seen, alerts, latest readings.

    Without ``checkpoint`` the query checkpoints to a temporary folder removed at the end:
    replaying old snapshots after a restart has no value for a watch of the present."""
    state = HealthState(min_growth=min_growth, growth_ratio=growth_ratio)
    lock = threading.Lock()
    done = threading.Event()
    stream = (
        spark.readStream.format("kbroker_metrics")
        .options(**{**options, "prefixes": ",".join(PREFIXES),
                    "interval_ms": str(max(int(interval * 1000), 100))})
        .load()
    )

    def on_batch(frame: Any, batch_id: int) -> None:
        rows = frame.select("endpoint", "timestamp", "process_id", "sequence", "sample",
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
    parser.add_argument("--min-growth", type=float, default=DEFAULT_MIN_GROWTH,
                        help="fewest pending operations added in a batch that may alarm")
    parser.add_argument("--growth-ratio", type=float, default=DEFAULT_GROWTH_RATIO,
                        help="growth alarms above this share of the operations that left (or "
                        "the requests that park them) in the same batch")
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    options = {**cluster_options(args), "skip_unavailable": "true"}
    from spark.session import get_session

    spark = get_session("kbroker-health-stream", master=args.master)
    try:
        state = watch(spark, options, interval=args.interval, max_batches=args.batches,
                      min_growth=args.min_growth, growth_ratio=args.growth_ratio)
    except KeyboardInterrupt:
        return 130
    finally:
        spark.stop()
    print(f"{state.batches} batches, {len(state.alerts)} alerts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
