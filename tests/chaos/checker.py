"""The chaos checker: what producers were told was stored, against what consumers read.

A history holds, with times on one monotonic clock (seconds):

- every acknowledged record: producer, its sequence number (one counter per producer, over
  all partitions), topic, partition and the offset the acknowledgement carried;
- every record a consumer was shown: consumer, topic, partition, offset, and the producer and
  sequence number the record carries;
- every client's span (when it started, when it stopped being expected to make progress) and
  the times it made progress;
- every injected fault: its kind, its target, when it was injected and when it was healed.

:func:`check` judges it as Kafka's guarantees for an idempotent, acks=all producer promise:

- lost: an acknowledged record that no consumer ever read (must be none);
- misplaced: an acknowledged record read at another offset than acknowledged;
- duplicates: one (producer, sequence) stored at two offsets (none for idempotent producers);
- reordered: within a partition, a producer's record stored after one it sent later;
- divergent: one offset read with two different records (someone read past the high watermark
  and the log was cut back);
- missed by the group: acknowledged records the consumer group never delivered;
- stuck: a client that made no progress for longer than the allowed gap inside its span;
- stalled: a partition without an acknowledgement for longer than that gap while the
  producers ran (a producer stuck on one partition still progresses on the others);
- ack pause per fault: around each fault, the longest time any partition went without an
  acknowledgement (the interval from the last acknowledgement before to the first after).

Pure: no clients, no processes; the workload (:mod:`tests.chaos.workload`) records, the
injector (:mod:`tests.chaos.faults`) adds faults. Not thread-safe: record under a lock.
"""

from __future__ import annotations

import bisect
import dataclasses
import statistics
from collections import defaultdict

