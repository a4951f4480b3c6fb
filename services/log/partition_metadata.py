"""The metadata file of a partition replica directory (Kafka's ``partition.metadata``, plus the
topic's config overrides), from which the node reloads its replicas on restart.

File ``<data_dir>/<topic>-<partition>/partition.metadata.json``, UTF-8 JSON:

    {"version": 1, "topic": "orders", "partition": 0, "topic_id": "<uuid or empty>",
     "configs": {"segment.bytes": "1048576", ...}}

It is replaced atomically (:func:`~services.log.checkpoint.replace_file`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .checkpoint import replace_file

FILE_NAME = "partition.metadata.json"
VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionMetadata:
    topic: str
    partition: int
    topic_id: str = ""
    # The topic's overrides only; defaults come from the node's configuration at load time.
    configs: dict[str, str] = field(default_factory=dict)

    def write(self, directory: Path) -> None:
        replace_file(directory / FILE_NAME, json.dumps(
            {"version": VERSION, "topic": self.topic, "partition": self.partition,
             "topic_id": self.topic_id, "configs": dict(sorted(self.configs.items()))},
            indent=1))

    @classmethod
    def read(cls, directory: Path) -> PartitionMetadata | None:
        """The stored metadata, or None if the file is missing. Raises ValueError if it is
        unreadable."""
        (directory / (FILE_NAME + ".tmp")).unlink(missing_ok=True)
        try:
            raw = (directory / FILE_NAME).read_bytes()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(raw)
            return cls(
                topic=str(data["topic"]),
                partition=int(data["partition"]),
                topic_id=str(data.get("topic_id", "")),
                configs={str(k): str(v) for k, v in data.get("configs", {}).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{directory / FILE_NAME}: unreadable metadata: {exc}") from exc

