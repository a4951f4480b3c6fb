"""Replicator processes competing for one Lease (served by tests/replicator/fake_lease_api.py,
reached through a kubeconfig) in front of the same real log node processes: one SERVING, the
other a NOT_SERVING standby refusing calls; killing the active one with SIGKILL makes the
standby take over within the lease duration with the same topics; a replica that can no
longer renew exits 1; SIGTERM releases the Lease.

Each replica has its own data directory: the new active one reads the cluster metadata from
the metadata log on the log nodes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kbroker.replicator.v1 import replicator_pb2 as pb
from kbroker.replicator.v1 import replicator_pb2_grpc
from services.replicator.server import PROCESS_HEALTH, SERVICE_NAME

from .fake_lease_api import FakeLeaseApi
from .test_main import free_port, tail

# Each test runs replicators as processes.
pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
NS, LEASE_NAME = "kbroker", "kb-kbroker-replicator"
LEASE_MS, RENEW_MS, RETRY_MS = 2000, 1500, 200
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class LogNodeProcess:
    entry: str
    proc: asyncio.subprocess.Process
    log: Path

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def start_log_nodes(tmp: Path, count: int) -> list[LogNodeProcess]:
    nodes = []
    for i in range(count):
        address = f"127.0.0.1:{free_port()}"
        log = tmp / f"log-{i}.log"
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.log", "--node-id", str(i),
                "--grpc-address", address, "--data-dir", str(tmp / f"log-{i}"),
                cwd=ROOT, stdout=out, stderr=out)
        nodes.append(LogNodeProcess(f"{i}={address}", proc, log))
    for node in nodes:
        address = node.entry.split("=", 1)[1]
        async with grpc.aio.insecure_channel(address) as channel:
            deadline = time.monotonic() + 30
            while True:
                assert node.proc.returncode is None, tail(node.log)
                try:
                    reply = await health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=1)
                    if reply.status == SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                assert time.monotonic() < deadline, tail(node.log)
                await asyncio.sleep(0.05)
    return nodes


@dataclass
class Replica:
    identity: str
    address: str
    proc: asyncio.subprocess.Process
    log: Path
    channel: grpc.aio.Channel

    async def health(self, service: str = "") -> int | None:
        """The health status of ``service``; None when the server does not answer."""
        try:
            reply = await health_pb2_grpc.HealthStub(self.channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=1)
            return int(reply.status)
        except grpc.aio.AioRpcError:
            return None

    @property
    def stub(self) -> replicator_pb2_grpc.ReplicatorStub:
        return replicator_pb2_grpc.ReplicatorStub(self.channel)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await self.channel.close()


async def launch(api: FakeLeaseApi, tmp: Path, identity: str, nodes: list[LogNodeProcess],
                 lease: str = LEASE_NAME) -> Replica:
    address = f"127.0.0.1:{free_port()}"
    kubeconfig = api.write_kubeconfig(tmp / f"kubeconfig-{identity}", identity, NS)
    log = tmp / f"replicator-{identity}.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "services.replicator", "--grpc-address", address,
            "--data-dir", str(tmp / f"replicator-{identity}"),
            "--log-nodes", ",".join(n.entry for n in nodes), "--node-check-interval-ms", "100",
            "--leader-election-lease", lease, "--leader-election-namespace", NS,
            "--leader-election-identity", identity,
            "--leader-election-lease-duration-ms", str(LEASE_MS),
            "--leader-election-renew-deadline-ms", str(RENEW_MS),
            "--leader-election-retry-period-ms", str(RETRY_MS),
            cwd=ROOT, stdout=out, stderr=out, env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
    return Replica(identity, address, proc, log, grpc.aio.insecure_channel(address))


async def wait_for(replica: Replica, service: str, status: int, limit: float) -> float:
    """Poll until ``service`` reports ``status``; the monotonic time it did."""
    deadline = time.monotonic() + limit
    while True:
        assert replica.proc.returncode is None, tail(replica.log)
        if await replica.health(service) == status:
            return time.monotonic()
        assert time.monotonic() < deadline, f"{replica.identity}: {tail(replica.log)}"
        await asyncio.sleep(0.02)


async def active_and_standby(replicas: list[Replica]) -> tuple[Replica, Replica]:
    for r in replicas:
        await wait_for(r, PROCESS_HEALTH, SERVING, 30)
    deadline = time.monotonic() + 30
    while True:
        states = [await r.health(SERVICE_NAME) for r in replicas]
        if sorted(s or 0 for s in states) == sorted([NOT_SERVING, SERVING]):
            break
        assert time.monotonic() < deadline, states
        await asyncio.sleep(0.05)
    active = replicas[states.index(SERVING)]
    standby = replicas[1 - states.index(SERVING)]
    return active, standby


def test_the_standby_takes_over_within_the_lease_duration_after_a_kill(tmp_path: Path):
    async def scenario() -> None:
        api = FakeLeaseApi().start()
        nodes: list[LogNodeProcess] = []
        replicas: list[Replica] = []
        try:
            nodes = await start_log_nodes(tmp_path, 2)
            replicas = [await launch(api, tmp_path, identity, nodes) for identity in "ab"]
            active, standby = await active_and_standby(replicas)
            assert api.holder(NS, LEASE_NAME) == active.identity
            assert await active.health("") == SERVING
            assert await standby.health("") == NOT_SERVING
            # A standby refuses Replicator calls, so callers retry elsewhere.
            try:
                await standby.stub.GetMetadata(pb.GetMetadataRequest(), timeout=2)
                raise AssertionError("a standby answered GetMetadata")
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.UNAVAILABLE
            created = await active.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                pb.NewTopic(name="orders", num_partitions=3, replication_factor=2)]))
            assert created.topics[0].error_code == 0
            before = await active.stub.GetMetadata(pb.GetMetadataRequest())
            # Still a standby after several lease durations: the active one keeps renewing.
            await asyncio.sleep(LEASE_MS / 1000 * 1.5)
            assert await standby.health(SERVICE_NAME) == NOT_SERVING

            active.proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            await active.proc.wait()
            serving = await wait_for(standby, SERVICE_NAME, SERVING, 30)
            took = serving - killed
            print(f"standby SERVING {took:.2f} s after the active replicator was killed")
            # Lease duration, a retry, and opening the controller.
            assert took <= LEASE_MS / 1000 + 4, took
            assert api.holder(NS, LEASE_NAME) == standby.identity
            assert await standby.health("") == SERVING
            after = await standby.stub.GetMetadata(pb.GetMetadataRequest())
            assert [t.name for t in after.topics] == [t.name for t in before.topics]
            assert [(t.topic_id, len(t.partitions)) for t in after.topics] == [
                (t.topic_id, len(t.partitions)) for t in before.topics]
            again = await standby.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                pb.NewTopic(name="orders", num_partitions=3, replication_factor=2)]))
            assert again.topics[0].error_code == 36  # TOPIC_ALREADY_EXISTS

            # A graceful stop releases the Lease for the next standby and exits 0.
            standby.proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(standby.proc.wait(), 15) == 0, tail(standby.log)
            lease = api.lease(NS, LEASE_NAME)
            assert lease is not None and lease["spec"]["holderIdentity"] == ""
        finally:
            for r in replicas:
                await r.stop()
            for n in nodes:
                await n.stop()
            api.stop()
    asyncio.run(scenario())


def test_a_replicator_that_cannot_renew_stops_serving_and_exits_1(tmp_path: Path):
    async def scenario() -> None:
        api = FakeLeaseApi().start()
        nodes: list[LogNodeProcess] = []
        replica: Replica | None = None
        try:
            nodes = await start_log_nodes(tmp_path, 1)
            replica = await launch(api, tmp_path, "a", nodes)
            await wait_for(replica, SERVICE_NAME, SERVING, 30)
            api.failing.add("a")
            cut = time.monotonic()
            code = await asyncio.wait_for(replica.proc.wait(), RENEW_MS / 1000 + 10)
            exited = time.monotonic() - cut
            assert code == 1, tail(replica.log)
            assert exited <= RENEW_MS / 1000 + 3, exited
            assert "leadership lost" in replica.log.read_text()
            # It never released: it could not reach the API server.
            assert api.holder(NS, LEASE_NAME) == "a"
        finally:
            api.failing.clear()
            if replica is not None:
                await replica.stop()
            for n in nodes:
                await n.stop()
            api.stop()
    asyncio.run(scenario())


def test_a_replicator_deposed_from_the_metadata_log_steps_down_and_lets_the_lease_go(
        tmp_path: Path):
    """Another replicator (electing through another Lease: a misconfiguration) takes over
    the metadata log: the first one's next commit finds itself deposed, so it stops serving,
    releases its Lease and exits 1."""
    async def scenario() -> None:
        api = FakeLeaseApi().start()
        nodes: list[LogNodeProcess] = []
        replicas: list[Replica] = []
        try:
            nodes = await start_log_nodes(tmp_path, 1)
            first = await launch(api, tmp_path, "a", nodes)
            replicas.append(first)
            await wait_for(first, SERVICE_NAME, SERVING, 30)
            rogue = await launch(api, tmp_path, "b", nodes, lease="another-lease")
            replicas.append(rogue)
            await wait_for(rogue, SERVICE_NAME, SERVING, 30)
            # Refused, or cut off as it steps down.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await first.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                    pb.NewTopic(name="t", num_partitions=1, replication_factor=1)]), timeout=10)
            code = await asyncio.wait_for(first.proc.wait(), 15)
            assert code == 1, tail(first.log)
            assert "deposed" in first.log.read_text()
            assert api.holder(NS, LEASE_NAME) == ""
            assert rogue.proc.returncode is None
        finally:
            for r in replicas:
                await r.stop()
            for n in nodes:
                await n.stop()
            api.stop()
    asyncio.run(scenario())


def test_a_single_replicator_deposed_from_the_metadata_log_stops_and_exits_1(tmp_path: Path):
    """Without a Lease (a local cluster), a second replicator started against the same log
    nodes takes the metadata log over: the first one's next commit finds itself deposed, so
    it stops acting and exits 1 instead of failing every commit from then on."""
    async def scenario() -> None:
        nodes: list[LogNodeProcess] = []
        replicas: list[Replica] = []

        async def plain(identity: str) -> Replica:
            address = f"127.0.0.1:{free_port()}"
            log = tmp_path / f"replicator-{identity}.log"
            with log.open("wb") as out:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "services.replicator", "--grpc-address", address,
                    "--data-dir", str(tmp_path / f"replicator-{identity}"),
                    "--log-nodes", ",".join(n.entry for n in nodes),
                    "--node-check-interval-ms", "100", cwd=ROOT, stdout=out, stderr=out)
            replica = Replica(identity, address, proc, log, grpc.aio.insecure_channel(address))
            replicas.append(replica)
            await wait_for(replica, SERVICE_NAME, SERVING, 30)
            return replica

        try:
            nodes = await start_log_nodes(tmp_path, 1)
            first = await plain("a")
            second = await plain("b")
            with contextlib.suppress(grpc.aio.AioRpcError):
                await first.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                    pb.NewTopic(name="t", num_partitions=1, replication_factor=1)]), timeout=10)
            code = await asyncio.wait_for(first.proc.wait(), 15)
            assert code == 1, tail(first.log)
            assert "deposed" in first.log.read_text()
            assert second.proc.returncode is None
            created = await second.stub.CreateTopics(pb.CreateTopicsRequest(topics=[
                pb.NewTopic(name="u", num_partitions=1, replication_factor=1)]), timeout=10)
            assert [t.error_code for t in created.topics] == [0], created
        finally:
            for r in replicas:
                await r.stop()
            for n in nodes:
                await n.stop()
    asyncio.run(scenario())
