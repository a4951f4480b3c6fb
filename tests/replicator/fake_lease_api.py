"""A small real HTTP server implementing the Lease subset of the Kubernetes API, for the real
kubernetes client to talk to (no API server can be installed offline):

    GET  /apis/coordination.k8s.io/v1/namespaces/NS/leases/NAME  -> 200 Lease | 404
    POST /apis/coordination.k8s.io/v1/namespaces/NS/leases       -> 201 | 409 AlreadyExists
    PUT  /apis/coordination.k8s.io/v1/namespaces/NS/leases/NAME  -> 200 | 409 Conflict | 404

as the API server does them: every write bumps a cluster-wide resourceVersion, a PUT
carrying a stale one is refused, and Lease times must be RFC 3339 with exactly six fractional
digits (``metav1.MicroTime``), otherwise 400. Requests are told apart by their bearer token,
so a test can make one client's requests fail (``failing``) or hang (``hanging``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PREFIX = "/apis/coordination.k8s.io/v1/namespaces/"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")


class FakeLeaseApi:
    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 100
        self.lock = threading.Lock()
        self.failing: set[str] = set()
        self.hanging: set[str] = set()
        # (method, path, token, status) of every request, in order.
        self.requests: list[tuple[str, str, str, int]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.handle(self, "GET")

            def do_POST(self) -> None:
                api.handle(self, "POST")

            def do_PUT(self) -> None:
                api.handle(self, "PUT")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FakeLeaseApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.hanging.clear()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            found = self.leases.get((namespace, name))
            return json.loads(json.dumps(found)) if found else None

    def holder(self, namespace: str, name: str) -> str:
        lease = self.lease(namespace, name)
        return (lease or {}).get("spec", {}).get("holderIdentity", "") if lease else ""

    def write_kubeconfig(self, path: Path, token: str, namespace: str) -> Path:
        """A kubeconfig whose current context is this server, as ``token``."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": token, "user": {"token": token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": token,
                                                      "namespace": namespace}}],
            "current-context": "fake",
        }))
        return path

    # The API.

    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length)) if length else None
        path = request.path.split("?", 1)[0]
        if token in self.hanging:
            deadline = time.monotonic() + 30
            while token in self.hanging and time.monotonic() < deadline:
                time.sleep(0.02)
        if token in self.failing:
            status, answer = 503, status_of(503, "ServiceUnavailable", "unavailable for tests")
        else:
            status, answer = self.answer(method, path, body)
        with self.lock:
            self.requests.append((method, path, token, status))
        data = json.dumps(answer).encode()
        try:
            request.send_response(status)
            request.send_header("Content-Type", "application/json")
            request.send_header("Content-Length", str(len(data)))
            request.end_headers()
            request.wfile.write(data)
        except OSError:
            pass  # the client gave up (request timeout)

    def answer(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not path.startswith(PREFIX):
            return 404, status_of(404, "NotFound", f"no route {path}")
        parts = path.removeprefix(PREFIX).split("/")
        if len(parts) not in (2, 3) or parts[1] != "leases":
            return 404, status_of(404, "NotFound", f"no route {path}")
        namespace, name = parts[0], parts[2] if len(parts) == 3 else None
        with self.lock:
            if method == "GET" and name:
                lease = self.leases.get((namespace, name))
                if lease is None:
                    return 404, status_of(404, "NotFound", f'leases "{name}" not found')
                return 200, lease
            if method == "POST" and name is None:
                return self._create(namespace, body)
            if method == "PUT" and name:
                return self._replace(namespace, name, body)
        return 405, status_of(405, "MethodNotAllowed", f"{method} {path}")

    def _create(self, namespace: str, body: Any) -> tuple[int, dict[str, Any]]:
        invalid = validate(body)
        if invalid:
            return 400, status_of(400, "BadRequest", invalid)
        name = body["metadata"]["name"]
        if (namespace, name) in self.leases:
            return 409, status_of(409, "AlreadyExists", f'leases "{name}" already exists')
        return 201, self._store(namespace, name, body, uid=f"uid-{name}")

    def _replace(self, namespace: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        invalid = validate(body)
        if invalid:
            return 400, status_of(400, "BadRequest", invalid)
        if body["metadata"].get("name") != name:
            return 400, status_of(400, "BadRequest", "the name of the object does not match")
        current = self.leases.get((namespace, name))
        if current is None:
            return 404, status_of(404, "NotFound", f'leases "{name}" not found')
        sent = body["metadata"].get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            return 409, status_of(409, "Conflict", f'Operation cannot be fulfilled on leases '
                                  f'"{name}": the object has been modified')
        return 200, self._store(namespace, name, body, uid=current["metadata"]["uid"])

    def _store(self, namespace: str, name: str, body: Any, uid: str) -> dict[str, Any]:
        self.version += 1
        lease = {
            "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
            "metadata": {**body.get("metadata", {}), "name": name, "namespace": namespace,
                         "uid": uid, "resourceVersion": str(self.version)},
            "spec": body.get("spec") or {},
        }
        self.leases[(namespace, name)] = lease
        return lease


def validate(body: Any) -> str:
    """Why the API server would refuse this Lease body ("" if it would not)."""
    if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
        return "no metadata"
    if not body["metadata"].get("name"):
        return "metadata.name: Required value"
    spec = body.get("spec") or {}
    for key in ("acquireTime", "renewTime"):
        if key in spec and spec[key] is not None and not MICRO_TIME.match(str(spec[key])):
            return f"spec.{key}: {spec[key]!r} is not RFC 3339 with microseconds"
    for key in ("leaseDurationSeconds", "leaseTransitions"):
        if key in spec and spec[key] is not None and not isinstance(spec[key], int):
            return f"spec.{key}: not an integer"
    return ""


def status_of(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
