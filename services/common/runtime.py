"""Process life cycle shared by every service's ``__main__``: allocator tuning, the open file
limit, CPU scheduling, uvloop, logging, and a graceful stop on SIGTERM/SIGINT or when the
launcher that started the process is gone."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import os
import resource
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

# glibc mallopt parameters.
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
_MIB = 1024 * 1024

# Set by the local launcher to its pid: the service asks for SIGTERM when that process dies
# (Linux's parent-death signal) and stops if its parent is already another process (the
# launcher died before that); a check every second covers systems without the signal.
PARENT_PID_ENV = "KBROKER_PARENT_PID"
_PARENT_CHECK_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1

# The CPU scheduling of every thread of a service: "normal" (the kernel's default policy, the
# default) or "batch" (Linux's SCHED_BATCH, see schedule_as_batch).
CPU_SCHEDULING_ENV = "KBROKER_CPU_SCHEDULING"
CPU_SCHEDULING = ("normal", "batch")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def die_with_parent(parent: int) -> bool:
    """Ask for SIGTERM when the process (strictly: the thread) that started this one ends,
    even by SIGKILL; False where there is no such signal. Set here, after exec, rather than by
    the launcher between fork and exec: a ``preexec_fn`` makes Python fork the whole launcher
    (no vfork), which runs gRPC's fork handlers, and those can hang a launcher with live gRPC
    channels. A launcher that died before this call is caught by the parent check."""
    libc = _libc()
    prctl = getattr(libc, "prctl", None) if libc is not None and sys.platform.startswith(
        "linux") else None
    if prctl is None:
        return False
    prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def tune_allocator() -> bool:
    """Keep multi-megabyte buffers (record batches in gRPC messages) on the heap.

    By default glibc serves every allocation over 128 KiB-32 MiB (a dynamic threshold) with a
    fresh mmap and returns it with munmap, so each fetch or produce of a few MB costs page
    faults on pages the kernel must zero: measured here as most of the log and handler CPU on
    the fetch path. A fixed 32 MiB threshold and a generous trim threshold let freed buffers be
    reused. Returns False where the C library has no mallopt (not glibc)."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 * _MIB)
    ok &= mallopt(_M_TRIM_THRESHOLD, 512 * _MIB)
    ok &= mallopt(_M_TOP_PAD, 64 * _MIB)
    return bool(ok)


def schedule_as_batch() -> bool:
    """Every thread of this process under Linux's SCHED_BATCH; threads started later inherit
    it. Returns False where there is no such policy (not Linux) or a thread could not be moved.

    A record crosses three services and each hop wakes the next one. Under the kernel's default
    policy a woken thread can preempt the one running on its core, even in the middle of the
    socket write (its GIL held) that woke it; a produce load on 2 cores made 36,000-38,000
    context switches a second. A SCHED_BATCH thread does not preempt the running one when
    woken: it waits for it to block or use up its time slice. Under the same load: 24,000-26,000
    switches a second, and 7% less of the services' CPU per MB produced. The same wait makes
    every hop slower when another process keeps a core busy: beside one such process, acks=all
    produce at RF=3 took 8.1-11.2 ms at p99 against 3.4-5.3 under the default policy. So it is
    a choice for hosts the services have to themselves (docs/performance.md, "Batch
    scheduling")."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    moved = True
    for tid in threads:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except OSError:  # gone meanwhile, or a sandbox that refuses it
            moved = False
    return moved


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (as the JVM does for
    Kafka's broker) and return the soft limit now. A log node keeps three files open per
    segment in use, a frontend a socket per client and the segment files it sends from, and
    a soft limit of 1,024 (a common default) runs out long before the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):  # an unlimited hard limit, say
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft


def release_free_memory() -> bool:
    """Give the pages of freed heap memory back to the kernel (glibc ``malloc_trim``): with the
    trim threshold :func:`tune_allocator` sets, glibc keeps them otherwise, so a process's
    resident memory would stay at its peak after, say, thousands of connections came and went.
    Returns False where the C library has no malloc_trim."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return False
    trim(0)
    return True


class FreedMemoryRelease:
    """Calls :func:`release_free_memory` ``delay`` seconds after it is first asked to, once for
    every request in between: after a burst of closed connections, one trim, not one each.
    Not thread-safe (one event loop)."""

    def __init__(self, delay: float = 1.0) -> None:
        self._delay = delay
        self._pending: asyncio.TimerHandle | None = None

    def soon(self) -> None:
        if self._pending is None:
            self._pending = asyncio.get_running_loop().call_later(self._delay, self._release)

    def _release(self) -> None:
        self._pending = None
        release_free_memory()

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None


