"""Sustained load: acks=all produce into a replicated topic, a consumer reading it back and a
probe timing single-record round trips, for minutes on one cluster; what each 10 s window
moved, and whether anything grows.

    python bench/sustained.py [--minutes 10] [--window 10] [--size 1000] [--partitions 6]
                              [--replication 3] [--mbps 0] [--probe-ms 50]
                              [--out reports/sustained.json]

Starts a local kbroker cluster (every service a process, 3 log nodes, free loopback ports, a
temporary data folder) and three confluent-kafka processes:

- a producer: SIZE-byte records with keys, acks=all, idempotent, linger.ms=5, batch.size 1 MB,
  into a topic of PARTITIONS partitions and REPLICATION replicas (min.insync.replicas 2), as
  fast as its acknowledgements come (``--mbps``: paced to that rate instead);
- a consumer: the topic from the start with manual assignment;
- a probe: one record every PROBE_MS, acks=all, linger.ms=0, the time until each is
  acknowledged.

The topic keeps at most 1 GiB per partition in 64 MiB segments, and the log nodes check
retention every 10 s, so the run's disk use stays bounded (a run at 40 MB/s writes some 70 GB
with three replicas in 10 minutes). Every window (10 s) it records, from the clients:
acknowledged MB/s, consumed MB/s, the consumer's lag (Kafka's: each partition's high
watermark, as the consumer last heard it, less its position) and the probe's p50/p99/max;
from every service process: its resident memory (VmRSS less the spool files' shared pages,
see :func:`rss_mb`); the bytes of the cluster's data
folder; from the services' metrics: the
operations parked in the purgatory and the frontend's mean Produce request queue time (frame
read until a worker took it). Prints one JSON line per window and a summary: each series'
first, last, minimum and maximum, and the growth from the first minute to the last (the first
window, warming up, is left out of the summary), as JSON and as Markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import kbroker_cluster  # noqa: E402

# bench/profile.py, under a name that is not the standard library's profile module.
_spec = importlib.util.spec_from_file_location("bench_profile", ROOT / "bench" / "profile.py")
assert _spec is not None and _spec.loader is not None
bench_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_profile)
scrape_all = bench_profile.scrape_all

# Each client prints a JSON line of its running totals about once a second.
PRODUCER = r'''
import json, sys, time
from confluent_kafka import Producer
bootstrap, topic, size, mbps = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
              "linger.ms": 5, "batch.size": 1_000_000, "compression.type": "none",
              "queue.buffering.max.messages": 200_000, "message.timeout.ms": 120_000})
payload = b"x" * size
acked = [0, 0]  # records, errors
def on_delivery(err, msg):
    if err: acked[1] += 1
    else: acked[0] += 1
per_second = mbps * 1e6 / size if mbps > 0 else 0
i = 0
start = last = time.perf_counter()
while True:
    now = time.perf_counter()
    if per_second and i >= (now - start) * per_second:
        p.poll(0.001)
    else:
        try:
            p.produce(topic, payload, key=str(i % 1000).encode(), on_delivery=on_delivery)
            i += 1
        except BufferError:
            p.poll(0.005)
        if i % 1000 == 0:
            p.poll(0)
    if now - last >= 1.0:
        last = now
        print(json.dumps({"t": time.time(), "acked": acked[0], "errors": acked[1],
                          "queued": len(p)}), flush=True)
'''

CONSUMER = r'''
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "sustained-nogroup",
              "enable.auto.commit": False, "fetch.max.bytes": 52428800,
              "max.partition.fetch.bytes": 10485760})
assigned = [TopicPartition(topic, q, 0) for q in range(partitions)]
c.assign(assigned)
got = nbytes = 0
last = time.perf_counter()
while True:
    for m in c.consume(10000, 0.2):
        if m.error(): continue
        got += 1; nbytes += len(m.value() or b"")
    if time.perf_counter() - last >= 1.0:
        last = time.perf_counter()
        # Kafka's consumer lag, from one view at one moment: each partition's high watermark
        # as the last fetch answer gave it, less the consumer's position.
        lag = 0
        for tp in c.position(assigned):
            high = c.get_watermark_offsets(tp, cached=True)[1]
            if high >= 0 and tp.offset >= 0:
                lag += max(high - tp.offset, 0)
        print(json.dumps({"t": time.time(), "consumed": got, "bytes": nbytes, "lag": lag}),
              flush=True)
'''

PROBE = r'''
import json, sys, time
from confluent_kafka import Producer
bootstrap, topic, size, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
              "enable.idempotence": False})
payload = b"p" * size
times = []
last = time.perf_counter()
while True:
    t = time.perf_counter()
    p.produce(topic, payload, key=b"probe", partition=0)
    p.flush(30)
    done = time.perf_counter()
    times.append((done - t) * 1000)
    if done - last >= 1.0:
        last = done
        print(json.dumps({"t": time.time(), "ms": [round(x, 3) for x in times]}), flush=True)
        times = []
    time.sleep(max(every - (time.perf_counter() - t), 0))
'''

SETUP = r'''
import sys
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, topic = sys.argv[1], sys.argv[2]
partitions, replication = int(sys.argv[3]), int(sys.argv[4])
admin = AdminClient({"bootstrap.servers": bootstrap})
configs = {"min.insync.replicas": "2"} if replication > 1 else {}
# Disk use bounded: old segments are deleted as the run goes (retention checked every 10 s).
configs.update({"retention.bytes": str(2**30), "segment.bytes": str(64 * 2**20)})
for f in admin.create_topics([NewTopic(topic, partitions, replication, config=configs)]).values():
    f.result(60)
'''


class Client:
    """A client process whose JSON lines are read by a thread: the last one, and (for the
    probe) every value of a list field since the last :meth:`take`."""

    def __init__(self, script: str, *args: object, collect: str = "") -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)],
                                     stdout=subprocess.PIPE, text=True)
        self.last: dict[str, Any] = {}
        self._collect = collect
        self._collected: list[float] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                with self._lock:
                    self.last = value
                    if self._collect:
                        self._collected.extend(value[self._collect])

    def take(self) -> tuple[dict[str, Any], list[float]]:
        with self._lock:
            collected, self._collected = self._collected, []
            return dict(self.last), collected

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def rss_mb(pid: int) -> float:
    """The process's resident memory in MB: VmRSS less RssShmem, the pages of tmpfs files it
    maps. Those are the frontend's spool files, mapped by the frontend and read through
    mappings by the log nodes: memory of the files (bounded by the spool, counted once by the
    tmpfs), which VmRSS would count again in every process that touched them."""
    kb = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssShmem"):
                kb[name] = int(value.split()[0])
    return round((kb.get("VmRSS", 0) - kb.get("RssShmem", 0)) / 1024, 1)


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (the cluster's data: every log node's log)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


def metric_sum(scraped: dict[str, dict[str, float]], prefix: str, kind: str = "") -> float:
    return sum(value for service, series in scraped.items()
               if not kind or service.split("-")[0] == kind
               for name, value in series.items() if name.startswith(prefix))


QUEUE_SUM = 'kbroker_frontend_request_phase_seconds_sum{api="Produce",phase="request_queue"}'
QUEUE_COUNT = 'kbroker_frontend_request_phase_seconds_count{api="Produce",phase="request_queue"}'


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(int(len(ordered) * q), len(ordered) - 1)], 2)


def summarise(windows: list[dict[str, Any]], per_minute: int) -> dict[str, Any]:
    """First/last/min/max of each series, and the change from the first minute's mean to the
    last minute's (the warm-up window left out)."""
    steady = windows[1:] or windows
    series: dict[str, list[float]] = {}
    for window in steady:
        for key, value in window.items():
            if key == "rss_mb":
                for service, mb in value.items():
                    series.setdefault(f"rss_mb {service}", []).append(mb)
            elif isinstance(value, int | float) and key not in ("window", "t_s"):
                series.setdefault(key, []).append(value)
    out = {}
    for key, values in series.items():
        first = statistics.mean(values[:per_minute])
        last = statistics.mean(values[-per_minute:])
        out[key] = {"first": values[0], "last": values[-1], "min": min(values),
                    "max": max(values), "mean": round(statistics.mean(values), 2),
                    "first_minute": round(first, 2), "last_minute": round(last, 2),
                    "change_pct": round(100 * (last - first) / first, 1) if first else None}
    return out


