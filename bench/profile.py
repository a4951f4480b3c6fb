"""Where the services spend their CPU under load: CPU seconds per GB moved and per request in
each service process, split by thread, and a py-spy profile of each one, in one run.

    python bench/profile.py [--n 200000] [--size 1000] [--partitions 3] [--acks 1]
                            [--replication 1] [--phases produce,consume] [--rate 250]
                            [--no-py-spy] [--out reports/profile] [--rounds 1]
                            [--warmup 5]

Starts a local kbroker cluster (every service a process, 3 log nodes, free loopback ports, a
temporary data folder) and, in a separate process, a confluent-kafka client that runs the
phases one after the other when told to (the settings of bench/throughput.py):

- produce: N records of SIZE bytes with keys, acks as given, linger.ms=5, batch.size=1 MB,
  into a topic of PARTITIONS partitions and REPLICATION replicas (min.insync.replicas 2 when
  replicated);
- consume: the same records back with manual assignment (no consumer group).

For each phase and service process: the CPU time it used (utime+stime from /proc, every
thread), in seconds per GB of record bytes moved, the share of it on the event loop's thread
(the rest is gRPC's C threads and the like), and the requests it served per second of CPU
(Kafka requests for the frontend, from its metrics). Meanwhile py-spy (``pip install py-spy``;
``--no-py-spy`` skips it) samples every service's Python stacks (``--rate`` per second, without
pausing them); the profile of each service and phase is written to OUT as collapsed stacks
(``<phase>-<service>.txt``, the input of any flame graph tool) and a flame graph
(``<phase>-<service>.svg``), and the functions with the most samples of their own, and where
the samples fall by concern (protobuf, kio, gRPC, asyncio, metrics, logging, ...), are printed
(one JSON line per phase, then a Markdown table of every phase and service).

With ``--rounds R`` the whole run repeats R times on fresh clusters; every round is printed.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import html
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import kbroker_cluster  # noqa: E402

from services.local_cluster import LocalCluster  # noqa: E402

CLIENT = r'''
import json, sys, time, uuid
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
bootstrap, n, size, partitions, acks, replication = (
    sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
    int(sys.argv[6]))
topic = f"profile-{uuid.uuid4().hex[:8]}"
admin = AdminClient({"bootstrap.servers": bootstrap})
configs = {"min.insync.replicas": "2"} if replication > 1 else {}
for f in admin.create_topics([NewTopic(topic, partitions, replication, config=configs)]).values():
    f.result(30)
time.sleep(1.0)
payload = b"x" * size
p = Producer({"bootstrap.servers": bootstrap, "acks": acks, "linger.ms": 5,
              "batch.size": 1_000_000, "compression.type": "none",
              "queue.buffering.max.messages": 1_000_000, "enable.idempotence": False})
p.produce(topic, payload, key=b"warm"); p.flush(30)
produced = 1
# The group coordinator, found once before any phase (a fresh cluster creates its offsets
# topic on the first lookup): the consumer below has a group id, so it looks it up too.
warm = Consumer({"bootstrap.servers": bootstrap, "group.id": "profile-nogroup"})
warm.committed([TopicPartition(topic, 0)], timeout=60)
warm.close()
def produce():
    global produced
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, key=str(i % 1000).encode()); break
            except BufferError:
                p.poll(0.01)
        if i % 10000 == 0: p.poll(0)
    left = p.flush(300)
    produced += n
    return {"MBps": round(n * size / 1e6 / (time.perf_counter() - t0), 1), "unflushed": left,
            "bytes": n * size}
def consume():
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "profile-nogroup",
                  "enable.auto.commit": False, "fetch.max.bytes": 52428800,
                  "max.partition.fetch.bytes": 10485760,
                  # As bench/throughput.py: no 1 s pause when the client's queue is full.
                  "fetch.queue.backoff.ms": 10})
    c.assign([TopicPartition(topic, q, 0) for q in range(partitions)])
    got = nbytes = 0
    t0 = time.perf_counter(); deadline = t0 + 300
    while got < produced and time.perf_counter() < deadline:
        # No more than are left: a batch call waits out its timeout for a batch it cannot
        # fill (the warm-up record makes the count uneven).
        for m in c.consume(min(10000, produced - got), 1.0):
            if m.error(): continue
            got += 1; nbytes += len(m.value() or b"")
    dt = time.perf_counter() - t0
    c.close()
    return {"MBps": round(nbytes / 1e6 / dt, 1), "consumed": got, "bytes": nbytes}
print("ready", flush=True)
for line in sys.stdin:
    print(json.dumps({"produce": produce, "consume": consume}[line.strip()]()), flush=True)
'''

# Where a sample's frames fall, by concern: the first pattern that matches a frame of the
# stack, from the innermost frame out, names it (so a protobuf call made by the converter
# counts as protobuf). Patterns match "function (file)" as py-spy writes frames.
CONCERNS = [
    ("metrics", re.compile(r"prometheus_client|services/\w+/metrics\.py|common/metrics\.py")),
    ("logging", re.compile(r"/logging/")),
    ("protobuf", re.compile(r"google/protobuf|SerializeToString|FromString|ParseFromString")),
    ("kio codec", re.compile(r"/kio/")),
    ("record batches (crc, headers)", re.compile(r"common/records/|crc32c")),
    ("envelopes", re.compile(r"envelopes\.py|replica_fetch_codec\.py|varints\.py")),
    ("converter", re.compile(r"frontend/converter\.py")),
    ("gRPC (Python side)", re.compile(r"grpc/|grpc_aio|_cython|cygrpc")),
    ("segments and files", re.compile(r"log/segment\.py|offset_index|time_index|index_file")),
    ("asyncio and uvloop", re.compile(r"asyncio/|uvloop")),
]


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds (utime+stime) of every thread of ``pid``, by thread name (threads of one
    name summed); "all" for the process."""
    ticks = os.sysconf("SC_CLK_TCK")
    by_name: dict[str, float] = collections.Counter()
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / ticks
            name = (task / "comm").read_text().strip()
            if task.name == str(pid):
                name = "event loop"
            by_name[name] += seconds
            total += seconds
    by_name["all"] = total
    return dict(by_name)


