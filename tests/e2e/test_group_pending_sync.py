"""A member that gets its JoinGroup answer and never sends SyncGroup is removed at the
rebalance timeout, and the group rebalances without it (Kafka's pending-sync expiry), through
the frontend with raw wire clients: the one that syncs keeps heartbeating and is told to
rebalance; the silent one is gone although its session timeout has not run out."""

from __future__ import annotations

import datetime
import socket
import threading
import time
import uuid

from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v2.request import FindCoordinatorRequest
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.join_group.v3.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.static.primitive import i32

from .wire import encode_request, read_response

REBALANCE_TIMEOUT_MS = 3000
SESSION_TIMEOUT_MS = 60_000
TIMEOUT_S = 30.0


class RawMember:
    """One connection to the group's coordinator, speaking the group protocol by hand."""

    def __init__(self, host: str, port: int, group: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT_S)
        self.group = group
        self.member_id = ""
        self.generation = -1
        self.correlation = 0

    def call(self, request: object) -> object:
        self.correlation += 1
        self.sock.sendall(encode_request(request, self.correlation))
        correlation, response = read_response(self.sock, type(request))
        assert correlation == self.correlation
        return response

    def join(self) -> object:
        response = self.call(JoinGroupRequest(
            group_id=self.group, session_timeout=datetime.timedelta(
                milliseconds=SESSION_TIMEOUT_MS),
            rebalance_timeout=datetime.timedelta(milliseconds=REBALANCE_TIMEOUT_MS),
            member_id=self.member_id, protocol_type="consumer",
            protocols=(JoinGroupRequestProtocol(name="range", metadata=b"m"),)))
        assert response.error_code == ErrorCode.none, response  # type: ignore[attr-defined]
        self.member_id = response.member_id  # type: ignore[attr-defined]
        self.generation = int(response.generation_id)  # type: ignore[attr-defined]
        return response

    def heartbeat(self) -> ErrorCode:
        response = self.call(HeartbeatRequest(
            group_id=self.group, generation_id=i32(self.generation), member_id=self.member_id))
        return response.error_code  # type: ignore[attr-defined]

    def close(self) -> None:
        self.sock.close()


def coordinator_of(bootstrap: str, group: str) -> tuple[str, int]:
    host, port = bootstrap.rsplit(":", 1)
    deadline = time.monotonic() + TIMEOUT_S
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        while True:
            sock.sendall(encode_request(FindCoordinatorRequest(key=group), 1))
            _, response = read_response(sock, FindCoordinatorRequest)
            if response.error_code == ErrorCode.none:  # type: ignore[attr-defined]
                return response.host, int(response.port)  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, response
            time.sleep(0.3)


def test_a_member_that_never_syncs_is_removed_at_the_rebalance_timeout(cluster):
    group = f"never-syncs-{uuid.uuid4().hex[:8]}"
    host, port = coordinator_of(cluster.bootstrap, group)
    leader, silent = RawMember(host, port, group), RawMember(host, port, group)
    try:
        answers: dict[str, object] = {}
        joins = [threading.Thread(target=lambda m=m, n=n: answers.__setitem__(n, m.join()))
                 for n, m in (("leader", leader), ("silent", silent))]
        for thread in joins:
            thread.start()
        for thread in joins:
            thread.join(TIMEOUT_S)
        assert len(answers) == 2, answers
        if answers["leader"].leader != leader.member_id:  # type: ignore[attr-defined]
            leader, silent = silent, leader
        answered = time.monotonic()
        synced = leader.call(SyncGroupRequest(
            group_id=group, generation_id=i32(leader.generation), member_id=leader.member_id,
            assignments=(SyncGroupRequestAssignment(member_id=leader.member_id,
                                                    assignment=b"all"),)))
        assert synced.error_code == ErrorCode.none  # type: ignore[attr-defined]
        # The silent member sends nothing more; the leader heartbeats until told to rejoin.
        code = ErrorCode.none
        while code == ErrorCode.none:
            assert time.monotonic() - answered < TIMEOUT_S, "the pending sync never expired"
            time.sleep(0.3)
            code = leader.heartbeat()
        assert code == ErrorCode.rebalance_in_progress
        assert time.monotonic() - answered >= REBALANCE_TIMEOUT_MS / 1000 - 0.2
        assert silent.heartbeat() == ErrorCode.unknown_member_id
        again = leader.join()
        assert again.generation_id == answers["leader"].generation_id + 1  # type: ignore[attr-defined]
        assert [m.member_id for m in again.members] == [leader.member_id]  # type: ignore[attr-defined]
    finally:
        leader.close()
        silent.close()
