"""``kbroker spread``: spread the partitions over the log nodes (see :mod:`.spread`).

    kbroker spread --replicator HOST:PORT [--exclude ID ...] [--topic NAME ...]
                   [--execute [--wait]] [--internal-tls-ca ... --internal-tls-cert ...
                   --internal-tls-key ...]

It reads the cluster metadata from the active replicator (in Kubernetes its Service,
``<release>-replicator:<port>``; ``make run``: 127.0.0.1:19400), prints the plan as
kafka-reassign-partitions' JSON (``{"version": 1, "partitions": [{"topic", "partition",
"replicas"}]}``) with the replicas and preferred leaders per log node before and after, and
with ``--execute`` starts the reassignments; ``--wait`` then waits until they are all done.
Without ``--execute`` nothing changes. Exit status 0, or 1 when a reassignment is refused or
``--wait`` runs out of time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc
from services.common.channels import internal_sync_channel
from services.common.tls import CA_HELP, InternalTls

from .spread import load_of, plan

CALL_TIMEOUT_S = 30.0


def add_parser(sub: Any) -> None:
    """Register ``spread`` on the ``kbroker`` command's subparsers."""
    spread = sub.add_parser("spread", help="spread partitions over the log nodes",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    spread.add_argument("--replicator", required=True, metavar="HOST:PORT",
                        help="gRPC address of the (active) replicator")
    spread.add_argument("--exclude", type=int, action="append", default=[], metavar="ID",
                        help="log node to empty (before removing it); repeatable")
    spread.add_argument("--topic", action="append", default=[], metavar="NAME",
                        help="only these topics (default: every topic); repeatable")
    spread.add_argument("--execute", action="store_true", help="start the reassignments")
    spread.add_argument("--wait", action="store_true",
                        help="with --execute: wait until every reassignment is done")
    spread.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
    spread.add_argument("--internal-tls-ca", default="", help=CA_HELP)
    spread.add_argument("--internal-tls-cert", default="",
                        help="PEM certificate to present to the replicator (internal mTLS)")
    spread.add_argument("--internal-tls-key", default="", help="PEM key of that certificate")


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    tls = InternalTls(args.internal_tls_ca, args.internal_tls_cert, args.internal_tls_key)
    with internal_sync_channel(args.replicator, tls, "replicator") as channel:
        stub = replicator_pb2_grpc.ReplicatorStub(channel)
        metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=args.topic),
                                    timeout=CALL_TIMEOUT_S)
        assignment = {(t.name, p.partition): tuple(p.replicas)
                      for t in metadata.topics for p in t.partitions}
        nodes = [n.node_id for n in metadata.log_nodes]
        try:
            moves = plan(assignment, nodes, args.exclude)
        except ValueError as exc:
            print(f"kbroker spread: {exc}", file=sys.stderr)
            return 1
        after = {**assignment, **moves}
        out(json.dumps({"version": 1, "partitions": [
            {"topic": t, "partition": p, "replicas": list(r)}
            for (t, p), r in sorted(moves.items())]}, indent=1))
        for label, state in (("before", assignment), ("after", after)):
            replicas, leaders = load_of(state)
            out(f"{label}: " + ", ".join(f"node {n}: {replicas[n]} replicas, {leaders[n]} "
                                          f"preferred leaders" for n in sorted(nodes)))
        if not args.execute or not moves:
            return 0
        answer = stub.AlterPartitionReassignments(pb.AlterPartitionReassignmentsRequest(
            allow_replication_factor_change=False, reassignments=[
                pb.Reassignment(topic=t, partition=p, replicas=r)
                for (t, p), r in sorted(moves.items())]), timeout=CALL_TIMEOUT_S)
        refused = [r for r in answer.results if r.error_code]
        for r in refused:
            print(f"kbroker spread: {r.topic}-{r.partition} refused: {r.error_message} "
                  f"(error {r.error_code})", file=sys.stderr)
        out(f"started {len(answer.results) - len(refused)} reassignments")
        if refused:
            return 1
        if args.wait:
            return 0 if _wait(stub, set(moves), args.timeout, out) else 1
    return 0


def _wait(stub: replicator_pb2_grpc.ReplicatorStub, moving: set[tuple[str, int]],
          timeout: float, out: Callable[[str], None]) -> bool:
    deadline = time.monotonic() + timeout
    topics = sorted({t for t, _ in moving})
    while True:
        metadata = stub.GetMetadata(pb.GetMetadataRequest(topics=topics),
                                    timeout=CALL_TIMEOUT_S)
        ongoing = sum(1 for t in metadata.topics for p in t.partitions
                      if (t.name, p.partition) in moving
                      and (p.adding_replicas or p.removing_replicas))
        if not ongoing:
            out("every reassignment is done")
            return True
        if time.monotonic() > deadline:
            print(f"kbroker spread: {ongoing} reassignments still under way after "
                  f"{timeout:.0f} s", file=sys.stderr)
            return False
        time.sleep(1.0)
