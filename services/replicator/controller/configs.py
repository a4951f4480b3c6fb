"""Topic configs (the topic part of Kafka's ConfigurationControlManager): AlterConfigs and
IncrementalAlterConfigs, validated by :mod:`~services.replicator.topic_rules`.

Changes commit first (in the exclusive section), then go to every live log node holding a
replica of the topic (one call per node) before the caller is answered. A node that could not
take them is brought up to date (all its replicas' configs) after a later node check, as is
every node that comes back to life; until then it applies the configs it had.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import Counter
from collections.abc import Iterable, Sequence

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError

from ..log_nodes import LogNodes, failure_message, partition_specs
from ..metadata import NodeId, TopicName, TopicRegistration
from ..topic_rules import apply_config_changes
from .core import ControllerCore
from .topics import created, failed, not_saved

log = logging.getLogger(__name__)


class ConfigControlManager:
    def __init__(self, core: ControllerCore, client: LogNodes) -> None:
        self._core = core
        self._client = client
        # Nodes whose replicas may carry outdated configs (a push failed, or the node was
        # down).
        self._stale: set[NodeId] = set()

    async def alter_configs(
        self, request: pb.AlterTopicConfigsRequest
    ) -> pb.AlterTopicConfigsResponse:
        """Apply config changes to topics; one result per entry, in order, carrying the
        topic's configs after the change."""
        results = await self._core.exclusive(
            lambda: self._alter_configs(request.topics, request.validate_only))
        return pb.AlterTopicConfigsResponse(topics=results)

    async def _alter_configs(
        self, requests: Sequence[pb.TopicConfigChanges], validate_only: bool
    ) -> list[pb.TopicResult]:
        image = self._core.image
        occurrences = Counter(r.topic for r in requests)
        results: list[pb.TopicResult] = []
        changed: dict[TopicName, TopicRegistration] = {}
        for request in requests:
            topic = image.topics.get(TopicName(request.topic))
            try:
                if occurrences[request.topic] > 1:
                    raise KafkaError(ErrorCode.invalid_request,
                                     "Duplicate topic in the request.")
                if topic is None:
                    raise KafkaError(ErrorCode.unknown_topic_or_partition,
                                     f"The topic '{request.topic}' does not exist.")
                configs = apply_config_changes(topic.configs, request.changes,
                                               replace=request.replace)
            except KafkaError as e:
                results.append(failed(request.topic, e))
                continue
            updated = dataclasses.replace(topic, configs=configs)
            results.append(created(updated))
            if configs != dict(topic.configs):
                changed[updated.name] = updated
        if validate_only or not changed:
            return results
        try:
            await self._core.commit(lambda current: (current.with_topics(added=[
                dataclasses.replace(current.topics[name], configs=t.configs)
                for name, t in changed.items() if name in current.topics]), None))
        except OSError as e:
            log.exception("could not save changed topic configs")
            return [failed(r.name, not_saved(e)) if r.name in changed else r for r in results]
        for topic in changed.values():
            log.info("topic %s configs are now %s", topic.name, dict(topic.configs))
        await self._push(list(changed.values()), self._core.image.live_node_ids)
        return results

    def mark_stale(self, nodes: Iterable[NodeId]) -> None:
        """``nodes`` may have missed config changes (they were down)."""
        self._stale.update(nodes)

    async def resync(self) -> None:
        """Push every topic's configs to the live nodes marked stale. Call in the exclusive
        section."""
        nodes = self._stale & set(self._core.image.live_node_ids)
        if nodes:
            self._stale -= nodes
            await self._push(list(self._core.image.topics.values()), nodes)

    async def _push(self, topics: Sequence[TopicRegistration], nodes: Iterable[NodeId]) -> None:
        """Send the configs of ``topics`` to those of ``nodes`` holding their replicas; nodes
        that fail are marked stale. Per-replica failures (a replica the node does not have)
        are logged only: the configs reach it when it is created."""
        specs = partition_specs(topics, nodes, with_state=False)
        outcomes = await asyncio.gather(
            *(self._client.update_configs(n, s) for n, s in specs.items()), return_exceptions=True)
        for node, outcome in zip(specs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("log node %d: config update deferred: %s", node, outcome)
                self._stale.add(node)
                continue
            self._stale.discard(node)
            for f in outcome:
                log.warning("log node %d: could not update the configs of %s-%d: %s", node,
                            f.topic, f.partition, failure_message(f))
