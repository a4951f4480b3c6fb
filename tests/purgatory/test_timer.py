"""LoopTimer: tasks run once after their delay, never early; cancelled tasks never run."""

from __future__ import annotations

import asyncio
import time

import pytest

from services.purgatory.timer import LoopTimer, TimerTask


class Recorder(TimerTask):
    def __init__(self, delay_ms: int, log: list[tuple[Recorder, float]]) -> None:
        super().__init__(delay_ms)
        self.log = log

    def run(self) -> None:
        self.log.append((self, time.monotonic()))


def test_tasks_run_once_in_deadline_order_and_not_early():
    async def scenario() -> None:
        timer = LoopTimer()
        log: list[tuple[Recorder, float]] = []
        start = time.monotonic()
        tasks = [Recorder(delay, log) for delay in (40, 10, 25, 0, -5)]
        for task in tasks:
            timer.add(task)
        assert timer.size == 5 and all(t.scheduled for t in tasks)
        await asyncio.sleep(0.08)
        assert [t.delay_ms for t, _ in log] == [0, -5, 10, 25, 40]
        for task, at in log:
            assert at - start >= max(task.delay_ms, 0) / 1000
        assert timer.size == 0 and not any(t.scheduled for t in tasks)

    asyncio.run(scenario())


def test_cancelled_task_never_runs_and_can_be_added_again():
    async def scenario() -> None:
        timer = LoopTimer()
        log: list[tuple[Recorder, float]] = []
        task = Recorder(10, log)
        timer.add(task)
        with pytest.raises(ValueError):
            timer.add(task)
        task.cancel()
        task.cancel()  # idempotent
        assert timer.size == 0
        await asyncio.sleep(0.03)
        assert log == []
        timer.add(task)
        await asyncio.sleep(0.03)
        assert [t for t, _ in log] == [task]

    asyncio.run(scenario())


def test_shutdown_drops_everything():
    async def scenario() -> None:
        timer = LoopTimer()
        log: list[tuple[Recorder, float]] = []
        tasks = [Recorder(5, log) for _ in range(10)]
        for task in tasks:
            timer.add(task)
        timer.shutdown()
        assert timer.size == 0 and not any(t.scheduled for t in tasks)
        await asyncio.sleep(0.02)
        assert log == []

    asyncio.run(scenario())
