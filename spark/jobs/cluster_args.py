"""The command-line flags every job uses to name the cluster it reads, turned into the
``kbroker_metrics`` data source's options (see :mod:`spark.discovery` for the forms)."""

from __future__ import annotations

import argparse

CLUSTER_HELP = ("the cluster: 'local', 'local:<base port>', 'k8s:<namespace>/<release>', or "
                "comma separated gRPC host:port / dns:///name:port / "
                "k8s:///service.namespace:port (default: local)")


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", default="", help=CLUSTER_HELP)
    parser.add_argument("--endpoints", default="", help="further endpoints, as --cluster's "
                        "explicit forms")
    parser.add_argument("--handlers", type=int, default=None,
                        help="a local cluster's handlers (default: the ones listening)")
    parser.add_argument("--log-nodes", type=int, default=None,
                        help="a local cluster's log nodes (default: the ones listening)")
    parser.add_argument("--kubeconfig", default="", help="a release: kubeconfig file "
                        "(default: the pod's service account, else ~/.kube/config)")
    parser.add_argument("--kube-context", default="", help="a release: kubeconfig context")


def cluster_options(args: argparse.Namespace) -> dict[str, str]:
    """The data source options ``args`` name (``cluster`` local when nothing is named)."""
    cluster = args.cluster or ("" if args.endpoints else "local")
    options = {"cluster": cluster, "endpoints": args.endpoints,
               "handlers": str(args.handlers or ""), "log_nodes": str(args.log_nodes or ""),
               "kubeconfig": args.kubeconfig, "kube_context": args.kube_context}
    return {k: v for k, v in options.items() if v}
