"""The event-loop metrics expose exactly what prometheus_client's Counter and Histogram expose
for the same calls (Hypothesis over observations and labels), and the switch's stand-ins
accept every call a metric gets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from services.common.metrics import (
    LATENCY_BUCKETS,
    EventLoopCounter,
    EventLoopHistogram,
    NullMetric,
)

values = st.floats(min_value=0, max_value=100, allow_nan=False)
apis = st.sampled_from(["Produce", "Fetch", "Metadata"])


def exposition(registry: CollectorRegistry) -> list[str]:
    # Sample lines only, without prometheus_client's _created timestamps.
    return sorted(line for line in generate_latest(registry).decode().splitlines()
                  if line and not line.startswith("#") and "_created" not in line)


@given(st.lists(st.tuples(apis, values), max_size=50))
def test_histogram_exposition_matches_prometheus_client(observations) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = EventLoopHistogram("t_seconds", "doc", ["api"], buckets=LATENCY_BUCKETS,
                              registry=ours)
    reference = Histogram("t_seconds", "doc", ["api"], buckets=LATENCY_BUCKETS,
                          registry=theirs)
    for api, value in observations:
        loop.labels(api).observe(value)
        reference.labels(api).observe(value)
    # Bucket edges included: a value equal to a bound falls in that bound's bucket.
    for bound in LATENCY_BUCKETS:
        loop.labels("edge").observe(bound)
        reference.labels("edge").observe(bound)
    assert exposition(ours) == exposition(theirs)


@given(st.lists(st.tuples(apis, st.integers(0, 3), values), max_size=50))
def test_counter_exposition_matches_prometheus_client(increments) -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = EventLoopCounter("t_requests_total", "doc", ["api", "code"], registry=ours)
    reference = Counter("t_requests_total", "doc", ["api", "code"], registry=theirs)
    for api, code, amount in increments:
        # Label values given as ints and as strings are the same child.
        loop.labels(api, code if code % 2 else str(code)).inc(amount)
        reference.labels(api, str(code)).inc(amount)
    plain, plain_reference = (EventLoopCounter("t_plain", "doc", registry=ours),
                              Counter("t_plain", "doc", registry=theirs))
    plain.inc(3)
    plain_reference.inc(3)
    assert exposition(ours) == exposition(theirs)


def test_labels_must_match_the_label_names() -> None:
    counter = EventLoopCounter("t_checked", "doc", ["a", "b"], registry=None)
    try:
        counter.labels("only-one")
        raise AssertionError("a wrong label count was accepted")
    except ValueError:
        pass


def test_null_metric_takes_every_call() -> None:
    metric = NullMetric("name", "doc", ["a"], buckets=(1.0,))
    child = metric.labels("x")
    child.inc()
    child.inc(2)
    child.dec()
    child.set(4)
    child.observe(0.1)
    metric.remove("x")
    metric.clear()
