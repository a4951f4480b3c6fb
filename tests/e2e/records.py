"""The messages end-to-end tests send, and the check that they came back exactly and in order."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

COMPRESSION_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
BASE_TIMESTAMP_MS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class Message:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int


def make_messages(tag: str, count: int, partitions: int) -> list[Message]:
    """Varied messages: keys (some null), values of several sizes (one null), headers, times."""
    out = []
    for i in range(count):
        key = None if i % 7 == 3 else f"{tag}-key-{i}".encode()
        if i == 5:
            value = None
        else:
            value = (f"{tag}-value-{i}-".encode() * (1 + i % 13))[: 10 + (i * 37) % 900]
        headers = tuple((f"h{j}", f"{tag}-{i}-{j}".encode()) for j in range(i % 3))
        out.append(Message(i % partitions, key, value, headers, BASE_TIMESTAMP_MS + i))
    return out


def by_partition(messages: list[Message]) -> dict[int, list[Message]]:
    grouped: dict[int, list[Message]] = defaultdict(list)
    for m in messages:
        grouped[m.partition].append(m)
    return dict(grouped)


def assert_same(sent: list[Message], received: list[Message]) -> None:
    """Everything sent came back exactly once, in order within each partition."""
    want, got = by_partition(sent), by_partition(received)
    assert sorted(got) == sorted(want), f"partitions {sorted(got)} != {sorted(want)}"
    for p in want:
        assert len(got[p]) == len(want[p]), f"partition {p}: {len(got[p])} != {len(want[p])}"
        for i, (w, g) in enumerate(zip(want[p], got[p], strict=True)):
            assert g == w, f"partition {p} message {i}: {g} != {w}"
