"""Transactional produce throughput beside idempotent produce, side by side with the reference
broker, in one run.

    python bench/transactions.py [--n 100000] [--size 1000] [--partitions 3]
                                 [--transactions 100,10000] [--rounds 1] [--replication 1]

Starts a local kbroker cluster (every service a process, free loopback ports, a temporary data
folder; the topic has REPLICATION replicas, min.insync.replicas 2 when more than one, and each
transaction's markers then wait for its followers) and the reference broker (Tansu, in memory,
installed into bench/.venv-ref on first use, see bench/throughput.py), and runs with
confluent-kafka in a separate process, on each broker (the reference, a single broker, always
at replication factor 1):

- idempotent: N records of SIZE bytes, acks=all, enable.idempotence, linger.ms=5;
- transactional: the same N records in transactions of T records each (begin, produce T,
  commit), for every T given: the cost of a transaction is its AddPartitionsToTxn, its EndTxn
  and the markers, paid once per T records.

Then a read_committed consumer reads every record back (manual assignment): the count must be
N for every run. Prints one JSON line per broker and workload, then the ratios
kbroker / reference (with ``--rounds R``, every round's and their medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import kbroker_cluster, reference_binary, reference_broker

WORKLOAD = r'''
import json, sys, time, uuid
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, n, size, partitions, per_txn, replication = sys.argv[1], *map(int, sys.argv[2:7])
topic = f"bench-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
configs = {"min.insync.replicas": "2"} if replication > 1 else {}
for f in admin.create_topics([NewTopic(topic, partitions, replication,
                                       config=configs)]).values():
    f.result(30)
time.sleep(0.5)
payload = b"x" * size
config = {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1_000_000,
          "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
          "enable.idempotence": True, "acks": "all"}
if per_txn:
    config["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
p = Producer(config)
errors = [0]
def on_delivery(err, msg):
    if err: errors[0] += 1
if per_txn:
    p.init_transactions(30)
t0 = time.perf_counter()
for start in range(0, n, per_txn or n):
    if per_txn:
        p.begin_transaction()
    for i in range(start, min(n, start + (per_txn or n))):
        while True:
            try:
                p.produce(topic, payload, key=str(i % 1000).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10000 == 0: p.poll(0)
    if per_txn:
        p.commit_transaction(120)
left = p.flush(300)
elapsed = time.perf_counter() - t0
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-nogroup",
              "enable.auto.commit": False, "isolation.level": "read_committed",
              "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
got = 0
deadline = time.perf_counter() + 300
while got < n and time.perf_counter() < deadline:
    # No more than are left: a batch call waits out its timeout for a batch it cannot fill.
    got += sum(1 for m in c.consume(min(10000, n - got), 1.0) if not m.error())
c.close()
print(json.dumps({"produce_MBps": round(n * size / 1e6 / elapsed, 1),
                  "produce_msgps": round(n / elapsed),
                  "transactions_per_s": round(n / per_txn / elapsed, 1) if per_txn else None,
                  "delivery_errors": errors[0], "unflushed": left,
                  "read_committed": got, "expected": n}))
'''


def run_workload(bootstrap: str, args: argparse.Namespace, per_txn: int,
                 replication: int = 1) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WORKLOAD, bootstrap, str(args.n), str(args.size),
         str(args.partitions), str(per_txn), str(replication)],
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        return {"failed": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def workloads(args: argparse.Namespace) -> list[tuple[str, int]]:
    sizes = [int(t) for t in args.transactions.split(",") if t]
    return [("idempotent", 0), *((f"transactions of {t}", t) for t in sizes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--transactions", default="100,10000",
                        help="records per transaction, comma-separated")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--replication", type=int, default=1,
                        help="replicas of kbroker's topic (the reference's has 1)")
    args = parser.parse_args()

    binary = reference_binary()
    ratios: dict[str, list[float]] = {name: [] for name, _ in workloads(args)}
    for round_number in range(1, args.rounds + 1):
        results: dict[str, dict[str, dict]] = {"reference": {}, "kbroker": {}}
        with reference_broker(binary) as bootstrap:
            for name, per_txn in workloads(args):
                results["reference"][name] = run_workload(bootstrap, args, per_txn)
        with kbroker_cluster() as cluster:
            for name, per_txn in workloads(args):
                results["kbroker"][name] = run_workload(cluster.bootstrap, args, per_txn,
                                                        args.replication)
        for broker, runs in results.items():
            for name, result in runs.items():
                print(json.dumps({"round": round_number, "broker": broker, "workload": name,
                                  **result}), flush=True)
        for name in ratios:
            ours, theirs = results["kbroker"][name], results["reference"][name]
            if "produce_MBps" in ours and "produce_MBps" in theirs:
                ratios[name].append(round(ours["produce_MBps"] / theirs["produce_MBps"], 2))
    print(json.dumps({
        "workload": f"{args.n} x {args.size} B, acks=all, {args.partitions} partitions, "
                    f"kbroker's replication factor {args.replication}",
        "rounds": args.rounds,
        "produce_ratio_medians": {name: statistics.median(values) if values else None
                                  for name, values in ratios.items()},
        "produce_ratios": ratios,
    }))


if __name__ == "__main__":
    main()