def scrape(port: int) -> dict[str, float]:
    """Every counter, and every histogram's sum and count, a service exposes now (from its
    Prometheus metrics), by series (name and labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "_bucket{" in line:
            continue
        series, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            values[series] = float(value)
    return values


GC_FULL = 'python_gc_collections_total{generation="2"}'
# Per phase: the series whose sum over count is the mean time of one request at each hop
# (service kind, the histogram's series without _sum/_count).
HOPS = {
    "produce": [("frontend", 'kbroker_frontend_request_total_seconds{api="Produce"}'),
                ("frontend", 'kbroker_frontend_request_phase_seconds{api="Produce",'
                             'phase="request_queue"}'),
                ("frontend", 'kbroker_frontend_request_phase_seconds{api="Produce",'
                             'phase="local"}'),
                ("handler", 'kbroker_handler_request_seconds{api="Produce"}'),
                ("handler", 'kbroker_handler_purgatory_wait_seconds{kind="produce"}'),
                ("log", "kbroker_log_append_seconds"),
                ("log", 'kbroker_log_commit_wait_seconds{outcome="committed"}'),
                ("log", 'kbroker_log_commit_wait_seconds{outcome="handed_on"}')],
    "consume": [("frontend", 'kbroker_frontend_request_total_seconds{api="Fetch"}'),
                ("frontend", 'kbroker_frontend_request_phase_seconds{api="Fetch",'
                             'phase="local"}'),
                ("frontend", 'kbroker_frontend_request_phase_seconds{api="Fetch",'
                             'phase="remote"}'),
                ("frontend", 'kbroker_frontend_request_phase_seconds{api="Fetch",'
                             'phase="response_send"}'),
                ("handler", 'kbroker_handler_request_seconds{api="Fetch"}'),
                ("log", "kbroker_log_read_seconds")],
}


def scrape_all(cluster: LocalCluster) -> dict[str, dict[str, float]]:
    return {name: scrape(svc.metrics_port) for name, svc in cluster.services.items()}


def hop_times(phase: str, before: dict[str, dict[str, float]],
              after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Mean milliseconds per request (and requests) at each hop of ``phase``, services of a
    kind pooled."""
    out: dict[str, dict[str, float]] = {}
    for kind, series in HOPS.get(phase.split("#")[0], []):
        name, brace, labels = series.partition("{")
        total = count = 0.0
        for service in after:
            if service.split("-")[0] != kind:
                continue
            for suffix in ("_sum", "_count"):
                key = f"{name}{suffix}{brace}{labels}"
                delta = after[service].get(key, 0.0) - before[service].get(key, 0.0)
                if suffix == "_sum":
                    total += delta
                else:
                    count += delta
        if count:
            out[f"{kind} {series}"] = {"mean_ms": round(1000 * total / count, 2),
                                       "requests": int(count)}
    return out


