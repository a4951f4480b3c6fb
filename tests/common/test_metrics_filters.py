"""The Metrics service's request filters, on a real gRPC server on port 0: families by exact
name (a counter with or without ``_total``) besides prefixes, and ``drop_empty``, which leaves
out zero counters, unused label sets and the histogram buckets no quantile needs, without
changing any quantile."""

from __future__ import annotations

import asyncio
import math

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from services.common.channels import insecure_channel
from services.common.metrics import Gauge, LoopCounter, LoopHistogram, non_empty_samples
from services.common.server import create_server

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
SECONDS = LoopHistogram("kbroker_test_filter_seconds", "Filter test histogram.", ["api"],
                        buckets=BUCKETS)
REQUESTS = LoopCounter("kbroker_test_filter_requests_total", "Filter test counter.", ["api"])
QUEUED = Gauge("kbroker_test_filter_queued", "Filter test gauge.", ["api"])
OTHER = LoopCounter("kbroker_test_filtered_out_total", "Another family.")

for value in (0.003, 0.004, 0.004, 0.2, 0.7):
    SECONDS.labels("Produce").observe(value)
SECONDS.labels("Fetch")  # registered, never observed
REQUESTS.labels("Produce").inc(5)
REQUESTS.labels("Fetch")
QUEUED.labels("Produce").set(0)
OTHER.inc()


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's histogram_quantile over cumulative (upper bound, count) pairs."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    raise AssertionError("unreachable")


def buckets_of(family: metrics_pb2.MetricFamily, api: str) -> list[tuple[float, float]]:
    return [(float(s.labels["le"]), s.value) for s in family.samples
            if s.name.endswith("_bucket") and s.labels["api"] == api]


async def _snapshot(**request: object) -> dict[str, metrics_pb2.MetricFamily]:
    server, port, _ = await create_server("test", [])
    channel = insecure_channel(f"127.0.0.1:{port}")
    try:
        answer = await metrics_pb2_grpc.MetricsStub(channel).Snapshot(
            metrics_pb2.SnapshotRequest(**request))
        return {f.name: f for f in answer.families}
    finally:
        await channel.close()
        await server.stop(0)


def snapshot(**request: object) -> dict[str, metrics_pb2.MetricFamily]:
    return asyncio.run(asyncio.wait_for(_snapshot(**request), 30))


def test_families_are_chosen_by_exact_name_or_prefix() -> None:
    chosen = snapshot(names=["kbroker_test_filter_requests_total", "kbroker_test_filter_queued"])
    assert set(chosen) == {"kbroker_test_filter_requests", "kbroker_test_filter_queued"}
    # The counter's family name without _total, and a prefix, are a union with the names.
    chosen = snapshot(names=["kbroker_test_filter_requests"], prefixes=["kbroker_test_filtered"])
    assert set(chosen) == {"kbroker_test_filter_requests", "kbroker_test_filtered_out"}
    assert "kbroker_test_filter" not in snapshot(names=["kbroker_test_filter"])


def test_drop_empty_leaves_out_what_says_nothing_and_keeps_every_quantile() -> None:
    prefix = ["kbroker_test_filter_"]
    full = snapshot(prefixes=prefix)
    lean = snapshot(prefixes=prefix, drop_empty=True)
    assert set(full) == set(lean) == {"kbroker_test_filter_seconds",
                                      "kbroker_test_filter_requests",
                                      "kbroker_test_filter_queued"}
    # Counters: the unused label set goes; gauges stay even at zero.
    assert [(s.labels["api"], s.value) for s in lean["kbroker_test_filter_requests"].samples] \
        == [("Produce", 5.0)]
    assert [(s.labels["api"], s.value) for s in lean["kbroker_test_filter_queued"].samples] \
        == [("Produce", 0.0)]
    # Histograms: the label set that observed nothing goes, sum and count stay.
    histogram = lean["kbroker_test_filter_seconds"]
    assert {s.labels["api"] for s in histogram.samples} == {"Produce"}
    assert {s.name for s in histogram.samples} == {
        "kbroker_test_filter_seconds_bucket", "kbroker_test_filter_seconds_count",
        "kbroker_test_filter_seconds_sum"}
    # Buckets: those that observed something, those just below them (their bound is the
    # next one's lower bound), and +Inf.
    kept = [bound for bound, _ in buckets_of(histogram, "Produce")]
    assert kept == [0.0025, 0.005, 0.1, 0.25, 0.5, 1.0, math.inf]
    before = buckets_of(full["kbroker_test_filter_seconds"], "Produce")
    assert len(before) == len(BUCKETS) + 1 > len(kept)
    after = buckets_of(histogram, "Produce")
    for q in (0.01, 0.1, 0.25, 0.5, 0.6, 0.75, 0.9, 0.99, 1.0):
        assert math.isclose(quantile(q, before), quantile(q, after)), q


def test_drop_empty_keeps_a_bucket_below_the_first_one_observed() -> None:
    class S:
        def __init__(self, name: str, le: str | None, value: float) -> None:
            self.name, self.value = name, value
            self.labels = {"le": le} if le is not None else {}

    samples = [S("h_bucket", "1.0", 0), S("h_bucket", "2.0", 0), S("h_bucket", "3.0", 4),
               S("h_bucket", "+Inf", 4), S("h_count", None, 4), S("h_sum", None, 10)]
    kept = non_empty_samples("histogram", samples)
    assert [s.labels.get("le") for s in kept] == ["2.0", "3.0", "+Inf", None, None]
    samples[-2].value = 0
    assert non_empty_samples("histogram", samples) == []


def test_stream_applies_the_same_filters() -> None:
    async def main() -> None:
        server, port, _ = await create_server("test", [])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            stream = metrics_pb2_grpc.MetricsStub(channel).Stream(metrics_pb2.StreamRequest(
                names=["kbroker_test_filter_requests_total"], drop_empty=True,
                interval_ms=100))
            seen = 0
            async for answer in stream:
                assert [f.name for f in answer.families] == ["kbroker_test_filter_requests"]
                assert [s.labels["api"] for s in answer.families[0].samples] == ["Produce"]
                seen += 1
                if seen == 2:
                    break
            stream.cancel()
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))
