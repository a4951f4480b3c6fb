"""The timer: a hierarchical timing wheel reaped on a fake clock (property tests) and on a real
event loop. Tasks run exactly once, never early, at most one tick late; cancelled tasks never
run; cancelling is an O(1) unlink."""

from __future__ import annotations

import asyncio
import math
import time
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.purgatory.delay_queue import DelayQueue
from services.purgatory.timer import SystemTimer
from services.purgatory.timer_task import TimerTask, TimerTaskList
from services.purgatory.timing_wheel import TimingWheel

from .fakes import ManualTimer


class Recorder(TimerTask):
    def __init__(self, delay_ms: int, log: list[tuple[Recorder, float]],
                 clock: callable = time.monotonic) -> None:  # type: ignore[valid-type]
        super().__init__(delay_ms)
        self.log = log
        self.clock = clock
        self.victim: TimerTask | None = None
        # Ids of tasks cancelled while scheduled, by the test or by a running task.
        self.cancelled: set[int] = set()

    def run(self) -> None:
        self.log.append((self, self.clock()))
        if self.victim is not None:
            if self.victim.scheduled:
                self.cancelled.add(id(self.victim))
            self.victim.cancel()


# --- the wheel on a fake clock -----------------------------------------------------------------

timeline = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(-3, 12_000), st.integers(0, 1000)),
        st.tuples(st.just("cancel"), st.integers(0, 10_000)),
        st.tuples(st.just("advance"), st.floats(0, 2_500, allow_nan=False)),
        st.tuples(st.just("step"), st.integers(1, 40)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tick_ms=st.sampled_from((1, 2, 5)),
    wheel_size=st.integers(2, 20),
    start_ms=st.floats(0, 1e9, allow_nan=False),
    steps=timeline,
)
def test_every_task_runs_once_never_early_and_within_one_tick(tick_ms, wheel_size, start_ms,
                                                               steps):
    timer = ManualTimer(tick_ms=tick_ms, wheel_size=wheel_size)
    timer.now_ms = start_ms
    timer.advance(0)
    runs: list[tuple[Recorder, float]] = []
    tasks: list[Recorder] = []
    deadline: dict[int, float] = {}
    cancelled: set[int] = set()
    # When each reap happened: (clock before, clock at the reap).
    reaps: list[tuple[float, float]] = []
    reaps_before: dict[int, int] = {}

    def reap(ms: float) -> None:
        before = timer.now_ms
        timer.advance(ms)
        reaps.append((before, timer.now_ms))

    for step in steps:
        if step[0] == "add":
            _, delay, victim = step
            task = Recorder(delay, runs, clock=lambda: timer.now_ms)
            task.cancelled = cancelled
            if tasks and victim % 3 == 0:
                task.victim = tasks[victim % len(tasks)]
            deadline[id(task)] = timer.now_ms + delay
            reaps_before[id(task)] = len(reaps)
            timer.add(task)
            tasks.append(task)
        elif step[0] == "cancel" and tasks:
            task = tasks[step[1] % len(tasks)]
            if task.scheduled:
                cancelled.add(id(task))
            task.cancel()
        elif step[0] == "advance":
            reap(step[1])
        elif step[0] == "step":
            for _ in range(step[1]):
                reap(tick_ms)
        assert timer.size == sum(t.scheduled for t in tasks)
    # Then let everything left run out.
    while timer.size:
        reap(tick_ms * 50)

    ran = [id(t) for t, _ in runs]
    assert len(ran) == len(set(ran)), "a task ran twice"
    for task, at in runs:
        due = deadline[id(task)]
        assert at >= due, f"ran at {at}, due at {due}"
        # It ran in the first reap after it was added whose clock reached its deadline rounded
        # up to the tick.
        rounded = math.ceil(due / tick_ms) * tick_ms
        first = next(now for _before, now in reaps[reaps_before[id(task)]:] if now >= rounded)
        assert at == first, f"due {due} (tick {tick_ms}), first chance {first}, ran {at}"
    # Every task either ran or was cancelled while scheduled (by the test or by a running
    # task), never both.
    for task in tasks:
        assert not task.scheduled
        assert (id(task) in set(ran)) != (id(task) in cancelled)


