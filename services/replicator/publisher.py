"""Change notification for metadata images: the latest image, and any number of watchers that
each receive it now and again after every change.

A watcher always gets the newest image: if several changes happen while it is busy (sending
the previous one), it receives the last of them, never a stale one, and versions it sees only
increase. Watchers hold no registration: one that goes away simply stops waiting, so there is
nothing to clean up. Listeners (in-process parts such as the replication role) are called
synchronously with each published image instead. Not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from . import metrics
from .metadata import MetadataImage

log = logging.getLogger(__name__)


class ImagePublisher:
    def __init__(self, image: MetadataImage) -> None:
        self._image = image
        self._changed = asyncio.Event()
        self._closed = False
        self._watchers = 0
        self._listeners: list[Callable[[MetadataImage], None]] = []

    @property
    def watchers(self) -> int:
        """Watchers currently iterating."""
        return self._watchers

    def subscribe(self, listener: Callable[[MetadataImage], None]) -> None:
        """Call ``listener(image)`` with every image published from now on."""
        self._listeners.append(listener)

    def publish(self, image: MetadataImage) -> None:
        self._image = image
        self._wake()
        for listener in self._listeners:
            try:
                listener(image)
            except Exception:  # a listener's failure must not undo a commit
                log.exception("metadata listener failed on version %d", image.version)

    def close(self) -> None:
        """End every watch (the service is stopping)."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        # Waiters hold the old event; a fresh one is ready for the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def watch(self) -> AsyncIterator[MetadataImage]:
        """The current image, then each newer one, until :meth:`close`."""
        self._watchers += 1
        metrics.WATCHERS.inc()
        try:
            sent = -1
            while not self._closed:
                changed = self._changed
                image = self._image
                if image.version != sent:
                    sent = image.version
                    yield image
                else:
                    await changed.wait()
        finally:
            self._watchers -= 1
            metrics.WATCHERS.dec()
