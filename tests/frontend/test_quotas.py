"""Client quotas as pure logic on a fake clock: Kafka's rates and throttle times (the numbers of
Kafka's own ClientQuotaManagerTest and ClientRequestQuotaManagerTest), quota resolution in
Kafka's precedence order, and the throttling of answers per API (an empty Fetch when throttled,
acks=0 exempt from the request quota, the mute counted from when the throttle was decided)."""

from __future__ import annotations

import pytest

from kbroker.kafka.v1 import kafka_pb2 as k
from kbroker.replicator.v1.replicator_pb2 import ClientQuota, QuotaEntityPart
from services.frontend.quota_rates import Rate, RateConfig, throttle_time_ms
from services.frontend.quotas import (
    DEFAULT,
    ClientQuotas,
    ClientSensors,
    QuotaType,
    entity_of,
)

PRODUCE = QuotaType.PRODUCE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0  # seconds

    def __call__(self) -> float:
        return self.now

    def sleep_ms(self, ms: float) -> None:
        self.now += ms / 1000


def part(entity_type: str, name: str | None) -> QuotaEntityPart:
    if name is None:
        return QuotaEntityPart(entity_type=entity_type, is_default=True)
    return QuotaEntityPart(entity_type=entity_type, name=name)


def quota(user: object = None, client: object = None, **values: float) -> ClientQuota:
    """A ClientQuota; ``user``/``client``: a name, DEFAULT, or None (absent)."""
    parts = []
    for entity_type, name in (("user", user), ("client-id", client)):
        if name is not None:
            parts.append(part(entity_type, None if name is DEFAULT else str(name)))
    return ClientQuota(entity=parts, values=values)


def sensors(quotas: ClientQuotas, user: str, client: str) -> ClientSensors:
    found = quotas.sensors(user, client)
    assert found is not None
    return found


def record(quotas: ClientQuotas, user: str, client: str, value: float,
           quota_type: QuotaType = PRODUCE) -> int:
    sensor = getattr(sensors(quotas, user, client), quota_type.label)
    return sensor.record(value, quotas.clock() * 1000)


# -- rates ----------------------------------------------------------------------------------


def test_a_new_rate_is_measured_over_all_windows_but_one() -> None:
    rate = Rate(RateConfig(samples=11, window_ms=1000), now_ms=0)
    rate.record(1000, 0)
    assert rate.measure(0) == pytest.approx(100)  # 1000 bytes over 10 s, not over 1 ms
    assert rate.measure(15_000) == 0  # obsolete after samples * window


def test_a_steady_rate_is_measured_as_itself() -> None:
    rate = Rate(RateConfig(samples=11, window_ms=1000), now_ms=0)
    for second in range(30):
        rate.record(250, second * 1000)
    assert rate.measure(29_999) == pytest.approx(250, rel=0.1)


def test_a_negative_value_takes_back_what_was_recorded() -> None:
    rate = Rate(RateConfig(), now_ms=0)
    rate.record(5000, 10)
    rate.record(-5000, 10)
    assert rate.measure(20) == 0


def test_throttle_time_is_kafkas() -> None:
    assert throttle_time_ms(600, 500, 10_500) == 2100
    assert throttle_time_ms(500, 500, 10_000) == 0
    assert throttle_time_ms(101, 100, 50) == 1  # Java's Math.round rounds half up
    assert throttle_time_ms(1e30, 1, 10_000) == 2**31 - 1


def test_rate_config_is_validated() -> None:
    with pytest.raises(ValueError):
        RateConfig(samples=0)
    with pytest.raises(ValueError):
        RateConfig(window_ms=0)


# -- violations (ClientQuotaManagerTest.testQuotaViolation and the request variant) -----------


def test_produce_quota_violation_throttles_until_the_burst_rolls_over() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client=DEFAULT, producer_byte_rate=500)])
    for _ in range(10):
        assert record(quotas, "ANONYMOUS", "unknown", 400) == 0
        clock.sleep_ms(1000)
    # 400*10 + 2300 = 6300 bytes over 10.5 s = 600/s; (600 - 500) / 500 * 10.5 s = 2100 ms
    clock.sleep_ms(500)
    assert record(quotas, "ANONYMOUS", "unknown", 2300) == 2100
    clock.sleep_ms(2100)
    for _ in range(10):
        record(quotas, "ANONYMOUS", "unknown", 400)
        clock.sleep_ms(1000)
    assert record(quotas, "ANONYMOUS", "unknown", 0) == 0


def test_request_percentage_violation_is_bounded_by_one_window() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(user="ANONYMOUS", client="test-client", request_percentage=1)])

    def percent(millis: float) -> float:
        return millis / 1000 * 100

    for _ in range(10):
        assert record(quotas, "ANONYMOUS", "test-client", percent(4), QuotaType.REQUEST) == 0
        clock.sleep_ms(1000)
    # 1% is 10 ms per second: 107.1 ms over 10.5 s = 10.2 ms/s, (10.2-10)/10 * 10.5 s = 210 ms
    clock.sleep_ms(500)
    assert record(quotas, "ANONYMOUS", "test-client", percent(67.1), QuotaType.REQUEST) == 210
    # A huge spike needs more than a window to come back within the quota: bounded by one.
    assert record(quotas, "ANONYMOUS", "test-client", percent(5000), QuotaType.REQUEST) == 1000