def test_cancelled_while_due_in_the_same_reap_never_runs():
    timer = ManualTimer()
    runs: list[tuple[Recorder, float]] = []
    first, second = Recorder(5, runs), Recorder(5, runs)
    first.victim = second
    timer.add(first)
    timer.add(second)
    assert timer.advance(5) == 1
    assert [t for t, _ in runs] == [first] and timer.size == 0


def test_overflow_wheels_are_created_on_demand_with_the_lower_interval_as_tick():
    timer = ManualTimer(tick_ms=1, wheel_size=20)
    runs: list[tuple[Recorder, float]] = []
    assert len(list(timer._wheel.wheels())) == 1
    timer.add(Recorder(19, runs))
    assert len(list(timer._wheel.wheels())) == 1
    timer.add(Recorder(20, runs))  # beyond the 20 ms of the first wheel
    assert len(list(timer._wheel.wheels())) == 2
    timer.add(Recorder(7_999, runs))
    assert len(list(timer._wheel.wheels())) == 3  # 20 ms ticks cover 400 ms, 400 ms ticks cover 8 s
    wheels = list(timer._wheel.wheels())
    assert [w.tick_ms for w in wheels] == [1, 20, 400]
    timer.advance(8_000)
    assert [t.delay_ms for t, _ in runs] == [19, 20, 7_999]


def test_cancel_is_an_unlink_that_touches_nothing_else():
    timer = ManualTimer()
    runs: list[tuple[Recorder, float]] = []
    tasks = [Recorder(d, runs) for d in range(1, 5_000)]
    for task in tasks:
        timer.add(task)
    queued = len(timer._queue)

    forbidden = AssertionError("cancel must not touch the delay queue or the wheels")
    with mock.patch.object(DelayQueue, "offer", side_effect=forbidden), \
            mock.patch.object(DelayQueue, "poll", side_effect=forbidden), \
            mock.patch.object(TimingWheel, "add", side_effect=forbidden):
        for task in tasks[::2]:
            task.cancel()
    assert len(timer._queue) == queued and timer.size == len(tasks[1::2])
    timer.advance(10_000)
    assert [t for t, _ in runs] == tasks[1::2]


def test_task_list_links_and_unlinks_in_constant_steps():
    bucket = TimerTaskList()
    log: list[tuple[Recorder, float]] = []
    a, b, c = Recorder(1, log), Recorder(1, log), Recorder(1, log)
    for task in (a, b, c):
        bucket.add(task)
    bucket.remove(b)
    assert list(bucket) == [a, c] and len(bucket) == 2 and not b.scheduled
    bucket.remove(b)  # not on it any more: nothing happens
    other = TimerTaskList()
    other.remove(a)  # not on that list: nothing happens
    assert list(bucket) == [a, c]
    assert bucket.set_expiration(10) and not bucket.set_expiration(10)
    assert bucket.flush() == [a, c] and len(bucket) == 0 and bucket.expiration_ms == -1
    assert not a.scheduled and bucket.pop() is None


def test_delay_queue_orders_buckets_and_skips_stale_entries():
    queue = DelayQueue()
    late, early = TimerTaskList(), TimerTaskList()
    late.set_expiration(30)
    early.set_expiration(10)
    queue.offer(late)
    queue.offer(early)
    assert queue.earliest_expiration() == 10
    assert queue.poll(9) is None
    assert queue.poll(10) is early
    late.flush()
    late.set_expiration(50)  # re-used under a new expiration: its old entry is stale
    queue.offer(late)
    assert queue.earliest_expiration() == 50 and queue.poll(49) is None
    assert queue.poll(50) is late and queue.poll(1e18) is None