@contextlib.contextmanager
def py_spy(cluster: LocalCluster, out: Path, phase: str, rate: int,
           enabled: bool, native: bool = False) -> Iterator[dict[str, Path]]:
    """py-spy recording every service of ``cluster`` while the block runs: collapsed stacks
    per service."""
    recorders: list[subprocess.Popen[bytes]] = []
    files: dict[str, Path] = {}
    if enabled:
        spy = Path(sys.executable).with_name("py-spy")
        for name, svc in cluster.services.items():
            assert svc.proc is not None
            files[name] = out / f"{phase}-{name}.txt"
            recorders.append(subprocess.Popen(
                [str(spy), "record", "--pid", str(svc.proc.pid), "--rate", str(rate),
                 *(["--native"] if native else ["--nonblocking"]),
                 "--format", "raw", "--output", str(files[name])],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # attached
    try:
        yield files
    finally:
        for recorder in recorders:
            recorder.send_signal(signal.SIGINT)
        for recorder in recorders:
            try:
                recorder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                recorder.kill()
                recorder.wait()


def read_stacks(path: Path) -> list[tuple[list[str], int]]:
    stacks = []
    if not path.exists():
        return stacks
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append((frames.split(";"), int(count)))
    return stacks


def _short(frame: str) -> str:
    """``function (path:line)`` with the path cut to its package-relative tail."""
    match = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return frame
    function, path = match.groups()
    for marker in ("site-packages/", "/services/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{function} ({path})"


def summarise(stacks: list[tuple[list[str], int]], top: int = 12) -> dict:
    """The functions with the most samples of their own, and the samples by concern."""
    total = sum(count for _, count in stacks) or 1
    own: collections.Counter[str] = collections.Counter()
    concerns: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        own[_short(frames[-1])] += count
        concern = "other Python"
        for frame in reversed(frames):
            found = next((name for name, pattern in CONCERNS if pattern.search(frame)), None)
            if found is not None:
                concern = found
                break
        concerns[concern] += count
    return {
        "samples": total,
        "by_concern_pct": {name: round(100 * c / total, 1) for name, c in concerns.most_common()},
        "top_own_pct": {name: round(100 * c / total, 1) for name, c in own.most_common(top)},
    }


def flame_graph(stacks: list[tuple[list[str], int]], title: str, path: Path) -> None:
    """A flame graph of collapsed ``stacks`` as an SVG (hover a frame for its name and
    share)."""
    root: dict = {"n": 0, "kids": {}}
    for frames, count in stacks:
        node = root
        node["n"] += count
        for frame in frames:
            node = node["kids"].setdefault(frame, {"n": 0, "kids": {}})
            node["n"] += count
    width, row = 1200, 16
    total = root["n"] or 1
    rects: list[str] = []
    depth_max = 0

    def draw(node: dict, x: float, depth: int) -> None:
        nonlocal depth_max
        for name, kid in sorted(node["kids"].items()):
            w = kid["n"] / total * width
            if w >= 0.3:
                depth_max = max(depth_max, depth)
                label = html.escape(_short(name))
                hue = 20 + (hash(name.split(" (")[0]) % 40)
                text = label if w > 40 else ""
                rects.append(
                    f'<g><title>{label} ({100 * kid["n"] / total:.1f}%)</title>'
                    f'<rect x="{x:.1f}" y="{{y{depth}}}" width="{w:.1f}" height="{row - 1}" '
                    f'fill="hsl({hue},80%,60%)"/>'
                    f'<text x="{x + 2:.1f}" y="{{t{depth}}}" font-size="10" '
                    f'clip-path="inset(0 0 0 0)">{text[: int(w / 6)]}</text></g>')
                draw(kid, x, depth + 1)
            x += w

    draw(root, 0.0, 0)
    height = (depth_max + 3) * row
    body = "\n".join(rects)
    for depth in range(depth_max + 1):
        y = height - (depth + 2) * row
        body = body.replace(f"{{y{depth}}}", str(y)).replace(f"{{t{depth}}}", str(y + 11))
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace"><text x="4" y="14" font-size="12">{html.escape(title)} '
        f'({root["n"]} samples)</text>\n{body}\n</svg>\n')


def run_round(args: argparse.Namespace, out: Path) -> dict:
    results: dict = {}
    with kbroker_cluster(log_nodes=3) as cluster:
        client = subprocess.Popen(
            [sys.executable, "-c", CLIENT, cluster.bootstrap, str(args.n), str(args.size),
             str(args.partitions), args.acks, str(args.replication)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert client.stdin is not None and client.stdout is not None
        try:
            if client.stdout.readline().strip() != "ready":
                raise RuntimeError("client failed to start")
            # The frontend compiles its codecs in the background after it starts serving:
            # not part of any phase.
            time.sleep(args.warmup)
            pids = {name: svc.proc.pid for name, svc in cluster.services.items()
                    if svc.proc is not None}
            phases = [p.strip() for p in args.phases.split(",") if p.strip()]
            for number, phase in enumerate(phases):
                # A phase that runs more than once is labelled with its turn (consume#2).
                label = phase if phases.count(phase) == 1 else \
                    f"{phase}#{phases[:number + 1].count(phase)}"
                metrics_before = scrape_all(cluster)
                with py_spy(cluster, out, label, args.rate, args.py_spy,
                            args.native) as files:
                    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    client_before = cpu_seconds(client.pid)["all"]
                    started = time.perf_counter()
                    client.stdin.write(phase + "\n")
                    client.stdin.flush()
                    outcome = json.loads(client.stdout.readline())
                    wall = time.perf_counter() - started
                    after = {name: cpu_seconds(pid) for name, pid in pids.items()}
                    client_cpu = cpu_seconds(client.pid)["all"] - client_before
                metrics_after = scrape_all(cluster)
                hops = hop_times(phase, metrics_before, metrics_after)
                gigabytes = outcome["bytes"] / 1e9
                services = {}
                for name in pids:
                    used = {thread: after[name].get(thread, 0) - before[name].get(thread, 0)
                            for thread in after[name]}
                    services[name] = {
                        "cpu_s": round(used["all"], 2),
                        # Full garbage collections (each walks every object not frozen).
                        "gc_full_collections": int(
                            metrics_after.get(name, {}).get(GC_FULL, 0)
                            - metrics_before.get(name, {}).get(GC_FULL, 0)),
                        "cpu_s_per_GB": round(used["all"] / gigabytes, 1),
                        "event_loop_share": round(used.get("event loop", 0) / used["all"], 2)
                        if used["all"] else 0.0,
                    }
                total_cpu = sum(s["cpu_s"] for s in services.values())
                results[label] = {
                    **outcome, "wall_s": round(wall, 2),
                    "hops": hops,
                    "client_cpu_cores": round(client_cpu / wall, 2),
                    "services_cpu_s_per_GB": round(total_cpu / gigabytes, 1),
                    "services_cpu_cores": round(total_cpu / wall, 2),
                    "services": services,
                }
                for name, path in files.items():
                    stacks = read_stacks(path)
                    if stacks:
                        results[label]["services"][name]["profile"] = summarise(stacks)
                        flame_graph(stacks, f"{name}, {label}: {args.n} x {args.size} B, "
                                            f"acks={args.acks}, RF={args.replication}",
                                    path.with_suffix(".svg"))
        finally:
            with contextlib.suppress(OSError):
                client.stdin.close()
            client.wait(timeout=60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--acks", default="1")
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--phases", default="produce,consume")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--no-py-spy", dest="py_spy", action="store_false")
    parser.add_argument("--native", action="store_true",
                        help="py-spy samples native frames too (C extensions: gRPC, protobuf, "
                             "uvloop), pausing each process to do so")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "profile")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=5.0,
                        help="seconds between the client's first record and the first phase")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for round_number in range(1, args.rounds + 1):
        results = run_round(args, args.out)
        for phase, result in results.items():
            print(json.dumps({"round": round_number, "phase": phase, **result}), flush=True)
        print(markdown_table(results), flush=True)


def markdown_table(results: dict) -> str:
    """Each phase and service as a row of a Markdown table: CPU seconds per GB, the share of
    them on the event loop's thread, and where py-spy found the samples (the three largest
    concerns and the function with the most samples of its own)."""
    rows = ["| phase | MB/s | service | CPU s/GB | event loop | full GCs | samples by concern | "
            "top function (own samples) |", "|---|---|---|---|---|---|---|---|"]
    for phase, result in results.items():
        for name, service in sorted(result["services"].items(),
                                    key=lambda item: -item[1]["cpu_s"]):
            if service["cpu_s"] < 0.05:
                continue
            profile = service.get("profile", {})
            concerns = ", ".join(f"{concern} {share}%" for concern, share in
                                 list(profile.get("by_concern_pct", {}).items())[:3])
            top = next(iter(profile.get("top_own_pct", {}).items()), None)
            rows.append(f"| {phase} | {result['MBps']} | {name} | {service['cpu_s_per_GB']} | "
                        f"{round(100 * service['event_loop_share'])}% | "
                        f"{service['gc_full_collections']} | {concerns} | "
                        f"{f'{top[0]} {top[1]}%' if top else ''} |")
        rows.append(f"| {phase} | {result['MBps']} | all services | "
                    f"{result['services_cpu_s_per_GB']} | | | "
                    f"{result['services_cpu_cores']} cores busy | |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
