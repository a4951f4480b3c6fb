"""The data source's readers against a real gRPC server on port 0 (the shared server plumbing
every service uses), without Spark: batch rows from Snapshot, and the streaming reader's
cursor offsets over Metrics/Stream - new snapshots only, resumed after a cursor, a restart
seen as a new process id."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from services.common.metrics import PROCESS_ID, Counter
from services.common.server import create_server
from spark.datasource import (
    SCHEMA,
    MetricsBatchReader,
    MetricsStreamReader,
    ReadSettings,
    snapshot_rows,
)

TICKS = Counter("kbroker_test_datasource_ticks_total", "Ticks of the data source test.")
FAMILY = "kbroker_test_datasource_ticks"


def with_metrics_server(body: Callable[[str], None]) -> None:
    """Run ``body(endpoint)`` in a thread while a gRPC server (health, reflection, metrics)
    on port 0 serves on this thread's event loop; the server stops afterwards."""

    async def main() -> None:
        server, port, _ = await create_server("test", [])
        try:
            await asyncio.wait_for(asyncio.to_thread(body, f"127.0.0.1:{port}"), 60)
        finally:
            await server.stop(0)

    asyncio.run(main())


def ticks(rows: list[tuple]) -> dict[int, float]:
    """The test counter per snapshot sequence."""
    names = SCHEMA.fieldNames()
    sample, value, sequence = (names.index(n) for n in ("sample", "value", "sequence"))
    return {r[sequence]: r[value] for r in rows if r[sample] == FAMILY + "_total"}


def read_until(reader: MetricsStreamReader, start: dict[str, Any], snapshots: int,
               time_limit: float = 10.0, ticked: float | None = None,
               ) -> tuple[list[tuple], dict[str, Any]]:
    """Micro-batches from ``start`` until ``snapshots`` distinct snapshots came in (and one
    shows the counter at ``ticked``, if given)."""
    rows: list[tuple] = []
    offset = start
    deadline = time.monotonic() + time_limit
    while len(ticks(rows)) < snapshots or (
            ticked is not None and ticked not in ticks(rows).values()):
        assert time.monotonic() < deadline, f"only {ticks(rows)}"
        batch, offset = reader.read(offset)
        rows.extend(batch)
        time.sleep(0.05)
    return rows, offset


def test_batch_rows_carry_the_cursor() -> None:
    with_metrics_server(batch_rows_carry_the_cursor)


def batch_rows_carry_the_cursor(endpoint: str) -> None:
    reader = MetricsBatchReader({"endpoints": endpoint, "prefixes": FAMILY})
    (partition,) = reader.partitions()
    rows = list(reader.read(partition))
    assert rows and len(rows[0]) == len(SCHEMA.fieldNames())
    names = SCHEMA.fieldNames()
    assert {r[names.index("process_id")] for r in rows} == {PROCESS_ID}
    assert {r[names.index("family")] for r in rows} == {FAMILY}
    again = list(snapshot_rows(endpoint, ReadSettings.from_options({"prefixes": FAMILY})))
    assert again[0][names.index("sequence")] > rows[0][names.index("sequence")]


def test_stream_offsets_are_cursors_and_resume_after_them() -> None:
    with_metrics_server(stream_offsets_are_cursors_and_resume_after_them)


def stream_offsets_are_cursors_and_resume_after_them(endpoint: str) -> None:
    options = {"endpoints": endpoint, "prefixes": FAMILY, "interval_ms": "100"}
    reader = MetricsStreamReader(options)
    try:
        start = reader.initialOffset()
        assert start == {"cursors": {}}
        rows, offset = read_until(reader, start, 2)
        cursor = offset["cursors"][endpoint]
        assert cursor["process_id"] == PROCESS_ID
        assert cursor["sequence"] == max(ticks(rows))
        # Counters move between snapshots.
        TICKS.inc(5)
        more, offset2 = read_until(reader, offset, 1, ticked=max(ticks(rows).values()) + 5)
        assert min(ticks(more)) > cursor["sequence"]
        assert offset2["cursors"][endpoint]["sequence"] == max(ticks(more))
        # Nothing new: the offset stays (Spark then plans no batch).
        stream = reader._streams[endpoint]
        stream.stop()
        stream._thread.join(5)
        stream.take()
        empty, same = reader.read(offset2)
        assert list(empty) == [] and same == offset2
    finally:
        reader.stop()

    # A restarted query resumes after the checkpointed cursor: nothing twice.
    resumed = MetricsStreamReader(options)
    try:
        rows, offset3 = read_until(resumed, offset2, 1)
        assert min(ticks(rows)) > offset2["cursors"][endpoint]["sequence"]
    finally:
        resumed.stop()

    # A cursor of another process (the service restarted): new process id in the rows.
    foreign = {"cursors": {endpoint: {"process_id": "gone", "sequence": 10**9}}}
    restarted = MetricsStreamReader(options)
    try:
        rows, offset4 = read_until(restarted, foreign, 1)
        assert offset4["cursors"][endpoint]["process_id"] == PROCESS_ID
    finally:
        restarted.stop()


def test_stream_fails_for_an_endpoint_that_never_answers() -> None:
    reader = MetricsStreamReader({"endpoints": "127.0.0.1:1", "timeout": "0.5"})
    try:
        offset = reader.initialOffset()
        reader.read(offset)
        time.sleep(0.7)
        with pytest.raises(RuntimeError, match="no metrics stream"):
            reader.read(offset)
    finally:
        reader.stop()
    tolerant = MetricsStreamReader({"endpoints": "127.0.0.1:1", "timeout": "0.5",
                                    "skip_unavailable": "true"})
    try:
        offset = tolerant.initialOffset()
        tolerant.read(offset)
        time.sleep(0.7)
        rows, end = tolerant.read(offset)
        assert list(rows) == [] and end == offset
    finally:
        tolerant.stop()
