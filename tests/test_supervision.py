"""The restart policy of a local cluster's supervisor: kubelet-like backoff over a given clock."""

from __future__ import annotations

from services.supervision import Backoff, Supervisor


def test_backoff_doubles_from_one_second_up_to_the_cap():
    backoff = Backoff(initial=1.0, cap=10.0)
    assert [backoff.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.delay(10_000) == 10.0


def test_a_crash_loop_backs_off_and_counts_every_restart():
    supervisor = Supervisor(["log-0", "log-1"], Backoff(initial=1.0, cap=4.0, reset_after=30.0))
    supervisor.started("log-0", 0.0)
    supervisor.started("log-1", 0.0)
    now = 5.0
    delays = []
    for _ in range(4):
        delay = supervisor.exited("log-0", now)
        delays.append(delay)
        assert supervisor.due(now + delay - 0.01) == []
        assert supervisor.due(now + delay) == ["log-0"]
        supervisor.restarting("log-0", now + delay)
        now += delay + 2.0  # runs 2 s, then crashes again
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert supervisor.restarts("log-0") == 4
    assert supervisor.restarts("log-1") == 0


def test_a_service_that_ran_long_enough_restarts_after_the_initial_delay_again():
    supervisor = Supervisor(["handler-0"], Backoff(initial=1.0, cap=60.0, reset_after=30.0))
    supervisor.started("handler-0", 0.0)
    for now in (1.0, 3.0, 6.0):
        supervisor.restarting("handler-0", now + supervisor.exited("handler-0", now))
    assert supervisor.exited("handler-0", 100.0) == 1.0


def test_an_exit_seen_twice_schedules_one_restart():
    supervisor = Supervisor(["frontend"])
    supervisor.started("frontend", 0.0)
    assert supervisor.exited("frontend", 10.0) == 1.0
    assert supervisor.pending("frontend")
    assert supervisor.exited("frontend", 10.5) == 0.5
    assert supervisor.due(11.0) == ["frontend"]
    assert supervisor.restarting("frontend", 11.0) == 1
    assert not supervisor.pending("frontend")
    assert supervisor.due(100.0) == []
