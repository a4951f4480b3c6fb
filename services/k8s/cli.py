"""``kbroker k8s ...``: operator commands for a release installed from deploy/k8s.

    kbroker k8s status [--namespace kbroker] [--release kbroker] [--wait [--timeout 600]]
        pods per role, rollout progress of every workload, the active replicator (the ready
        pod, and the holder of its Lease) and its standbys, under-replicated and offline
        partitions (from the active replicator); --wait polls until every rollout is complete
        and exactly one replicator is active, the others standbys. Exit status 0 when healthy
        (rolled out, one active replicator, no under-replicated or offline partitions), 1
        otherwise ("no active replicator", "two active replicators", ...).

The API is reached with the pod's service account inside a cluster, else with the kubeconfig
(--kubeconfig, --context, as kubectl).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from services.common.kubernetes_api import default_api_client

from .release import ReleaseReader, wait_for_rollout
from .status import ClusterStatus, render


def add_parser(sub: Any) -> None:
    """Register ``k8s`` on the ``kbroker`` command's subparsers."""
    k8s = sub.add_parser("k8s", help="operate a release on Kubernetes",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    k8s_sub = k8s.add_subparsers(dest="k8s_command", required=True)
    status = k8s_sub.add_parser("status", help="pods, rollouts and partition health")
    status.add_argument("--namespace", "-n", default="kbroker")
    status.add_argument("--release", default="kbroker", help="Helm release name")
    status.add_argument("--kubeconfig", default=None)
    status.add_argument("--context", default=None)
    status.add_argument("--wait", action="store_true",
                        help="wait for every rollout and one active replicator")
    status.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits")
    status.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)


def run(args: argparse.Namespace, api_client: Any = None,
        out: Callable[[str], None] = print) -> int:
    if args.k8s_command != "status":
        return 2
    client = api_client or default_api_client(args.kubeconfig, args.context)
    reader = ReleaseReader(client, args.namespace, args.release)
    if args.wait:
        def progress(s: ClusterStatus) -> None:
            if not s.rolled_out:
                waiting = [r.name for r in s.rollouts if not r.complete]
                if s.rollouts and not s.replicator.settled:
                    waiting.append("an active replicator with running standbys")
                print(f"waiting for {', '.join(waiting) or 'workloads'}...", file=sys.stderr,
                      flush=True)

        status = wait_for_rollout(reader.status, args.timeout, args.interval, on_poll=progress)
    else:
        status = reader.status()
    for line in render(status):
        out(line)
    return 0 if status.healthy else 1
