"""Leadership of the replicator: one active instance among its replicas, chosen with a
Kubernetes Lease (``coordination.k8s.io/v1``) the way client-go's ``leaderelection`` package
chooses one.

The Lease spec is the election record: ``holderIdentity`` (empty: nobody holds it),
``leaseDurationSeconds``, ``acquireTime``, ``renewTime`` and ``leaseTransitions`` (how many
times it changed hands). The rules:

- A candidate that finds no Lease creates one naming itself. A create answered 409
  (AlreadyExists) means another candidate was first.
- A Lease held by another identity expires when its record has stayed the same for
  ``leaseDurationSeconds`` on the candidate's own monotonic clock, counted from when the
  candidate first saw that record. The times written in the record are never compared with
  the local clock, so skew between machines cannot cut a lease short: only the rates of the
  clocks matter.
- A Lease with no holder (released), an expired one or one already naming us is taken by
  writing our record with the ``resourceVersion`` just read. A 409 (Conflict) means someone
  wrote in between and won; we read again at the next try.
- The leader renews every retry period. When no renewal has succeeded for ``renew_deadline``
  (counted from when the last successful one was sent), or it finds another holder in the
  Lease, it stops leading. ``renew_deadline < lease_duration``, so a leader that cannot renew
  gives up before any other candidate may consider the Lease expired.
- A leader stopping gracefully releases the Lease (no holder, one second), so a standby takes
  over at its next try instead of waiting out the lease.

Pure decisions (:func:`observe`, :func:`decide`, :func:`next_record`) are apart from the API
calls. :class:`KubernetesLeases` runs the blocking official client in worker threads with a
timeout on every call; :class:`LeaseElector` runs the acquire and renew loops on one event
loop (not thread-safe).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import logging
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)

# client-go's JitterFactor: retries wait up to this factor of the retry period.
JITTER_FACTOR = 1.2


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election record in a Lease's spec."""

    holder: str  # "": nobody (never held, or released)
    duration_s: int  # 0: not set
    acquire_time: datetime.datetime | None
    renew_time: datetime.datetime | None
    transitions: int


@dataclass(frozen=True, slots=True)
class Observation:
    """A record as this candidate last saw it, and when (monotonic seconds) it first saw it
    so: the start of the holder's lease as far as this candidate can tell."""

    record: LeaseRecord
    seen_at: float


class Action(enum.Enum):
    CREATE = "create"  # no Lease yet
    ACQUIRE = "acquire"  # released or expired: take it
    RENEW = "renew"  # ours: renew it
    WAIT = "wait"  # another holder's, still valid


