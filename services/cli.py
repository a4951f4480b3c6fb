"""``kbroker``: the operator's command line.

    kbroker up [--kafka-port 9092] [--data-dir data] [--handlers 2] [--log-nodes 3] ...
               [--internal-tls DIR]
        a whole local cluster on loopback until Ctrl-C (internal gRPC plaintext, or mutual
        TLS with the certificates in DIR); a service that exits is restarted with backoff,
        and the services end with the launcher
    kbroker k8s status [--namespace kbroker] [--release kbroker] [--wait]
        a release on Kubernetes: pods per role, rollouts, partition health
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import time
from pathlib import Path

from .admin import cli as admin_cli
from .k8s import cli as k8s_cli
from .local_cluster import ClusterSpec, LocalCluster, ServiceProcess, StartupError


def _up(args: argparse.Namespace) -> int:
    # The flags are named (dest) after the ClusterSpec fields they set.
    names = {f.name for f in dataclasses.fields(ClusterSpec)}
    spec = ClusterSpec(**{name: value for name, value in vars(args).items() if name in names})
    try:
        cluster = LocalCluster(spec)
        cluster.preflight()
    except (FileNotFoundError, StartupError) as exc:
        print(f"start-up failed: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"start-up failed: {exc.strerror or exc}", file=sys.stderr)
        return 1
    stopping = False

    def on_signal(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"starting a local cluster, data in {cluster.data_dir}", flush=True)

    def healthy(svc: ServiceProcess) -> None:
        pid = svc.proc.pid if svc.proc is not None else "-"
        print(f"  {svc.name:<11} healthy  pid {pid!s:<7} grpc {svc.grpc_address}", flush=True)

    try:
        cluster.start(progress=healthy)
    except (RuntimeError, TimeoutError, OSError) as exc:
        # The first line names the service; its log holds the rest.
        print(f"start-up failed: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    cluster.supervise()
    for line in cluster.status_lines():
        print(line, flush=True)
    for line in cluster.security_lines():
        print(line, flush=True)
    print(f"Kafka clients: bootstrap.servers={cluster.bootstrap}   (Ctrl-C stops the cluster)",
          flush=True)
    print(f"logs: {cluster.log_dir}", flush=True)
    try:
        while not stopping:
            time.sleep(0.2)
            for line in cluster.supervise_step():
                print(line, file=sys.stderr, flush=True)
    finally:
        print("stopping...", flush=True)
        cluster.stop()
        for line in cluster.status_lines():
            print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kbroker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run a whole local cluster until Ctrl-C")
    up.add_argument("--data-dir", default=Path("data"), type=Path,
                    help="folder for data and logs")
    up.add_argument("--host", default="127.0.0.1", help="address the Kafka listener binds")
    up.add_argument("--kafka-port", type=int, default=9092,
                    help="bootstrap port; broker N (log node N) is also served on port + N")
    up.add_argument("--advertised-host", default="",
                    help="host clients are told to connect to (default: --host)")
    up.add_argument("--advertised-port", type=int, default=0,
                    help="port clients are told to connect to (default: --kafka-port)")
    up.add_argument("--handlers", type=int, default=2)
    up.add_argument("--log-nodes", type=int, default=3)
    up.add_argument("--base-port", type=int, default=19090,
                    help="first internal gRPC port (0: any free ports)")
    up.add_argument("--partitions", dest="num_partitions", type=int, default=1,
                    help="num.partitions for new topics")
    up.add_argument("--replication-factor", dest="default_replication_factor", type=int,
                    default=1, help="default.replication.factor for new topics")
    up.add_argument("--log-level", default="INFO")
    up.add_argument("--internal-tls", type=Path, default=None, metavar="DIR",
                    help="mutual TLS between the services with the CA and certificates in DIR "
                         "(ca.crt, <kind>.crt, <kind>.key per kind: frontend, handler, log, "
                         "purgatory, replicator); default: plaintext on loopback")
    k8s_cli.add_parser(sub)
    admin_cli.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "up":
        return _up(args)
    if args.command == "k8s":
        return k8s_cli.run(args)
    if args.command == "spread":
        return admin_cli.run(args)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
