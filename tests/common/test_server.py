"""Every service's gRPC server: health, reflection, the Metrics service (snapshot and stream)
and gRPC server metrics for unary and client-streaming calls, on a real server on port 0."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from kbroker.metrics.v1 import metrics_pb2, metrics_pb2_grpc
from kbroker.purgatory.v1 import purgatory_pb2, purgatory_pb2_grpc
from services.common import runtime
from services.common.channels import insecure_channel
from services.common.metrics import stream_interval_seconds
from services.common.runtime import FreedMemoryRelease, release_free_memory, tune_allocator
from services.common.server import ServiceBinding, create_server

SERVICE = "kbroker.purgatory.v1.Purgatory"


class Counting(purgatory_pb2_grpc.PurgatoryServicer):
    def __init__(self) -> None:
        self.reported = 0

    async def CheckAndComplete(self, request, context):
        self.reported += len(request.keys)
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)

    async def ReportProgress(self, request_iterator, context):
        async for request in request_iterator:
            self.reported += len(request.keys)
        return purgatory_pb2.CheckAndCompleteResponse(completed=0)


def handled(method: str, kind: str, code: str = "OK") -> float:
    return REGISTRY.get_sample_value("kbroker_grpc_server_handled_total", {
        "grpc_service": SERVICE, "grpc_method": method, "grpc_type": kind,
        "grpc_code": code}) or 0.0


def started(method: str, kind: str) -> float:
    return REGISTRY.get_sample_value("kbroker_grpc_server_started_total", {
        "grpc_service": SERVICE, "grpc_method": method, "grpc_type": kind}) or 0.0


def test_server_serves_health_reflection_metrics_and_counts_calls():
    async def main() -> None:
        servicer = Counting()
        server, port, _ = await create_server("test", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, servicer)])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            for name in ("", SERVICE):
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=name))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

            stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            listed = {s.name async for answer in stream
                      for s in answer.list_services_response.service}
            assert {SERVICE, "kbroker.metrics.v1.Metrics", "grpc.health.v1.Health"} <= listed

            unary_before = handled("CheckAndComplete", "unary")
            stream_before = handled("ReportProgress", "client_stream")
            started_before = started("ReportProgress", "client_stream")
            stub = purgatory_pb2_grpc.PurgatoryStub(channel)
            state = purgatory_pb2.KeyState(key="t-0", position=1)
            await stub.CheckAndComplete(purgatory_pb2.CheckAndCompleteRequest(keys=[state]))
            call = stub.ReportProgress()
            for _ in range(3):
                await call.write(purgatory_pb2.CheckAndCompleteRequest(keys=[state]))
            await call.done_writing()
            await call
            assert servicer.reported == 4
            assert handled("CheckAndComplete", "unary") == unary_before + 1
            assert handled("ReportProgress", "client_stream") == stream_before + 1
            assert started("ReportProgress", "client_stream") == started_before + 1

            snapshot = await metrics_pb2_grpc.MetricsStub(channel).Snapshot(
                metrics_pb2.SnapshotRequest(prefixes=["kbroker_grpc_server_handled"]))
            assert [f.name for f in snapshot.families] == ["kbroker_grpc_server_handled"]
            assert any(s.labels.get("grpc_method") == "ReportProgress"
                       for s in snapshot.families[0].samples)
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_allocator_tuning_applies_on_glibc():
    assert tune_allocator() is True


def test_a_service_raises_its_open_file_limit_to_the_hard_one():
    """In a process started with a soft limit of 256 (the service's own start-up step)."""
    script = (
        "import resource\n"
        "from services.common.runtime import raise_open_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "now = raise_open_file_limit()\n"
        "print(now, resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    now, soft, hard = map(int, done.stdout.split())
    assert hard > 256
    assert now == soft == hard


def test_freed_memory_is_released_once_a_delay_after_a_burst(monkeypatch):
    assert release_free_memory() is True  # glibc has malloc_trim
    released: list[float] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        monkeypatch.setattr(runtime, "release_free_memory", lambda: released.append(loop.time()))
        release = FreedMemoryRelease(delay=0.2)
        start = loop.time()
        for _ in range(100):  # connections closing in a burst
            release.soon()
            await asyncio.sleep(0)
        await asyncio.sleep(0.4)
        assert len(released) == 1 and released[0] - start >= 0.19
        release.soon()
        release.cancel()  # the service stopped: nothing more
        await asyncio.sleep(0.3)
        assert len(released) == 1

    asyncio.run(asyncio.wait_for(main(), 10))


def _counter_value(snap: metrics_pb2.MetricsSnapshot, family: str, **labels: str) -> float:
    for f in snap.families:
        if f.name != family:
            continue
        for s in f.samples:
            if s.name == family + "_total" and all(s.labels.get(k) == v
                                                    for k, v in labels.items()):
                return s.value
    return 0.0


def test_metrics_stream_sends_snapshots_with_cursors_and_resumes():
    """The Stream RPC on a real server: snapshots every interval with increasing cursors,
    counters that move between them, and resuming after a cursor of this process (continuation)
    or of another one (reset)."""

    async def main() -> None:
        servicer = Counting()
        server, port, _ = await create_server("test", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, servicer)])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            metrics = metrics_pb2_grpc.MetricsStub(channel)
            work = purgatory_pb2_grpc.PurgatoryStub(channel)
            request = purgatory_pb2.CheckAndCompleteRequest(
                keys=[purgatory_pb2.KeyState(key="t-0", position=1)])
            labels = {"grpc_method": "CheckAndComplete", "grpc_code": "OK"}

            # Intervals long enough for two calls to finish between snapshots on a busy machine.
            stream = metrics.Stream(metrics_pb2.StreamRequest(
                prefixes=["kbroker_grpc_server_handled"], interval_ms=400))
            received = []
            started = asyncio.get_running_loop().time()
            async for snap in stream:
                received.append(snap)
                if len(received) == 3:
                    break
                # Work between snapshots: the next one must show it.
                for _ in range(2):
                    await work.CheckAndComplete(request)
            stream.cancel()
            elapsed = asyncio.get_running_loop().time() - started
            assert elapsed >= 0.79, "three snapshots at 400 ms need two intervals"
            assert {f.name for s in received for f in s.families} == {"kbroker_grpc_server_handled"}
            ids = {s.cursor.process_id for s in received}
            assert len(ids) == 1 and ids.pop()
            sequences = [s.cursor.sequence for s in received]
            assert sequences == sorted(set(sequences)) and sequences[0] > 0
            assert not any(s.reset for s in received)
            counts = [_counter_value(s, "kbroker_grpc_server_handled", **labels) for s in received]
            assert counts[1] == counts[0] + 2 and counts[2] == counts[1] + 2

            # Resume after the last cursor: strictly later, same process, counters carry on.
            last = received[-1]
            await work.CheckAndComplete(request)
            resumed = metrics.Stream(metrics_pb2.StreamRequest(
                prefixes=["kbroker_grpc_server_handled"], interval_ms=100, after=last.cursor))
            first = await anext(aiter(resumed))
            resumed.cancel()
            assert first.cursor.process_id == last.cursor.process_id
            assert first.cursor.sequence > last.cursor.sequence
            assert not first.reset
            assert _counter_value(first, "kbroker_grpc_server_handled", **labels) == counts[2] + 1

            # A cursor of another process (as after a restart): the first snapshot says reset.
            other = metrics_pb2.Cursor(process_id="another-process", sequence=10**9)
            restarted = metrics.Stream(metrics_pb2.StreamRequest(interval_ms=100, after=other))
            snap = await anext(aiter(restarted))
            restarted.cancel()
            assert snap.reset and snap.cursor.process_id != "another-process"

            # A cursor this process never issued is refused.
            ahead = metrics_pb2.Cursor(process_id=last.cursor.process_id, sequence=10**12)
            refused = metrics.Stream(metrics_pb2.StreamRequest(after=ahead))
            try:
                await anext(aiter(refused))
                raise AssertionError("a cursor from the future was accepted")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.OUT_OF_RANGE

            # Snapshot shares the numbering.
            single = await metrics.Snapshot(metrics_pb2.SnapshotRequest(prefixes=["x_none"]))
            assert single.cursor.process_id == last.cursor.process_id
            assert single.cursor.sequence > first.cursor.sequence
            assert single.process_start_ms > 0
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_stream_interval_defaults_and_floor():
    assert stream_interval_seconds(0) == 1.0
    assert stream_interval_seconds(5) == 0.1
    assert stream_interval_seconds(2500) == 2.5


