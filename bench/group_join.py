"""Consumer group timings, classic and consumer (KIP-848) group protocols side by side, and
beside the reference broker, in one run.

    python bench/group_join.py [--rounds 5] [--records 3000] [--members 10]
                               [--heartbeat-ms 1000] [--delay-ms 3000]
                               [--protocols classic,consumer]

Starts a local kbroker cluster (every service a process, free loopback ports, a temporary data
folder; handlers with group.initial.rebalance.delay.ms = DELAY) and the reference broker
(Tansu, in memory; see bench/throughput.py), then runs the same workload against each with
confluent-kafka in a separate process:

- first record: RECORDS records are in a 3-partition topic; a consumer of a new group
  subscribes, and the time from subscribe() to its first record and to the last one is taken
  (ROUNDS groups, one after the other, after one warm-up group that creates what the broker
  creates on first use, such as __consumer_offsets);
- rebalance: MEMBERS consumers share a topic of 2 x MEMBERS partitions; once the group is
  stable, one member closes (LeaveGroup) and the time from close() to the moment every
  remaining member holds its new assignment (together covering every partition) is taken;
  a new member then joins to bring the group back to MEMBERS (also timed), ROUNDS times.

Each workload runs once per group protocol (``--protocols``): ``classic`` (JoinGroup and
SyncGroup, librdkafka's default eager assignors; the group waits
group.initial.rebalance.delay.ms = DELAY for more members before its first generation) and
``consumer`` (``group.protocol=consumer``: ConsumerGroupHeartbeat with the broker's uniform
assignor, no initial delay, partitions handed over one member at a time). Sessions are 10 s and
heartbeats every HEARTBEAT ms under both (members learn of a rebalance from a heartbeat, so it
bounds the rebalance time from below): the classic members set session.timeout.ms and
heartbeat.interval.ms, the consumer protocol takes them from the broker
(group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms). The reference
broker runs the protocols it serves (a protocol it refuses is reported, not timed).

Prints one JSON line per broker and protocol, then the ratios: kbroker's consumer protocol over
its classic protocol, and kbroker over the reference for each protocol both ran.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import kbroker_cluster, reference_broker  # noqa: E402

WORKLOAD = r'''
import json, statistics, sys, threading, time, uuid
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap = sys.argv[1]
rounds, records, members, heartbeat_ms = (int(a) for a in sys.argv[2:6])
protocol = sys.argv[6]
admin = AdminClient({"bootstrap.servers": bootstrap})
topic = f"groups-{uuid.uuid4().hex[:8]}"
shared = f"rebalance-{uuid.uuid4().hex[:8]}"
for f in admin.create_topics([NewTopic(topic, 3, 1),
                              NewTopic(shared, 2 * members, 1)]).values():
    f.result(30)
time.sleep(0.5)
producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
for i in range(records):
    producer.produce(topic, b"x" * 100, key=str(i).encode())
assert producer.flush(60) == 0

def config(group):
    settings = {"bootstrap.servers": bootstrap, "group.id": group,
                "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if protocol == "consumer":  # session and heartbeat interval are the broker's
        settings["group.protocol"] = "consumer"
    else:
        settings.update({"session.timeout.ms": 10000, "heartbeat.interval.ms": heartbeat_ms})
    return settings

def first_record(group):
    consumer = Consumer(config(group))
    started = time.perf_counter()
    consumer.subscribe([topic])
    first, got, deadline = None, 0, started + 120
    while got < records and time.perf_counter() < deadline:
        message = consumer.poll(0.05)
        if message is None:
            continue
        if message.error():
            if message.error().fatal() or "UNSUPPORTED" in message.error().name():
                raise SystemExit(f"unsupported: {message.error()}")
            continue
        if first is None:
            first = time.perf_counter() - started
        got += 1
    last = time.perf_counter() - started
    consumer.close()
    return first, last, got

class Member(threading.Thread):
    def __init__(self, group):
        super().__init__(daemon=True)
        self.consumer = Consumer(config(group))
        self.assigned = frozenset()
        self.assigned_at = 0.0
        self.stopping = threading.Event()

    # Callbacks hand over what changed: everything under the classic protocol's eager
    # assignors (all revoked, then all assigned), only what moved under the consumer protocol.
    def on_assign(self, consumer, partitions):
        self.assigned = self.assigned | {p.partition for p in partitions}
        self.assigned_at = time.perf_counter()

    def on_revoke(self, consumer, partitions):
        self.assigned = self.assigned - {p.partition for p in partitions}
        self.assigned_at = time.perf_counter()

    def run(self):
        self.consumer.subscribe([shared], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_revoke)
        while not self.stopping.is_set():
            self.consumer.poll(0.02)

    def leave(self):
        started = time.perf_counter()
        self.stopping.set()
        self.join(30)
        self.consumer.close()
        return started

def settled(group, since, timeout=120):
    """Seconds from ``since`` to the last hand-over after which every member holds partitions
    and together they hold each once."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        union = set()
        for m in group:
            union |= m.assigned
        last = max(m.assigned_at for m in group)
        if (union == set(range(2 * members)) and all(m.assigned for m in group)
                and last > since and sum(len(m.assigned) for m in group) == 2 * members):
            return last - since
        time.sleep(0.005)
    raise TimeoutError("the group did not settle")