def freeze_heap() -> None:
    """Move every object alive now (modules, compiled codecs, config: what a started service
    keeps for good) out of the garbage collector's reach (``gc.freeze``), after one last
    collection. A full collection walks every tracked object; in a started frontend that is
    about 140,000 of them, some 140 ms with the event loop stopped, and the collections that
    requests' garbage triggers kept walking them for nothing."""
    gc.collect()
    gc.freeze()


def run(service: str, main: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """Run ``main(stop_event)`` on uvloop until it returns (logging to stderr at
    ``KBROKER_LOG_LEVEL``); SIGTERM/SIGINT set the event, and so does the end of the launcher
    whose pid is in ``KBROKER_PARENT_PID`` (when set). Every thread runs under the scheduling
    ``KBROKER_CPU_SCHEDULING`` names (the kernel's default unless it says batch; another value
    ends the process). Unusable internal TLS settings (plaintext on a non-loopback address, missing
    files) end the process with status 1 and one line saying why."""
    import uvloop

    logging.basicConfig(level=os.environ.get("KBROKER_LOG_LEVEL", "INFO").upper(),
                        stream=sys.stderr,
                        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    tune_allocator()
    raise_open_file_limit()
    scheduling = os.environ.get(CPU_SCHEDULING_ENV, "normal")
    if scheduling not in CPU_SCHEDULING:
        sys.exit(f"{service}: cannot start: {CPU_SCHEDULING_ENV} is {scheduling!r}; expected "
                 + " or ".join(CPU_SCHEDULING))
    if scheduling == "batch" and not schedule_as_batch():
        logging.getLogger(f"services.{service}").warning(
            "could not move every thread to SCHED_BATCH; those left keep their scheduling")
    parent = os.environ.get(PARENT_PID_ENV, "")
    if parent.isdigit():
        die_with_parent(int(parent))

    async def _wrapper() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        watch = None
        if parent.isdigit():
            # The parent-death signal is a SIGTERM: say why when it is that one.
            loop.add_signal_handler(signal.SIGTERM, _stop_or_orphaned, int(parent), stop)
            watch = asyncio.create_task(_stop_when_orphaned(int(parent), stop))
        try:
            await main(stop)
        finally:
            if watch is not None:
                watch.cancel()

    from .tls import InternalTlsError

    try:
        uvloop.run(_wrapper())
    except InternalTlsError as e:
        # A settings mistake, not a crash: say what is wrong, no traceback.
        logging.getLogger(f"services.{service}").error("cannot start: %s", e)
        sys.exit(f"{service}: cannot start: {e}")


def _stop_or_orphaned(parent: int, stop: asyncio.Event) -> None:
    if os.getppid() != parent and not stop.is_set():
        _say_orphaned(parent)
    stop.set()


def _say_orphaned(parent: int) -> None:
    logging.getLogger("services.common.runtime").warning(
        "the launcher (pid %d) is gone; stopping", parent)


async def _stop_when_orphaned(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _PARENT_CHECK_SECONDS)
            return  # stopped for another reason
    if not stop.is_set():
        _say_orphaned(parent)
    stop.set()


def serve_main(service: str, config_cls: type, start: Callable[[Any], Awaitable[Any]]) -> None:
    """The whole ``python -m services.<service>``: read the config from flags and environment,
    serve Prometheus text on ``metrics_port`` (same interface as the gRPC port), start the
    service, and stop it gracefully on SIGTERM/SIGINT."""
    from .config import load
    from .metrics import serve_prometheus
    from .tls import InternalTls

    config = load(config_cls, sys.argv[1:])
    log = logging.getLogger(f"services.{service}")

    async def serve(stop: asyncio.Event) -> None:
        if config.metrics_port:
            host = config.grpc_address.rsplit(":", 1)[0].strip("[]") or "127.0.0.1"
            serve_prometheus(config.metrics_port, host)
        running = await start(config)
        freeze_heap()
        log.info("%s ready: gRPC on %s (%s)", service, config.grpc_address,
                 InternalTls.of(config).describe())
        try:
            await stop.wait()
        finally:
            await running.stop()

    run(service, serve)