def test_adding_a_scheduled_task_again_is_refused():
    timer = ManualTimer()
    task = Recorder(10, [])
    timer.add(task)
    with pytest.raises(ValueError):
        timer.add(task)


def test_many_pending_tasks_all_expire_in_order():
    timer = ManualTimer()
    runs: list[tuple[Recorder, float]] = []
    delays = [(i * 7919) % 100_000 for i in range(20_000)]
    for delay in delays:
        timer.add(Recorder(delay, runs, clock=lambda: timer.now_ms))
    while timer.size:
        timer.advance(1)
    assert [t.delay_ms for t, _ in runs] == sorted(delays)
    assert all(at == max(t.delay_ms, 0) or (t.delay_ms <= 0 and at == 1) for t, at in runs)


# --- the timer on a real event loop ------------------------------------------------------------


def test_tasks_run_once_in_deadline_order_and_not_early():
    async def scenario() -> None:
        timer = SystemTimer(loop=asyncio.get_running_loop())
        log: list[tuple[Recorder, float]] = []
        start = time.monotonic()
        tasks = [Recorder(delay, log) for delay in (40, 10, 25, 0, -5)]
        for task in tasks:
            timer.add(task)
        assert log == []  # even due tasks run on a later loop iteration
        assert timer.size == 5 and all(t.scheduled for t in tasks)
        await asyncio.sleep(0.08)
        order = [t.delay_ms for t, _ in log]
        # The two already due run first (in either order), then by deadline.
        assert sorted(order[:2]) == [-5, 0] and order[2:] == [10, 25, 40]
        for task, at in log:
            assert at - start >= max(task.delay_ms, 0) / 1000
        assert timer.size == 0 and not any(t.scheduled for t in tasks)

    asyncio.run(scenario())


def test_the_reaper_sleeps_until_the_next_bucket_instead_of_polling():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        timer = SystemTimer(loop=loop)
        wakeups = 0
        reap = timer._on_wakeup

        def counting() -> None:
            nonlocal wakeups
            wakeups += 1
            reap()

        timer._on_wakeup = counting  # type: ignore[method-assign]
        log: list[tuple[Recorder, float]] = []
        begin = loop.time()
        timer.add(Recorder(300, log))
        await asyncio.sleep(0.35)
        assert len(log) == 1
        # 300 ms sits in the 400 ms wheel (bucket of 20 ms ticks), cascades to the finest
        # wheel, then runs: a handful of wakeups, not one per millisecond.
        assert wakeups <= 4, wakeups
        late = log[0][1] - time.monotonic() + loop.time() - begin - 0.300
        assert 0 <= late < 0.030, late

    asyncio.run(scenario())


def test_a_new_earlier_task_moves_the_wakeup_earlier():
    async def scenario() -> None:
        timer = SystemTimer(loop=asyncio.get_running_loop())
        log: list[tuple[Recorder, float]] = []
        start = time.monotonic()
        timer.add(Recorder(5_000, log))
        timer.add(Recorder(20, log))
        await asyncio.sleep(0.1)
        assert [t.delay_ms for t, _ in log] == [20]
        assert log[0][1] - start < 0.08
        timer.shutdown()

    asyncio.run(scenario())


def test_cancelled_task_never_runs_and_can_be_added_again():
    async def scenario() -> None:
        timer = SystemTimer(loop=asyncio.get_running_loop())
        log: list[tuple[Recorder, float]] = []
        task = Recorder(10, log)
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
        timer = SystemTimer(loop=asyncio.get_running_loop())
        log: list[tuple[Recorder, float]] = []
        tasks = [Recorder(d, log) for d in (0, 5, 50, 5_000)]
        for task in tasks:
            timer.add(task)
        timer.shutdown()
        assert timer.size == 0 and not any(t.scheduled for t in tasks)
        await asyncio.sleep(0.06)
        assert log == []

    asyncio.run(scenario())


