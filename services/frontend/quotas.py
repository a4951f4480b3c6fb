"""Client quotas (Kafka's ClientQuotaManager, ClientRequestQuotaManager and the throttling part of
KafkaApis), enforced by each frontend on its own connections as each Kafka broker enforces them
on its own: a quota is a per-frontend share, as in Kafka it is per broker.

Quota types, by Kafka's quota keys::

    producer_byte_rate   produce   request frame bytes of Produce, per second
    consumer_byte_rate   fetch     Fetch response bytes, per second
    request_percentage   request   time spent serving the client's requests, as a percentage
                                   of one thread (100 = one thread busy all the time)

A client is the pair (user, client-id): ``user`` is the name of its ``User:`` principal
("ANONYMOUS" without authentication), the client id is the request header's. The quota that
applies is the most specific configured one, in Kafka's order::

    1. user + client-id            5. default user + default client-id
    2. user + default client-id    6. default user
    3. user                        7. client-id
    4. default user + client-id    8. default client-id

and each quota type resolves on its own (a user with only a consumer_byte_rate is unlimited
for produce, or falls back to a less specific producer_byte_rate). Which clients share a rate
follows Kafka's sensors: at levels 1, 2, 4 and 5 each (user, client-id) has its own; at levels 3
and 6 a user's client ids share one (a user quota bounds all of them together); at levels 7 and
8 a client id's users share one.

Rates and throttle times are Kafka's (:mod:`.quota_rates`). The throttle time of a response is
the largest of its quota types' (Kafka's ``maxThrottleTimeMs``), per API as KafkaApis does it:

- Produce: the request's bytes count against producer_byte_rate, then its time against
  request_percentage (not for acks=0, which has no answer; its channel is still muted);
- Fetch: time against request_percentage, then the answer's bytes against consumer_byte_rate.
  A throttled Fetch is answered empty (Kafka's ``getThrottledResponse``) and its bytes are taken
  back from the rate, since they were not sent. Before the call, a Fetch's max_bytes (and
  min_bytes) is capped to what one quota window can carry (Kafka's
  ``getMaxValueInQuotaWindow``), so a single fetch is never throttled for its size alone;
- every other forwarded API: its time against request_percentage. WriteTxnMarkers (a cluster
  action) is exempt, and so are the APIs the frontend answers itself (ApiVersions, SASL), which
  Kafka serves from the network layer before authentication completes.

A byte-rate throttle is not bounded (a request far above a small quota waits accordingly, as in
Kafka); a request-percentage throttle is bounded by one quota window
(``ClientRequestQuotaManager.maxThrottleTimeMs``).

Request time: Kafka counts the request handler thread's time on the request (from taking it
off the request queue to handing the answer to the network thread; a request parked in the
purgatory frees its thread, which is RemoteTime) plus the network threads' time on it. A
frontend and its handlers together play the request handler and network threads, so the time
counted is the request's ``local`` phase (decode, the handler call less its purgatory wait,
encode: what the frontend and the handler spent on it) with the throttle check, then the
``response_send`` phase once the answer is written, without a check (Kafka's
``recordNoThrottle`` of network thread time). It is wall time, as Kafka's thread time is.

The configuration is the cluster metadata's ``client_quotas`` (``replicator_pb2.ClientQuota``):
:meth:`ClientQuotas.update` replaces it. Entities with an ``ip`` part (connection quotas) and
keys other than the three above are not client quotas and are ignored here. Not thread-safe
(one event loop).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from typing import Final

from google.protobuf.message import Message

from kbroker.kafka.v1 import kafka_pb2
from kbroker.replicator.v1 import replicator_pb2

from .quota_rates import DEFAULT_SAMPLES, DEFAULT_WINDOW_SECONDS, Rate, RateConfig, throttle_time_ms

PRODUCE_KEY = 0
FETCH_KEY = 1
WRITE_TXN_MARKERS_KEY = 27
# APIs Kafka answers without charging the request quota (cluster actions).
EXEMPT_APIS = frozenset({WRITE_TXN_MARKERS_KEY})

# Kafka drops a client's sensors after an hour without activity.
INACTIVE_SENSOR_SECONDS = 3600.0
# How often idle rates are looked for.
_EXPIRY_CHECK_SECONDS = 60.0
# Resolved clients kept (client ids come from clients: bounded).
_MAX_CACHED_CLIENTS = 10_000
_PERCENT_PER_SECOND = 100.0


class QuotaType(enum.Enum):
    """A client quota type, valued by its Kafka quota key."""

    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST = "request_percentage"

    @property
    def label(self) -> str:
        """The low-cardinality name in metrics (Kafka's QuotaType: Produce, Fetch, Request)."""
        return self.name.lower()


class _Default:
    """The default entity of a type (Kafka's ``<default>``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default>"


DEFAULT: Final = _Default()
# One part of an entity: absent (None), the default, or a name.
EntityName = str | _Default | None
# (user, client-id)
Entity = tuple[EntityName, EntityName]
# A sensor's identity (Kafka's metric tags user and client-id; "" for a level not used).
Tags = tuple[str, str]


def entity_of(quota: replicator_pb2.ClientQuota) -> Entity | None:
    """The (user, client-id) entity of ``quota``, or None when it is not a client entity (an
    ``ip`` part, an unknown type, a type twice, no part)."""
    user: EntityName = None
    client: EntityName = None
    seen = set()
    for part in quota.entity:
        if part.entity_type in seen:
            return None
        seen.add(part.entity_type)
        name: EntityName = DEFAULT if part.is_default else part.name
        if part.entity_type == "user":
            user = name
        elif part.entity_type == "client-id":
            client = name
        else:
            return None
    if not seen:
        return None
    return user, client


class _QuotaManager:
    """The configured quotas and the clients' rates of one quota type (Kafka's
    ClientQuotaManager with its DefaultQuotaCallback)."""

    def __init__(self, quota_type: QuotaType, config: RateConfig, max_throttle_ms: int) -> None:
        self.quota_type = quota_type
        self.config = config
        self.max_throttle_ms = max_throttle_ms
        self.overrides: dict[Entity, float] = {}
        self.rates: dict[Tags, Rate] = {}

    def metric_tags(self, user: str, client_id: str) -> Tags:
        """Which rate a client is measured by: its own (user, client-id) for a quota at the
        user + client-id levels, the user's for a user-level one, else the client id's."""
        o = self.overrides
        if (user, client_id) in o or (user, DEFAULT) in o:
            return user, client_id
        if (user, None) in o:
            return user, ""
        if (DEFAULT, client_id) in o or (DEFAULT, DEFAULT) in o:
            return user, client_id
        if (DEFAULT, None) in o:
            return user, ""
        return "", client_id

    def quota_limit(self, tags: Tags) -> float | None:
        """The bound of the rate named by ``tags`` (Kafka's ``quotaLimit``), None if unlimited."""
        user, client_id = tags
        o = self.overrides
        if user and client_id:
            for entity in ((user, client_id), (user, DEFAULT), (DEFAULT, client_id),
                           (DEFAULT, DEFAULT)):
                if entity in o:
                    return o[entity]
        elif user:
            for entity in ((user, None), (DEFAULT, None)):
                if entity in o:
                    return o[entity]
        elif client_id:
            for entity in ((None, client_id), (None, DEFAULT)):
                if entity in o:
                    return o[entity]
        return None

    def sensor(self, user: str, client_id: str, now_ms: float) -> QuotaSensor | None:
        """The client's rate and bound, or None when no quota of this type applies to it."""
        tags = self.metric_tags(user, client_id)
        bound = self.quota_limit(tags)
        if bound is None:
            return None
        rate = self.rates.get(tags)
        if rate is None:
            rate = self.rates[tags] = Rate(self.config, now_ms)
        return QuotaSensor(self, rate, bound)

    def expire(self, now_ms: float) -> None:
        limit = now_ms - INACTIVE_SENSOR_SECONDS * 1000.0
        for tags in [t for t, r in self.rates.items() if r.last_record_ms < limit]:
            del self.rates[tags]


class QuotaSensor:
    """One client's rate of one quota type and its bound (Kafka's quota sensor)."""

    __slots__ = ("bound", "manager", "rate")

    def __init__(self, manager: _QuotaManager, rate: Rate, bound: float) -> None:
        self.manager = manager
        self.rate = rate
        self.bound = bound

    def record(self, value: float, now_ms: float) -> int:
        """Record ``value`` and return the throttle time in ms (0 within the quota)."""
        rate = self.rate
        rate.record(value, now_ms)
        observed = rate.measure(now_ms)
        if observed <= self.bound:
            return 0
        throttle = throttle_time_ms(observed, self.bound, rate.window_ms(now_ms))
        return min(throttle, self.manager.max_throttle_ms)

    def record_no_throttle(self, value: float, now_ms: float) -> None:
        """Record ``value`` without a check: it counts against the client's next requests."""
        self.rate.record(value, now_ms)

    def max_value_in_window(self) -> float:
        """The most that can be recorded at once without certain throttling (Kafka's
        ``getMaxValueInQuotaWindow``): the bound over all windows but the current one."""
        config = self.manager.config
        return self.bound * (config.samples - 1) * config.window_ms / 1000.0


class ClientSensors:
    """The sensors one client (user, client-id) is charged on, one per quota type that applies
    to it (None where none does)."""

    __slots__ = ("fetch", "produce", "request")

    def __init__(self, produce: QuotaSensor | None, fetch: QuotaSensor | None,
                 request: QuotaSensor | None) -> None:
        self.produce = produce
        self.fetch = fetch
        self.request = request


class Charge:
    """What answering one request cost a client under its quotas: the throttle time the answer
    carries, the quota type it is due to (None when not throttled) and the bytes counted
    against a byte rate. After the answer is written, :meth:`after_send` counts the send time
    and tells how long the connection stays muted (Kafka's ThrottledChannel)."""

    __slots__ = ("_quotas", "_request_sensor", "counted_bytes", "quota_type", "throttle_ms",
                 "until")

    def __init__(self, quotas: ClientQuotas, request_sensor: QuotaSensor | None,
                 throttle_ms: int, quota_type: QuotaType | None, counted_bytes: int,
                 decided: float) -> None:
        self._quotas = quotas
        self._request_sensor = request_sensor
        self.throttle_ms = throttle_ms
        self.quota_type = quota_type
        self.counted_bytes = counted_bytes
        # When the mute ends, on the quotas' clock (seconds): the throttle counts from when it
        # was decided, as Kafka's ThrottledChannel does.
        self.until = decided + throttle_ms / 1000.0

    def after_send(self, send_seconds: float) -> float:
        """Count the time spent writing the answer against the request quota (no check), and
        return the seconds the connection must still stay muted."""
        now = self._quotas.clock()
        if self._request_sensor is not None and send_seconds > 0:
            self._request_sensor.record_no_throttle(send_seconds * _PERCENT_PER_SECOND,
                                                    now * 1000.0)
        return max(self.until - now, 0.0)


class ClientQuotas:
    """Every client quota of one frontend: the configuration, the clients' rates and the
    throttling of their answers."""

    def __init__(self, *, samples: int = DEFAULT_SAMPLES,
                 window_seconds: float = DEFAULT_WINDOW_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config = RateConfig(samples=samples, window_ms=window_seconds * 1000.0)
        self.clock = clock
        self._managers = {
            QuotaType.PRODUCE: _QuotaManager(QuotaType.PRODUCE, config, 2**31 - 1),
            QuotaType.FETCH: _QuotaManager(QuotaType.FETCH, config, 2**31 - 1),
            QuotaType.REQUEST: _QuotaManager(QuotaType.REQUEST, config,
                                             round(config.window_ms)),
        }
        self._clients: dict[tuple[str, str], ClientSensors | None] = {}
        self._next_expiry = 0.0
        self.enabled = False

    # -- configuration ----------------------------------------------------------------------

    def update(self, quotas: Iterable[replicator_pb2.ClientQuota]) -> None:
        """Replace the configured quotas. Rates measured so far are kept: a changed bound
        applies to what a client already did, as Kafka's updated metric config does."""
        overrides: dict[QuotaType, dict[Entity, float]] = {t: {} for t in QuotaType}
        for quota in quotas:
            entity = entity_of(quota)
            if entity is None:
                continue
            for key, value in quota.values.items():
                try:
                    quota_type = QuotaType(key)
                except ValueError:
                    continue
                overrides[quota_type][entity] = value
        for quota_type, manager in self._managers.items():
            manager.overrides = overrides[quota_type]
        self._clients.clear()
        self.enabled = any(overrides.values())

    def quota(self, quota_type: QuotaType, user: str, client_id: str | None) -> float | None:
        """The bound that applies to a client for ``quota_type``, None if unlimited."""
        manager = self._managers[quota_type]
        return manager.quota_limit(manager.metric_tags(user, client_id or ""))

    # -- measuring --------------------------------------------------------------------------

    def sensors(self, user: str, client_id: str | None) -> ClientSensors | None:
        """The sensors of a client, or None when no quota applies to it."""
        key = (user, client_id or "")
        try:
            return self._clients[key]
        except KeyError:
            pass
        now_ms = self.clock() * 1000.0
        if now_ms >= self._next_expiry:
            self._expire(now_ms)
        produce, fetch, request = (self._managers[t].sensor(*key, now_ms) for t in
                                   (QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST))
        found = (ClientSensors(produce, fetch, request)
                 if produce or fetch or request else None)
        if len(self._clients) >= _MAX_CACHED_CLIENTS:
            self._clients.clear()
        self._clients[key] = found
        return found

    def _expire(self, now_ms: float) -> None:
        self._next_expiry = now_ms + _EXPIRY_CHECK_SECONDS * 1000.0
        for manager in self._managers.values():
            manager.expire(now_ms)
        self._clients.clear()

    def cap_fetch(self, sensors: ClientSensors, request: Message) -> None:
        """Cap a FetchRequest's max_bytes (and min_bytes) to what one quota window can carry."""
        if sensors.fetch is None:
            return
        cap = int(min(sensors.fetch.max_value_in_window(), 2**31 - 1))
        if request.max_bytes > cap:  # type: ignore[attr-defined]
            request.max_bytes = cap  # type: ignore[attr-defined]
        if request.min_bytes > request.max_bytes:  # type: ignore[attr-defined]
            request.min_bytes = request.max_bytes  # type: ignore[attr-defined]

    def charge(self, sensors: ClientSensors, api_key: int, request_bytes: int,
               request_seconds: float, response: Message, *,
               acks0: bool = False) -> tuple[Message, Charge]:
        """Record one answered request against the client's quotas; return the answer to send
        (its throttle_time_ms set where it has one; an empty one for a throttled Fetch) and the
        :class:`Charge`."""
        now = self.clock()
        now_ms = now * 1000.0
        request_sensor = None if api_key in EXEMPT_APIS else sensors.request
        request_percent = max(request_seconds, 0.0) * _PERCENT_PER_SECOND
        bandwidth_ms = request_ms = 0
        bandwidth_type: QuotaType | None = None
        counted = 0
        if api_key == PRODUCE_KEY:
            if sensors.produce is not None:
                counted = request_bytes
                bandwidth_ms = sensors.produce.record(request_bytes, now_ms)
                bandwidth_type = QuotaType.PRODUCE
            if request_sensor is not None and not acks0:
                request_ms = request_sensor.record(request_percent, now_ms)
        elif api_key == FETCH_KEY:
            if request_sensor is not None:
                request_ms = request_sensor.record(request_percent, now_ms)
            if sensors.fetch is not None:
                counted = response.ByteSize()
                bandwidth_ms = sensors.fetch.record(counted, now_ms)
                bandwidth_type = QuotaType.FETCH
                if max(bandwidth_ms, request_ms) > 0:
                    # The answer is not sent: its bytes do not count.
                    sensors.fetch.record_no_throttle(-counted, now_ms)
                    counted = 0
            if max(bandwidth_ms, request_ms) > 0:
                response = kafka_pb2.FetchResponse(
                    error_code=0, session_id=response.session_id)  # type: ignore[attr-defined]
        elif request_sensor is not None:
            request_ms = request_sensor.record(request_percent, now_ms)
        throttle_ms = max(bandwidth_ms, request_ms)
        quota_type = None
        if throttle_ms > 0:
            quota_type = bandwidth_type if bandwidth_ms > request_ms else QuotaType.REQUEST
            if "throttle_time_ms" in response.DESCRIPTOR.fields_by_name:
                response.throttle_time_ms = throttle_ms  # type: ignore[attr-defined]
        return response, Charge(self, request_sensor, throttle_ms, quota_type, counted, now)
