"""A connection's stream reader that remembers when its bytes arrived, so the connection can
tell when each frame was complete: the start of Kafka's request-queue time.

The event loop reads from the socket whenever data is there and feeds it to the reader (up to
its buffer limit), whether or not the connection is ready for another request; a pipelined
request can so sit complete in the buffer while the one before it is served. Each chunk fed is
recorded as (bytes fed so far, time); the completion time of a frame that ends at stream
position ``n`` is the time of the first chunk that brought the total to ``n`` or more.
Records are dropped once consumed, so they are bounded by what the buffer holds.
"""

from __future__ import annotations

import asyncio
import collections
import time


class TimedStreamReader(asyncio.StreamReader):
    """``asyncio.StreamReader`` plus :meth:`completed_at`."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit=limit)
        self._fed = 0
        self._arrivals: collections.deque[tuple[int, float]] = collections.deque()

    def feed_data(self, data: bytes) -> None:
        super().feed_data(data)
        self._fed += len(data)
        self._arrivals.append((self._fed, time.perf_counter()))

    def completed_at(self, position: int) -> float:
        """When the stream's first ``position`` bytes had all arrived (``time.perf_counter``
        clock); now, if they have not (a caller that counts wrong)."""
        arrivals = self._arrivals
        while arrivals and arrivals[0][0] < position:
            arrivals.popleft()
        return arrivals[0][1] if arrivals else time.perf_counter()
