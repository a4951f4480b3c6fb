"""The data source against a metrics server that requires mutual TLS (a real gRPC server on port
0 with a log node's certificate, made in the test): rows through Spark and through the streaming
reader with the cluster's TLS material (options or KBROKER_INTERNAL_TLS_*), the server's
identity found among the service kinds or given; refused without a client certificate, with a
certificate of another CA, or when the server does not carry the name asked for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.common.metrics import Counter
from services.common.server import create_server
from services.common.tls import InternalTls
from spark import datasource
from spark.datasource import (
    SCHEMA,
    MetricsBatchReader,
    MetricsStreamReader,
    ReadSettings,
    server_names,
    snapshot_rows,
)
from tests.tls_material import CertificateAuthority, internal_tls_dir

CALLS = Counter("kbroker_test_datasource_tls_total", "A counter the TLS reads must see.")
FAMILY = "kbroker_test_datasource_tls"


@pytest.fixture(scope="module")
def material(tmp_path_factory) -> Path:
    """ca.crt and <kind>.crt/.key for every service kind, plus other-ca/ with a stranger."""
    folder = tmp_path_factory.mktemp("internal-tls")
    internal_tls_dir(folder)
    other = CertificateAuthority.create(folder / "other-ca")
    other.issue(folder / "other-ca", "kbroker-frontend", dns_names=["kbroker-frontend"],
                stem="frontend")
    return folder


def tls_options(folder: Path, kind: str = "frontend", ca: Path | None = None) -> dict[str, str]:
    return {"internal_tls_ca": str(ca or folder / "ca.crt"),
            "internal_tls_cert": str(folder / f"{kind}.crt"),
            "internal_tls_key": str(folder / f"{kind}.key")}


def with_tls_metrics_server(folder: Path, body: Callable[[str], None]) -> None:
    """Run ``body(endpoint)`` in a thread while a gRPC server requiring client certificates of
    the test CA, presenting the log node's certificate, serves on this thread's event loop."""

    async def main() -> None:
        tls = InternalTls(str(folder / "ca.crt"), str(folder / "log.crt"),
                          str(folder / "log.key"))
        server, port, _ = await create_server("log", [], tls=tls)
        try:
            await asyncio.wait_for(asyncio.to_thread(body, f"127.0.0.1:{port}"), 120)
        finally:
            await server.stop(0)

    asyncio.run(main())


@pytest.fixture
def fresh_names() -> Iterator[None]:
    datasource._SERVER_NAMES.clear()
    yield
    datasource._SERVER_NAMES.clear()


def families(rows: list[tuple]) -> set[str]:
    return {r[SCHEMA.fieldNames().index("family")] for r in rows}


def test_tls_paths_come_from_options_or_the_environment(material) -> None:
    env = {"KBROKER_INTERNAL_TLS_CA": "/env/ca.crt", "KBROKER_INTERNAL_TLS_CERT": "/env/c.crt",
           "KBROKER_INTERNAL_TLS_KEY": "/env/c.key"}
    assert ReadSettings.from_options({}, environ=env).tls == InternalTls(
        "/env/ca.crt", "/env/c.crt", "/env/c.key")
    options = tls_options(material)
    assert ReadSettings.from_options(options, environ=env).tls == InternalTls(
        options["internal_tls_ca"], options["internal_tls_cert"], options["internal_tls_key"])
    assert not ReadSettings.from_options({}, environ={}).tls.enabled
    # Without TLS, no name to check; with it, the kind the host names is tried first.
    plain = ReadSettings.from_options({}, environ={})
    assert server_names("127.0.0.1:1", plain) == [""]
    secure = ReadSettings.from_options(options, environ={})
    assert server_names("kbroker-log-0.kbroker-log.kafka:9090", secure)[0] == "kbroker-log"
    assert len(server_names("10.0.0.1:9090", secure)) == 5
    named = ReadSettings.from_options({**options, "tls_server_name": "kbroker-handler"},
                                      environ={})
    assert server_names("10.0.0.1:9090", named) == ["kbroker-handler"]


def test_spark_reads_a_server_that_requires_client_certificates(material, spark,
                                                                fresh_names) -> None:
    def body(endpoint: str) -> None:
        df = (spark.read.format("kbroker_metrics")
              .option("endpoints", endpoint).option("prefixes", FAMILY)
              .options(**tls_options(material)).load())
        rows = df.select("service", "family").distinct().collect()
        assert [(r.service, r.family) for r in rows] == [("log", FAMILY)]

    with_tls_metrics_server(material, body)


def test_batch_reader_finds_the_server_identity_and_is_refused_otherwise(
        material, monkeypatch, fresh_names) -> None:
    monkeypatch.delenv("KBROKER_INTERNAL_TLS_CA", raising=False)

    def body(endpoint: str) -> None:
        reader = MetricsBatchReader({"endpoints": endpoint, "prefixes": FAMILY,
                                     **tls_options(material, kind="handler")})
        (partition,) = reader.partitions()
        assert families(list(reader.read(partition))) == {FAMILY}
        assert datasource._SERVER_NAMES[endpoint] == "kbroker-log"

        refused = [
            {},  # plaintext to a TLS port
            tls_options(material / "other-ca", ca=material / "ca.crt"),  # a stranger's cert
            {**tls_options(material), "tls_server_name": "kbroker-handler"},  # wrong identity
        ]
        for options in refused:
            settings = ReadSettings.from_options(
                {"prefixes": FAMILY, "timeout": "3", **options}, environ={})
            with pytest.raises(Exception) as caught:
                list(snapshot_rows(endpoint, settings))
            assert "UNAVAILABLE" in str(caught.value), options
            tolerant = ReadSettings.from_options(
                {"prefixes": FAMILY, "timeout": "3", "skip_unavailable": "true", **options},
                environ={})
            assert list(snapshot_rows(endpoint, tolerant)) == []
        # The name that matched is the one given.
        given = ReadSettings.from_options(
            {"prefixes": FAMILY, "tls_server_name": "kbroker-log", **tls_options(material)},
            environ={})
        assert families(list(snapshot_rows(endpoint, given))) == {FAMILY}

    with_tls_metrics_server(material, body)


def test_stream_reader_over_mutual_tls_from_the_environment(material, monkeypatch,
                                                            fresh_names) -> None:
    for part, value in zip(("CA", "CERT", "KEY"), tls_options(material).values(), strict=True):
        monkeypatch.setenv(f"KBROKER_INTERNAL_TLS_{part}", value)

    def body(endpoint: str) -> None:
        reader = MetricsStreamReader({"endpoints": endpoint, "prefixes": FAMILY,
                                      "interval_ms": "100", "timeout": "10"})
        try:
            offset = reader.initialOffset()
            rows: list[tuple] = []
            deadline = time.monotonic() + 15
            while not rows:
                assert time.monotonic() < deadline, reader._streams[endpoint].last_error
                batch, offset = reader.read(offset)
                rows.extend(batch)
                time.sleep(0.05)
            assert families(rows) == {FAMILY}
            assert datasource._SERVER_NAMES[endpoint] == "kbroker-log"
        finally:
            reader.stop()

    with_tls_metrics_server(material, body)
