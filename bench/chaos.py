"""The long chaos run: random faults on a supervised local cluster under idempotent acks=all
production and a consumer group, then the checker's verdict and the ack pause per fault kind.

    python bench/chaos.py [--duration 1800] [--interval 20] [--kinds kill,pause,...]
                          [--roles log,handler,...] [--seed N] [--rate 100]
                          [--disk-mb 256] [--full-disk-seconds 15] [--stuck-after 30]
                          [--links *|none|log-0,...]

The pieces are those of tests/chaos (the short version in ``make test``): a cluster of 3 log
nodes, 2 handlers, a purgatory, a replicator and a frontend, supervised (a service that exits
is restarted with backoff), with a loopback proxy in front of every internal gRPC port (or of
those ``--links`` names: behind a proxy a killed service looks like an unreachable one, whose
port still accepts, so it is fenced after the session timeout, not at once) and a
tmpfs of DISK_MB per log node (root only; ``--disk-mb 0`` leaves full disks out); a topic of
6 partitions, RF=3, min.insync.replicas=2; 2 idempotent acks=all producers at RATE records/s
each and a consumer group of 2. Every INTERVAL seconds one fault, drawn at random (kind
first, then a target of a chosen role), is injected, held, healed, and the cluster is given
time to settle (every replica back in its ISR, every partition acknowledging again, every
client progressing again):

    kill        SIGKILL, the supervisor restarts it
    pause       SIGSTOP, SIGCONT after --pause-seconds
    restart     SIGTERM (graceful), the supervisor restarts it
    full-disk   a log node's disk filled for --full-disk-seconds, freed, the node restarted
    partition   nothing moves on the service's inbound gRPC streams for --partition-seconds
    disconnect  its inbound gRPC streams reset and refused for --partition-seconds

Prints a line per fault as it happens, then the ack pause per fault (the longest time a
partition went without an acknowledgement around it), p50 and max per fault kind and role,
the checker's totals, which fault each finding was acknowledged under, restarts beyond the
faults (crashes), and one JSON line with all of it. Exits 1 on any lost, misplaced,
duplicated, reordered or divergent record or crash (with ``--strict`` also on stuck clients
and stalled partitions).

There is no reference broker beside it: the reference (Tansu) runs as one in-memory broker,
where each of these faults is an outage, so there is no pause to compare with.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.chaos.checker import findings_by_fault  # noqa: E402
from tests.chaos.faults import KINDS, ROLES, FaultSettings  # noqa: E402
from tests.chaos.harness import ChaosRun, ChaosSettings  # noqa: E402

DATA_FINDINGS = ("lost", "misplaced", "duplicates", "reordered", "divergent")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of faults")
    parser.add_argument("--interval", type=float, default=20.0,
                        help="seconds from one fault to the next (at least the settling time)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rate", type=float, default=100.0, help="records/s per producer")
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--disk-mb", type=int, default=256,
                        help="tmpfs size per log node (0: no full-disk faults)")
    parser.add_argument("--pause-seconds", type=float, default=3.0)
    parser.add_argument("--partition-seconds", type=float, default=5.0)
    parser.add_argument("--full-disk-seconds", type=float, default=15.0)
    parser.add_argument("--stuck-after", type=float, default=30.0)
    parser.add_argument("--settle-timeout", type=float, default=120.0)
    parser.add_argument("--strict", action="store_true",
                        help="also fail on stuck clients and stalled partitions")
    parser.add_argument("--links", default="*",
                        help="internal services behind a loopback proxy: * (all), a comma "
                             "list, or none (partition and disconnect faults need one; "
                             "without, a killed service refuses connections as it does "
                             "in a deployment)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="keep data and service logs here (default: a temporary folder)")
    args = parser.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    roles = [r for r in args.roles.split(",") if r]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"unknown kinds {sorted(unknown)}; choose from {KINDS}")
    if args.disk_mb == 0 and "full-disk" in kinds:
        kinds.remove("full-disk")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"{time.monotonic() - started:8.1f}s {message}", flush=True)

    log(f"seed {seed}; kinds {kinds}; roles {roles}")
    settings = ChaosSettings(
        partitions=args.partitions, rate=args.rate, disk_mb=args.disk_mb,
        links=tuple(n for n in args.links.split(",") if n and n != "none"),
        stuck_after=args.stuck_after, settle_timeout=args.settle_timeout,
        faults=FaultSettings(pause_seconds=args.pause_seconds,
                             partition_seconds=args.partition_seconds,
                             full_disk_seconds=args.full_disk_seconds,
                             heal_timeout=args.settle_timeout))
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        with ChaosRun(data_dir, settings, log=log) as run:
            assert run.injector is not None
            unsettled: list[str] = []
            deadline = time.monotonic() + args.duration
            while time.monotonic() < deadline:
                next_at = time.monotonic() + args.interval
                choices = [(kind, target) for kind in kinds
                           for target in run.injector.targets(kind)
                           if target.split("-")[0] in roles]
                if not choices:
                    parser.error("no fault hits the chosen roles")
                kind = rng.choice(sorted({k for k, _ in choices}))
                target = rng.choice([t for k, t in choices if k == kind])
                try:
                    run.inject(kind, target)
                except AssertionError as exc:  # not settled: a finding; carry on
                    unsettled.append(f"{kind} {target}")
                    log(f"NOT SETTLED after {kind} {target}: {str(exc).splitlines()[0]}")
                run.injector.hold(max(0.0, next_at - time.monotonic()))
            log("faults over; draining")
            report = run.finish(drain_timeout=120.0)
            assert run.workload is not None
            by_fault = findings_by_fault(report, run.workload.history)
            crashes = run.injector.unexpected_restarts()
            not_running = run.injector.not_running()

    print()
    for pause in report.pauses:
        print(f"  {pause.fault.label:<24} at {pause.fault.start - started:8.1f}s  ack pause "
              f"{pause.seconds:6.2f}s{'+' if pause.open_ended else ' '} on partition "
              f"{pause.topic_partition[1] if pause.topic_partition else '-'}")
    by_kind = report.pauses_by_kind()
    print(f"\n{'fault':<22} {'count':>5} {'p50 s':>7} {'max s':>7}")
    for name, row in by_kind.items():
        print(f"{name:<22} {row['faults']:>5} {row['p50_s']:>7.2f} {row['max_s']:>7.2f}")
    print(f"\n{report.describe(limit=5).splitlines()[0]}")
    for line in report.describe(limit=5).splitlines()[1:]:
        if not line.lstrip().startswith("ack pause"):
            print(line)
    for label, counts in by_fault.items():
        print(f"  acknowledged during {label}: {counts}")
    print(f"restarts beyond the faults: {crashes or 'none'}; not running at the end: "
          f"{not_running or 'none'}; not settled: {unsettled or 'none'}")
    totals = report.totals()
    print(json.dumps({"seed": seed, "duration_s": args.duration, "totals": totals,
                      "pauses": by_kind, "findings_by_fault": by_fault, "crashes": crashes,
                      "not_running": not_running, "unsettled": unsettled}))
    failed = any(totals[name] for name in DATA_FINDINGS) or bool(crashes) or bool(not_running)
    if args.strict:
        failed = failed or bool(totals["stuck"] or totals["stalled"] or unsettled)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
