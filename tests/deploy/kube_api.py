"""A Kubernetes API server reduced to what ``helm template --dry-run=server`` asks of one:
discovery of the kinds the chart renders, and GET of single objects, answered from a dict of
stored objects (404 for anything else). It lets the tests run the chart's ``lookup`` calls
against "installed" Secrets, as ``helm upgrade`` does, without a cluster. HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# groupVersion -> (resource, kind) the chart renders.
RESOURCES = {
    "v1": [("secrets", "Secret"), ("configmaps", "ConfigMap"), ("services", "Service"),
           ("serviceaccounts", "ServiceAccount")],
    "apps/v1": [("deployments", "Deployment"), ("statefulsets", "StatefulSet")],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget")],
    "networking.k8s.io/v1": [("networkpolicies", "NetworkPolicy")],
    "rbac.authorization.k8s.io/v1": [("roles", "Role"), ("rolebindings", "RoleBinding")],
    "autoscaling/v2": [("horizontalpodautoscalers", "HorizontalPodAutoscaler")],
    "cert-manager.io/v1": [("certificates", "Certificate")],
}
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
             "code": 404}


class KubeApi:
    """Serves ``objects`` (path -> object, e.g. "/api/v1/namespaces/ns/secrets/name");
    ``requests`` records every path asked for."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                api.requests.append(path)
                code, body = api.answer(path)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, path: str) -> tuple[int, Any]:
        if path == "/version":
            return 200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0",
                         "platform": "linux/amd64"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    group, version = gv.split("/")
                    entry = {"groupVersion": gv, "version": version}
                    groups.append({"name": group, "versions": [entry],
                                   "preferredVersion": entry})
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        gv = path.removeprefix("/api/") if path.startswith("/api/") else path.removeprefix(
            "/apis/")
        if gv in RESOURCES:
            return 200, {"kind": "APIResourceList", "groupVersion": gv, "resources": [
                {"name": name, "singularName": kind.lower(), "namespaced": True, "kind": kind,
                 "verbs": ["get", "list", "create", "update", "delete"]}
                for name, kind in RESOURCES[gv]]}
        if path in self.objects:
            return 200, self.objects[path]
        return 404, NOT_FOUND

    def store_secret(self, secret: dict[str, Any], namespace: str, release: str) -> None:
        """Keep ``secret`` as installed by ``release`` (with Helm's ownership marks)."""
        stored = json.loads(json.dumps(secret))
        meta = stored["metadata"]
        meta["namespace"] = namespace
        meta.setdefault("annotations", {}).update({
            "meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace})
        self.objects[f"/api/v1/namespaces/{namespace}/secrets/{meta['name']}"] = stored

    def kubeconfig(self, directory: Path, namespace: str) -> Path:
        path = directory / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": namespace}}]}))
        return path

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
