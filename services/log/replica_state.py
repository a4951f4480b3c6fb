"""A replica's place in its partition, as the replicator last told it (Kafka's LeaderAndIsr
for one partition): leader or follower, the leader epoch, and whether a leader is alone in the
ISR (then its appends are committed at once).

File ``<topic>-<partition>/replica-state.json`` (UTF-8 JSON, replaced atomically):

    {"version": 1, "role": "leader", "leader_epoch": 3, "in_sync_alone": false}

A replica without the file is a standalone leader with no epoch (-1): created without a
state (before replication existed, or directly, not through the replicator), it stores batches
with the partition leader epoch their writer gave them. On start-up a replica whose state is
replicated (a follower, or a leader with other in-sync replicas) comes back with role
``unknown``: another replica may have been elected meanwhile, so it takes no appends until the
replicator confirms its state; a leader alone in the ISR resumes at once.
"""

from __future__ import annotations

import enum
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from .checkpoint import replace_file

log = logging.getLogger(__name__)

FILE_NAME = "replica-state.json"
VERSION = 1


class Role(enum.Enum):
    UNKNOWN = "unknown"
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaState:
    role: Role = Role.LEADER
    leader_epoch: int = 0
    in_sync_alone: bool = True

    @property
    def commits_alone(self) -> bool:
        """A leader whose appends are committed without waiting for followers."""
        return self.role is Role.LEADER and self.in_sync_alone

    @property
    def replicated(self) -> bool:
        return not self.commits_alone


NO_EPOCH = -1
STANDALONE = ReplicaState(leader_epoch=NO_EPOCH)


def read(directory: Path) -> ReplicaState | None:
    """The stored state, None if there is none (or it is unreadable, which is reported)."""
    path = directory / FILE_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document["version"] != VERSION:
            raise ValueError(f"version {document['version']}")
        return ReplicaState(role=Role(document["role"]),
                            leader_epoch=int(document["leader_epoch"]),
                            in_sync_alone=bool(document["in_sync_alone"]))
    except FileNotFoundError:
        return None
    except (OSError, KeyError, TypeError, ValueError) as exc:
        log.error("%s: unreadable replica state (%s); ignored", path, exc)
        return None


def write(directory: Path, state: ReplicaState) -> None:
    replace_file(directory / FILE_NAME, json.dumps(
        {"version": VERSION, "role": state.role.value, "leader_epoch": state.leader_epoch,
         "in_sync_alone": state.in_sync_alone}))


def restored(stored: ReplicaState | None) -> ReplicaState:
    """The state a replica starts with after loading ``stored`` (see the module docstring)."""
    if stored is None:
        return STANDALONE
    if stored.commits_alone:
        return stored
    return ReplicaState(role=Role.UNKNOWN, leader_epoch=stored.leader_epoch, in_sync_alone=False)