class Failing(purgatory_pb2_grpc.PurgatoryServicer):
    async def CheckAndComplete(self, request, context):
        if request.keys[0].key == "abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused")
        raise RuntimeError("a bug")


def test_failed_calls_are_counted_under_their_code():
    def handled_as(code: str) -> float:
        return handled("CheckAndComplete", "unary", code)

    async def main() -> None:
        server, port, _ = await create_server("test", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, Failing())])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            stub = purgatory_pb2_grpc.PurgatoryStub(channel)
            before = {c: handled_as(c) for c in ("UNKNOWN", "FAILED_PRECONDITION", "OK")}
            for key, expected in (("bug", grpc.StatusCode.UNKNOWN),
                                  ("abort", grpc.StatusCode.FAILED_PRECONDITION),
                                  ("bug", grpc.StatusCode.UNKNOWN)):
                try:
                    await stub.CheckAndComplete(purgatory_pb2.CheckAndCompleteRequest(
                        keys=[purgatory_pb2.KeyState(key=key, position=1)]))
                    raise AssertionError("the call succeeded")
                except grpc.aio.AioRpcError as e:
                    assert e.code() == expected
            assert handled_as("UNKNOWN") - before["UNKNOWN"] == 2
            assert handled_as("FAILED_PRECONDITION") - before["FAILED_PRECONDITION"] == 1
            assert handled_as("OK") == before["OK"]
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_health_watch_streams_status_changes_through_the_metrics_interceptor():
    """Health's Watch writes with context.write instead of yielding: the server metrics
    wrap it as such, and a watcher sees the status and each change."""
    async def main() -> None:
        server, port, health = await create_server("test", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, Counting())])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            call = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=SERVICE))
            first = await asyncio.wait_for(call.read(), 5)
            assert first.status == health_pb2.HealthCheckResponse.SERVING
            await health.set(SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
            second = await asyncio.wait_for(call.read(), 5)
            assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
            call.cancel()
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(main())


def test_a_graceful_stop_ends_health_watches_instead_of_waiting_for_them():
    """An open health watch learns NOT_SERVING and ends when the server enters its graceful
    shutdown, so the stop does not wait its whole grace period for it."""
    async def main() -> None:
        server, port, health = await create_server("purgatory", [ServiceBinding(
            SERVICE, purgatory_pb2_grpc.add_PurgatoryServicer_to_server, Counting())])
        channel = insecure_channel(f"127.0.0.1:{port}")
        try:
            call = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=SERVICE))
            seen = []
            watching = asyncio.Event()

            async def follow() -> None:
                async for reply in call:
                    seen.append(reply.status)
                    watching.set()

            following = asyncio.ensure_future(follow())
            await asyncio.wait_for(watching.wait(), 5)
            await health.enter_graceful_shutdown()
            started = asyncio.get_running_loop().time()
            await server.stop(10)
            assert asyncio.get_running_loop().time() - started < 5
            await asyncio.wait_for(following, 5)
            assert seen == [health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING]
        finally:
            await channel.close()
            await server.stop(0)

    asyncio.run(main())