# --- the cascade: sliced coarse ticks and bounded reaps ------------------------------------------


def test_a_coarse_tick_hands_its_tasks_down_slice_by_slice():
    timer = ManualTimer(tick_ms=1, wheel_size=20)
    runs: list[tuple[Recorder, float]] = []
    # 20,000 tasks in one 400 ms tick of the third wheel (20 ms slices of about 1,000 each).
    delays = [1_200 + (i * 7919) % 400 for i in range(20_000)]
    tasks = [Recorder(d, runs, clock=lambda: timer.now_ms) for d in delays]
    for task in tasks:
        timer.add(task)
    assert [w.tick_ms for w in timer._wheel.wheels()] == [1, 20, 400]
    # How many tasks each list taken off the delay queue held.
    sizes: list[int] = []
    poll = DelayQueue.poll

    def spying(queue: DelayQueue, now_ms: float) -> TimerTaskList | None:
        bucket = poll(queue, now_ms)
        if bucket is not None:
            sizes.append(bucket.count)
        return bucket

    with mock.patch.object(DelayQueue, "poll", spying):
        while timer.size:
            timer.advance(1)
    # No single reap moves the whole coarse tick: at most one 20 ms slice at a time.
    assert max(sizes) <= 20_000 // 20 + 20, max(sizes)
    assert sorted(id(t) for t, _ in runs) == sorted(id(t) for t in tasks)
    assert all(at == task.delay_ms for task, at in runs)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    delays=st.lists(st.integers(-2, 3_000), min_size=1, max_size=300),
    cancel_every=st.integers(2, 7),
    budget=st.integers(1, 60),
    jumps=st.lists(st.integers(0, 700), min_size=1, max_size=12),
)
def test_a_bounded_reap_never_runs_early_nor_twice_and_loses_nothing(delays, cancel_every,
                                                                      budget, jumps):
    timer = ManualTimer()
    runs: list[tuple[Recorder, float]] = []
    tasks = [Recorder(d, runs, clock=lambda: timer.now_ms) for d in delays]
    for task in tasks:
        timer.add(task)
    cancelled = tasks[::cancel_every]
    for task in cancelled:
        task.cancel()
    for jump in [*jumps, 3_100]:
        timer.now_ms += jump
        # Reaps at one instant, each moving about ``budget`` tasks, until nothing is left due.
        while True:
            timer.advance_clock(budget=budget)
            following = timer.next_expiration_ms()
            if following is None or following > timer.now_ms:
                break
        # Whatever is due by now has run.
        assert all(not t.scheduled for t in tasks if max(t.delay_ms, 0) <= timer.now_ms)
    ran = [id(t) for t, _ in runs]
    assert len(ran) == len(set(ran)), "a task ran twice"
    assert set(ran) == {id(t) for t in tasks} - {id(t) for t in cancelled}
    for task, at in runs:
        assert at >= task.delay_ms, f"ran at {at}, due at {task.delay_ms}"
    assert timer.size == 0


def test_a_stalled_loop_catches_up_in_bounded_reaps_that_let_the_loop_run():
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        timer = SystemTimer(loop=loop, reap_budget=200)
        log: list[tuple[Recorder, float]] = []
        start = time.monotonic()
        tasks = [Recorder(20 + i % 60, log) for i in range(3_000)]
        for task in tasks:
            timer.add(task)
        stall = time.sleep  # the loop stalls: every task comes due before the first reap
        stall(0.1)
        ticks = 0

        async def other_work() -> None:
            nonlocal ticks
            while len(log) < len(tasks):
                ticks += 1
                await asyncio.sleep(0)

        await asyncio.wait_for(other_work(), 5)
        # The catch-up took several reaps, with other work running in between.
        assert ticks >= 5, ticks
        assert sorted(id(t) for t, _ in log) == sorted(id(t) for t in tasks)
        for task, at in log:
            assert at - start >= task.delay_ms / 1000

    asyncio.run(scenario())
