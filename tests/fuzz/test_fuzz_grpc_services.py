"""Fuzzing the internal gRPC services: generated requests to every unary RPC of the log node,
purgatory, replicator and handler of a real in-process cluster never make a servicer crash
(no UNKNOWN or INTERNAL status, no traceback logged)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from .grpc_messages import SERVICES, FuzzCluster, calls, fuzz_cluster

FUZZ = settings(max_examples=250, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def cluster() -> Iterator[FuzzCluster]:
    with fuzz_cluster() as running:
        yield running


def _fuzz(service: str) -> Any:
    @FUZZ
    @given(call=calls(service))
    def test(cluster: FuzzCluster, call: tuple[str, Any]) -> None:
        name, request = call
        cluster.check_call(service, name, request)

    return test


assert set(SERVICES) == {"log", "purgatory", "replicator", "handler"}
test_log_node_requests = _fuzz("log")
test_purgatory_requests = _fuzz("purgatory")
test_replicator_requests = _fuzz("replicator")
test_handler_requests = _fuzz("handler")