TopicPartition = tuple[str, int]
RecordId = tuple[str, int]  # (producer, sequence)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Acked:
    """A record a producer was told is stored."""

    producer: str
    sequence: int
    topic: str
    partition: int
    # None: the acknowledgement carried no offset (the client reports -1001).
    offset: int | None
    at: float

    @property
    def record(self) -> RecordId:
        return (self.producer, self.sequence)

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Read:
    """A record a consumer was shown."""

    consumer: str
    producer: str
    sequence: int
    topic: str
    partition: int
    offset: int
    at: float
    # Whether the consumer belongs to the consumer group under test (False: a verifying reader
    # that reads every partition from the start at the end).
    group: bool = True

    @property
    def record(self) -> RecordId:
        return (self.producer, self.sequence)

    @property
    def topic_partition(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclasses.dataclass(slots=True, kw_only=True)
class Fault:
    """One injected fault: ``kind`` (kill, pause, restart, full-disk, partition) of ``target``
    (a service name), injected at ``start`` and healed at ``end`` (the service healthy again,
    the disk freed, the link restored; None: not healed)."""

    kind: str
    target: str
    start: float
    end: float | None = None

    @property
    def label(self) -> str:
        return f"{self.kind} {self.target}"


@dataclasses.dataclass(slots=True, kw_only=True)
class ClientSpan:
    """A client that is expected to progress from ``start`` to ``end`` (None: until the end of
    the history); ``progress`` holds the times it did (an acknowledgement, a record read)."""

    name: str
    start: float
    end: float | None = None
    progress: list[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class History:
    acked: list[Acked] = dataclasses.field(default_factory=list)
    reads: list[Read] = dataclasses.field(default_factory=list)
    faults: list[Fault] = dataclasses.field(default_factory=list)
    clients: dict[str, ClientSpan] = dataclasses.field(default_factory=dict)
    # Deliveries that failed (the producer's application saw an error), as text.
    failed: list[str] = dataclasses.field(default_factory=list)
    end: float | None = None


# ------------------------------------------------------------------------------ findings


@dataclasses.dataclass(frozen=True, slots=True)
class Duplicate:
    record: RecordId
    topic_partition: TopicPartition
    offsets: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Reordering:
    """In ``topic_partition``, ``producer``'s sequence ``later`` is stored at ``later_offset``,
    before its ``earlier`` sequence at ``earlier_offset``."""

    topic_partition: TopicPartition
    producer: str
    earlier: int
    earlier_offset: int
    later: int
    later_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Misplaced:
    acked: Acked
    read_offsets: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Divergence:
    topic_partition: TopicPartition
    offset: int
    records: tuple[RecordId, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Stuck:
    client: str
    since: float
    until: float

    @property
    def seconds(self) -> float:
        return self.until - self.since


@dataclasses.dataclass(frozen=True, slots=True)
class Stall:
    topic_partition: TopicPartition
    since: float
    until: float

    @property
    def seconds(self) -> float:
        return self.until - self.since


@dataclasses.dataclass(frozen=True, slots=True)
class AckPause:
    """Around ``fault``: the longest interval without an acknowledgement on one partition,
    ``seconds`` long, on ``topic_partition``. ``open_ended``: no acknowledgement came on that
    partition before the window closed (the pause is at least this long)."""

    fault: Fault
    seconds: float
    topic_partition: TopicPartition | None
    open_ended: bool = False


@dataclasses.dataclass(slots=True)
class Report:
    acknowledged: int
    read: int
    lost: list[Acked]
    misplaced: list[Misplaced]
    duplicates: list[Duplicate]
    reordered: list[Reordering]
    divergent: list[Divergence]
    missed_by_group: list[Acked]
    stuck: list[Stuck]
    stalled: list[Stall]
    pauses: list[AckPause]
    failed_deliveries: int
    # Acknowledgements without an offset (not a lost record; Kafka always returns one).
    without_offset: int = 0

    @property
    def ok(self) -> bool:
        """No finding that breaks a guarantee (pauses are measurements, not findings)."""
        return not (self.lost or self.misplaced or self.duplicates or self.reordered
                    or self.divergent or self.missed_by_group or self.stuck or self.stalled)

    def totals(self) -> dict[str, int]:
        return {"acknowledged": self.acknowledged, "read": self.read, "lost": len(self.lost),
                "misplaced": len(self.misplaced), "duplicates": len(self.duplicates),
                "reordered": len(self.reordered), "divergent": len(self.divergent),
                "missed_by_group": len(self.missed_by_group), "stuck": len(self.stuck),
                "stalled": len(self.stalled),
                "failed_deliveries": self.failed_deliveries,
                "without_offset": self.without_offset, "faults": len(self.pauses)}

    def pauses_by_kind(self) -> dict[str, dict[str, float | int]]:
        """Per fault kind and target role (``kill log``, ``pause handler``): how many, and the
        ack pause's p50 and max in seconds."""
        by_kind: dict[str, list[float]] = defaultdict(list)
        for pause in self.pauses:
            role = pause.fault.target.split("-")[0]
            by_kind[f"{pause.fault.kind} {role}"].append(pause.seconds)
        return {kind: {"faults": len(values), "p50_s": round(statistics.median(values), 3),
                       "max_s": round(max(values), 3)}
                for kind, values in sorted(by_kind.items())}

    def describe(self, limit: int = 5) -> str:
        """The findings as lines an operator reads (at most ``limit`` examples of each)."""
        lines = [" ".join(f"{k}={v}" for k, v in self.totals().items())]
        for name in ("lost", "misplaced", "duplicates", "reordered", "divergent",
                     "missed_by_group", "stuck", "stalled"):
            found = getattr(self, name)
            lines.extend(f"  {name}: {item}" for item in found[:limit])
        lines.extend(f"  ack pause {p.fault.label} at {p.fault.start:.1f}: {p.seconds:.2f}s"
                     f"{'+' if p.open_ended else ''} on {p.topic_partition}"
                     for p in self.pauses)
        return "\n".join(lines)


# ------------------------------------------------------------------------------- checking


def check(history: History, *, stuck_after: float) -> Report:
    """Judge ``history``; a client is stuck when it went ``stuck_after`` seconds without
    progress inside its span."""
    stored = _stored_records(history)
    read_at: dict[RecordId, set[tuple[TopicPartition, int]]] = defaultdict(set)
    for (tp, offset), records in stored.items():
        for record in records:
            read_at[record].add((tp, offset))
    group_read = {r.record for r in history.reads if r.group}

    lost, misplaced, missed = [], [], []
    for acked in history.acked:
        places = read_at.get(acked.record)
        if not places:
            lost.append(acked)
            continue
        if acked.offset is not None and (acked.topic_partition, acked.offset) not in places:
            misplaced.append(Misplaced(acked, tuple(sorted(o for _, o in places))))
        if acked.record not in group_read:
            missed.append(acked)

    duplicates = [
        Duplicate(record, places_tp[0][0], tuple(sorted(o for _, o in places_tp)))
        for record, places in read_at.items() if len(places) > 1
        for places_tp in [sorted(places)]]
    divergent = [Divergence(tp, offset, tuple(sorted(records)))
                 for (tp, offset), records in sorted(stored.items()) if len(records) > 1]
    return Report(
        acknowledged=len(history.acked), read=len(history.reads), lost=lost,
        misplaced=misplaced, duplicates=duplicates, reordered=_reorderings(history, stored),
        divergent=divergent, missed_by_group=missed,
        stuck=stuck_clients(history, stuck_after),
        stalled=stalled_partitions(history, stuck_after), pauses=ack_pauses(history),
        failed_deliveries=len(history.failed),
        without_offset=sum(1 for a in history.acked if a.offset is None))


def _stored_records(history: History) -> dict[tuple[TopicPartition, int], set[RecordId]]:
    """What each offset was read as (more than one record: a divergent log)."""
    stored: dict[tuple[TopicPartition, int], set[RecordId]] = defaultdict(set)
    for read in history.reads:
        stored[(read.topic_partition, read.offset)].add(read.record)
    return stored


def _reorderings(history: History, stored: dict[tuple[TopicPartition, int], set[RecordId]]
                 ) -> list[Reordering]:
    """Per partition and producer, sequences must grow with offsets, in what was read and in
    what was acknowledged (an equal sequence twice is a duplicate, not a reordering)."""
    placed: dict[TopicPartition, dict[int, set[RecordId]]] = defaultdict(lambda: defaultdict(set))
    for (tp, offset), records in stored.items():
        placed[tp][offset] |= records
    for acked in history.acked:
        if acked.offset is not None:
            placed[acked.topic_partition][acked.offset].add(acked.record)
    found = []
    for tp, offsets in sorted(placed.items()):
        last: dict[str, tuple[int, int]] = {}  # producer -> (highest sequence, its offset)
        seen: set[RecordId] = set()
        for offset in sorted(offsets):
            for producer, sequence in sorted(offsets[offset]):
                if (producer, sequence) in seen:
                    continue  # stored again further on: a duplicate
                seen.add((producer, sequence))
                previous = last.get(producer)
                if previous is not None and sequence < previous[0]:
                    found.append(Reordering(tp, producer, sequence, offset, previous[0],
                                            previous[1]))
                    continue
                last[producer] = (sequence, offset)
    return found


def stuck_clients(history: History, stuck_after: float) -> list[Stuck]:
    """Every interval longer than ``stuck_after`` in which a client made no progress, counted
    from its span's start to its span's end (the end of the history for an open span)."""
    end_of_history = history.end if history.end is not None else _last_time(history)
    found = []
    for client in history.clients.values():
        end = client.end if client.end is not None else end_of_history
        times = [client.start, *sorted(t for t in client.progress if client.start <= t <= end),
                 end]
        found.extend(Stuck(client.name, a, b) for a, b in zip(times, times[1:], strict=False)
                     if b - a > stuck_after)
    return found


def stalled_partitions(history: History, stuck_after: float) -> list[Stall]:
    """Every interval longer than ``stuck_after`` without an acknowledgement on a partition
    that was acknowledged at all, while every producer ran (from the latest producer start to
    the earliest producer end)."""
    producers = [history.clients[p] for p in {a.producer for a in history.acked}
                 if p in history.clients]
    if not producers:
        return []
    end_of_history = history.end if history.end is not None else _last_time(history)
    start = max(c.start for c in producers)
    end = min(c.end if c.end is not None else end_of_history for c in producers)
    acks: dict[TopicPartition, list[float]] = defaultdict(list)
    for acked in history.acked:
        acks[acked.topic_partition].append(acked.at)
    found = []
    for tp, times in sorted(acks.items()):
        inside = [start, *sorted(t for t in times if start <= t <= end), end]
        found.extend(Stall(tp, a, b) for a, b in zip(inside, inside[1:], strict=False)
                     if b - a > stuck_after)
    return found


def _last_time(history: History) -> float:
    times = [a.at for a in history.acked] + [r.at for r in history.reads]
    return max(times, default=0.0)


def ack_pauses(history: History) -> list[AckPause]:
    """Per fault, the longest acknowledgement gap on any partition that ended in the fault's
    window: after its injection, by the next fault's injection (or the end of the
    history)."""
    acks: dict[TopicPartition, list[float]] = defaultdict(list)
    for acked in history.acked:
        acks[acked.topic_partition].append(acked.at)
    for times in acks.values():
        times.sort()
    faults = sorted(history.faults, key=lambda f: f.start)
    end_of_history = history.end if history.end is not None else _last_time(history)
    pauses = []
    for i, fault in enumerate(faults):
        window_end = faults[i + 1].start if i + 1 < len(faults) else end_of_history
        best = AckPause(fault, 0.0, None)
        for tp, times in sorted(acks.items()):
            seconds, open_ended = _longest_gap(times, fault.start, window_end)
            if seconds > best.seconds:
                best = AckPause(fault, seconds, tp, open_ended)
        pauses.append(best)
    return pauses


def _longest_gap(times: list[float], start: float, end: float) -> tuple[float, bool]:
    """The longest interval between consecutive ``times`` (sorted) that ends after ``start``
    and by ``end`` (an interval belongs to the last fault injected before it ended); when
    nothing comes after ``start``, the interval from the last time before it to ``end``
    (open-ended)."""
    first_after = bisect.bisect_right(times, start)
    if first_after == 0:
        return 0.0, False  # nothing acknowledged on this partition before the fault
    if first_after == len(times):
        return max(0.0, end - times[-1]), True
    longest = 0.0
    i = first_after
    while i < len(times) and times[i] <= end:
        longest = max(longest, times[i] - times[i - 1])
        i += 1
    return longest, False


def fault_at(faults: list[Fault], at: float) -> Fault | None:
    """The fault whose window ``at`` falls in: the last one injected at or before ``at``
    (None: before the first)."""
    starts = sorted(faults, key=lambda f: f.start)
    i = bisect.bisect_right([f.start for f in starts], at)
    return starts[i - 1] if i else None


def findings_by_fault(report: Report, history: History) -> dict[str, dict[str, int]]:
    """How many lost, misplaced, duplicated and reordered records were acknowledged in each
    fault's window (``before any fault`` for those before the first)."""
    acked_at = {a.record: a.at for a in history.acked}
    records: dict[str, list[RecordId]] = {
        "lost": [a.record for a in report.lost],
        "misplaced": [m.acked.record for m in report.misplaced],
        "duplicates": [d.record for d in report.duplicates],
        "reordered": [(r.producer, r.earlier) for r in report.reordered],
    }
    found: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for name, ids in records.items():
        for record in ids:
            at = acked_at.get(record)
            fault = fault_at(history.faults, at) if at is not None else None
            label = fault.label if fault is not None else "before any fault"
            found[label][name] += 1
    return {label: dict(counts) for label, counts in found.items()}
