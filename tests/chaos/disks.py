"""Full disks for log nodes: each log node's data folder is a small tmpfs of its own, mounted
before the node starts, which the test fills to the last byte and frees again.

Filling a disk the node already writes to (rather than swapping the folder under a running
process) is what an operator meets: another tenant or a runaway log file takes the space, and
the node's next write fails with ENOSPC. Needs root (mount); every mount is undone by
:meth:`FullDisks.unmount`, which the test calls in its teardown.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

FILLER = ".chaos-filler"


class FullDisks:
    """A tmpfs of ``size_mb`` MiB over each of ``folders`` (name -> data folder)."""

    def __init__(self, folders: dict[str, Path], size_mb: int) -> None:
        self.folders = folders
        self.size_mb = size_mb
        self.mounted: list[Path] = []
        self.full: set[str] = set()

    def mount(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("full-disk faults mount a tmpfs per log node: run as root")
        for folder in self.folders.values():
            folder.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mb}m", "tmpfs",
                            str(folder)], check=True, capture_output=True, timeout=10)
            self.mounted.append(folder)

    def fill(self, name: str) -> int:
        """Take every free byte of ``name``'s disk; return how many were taken."""
        filler = self.folders[name] / FILLER
        taken = 0
        with open(filler, "ab", buffering=0) as out:
            free = os.statvfs(filler)
            room = free.f_bavail * free.f_frsize
            if room:
                with contextlib.suppress(OSError):
                    os.posix_fallocate(out.fileno(), out.tell(), room)
                    taken += room
            chunk = b"\0" * 4096
            while True:  # whatever fallocate left, a page at a time
                try:
                    written = out.write(chunk)
                except OSError:
                    break
                taken += written or 0
        self.full.add(name)
        return taken

    def free(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.folders[name] / FILLER).unlink()
        self.full.discard(name)

    def usage(self, name: str) -> tuple[int, int]:
        """(used, total) bytes of ``name``'s disk."""
        stat = os.statvfs(self.folders[name])
        return ((stat.f_blocks - stat.f_bfree) * stat.f_frsize, stat.f_blocks * stat.f_frsize)

    def unmount(self) -> None:
        """Undo every mount (lazily if a process still holds the folder)."""
        for folder in reversed(self.mounted):
            done = subprocess.run(["umount", str(folder)], capture_output=True, timeout=10)
            if done.returncode != 0:
                subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=10)
        self.mounted.clear()
        self.full.clear()
