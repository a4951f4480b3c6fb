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
    """One Kafka API: its key, its name (also the name of the handler RPC that serves it,
    unless the frontend answers it itself), and the versions accepted.

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
    retry_safe: bool
    forwarded: bool = True

    @property
    def schema_name(self) -> str:
        """kio's name of the API (``metadata``), which indexes its schemas."""
        return api_key_map[self.key]

    @property
    def rpc(self) -> str | None:
        """The handler RPC serving the API (None: answered by the frontend)."""
        return self.name if self.forwarded else None


API_VERSIONS_KEY = 18

SUPPORTED_APIS: dict[int, SupportedApi] = {
    api.key: api
    for api in (
        SupportedApi(0, "Produce", 3, 12, retry_safe=False),
        SupportedApi(1, "Fetch", 4, 15, retry_safe=True),
        SupportedApi(2, "ListOffsets", 1, 8, retry_safe=True),
        SupportedApi(3, "Metadata", 0, 12, retry_safe=True),
        SupportedApi(8, "OffsetCommit", 2, 9, retry_safe=False),
        SupportedApi(9, "OffsetFetch", 1, 9, retry_safe=True),
        SupportedApi(10, "FindCoordinator", 0, 6, retry_safe=True),
        SupportedApi(11, "JoinGroup", 0, 9, retry_safe=False),
        # Re-arms a session timer; at most ends an overdue phase, which a retry finds done.
        SupportedApi(12, "Heartbeat", 0, 4, retry_safe=True),
        SupportedApi(13, "LeaveGroup", 0, 5, retry_safe=False),
        # The leader's assignment is stored once; a retry of the same generation reads it.
        SupportedApi(14, "SyncGroup", 0, 5, retry_safe=True),
        SupportedApi(15, "DescribeGroups", 0, 6, retry_safe=True),
        SupportedApi(16, "ListGroups", 0, 5, retry_safe=True),
        # SASL authentication happens on the connection, so the frontend answers these.
        SupportedApi(17, "SaslHandshake", 0, 1, retry_safe=True, forwarded=False),
        SupportedApi(API_VERSIONS_KEY, "ApiVersions", 0, 4, retry_safe=True, forwarded=False),
        SupportedApi(19, "CreateTopics", 2, 7, retry_safe=False),
        SupportedApi(20, "DeleteTopics", 1, 6, retry_safe=False),
        SupportedApi(21, "DeleteRecords", 0, 2, retry_safe=False),
        # Retrying elsewhere at worst wastes a producer id.
        SupportedApi(22, "InitProducerId", 0, 5, retry_safe=True),
        SupportedApi(23, "OffsetForLeaderEpoch", 2, 4, retry_safe=True),
        # Adding partitions a transaction already has changes nothing.
        SupportedApi(24, "AddPartitionsToTxn", 0, 5, retry_safe=True),
        SupportedApi(25, "AddOffsetsToTxn", 0, 4, retry_safe=True),
        # A retried commit or abort finds it prepared (CONCURRENT_TRANSACTIONS, which clients
        # retry) or complete (answered as done).
        SupportedApi(26, "EndTxn", 0, 5, retry_safe=True),
        SupportedApi(27, "WriteTxnMarkers", 1, 2, retry_safe=False),
        SupportedApi(28, "TxnOffsetCommit", 0, 5, retry_safe=False),
        SupportedApi(29, "DescribeAcls", 1, 3, retry_safe=True),
        SupportedApi(30, "CreateAcls", 1, 3, retry_safe=False),
        SupportedApi(31, "DeleteAcls", 1, 3, retry_safe=False),
        SupportedApi(32, "DescribeConfigs", 1, 4, retry_safe=True),
        SupportedApi(33, "AlterConfigs", 0, 2, retry_safe=False),
        SupportedApi(35, "DescribeLogDirs", 1, 4, retry_safe=True),
        SupportedApi(36, "SaslAuthenticate", 0, 2, retry_safe=True, forwarded=False),
        SupportedApi(37, "CreatePartitions", 0, 3, retry_safe=False),
        SupportedApi(42, "DeleteGroups", 0, 2, retry_safe=False),
        # A repeated election finds the leader it chose (ELECTION_NOT_NEEDED).
        SupportedApi(43, "ElectLeaders", 0, 2, retry_safe=False),
        SupportedApi(44, "IncrementalAlterConfigs", 0, 1, retry_safe=False),
        # A repeated reassignment to the same target changes nothing more.
        SupportedApi(45, "AlterPartitionReassignments", 0, 1, retry_safe=False),
        SupportedApi(46, "ListPartitionReassignments", 0, 0, retry_safe=True),
        SupportedApi(47, "OffsetDelete", 0, 0, retry_safe=False),
        SupportedApi(48, "DescribeClientQuotas", 0, 1, retry_safe=True),
        SupportedApi(49, "AlterClientQuotas", 0, 1, retry_safe=False),
        SupportedApi(50, "DescribeUserScramCredentials", 0, 0, retry_safe=True),
        SupportedApi(51, "AlterUserScramCredentials", 0, 0, retry_safe=False),
        SupportedApi(60, "DescribeCluster", 0, 1, retry_safe=True),
        SupportedApi(61, "DescribeProducers", 0, 0, retry_safe=True),
        SupportedApi(65, "DescribeTransactions", 0, 0, retry_safe=True),
        SupportedApi(66, "ListTransactions", 0, 1, retry_safe=True),
        # A heartbeat is computed on fresh state: a retry finds the first one's effect (a
        # joining member's retry names the member id the first one took, or joins as new).
        SupportedApi(68, "ConsumerGroupHeartbeat", 0, 1, retry_safe=True),
        SupportedApi(69, "ConsumerGroupDescribe", 0, 1, retry_safe=True),
        # Client telemetry (KIP-714). A repeated subscription request at worst mints an id
        # the client never uses; a repeated push would count its deltas twice.
        SupportedApi(71, "GetTelemetrySubscriptions", 0, 0, retry_safe=True),
        SupportedApi(72, "PushTelemetry", 0, 0, retry_safe=False),
    )
}


def supported_versions() -> list[tuple[int, int, int]]:
    """(api key, min version, max version) of every API, in key order."""
    return [(a.key, a.min_version, a.max_version) for a in sorted(
        SUPPORTED_APIS.values(), key=lambda a: a.key)]
