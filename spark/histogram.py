"""Quantiles from Prometheus histogram buckets, the way Prometheus' ``histogram_quantile`` does
it: find the bucket the rank falls in and interpolate linearly inside it.

Buckets are cumulative ``(upper bound, count)`` pairs and the last one is ``+Inf`` (its count is
the number of observations). Edge cases, as in Prometheus: no observations -> NaN; a rank in the
``+Inf`` bucket -> the highest finite bound (nothing better is known); the first bucket's lower
bound is 0 (our histograms observe durations, never negative). Counts that decrease from one
bound to the next (a snapshot taken mid-update across labels) are clamped to be monotonic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def parse_le(le: str) -> float:
    """A bucket's ``le`` label as a float (``+Inf`` included)."""
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile (0 <= q <= 1) of a histogram given as cumulative (bound, count) pairs."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile out of range: {q}")
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return math.nan
    counts: list[float] = []
    running = 0.0
    for _, count in ordered:
        running = max(running, count)
        counts.append(running)
    total = counts[-1]
    if total <= 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for (bound, _), count in zip(ordered, counts, strict=True):
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
