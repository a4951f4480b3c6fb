"""A replica's place in its partition, as the replicator last told it (Kafka's LeaderAndIsr
for one partition): leader or follower, the leader epoch, the partition's leader, replicas
and ISR with their partition epoch, and whether a leader is alone in the ISR (then its appends
are committed at once). The state is the log service's ``ReplicaState`` message, its topic and
partition left unset.

File ``<topic>-<partition>/replica-state.json`` (UTF-8 JSON, replaced atomically):

    {"version": 2, "role": "leader", "leader_epoch": 3, "in_sync_alone": false,
     "leader": 1, "replicas": [1, 2, 0], "isr": [1, 2], "partition_epoch": 57}

Version 1 files (written before replicas and ISRs were stored) hold only the first three
fields and are still read. A replica without the file is a standalone leader with no epoch
(-1): created without a state (before replication existed, or directly, not through the
replicator), it stores batches with the partition leader epoch their writer gave them. On
start-up a replica whose state is replicated (a follower, or a leader with other in-sync
replicas) comes back with role ``unknown``: another replica may have been elected meanwhile,
so it takes no appends until the replicator confirms its state; a leader alone in the ISR
resumes at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path

from kbroker.log.v1.log_pb2 import REPLICA_ROLE_FOLLOWER as FOLLOWER
from kbroker.log.v1.log_pb2 import REPLICA_ROLE_LEADER as LEADER
from kbroker.log.v1.log_pb2 import REPLICA_ROLE_UNKNOWN as UNKNOWN
from kbroker.log.v1.log_pb2 import ReplicaState

from .checkpoint import replace_file

log = logging.getLogger(__name__)

FILE_NAME = "replica-state.json"
VERSION = 2
NO_EPOCH = -1
NO_LEADER = -1
# The roles by their names in the file (and in messages).
ROLE_NAMES = {UNKNOWN: "unknown", LEADER: "leader", FOLLOWER: "follower"}
_ROLES = {name: role for role, name in ROLE_NAMES.items()}


def state(role: int, leader_epoch: int, in_sync_alone: bool = False, *,
          leader: int = NO_LEADER, replicas: Iterable[int] = (), isr: Iterable[int] = (),
          partition_epoch: int = 0) -> ReplicaState:
    return ReplicaState(role=role, leader_epoch=leader_epoch, in_sync_alone=in_sync_alone,
                        leader=leader, replicas=list(replicas), isr=list(isr),
                        partition_epoch=partition_epoch)


def copy(replica: ReplicaState, **changes: object) -> ReplicaState:
    """``replica`` without its topic and partition, with ``changes``."""
    fields = {"role": replica.role, "leader_epoch": replica.leader_epoch,
              "in_sync_alone": replica.in_sync_alone, "leader": replica.leader,
              "replicas": tuple(replica.replicas), "isr": tuple(replica.isr),
              "partition_epoch": replica.partition_epoch, **changes}
    return state(fields.pop("role"), fields.pop("leader_epoch"), **fields)  # type: ignore[arg-type]


def standalone() -> ReplicaState:
    return state(LEADER, NO_EPOCH, in_sync_alone=True)


def commits_alone(replica: ReplicaState) -> bool:
    """Whether this is a leader whose appends are committed without waiting for followers."""
    return replica.role == LEADER and replica.in_sync_alone


def same_place(a: ReplicaState, b: ReplicaState) -> bool:
    """Whether two states say the same (the partition epoch aside)."""
    return (a.role, a.leader_epoch, a.in_sync_alone, a.leader, list(a.replicas),
            list(a.isr)) == (b.role, b.leader_epoch, b.in_sync_alone, b.leader,
                             list(b.replicas), list(b.isr))


def read(directory: Path) -> ReplicaState | None:
    """The stored state, None if there is none (or it is unreadable, which is reported)."""
    path = directory / FILE_NAME
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if document["version"] not in (1, VERSION):
            raise ValueError(f"version {document['version']}")
        return state(_ROLES[document["role"]], int(document["leader_epoch"]),
                     bool(document["in_sync_alone"]),
                     leader=int(document.get("leader", NO_LEADER)),
                     replicas=[int(n) for n in document.get("replicas", ())],
                     isr=[int(n) for n in document.get("isr", ())],
                     partition_epoch=int(document.get("partition_epoch", 0)))
    except FileNotFoundError:
        return None
    except (OSError, KeyError, TypeError, ValueError) as exc:
        log.error("%s: unreadable replica state (%s); ignored", path, exc)
        return None


def write(directory: Path, replica: ReplicaState) -> None:
    replace_file(directory / FILE_NAME, json.dumps(
        {"version": VERSION, "role": ROLE_NAMES[replica.role],
         "leader_epoch": replica.leader_epoch, "in_sync_alone": replica.in_sync_alone,
         "leader": replica.leader, "replicas": list(replica.replicas),
         "isr": list(replica.isr), "partition_epoch": replica.partition_epoch}))


def restored(stored: ReplicaState | None) -> ReplicaState:
    """The state a replica starts with after loading ``stored`` (see the module docstring)."""
    if stored is None:
        return standalone()
    if commits_alone(stored):
        return stored
    return copy(stored, role=UNKNOWN)