def test_byte_rate_throttle_is_not_bounded_by_the_window() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client="big", producer_byte_rate=1000)])
    # 1 MB over 10 s = 100 kB/s: 99 times the quota, 99 * 10 s to come back.
    assert record(quotas, "ANONYMOUS", "big", 1_000_000) == 990_000


# -- resolution (ClientQuotaManagerTest.testQuotaConfigPrecedence) ----------------------------


def check(quotas: ClientQuotas, user: str, client: str, bound: float, value: float,
          throttled: bool) -> None:
    assert quotas.quota(PRODUCE, user, client) == bound
    assert sensors(quotas, user, client).produce.max_value_in_window() == (  # type: ignore[union-attr]
        pytest.approx(10 * bound))
    throttle = record(quotas, user, client, value * 11)
    assert (throttle > 0) == throttled, (user, client, throttle)


def test_quota_precedence_and_shared_rates() -> None:
    quotas = ClientQuotas(clock=FakeClock())
    configured = {
        (DEFAULT, None): 1000, (None, DEFAULT): 2000, (DEFAULT, DEFAULT): 3000,
        ("userA", None): 4000, ("userA", "client1"): 5000, ("userB", None): 6000,
        ("userB", "client1"): 7000, ("userB", DEFAULT): 8000, ("userC", None): 10000,
        (None, "client1"): 9000,
    }

    def apply() -> None:
        quotas.update([quota(user, client, producer_byte_rate=value)
                       for (user, client), value in configured.items()])

    apply()
    check(quotas, "userA", "client1", 5000, 4500, False)  # <user, client> before <user>
    check(quotas, "userA", "client2", 4000, 4500, True)  # <user> before <client> and defaults
    check(quotas, "userA", "client3", 4000, 0, True)  # <user> is shared by its clients
    check(quotas, "userA", "client1", 5000, 0, False)  # <user, client> is its own
    check(quotas, "userB", "client1", 7000, 8000, True)
    check(quotas, "userB", "client2", 8000, 7000, False)  # <user, default client> per client
    check(quotas, "userB", "client3", 8000, 7000, False)
    check(quotas, "userD", "client1", 3000, 3500, True)  # <default user, default client>
    check(quotas, "userD", "client2", 3000, 2500, False)
    check(quotas, "userE", "client1", 3000, 2500, False)

    del configured[(DEFAULT, DEFAULT)]  # back to the <default user> quota
    apply()
    check(quotas, "userD", "client1", 1000, 0, False)  # another rate: starts over
    check(quotas, "userE", "client4", 1000, 1500, True)
    check(quotas, "userF", "client4", 1000, 800, False)  # <default user> is per user
    check(quotas, "userF", "client5", 1000, 800, True)

    del configured[(DEFAULT, None)]  # back to the <default client-id> quota
    apply()
    check(quotas, "userF", "client4", 2000, 0, False)  # shared by a client id of all users
    check(quotas, "userF", "client5", 2000, 0, False)
    check(quotas, "userF", "client5", 2000, 2500, True)
    check(quotas, "userG", "client5", 2000, 0, True)

    configured[("userA", None)] = 8000
    configured[("userA", "client1")] = 10000
    apply()
    check(quotas, "userA", "client2", 8000, 0, False)
    check(quotas, "userA", "client2", 8000, 4500, True)  # earlier values still count
    check(quotas, "userA", "client1", 10000, 0, False)
    check(quotas, "userA", "client1", 10000, 6000, True)
    del configured[("userA", "client1")]
    apply()
    check(quotas, "userA", "client6", 8000, 0, True)  # the user's shared rate
    configured[("userA", "client6")] = 11000
    apply()
    check(quotas, "userA", "client6", 11000, 8500, False)
    configured[("userA", DEFAULT)] = 12000
    del configured[("userA", "client6")]
    apply()
    check(quotas, "userA", "client6", 12000, 4000, True)


def test_each_quota_type_resolves_on_its_own() -> None:
    quotas = ClientQuotas(clock=FakeClock())
    quotas.update([quota(user="alice", consumer_byte_rate=100),
                   quota(client="app", producer_byte_rate=200, request_percentage=50)])
    assert quotas.quota(QuotaType.FETCH, "alice", "app") == 100
    assert quotas.quota(QuotaType.PRODUCE, "alice", "app") == 200
    assert quotas.quota(QuotaType.REQUEST, "alice", "app") == 50
    assert quotas.quota(QuotaType.PRODUCE, "bob", "other") is None
    assert quotas.sensors("bob", "other") is None
    assert quotas.enabled
    quotas.update([])
    assert not quotas.enabled
    assert quotas.sensors("alice", "app") is None


