"""Recorded Kubernetes API answers served to the real kubernetes client: a stand-in for the
client's urllib3 pool manager answers each request from a JSON fixture keyed by method and
path, and fails any request the recording does not hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

FIXTURES = Path(__file__).parent / "fixtures"


class RecordedResponse:
    def __init__(self, status: int, data: bytes, content_type: str) -> None:
        self.status = status
        self.reason = "OK" if status == 200 else "Error"
        self.data = data
        self.headers = {"content-type": content_type}

    def release_conn(self) -> None:
        pass


class RecordedPoolManager:
    """Answers from ``fixtures/<name>.json``; records each request's path and query."""

    def __init__(self, name: str, overrides: dict[str, dict[str, Any]] | None = None) -> None:
        self.answers: dict[str, dict[str, Any]] = json.loads(
            (FIXTURES / f"{name}.json").read_text())["answers"]
        self.answers.update(overrides or {})
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []

    def request(self, method: str, url: str, **_kwargs: Any) -> RecordedResponse:
        parts = urlsplit(url)
        path = unquote(parts.path)
        self.requests.append((method, path, parse_qs(parts.query)))
        key = f"{method} {path}"
        if key not in self.answers:
            raise AssertionError(f"unrecorded API request: {key}")
        answer = self.answers[key]
        if "text" in answer:
            return RecordedResponse(answer["status"], answer["text"].encode(), "text/plain")
        return RecordedResponse(answer["status"], json.dumps(answer["body"]).encode(),
                                "application/json")

    def clear(self) -> None:
        pass


def recorded_api_client(name: str, overrides: dict[str, dict[str, Any]] | None = None
                        ) -> tuple[Any, RecordedPoolManager]:
    """An API client answering from ``fixtures/<name>.json``, with ``overrides`` replacing
    (or adding) answers by ``"METHOD /path"``."""
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = "https://kubernetes.test:6443"
    api_client = client.ApiClient(configuration)
    pool = RecordedPoolManager(name, overrides)
    api_client.rest_client.pool_manager = pool
    return api_client, pool
