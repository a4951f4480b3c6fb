"""The bytes of requests the frontend holds, bounded (Kafka's ``queued.max.request.bytes`` and
its ``SimpleMemoryPool``).

A connection asks the pool for a frame's size as soon as the frame's size prefix has arrived,
before it receives the frame's body, and gives it back once the request is answered (or the
connection closes). When the pool is exhausted the connection stops reading: the rest of the
frame stays in the socket buffers (TCP then holds the client back) and the connection waits in
line until another request's bytes are given back. So however many clients send large requests
at once, the frontend holds about ``capacity`` bytes of them (and the connections waiting keep
their place in line).

As Kafka's pool for requests, the limit is not strict: an allocation succeeds while any memory
is left, so a single request larger than what is left (or than the whole pool) still gets
through, one at a time, instead of waiting forever. A capacity of 0 or less is no limit
(Kafka's default -1). Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class MemoryPool:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        # Connections waiting for memory, in the order they asked (a dict keeps that order
        # and removes a connection that closes while it waits in O(1)).
        self._waiting: dict[Callable[[], None], None] = {}
        self._wake_scheduled = False
        # Since when (monotonic seconds) the pool has been exhausted, and for how long in all
        # it was before that (Kafka's MemoryPoolDepletedTimeTotal).
        self._depleted_since: float | None = None
        self._depleted_seconds = 0.0

    @property
    def bounded(self) -> bool:
        return self.capacity > 0

    @property
    def available(self) -> int:
        """Bytes left (negative after a request larger than what was left got through)."""
        return self.capacity - self.used if self.bounded else 1 << 62

    def try_allocate(self, size: int) -> bool:
        """Take ``size`` bytes while any are left; False when the pool is exhausted."""
        if self.bounded and self.used >= self.capacity:
            return False
        self.used += size
        if self.bounded and self.used >= self.capacity and self._depleted_since is None:
            self._depleted_since = time.monotonic()
        return True

    def release(self, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        if self.used < self.capacity and self._depleted_since is not None:
            self._depleted_seconds += time.monotonic() - self._depleted_since
            self._depleted_since = None
        if self._waiting and not self._wake_scheduled and self.used < self.capacity:
            self._wake_scheduled = True
            asyncio.get_running_loop().call_soon(self._wake)

    def wait(self, on_available: Callable[[], None]) -> None:
        """Call ``on_available()`` (once) when memory is left again, after the connections
        that asked before."""
        self._waiting[on_available] = None

    def cancel_wait(self, on_available: Callable[[], None]) -> None:
        self._waiting.pop(on_available, None)

    def _wake(self) -> None:
        self._wake_scheduled = False
        # Each woken connection allocates (or waits again, at the end of the line).
        while self._waiting and self.used < self.capacity:
            waiter = next(iter(self._waiting))
            del self._waiting[waiter]
            waiter()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def depleted_seconds(self) -> float:
        """Seconds in all the pool has been exhausted."""
        since = self._depleted_since
        return self._depleted_seconds + (time.monotonic() - since if since is not None else 0.0)
