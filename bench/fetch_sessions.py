"""What a fetch costs at many partitions, with and without incremental fetch sessions (KIP-227),
side by side with the reference broker, in one run.

    python bench/fetch_sessions.py [--partitions 1000] [--seconds 10]

A kafka-python consumer (the Python client that uses fetch sessions) is assigned every
partition of a topic of PARTITIONS partitions holding one record each, reads them, then keeps
fetching for SECONDS with fetch.max.wait.ms 0 while nothing new arrives: every fetch is
answered at once, so the fetch rate is what one fetch costs end to end. Measured against:

- kbroker with sessions (the default): after the first full fetch, requests name no partition
  and answers carry none;
- kbroker with max.incremental.fetch.session.cache.slots 0: every fetch names every partition
  and every answer carries them all;
- the reference broker (Tansu, in memory), whatever it does (Tansu 0.6.0 gives kafka-python's
  consumer no records at all: the run says so).

Prints one JSON line per broker (fetches per second, mean request and response bytes per
fetch from the client's own metrics, CPU seconds of the kbroker services per fetch) and the
ratios sessions / no sessions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import cpu_seconds, kbroker_cluster, reference_broker  # noqa: E402

WORKLOAD = r'''
import json, sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

bootstrap, partitions, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
topic = f"sessions-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(300)
time.sleep(1.0)
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
for p in range(partitions):
    producer.produce(topic, b"x" * 100, partition=p)
assert producer.flush(120) == 0
consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                         enable_auto_commit=False, fetch_max_wait_ms=0, fetch_min_bytes=1,
                         request_timeout_ms=60000)
consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
got, deadline = 0, time.monotonic() + 60
while got < partitions and time.monotonic() < deadline:
    got += sum(len(r) for r in consumer.poll(timeout_ms=200).values())
assert got == partitions, (got, partitions)

# Cumulative counts (kafka-python's own metrics are windowed rates): bytes on the wire both
# ways, and fetch answers (one fetch-latency record each).
from kafka.metrics.stats import Total
metrics = consumer._metrics
for sensor_name, name in (("bytes-sent", "sent-total"), ("bytes-received", "received-total")):
    metrics.get_sensor(sensor_name).add(metrics.metric_name(name, "bench"), Total())
answered = [0]

class CountingSensor:
    def __init__(self, sensor):
        self.sensor = sensor

    def record(self, *args, **kwargs):
        answered[0] += 1
        return self.sensor.record(*args, **kwargs)

consumer._fetcher._sensors.fetch_latency = CountingSensor(
    consumer._fetcher._sensors.fetch_latency)

def totals():
    values = {name.name: metric.value() for name, metric in metrics.metrics.items()
              if name.group == "bench"}
    return answered[0], values["sent-total"], values["received-total"]

print("READY", flush=True)
sys.stdin.readline()
before = totals()
started = time.monotonic()
while time.monotonic() - started < seconds:
    assert not consumer.poll(timeout_ms=100)
elapsed = time.monotonic() - started
after = totals()
consumer.close()
fetches = after[0] - before[0]
print(json.dumps({"partitions": partitions, "fetches": int(fetches),
                  "fetches_per_s": round(fetches / elapsed, 1),
                  "request_bytes_per_fetch": round((after[1] - before[1]) / max(fetches, 1)),
                  "response_bytes_per_fetch": round((after[2] - before[2]) / max(fetches, 1))}))
'''


def run_workload(bootstrap: str, args: argparse.Namespace, pids: list[int]) -> dict:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKLOAD, bootstrap, str(args.partitions), str(args.seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdin is not None
        line = process.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError(line + process.stderr.read()[-3000:] if process.stderr else line)
        cpu_before = cpu_seconds(pids) if pids else 0.0
        process.stdin.write("\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=args.seconds + 300)
        cpu = cpu_seconds(pids) - cpu_before if pids else None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
    if process.returncode != 0:
        raise RuntimeError(err[-3000:])
    result = json.loads(out.strip().splitlines()[-1])
    if cpu is not None:
        result["service_cpu_ms_per_fetch"] = round(1000 * cpu / max(result["fetches"], 1), 2)
    return result


def run_kbroker(args: argparse.Namespace, slots: int) -> dict:
    flags = {"frontend": {"max_incremental_fetch_session_cache_slots": slots}}
    with kbroker_cluster(service_flags=flags) as cluster:
        pids = [svc.proc.pid for svc in cluster.services.values()
                if svc.proc is not None]
        return run_workload(cluster.bootstrap, args, pids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with_sessions = run_kbroker(args, 1000)
    print(json.dumps({"broker": "kbroker, fetch sessions", **with_sessions}), flush=True)
    time.sleep(1)
    without = run_kbroker(args, 0)
    print(json.dumps({"broker": "kbroker, no fetch sessions", **without}), flush=True)
    try:
        with reference_broker() as bootstrap:
            reference = run_workload(bootstrap, args, [])
    except RuntimeError as e:
        # Seen with Tansu 0.6.0: kafka-python's consumer reads nothing from it.
        reference = {"failed": str(e).strip().splitlines()[-1][:300]}
    print(json.dumps({"broker": "reference (tansu, memory)", **reference}), flush=True)
    print(json.dumps({"sessions_over_no_sessions": {
        key: round(with_sessions[key] / without[key], 3) if without[key] else None
        for key in ("fetches_per_s", "request_bytes_per_fetch", "response_bytes_per_fetch",
                    "service_cpu_ms_per_fetch")}}))


if __name__ == "__main__":
    main()
