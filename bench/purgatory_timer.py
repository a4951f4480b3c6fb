"""The purgatory's timer: the hierarchical timing wheel against a heap-based timer, in one run.

    python bench/purgatory_timer.py [--pending 1000000] [--churn 200000] [--lateness 100000]
                                    [--spread-ms 2000]

- add / cancel: with PENDING operations already waiting (delays 30-60 s, so none expires during
  the measurement), CHURN more are added and then cancelled in random order, as a purgatory
  does with operations that complete before their timeout. Cost per operation for each timer.
  The heap timer is the one the ``heapq`` documentation describes: entries ``[deadline, count,
  task]``, cancelled by marking the entry, the mark left in the heap. Marking defers the real
  cost of a cancel: a heap timer must still take every marked entry out some day, so the bench
  prints the heap's cost both ways, and the removal two ways, per cancelled operation:
  - pop: the marked entry is popped when it reaches the top (what asyncio does while fewer than
    half of its timers are cancelled): one heappop on a heap of PENDING + CHURN entries,
    measured by popping CHURN entries off a copy of the heap;
  - rebuild: all marks dropped in one filter + heapify of the heap (what asyncio does once half
    of its timers are cancelled), its cost divided by CHURN.
  The wheel's cancel is complete at once (an unlink), nothing is left for later.
- memory: bytes per pending operation (task object and the timer's structures, measured with
  tracemalloc) with PENDING operations.
- lateness: LATENESS operations with deadlines spread over SPREAD ms (from 1 s out) on a real
  event loop (uvloop when installed, as the services run), each one's lateness = when it ran -
  its deadline; p50, p99, max. asyncio's own ``call_at`` (a heap) is measured the same way for
  reference.

Prints a table and one JSON line with every number. Goal: add+cancel at least 3x faster than
the heap at 1M pending, lateness p99 under 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import heapq
import itertools
import json
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.purgatory.timer import SystemTimer
from services.purgatory.timer_task import TimerTask

_monotonic = time.monotonic


def now_ms() -> float:
    return _monotonic() * 1000.0


class WheelTask(TimerTask):
    __slots__ = ("ran_at",)

    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.ran_at = 0.0

    def run(self) -> None:
        self.ran_at = _monotonic()


class HeapTask:
    __slots__ = ("delay_ms", "entry")

    def __init__(self, delay_ms: int) -> None:
        self.delay_ms = delay_ms
        self.entry: list | None = None


class HeapTimer:
    """A heapq timer with cancellation by marking, as in the heapq documentation."""

    def __init__(self) -> None:
        self.heap: list[list] = []
        self.counter = itertools.count()
        self.cancelled = 0

    def add(self, task: HeapTask) -> None:
        # The clock read inline, as the wheel's add does.
        entry = [_monotonic() * 1000.0 + task.delay_ms, next(self.counter), task]
        task.entry = entry
        heapq.heappush(self.heap, entry)

    def cancel(self, task: HeapTask) -> None:
        entry = task.entry
        if entry is not None:
            entry[2] = None
            task.entry = None
            self.cancelled += 1

    @staticmethod
    def pop_marked(heap: list[list], count: int) -> None:
        """Pop ``count`` entries off ``heap`` (a copy): the cost of removing marked entries one
        by one as they reach the top (a live entry would be popped at its expiry anyway)."""
        pop = heapq.heappop
        for _ in range(count):
            pop(heap)

    def drop_cancelled(self) -> None:
        self.heap = [e for e in self.heap if e[2] is not None]
        heapq.heapify(self.heap)
        self.cancelled = 0


def delays(n: int, low: int, high: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def timed(fn) -> float:
    gc.collect()
    gc.disable()
    try:
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin
    finally:
        gc.enable()


def churn_wheel(base: list[int], extra: list[int], order: list[int]) -> dict[str, float]:
    wheel = SystemTimer()  # the monotonic clock, reaped by hand (never here)
    for d in base:
        wheel.add(WheelTask(d))
    tasks = [WheelTask(d) for d in extra]
    cancels = [tasks[i] for i in order]
    add = wheel.add
    add_s = timed(lambda: [add(t) for t in tasks])
    cancel_s = timed(lambda: [t.cancel() for t in cancels])
    assert wheel.size == len(base)
    wheel.shutdown()
    return {"wheel_add_us": add_s / len(extra) * 1e6,
            "wheel_cancel_us": cancel_s / len(extra) * 1e6}


def churn_heap(base: list[int], extra: list[int], order: list[int]) -> dict[str, float]:
    heap = HeapTimer()
    for d in base:
        heap.add(HeapTask(d))
    tasks = [HeapTask(d) for d in extra]
    cancels = [tasks[i] for i in order]
    add, cancel = heap.add, heap.cancel
    add_s = timed(lambda: [add(t) for t in tasks])
    cancel_s = timed(lambda: [cancel(t) for t in cancels])
    copy = list(heap.heap)
    pop_s = timed(lambda: heap.pop_marked(copy, len(extra)))
    drop_s = timed(heap.drop_cancelled)
    assert len(heap.heap) == len(base)
    return {"heap_add_us": add_s / len(extra) * 1e6,
            "heap_cancel_us": cancel_s / len(extra) * 1e6,
            "heap_pop_marked_us": pop_s / len(extra) * 1e6,
            "heap_drop_cancelled_us": drop_s / len(extra) * 1e6}


def add_cancel(pending: int, churn: int) -> dict[str, float]:
    base = delays(pending, 30_000, 60_000, 1)
    extra = delays(churn, 30_000, 60_000, 2)
    order = list(range(churn))
    random.Random(3).shuffle(order)
    out = churn_wheel(base, extra, order)
    gc.collect()
    out.update(churn_heap(base, extra, order))
    out["wheel_add_cancel_us"] = out["wheel_add_us"] + out["wheel_cancel_us"]
    out["heap_add_cancel_us"] = out["heap_add_us"] + out["heap_cancel_us"]
    out["heap_add_cancel_with_pop_us"] = out["heap_add_cancel_us"] + out["heap_pop_marked_us"]
    out["heap_add_cancel_with_drop_us"] = out["heap_add_cancel_us"] + out["heap_drop_cancelled_us"]
    wheel_us = out["wheel_add_cancel_us"]
    out["speedup"] = out["heap_add_cancel_us"] / wheel_us
    out["speedup_with_pop"] = out["heap_add_cancel_with_pop_us"] / wheel_us
    out["speedup_with_drop"] = out["heap_add_cancel_with_drop_us"] / wheel_us
    return out


def memory(pending: int) -> dict[str, float]:
    ds = delays(pending, 30_000, 60_000, 4)
    out: dict[str, float] = {}
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    wheel = SystemTimer()
    wheel_tasks = [WheelTask(d) for d in ds]
    for t in wheel_tasks:
        wheel.add(t)
    list_cost = sys.getsizeof(wheel_tasks)  # the benchmark's own list, not the timer's
    out["wheel_bytes_per_op"] = (tracemalloc.get_traced_memory()[0] - base - list_cost) / pending
    wheel.shutdown()
    del wheel, wheel_tasks
    gc.collect()
    base = tracemalloc.get_traced_memory()[0]
    heap = HeapTimer()
    heap_tasks = [HeapTask(d) for d in ds]
    for t in heap_tasks:
        heap.add(t)
    list_cost = sys.getsizeof(heap_tasks)
    out["heap_bytes_per_op"] = (tracemalloc.get_traced_memory()[0] - base - list_cost) / pending
    tracemalloc.stop()
    del heap, heap_tasks
    gc.collect()
    return out


def percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "max_ms": values[-1] * 1000}


async def lateness_wheel(n: int, spread_ms: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    timer = SystemTimer(loop=loop)
    # Deadlines start after the adding is over, so they measure the timer, not the set-up.
    ds = delays(n, 1000, 1000 + spread_ms, 5)
    tasks = []
    deadlines = []
    for d in ds:
        task = WheelTask(d)
        deadlines.append(_monotonic() + d / 1000)
        timer.add(task)
        tasks.append(task)
    await asyncio.sleep(1 + spread_ms / 1000)
    while timer.size:  # noqa: ASYNC110 - the timer has no completion event; a few rounds
        await asyncio.sleep(0.05)
    late = [t.ran_at - dl for t, dl in zip(tasks, deadlines, strict=True)]
    assert min(late) >= -1e-6, min(late)  # never early
    return percentiles(late)


async def lateness_call_at(n: int, spread_ms: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    ds = delays(n, 1000, 1000 + spread_ms, 5)
    ran = [0.0] * n
    deadlines = []
    done = asyncio.Event()
    left = [n]

    def fire(i: int) -> None:
        ran[i] = _monotonic()
        left[0] -= 1
        if not left[0]:
            done.set()

    for i, d in enumerate(ds):
        deadlines.append(_monotonic() + d / 1000)
        loop.call_at(loop.time() + d / 1000, fire, i)
    await done.wait()
    return percentiles([r - dl for r, dl in zip(ran, deadlines, strict=True)])


def run_loop(coro_fn, n: int, spread_ms: int) -> dict[str, float]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro_fn(n, spread_ms))
    return uvloop.run(coro_fn(n, spread_ms))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--churn", type=int, default=200_000)
    parser.add_argument("--lateness", type=int, default=100_000)
    parser.add_argument("--spread-ms", type=int, default=2000,
                        help="lateness: deadlines spread over this long, starting 1 s out")
    args = parser.parse_args()

    costs = add_cancel(args.pending, args.churn)
    mem = memory(args.pending)
    wheel_late = run_loop(lateness_wheel, args.lateness, args.spread_ms)
    call_at_late = run_loop(lateness_call_at, args.lateness, args.spread_ms)

    print(f"add/cancel with {args.pending:,} pending ({args.churn:,} operations), us per op:")
    print(f"  {'':24}{'add':>8}{'cancel':>8}{'add+cancel':>12}{'+pop marks':>12}"
          f"{'+rebuild':>10}")
    wheel_us = costs["wheel_add_cancel_us"]
    print(f"  {'timing wheel':24}{costs['wheel_add_us']:8.3f}{costs['wheel_cancel_us']:8.3f}"
          f"{wheel_us:12.3f}{wheel_us:12.3f}{wheel_us:10.3f}")
    print(f"  {'heapq (mark on cancel)':24}{costs['heap_add_us']:8.3f}"
          f"{costs['heap_cancel_us']:8.3f}{costs['heap_add_cancel_us']:12.3f}"
          f"{costs['heap_add_cancel_with_pop_us']:12.3f}"
          f"{costs['heap_add_cancel_with_drop_us']:10.3f}")
    print("  (the heap's cancel only marks its entry; '+pop marks' adds one heappop per marked"
          " entry,\n   '+rebuild' one filter+heapify of the whole heap shared by the cancels;"
          " the wheel's\n   cancel is a complete unlink, nothing deferred)")
    print(f"  wheel speed-up: {costs['speedup']:.2f}x counting the heap's mark only, "
          f"{costs['speedup_with_pop']:.2f}x with its pops of marks, "
          f"{costs['speedup_with_drop']:.2f}x with its rebuild (goal 3x)")
    print(f"memory per pending operation: wheel {mem['wheel_bytes_per_op']:.0f} B, "
          f"heap {mem['heap_bytes_per_op']:.0f} B")
    print(f"lateness with {args.lateness:,} pending over {args.spread_ms} ms: "
          f"wheel p50 {wheel_late['p50_ms']:.3f} ms, "
          f"p99 {wheel_late['p99_ms']:.3f} ms, max {wheel_late['max_ms']:.3f} ms; "
          f"loop.call_at p50 {call_at_late['p50_ms']:.3f} ms, p99 {call_at_late['p99_ms']:.3f}"
          f" ms, max {call_at_late['max_ms']:.3f} ms")
    print(json.dumps({"pending": args.pending, "churn": args.churn,
                      "spread_ms": args.spread_ms, **costs, **mem,
                      "wheel_lateness": wheel_late, "call_at_lateness": call_at_late}))


if __name__ == "__main__":
    main()
