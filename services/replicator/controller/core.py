"""The controller's commit core (Kafka's QuorumController without its control managers): the
current metadata image and the one way it changes.

- Commit: under the commit lock, a change computes the new image (and its caller's result)
  from the image current at that moment; the image is saved (the
  :class:`~services.replicator.metadata_store.MetadataStore`) and only then made current and
  published; a failed save leaves the previous one. So a change computed before an await never
  overwrites one committed meanwhile. A change clients can see bumps the version and reaches
  the watchers; bookkeeping they cannot see (pending deletions, producer ids) does not.
- Exclusive section: operations that talk to log nodes between reading the image and
  committing (topic creation and deletion, config changes, partition additions) run one at a
  time, shielded, so a caller that goes away never leaves one half applied. Other commits
  (liveness, elections, ISR changes) do not wait for it.
- Deposed: once the store finds that another replicator has taken over the metadata
  (:class:`~services.replicator.metadata_store.DeposedError`), every later commit fails and
  :attr:`ControllerCore.deposed` is set; the process must stop acting as the controller.

Not thread-safe: one event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .. import metrics
from ..metadata import MetadataImage
from ..metadata_store import DeposedError, MetadataStore
from ..publisher import ImagePublisher

log = logging.getLogger(__name__)

T = TypeVar("T")

# A change: the new image from the current one, and what the caller learns from it. Returning
# the image it was given commits nothing.
Change = Callable[[MetadataImage], tuple[MetadataImage, T]]


class ControllerCore:

    def __init__(self, image: MetadataImage, store: MetadataStore) -> None:
        self._image = image
        self._store = store
        self._lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self.deposed = asyncio.Event()
        self.publisher = ImagePublisher(image)
        metrics.observe(image)

    @property
    def image(self) -> MetadataImage:
        return self._image

    async def exclusive(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` alone among the exclusive operations, to its end even if the
        caller goes away."""

        async def locked() -> T:
            async with self._lock:
                return await operation()

        return await asyncio.shield(locked())

    async def when_idle(self, operation: Callable[[], Awaitable[None]]) -> None:
        """Run background work (retried at the next round anyway) exclusively, unless an
        operation is running."""
        if not self._lock.locked():
            async with self._lock:
                await operation()

    async def commit(self, change: Change[T], *, bump: bool = True) -> T:
        """Apply ``change`` (with ``bump``: as a new version), save, make current; returns the
        change's result. Raises OSError (DeposedError once another replicator took over) when
        the save failed."""
        async with self._commit_lock:
            current = self._image
            image, result = change(current)
            if image is current or (not bump and image == current):
                return result
            if bump:
                image = image.replace(version=current.version + 1)
            try:
                await self._store.save(image)
            except DeposedError:
                if not self.deposed.is_set():
                    log.error("another replicator has taken over the cluster metadata; this "
                              "one commits nothing from now on")
                    self.deposed.set()
                raise
            self._image = image
        if bump:
            self.publisher.publish(image)
        metrics.observe(image)
        return result

    async def close(self) -> None:
        self.publisher.close()
        await self._store.close()
