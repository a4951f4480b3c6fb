"""Quantiles from Prometheus histogram buckets, interpolated inside the bucket the rank falls in.

Buckets are cumulative ``(upper bound, count)`` pairs and the last one is ``+Inf`` (its count is
the number of observations). The rank of quantile q is ``q * count``; the quantile lies in the
first bucket whose cumulative count reaches it, between that bucket's lower bound (the previous
bound; 0 for the first bucket, as durations are never negative) and its upper bound, never
outside it.

Where inside the bucket: :func:`histogram_quantile` alone assumes observations spread evenly
over each bucket, as Prometheus' ``histogram_quantile`` does. That is often far off: a phase
that takes microseconds puts every observation in the first bucket (0, 0.5 ms], and even
spreading reports a median of 0.25 ms, above a mean of 0.02 ms. Given the sum of the
observations as well, :func:`quantiles` places them consistently with their mean: inside every
bucket of width ``w`` from ``lo`` the observations follow the distribution function
``((x - lo) / w) ** a``, with one shape ``a`` for all buckets chosen so that the mean the model
implies equals the observed mean (``a`` = 1 is even spreading, a large ``a`` piles observations
at the upper bounds, a small one at the lower bounds). The implied mean is linear in
``t = a / (a + 1)``, the mean position of an observation inside its bucket, so ``t`` is solved
exactly:

    sum = sum over buckets of n_b * (lo_b + t * w_b)      ->   t = (sum - S_lo) / S_w

and clamped to [0, 1] (the sum lies outside what the buckets allow only through rounding, or
through observations beyond the last finite bound, which count at that bound). The quantile is
then ``lo + w * u ** (1 / a)``, ``u`` the rank's fraction of its bucket. Every quantile lies in
its bucket, quantiles grow with q, and with one bucket holding everything the mean lies between
the lower bound and the upper bound where the quantiles are.

Edge cases, as in Prometheus: no observations -> NaN; a rank in the ``+Inf`` bucket -> the
highest finite bound (nothing better is known). Counts that decrease from one bound to the next
(a snapshot taken mid-update across labels) are clamped to be monotonic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def parse_le(le: str) -> float:
    """A bucket's ``le`` label as a float (``+Inf`` included)."""
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def _cumulative(buckets: Iterable[tuple[float, float]]) -> list[tuple[float, float]] | None:
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    out, running = [], 0.0
    for bound, count in ordered:
        running = max(running, count)
        out.append((bound, running))
    return out if running > 0 else None


def mean_position(buckets: Sequence[tuple[float, float]], total: float) -> float:
    """``t``: where in its bucket the average observation lies (0 lower bound, 1 upper bound,
    0.5 evenly spread), so that the buckets' implied mean equals ``total / count``."""
    lows = widths = 0.0
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        n = count - lower_count
        if n > 0:
            lows += n * lower_bound
            if not math.isinf(bound):
                widths += n * (bound - lower_bound)
        lower_bound, lower_count = bound, count
    if widths <= 0:
        return 0.5
    return min(1.0, max(0.0, (total - lows) / widths))


def quantiles(qs: Sequence[float], buckets: Iterable[tuple[float, float]],
              total: float | None = None) -> list[float]:
    """The q-quantiles (each 0 <= q <= 1) of a histogram given as cumulative (bound, count)
    pairs, placed consistently with the sum of the observations ``total`` (None: evenly
    spread inside each bucket)."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile out of range: {q}")
    cumulative = _cumulative(buckets)
    if cumulative is None:
        return [math.nan] * len(qs)
    t = 0.5 if total is None else mean_position(cumulative, total)
    return [_quantile(q, cumulative, t) for q in qs]


def _quantile(q: float, cumulative: list[tuple[float, float]], t: float) -> float:
    rank = q * cumulative[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            u = (rank - lower_count) / (count - lower_count)
            return lower_bound + (bound - lower_bound) * _position(u, t)
        lower_bound, lower_count = bound, count
    return lower_bound


def _position(u: float, t: float) -> float:
    """Where in its bucket (0..1) the fraction ``u`` of the bucket's observations lies, for
    observations whose mean position is ``t``: the inverse of F(x) = x ** a, a = t / (1 - t)."""
    if t >= 1.0:
        return 1.0 if u > 0 else 0.0
    if t <= 0.0:
        return 1.0 if u >= 1.0 else 0.0
    a = t / (1.0 - t)
    return u ** (1.0 / a)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]],
                       total: float | None = None) -> float:
    """The q-quantile (0 <= q <= 1) of a histogram (see :func:`quantiles`)."""
    return quantiles([q], buckets, total)[0]
