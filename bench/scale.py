"""Scale curves: produce and fetch throughput and p99 against the partitions written, and
produce throughput and p99 against the producer connections, beside the reference broker, in
one run; memory per partition and per connection; PNG plots of the curves.

    python bench/scale.py [--partitions 1,10,100,1000] [--connections 10,100,1000]
                          [--nodes 1,2,3] [--seconds 8] [--brokers kbroker,reference]
                          [--out reports/scale]

For each broker (a local kbroker cluster: every service a process, 3 log nodes, 2 handlers;
the reference broker, Tansu in memory, see bench/throughput.py), one after the other, on one
broker instance each:

- partitions: for each count P, a topic of P partitions (replication factor 1: the reference
  is a single broker) written for SECONDS by 4 producers, each sending to every partition
  (one connection per partition leader, one request in flight, 256 records of 1 KB per
  request spread over the partitions of that leader, acks=1), then read back by one fetcher
  per leader (all its partitions in each Fetch);
- connections: for each count C, C producers (one connection each) writing a topic of 10
  partitions for SECONDS, 16 records of 1 KB per request, acks=1;
- operations: with every topic above in the cluster (1,121 partitions), Metadata of every
  topic 20 times, the coordinator of each of GROUPS (200) consumer groups one after the other,
  then the groups concurrently, each committing an offset for each partition of the
  10-partition topic and fetching them back (a group without members, as a consumer with
  manual assignment commits);
- memory: on a fresh broker, the resident memory idle, after creating a topic of 1,000
  partitions (no records) and while 1,000 connections (each answered one Metadata request)
  stay open: KB per idle partition and per idle connection;
- log nodes and handlers (kbroker only): the partitions load on a topic of 12 partitions, on
  clusters of N log nodes and N handlers for each N of ``--nodes``.

The load is bench/scale_client.py (the wire protocol spoken directly, batches built once,
each answer read into a buffer its connection keeps: next to no client CPU per request, so the
curves measure the brokers on this 2-core machine rather than the client). p99 is of the
request round trips (one in flight per connection: at saturation, the queueing a client
sees). Memory is the resident size (VmRSS, less the pages of
the frontend's spool files that a process maps: see ``sustained.rss_mb``) of every service
process together (the reference: its one process), sampled while the load runs; per partition
it is the slope from the second-smallest to the largest partition count (topics accumulate, so
the counts are cumulative), per connection the slope from the fewest to the most
connections. The reference keeps every record in memory (its storage is ``memory://``): its
memory grows with the data written, not only with partitions. Each point also gives the CPU
(user and system) every service process used over it, per MB produced
(``cpu_ms_per_MB_produced``; for the partitions curve, the fetch phase included).

Prints one JSON line per point, then Markdown tables; writes OUT/scale.json and the plots
OUT/scale-partitions.png, OUT/scale-connections.png and OUT/scale-nodes.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from fetch_sessions import cpu_seconds  # noqa: E402
from sustained import rss_mb  # noqa: E402
from throughput import kbroker_cluster, reference_binary, wait_port  # noqa: E402

from services.local_cluster import free_port  # noqa: E402

CLIENT = ROOT / "bench" / "scale_client.py"


@contextlib.contextmanager
def kbroker(log_nodes: int = 3, handlers: int = 2) -> Iterator[tuple[str, list[int]]]:
    with kbroker_cluster(log_nodes=log_nodes, handlers=handlers) as cluster:
        yield cluster.bootstrap, [svc.proc.pid for svc in cluster.services.values()
                                  if svc.proc is not None]


@contextlib.contextmanager
def reference() -> Iterator[tuple[str, list[int]]]:
    port = free_port()
    ref = subprocess.Popen(
        [str(reference_binary()), "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{port}",
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        yield f"127.0.0.1:{port}", [ref.pid]
    finally:
        ref.terminate()
        ref.wait(timeout=10)


def create_topic(bootstrap: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"scale-{partitions}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(180)
    return topic


def run_point(bootstrap: str, pids: list[int], topic: str, *options: str) -> dict[str, Any]:
    """One run of the load client; the services' memory sampled two seconds into it, and the
    CPU they used over the whole run per MB produced (produce and fetch phases together)."""
    cpu_before = cpu_seconds(pids)
    client = subprocess.Popen([sys.executable, str(CLIENT), bootstrap, topic, *options],
                              stdout=subprocess.PIPE, text=True)
    assert client.stdout is not None
    memory = 0.0
    result: dict[str, Any] = {}
    try:
        for line in client.stdout:
            value = json.loads(line)
            if "running" in value:
                time.sleep(2.0)
                memory = round(sum(rss_mb(pid) for pid in pids), 1)
            else:
                result = value
        client.wait(timeout=120)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    if not memory:  # the operations: no load to sample during
        memory = round(sum(rss_mb(pid) for pid in pids), 1)
    if client.returncode != 0 or not result:
        raise RuntimeError(f"load client failed on {topic} ({client.returncode})")
    cpu = cpu_seconds(pids) - cpu_before
    produced = result.get("produced_bytes", 0) / 1e6
    if produced:
        result["cpu_ms_per_MB_produced"] = round(1000 * cpu / produced, 2)
    return {**result, "rss_mb": memory}


def slope(points: list[dict[str, Any]], key: str) -> float | None:
    if len(points) < 2:
        return None
    first, last = points[0], points[-1]
    if last[key] == first[key]:
        return None
    return round(1024 * (last["rss_mb"] - first["rss_mb"]) / (last[key] - first[key]), 1)


def run_broker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    start = kbroker if name == "kbroker" else reference
    partition_points: list[dict[str, Any]] = []
    connection_points: list[dict[str, Any]] = []
    with start() as (bootstrap, pids):
        idle = round(sum(rss_mb(pid) for pid in pids), 1)
        total_partitions = 0
        for count in args.partitions:
            topic = create_topic(bootstrap, count)
            total_partitions += count
            point = {"broker": name, "curve": "partitions", "partitions": count,
                     "partitions_in_cluster": total_partitions,
                     **run_point(bootstrap, pids, topic, "--producers", "4",
                                 "--seconds", str(args.seconds), "--fetch")}
            partition_points.append(point)
            print(json.dumps(point), flush=True)
        topic = create_topic(bootstrap, 10)
        for count in args.connections:
            point = {"broker": name, "curve": "connections", "connections": count,
                     **run_point(bootstrap, pids, topic, "--producers", str(count),
                                 "--records", "16", "--seconds", str(args.seconds))}
            connection_points.append(point)
            print(json.dumps(point), flush=True)
        operations = {"broker": name, "curve": "operations",
                      **run_point(bootstrap, pids, topic, "--operations",
                                  "--metadata", "20", "--groups", str(args.groups))}
        print(json.dumps(operations), flush=True)
    return {
        "operations": operations,
        "idle_rss_mb": idle, "partitions": partition_points, "connections": connection_points,
        "kb_per_partition": slope(partition_points[1:], "partitions_in_cluster"),
        "kb_per_connection": slope(connection_points, "connections"),
    }


def run_memory(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Memory of idle partitions and idle connections on a fresh broker: the services'
    resident memory idle, after creating a topic of ``--memory-partitions`` partitions (no
    records), and while ``--memory-connections`` connections, each answered one Metadata
    request, stay open."""
    start = kbroker if name == "kbroker" else reference
    with start() as (bootstrap, pids):
        time.sleep(3.0)
        idle = sum(rss_mb(pid) for pid in pids)
        topic = create_topic(bootstrap, args.memory_partitions)
        time.sleep(3.0)
        with_partitions = sum(rss_mb(pid) for pid in pids)
        point = run_point(bootstrap, pids, topic, "--idle", "--producers",
                          str(args.memory_connections), "--seconds", "4")
    result = {
        "broker": name, "curve": "memory", "idle_rss_mb": round(idle, 1),
        "partitions": args.memory_partitions, "connections": args.memory_connections,
        "rss_with_partitions_mb": round(with_partitions, 1),
        "rss_with_connections_mb": point["rss_mb"],
        "kb_per_idle_partition": round(1024 * (with_partitions - idle)
                                       / args.memory_partitions, 1),
        "kb_per_idle_connection": round(1024 * (point["rss_mb"] - with_partitions)
                                        / args.memory_connections, 1),
    }
    print(json.dumps(result), flush=True)
    return result


