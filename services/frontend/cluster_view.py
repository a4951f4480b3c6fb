"""The frontend's view of the cluster metadata: the replicator's ``WatchMetadata`` stream (the
current ``ClusterMetadata``, then every change), followed for the frontend's whole life and
reopened with a growing delay whenever it ends or fails.

The frontend needs only the security part of it (SCRAM credentials, and client quotas for
whoever subscribes). The view never blocks serving: until the first snapshot arrives (or with
no replicator configured) it is empty, and PLAINTEXT clients, and SASL users from the users
file, are served regardless.

Subscribers (:meth:`ClusterView.add_listener`) are called on the event loop with every new
snapshot, and once at once with the current one if there is one. Not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

import grpc

from kbroker.replicator.v1 import replicator_pb2, replicator_pb2_grpc
from services.common.channels import internal_channel
from services.common.tls import InternalTls

log = logging.getLogger(__name__)

ClusterMetadata = replicator_pb2.ClusterMetadata
Listener = Callable[[ClusterMetadata], None]
StreamFactory = Callable[[], AsyncIterator[ClusterMetadata]]


class ClusterView:
    """The latest ``ClusterMetadata`` the replicator published (None before the first)."""

    def __init__(self, stream: StreamFactory | None = None,
                 initial_backoff: float = 0.1, max_backoff: float = 5.0) -> None:
        self._stream = stream
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self.latest: ClusterMetadata | None = None
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self.updated = asyncio.Event()

    @classmethod
    def of_replicator(cls, address: str, tls: InternalTls) -> ClusterView:
        """A view following the replicator at ``address`` (none when empty)."""
        if not address:
            return cls(None)
        channel = internal_channel(address, tls, "replicator")
        stub = replicator_pb2_grpc.ReplicatorStub(channel)

        async def stream() -> AsyncIterator[ClusterMetadata]:
            async for snapshot in stub.WatchMetadata(replicator_pb2.WatchMetadataRequest()):
                yield snapshot

        view = cls(stream)
        view._channel = channel
        return view

    def add_listener(self, callback: Listener) -> None:
        """Call ``callback(snapshot)`` with every new snapshot (now, if there is one)."""
        self._listeners.append(callback)
        if self.latest is not None:
            callback(self.latest)

    def install(self, snapshot: ClusterMetadata, *, authoritative: bool = False) -> None:
        """Make ``snapshot`` current unless a newer version is (the first snapshot of a new
        stream is the replicator's state by definition, whatever its version)."""
        if (not authoritative and self.latest is not None
                and snapshot.version < self.latest.version):
            return
        self.latest = snapshot
        self.updated.set()
        for callback in list(self._listeners):
            try:
                callback(snapshot)
            except Exception:
                log.exception("cluster metadata listener failed")

    def start(self) -> None:
        if self._stream is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow(),
                                                                name="cluster-view")

    async def _follow(self) -> None:
        assert self._stream is not None
        delay = self._initial_backoff
        quiet = False
        while True:
            first = True
            problem = "ended"
            try:
                async for snapshot in self._stream():
                    self.install(snapshot, authoritative=first)
                    first, quiet, delay = False, False, self._initial_backoff
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - reopened whatever broke it
                problem = f"broke ({exc})"
            log.log(logging.DEBUG if quiet else logging.WARNING,
                    "cluster metadata stream %s; reconnecting", problem)
            quiet = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_backoff)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
