"""Restart policy for the services of a local cluster: when a service that exited is started
again, as Kubernetes restarts a crashed container (``restartPolicy: Always``).

Pure bookkeeping over a clock the caller passes in; :class:`services.local_cluster.LocalCluster`
does the process work. The backoff mirrors the kubelet's CrashLoopBackOff: the first restart
waits ``initial`` seconds, each further one twice as long up to ``cap``, and a service that ran
for ``reset_after`` seconds before it exited starts over at ``initial``. Not thread-safe: one
supervising loop drives it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """Delays before restarts, in seconds."""

    initial: float = 1.0
    cap: float = 60.0
    reset_after: float = 60.0

    def delay(self, failures: int) -> float:
        """The wait before restart number ``failures`` (1: the first since the last reset)."""
        if failures < 1:
            return 0.0
        return min(self.cap, self.initial * 2 ** min(failures - 1, 62))


@dataclasses.dataclass(slots=True)
class ServiceRecord:
    """One supervised service: when it last started, its restarts and the pending one."""

    started_at: float | None = None
    # Exits since the service last ran for Backoff.reset_after: the backoff exponent.
    failures: int = 0
    # Restarts done over the supervisor's life (what status lines show).
    restarts: int = 0
    # When the pending restart is due (None: the service runs, or is not to be restarted).
    restart_at: float | None = None


class Supervisor:
    """Decides when each exited service restarts; counts the restarts."""

    def __init__(self, names: list[str], backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._records = {name: ServiceRecord() for name in names}

    def started(self, name: str, now: float) -> None:
        """Service ``name`` was (re)started at ``now``."""
        record = self._records[name]
        record.started_at = now
        record.restart_at = None

    def exited(self, name: str, now: float) -> float:
        """Service ``name`` was seen exited at ``now``: schedule its restart and return the
        delay. A service that ran at least ``reset_after`` seconds restarts after ``initial``."""
        record = self._records[name]
        if record.restart_at is not None:
            return record.restart_at - now
        ran = now - record.started_at if record.started_at is not None else 0.0
        if ran >= self.backoff.reset_after:
            record.failures = 0
        record.failures += 1
        delay = self.backoff.delay(record.failures)
        record.restart_at = now + delay
        return delay

    def pending(self, name: str) -> bool:
        """Whether a restart of ``name`` is scheduled (its exit was already seen)."""
        return self._records[name].restart_at is not None

    def due(self, now: float) -> list[str]:
        """The services whose restart is due at ``now``, in the order they were registered."""
        return [name for name, record in self._records.items()
                if record.restart_at is not None and record.restart_at <= now]

    def restarting(self, name: str, now: float) -> int:
        """Service ``name`` is being restarted at ``now``; return its restart count."""
        record = self._records[name]
        record.restarts += 1
        self.started(name, now)
        return record.restarts

    def restarts(self, name: str) -> int:
        return self._records[name].restarts
