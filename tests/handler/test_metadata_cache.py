import asyncio

import pytest

from services.handler.metadata_cache import Backoff, MetadataCache, MetadataUnavailableError

from .fakes import cluster, topic


def test_older_snapshots_never_replace_newer_ones_unless_authoritative():
    async def main():
        cache = MetadataCache(_failing_loader)
        assert cache.install(cluster(version=5))
        assert not cache.install(cluster(topic("old"), version=4))
        assert cache.snapshot.version == 5
        assert cache.install(cluster(topic("same"), version=5))
        assert cache.install(cluster(version=2), authoritative=True)
        assert cache.snapshot.version == 2

    asyncio.run(main())


async def _failing_loader():
    raise ConnectionError("replicator down")


def test_current_loads_once_for_concurrent_callers_when_empty():
    loads = 0

    async def loader():
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.01)
        return cluster(topic("t"), version=3)

    async def main():
        cache = MetadataCache(loader)
        snapshots = await asyncio.gather(*(cache.current() for _ in range(5)))
        assert {s.version for s in snapshots} == {3}
        assert loads == 1
        await cache.current()
        assert loads == 1

    asyncio.run(main())


def test_no_metadata_at_all_is_metadata_unavailable():
    async def main():
        cache = MetadataCache(_failing_loader)
        with pytest.raises(MetadataUnavailableError) as failure:
            await cache.current()
        assert failure.value.errno == 5
        # A failed refresh keeps what is installed.
        cache.install(cluster(version=1))
        assert (await cache.refresh()).version == 1

    asyncio.run(main())


def test_refresh_loads_even_when_a_snapshot_is_installed():
    versions = iter([7, 8])

    async def loader():
        return cluster(version=next(versions))

    async def main():
        cache = MetadataCache(loader)
        cache.install(cluster(version=1))
        assert (await cache.refresh()).version == 7
        assert (await cache.refresh()).version == 8

    asyncio.run(main())


def test_follow_reconnects_after_the_stream_breaks():
    opened = 0

    def stream():
        async def gen():
            nonlocal opened
            opened += 1
            if opened == 1:
                yield cluster(version=10)
                raise ConnectionError("stream broke")
            # The replicator restarted: its first snapshot wins even with a lower version.
            yield cluster(topic("after"), version=1)
            await asyncio.Event().wait()

        return gen()

    async def main():
        cache = MetadataCache(_failing_loader)
        changed = asyncio.Event()
        cache.add_listener(lambda snapshot: changed.set())
        follower = asyncio.create_task(cache.follow(stream, Backoff(initial=0.01, maximum=0.02)))
        try:
            async with asyncio.timeout(5):
                while cache.snapshot is None or cache.snapshot.topic("after") is None:
                    await changed.wait()
                    changed.clear()
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        assert opened == 2
        assert cache.snapshot.version == 1

    asyncio.run(main())


def test_backoff_doubles_up_to_its_cap_and_resets():
    backoff = Backoff(initial=0.1, maximum=0.5)
    assert [backoff.next_delay() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next_delay() == 0.1


def test_snapshot_lookups():
    snapshot = cluster(
        topic("a", 2, leaders=[0, 1], topic_id="5f7c0e53-7bd1-4d52-9b67-1b2a1c3e4f50"),
        nodes=(0,), dead=(1,), controller=7,
    )
    assert snapshot.topic_by_id("5F7C0E53-7BD1-4D52-9B67-1B2A1C3E4F50").name == "a"
    assert snapshot.topic_by_id(None) is None
    assert [n.node_id for n in snapshot.live_nodes()] == [0]
    assert snapshot.live_node(1) is None
    # The replicator's controller is not a live broker: clients get a live one.
    assert snapshot.client_controller_id() == 0
    assert snapshot.offline_replicas(snapshot.topic("a").partitions[1]) == [1]
    assert cluster(nodes=(), dead=(0,)).client_controller_id() == -1
