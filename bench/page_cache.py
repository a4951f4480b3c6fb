"""What a write into the page cache costs on this machine when its pages are new, against
pages the kernel has just freed: the part of a log node's CPU per GB that the machine, not
kbroker, decides.

    python bench/page_cache.py [--dir /tmp] [--mib 2000] [--block-kib 1024] [--rest 15]

Writes MIB MiB into a new file in DIR (``os.pwrite`` of BLOCK-KiB blocks, as a log segment is
appended to), deletes it, and does it again three times: at once (the kernel hands out the
pages the deleted file just gave back), then after REST seconds idle, then at once again. Each
pass reports the CPU time the writes took (user and system, of this process) as GB per second
of CPU. A log node writes every appended byte into the page cache this way (a follower too), so
on a machine where the first pass is much slower than the second, each GB kbroker stores costs
that much more CPU than the services' code accounts for; the reference broker of the other
benchmarks keeps its records in memory and writes no file.

On a virtual machine whose balloon driver reports free memory to its host (Linux's free page
reporting, ``virtio_balloon``), memory left free for a few seconds goes back to the host, and
the next touch of it costs again: the pass after the rest is as slow as the first. Prints one
JSON line per pass, then one with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def write_pass(directory: Path, mib: int, block: int) -> dict[str, float]:
    """Write ``mib`` MiB in ``block``-byte blocks into a new file, then delete it."""
    path = directory / f"page-cache-{os.getpid()}.log"
    data = b"\x5a" * block
    blocks = (mib << 20) // block
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for number in range(blocks):
            os.pwrite(fd, data, number * block)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        os.close(fd)
        path.unlink()
    written = blocks * block / 1e9
    return {"GB_per_cpu_s": round(written / cpu, 2), "GB_per_s": round(written / wall, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--mib", type=int, default=2000)
    parser.add_argument("--block-kib", type=int, default=1024)
    parser.add_argument("--rest", type=float, default=15.0)
    args = parser.parse_args()
    block = args.block_kib << 10
    reporting = Path("/sys/bus/virtio/drivers/virtio_balloon").exists()
    passes = {}
    for name, rest in (("new pages", 0.0), ("just freed", 0.0), ("after rest", args.rest),
                       ("just freed again", 0.0)):
        time.sleep(rest)
        passes[name] = write_pass(args.dir, args.mib, block)
        print(json.dumps({"pass": name, "rest_s": rest, "MiB": args.mib, **passes[name]}),
              flush=True)
    freed = passes["just freed"]["GB_per_cpu_s"]
    print(json.dumps({
        "virtio_balloon": reporting,
        "new_over_just_freed_cpu": round(freed / passes["new pages"]["GB_per_cpu_s"], 2),
        "rested_over_just_freed_cpu": round(freed / passes["after rest"]["GB_per_cpu_s"], 2),
        "extra_cpu_s_per_GB_new_pages": round(
            1 / passes["new pages"]["GB_per_cpu_s"] - 1 / freed, 3),
    }), flush=True)


if __name__ == "__main__":
    main()
