"""What every consumer group transition works with: Kafka's ``group.consumer.*`` settings
(:class:`ConsumerGroupConfig`), the cluster's topics as the handler's metadata has them
(:class:`TopicImage`), and the error a transition raises with Kafka's code
(:class:`GroupError`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .consumer_group import SubscribedTopic

MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")


class GroupError(Exception):
    """A Kafka error to answer, with its message."""

    def __init__(self, code: int, message: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerGroupConfig:
    """Kafka's group.consumer.* settings."""

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    max_size: int = 2**31 - 1
    assignors: tuple[str, ...] = ("uniform", "range")
    migration_policy: str = "bidirectional"
    # group.max.size: a classic group larger than this cannot be made of a consumer group.
    classic_max_size: int = 2**31 - 1

    @property
    def default_assignor(self) -> str:
        return self.assignors[0]

    @property
    def upgrades(self) -> bool:
        return self.migration_policy in ("upgrade", "bidirectional")

    @property
    def downgrades(self) -> bool:
        return self.migration_policy in ("downgrade", "bidirectional")


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicImage:
    """The topics of the cluster as the handler's metadata has them: name -> id and
    partition count; ``version`` orders images (the metadata epoch)."""

    topics: Mapping[str, SubscribedTopic] = field(default_factory=dict)
    version: int = 0

    def names_by_id(self) -> dict[str, str]:
        return {t.topic_id: name for name, t in self.topics.items()}
