"""Metadata watchers get the current image, then only newer ones, and leave no trace."""

from __future__ import annotations

import asyncio

from services.replicator.metadata import MetadataImage
from services.replicator.publisher import ImagePublisher


def image(version: int) -> MetadataImage:
    return MetadataImage(cluster_id="c", version=version)


def test_watchers_see_the_current_image_then_each_change():
    async def scenario() -> None:
        publisher = ImagePublisher(image(1))
        seen: list[list[int]] = [[], [], []]

        async def watch(into: list[int]) -> None:
            async for current in publisher.watch():
                into.append(current.version)

        tasks = [asyncio.create_task(watch(s)) for s in seen]
        await asyncio.sleep(0)
        assert publisher.watchers == 3 and all(s == [1] for s in seen)
        publisher.publish(image(2))
        await asyncio.sleep(0)
        assert all(s == [1, 2] for s in seen)
        publisher.close()
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert publisher.watchers == 0

    asyncio.run(scenario())


def test_a_busy_watcher_skips_to_the_newest_image():
    async def scenario() -> None:
        publisher = ImagePublisher(image(1))
        stream = publisher.watch()
        assert (await anext(stream)).version == 1
        for version in (2, 3, 4):
            publisher.publish(image(version))
        assert (await anext(stream)).version == 4
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        publisher.publish(image(5))
        assert (await asyncio.wait_for(waiting, 1)).version == 5
        await stream.aclose()
        assert publisher.watchers == 0

    asyncio.run(scenario())


def test_a_cancelled_watcher_is_forgotten():
    async def scenario() -> None:
        publisher = ImagePublisher(image(1))

        async def watch() -> None:
            async for _ in publisher.watch():
                pass

        tasks = [asyncio.create_task(watch()) for _ in range(100)]
        await asyncio.sleep(0)
        assert publisher.watchers == 100
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert publisher.watchers == 0
        assert not publisher._changed._waiters  # no leftover waiters on the event

    asyncio.run(scenario())
