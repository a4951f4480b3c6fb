"""Rates measured as Kafka's quota sensors measure them (``org.apache.kafka.common.metrics.stats``
``Rate`` over a ``WindowedSum`` ``SampledStat``) and the throttle time of a violated quota
(``org.apache.kafka.server.quota.QuotaUtils``).

A rate keeps ``samples`` samples of ``window_ms`` each (``quota.window.num`` = 11 and
``quota.window.size.seconds`` = 1 by default). A value is added to the current sample; a sample
is complete once ``window_ms`` has passed since it started, and the next value then starts a new
one, reusing the oldest of ``samples + 1`` slots. A sample whose last value is ``samples *
window_ms`` or more in the past is obsolete: it is reset (its value no longer counts). The rate
at time ``now`` is the sum of the samples divided by the elapsed window::

    elapsed = now - start of the oldest sample
    elapsed = max(elapsed, (samples - 1) * window_ms) if fewer than samples - 1 full windows
    rate    = sum / (elapsed / 1000)        (per second; elapsed at least 1 ms)

so a client that was idle cannot burst: a new client's first request is measured over
``samples - 1`` windows, not over the milliseconds it has been connected.

Times are milliseconds from a monotonic clock; nothing here reads a clock. Not thread-safe (the
frontend's connections share one event loop).
"""

from __future__ import annotations

import dataclasses
import math

# Kafka's defaults (QuotaConfig): quota.window.num and quota.window.size.seconds.
DEFAULT_SAMPLES = 11
DEFAULT_WINDOW_SECONDS = 1
# Throttle times travel in int32 fields (throttle_time_ms).
MAX_THROTTLE_MS = 2**31 - 1


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RateConfig:
    """How a rate is sampled (Kafka's MetricConfig of a quota sensor)."""

    samples: int = DEFAULT_SAMPLES
    window_ms: float = DEFAULT_WINDOW_SECONDS * 1000.0

    def __post_init__(self) -> None:
        if self.samples < 1:
            raise ValueError(f"quota_window_num must be at least 1, not {self.samples}")
        if self.window_ms <= 0:
            raise ValueError(f"quota window must be positive, not {self.window_ms} ms")


class _Sample:
    __slots__ = ("last_event_ms", "start_ms", "value")

    def __init__(self, now_ms: float) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0.0

    def reset(self, now_ms: float) -> None:
        self.start_ms = now_ms
        self.last_event_ms = now_ms
        self.value = 0.0


class Rate:
    """A per-second rate over sampled windows (Kafka's ``Rate`` of a ``WindowedSum``)."""

    __slots__ = ("_config", "_current", "_samples", "last_record_ms")

    def __init__(self, config: RateConfig, now_ms: float) -> None:
        self._config = config
        self._samples = [_Sample(now_ms)]
        self._current = 0
        # When a value was last recorded (an idle rate can be dropped).
        self.last_record_ms = now_ms

    def record(self, value: float, now_ms: float) -> None:
        """Add ``value`` (negative to take back a value recorded before) at ``now_ms``."""
        config = self._config
        sample = self._samples[self._current]
        if now_ms - sample.start_ms >= config.window_ms:
            sample = self._advance(now_ms)
        sample.value += value
        sample.last_event_ms = now_ms
        self.last_record_ms = now_ms

    def _advance(self, now_ms: float) -> _Sample:
        # One slot more than the samples kept: the oldest may still overlap the window.
        self._current = (self._current + 1) % (self._config.samples + 1)
        if self._current >= len(self._samples):
            sample = _Sample(now_ms)
            self._samples.append(sample)
            return sample
        sample = self._samples[self._current]
        sample.reset(now_ms)
        return sample

    def _purge_obsolete(self, now_ms: float) -> None:
        expire_age = self._config.samples * self._config.window_ms
        for sample in self._samples:
            if now_ms - sample.last_event_ms >= expire_age:
                sample.reset(now_ms)

    def window_ms(self, now_ms: float) -> float:
        """The span the rate is measured over at ``now_ms`` (Kafka's ``Rate.windowSize``)."""
        self._purge_obsolete(now_ms)
        config = self._config
        elapsed = now_ms - min(s.start_ms for s in self._samples)
        full_windows = int(elapsed // config.window_ms)
        min_full_windows = config.samples - 1
        if full_windows < min_full_windows:
            elapsed += (min_full_windows - full_windows) * config.window_ms
        return max(elapsed, 1.0)

    def measure(self, now_ms: float) -> float:
        """The rate per second at ``now_ms``."""
        window = self.window_ms(now_ms)  # purges first
        return sum(s.value for s in self._samples) / (window / 1000.0)


def throttle_time_ms(observed: float, bound: float, window_ms: float) -> int:
    """How long a client must stay silent for ``observed`` to come back to ``bound`` over a
    window of ``window_ms`` (Kafka's ``QuotaUtils.throttleTime``): with O the observed rate and
    T the bound, O * W / (W + X) = T gives X = (O - T) / T * W. Zero within the bound."""
    if observed <= bound:
        return 0
    if bound <= 0:
        return MAX_THROTTLE_MS
    # Java's Math.round: half up.
    return min(math.floor((observed - bound) / bound * window_ms + 0.5), MAX_THROTTLE_MS)
