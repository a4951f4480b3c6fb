"""The long fuzzing campaign: the targets of tests/fuzz (Kafka request frames, record batches,
the internal gRPC services of an in-process cluster), with fresh random seeds and many more
examples than ``make test`` runs.

    python bench/fuzz.py [--minutes 10] [--only kafka|records|grpc|<target name part>]
                         [--chunk 2000] [--seed N]

The time is shared among the targets round-robin, in chunks of examples (a tenth of the chunk
for the gRPC targets, whose examples are calls to real servers). A failure is shrunk by
Hypothesis and printed with its minimal input; the campaign goes on with the other targets.
Turn each failure into a fix and a plain regression test (as tests/frontend/
test_malformed_requests.py). Prints a table of examples and failures per target, then one
JSON line with the same numbers; exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.fuzz.grpc_messages import SERVICES, calls, fuzz_cluster  # noqa: E402
from tests.fuzz.kafka_requests import check_request_frame, decoder, valid_frames  # noqa: E402
from tests.fuzz.mutations import mutated  # noqa: E402
from tests.fuzz.record_batches import check_records, recrc, valid_batches  # noqa: E402

GRPC_CHUNK_SHARE = 10


@dataclass
class Target:
    name: str
    strategy: st.SearchStrategy[Any]
    check: Callable[[Any], None]
    chunk_divisor: int = 1
    examples: int = 0
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def offline_targets() -> list[Target]:
    return [
        Target("kafka/arbitrary-bytes", st.binary(max_size=1024), check_request_frame),
        Target("kafka/damaged-requests", mutated(valid_frames(), max_mutations=8),
               check_request_frame),
        Target("records/arbitrary-bytes", st.binary(max_size=1024), check_records),
        Target("records/damaged-batches", mutated(valid_batches(), max_mutations=8),
               check_records),
        Target("records/damaged-batches-correct-crc",
               mutated(valid_batches(), max_mutations=8).map(recrc), check_records),
    ]


@contextlib.contextmanager
def grpc_targets(wanted: Callable[[str], bool]) -> Iterator[list[Target]]:
    names = [f"grpc/{service}" for service in SERVICES]
    if not any(wanted(name) for name in names):
        yield []
        return
    with fuzz_cluster() as cluster:
        def checker(service: str) -> Callable[[Any], None]:
            return lambda call: cluster.check_call(service, *call)

        yield [Target(f"grpc/{service}", calls(service), checker(service), GRPC_CHUNK_SHARE)
               for service in SERVICES]


def run_chunk(target: Target, examples: int, chunk_seed: int) -> None:
    last: list[Any] = [None]

    def counted(value: Any) -> None:
        target.examples += 1
        last[0] = value  # Hypothesis runs the shrunk failing example last
        target.check(value)

    test = seed(chunk_seed)(settings(
        max_examples=examples, deadline=None, database=None, print_blob=True,
        suppress_health_check=list(HealthCheck))(given(target.strategy)(counted)))
    started = time.perf_counter()
    try:
        test()
    except Exception as e:  # noqa: BLE001 - a finding: reported, and the campaign goes on
        notes = "\n".join(getattr(e, "__notes__", []))
        found = f"{type(e).__name__}: {e}\ninput: {last[0]!r}\n{notes}".strip()
        target.failures.append(found)
        print(f"\n=== {target.name}: failure (seed {chunk_seed})\n{found}\n"
              + "".join(traceback.format_exception(e)[-6:]), flush=True)
    finally:
        target.seconds += time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--only", default="", help="run the targets whose name contains this")
    parser.add_argument("--chunk", type=int, default=2000, help="examples per turn")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    def wanted(name: str) -> bool:
        return args.only in name

    decoder()  # compiled once, outside the measured time
    deadline = time.monotonic() + args.minutes * 60
    with grpc_targets(wanted) as served:
        targets = [t for t in offline_targets() + served if wanted(t.name)]
        if not targets:
            parser.error(f"no target matches {args.only!r}")
        while time.monotonic() < deadline:
            for target in targets:
                if time.monotonic() >= deadline:
                    break
                run_chunk(target, max(args.chunk // target.chunk_divisor, 1),
                          rng.getrandbits(32))
    print(f"\n{'target':40} {'examples':>10} {'per s':>8} {'failures':>8}")
    for t in targets:
        rate = t.examples / t.seconds if t.seconds else 0.0
        print(f"{t.name:40} {t.examples:>10} {rate:>8.0f} {len(t.failures):>8}")
    total_failures = sum(len(t.failures) for t in targets)
    print(json.dumps({"minutes": args.minutes, "targets": {
        t.name: {"examples": t.examples, "failures": len(t.failures)} for t in targets},
        "failures": total_failures}))
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
