"""Bucket quantiles (spark.histogram) against exact quantiles of the observations, evenly spread
as Prometheus does and placed by the observed mean."""

from __future__ import annotations

import bisect
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.metrics import LATENCY_BUCKETS
from spark.histogram import histogram_quantile, mean_position, parse_le, quantiles

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


def test_quantiles_follow_the_mean_inside_a_bucket() -> None:
    # 1000 observations of 20 us: all in the first bucket (0, 0.5 ms]. Evenly spread they would
    # give a median of 0.25 ms, above their mean; placed by the mean, every quantile is small.
    obs = [0.00002] * 1000
    buckets, total = buckets_of(obs), sum(obs)
    p50, p99 = quantiles([0.5, 0.99], buckets, total)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.00025)
    assert 0 <= p50 <= p99 <= 0.0005
    assert p50 < 0.0001
    # Piled at the top of (0.25, 0.5] (long polls answered at 0.4999 s): quantiles near 0.5 s,
    # never below the bucket's lower bound.
    polls = [0.4999] * 500
    q = quantiles([0.0, 0.5, 0.99], buckets_of(polls), sum(polls))
    assert all(0.25 <= v <= 0.5 for v in q)
    assert q[1] > 0.49
    # A phase that never took time: every quantile 0.
    assert quantiles([0.5, 0.99], buckets_of([0.0] * 10), 0.0) == [0.0, 0.0]


@given(
    st.lists(st.floats(min_value=0.0, max_value=29.0, allow_nan=False), min_size=1,
             max_size=200),
    st.sampled_from([0.5, 0.9, 0.99, 0.999]),
)
def test_mean_placed_estimate_lies_in_the_bucket_of_the_true_quantile(
        obs: list[float], q: float) -> None:
    estimate = histogram_quantile(q, buckets_of(obs), sum(obs))
    ordered = sorted(obs)
    exact = ordered[max(0, math.ceil(q * len(ordered)) - 1)]
    upper_index = bisect.bisect_left(BOUNDS, exact)
    lower = BOUNDS[upper_index - 1] if upper_index else 0.0
    assert lower - 1e-12 <= estimate <= BOUNDS[upper_index] + 1e-12


@given(st.lists(st.floats(min_value=0.0, max_value=29.0, allow_nan=False), min_size=1,
                max_size=100))
def test_the_placement_implies_the_observed_mean(obs: list[float]) -> None:
    buckets = buckets_of(obs)
    mean = sum(obs) / len(obs)
    t = mean_position(buckets, sum(obs))
    if 0.0 < t < 1.0:
        # The mean of the model: the integral of its quantile function over q.
        steps = 4000
        implied = sum(quantiles([(i + 0.5) / steps for i in range(steps)], buckets, sum(obs)))
        assert implied / steps == pytest.approx(mean, rel=0.02, abs=1e-6)
    values = quantiles([0.0, 0.5, 0.9, 0.99, 0.999, 1.0], buckets, sum(obs))
    assert values == sorted(values)