def markdown(summary: dict[str, Any]) -> str:
    rows = ["| series | first minute | last minute | change | min | max |",
            "|---|---|---|---|---|---|"]
    for key, s in summary.items():
        change = "" if s["change_pct"] is None else f"{s['change_pct']:+.1f}%"
        rows.append(f"| {key} | {s['first_minute']} | {s['last_minute']} | {change} | "
                    f"{s['min']} | {s['max']} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per window")
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--replication", type=int, default=3)
    parser.add_argument("--mbps", type=float, default=0.0,
                        help="pace the producer to this many MB/s (0: as fast as it goes)")
    parser.add_argument("--probe-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "sustained.json")
    args = parser.parse_args()
    topic = "sustained"
    windows: list[dict[str, Any]] = []
    with kbroker_cluster(log_nodes=3, retention_check_interval_ms=10_000) as cluster:
        subprocess.run([sys.executable, "-c", SETUP, cluster.bootstrap, topic,
                        str(args.partitions), str(args.replication)], check=True, timeout=120)
        pids = {name: svc.proc.pid for name, svc in cluster.services.items()
                if svc.proc is not None}
        clients = [Client(PRODUCER, cluster.bootstrap, topic, args.size, args.mbps),
                   Client(CONSUMER, cluster.bootstrap, topic, args.partitions),
                   Client(PROBE, cluster.bootstrap, topic, args.size, args.probe_ms / 1000,
                          collect="ms")]
        producer, consumer, probe = clients
        try:
            start = time.monotonic()
            previous = {"acked": 0, "bytes": 0, "t": time.time()}
            scraped = scrape_all(cluster)
            number = 0
            while time.monotonic() - start < args.minutes * 60:
                number += 1
                time.sleep(max(start + number * args.window - time.monotonic(), 0))
                gone = {name: client.proc.returncode for name, client in
                        zip(("producer", "consumer", "probe"), clients, strict=True)
                        if client.proc.poll() is not None}
                if gone:  # a client that died would read as a broker that stopped
                    print(json.dumps({"window": number, "clients_exited": gone}), flush=True)
                    break
                produced, _ = producer.take()
                consumed, _ = consumer.take()
                _, probes = probe.take()
                now = time.time()
                seconds = now - previous["t"]
                after = scrape_all(cluster)
                queued = metric_sum(after, QUEUE_COUNT) - metric_sum(scraped, QUEUE_COUNT)
                queue_ms = (1000 * (metric_sum(after, QUEUE_SUM) - metric_sum(scraped, QUEUE_SUM))
                            / queued) if queued else 0.0
                acked = produced.get("acked", 0)
                got_bytes = consumed.get("bytes", 0)
                window = {
                    "window": number, "t_s": round(time.monotonic() - start, 1),
                    "produce_MBps": round((acked - previous["acked"]) * args.size / 1e6
                                          / seconds, 1),
                    "consume_MBps": round((got_bytes - previous["bytes"]) / 1e6 / seconds, 1),
                    "consumer_lag_records": consumed.get("lag", 0),
                    "producer_queue_records": produced.get("queued", 0),
                    "delivery_errors": produced.get("errors", 0),
                    "probe_p50_ms": percentile(probes, 0.5),
                    "probe_p99_ms": percentile(probes, 0.99),
                    "probe_max_ms": round(max(probes), 2) if probes else 0.0,
                    "purgatory_pending": metric_sum(
                        after, "kbroker_purgatory_pending_operations", "purgatory"),
                    "produce_request_queue_ms": round(queue_ms, 2),
                    "rss_mb": {name: rss_mb(pid) for name, pid in pids.items()},
                    "data_gb": round(folder_bytes(cluster.spec.data_dir) / 1e9, 2),
                }
                previous = {"acked": acked, "bytes": got_bytes, "t": now}
                scraped = after
                windows.append(window)
                print(json.dumps(window), flush=True)
        finally:
            for client in clients:
                client.stop()
    per_minute = max(int(60 / args.window), 1)
    summary = summarise(windows, per_minute)
    result = {"workload": {k: str(v) for k, v in vars(args).items()}, "windows": windows,
              "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"summary": summary}), flush=True)
    print(markdown(summary), flush=True)


if __name__ == "__main__":
    main()