def test_entities_that_are_not_client_entities_are_ignored() -> None:
    assert entity_of(quota(user="u", client=DEFAULT)) == ("u", DEFAULT)
    assert entity_of(ClientQuota(entity=[part("ip", "1.2.3.4")])) is None
    assert entity_of(ClientQuota(entity=[part("user", "a"), part("user", "b")])) is None
    assert entity_of(ClientQuota()) is None
    quotas = ClientQuotas(clock=FakeClock())
    quotas.update([ClientQuota(entity=[part("ip", None)], values={"connection_creation_rate": 5}),
                   quota(user="u", controller_mutation_rate=5)])
    assert not quotas.enabled


def test_idle_rates_expire_after_an_hour() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client=DEFAULT, producer_byte_rate=10)])
    for client in ("a", "b"):
        record(quotas, "u", client, 1)
    clock.sleep_ms(3_600_001)
    record(quotas, "u", "c", 1)
    assert set(quotas._managers[PRODUCE].rates) == {("", "c")}


# -- answers --------------------------------------------------------------------------------


def produce_response() -> k.ProduceResponse:
    return k.ProduceResponse(responses=[k.ProduceResponse.TopicProduceResponse(name="t")])


def test_a_throttled_produce_carries_the_largest_throttle() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client="p", producer_byte_rate=100, request_percentage=1000)])
    answer, charge = quotas.charge(sensors(quotas, "ANONYMOUS", "p"), 0, 2000, 0.001,
                                   produce_response())
    # 2000 bytes over 10 s = 200/s: (200 - 100) / 100 * 10 s
    assert answer.throttle_time_ms == charge.throttle_ms == 10_000
    assert charge.quota_type is QuotaType.PRODUCE and charge.counted_bytes == 2000
    clock.sleep_ms(4000)
    assert charge.after_send(0.0) == pytest.approx(6.0)


def test_acks_0_is_exempt_from_the_request_quota_but_not_the_byte_rate() -> None:
    quotas = ClientQuotas(clock=FakeClock())
    quotas.update([quota(client="p", request_percentage=1)])
    client = sensors(quotas, "ANONYMOUS", "p")
    _, charge = quotas.charge(client, 0, 10, 5.0, produce_response(), acks0=True)
    assert charge.throttle_ms == 0
    _, charge = quotas.charge(client, 0, 10, 5.0, produce_response())
    assert charge.throttle_ms == 1000 and charge.quota_type is QuotaType.REQUEST


def fetch_response(size: int) -> k.FetchResponse:
    return k.FetchResponse(session_id=0, responses=[k.FetchResponse.FetchableTopicResponse(
        topic="t", partitions=[k.FetchResponse.PartitionData(partition_index=0,
                                                              records=b"x" * size)])])


def test_a_throttled_fetch_is_answered_empty_and_its_bytes_do_not_count() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client="c", consumer_byte_rate=1000)])
    client = sensors(quotas, "ANONYMOUS", "c")
    answer, charge = quotas.charge(client, 1, 100, 0.0, fetch_response(5000))
    assert charge.throttle_ms == 0 and len(answer.responses) == 1
    assert charge.counted_bytes == answer.ByteSize()
    answer, charge = quotas.charge(client, 1, 100, 0.0, fetch_response(9000))
    assert charge.throttle_ms > 0 and charge.quota_type is QuotaType.FETCH
    assert answer.throttle_time_ms == charge.throttle_ms
    assert len(answer.responses) == 0 and answer.error_code == 0
    assert charge.counted_bytes == 0
    # Only the first answer's bytes count: still within 1000/s over 10 s.
    assert client.fetch is not None
    assert client.fetch.rate.measure(clock() * 1000) == pytest.approx(
        fetch_response(5000).ByteSize() / 10)


def test_fetch_max_bytes_is_capped_to_one_quota_window() -> None:
    quotas = ClientQuotas(clock=FakeClock())
    quotas.update([quota(client="c", consumer_byte_rate=1000)])
    request = k.FetchRequest(max_bytes=50 * 1024 * 1024, min_bytes=1 << 20)
    quotas.cap_fetch(sensors(quotas, "ANONYMOUS", "c"), request)
    assert (request.max_bytes, request.min_bytes) == (10_000, 10_000)


def test_write_txn_markers_is_exempt() -> None:
    quotas = ClientQuotas(clock=FakeClock())
    quotas.update([quota(client="c", request_percentage=1)])
    _, charge = quotas.charge(sensors(quotas, "ANONYMOUS", "c"), 27, 10, 5.0,
                              k.WriteTxnMarkersResponse())
    assert charge.throttle_ms == 0


def test_the_mute_counts_send_time_against_the_request_quota() -> None:
    clock = FakeClock()
    quotas = ClientQuotas(clock=clock)
    quotas.update([quota(client="c", request_percentage=10)])
    client = sensors(quotas, "ANONYMOUS", "c")
    _, charge = quotas.charge(client, 3, 10, 0.0, k.MetadataResponse())
    assert charge.throttle_ms == 0 and charge.after_send(2.0) == 0
    # 2 s of sending = 200% over 10 s = 20%: the next request is throttled for it.
    _, charge = quotas.charge(client, 3, 10, 0.0, k.MetadataResponse())
    assert charge.throttle_ms == 1000  # (20 - 10) / 10 * 10 s, bounded by one window