def run_nodes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The partitions load on 12 partitions, on kbroker clusters of N log nodes and N
    handlers."""
    points = []
    for count in args.nodes:
        with kbroker(log_nodes=count, handlers=count) as (bootstrap, pids):
            topic = create_topic(bootstrap, 12)
            point = {"broker": "kbroker", "curve": "nodes", "nodes": count,
                     **run_point(bootstrap, pids, topic, "--producers", "4",
                                 "--seconds", str(args.seconds), "--fetch")}
        points.append(point)
        print(json.dumps(point), flush=True)
    return points


def plot(results: dict[str, dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {"kbroker": "-o", "reference": "--s"}
    curves = [("partitions", "partitions written", [("produce", "produce"), ("fetch", "fetch")]),
              ("connections", "producer connections", [("produce", "produce")]),
              ("nodes", "log nodes and handlers", [("produce", "produce"), ("fetch", "fetch")])]
    for curve, label, kinds in curves:
        fig, (rate, p99) = plt.subplots(1, 2, figsize=(11, 4.2))
        for broker, result in results.items():
            points = result.get(curve)
            if not points:
                continue
            xs = [p[curve] for p in points]
            for kind, title in kinds:
                if f"{kind}_MBps" not in points[0]:
                    continue
                rate.plot(xs, [p[f"{kind}_MBps"] for p in points], styles.get(broker, "-"),
                          label=f"{broker} {title}")
                p99.plot(xs, [p[f"{kind}_p99_ms"] for p in points], styles.get(broker, "-"),
                         label=f"{broker} {title}")
        for axis, ylabel in ((rate, "MB/s"), (p99, "p99 request round trip (ms)")):
            axis.set_xscale("log")
            axis.set_xlabel(label)
            axis.set_ylabel(ylabel)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize=8)
        rate.set_ylim(bottom=0)
        p99.set_yscale("log")
        if curve == "nodes":
            for axis in (rate, p99):
                axis.set_xscale("linear")
                axis.set_xticks([p["nodes"] for p in results.get("kbroker", {}).get("nodes", [])])
        fig.suptitle(f"Throughput and p99 against {label} (1 KB records, acks=1, 2 cores)")
        fig.tight_layout()
        fig.savefig(out / f"scale-{curve}.png", dpi=90)
        plt.close(fig)


def markdown(results: dict[str, dict[str, Any]]) -> str:
    rows = ["| broker | partitions | produce MB/s | produce p99 ms | fetch MB/s | fetch p99 ms "
            "| RSS MB |", "|---|---|---|---|---|---|---|"]
    for broker, result in results.items():
        for p in result["partitions"]:
            rows.append(f"| {broker} | {p['partitions']} | {p['produce_MBps']} | "
                        f"{p['produce_p99_ms']} | {p.get('fetch_MBps', '')} | "
                        f"{p.get('fetch_p99_ms', '')} | {p['rss_mb']} |")
    rows += ["", "| broker | connections | produce MB/s | produce p99 ms | errors | RSS MB |",
             "|---|---|---|---|---|---|"]
    for broker, result in results.items():
        for p in result["connections"]:
            rows.append(f"| {broker} | {p['connections']} | {p['produce_MBps']} | "
                        f"{p['produce_p99_ms']} | {p['produce_errors']} | {p['rss_mb']} |")
    nodes = results.get("kbroker", {}).get("nodes", [])
    if nodes:
        rows += ["", "| log nodes and handlers | produce MB/s | produce p99 ms | fetch MB/s | "
                 "fetch p99 ms |", "|---|---|---|---|---|"]
        for p in nodes:
            rows.append(f"| {p['nodes']} | {p['produce_MBps']} | {p['produce_p99_ms']} | "
                        f"{p['fetch_MBps']} | {p['fetch_p99_ms']} |")
    rows += ["", "| broker | partitions in cluster | Metadata p50 / p99 ms | groups | "
             "FindCoordinator p50 / p99 ms | OffsetCommit p50 / p99 ms | "
             "OffsetFetch p50 / p99 ms | errors |", "|---|---|---|---|---|---|---|---|"]
    for broker, result in results.items():
        o = result.get("operations")
        if o:
            rows.append(
                f"| {broker} | {o['partitions_in_cluster']} | {o['metadata_p50_ms']} / "
                f"{o['metadata_p99_ms']} | {o['groups']} | {o['find_coordinator_p50_ms']} / "
                f"{o['find_coordinator_p99_ms']} | {o['offset_commit_p50_ms']} / "
                f"{o['offset_commit_p99_ms']} | {o['offset_fetch_p50_ms']} / "
                f"{o['offset_fetch_p99_ms']} | {o['group_errors']} |")
    rows += ["", "| broker | idle RSS MB | KB per partition under load (slope) | KB per "
             "connection under load (slope) | KB per idle partition | KB per idle connection |",
             "|---|---|---|---|---|---|"]
    for broker, result in results.items():
        memory = result.get("memory", {})
        rows.append(f"| {broker} | {result['idle_rss_mb']} | {result['kb_per_partition']} | "
                    f"{result['kb_per_connection']} | "
                    f"{memory.get('kb_per_idle_partition', '')} | "
                    f"{memory.get('kb_per_idle_connection', '')} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="1,10,100,1000")
    parser.add_argument("--connections", default="10,100,1000")
    parser.add_argument("--nodes", default="1,2,3",
                        help="kbroker only: log nodes and handlers (as many of each) of the "
                             "clusters of the third curve (empty: none)")
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--memory-partitions", type=int, default=1000,
                        help="idle partitions of the memory measurement (0: none)")
    parser.add_argument("--memory-connections", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--brokers", default="kbroker,reference")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "scale")
    args = parser.parse_args()
    args.partitions = [int(v) for v in args.partitions.split(",") if v]
    args.connections = [int(v) for v in args.connections.split(",") if v]
    args.nodes = [int(v) for v in args.nodes.split(",") if v]
    args.out.mkdir(parents=True, exist_ok=True)
    results = {name: run_broker(name, args) for name in args.brokers.split(",") if name}
    if args.memory_partitions and args.memory_connections:
        for name in results:
            results[name]["memory"] = run_memory(name, args)
    if args.nodes and "kbroker" in results:
        results["kbroker"]["nodes"] = run_nodes(args)
    (args.out / "scale.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out)
    print(markdown(results), flush=True)


if __name__ == "__main__":
    main()
