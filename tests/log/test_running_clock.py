"""The running clock: monotonic time less the stalls of the event loop."""

from __future__ import annotations

import asyncio
import time

from services.log.running_clock import RunningClock


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ordinary_ticks_take_nothing_off() -> None:
    fake = FakeTime()
    clock = RunningClock(tick_ms=100, tolerance_ms=200, clock=fake)
    for _ in range(10):
        fake.now += 250  # late, but within the tolerance
        clock.tick()
    assert clock.now_ms() == 3500
    assert clock.stalled_ms == 0


def test_a_stall_is_taken_off_past_the_tick_and_tolerance() -> None:
    fake = FakeTime()
    clock = RunningClock(tick_ms=100, tolerance_ms=200, clock=fake)
    fake.now += 5000
    assert clock.now_ms() == 1300  # the stall still going on counts already
    clock.tick()
    assert clock.now_ms() == 1300
    assert clock.stalled_ms == 4700
    fake.now += 100
    assert clock.now_ms() == 1400


def test_the_clock_never_runs_backwards() -> None:
    fake = FakeTime()
    clock = RunningClock(tick_ms=100, tolerance_ms=200, clock=fake)
    readings = []
    for step in range(200):
        fake.now += 7
        readings.append(clock.now_ms())
        if step % 90 == 89:
            clock.tick()
    assert readings == sorted(readings)


def test_a_blocked_loop_is_a_stall() -> None:
    async def body() -> tuple[int, int]:
        clock = RunningClock(tick_ms=20, tolerance_ms=50)
        ticking = asyncio.get_running_loop().create_task(clock.run())
        await asyncio.sleep(0.1)
        before, wall = clock.now_ms(), time.monotonic()
        time.sleep(0.6)  # noqa: ASYNC251 - the loop stands still
        await asyncio.sleep(0.1)
        ran = clock.now_ms() - before
        ticking.cancel()
        return ran, int((time.monotonic() - wall) * 1000)

    ran, wall = asyncio.run(body())
    assert wall >= 700
    assert ran < 400  # the 600 ms the loop stood still are not running time