@dataclass(frozen=True, slots=True)
class ElectionSettings:
    """Who competes for which Lease, and the timing (client-go's defaults: 15 s, 10 s, 2 s)."""

    lease_name: str
    namespace: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not (self.lease_name and self.namespace and self.identity):
            raise ValueError("leader election needs a lease name, a namespace and an identity")
        if self.retry_period <= 0:
            raise ValueError("the retry period must be positive")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(f"the renew deadline ({self.renew_deadline} s) must exceed "
                             f"{JITTER_FACTOR} x the retry period ({self.retry_period} s)")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(f"the lease duration ({self.lease_duration} s) must exceed the "
                             f"renew deadline ({self.renew_deadline} s)")

    @property
    def lease_duration_seconds(self) -> int:
        """The whole seconds written in the Lease (at least 1)."""
        return max(1, round(self.lease_duration))

    @property
    def request_timeout(self) -> float:
        """The bound on one API call: a retry period, within the renew deadline."""
        return min(self.retry_period, self.renew_deadline / 2)


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading ``record`` at ``now``: unchanged if the record is the one
    seen before (its lease keeps running from then), else starting now."""
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def decide(identity: str, observed: Observation | None, now: float,
           default_duration: float) -> Action:
    """What ``identity`` does with the Lease it observed (None: there is none) at ``now``.

    A record without a duration counts as lasting ``default_duration``."""
    if observed is None:
        return Action.CREATE
    record = observed.record
    if record.holder == identity:
        return Action.RENEW
    if not record.holder:
        return Action.ACQUIRE
    duration = record.duration_s if record.duration_s > 0 else default_duration
    if now < observed.seen_at + duration:
        return Action.WAIT
    return Action.ACQUIRE


def next_record(action: Action, identity: str, current: LeaseRecord | None, duration_s: int,
                now: datetime.datetime) -> LeaseRecord:
    """The record ``identity`` writes for ``action`` (CREATE, ACQUIRE or RENEW) at wall time
    ``now``: a renewal keeps the acquire time and the transition count; taking the Lease from
    another holder (or from nobody) counts a transition."""
    if action is Action.CREATE or current is None:
        return LeaseRecord(identity, duration_s, now, now, 0)
    if action is Action.RENEW:
        return dataclasses.replace(current, holder=identity, duration_s=duration_s,
                                   renew_time=now)
    if action is Action.ACQUIRE:
        return LeaseRecord(identity, duration_s, now, now, current.transitions + 1)
    raise ValueError(f"nothing to write for {action}")


def released_record(current: LeaseRecord, now: datetime.datetime) -> LeaseRecord:
    """The record a leader leaves when it steps down gracefully (client-go's release)."""
    return LeaseRecord("", 1, now, now, current.transitions)


def wall_now() -> datetime.datetime:
    """UTC now for the record. The API server parses Lease times as RFC 3339 with exactly six
    fractional digits, and the client writes none when the microseconds are zero, so those
    become one microsecond."""
    now = datetime.datetime.now(datetime.UTC)
    return now if now.microsecond else now.replace(microsecond=1)


class LeaseConflictError(Exception):
    """409: the Lease exists already (create) or changed since it was read (replace)."""


class LeaseApiError(Exception):
    """The API server could not be asked or refused for another reason; try again later."""


class Leases(Protocol):
    """The Lease subset of the Kubernetes API an elector needs."""

    async def read(self) -> tuple[LeaseRecord, Any] | None:
        """The record and an opaque version handle, or None when there is no Lease."""

    async def create(self, record: LeaseRecord) -> Any:
        """Create the Lease; returns the new version handle. Raises LeaseConflictError."""

    async def replace(self, record: LeaseRecord, version: Any) -> Any:
        """Write ``record`` over ``version``; returns the new handle. Raises LeaseConflictError."""


class KubernetesLeases:
    """:class:`Leases` through the official client's CoordinationV1Api. Each call runs in a
    worker thread and carries ``timeout`` as its request timeout. The version handle is the
    V1Lease read, so a replace sends back its metadata (name, resourceVersion) and keeps any
    spec fields this elector does not manage."""

    def __init__(self, api_client: ApiClient, name: str, namespace: str,
                 timeout: float) -> None:
        from kubernetes.client import CoordinationV1Api

        self._api = CoordinationV1Api(api_client)
        self._name = name
        self._namespace = namespace
        self._timeout = float(timeout)

    async def read(self) -> tuple[LeaseRecord, Any] | None:
        try:
            lease = await self._call(self._api.read_namespaced_lease, self._name,
                                     self._namespace)
        except LeaseApiError as exc:
            if getattr(exc.__cause__, "status", None) == 404:
                return None
            raise
        return _record_of(lease), lease

    async def create(self, record: LeaseRecord) -> Any:
        from kubernetes.client import V1Lease, V1ObjectMeta

        body = V1Lease(metadata=V1ObjectMeta(name=self._name), spec=_spec_of(record, None))
        return await self._call(self._api.create_namespaced_lease, self._namespace, body)

    async def replace(self, record: LeaseRecord, version: Any) -> Any:
        from kubernetes.client import V1Lease

        body = V1Lease(metadata=version.metadata, spec=_spec_of(record, version.spec))
        return await self._call(self._api.replace_namespaced_lease, self._name,
                                self._namespace, body)

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(method, *args, _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflictError(exc.reason) from exc
            raise LeaseApiError(f"{exc.status} {exc.reason}") from exc
        except Exception as exc:  # urllib3/socket errors, timeouts, bad answers
            raise LeaseApiError(repr(exc)) from exc


def _record_of(lease: Any) -> LeaseRecord:
    spec = lease.spec
    if spec is None:
        return LeaseRecord("", 0, None, None, 0)
    return LeaseRecord(
        holder=spec.holder_identity or "",
        duration_s=spec.lease_duration_seconds or 0,
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        transitions=spec.lease_transitions or 0,
    )


def _spec_of(record: LeaseRecord, current: Any) -> Any:
    from kubernetes.client import V1LeaseSpec

    return V1LeaseSpec(
        holder_identity=record.holder,
        lease_duration_seconds=record.duration_s,
        acquire_time=record.acquire_time,
        renew_time=record.renew_time,
        lease_transitions=record.transitions,
        # Coordinated leader election's fields, kept as they were.
        preferred_holder=getattr(current, "preferred_holder", None),
        strategy=getattr(current, "strategy", None),
    )


class LeaseElector:
    """Campaigns for a Lease and keeps it: :meth:`acquire` returns once this candidate leads,
    :meth:`hold` renews until leadership is lost, :meth:`release` gives it up."""

    def __init__(self, leases: Leases, settings: ElectionSettings,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime.datetime] = wall_now) -> None:
        self._leases = leases
        self.settings = settings
        self._clock = clock
        self._wall = wall
        self._observed: Observation | None = None
        self._version: Any = None
        self.is_leader = False
        # The holder in the last record read or written ("" unknown or nobody).
        self.holder = ""
        # Monotonic time the last successful acquire or renewal round started.
        self._renewed_at = 0.0

    async def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease and create, take or renew it if this candidate may.
        True when this candidate holds it afterwards. Raises LeaseApiError."""
        s = self.settings
        now = self._clock()
        found = await self._leases.read()
        if found is None:
            self._observed = None
        else:
            record, self._version = found
            self._observed = observe(self._observed, record, now)
            self.holder = record.holder
        action = decide(s.identity, self._observed, now, s.lease_duration)
        if action is Action.WAIT:
            return False
        current = self._observed.record if self._observed is not None else None
        new = next_record(action, s.identity, current, s.lease_duration_seconds, self._wall())
        try:
            if action is Action.CREATE:
                self._version = await self._leases.create(new)
            else:
                self._version = await self._leases.replace(new, self._version)
        except LeaseConflictError:
            log.info("lease %s/%s: another candidate wrote first", s.namespace, s.lease_name)
            return False
        if action is not Action.RENEW:
            log.info("lease %s/%s acquired by %s (was %s, %d transitions)", s.namespace,
                     s.lease_name, s.identity, current.holder if current else "absent",
                     new.transitions)
        self._observed = Observation(new, self._clock())
        self.holder = new.holder
        self.is_leader = True
        return True

    async def acquire(self) -> None:
        """Try every retry period (with jitter) until this candidate holds the Lease."""
        s = self.settings
        log.info("lease %s/%s: %s is a candidate", s.namespace, s.lease_name, s.identity)
        while True:
            try:
                async with asyncio.timeout(s.request_timeout * 2):
                    if await self.try_acquire_or_renew():
                        self._renewed_at = self._clock()
                        return
            except (LeaseApiError, TimeoutError) as exc:
                log.warning("lease %s/%s: cannot reach the API server: %s", s.namespace,
                            s.lease_name, exc)
            await asyncio.sleep(s.retry_period * (1 + random.random() * (JITTER_FACTOR - 1)))

    async def hold(self) -> None:
        """Renew every retry period while leading; returns when leadership is lost: no
        renewal succeeded within the renew deadline, or another holder is in the Lease.
        Call after :meth:`acquire`."""
        s = self.settings
        last_sent = self._renewed_at
        while True:
            await asyncio.sleep(s.retry_period)
            deadline = last_sent + s.renew_deadline
            while True:
                started = self._clock()
                left = deadline - started
                if left <= 0:
                    log.error("lease %s/%s: no renewal succeeded for %.1f s: leadership lost",
                              s.namespace, s.lease_name, s.renew_deadline)
                    self.is_leader = False
                    return
                try:
                    async with asyncio.timeout(min(s.request_timeout * 2, left)):
                        renewed = await self.try_acquire_or_renew()
                except (LeaseApiError, TimeoutError) as exc:
                    log.warning("lease %s/%s: renewal failed: %s", s.namespace, s.lease_name,
                                exc)
                    renewed = False
                if renewed:
                    last_sent = started
                    break
                if self.holder and self.holder != s.identity:
                    log.error("lease %s/%s is now held by %s: leadership lost", s.namespace,
                              s.lease_name, self.holder)
                    self.is_leader = False
                    return
                await asyncio.sleep(min(s.retry_period, max(0.0, deadline - self._clock())))

    async def release(self) -> bool:
        """Give the Lease up if this candidate still holds it (bounded). True when released.

        As client-go's release, the Lease is read first: a renewal cancelled while its write
        was on the wire may have changed the Lease after this candidate last saw it, and a
        write at the version seen before would be refused as a conflict."""
        s = self.settings
        if not self.is_leader or self._observed is None:
            return False
        self.is_leader = False
        try:
            async with asyncio.timeout(s.request_timeout * 2):
                found = await self._leases.read()
                if found is None or found[0].holder != s.identity:
                    log.info("lease %s/%s: no longer held by %s, nothing to release",
                             s.namespace, s.lease_name, s.identity)
                    return False
                record, self._version = found
                self._version = await self._leases.replace(
                    released_record(record, self._wall()), self._version)
        except (LeaseConflictError, LeaseApiError, TimeoutError) as exc:
            log.warning("lease %s/%s: could not release: %s", s.namespace, s.lease_name, exc)
            return False
        log.info("lease %s/%s released by %s", s.namespace, s.lease_name, s.identity)
        self.holder = ""
        return True


def default_identity() -> str:
    """The pod name (a pod's hostname), else this machine's host name. Identities must be
    unique among the candidates: two with the same one would both lead."""
    return socket.gethostname()
