"""Endpoint discovery for the metrics data source: local plans (found by their listening
ports at any base port), DNS, and Helm releases read through the real kubernetes client from
an API server on loopback that serves the pods of the chart's rendered manifests."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from services.k8s.status import COMPONENT_LABEL as COMPONENT
from services.local_cluster import _bindable, free_port_range
from spark.discovery import (
    endpoints_from_options,
    listening,
    local_plan_endpoints,
    parse_release,
    resolve_endpoints,
)

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "k8s" / "manifests"


def test_local_plan_matches_kbroker_up_ports() -> None:
    endpoints = local_plan_endpoints("local")
    assert "127.0.0.1:19090" in endpoints  # frontend
    assert {"127.0.0.1:19100", "127.0.0.1:19101"} <= set(endpoints)  # handlers
    assert {"127.0.0.1:19200", "127.0.0.1:19201", "127.0.0.1:19202"} <= set(endpoints)
    assert {"127.0.0.1:19300", "127.0.0.1:19400"} <= set(endpoints)
    assert len(endpoints) == 8
    assert len(local_plan_endpoints("local:29090", handlers=1, log_nodes=1)) == 5
    assert "127.0.0.1:29090" in local_plan_endpoints("local:29090")


def test_options_combine_and_deduplicate() -> None:
    got = endpoints_from_options({"endpoints": "127.0.0.1:19090, 10.0.0.1:1", "cluster": "local",
                                  "handlers": "2", "log_nodes": "3"})
    assert got[:2] == ["127.0.0.1:19090", "10.0.0.1:1"]
    assert len(got) == 9


def test_dns_entries_resolve_to_every_address() -> None:
    assert resolve_endpoints(["dns:///localhost:7000"]) in (
        ["127.0.0.1:7000"], ["127.0.0.1:7000", "[::1]:7000"], ["[::1]:7000", "127.0.0.1:7000"])


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError):
        endpoints_from_options({})
    with pytest.raises(ValueError):
        endpoints_from_options({"endpoints": "no-port"})
    with pytest.raises(ValueError):
        local_plan_endpoints("remote")


OFFSETS = (10, 11, 12, 110, 111, 112, 113)


def quiet_base() -> int:
    """A base port whose handler and log node ranges nothing listens on, and whose planned
    ports for three handlers and four log nodes can be bound (other clusters on this machine
    use random ports)."""
    for _ in range(200):
        base = free_port_range("127.0.0.1", 1)
        if not any(listening("127.0.0.1", base + offset) for offset in range(10, 210)) and all(
                _bindable("127.0.0.1", base + offset) for offset in OFFSETS):
            return base
    raise AssertionError("no quiet port range")


def test_a_local_cluster_is_found_at_any_base_port_by_its_listening_ports() -> None:
    base = quiet_base()
    # Three handlers and four log nodes listening where `kbroker up --base-port` puts them.
    listeners = [socket.create_server(("127.0.0.1", base + offset))
                 for offset in OFFSETS]
    try:
        got = endpoints_from_options({"cluster": f"local:{base}"})
    finally:
        for listener in listeners:
            listener.close()
    ports = sorted(int(e.rsplit(":", 1)[1]) - base for e in got)
    assert ports == [0, 10, 11, 12, 110, 111, 112, 113, 210, 310]
    # Counts given win; nothing listening gives the default plan.
    fixed = endpoints_from_options({"cluster": f"local:{base}", "handlers": "1",
                                    "log_nodes": "2"})
    assert sorted(int(e.rsplit(":", 1)[1]) - base for e in fixed) == [0, 10, 110, 111, 210, 310]
    assert len(endpoints_from_options({"cluster": f"local:{base}"})) == 8


class PodsApi:
    """The pod list of the Kubernetes API (``GET /api/v1/namespaces/NS/pods`` with an
    equality ``labelSelector``), over HTTP on loopback, for the real kubernetes client."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.selectors: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if parts[:3] != ["api", "v1", "namespaces"] or parts[4:] != ["pods"]:
                    self.send_error(404)
                    return
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                api.selectors.append(selector)
                wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
                items = [p for p in api.pods if p["metadata"]["namespace"] == parts[3]
                         and wanted.items() <= p["metadata"]["labels"].items()]
                body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "metadata": {}, "items": items}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def kubeconfig(self, path: Path) -> Path:
        url = f"http://127.0.0.1:{self.server.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": url}}],
            "users": [{"name": "test", "user": {"token": "test"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
        return path

    def __enter__(self) -> PodsApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


def pods_of_rendered_manifests(namespace: str) -> list[dict[str, Any]]:
    """The pods Kubernetes would run for deploy/k8s/manifests (the chart as rendered): one per
    replica of every StatefulSet and Deployment, named as their controllers name them, with
    the template's labels and containers, running at an address of their own."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "kbroker.yaml").read_text()) if d]
    pods = []
    for doc in docs:
        if doc["kind"] not in ("StatefulSet", "Deployment"):
            continue
        template = doc["spec"]["template"]
        # The handler's replicas come from its autoscaler, not the Deployment.
        for i in range(doc["spec"].get("replicas") or 2):
            name = (f"{doc['metadata']['name']}-{i}" if doc["kind"] == "StatefulSet"
                    else f"{doc['metadata']['name']}-5d9f8-{i}x")
            pods.append({"metadata": {"name": name, "namespace": namespace,
                                      "labels": template["metadata"]["labels"]},
                         "spec": template["spec"],
                         "status": {"phase": "Running", "podIP": f"10.1.0.{len(pods) + 1}"}})
    return pods


def test_a_helm_release_is_found_through_the_kubernetes_api(tmp_path: Path) -> None:
    pods = pods_of_rendered_manifests("kafka")
    grpc_ports = {p["metadata"]["labels"][COMPONENT]: c_port["containerPort"]
                  for p in pods for c in p["spec"]["containers"] for c_port in c["ports"]
                  if c_port.get("name") == "grpc"}
    assert set(grpc_ports) == {"frontend", "handler", "log", "purgatory", "replicator"}
    # A pod of another release, one being deleted and one not started are left out.
    stranger = json.loads(json.dumps(pods[0]))
    stranger["metadata"]["labels"]["app.kubernetes.io/instance"] = "other"
    leaving = json.loads(json.dumps(pods[1]))
    leaving["metadata"].update(name="zz-leaving", deletionTimestamp="2026-01-01T00:00:00Z")
    pending = json.loads(json.dumps(pods[2]))
    pending["metadata"]["name"] = "zz-pending"
    pending["status"] = {"phase": "Pending"}
    with PodsApi([*pods, stranger, leaving, pending]) as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        got = endpoints_from_options({"cluster": "k8s:kafka/kbroker",
                                      "kubeconfig": str(kubeconfig)})
        assert "app.kubernetes.io/instance=kbroker" in api.selectors[-1]
        with pytest.raises(ValueError, match="no running pod"):
            endpoints_from_options({"cluster": "k8s:elsewhere/kbroker",
                                    "kubeconfig": str(kubeconfig)})
    by_name = sorted(pods, key=lambda p: p["metadata"]["name"])
    assert got == [f"{p['status']['podIP']}:{grpc_ports[p['metadata']['labels'][COMPONENT]]}"
                   for p in by_name]
    # 1 frontend, 2 handlers, 3 log nodes, 1 purgatory, 2 replicators.
    assert len(got) == 9


def test_release_addresses_parse() -> None:
    assert parse_release("k8s:kafka/kbroker") == ("kafka", "kbroker")
    assert parse_release("k8s:kbroker")[1] == "kbroker"
    for bad in ("k8s:", "k8s:ns/", "k8s:/x"):
        with pytest.raises(ValueError):
            parse_release(bad)