warm = first_record(f"warm-{uuid.uuid4().hex[:8]}")
firsts, lasts = [], []
for _ in range(rounds):
    first, last, got = first_record(f"new-{uuid.uuid4().hex[:8]}")
    assert got == records, (got, records)
    firsts.append(first); lasts.append(last)

group_id = f"ten-{uuid.uuid4().hex[:8]}"
group = [Member(group_id) for _ in range(members)]
started = time.perf_counter()
for m in group:
    m.start()
formed = settled(group, started)
leaves, joins = [], []
for _ in range(rounds):
    time.sleep(1.0)
    victim = group.pop(0)
    left_at = victim.leave()
    leaves.append(settled(group, left_at))
    newcomer = Member(group_id)
    joined_at = time.perf_counter()
    newcomer.start()
    group.append(newcomer)
    joins.append(settled(group, joined_at))
for m in group:
    m.leave()
med = statistics.median
print(json.dumps({
    "protocol": protocol,
    "warmup_first_record_s": round(warm[0], 3),
    "first_record_s": [round(x, 3) for x in firsts], "first_record_median_s": round(med(firsts), 3),
    "first_record_max_s": round(max(firsts), 3),
    "all_records_median_s": round(med(lasts), 3), "records": records,
    "group_formed_s": round(formed, 3),
    "leave_rebalance_s": [round(x, 3) for x in leaves],
    "leave_rebalance_median_s": round(med(leaves), 3),
    "join_rebalance_median_s": round(med(joins), 3), "members": members,
}))
'''


def run_workload(bootstrap: str, protocol: str, args: argparse.Namespace,
                 reference: bool = False) -> dict:
    """The workload's JSON line, or (the reference broker's consumer protocol)
    {"protocol": ..., "unsupported": reason} when the broker does not serve the protocol."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", WORKLOAD, bootstrap, str(args.rounds), str(args.records),
             str(args.members), str(args.heartbeat_ms), protocol],
            capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        if reference and protocol != "classic":
            return {"protocol": protocol, "unsupported": f"no result within {args.timeout} s"}
        raise
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        if reference and protocol != "classic":
            return {"protocol": protocol, "unsupported": last[-300:]}
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_reference(protocols: list[str], args: argparse.Namespace) -> dict[str, dict]:
    with reference_broker() as bootstrap:
        return {p: run_workload(bootstrap, p, args, reference=True) for p in protocols}


def run_kbroker(protocols: list[str], args: argparse.Namespace) -> dict[str, dict]:
    # The consumer protocol's session and heartbeat interval, as the classic members ask for.
    flags = {"group_consumer_session_timeout_ms": 10_000,
             "group_consumer_min_session_timeout_ms": 10_000,
             "group_consumer_heartbeat_interval_ms": args.heartbeat_ms,
             "group_consumer_min_heartbeat_interval_ms": min(args.heartbeat_ms, 5000)}
    with kbroker_cluster(group_initial_rebalance_delay_ms=args.delay_ms,
                         service_flags={"handler": flags}) as cluster:
        return {p: run_workload(cluster.bootstrap, p, args) for p in protocols}


TIMED = ("first_record_median_s", "all_records_median_s", "group_formed_s",
         "leave_rebalance_median_s", "join_rebalance_median_s")


def ratios(ours: dict, theirs: dict) -> dict[str, float | None]:
    return {key: round(ours[key] / theirs[key], 2) if theirs.get(key) else None
            for key in TIMED if key in ours and key in theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    parser.add_argument("--delay-ms", type=int, default=3000,
                        help="kbroker's group.initial.rebalance.delay.ms (classic groups)")
    parser.add_argument("--protocols", default="classic,consumer",
                        help="group protocols to run, comma-separated: classic, consumer")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds one broker gets for one protocol's workload")
    args = parser.parse_args()
    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    unknown = set(protocols) - {"classic", "consumer"}
    if unknown or not protocols:
        parser.error(f"unknown protocols: {', '.join(sorted(unknown)) or '(none)'}")
    ours = run_kbroker(protocols, args)
    for result in ours.values():
        print(json.dumps({"broker": "kbroker",
                          "group_initial_rebalance_delay_ms": args.delay_ms, **result}),
              flush=True)
    theirs = run_reference(protocols, args)
    for result in theirs.values():
        print(json.dumps({"broker": "reference (tansu, memory)", **result}), flush=True)
    summary: dict[str, object] = {}
    if "classic" in ours and "consumer" in ours and "unsupported" not in ours["consumer"]:
        summary["kbroker_consumer_over_classic"] = ratios(ours["consumer"], ours["classic"])
    for protocol in protocols:
        if "unsupported" not in ours[protocol] and "unsupported" not in theirs[protocol]:
            summary[f"kbroker_over_reference_{protocol}"] = ratios(ours[protocol],
                                                                  theirs[protocol])
    if "classic" in ours:
        budget = (args.delay_ms + 500) / 1000
        summary["classic_first_record_within_delay_plus_500ms"] = \
            ours["classic"]["first_record_max_s"] <= budget
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
