"""A failed log directory (Kafka's ``LogDirFailureChannel``) and the free-space floor that
fails it before the disk is really full.

A log node keeps its partition replicas in one log directory. Any I/O error while writing,
flushing or rolling a segment, or writing a checkpoint there (``OSError``: ENOSPC, EIO, EROFS,
EDQUOT, ...) marks the directory failed, once: the first failure is logged (one line), later
ones are not. From then on every replica in the directory is offline, as in Kafka: appends,
reads and replication calls on them answer KAFKA_STORAGE_ERROR, nothing more is written there
(no flush or checkpoint on shutdown either), and the node reports the failure in its health
check and metrics. Only a restart brings the directory back; recovery at start-up then cuts
whatever half-written tail the failure left, as after a crash.

The free-space floor (``log.dir.min.free.bytes`` and ``log.dir.min.free.percent``, no Kafka
equivalent; Redpanda's ``storage_min_free_bytes`` is the same idea) is checked before each
write: a write that would leave less free space than the floor fails the directory the same
way, with an ENOSPC of our own, before the file system runs out. One state and one way back
(a restart with space) rather than a second "low on space" state that clears by itself:
free space hovering around the floor (retention deleting a segment, the next appends filling
it) would otherwise move leadership back and forth, and a directory failed with headroom left
can still be shut down cleanly. Followers with space take over its partitions, since the node
stops reporting its log service as serving.

Free space is read with ``statvfs`` at most every :data:`RECHECK_SECONDS` and whenever the
bytes written since the last reading could have brought it within twice the floor, so an
append costs no system call in the common case.

Not thread-safe: used from the event loop (a failure met in a worker thread is reported back
on it).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from services.common.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# Re-read free space at least this often while appends go on.
RECHECK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class DiskUsage:
    """The file system holding a log directory, in bytes (as ``df`` reports it: ``free`` is
    what an unprivileged writer may still use)."""

    total: int
    free: int
    used: int

    @classmethod
    def of(cls, path: Path) -> DiskUsage:
        stat = os.statvfs(path)
        total = stat.f_blocks * stat.f_frsize
        return cls(total=total, free=stat.f_bavail * stat.f_frsize,
                   used=total - stat.f_bfree * stat.f_frsize)


@dataclass(frozen=True, slots=True, kw_only=True)
class FreeSpaceFloor:
    """The least free space a log directory keeps: ``min_bytes`` or ``min_percent`` of the
    file system, whichever is larger (0 and 0: no floor)."""

    min_bytes: int = 0
    min_percent: float = 0.0

    def __post_init__(self) -> None:
        if self.min_bytes < 0 or not 0 <= self.min_percent < 100:
            raise ValueError("the free-space floor needs bytes >= 0 and 0 <= percent < 100")

    @property
    def enabled(self) -> bool:
        return self.min_bytes > 0 or self.min_percent > 0

    def bytes_for(self, total: int) -> int:
        """The floor in bytes on a file system of ``total`` bytes."""
        return max(self.min_bytes, int(total * self.min_percent / 100))


class LogDirFailureChannel:
    """Whether the log directory ``path`` has failed, why, and the guard its writers call.

    ``on_failure`` is called once, with the directory's failure, when it fails (the node's
    glue takes its log service out of service there)."""

    def __init__(self, path: Path, floor: FreeSpaceFloor | None = None,
                 on_failure: Callable[[str], None] | None = None,
                 usage: Callable[[Path], DiskUsage] = DiskUsage.of,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.floor = floor or FreeSpaceFloor()
        self.on_failure = on_failure
        self._usage = usage
        self._clock = clock
        # Why the directory failed (None: online).
        self.failure: str | None = None
        # Free bytes at the last reading, bytes written since, when read (clock seconds).
        self._free = 0
        self._floor_bytes = 0
        self._written_since = 0
        self._read_at: float | None = None

    @property
    def offline(self) -> bool:
        return self.failure is not None

    def fail(self, exc: BaseException, during: str) -> bool:
        """Mark the directory failed by ``exc``, met while ``during`` (Kafka's
        ``maybeAddOfflineLogDir``); only the first failure is logged and reported. Returns
        whether this call failed it."""
        if self.failure is not None:
            return False
        self.failure = f"{during}: {_describe(exc)}"
        log.error("log dir %s failed (%s); its replicas are offline until the node is "
                  "restarted", self.path, self.failure)
        if self.on_failure is not None:
            self.on_failure(self.failure)
        return True

    def check_online(self) -> None:
        """Raise KAFKA_STORAGE_ERROR if the directory has failed."""
        if self.failure is not None:
            raise KafkaError(ErrorCode.kafka_storage_error,
                             f"log dir {self.path} is offline ({self.failure})")

    def reserve(self, size: int) -> None:
        """Before writing ``size`` bytes: raise ``OSError(ENOSPC)`` if they would take the
        free space below the floor (the caller fails the directory as for any write
        error)."""
        if not self.floor.enabled:
            return
        now = self._clock()
        if (self._read_at is None or now - self._read_at >= RECHECK_SECONDS
                or self._free - self._written_since - size < 2 * self._floor_bytes):
            usage = self._usage(self.path)
            self._free, self._written_since, self._read_at = usage.free, 0, now
            self._floor_bytes = self.floor.bytes_for(usage.total)
        left = self._free - self._written_since - size
        if left < self._floor_bytes:
            raise OSError(errno.ENOSPC, f"{size} more bytes would leave {max(left, 0)} free, "
                          f"below the floor of {self._floor_bytes} (log.dir.min.free.bytes / "
                          f"log.dir.min.free.percent)")
        self._written_since += size


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{name}: {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"
