"""Record batches read from a log node's segment files by another process on the same host.

Kafka's broker never copies a fetch answer's records through its heap: the answer holds a
region of a segment file and the socket is handed that region (``FileRecords``). Here the log
node, the handler and the frontend are separate processes, and every process a record's bytes
pass through costs CPU per byte. So when the frontend runs on the same host as a log node, a
Fetch answer may name its batches as ranges of segment files (path, inode, position, size)
instead of carrying them: the log node decides what to answer exactly as before (whole batches,
byte limits, the high watermark), the handler passes the ranges on, and the frontend hands
each large range to the client's socket with ``sendfile`` (:class:`FileSlice`; read and written
on a TLS connection, and a small range read).

"The same host" is the same kernel and the same view of the file system: :func:`local_host_key`
is the boot id with the mount namespace, which processes of one machine share and containers
of different pods do not. A log node names ranges only to a reader whose key equals its own.

Only segment files are read: an absolute path to a regular file named as a log segment
(``<base offset, 20 digits>.log``), opened without following a symbolic link. A reader trusts
the service that names a range to name one of its segments; the name check keeps any other file
of the reader's host (its TLS key, say) out of what it could be made to send.

A range read later than it was decided can find its file gone (the segment deleted by
retention or replaced by compaction) or shorter (truncated): the reader checks the inode and
the size and reports the range unreadable, and the caller asks again with the records carried.
As with Kafka's sendfile, the bytes are whatever the file holds when read; a range lies below
the high watermark when decided, and committed batches are not rewritten.

Produce goes the other way. A frontend writes a large Produce's batches into a spool file of its
own (``kbroker-records-<pid>-<16 hex digits>.spool``, in a tmpfs such as /dev/shm:
services.frontend.records_spool) and names them in its call; the handler passes the ranges on,
and the leader log node reads them and appends them as if they had come carried. A range is
written over only once its call was answered with ``file_records_settled``: every service that
was asked to read it answered, so none reads it late. Whoever cannot read a range (another
host, a file gone) says so before anything is stored, and the batches are sent again carried.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from .buffers import unfilled

# gRPC metadata on a frontend's Fetch call: the frontend's local host key.
METADATA_KEY = "kbroker-local-files"

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_MOUNT_NAMESPACE = "/proc/self/ns/mnt"

_key: str | None = None

# How long a service that could not read ranges it was named (another host, a file gone) is
# then sent the batches carried at once, before ranges are tried again: a frontend's handler,
# a handler's leader, a follower's leader.
CARRIED_AFTER_REFUSAL_SECONDS = 60.0

# What a log segment's file is called (services.log.segment),
SEGMENT_FILE = re.compile(r"[0-9]{20}\.log")
# and a frontend's spool file of produced batches.
SPOOL_FILE = re.compile(r"kbroker-records-[0-9]+-[0-9a-f]{16}\.spool")


def local_host_key() -> str:
    """This process's local host key: equal for two processes exactly when they share a kernel
    and a mount namespace, so a path one names is the file the other opens. Empty where it
    cannot be told (no /proc): such a process never reads or names file ranges."""
    global _key
    if _key is None:
        try:
            _key = f"{_BOOT_ID.read_text().strip()}/{os.readlink(_MOUNT_NAMESPACE)}"
        except OSError:
            _key = ""
    return _key


def is_local(key: str) -> bool:
    """Whether ``key`` (another process's :func:`local_host_key`) is this process's."""
    return bool(key) and key == local_host_key()


class SpoolReads:
    """Whether the spooled ranges of a call may still be read after it is answered: set when a
    call that named them to another service ended without that service's answer."""

    __slots__ = ("unsettled",)

    def __init__(self) -> None:
        self.unsettled = False


@dataclass(frozen=True, slots=True)
class SpooledRecords:
    """A partition's batches left in a spool file: where they are, the first batch's header
    (``head``), which the handler's checks look at, and the call's :class:`SpoolReads`."""

    head: bytes | memoryview
    path: str
    inode: int
    position: int
    size: int
    reads: SpoolReads = field(default_factory=SpoolReads)


# A range at least this large goes into a Fetch answer as a FileSlice (sent with sendfile);
# a smaller one is read: for it a descriptor of its own and a sendfile of its own cost more
# than the copies they save.
SLICE_MIN_BYTES = 32 * 1024


class FileSlice:
    """``size`` bytes at ``position`` of an open file (Kafka's ``FileRecords`` slice, which
    its socket server hands the socket whole): a frontend puts one among a Fetch answer's
    buffers, and the client's connection sends it with ``sendfile`` (from the file's pages,
    not copied through the process) or, where it cannot (TLS), :meth:`read` s it. It holds a
    descriptor of its own until :meth:`close` (or until it is collected)."""

    __slots__ = ("fd", "position", "size")

    def __init__(self, fd: int, position: int, size: int) -> None:
        self.fd = fd
        self.position = position
        self.size = size

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes | None:
        """Its bytes, or None when the file no longer holds them all (cut meanwhile)."""
        try:
            data = os.pread(self.fd, self.size, self.position)
        except OSError:
            return None
        return data if len(data) == self.size else None

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


class FileRecordsReader:
    """Reads ranges of segment files (or of files whose names match ``names``: spool files),
    keeping the last ``max_open`` files open (a fetch reads the same few segments over and
    over). Opening a file closes the open ones of its directory since deleted, and a file
    unused for ``idle_seconds`` is closed, so a deleted file's space is not held for long.

    With ``mapped``, :meth:`read` copies a range out of a mapping of its file rather than with
    ``pread``, which does the kernel's work for every 4 KiB page (72 µs against 15 for 830 KB of
    a tmpfs file, docs/performance.md). Only for files no one cuts short while they may be
    read, as spool files are (made whole and only ever removed): a mapped page past the end of
    a file that shrank kills the reader (SIGBUS), where ``pread`` reads short. The size is
    checked before each read, which leaves only a cut in that instant to meet such a page."""

    def __init__(self, max_open: int = 256, idle_seconds: float = 30.0,
                 names: re.Pattern[str] = SEGMENT_FILE, mapped: bool = False) -> None:
        self._names = names
        self._max_open = max_open
        self._idle_seconds = idle_seconds
        self._mapped = mapped
        # (path, inode) -> (fd, last used, monotonic seconds)
        self._open: OrderedDict[tuple[str, int], tuple[int, float]] = OrderedDict()
        # (path, inode) -> the file mapped (read-only) as long as it was when mapped
        self._maps: dict[tuple[str, int], mmap.mmap] = {}
        # directory -> its files in _open
        self._in_directory: dict[str, set[tuple[str, int]]] = {}
        self._swept = time.monotonic()

    def read(self, path: str, inode: int, position: int, size: int) -> bytes | bytearray | None:
        """The ``size`` bytes at ``position`` of the file ``path`` if it is still the file of
        that inode and holds them (a bytearray of the reader's own when ``mapped``); None
        otherwise."""
        fd = self._file(path, inode, position, size)
        if fd is None:
            return None
        if self._mapped:
            return self._read_mapped((path, inode), fd, position, size)
        try:
            data = os.pread(fd, size, position)
        except OSError:
            self._forget((path, inode))
            return None
        return data if len(data) == size else None

    def _read_mapped(self, key: tuple[str, int], fd: int, position: int, size: int
                     ) -> bytearray | None:
        end = position + size
        try:
            # Checked on every read, so that a file cut short reads as unreadable rather than
            # through a mapped page past its end (which only a cut in this instant can meet).
            length = os.fstat(fd).st_size
        except OSError:
            self._forget(key)
            return None
        if length < end:
            return None
        mapped = self._maps.get(key)
        if mapped is None or len(mapped) < end:
            # Not mapped yet, or the file has grown past its mapping (a spool file written
            # as it fills, by a frontend of an earlier version).
            try:
                replaced = mmap.mmap(fd, length, prot=mmap.PROT_READ)
            except (OSError, ValueError):
                self._forget(key)
                return None
            if mapped is not None:
                mapped.close()
            mapped = self._maps[key] = replaced
        data = unfilled(size)  # one copy, into a buffer its reader may patch
        with memoryview(mapped) as view:
            data[:] = view[position:end]
        return data

    def slice(self, path: str, inode: int, position: int, size: int) -> FileSlice | bytes | None:
        """The ``size`` bytes at ``position`` of the file ``path`` as a :class:`FileSlice`, if
        it is still the file of that inode and holds them; None otherwise. The slice holds a
        descriptor of its own: this reader closing the file does not cut its send short. With
        no descriptor left for one (the open file limit reached), the bytes themselves."""
        fd = self._file(path, inode, position, size)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size < position + size:
                return None
            return FileSlice(os.dup(fd), position, size)
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                return self.read(path, inode, position, size)
            self._forget((path, inode))
            return None

    def _file(self, path: str, inode: int, position: int, size: int) -> int | None:
        """The descriptor of ``path`` if it is the file of ``inode`` (kept open) and the range
        is not negative, else None."""
        if size < 0 or position < 0:
            return None
        now = time.monotonic()
        key = (path, inode)
        entry = self._open.get(key)
        if entry is None:
            fd = self._open_file(path, inode)
            if fd is None:
                return None
            directory = os.path.dirname(path)
            self._close_deleted(self._in_directory.get(directory, set()))
            self._in_directory.setdefault(directory, set()).add(key)
            self._open[key] = (fd, now)
            if len(self._open) > self._max_open:
                self._forget(next(iter(self._open)))
        else:
            fd = entry[0]
            self._open[key] = (fd, now)
            self._open.move_to_end(key)
        if now - self._swept > self._idle_seconds / 3:
            self._sweep(now)
        return fd

    def _open_file(self, path: str, inode: int) -> int | None:
        if not os.path.isabs(path) or not self._names.fullmatch(os.path.basename(path)):
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        try:
            found = os.fstat(fd)
            if found.st_ino == inode and stat.S_ISREG(found.st_mode):
                return fd
        except OSError:
            pass
        os.close(fd)
        return None

    def _forget(self, key: tuple[str, int]) -> None:
        mapped = self._maps.pop(key, None)
        if mapped is not None:
            mapped.close()
        entry = self._open.pop(key, None)
        if entry is None:
            return
        with contextlib.suppress(OSError):
            os.close(entry[0])
        directory = os.path.dirname(key[0])
        neighbours = self._in_directory.get(directory)
        if neighbours is not None:
            neighbours.discard(key)
            if not neighbours:
                del self._in_directory[directory]

    def _close_deleted(self, keys: set[tuple[str, int]]) -> None:
        """Close those of ``keys`` (the open files of the directory a file is being opened
        in) whose file was deleted: a new file there (a segment rolled, a spool file started)
        is when older ones go. Only that directory's are checked, so a reader of many
        partitions' segments does not stat them all."""
        for key in list(keys):
            try:
                deleted = os.fstat(self._open[key][0]).st_nlink == 0
            except OSError:
                deleted = True
            if deleted:
                self._forget(key)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for key, (_, used) in list(self._open.items()):
            if now - used > self._idle_seconds:
                self._forget(key)

    @property
    def open_files(self) -> int:
        return len(self._open)

    def close(self) -> None:
        for key in list(self._open):
            self._forget(key)


def spool_reader() -> FileRecordsReader:
    """A reader of frontends' spool files (a leader's, and a handler's for batches a leader
    could not read): few kept open, and not for long, since a frontend fills one file after
    another; read through mappings, which only files never cut short allow."""
    return FileRecordsReader(max_open=4, idle_seconds=5.0, names=SPOOL_FILE, mapped=True)
