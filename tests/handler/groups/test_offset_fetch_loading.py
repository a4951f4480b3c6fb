"""OffsetFetch while the group's partition cannot be read (its leader failing, moving, or
being reloaded here): COORDINATOR_LOAD_IN_PROGRESS, the coordinator error clients retry in
place, in every shape of the answer; NOT_COORDINATOR still at a broker that is not the
coordinator."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from kbroker.kafka.v1 import kafka_pb2 as k
from services.common.errors import ErrorCode
from services.handler.apis.group_offsets import OffsetFetchApi
from services.handler.coordinator.placement import CoordinatorError
from services.handler.request_context import RequestContext

LOADING = ErrorCode.coordinator_load_in_progress.value
NOT_COORDINATOR = ErrorCode.not_coordinator.value


def coordinator(error: int, not_coordinator: int = 0) -> Any:
    async def check(key: str, broker_id: int | None) -> int:
        return not_coordinator

    async def fetch(group_id: str, wanted: Any) -> Any:
        raise CoordinatorError(error, "the leader of __consumer_offsets-3 failed")

    return SimpleNamespace(placement=SimpleNamespace(not_coordinator=check),
                           offsets=SimpleNamespace(fetch=fetch))


def answer(api: OffsetFetchApi, version: int, request: k.OffsetFetchRequest) -> Any:
    context = RequestContext(advertised_host="127.0.0.1", advertised_port=9092,
                             api_version=version, broker_id=1)
    return asyncio.run(api.handle(request, context))


def test_an_unreadable_group_partition_is_a_group_being_loaded() -> None:
    single = k.OffsetFetchRequest(group_id="g", topics=[{"name": "t", "partition_indexes": [0]}])
    for error in (ErrorCode.coordinator_not_available.value, NOT_COORDINATOR):
        api = OffsetFetchApi(coordinator(error))  # type: ignore[arg-type]
        assert answer(api, 7, single).error_code == LOADING
        [partition] = answer(api, 1, single).topics[0].partitions  # before v2: per partition
        assert (partition.error_code, partition.committed_offset) == (LOADING, -1)
        batched = k.OffsetFetchRequest(groups=[{"group_id": "g", "topics_is_null": True}])
        assert [g.error_code for g in answer(api, 8, batched).groups] == [LOADING]


def test_a_broker_that_does_not_coordinate_the_group_still_says_so() -> None:
    api = OffsetFetchApi(coordinator(0, NOT_COORDINATOR))  # type: ignore[arg-type]
    request = k.OffsetFetchRequest(group_id="g", topics=[{"name": "t", "partition_indexes": [0]}])
    assert answer(api, 7, request).error_code == NOT_COORDINATOR
