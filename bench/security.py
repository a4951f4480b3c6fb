"""The cost of TLS and SASL: produce throughput and connection set-up per listener, side by
side with plaintext and with the reference broker, in one run.

    python bench/security.py [--n 200000] [--size 1000] [--partitions 3]
                             [--connections 40] [--rounds 3] [--internal-tls]
                             [--only SSL,SASL_SSL]

Starts one local kbroker cluster (every service a process, free loopback ports, a temporary
data folder) whose frontend has four listeners:

- PLAINTEXT;
- SSL (server certificate only; made at start by a CA generated into the temporary folder);
- SASL_PLAINTEXT with SCRAM-SHA-512 (one user from ``sasl_users_file``);
- SASL_SSL with SCRAM-SHA-512;

with ``--internal-tls`` a second cluster whose services talk gRPC over mutual TLS
(``ClusterSpec.internal_tls``), read through its PLAINTEXT listener (the cost of
service-to-service TLS); and the reference broker (Tansu, plaintext, in memory; see
bench/throughput.py) for scale. Every target stays up for the whole run.

Per round and target, one confluent-kafka process:

- produce: N records of SIZE bytes with keys, linger.ms=5, batch.size=1 MB, no compression, into
  a new topic of PARTITIONS partitions (replication factor 1), once with acks=1 and once with
  acks=all: MB/s;
- connection set-up: CONNECTIONS times a new connection until its first answered Metadata
  request, as a client opens one: TCP, the TLS handshake (Python's ssl, verifying the server),
  ApiVersions, SaslHandshake and the two SCRAM SaslAuthenticate round trips where the listener
  asks for them: median and p99 in ms. Raw sockets rather than a new librdkafka client: that
  one drops its bootstrap connection once the Metadata answer names the brokers, and an
  application request still in flight on it is sent again only after a 50 ms back-off, which
  would hide the broker's cost in noise.

Beside the throughput, the CPU time spent per MB produced (both acks runs) by the client process,
the frontend and every service of the cluster together, from /proc: on a machine whose cores
the client and every service share, the client's TLS work lowers the throughput too; these say
who pays.

With ``--rounds R`` the targets run R times, in the reverse order every other round (the
machine's load drifts; alternating exposes every target to it alike). Prints one JSON line per
round and target, then one per target with the medians over the rounds, and the medians of the
per-round throughput ratios to the first cluster's PLAINTEXT listener (``*_vs_kbroker
PLAINTEXT``; a ratio is taken within one round, under the same load) and to the reference
broker (``*_vs_reference``). With the defaults and ``--internal-tls`` a run takes about four
minutes on two cores.
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import reference_binary, reference_broker  # noqa: E402

from services.local_cluster import ClusterSpec, LocalCluster, free_port_range  # noqa: E402
from tests.tls_material import CertificateAuthority, internal_tls_dir  # noqa: E402

HOST = "127.0.0.1"
USER, PASSWORD = "bench", "bench-secret"
MECHANISM = "SCRAM-SHA-512"
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

WORKLOAD = r'''
import base64, hashlib, hmac, json, os, socket, ssl, statistics, struct, sys, time, uuid
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
config = json.loads(sys.argv[1])
user, password = sys.argv[6], sys.argv[7]
frontend_pids = [int(p) for p in sys.argv[8].split(",") if p]
cluster_pids = [int(p) for p in sys.argv[9].split(",") if p]
TICK = os.sysconf("SC_CLK_TCK")

def cpu_seconds(pids):
    total = 0
    for pid in pids:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK

cpu = {"client": 0.0, "frontend": 0.0, "cluster": 0.0}
n, size, partitions, connections = (int(a) for a in sys.argv[2:6])
admin = AdminClient(config)

def produce(acks):
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    time.sleep(0.3)
    p = Producer({**config, "acks": acks, "linger.ms": 5, "batch.size": 1_000_000,
                  "compression.type": "none", "queue.buffering.max.messages": 1_000_000,
                  "enable.idempotence": False})
    p.list_topics(topic, timeout=30)  # connected and authenticated before the clock starts
    errors = [0]
    def on_delivery(err, msg):
        if err: errors[0] += 1
    payload = b"x" * size
    before = time.process_time(), cpu_seconds(frontend_pids), cpu_seconds(cluster_pids)
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, key=str(i % 1000).encode(), on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10000 == 0: p.poll(0)
    left = p.flush(300)
    seconds = time.perf_counter() - t0
    after = time.process_time(), cpu_seconds(frontend_pids), cpu_seconds(cluster_pids)
    for key, b, a in zip(("client", "frontend", "cluster"), before, after):
        cpu[key] += a - b
    if errors[0] or left:
        raise SystemExit(f"acks={acks}: {errors[0]} delivery errors, {left} unflushed")
    return round(n * size / 1e6 / seconds, 1)

def frame(api, version, correlation, body=b""):
    message = struct.pack(">hhih", api, version, correlation, 5) + b"bench" + body
    return struct.pack(">i", len(message)) + message

def exchange(sock, data):
    sock.sendall(data)
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk: raise SystemExit("connection closed")
        head += chunk
    size, body = struct.unpack(">i", head)[0], b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk: raise SystemExit("connection closed")
        body += chunk
    return body[4:]  # after the correlation id

def authenticate(sock, correlation):
    answer = exchange(sock, frame(17, 1, correlation, struct.pack(">h", 13) + b"SCRAM-SHA-512"))
    assert struct.unpack(">h", answer[:2])[0] == 0, "SaslHandshake failed"
    def sasl(token, correlation):
        body = exchange(sock, frame(36, 1, correlation, struct.pack(">i", len(token)) + token))
        error, length = struct.unpack(">hh", body[:4])
        at = 4 + max(length, 0)
        assert error == 0, body[4:at]
        size = struct.unpack(">i", body[at:at + 4])[0]
        return body[at + 4:at + 4 + size]
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user},r={nonce}"
    first = sasl(f"n,,{bare}".encode(), correlation + 1).decode()
    fields = dict(item.split("=", 1) for item in first.split(","))
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(fields["s"]),
                                 int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", "sha512").digest()
    without_proof = f"c=biws,r={fields['r']}"
    auth_message = f"{bare},{first},{without_proof}".encode()
    signature = hmac.new(hashlib.sha512(client_key).digest(), auth_message, "sha512").digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    final = sasl(f"{without_proof},p={proof}".encode(), correlation + 2).decode()
    server_key = hmac.new(salted, b"Server Key", "sha512").digest()
    expected = base64.b64encode(hmac.new(server_key, auth_message, "sha512").digest()).decode()
    assert final == f"v={expected}", "server signature does not verify"

def connect_ms():
    """Fresh connections until their first answered Metadata request: TCP, TLS handshake,
    ApiVersions, SaslHandshake and two SaslAuthenticate round trips as the listener asks."""
    protocol = config.get("security.protocol", "PLAINTEXT")
    host, port = config["bootstrap.servers"].split(",")[0].rsplit(":", 1)
    context = None
    if protocol.endswith("SSL"):
        context = ssl.create_default_context(cafile=config["ssl.ca.location"])
    times = []
    for _ in range(connections):
        t0 = time.perf_counter()
        sock = socket.create_connection((host, int(port)), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=host)
        exchange(sock, frame(18, 0, 1))
        if protocol.startswith("SASL"):
            authenticate(sock, 2)
        exchange(sock, frame(3, 1, 5, struct.pack(">i", 0)))  # brokers, no topics
        times.append((time.perf_counter() - t0) * 1000)
        sock.close()
    times.sort()
    p99 = times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]
    return round(statistics.median(times), 2), round(p99, 2)

out = {"acks1_MBps": produce("1"), "acksall_MBps": produce("all")}
megabytes = 2 * n * size / 1e6
if cluster_pids:
    out.update({f"{key}_cpu_ms_per_MB": round(seconds * 1000 / megabytes, 2)
                for key, seconds in cpu.items()})
out["connect_p50_ms"], out["connect_p99_ms"] = connect_ms()
print(json.dumps(out))
'''


@dataclass
class Target:
    """One listener to measure: its name, the client settings that reach it, and the target
    its ratio is taken against."""

    name: str
    config: dict[str, str]
    baseline: str
    frontend_pids: list[int] = field(default_factory=list)
    cluster_pids: list[int] = field(default_factory=list)
    results: list[dict[str, float]] = field(default_factory=list)


def client_config(protocol: str, address: str, ca: Path) -> dict[str, str]:
    config = {"bootstrap.servers": address, "security.protocol": protocol}
    if protocol.endswith("SSL"):
        config["ssl.ca.location"] = str(ca)
    if protocol.startswith("SASL"):
        config.update({"sasl.mechanism": MECHANISM, "sasl.username": USER,
                       "sasl.password": PASSWORD})
    return config


@contextlib.contextmanager
def secure_cluster(folder: Path, *, internal_tls: bool, log_nodes: int,
                   protocols: tuple[str, ...]) -> Iterator[tuple[dict[str, str], LocalCluster]]:
    """A local cluster with one listener per protocol in ``protocols`` (each on ``log_nodes``
    consecutive ports, one per broker): ({protocol: bootstrap address}, the cluster)."""
    ca = CertificateAuthority.create(folder / "tls", "kbroker-bench-ca")
    server = ca.issue(folder / "tls", "localhost", dns_names=["localhost"],
                      ip_addresses=[HOST], stem="server")
    users = folder / "users.txt"
    users.write_text(f"{USER}:{PASSWORD}\n")
    ports = {protocol: free_port_range(HOST, log_nodes) for protocol in protocols}
    internal = None
    if internal_tls:
        internal = folder / "internal"
        internal_tls_dir(internal)
    spec = ClusterSpec(
        data_dir=folder / "data", kafka_port=ports["PLAINTEXT"], base_port=0,
        log_nodes=log_nodes, log_level=os.environ.get("LOG_LEVEL", "WARNING"),
        internal_tls=internal,
        service_flags={"frontend": {
            "listeners": ",".join(f"{p}://{HOST}:{port}" for p, port in ports.items()),
            "ssl_certfile": server.cert, "ssl_keyfile": server.key,
            "sasl_enabled_mechanisms": MECHANISM, "sasl_users_file": users,
        }})
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield {protocol: f"{HOST}:{port}" for protocol, port in ports.items()}, cluster
    finally:
        cluster.stop()


def run_workload(target: Target, args: argparse.Namespace) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", WORKLOAD, json.dumps(target.config), str(args.n), str(args.size),
         str(args.partitions), str(args.connections), USER, PASSWORD,
         ",".join(map(str, target.frontend_pids)), ",".join(map(str, target.cluster_pids))],
        capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def pids(cluster: LocalCluster) -> tuple[list[int], list[int]]:
    """The process ids of the frontend and of every service of ``cluster``."""
    every = {name: svc.proc.pid for name, svc in cluster.services.items()
             if svc.proc is not None}
    return [pid for name, pid in every.items() if name == "frontend"], list(every.values())


METRICS = ("acks1_MBps", "acksall_MBps", "connect_p50_ms", "connect_p99_ms")
CPU = ("client_cpu_ms_per_MB", "frontend_cpu_ms_per_MB", "cluster_cpu_ms_per_MB")


def summary(target: Target, by_name: dict[str, Target],
            reference: Target) -> dict[str, Any]:
    medians = {m: round(statistics.median(r[m] for r in target.results), 2)
               for m in METRICS + CPU if m in target.results[0]}
    line: dict[str, Any] = {"target": target.name, **medians}
    if target is reference:
        return line
    for kind in ("acks1", "acksall"):
        key = f"{kind}_MBps"
        # Ratios per round (same round, same load), then their median.
        base = by_name[target.baseline].results
        line[f"{kind}_vs_{target.baseline}"] = round(statistics.median(
            r[key] / b[key] for r, b in zip(target.results, base, strict=True)), 3)
        line[f"{kind}_vs_reference"] = round(statistics.median(
            r[key] / b[key] for r, b in zip(target.results, reference.results, strict=True)),
            3)
    line["connect_p50_vs_" + target.baseline] = round(
        medians["connect_p50_ms"] / statistics.median(
            r["connect_p50_ms"] for r in by_name[target.baseline].results), 2)
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--connections", type=int, default=40,
                        help="new clients per target and round for the set-up times")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-nodes", type=int, default=3)
    parser.add_argument("--internal-tls", action="store_true",
                        help="also a cluster with mutual TLS between its services")
    parser.add_argument("--only", default="",
                        help="comma-separated protocols of the first cluster to measure "
                             "(default: all four; PLAINTEXT is always measured)")
    args = parser.parse_args()
    protocols = tuple(p for p in PROTOCOLS if not args.only or p == "PLAINTEXT"
                      or p in args.only.split(","))

    binary = reference_binary()
    with contextlib.ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="kbroker-bench-security-")))
        reference = Target("reference (tansu, memory) PLAINTEXT",
                           {"bootstrap.servers": stack.enter_context(reference_broker(binary))},
                           "")
        addresses, cluster = stack.enter_context(secure_cluster(
            folder / "a", internal_tls=False, log_nodes=args.log_nodes, protocols=protocols))
        ca = folder / "a" / "tls" / "ca.crt"
        targets = [reference] + [
            Target(f"kbroker {p}", client_config(p, addresses[p], ca), "kbroker PLAINTEXT",
                   *pids(cluster)) for p in protocols]
        if args.internal_tls:
            internal, cluster_b = stack.enter_context(secure_cluster(
                folder / "b", internal_tls=True, log_nodes=args.log_nodes,
                protocols=("PLAINTEXT",)))
            targets.append(Target("kbroker internal-mTLS PLAINTEXT",
                                  client_config("PLAINTEXT", internal["PLAINTEXT"], ca),
                                  "kbroker PLAINTEXT", *pids(cluster_b)))
        for round_number in range(1, args.rounds + 1):
            order = targets if round_number % 2 else targets[::-1]
            for target in order:
                result = run_workload(target, args)
                target.results.append(result)
                print(json.dumps({"round": round_number, "target": target.name, **result}),
                      flush=True)
        by_name = {t.name: t for t in targets}
        print(json.dumps({"workload": f"{args.n} x {args.size} B, {args.partitions} "
                                      f"partitions, RF 1; {args.connections} connections; "
                                      f"SASL {MECHANISM}",
                          "rounds": args.rounds}))
        for target in targets:
            print(json.dumps(summary(target, by_name, reference)), flush=True)


if __name__ == "__main__":
    main()
