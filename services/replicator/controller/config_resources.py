"""Dynamic configs of config resources other than topics (the rest of Kafka's
ConfigurationControlManager): BROKER resources, cluster-wide (name "") or per log node (its
id), through AlterConfigs and IncrementalAlterConfigs. Stored in the cluster metadata and
published with it; the replication role sends each log node its rates
(:mod:`..replication.settings`), which throttle its fetching and serving.

The dynamic broker configs are the replication throttle rates (bytes/s, Kafka's defaults
unlimited): ``leader.replication.throttled.rate`` bounds what a leader's throttled replicas
send, ``follower.replication.throttled.rate`` what a follower's throttled replicas receive;
which replicas are throttled is each topic's ``leader/follower.replication.throttled.replicas``.
Any other broker config is static: INVALID_REQUEST, as Kafka answers. A bad value is
INVALID_CONFIG, APPEND/SUBTRACT (these are not lists) too; an unknown log node id
INVALID_REQUEST.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence

from kbroker.replicator.v1 import replicator_pb2 as pb
from services.common.errors import ErrorCode, KafkaError

from ..metadata import ConfigResourceKey, MetadataImage
from .core import ControllerCore

log = logging.getLogger(__name__)

BROKER = 4
LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
UNLIMITED = (1 << 63) - 1  # Kafka's Long.MAX_VALUE default
DYNAMIC_BROKER_CONFIGS = (LEADER_RATE, FOLLOWER_RATE)


def _validated(name: str, value: str) -> str:
    try:
        number = int(value.strip())
    except ValueError:
        raise KafkaError(ErrorCode.invalid_config,
                         f"Invalid value {value} for configuration {name}: Not a number of type "
                         f"LONG") from None
    if not 0 <= number <= UNLIMITED:
        raise KafkaError(ErrorCode.invalid_config,
                         f"Invalid value {value} for configuration {name}: Value must be at "
                         f"least 0")
    return str(number)


def changed_configs(current: Mapping[str, str], request: pb.ConfigResourceChanges,
                    nodes: Collection[int]) -> dict[str, str]:
    """A broker resource's configs after ``request``. Raises KafkaError."""
    if request.resource_type != BROKER:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Unsupported resource type {request.resource_type}")
    if request.name:
        try:
            node = int(request.name)
        except ValueError:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Broker id must be an integer, but it is: {request.name}") from None
        if node not in nodes:
            raise KafkaError(ErrorCode.invalid_request,
                             f"Unexpected broker id, expected one of {sorted(nodes)} or empty "
                             f"string, but received {request.name}")
    static = sorted({c.name for c in request.changes} - set(DYNAMIC_BROKER_CONFIGS))
    if static:
        raise KafkaError(ErrorCode.invalid_request,
                         f"Cannot update these configs dynamically: {static}")
    configs = {} if request.replace else dict(current)
    for change in request.changes:
        if change.operation == pb.ConfigChange.SET:
            configs[change.name] = _validated(change.name, change.value)
        elif change.operation == pb.ConfigChange.DELETE:
            configs.pop(change.name, None)
        else:
            raise KafkaError(ErrorCode.invalid_config,
                             f"Config value append or subtract is not allowed for config key: "
                             f"{change.name}")
    return configs


def alter(image: MetadataImage, requests: Sequence[pb.ConfigResourceChanges]
          ) -> tuple[dict[ConfigResourceKey, dict[str, str]], list[pb.ConfigResourceResult]]:
    """The resources whose configs change, and one result per request."""
    nodes = [n.node_id for n in image.log_nodes]
    seen: set[ConfigResourceKey] = set()
    changed: dict[ConfigResourceKey, dict[str, str]] = {}
    results = []
    for request in requests:
        key = (request.resource_type, request.name)
        try:
            if key in seen:
                raise KafkaError(ErrorCode.invalid_request, "Error due to duplicate resource.")
            seen.add(key)
            configs = changed_configs(image.config_resources.get(key, {}), request, nodes)
        except KafkaError as e:
            results.append(pb.ConfigResourceResult(error_code=e.errno,
                                                   error_message=e.message or ""))
            continue
        results.append(pb.ConfigResourceResult())
        if configs != dict(image.config_resources.get(key, {})):
            changed[key] = configs
    return changed, results


def with_configs(image: MetadataImage, changed: Mapping[ConfigResourceKey, Mapping[str, str]]
                 ) -> MetadataImage:
    resources = {**image.config_resources, **changed}
    return image.replace(config_resources={k: v for k, v in resources.items() if v})


def broker_config(image: MetadataImage, node: int, name: str) -> str | None:
    """A dynamic broker config as it applies to log node ``node``: its own value, else the
    cluster-wide one, else None."""
    own = image.config_resources.get((BROKER, str(node)), {})
    if name in own:
        return own[name]
    return image.config_resources.get((BROKER, ""), {}).get(name)


class ConfigResourceControlManager:
    def __init__(self, core: ControllerCore) -> None:
        self._core = core

    async def alter(self, request: pb.AlterConfigResourcesRequest
                    ) -> pb.AlterConfigResourcesResponse:
        def change(current: MetadataImage) -> tuple[MetadataImage, tuple[
                dict[ConfigResourceKey, dict[str, str]], list[pb.ConfigResourceResult]]]:
            changed, results = alter(current, request.resources)
            if request.validate_only or not changed:
                return current, (changed, results)
            return with_configs(current, changed), (changed, results)

        try:
            changed, results = await self._core.commit(change)
        except OSError:
            log.exception("could not save changed broker configs")
            failed = pb.ConfigResourceResult(error_code=ErrorCode.unknown_server_error.value,
                                             error_message="could not save the cluster metadata")
            return pb.AlterConfigResourcesResponse(results=[
                failed if not result.error_code else result
                for result in alter(self._core.image, request.resources)[1]])
        for (_kind, name), configs in changed.items():
            log.info("%s configs are now %s", f"broker {name}" if name else
                     "cluster-wide broker", configs)
        return pb.AlterConfigResourcesResponse(results=results)
