"""Endpoint discovery for the metrics data source."""

from __future__ import annotations

import pytest

from spark.discovery import endpoints_from_options, local_plan_endpoints, resolve_endpoints


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
    got = endpoints_from_options({"endpoints": "127.0.0.1:19090, 10.0.0.1:1", "cluster": "local"})
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
