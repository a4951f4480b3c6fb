"""The Kafka APIs this broker speaks and the version range of each: the single source of truth
for what ApiVersions advertises, what the frontend accepts, and which handler RPC serves an API.

A request of an API missing here, or of a version outside its range, is not decodable and closes
the connection (ApiVersions excepted: KIP-511 asks for an UNSUPPORTED_VERSION answer instead).
"""

from __future__ import annotations

from dataclasses import dataclass

from kio.schema.index import api_key_map


@dataclass(frozen=True, slots=True)
class SupportedApi:
    """One Kafka API: its key, the versions accepted, and the handler RPC that serves it.

    ``retry_safe`` says whether the request may be sent to another handler after one failed
    mid-request: true for APIs that only read, and for group APIs whose second run finds the
    first one's effect and does nothing more (every group change is a conditional write
    computed on fresh state); false for those whose effect could be doubled or undone, or
    whose answer would change (an OffsetCommit retried after the client moved on could put an
    older offset back; a JoinGroup without a member id would add a second member; a repeated
    LeaveGroup or DeleteGroups answers UNKNOWN_MEMBER_ID or GROUP_ID_NOT_FOUND).
    """

    key: int
    name: str
    min_version: int
    max_version: int
    rpc: str | None
    retry_safe: bool

    @property
    def schema_name(self) -> str:
        """kio's name of the API (``metadata``), which indexes its schemas."""
        return api_key_map[self.key]

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


API_VERSIONS_KEY = 18

# rpc None: answered by the frontend itself.
SUPPORTED_APIS: dict[int, SupportedApi] = {
    api.key: api
    for api in (
        SupportedApi(0, "Produce", 3, 11, "Produce", retry_safe=False),
        SupportedApi(1, "Fetch", 4, 15, "Fetch", retry_safe=True),
        SupportedApi(2, "ListOffsets", 1, 8, "ListOffsets", retry_safe=True),
        SupportedApi(3, "Metadata", 0, 12, "Metadata", retry_safe=True),
        SupportedApi(8, "OffsetCommit", 2, 9, "OffsetCommit", retry_safe=False),
        SupportedApi(9, "OffsetFetch", 1, 9, "OffsetFetch", retry_safe=True),
        SupportedApi(10, "FindCoordinator", 0, 6, "FindCoordinator", retry_safe=True),
        SupportedApi(11, "JoinGroup", 0, 9, "JoinGroup", retry_safe=False),
        # Re-arms a session timer; at most ends an overdue phase, which a retry finds done.
        SupportedApi(12, "Heartbeat", 0, 4, "Heartbeat", retry_safe=True),
        SupportedApi(13, "LeaveGroup", 0, 5, "LeaveGroup", retry_safe=False),
        # The leader's assignment is stored once; a retry of the same generation reads it.
        SupportedApi(14, "SyncGroup", 0, 5, "SyncGroup", retry_safe=True),
        SupportedApi(15, "DescribeGroups", 0, 6, "DescribeGroups", retry_safe=True),
        SupportedApi(16, "ListGroups", 0, 5, "ListGroups", retry_safe=True),
        SupportedApi(API_VERSIONS_KEY, "ApiVersions", 0, 4, None, retry_safe=True),
        SupportedApi(19, "CreateTopics", 2, 7, "CreateTopics", retry_safe=False),
        SupportedApi(20, "DeleteTopics", 1, 6, "DeleteTopics", retry_safe=False),
        SupportedApi(21, "DeleteRecords", 0, 2, "DeleteRecords", retry_safe=False),
        # Retrying elsewhere at worst wastes a producer id.
        SupportedApi(22, "InitProducerId", 0, 5, "InitProducerId", retry_safe=True),
        SupportedApi(23, "OffsetForLeaderEpoch", 2, 4, "OffsetForLeaderEpoch",
                     retry_safe=True),
        SupportedApi(32, "DescribeConfigs", 1, 4, "DescribeConfigs", retry_safe=True),
        SupportedApi(33, "AlterConfigs", 0, 2, "AlterConfigs", retry_safe=False),
        SupportedApi(37, "CreatePartitions", 0, 3, "CreatePartitions", retry_safe=False),
        SupportedApi(42, "DeleteGroups", 0, 2, "DeleteGroups", retry_safe=False),
        SupportedApi(44, "IncrementalAlterConfigs", 0, 1, "IncrementalAlterConfigs",
                     retry_safe=False),
        SupportedApi(47, "OffsetDelete", 0, 0, "OffsetDelete", retry_safe=False),
        SupportedApi(60, "DescribeCluster", 0, 1, "DescribeCluster", retry_safe=True),
    )
}


def supported_versions() -> list[tuple[int, int, int]]:
    """(api key, min version, max version) of every API, in key order."""
    return [(a.key, a.min_version, a.max_version) for a in sorted(
        SUPPORTED_APIS.values(), key=lambda a: a.key)]
