"""The CPU scheduling of the service processes (``services/common/runtime.py``): a service runs
under the kernel's default policy unless ``KBROKER_CPU_SCHEDULING`` says ``batch``, and then
every thread of it runs under Linux's SCHED_BATCH, those started before the choice and after it;
any other value stops the service at start-up with one line saying why, and a service whose
threads cannot be moved warns and runs on. Each case is a real process: a policy belongs to the
threads that took it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A thread started before the choice, one after it; then the policy of every thread.
THREADS = """
import os, threading
from services.common.runtime import schedule_as_batch
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
moved = schedule_as_batch()
after = threading.Thread(target=stop.wait); after.start()
tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
print(moved, len(tids), *sorted({os.sched_getscheduler(t) for t in tids}))
stop.set()
"""

# What a service's start-up chooses: the policy of its event loop's thread and of a thread
# that loop starts.
SERVICE = """
import asyncio, os
from services.common.runtime import run

async def main(stop):
    thread = await asyncio.to_thread(lambda: os.sched_getscheduler(0))
    print(os.sched_getscheduler(0), thread)

run("log", main)
"""


def run_python(code: str, scheduling: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KBROKER_CPU_SCHEDULING"}
    if scheduling is not None:
        env["KBROKER_CPU_SCHEDULING"] = scheduling
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_every_thread_runs_under_batch_scheduling_those_started_before_and_after():
    done = run_python(THREADS, None)
    assert done.returncode == 0, done.stderr
    moved, threads, *policies = done.stdout.split()
    assert moved == "True"
    assert int(threads) >= 3
    assert policies == [str(os.SCHED_BATCH)]


@pytest.mark.parametrize(("scheduling", "policy"), [
    (None, "SCHED_OTHER"), ("normal", "SCHED_OTHER"), ("batch", "SCHED_BATCH")])
def test_a_service_takes_the_scheduling_its_setting_names(scheduling, policy):
    done = run_python(SERVICE, scheduling)
    assert done.returncode == 0, done.stderr
    expected = str(getattr(os, policy))
    assert done.stdout.split() == [expected, expected]


def test_a_service_whose_threads_cannot_be_moved_says_so_and_runs_on():
    # As in a sandbox that refuses the call.
    refused = ("import os\n"
               "def refuse(tid, policy, param):\n"
               "    raise PermissionError(1, 'Operation not permitted')\n"
               "os.sched_setscheduler = refuse\n")
    done = run_python(refused + SERVICE, "batch")
    assert done.returncode == 0, done.stderr
    normal = str(os.SCHED_OTHER)
    assert done.stdout.split() == [normal, normal]
    assert "could not move every thread to SCHED_BATCH" in done.stderr


def test_an_unknown_scheduling_stops_the_service_saying_why():
    done = run_python(SERVICE, "fifo")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "log: cannot start: KBROKER_CPU_SCHEDULING is 'fifo'; expected normal or batch")
