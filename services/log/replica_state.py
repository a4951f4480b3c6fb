"""A replica's place in its partition, as the replicator last told it (Kafka's LeaderAndIsr
for one partition): leader or follower, the leader epoch, and whether a leader is alone in the
ISR (then its appends are committed at once). The state is the log service's ``ReplicaState``
message, its topic and partition left unset.

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

import json
import logging
from pathlib import Path

from kbroker.log.v1.log_pb2 import REPLICA_ROLE_FOLLOWER as FOLLOWER
from kbroker.log.v1.log_pb2 import REPLICA_ROLE_LEADER as LEADER
from kbroker.log.v1.log_pb2 import REPLICA_ROLE_UNKNOWN as UNKNOWN
from kbroker.log.v1.log_pb2 import ReplicaState

from .checkpoint import replace_file

log = logging.getLogger(__name__)

FILE_NAME = "replica-state.json"
VERSION = 1
NO_EPOCH = -1
# The roles by their names in the file (and in messages).
ROLE_NAMES = {UNKNOWN: "unknown", LEADER: "leader", FOLLOWER: "follower"}
_ROLES = {name: role for role, name in ROLE_NAMES.items()}


def state(role: int, leader_epoch: int, in_sync_alone: bool = False) -> ReplicaState:
    return ReplicaState(role=role, leader_epoch=leader_epoch, in_sync_alone=in_sync_alone)


def standalone() -> ReplicaState:
    return state(LEADER, NO_EPOCH, in_sync_alone=True)


def commits_alone(replica: ReplicaState) -> bool:
    """Whether this is a leader whose appends are committed without waiting for followers."""
    return replica.role == LEADER and replica.in_sync_alone


def read(directory: Path) -> ReplicaState | None:
    """The stored state, None if there is none (or it is unreadable, which is reported)."""
    path = directory / FILE_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document["version"] != VERSION:
            raise ValueError(f"version {document['version']}")
        return state(_ROLES[document["role"]], int(document["leader_epoch"]),
                     bool(document["in_sync_alone"]))
    except FileNotFoundError:
        return None
    except (OSError, KeyError, TypeError, ValueError) as exc:
        log.error("%s: unreadable replica state (%s); ignored", path, exc)
        return None


def write(directory: Path, replica: ReplicaState) -> None:
    replace_file(directory / FILE_NAME, json.dumps(
        {"version": VERSION, "role": ROLE_NAMES[replica.role], "leader_epoch": replica.leader_epoch,
         "in_sync_alone": replica.in_sync_alone}))


def restored(stored: ReplicaState | None) -> ReplicaState:
    """The state a replica starts with after loading ``stored`` (see the module docstring)."""
    if stored is None:
        return standalone()
    if commits_alone(stored):
        return stored
    return state(UNKNOWN, stored.leader_epoch)
