"""The purgatory's domain on a manual clock: completion rules, expiry, cancellation, and a
property test that no operation completes twice, is missed, or leaks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbroker.purgatory.v1.purgatory_pb2 import OUTCOME_COMPLETED as COMPLETED
from kbroker.purgatory.v1.purgatory_pb2 import OUTCOME_EXPIRED as EXPIRED
from services.purgatory import metrics
from services.purgatory.delayed_await import DelayedAwait
from services.purgatory.delayed_fetch import DelayedFetch
from services.purgatory.delayed_operation import DelayedOperation
from services.purgatory.delayed_produce import DelayedProduce
from services.purgatory.purgatories import KINDS, Purgatories

from .fakes import ManualTimer


def on_loop(test: Callable[[Purgatories, ManualTimer], None]) -> None:
    """Run a synchronous scenario inside an event loop (operations own futures)."""

    async def scenario() -> None:
        timer = ManualTimer()
        test(Purgatories(timer), timer)

    asyncio.run(scenario())


def outcome(op: DelayedAwait) -> int | None:
    return op.result.result().outcome if op.result.done() else None


def test_any_key_completes_when_one_reaches_its_threshold():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="fetch", thresholds={"a": 5, "b": 5}, require_all=False,
                    timeout_ms=100)
        assert p.report([("a", 4, 0)]) == 0 and outcome(op) is None
        assert p.report([("b", 5, 0)]) == 1
        answer = op.result.result()
        assert answer.outcome == COMPLETED
        assert [(s.key, s.position) for s in answer.keys] == [("a", 4), ("b", 5)]
        # Completed through "b", the operation stays on "a" until "a" is checked or purged.
        assert p.describe().pending_by_kind["fetch"] == 0 and p.describe().watched_keys == 1
        assert timer.size == 0
        assert p.report([("a", 4, 0)]) == 0
        assert p.describe().watched_keys == 0

    on_loop(scenario)


def test_completed_operations_are_purged_from_their_other_keys_past_the_interval():
    async def scenario() -> None:
        timer = ManualTimer()
        p = Purgatories(timer, purge_interval=5)
        fetch = p._by_kind["fetch"]
        before = metrics.PURGED.labels("fetch")._value.get()
        ops = [p.park(kind="fetch", thresholds={"hot": 1, f"cold-{i}": 1}, require_all=False,
                      timeout_ms=1000) for i in range(4)]
        assert p.report([("hot", 1, 0)]) == 4
        assert all(outcome(op) == COMPLETED for op in ops)
        # Four completed entries linger on the cold keys: below the interval of five.
        assert fetch.completed_entries == 4 and p.describe().watched_keys == 4
        more = p.park(kind="fetch", thresholds={"hot": 2, "cold-9": 1}, require_all=False,
                      timeout_ms=1000)
        assert p.report([("hot", 2, 0)]) == 1 and outcome(more) == COMPLETED
        # The fifth reached the interval: every list was purged.
        assert fetch.completed_entries == 0 and p.describe().watched_keys == 0
        assert metrics.PURGED.labels("fetch")._value.get() - before == 5

    asyncio.run(scenario())


def test_expired_and_cancelled_operations_leave_every_list_at_once():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        expiring = p.park(kind="fetch", thresholds={"a": 1, "b": 1}, require_all=False,
                          timeout_ms=10)
        cancelled = p.park(kind="fetch", thresholds={"c": 1, "d": 1}, require_all=False,
                           timeout_ms=1000)
        assert p.describe().watched_keys == 4
        assert p.cancel(cancelled) and p.describe().watched_keys == 2
        timer.advance(10)
        assert outcome(expiring) == EXPIRED and p.describe().watched_keys == 0

    on_loop(scenario)


def test_all_keys_must_reach_their_thresholds():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="produce", thresholds={"a": 5, "b": 7}, require_all=True,
                    timeout_ms=100)
        assert p.report([("a", 9, 0)]) == 0
        assert p.report([("b", 6, 0)]) == 0
        assert outcome(op) is None
        assert p.report([("b", 7, 0)]) == 1
        assert outcome(op) == COMPLETED

    on_loop(scenario)


def test_each_key_answers_with_the_isr_of_the_report_that_satisfied_it():
    """What min.insync.replicas is checked against: the leader's ISR when its high watermark
    passed the threshold, not what a later report of the key said."""

    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        p.report([("a", 9, 0, (1, 2, 3))])  # before parking: satisfies "a" at parking
        op = p.park(kind="produce", thresholds={"a": 5, "b": 7, "c": 1}, require_all=True,
                    timeout_ms=100)
        assert p.report([("b", 7, 0, (1, 2))]) == 0
        p.report([("a", 10, 0, (1,)), ("b", 8, 0, (1,))])  # a shrink, after both were satisfied
        assert p.report([("c", 1, 0)]) == 1  # a reporter that names no ISR
        answer = op.result.result()
        assert answer.outcome == COMPLETED
        assert [(k.key, k.position, list(k.isr)) for k in answer.keys] == [
            ("a", 10, [1, 2, 3]), ("b", 8, [1, 2]), ("c", 1, [])]
        expiring = p.park(kind="produce", thresholds={"a": 50}, require_all=True,
                          timeout_ms=10)
        timer.advance(20)
        assert [list(k.isr) for k in expiring.result.result().keys] == [[]]  # not satisfied

    on_loop(scenario)


def test_a_report_made_before_parking_is_seen_at_parking():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        p.report([("a", 10, 0)])
        op = p.park(kind="fetch", thresholds={"a": 10}, require_all=False, timeout_ms=100)
        assert outcome(op) == COMPLETED
        assert p.describe().pending_by_kind["fetch"] == 0 and timer.size == 0

    on_loop(scenario)


def test_errors_count_only_when_reported_after_parking():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        p.report([("a", 0, 6)])
        op = p.park(kind="fetch", thresholds={"a": 10}, require_all=False, timeout_ms=100)
        assert outcome(op) is None  # the old error is history
        assert p.report([("a", 0, 6)]) == 1
        answer = op.result.result()
        assert answer.outcome == COMPLETED and answer.keys[0].error_code == 6

    on_loop(scenario)


def test_the_end_of_a_leader_epoch_fails_every_wait_on_its_key_however_late():
    """An old leader that has not heard of its epoch's end may take an append, whose acks=all
    produce then parks after the end was reported: it must fail at once, not time out."""
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        ended = "t-0@3@3b4d6a10-8f1e-4bd2-9c55-6e0f3f2d6a01"
        p.report([(ended, 7, 0)])
        p.report([(ended, -1, 6)])  # the epoch ended (the replicator does not know where)
        # What the leader's last report covered stays covered.
        before = p.park(kind="produce", thresholds={ended: 7}, require_all=True,
                        timeout_ms=100)
        assert outcome(before) == COMPLETED
        assert [(k.position, k.error_code) for k in before.result.result().keys] == [(7, 0)]
        p.report([(ended, 8, 0)])  # the old leader, still unaware, moves on: the end stands
        late = p.park(kind="produce", thresholds={ended: 9}, require_all=True, timeout_ms=100)
        answer = late.result.result()
        assert answer.outcome == COMPLETED
        assert [(k.position, k.error_code) for k in answer.keys] == [(8, 6)]
        # What the ended epoch covered is still answered as covered.
        covered = p.park(kind="produce", thresholds={ended: 8}, require_all=True,
                         timeout_ms=100)
        assert outcome(covered) == COMPLETED
        assert [(k.position, k.error_code) for k in covered.result.result().keys] == [(8, 0)]
        # The same partition's next epoch, and a topic of the same name created again, are
        # other keys.
        for key in ("t-0@4@3b4d6a10-8f1e-4bd2-9c55-6e0f3f2d6a01",
                    "t-0@3@9d0c7e55-0a7b-4b0e-8f6e-1f3a2c5d7e90"):
            op = p.park(kind="produce", thresholds={key: 1}, require_all=True, timeout_ms=100)
            assert outcome(op) is None
            p.report([(key, 1, 0)])
            assert outcome(op) == COMPLETED and op.result.result().keys[0].error_code == 0

    on_loop(scenario)


def test_with_require_all_an_error_settles_its_key_and_the_others_are_still_awaited():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="produce", thresholds={"a": 5, "b": 5}, require_all=True,
                    timeout_ms=100)
        assert p.report([("a", 3, 6)]) == 0
        assert p.report([("a", 3, 0)]) == 0  # a recovered, but its failure stands for this op
        assert p.report([("b", 5, 0)]) == 1
        keys = {s.key: s for s in op.result.result().keys}
        assert keys["a"].error_code == 6 and keys["b"].position == 5

    on_loop(scenario)


def test_expiry_answers_expired_once_and_releases_the_keys():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="fetch", thresholds={"a": 1}, require_all=False, timeout_ms=100)
        timer.advance(99)
        assert outcome(op) is None
        timer.advance(1)
        assert outcome(op) == EXPIRED
        assert op.result.result().keys[0].position == -1  # never reported
        assert p.report([("a", 5, 0)]) == 0
        assert p.describe().watched_keys == 0

    on_loop(scenario)


def test_non_positive_timeout_checks_once_and_answers_at_once():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        p.report([("a", 3, 0)])
        met = p.park(kind="fetch", thresholds={"a": 3}, require_all=False, timeout_ms=0)
        unmet = p.park(kind="fetch", thresholds={"a": 4}, require_all=False, timeout_ms=-1)
        assert outcome(met) == COMPLETED and outcome(unmet) == EXPIRED
        assert timer.size == 0 and p.describe().pending_by_kind["fetch"] == 0

    on_loop(scenario)


def test_no_keys_means_every_holds_at_once_and_any_is_a_plain_delay():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        every = p.park(kind="join", thresholds={}, require_all=True, timeout_ms=50)
        delay = p.park(kind="join", thresholds={}, require_all=False, timeout_ms=50)
        assert outcome(every) == COMPLETED and outcome(delay) is None
        timer.advance(50)
        assert outcome(delay) == EXPIRED

    on_loop(scenario)


def test_cancel_removes_the_operation_from_every_list():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        ops = [p.park(kind="fetch", thresholds={"a": 1, f"b{i}": 1}, require_all=True,
                      timeout_ms=100) for i in range(10)]
        assert p.describe().watched_keys == 11 and timer.size == 10
        for op in ops:
            assert p.cancel(op)
            assert not p.cancel(op)
        assert p.describe().pending_by_kind["fetch"] == 0 and p.describe().watched_keys == 0
        assert timer.size == 0
        timer.advance(1000)
        assert p.report([("a", 1, 0)]) == 0
        assert not any(op.result.done() for op in ops)

    on_loop(scenario)


def test_force_complete_runs_the_completion_exactly_once():
    class Counting(DelayedOperation):
        completions = 0
        expirations = 0

        def try_complete(self) -> bool:
            return self.force_complete()

        def on_complete(self) -> None:
            self.completions += 1

        def on_expiration(self) -> None:
            self.expirations += 1

    op = Counting(10)
    assert op.force_complete()
    assert not op.force_complete() and not op.try_complete() and not op.abandon()
    op.run()
    assert (op.completions, op.expirations) == (1, 0)
    expired = Counting(10)
    expired.run()
    expired.run()
    assert (expired.completions, expired.expirations) == (1, 1)


KEYS = ("a", "b", "c")

actions = st.lists(
    st.one_of(
        st.tuples(st.just("park"), st.sampled_from(KINDS),
                  st.dictionaries(st.sampled_from(KEYS), st.integers(0, 6), max_size=3),
                  st.booleans(), st.integers(-1, 20)),
        st.tuples(st.just("report"), st.sampled_from(KEYS), st.integers(0, 6),
                  st.sampled_from((0, 0, 0, 6))),
        st.tuples(st.just("advance"), st.integers(0, 8)),
        st.tuples(st.just("cancel"), st.integers(0, 50)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_random_histories_complete_each_operation_at_most_once_and_leak_nothing(history):
    async def scenario() -> None:
        timer = ManualTimer()
        p = Purgatories(timer, purge_interval=4)
        ops: list[tuple[DelayedAwait, float]] = []
        answers: dict[int, int] = {}
        positions: dict[str, int] = {}
        abandoned: set[int] = set()

        for action in history:
            if action[0] == "park":
                _, kind, thresholds, require_all, timeout = action
                op = p.park(kind=kind, thresholds=thresholds, require_all=require_all,
                            timeout_ms=timeout)
                key = id(op)
                op.result.add_done_callback(
                    lambda _f, i=key: answers.__setitem__(i, answers.get(i, 0) + 1))
                ops.append((op, timer.now_ms))
            elif action[0] == "report":
                _, key, position, error = action
                p.report([(key, position, error)])
                positions[key] = position
            elif action[0] == "advance":
                timer.advance(action[1])
            elif ops:
                op, _ = ops[action[1] % len(ops)]
                if p.cancel(op):
                    abandoned.add(id(op))
            await asyncio.sleep(0)  # let future callbacks run

            pending = [op for op, _ in ops if not op.is_completed]
            description = p.describe()
            assert sum(description.pending_by_kind.values()) == len(pending)
            pending_keys = {k for op in pending for k in op.thresholds}
            watched = {k for kind in KINDS for k in p._by_kind[kind].watched_keys()}
            # Completed operations may linger on their other keys, but boundedly.
            assert pending_keys <= watched and description.watched_keys == len(watched)
            for kind in KINDS:
                purgatory = p._by_kind[kind]
                lingering = sum(op.is_completed for key in purgatory.watched_keys()
                                for op in purgatory._watchers[key])
                assert lingering == purgatory.completed_entries < 4
            assert timer.size == len(pending)
            for op in pending:
                reached = [positions.get(k, -1) >= t for k, t in op.thresholds.items()]
                # A pending operation must not be one whose condition already holds.
                assert not (all(reached) if op.require_all else any(reached))
            for op, parked_at in ops:
                if not op.result.done():
                    continue
                answer = op.result.result()
                if answer.outcome == EXPIRED:
                    assert timer.now_ms >= parked_at + op.delay_ms
        assert all(count == 1 for count in answers.values())
        for op, _ in ops:
            assert op.result.done() == (op.is_completed and id(op) not in abandoned)
        p.purge_completed()
        pending = [op for op, _ in ops if not op.is_completed]
        assert p.describe().watched_keys == len({k for op in pending for k in op.thresholds})
        p.shutdown()
        assert timer.size == 0 and p.describe().watched_keys == 0

    asyncio.run(scenario())


def test_an_expired_produce_times_out_only_its_pending_partitions():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="produce", thresholds={"t-0": 5, "t-1": 5, "t-2": 5},
                    require_all=True, timeout_ms=30)
        assert isinstance(op, DelayedProduce)
        p.report([("t-0", 5, 0), ("t-1", 2, 6), ("t-2", 4, 0)])
        timer.advance(29)
        assert outcome(op) is None
        timer.advance(1)
        answer = op.result.result()
        assert answer.outcome == EXPIRED
        assert [(s.key, s.position, s.error_code) for s in answer.keys] == [
            ("t-0", 5, 0),  # replicated in time
            ("t-1", 2, 6),  # its leader moved: NOT_LEADER_OR_FOLLOWER stands
            ("t-2", 4, 7),  # still short: REQUEST_TIMED_OUT
        ]

    on_loop(scenario)


def test_an_expired_fetch_answers_what_is_there():
    def scenario(p: Purgatories, timer: ManualTimer) -> None:
        op = p.park(kind="fetch", thresholds={"t-0": 5}, require_all=False, timeout_ms=800)
        assert isinstance(op, DelayedFetch)
        p.report([("t-0", 4, 0)])
        timer.advance(800)
        answer = op.result.result()
        assert answer.outcome == EXPIRED
        assert [(s.key, s.position, s.error_code) for s in answer.keys] == [("t-0", 4, 0)]

    on_loop(scenario)
