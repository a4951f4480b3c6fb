"""Bucket quantiles (spark.histogram) against exact quantiles of the observations."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.metrics import LATENCY_BUCKETS
from spark.histogram import histogram_quantile, parse_le

BOUNDS = (*LATENCY_BUCKETS, math.inf)


def buckets_of(observations: list[float]) -> list[tuple[float, float]]:
    ordered = sorted(observations)
    return [(b, float(bisect.bisect_right(ordered, b))) for b in BOUNDS]


def test_interpolates_inside_the_bucket() -> None:
    # 10 observations in (0.01, 0.025]: the median is halfway through that bucket.
    buckets = [(0.01, 0.0), (0.025, 10.0), (math.inf, 10.0)]
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.0175)
    assert histogram_quantile(1.0, buckets) == pytest.approx(0.025)


def test_edge_cases() -> None:
    assert math.isnan(histogram_quantile(0.5, []))
    assert math.isnan(histogram_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]))
    assert math.isnan(histogram_quantile(0.5, [(1.0, 3.0)]))  # no +Inf bucket
    # Ranks in the +Inf bucket answer the highest finite bound.
    assert histogram_quantile(0.99, [(1.0, 1.0), (math.inf, 100.0)]) == 1.0
    # The first bucket starts at 0.
    assert histogram_quantile(0.5, [(2.0, 4.0), (math.inf, 4.0)]) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        histogram_quantile(1.5, [(math.inf, 1.0)])
    assert parse_le("+Inf") == math.inf and parse_le("0.005") == 0.005


@given(
    st.lists(st.floats(min_value=0.0, max_value=40.0, allow_nan=False), min_size=1,
             max_size=200),
    st.sampled_from([0.5, 0.9, 0.99, 0.999]),
)
def test_estimate_lies_in_the_bucket_of_the_true_quantile(obs: list[float], q: float) -> None:
    estimate = histogram_quantile(q, buckets_of(obs))
    ordered = sorted(obs)
    exact = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    upper_index = bisect.bisect_left(BOUNDS, exact)
    lower = BOUNDS[upper_index - 1] if upper_index else 0.0
    upper = BOUNDS[upper_index]
    if math.isinf(upper):
        assert estimate == LATENCY_BUCKETS[-1]
    else:
        assert lower - 1e-12 <= estimate <= upper + 1e-12


@given(st.lists(st.floats(min_value=0.0, max_value=40.0, allow_nan=False), min_size=1,
                max_size=100))
def test_quantiles_are_monotonic_in_q(obs: list[float]) -> None:
    buckets = buckets_of(obs)
    values = [histogram_quantile(q, buckets) for q in (0.0, 0.5, 0.9, 0.99, 0.999, 1.0)]
    assert values == sorted(values)
