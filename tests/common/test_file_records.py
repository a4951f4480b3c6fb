"""Reading ranges of segment files named by another process: only from the file the range was
named in (same path and inode), only whole, and without holding files open for long; a range
taken as a slice to send holds its file open itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from services.common.file_records import SPOOL_FILE, FileRecordsReader, local_host_key

SEGMENT = "00000000000000000000.log"


def segment(path, data: bytes) -> int:
    path.write_bytes(data)
    return os.stat(path).st_ino


@pytest.mark.parametrize("mapped", [False, True])
def test_a_range_reads_as_named(tmp_path, mapped) -> None:
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    reader = FileRecordsReader(mapped=mapped)
    assert reader.read(str(path), inode, 2, 5) == b"23456"
    assert reader.read(str(path), inode, 0, 10) == b"0123456789"
    assert reader.open_files == 1
    reader.close()
    assert reader.open_files == 0


@pytest.mark.parametrize("mapped", [False, True])
def test_a_replaced_deleted_or_truncated_file_is_unreadable(tmp_path, mapped) -> None:
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    reader = FileRecordsReader(mapped=mapped)
    assert reader.read(str(path), inode, 8, 3) is None  # past the end: short
    assert reader.read(str(path), inode, -1, 3) is None
    assert reader.read(str(path), inode, 0, -1) is None
    assert reader.read(str(tmp_path / "00000000000000000009.log"), inode, 0, 1) is None

    # Replaced (the log cleaner's swap): the path names another file now.
    fresh = FileRecordsReader(mapped=mapped)
    other = tmp_path / (SEGMENT + ".swap")
    segment(other, b"abcdefghij")
    os.replace(other, path)
    assert fresh.read(str(path), inode, 0, 4) is None
    assert fresh.read(str(path), os.stat(path).st_ino, 0, 4) == b"abcd"

    # Truncated under an open reader (a follower truncating its log), whose mapping (if it
    # reads so) still spans the bytes cut: the size checked first, it reads nothing.
    os.truncate(path, 2)
    assert fresh.read(str(path), os.stat(path).st_ino, 0, 4) is None
    assert fresh.read(str(path), os.stat(path).st_ino, 0, 2) == b"ab"


def test_a_mapped_file_that_grew_is_read_past_its_first_mapping(tmp_path) -> None:
    """A spool file written as it fills (by a frontend of an earlier version) is mapped again
    once a range lies past the mapping."""
    path = tmp_path / f"kbroker-records-{os.getpid()}-{0:016x}.spool"
    inode = segment(path, b"0123456789")
    reader = FileRecordsReader(names=SPOOL_FILE, mapped=True)
    assert reader.read(str(path), inode, 6, 4) == b"6789"
    assert reader.read(str(path), inode, 8, 4) is None  # not written yet
    with open(path, "ab") as more:
        more.write(b"abcdef")
    assert reader.read(str(path), inode, 8, 4) == b"89ab"
    assert reader.read(str(path), inode, 0, 16) == b"0123456789abcdef"
    path.unlink()
    assert reader.read(str(path), inode, 12, 4) == b"cdef"  # still open: readable
    reader.close()
    assert reader.open_files == 0


def test_a_slice_holds_its_range_until_closed(tmp_path) -> None:
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    reader = FileRecordsReader()
    piece = reader.slice(str(path), inode, 2, 5)
    assert piece is not None and len(piece) == 5 and piece.read() == b"23456"
    # Past the end, another inode or a negative range: no slice.
    assert reader.slice(str(path), inode, 8, 3) is None
    assert reader.slice(str(path), inode + 1, 0, 1) is None
    assert reader.slice(str(path), inode, -1, 1) is None
    # Its own descriptor: the reader closing the file and the file being deleted leave it.
    reader.close()
    path.unlink()
    assert piece.read() == b"23456"
    fd = piece.fd
    piece.close()
    assert piece.fd == -1
    try:
        os.fstat(fd)
        raise AssertionError("the slice's descriptor is still open")
    except OSError:
        pass
    piece.close()  # again: nothing


def test_a_slice_whose_file_was_cut_since_reads_as_none(tmp_path) -> None:
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    piece = FileRecordsReader().slice(str(path), inode, 4, 6)
    assert piece is not None
    os.truncate(path, 8)
    assert piece.read() is None
    piece.close()


def test_with_no_descriptor_left_for_a_slice_its_bytes_are_read(tmp_path) -> None:
    """In a process at its open file limit: the range comes back as bytes, not as a slice
    and not as unreadable."""
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    script = (
        "import os, resource, sys\n"
        "from services.common.file_records import FileRecordsReader, FileSlice\n"
        "path, inode = sys.argv[1], int(sys.argv[2])\n"
        "reader = FileRecordsReader()\n"
        "first = reader.slice(path, inode, 2, 5)\n"
        "assert isinstance(first, FileSlice), first\n"
        "first.close()\n"
        "held = []\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))\n"
        "try:\n"
        "    while True:\n"
        "        held.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "print(repr(reader.slice(path, inode, 2, 5)), reader.open_files)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path), str(inode)],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["b'23456'", "1"]


def test_only_segment_files_are_read(tmp_path, monkeypatch) -> None:
    """A file not named as a segment, a relative path, a symbolic link or a directory is not
    read, whatever range names it."""
    reader = FileRecordsReader()
    key = tmp_path / "frontend.key"
    inode = segment(key, b"-----BEGIN PRIVATE KEY-----")
    assert reader.read(str(key), inode, 0, 5) is None
    link = tmp_path / SEGMENT
    link.symlink_to(key)
    assert reader.read(str(link), inode, 0, 5) is None
    folder = tmp_path / "d" / "00000000000000000001.log"
    folder.mkdir(parents=True)
    assert reader.read(str(folder), folder.stat().st_ino, 0, 0) is None
    monkeypatch.chdir(tmp_path)
    real = tmp_path / "00000000000000000002.log"
    real_inode = segment(real, b"0123")
    assert reader.read(real.name, real_inode, 0, 2) is None
    assert reader.read(str(real), real_inode, 0, 2) == b"01"
    assert reader.open_files == 1


@pytest.mark.parametrize("mapped", [False, True])
def test_a_file_kept_open_reads_as_named_after_it_is_deleted(tmp_path, mapped) -> None:
    """As with Kafka's sendfile of a segment being deleted: the bytes decided are still there."""
    path = tmp_path / SEGMENT
    inode = segment(path, b"0123456789")
    reader = FileRecordsReader(mapped=mapped)
    assert reader.read(str(path), inode, 0, 2) == b"01"
    path.unlink()
    assert reader.read(str(path), inode, 2, 2) == b"23"


def test_open_files_are_bounded_and_idle_ones_closed(tmp_path) -> None:
    reader = FileRecordsReader(max_open=2, idle_seconds=0.05)
    files = []
    for n in range(3):
        path = tmp_path / f"{n:020d}.log"
        files.append((str(path), segment(path, b"x" * 10)))
    for path, inode in files:
        assert reader.read(path, inode, 0, 1) == b"x"
    assert reader.open_files == 2
    time.sleep(0.1)
    assert reader.read(*files[0], 0, 1) == b"x"  # sweeps the idle ones
    assert reader.open_files == 1
    reader.close()


@pytest.mark.parametrize("mapped", [False, True])
def test_opening_a_file_closes_the_open_ones_since_deleted(tmp_path, mapped) -> None:
    """A frontend's spool files come one after another: a reader keeps none of them, once
    deleted, open past its next file."""
    reader = FileRecordsReader(names=SPOOL_FILE, mapped=mapped)
    files = []
    for n in range(3):
        path = tmp_path / f"kbroker-records-{os.getpid()}-{n:016x}.spool"
        files.append((path, segment(path, b"y" * 10)))
    assert reader.read(str(files[0][0]), files[0][1], 0, 1) == b"y"
    files[0][0].unlink()
    assert reader.read(str(files[0][0]), files[0][1], 1, 1) == b"y"  # still open: readable
    assert reader.read(str(files[1][0]), files[1][1], 0, 1) == b"y"
    assert reader.open_files == 1
    assert reader.read(str(files[0][0]), files[0][1], 2, 1) is None
    # and so on, file after file.
    files[1][0].unlink()
    assert reader.read(str(files[2][0]), files[2][1], 0, 1) == b"y"
    assert reader.open_files == 1
    reader.close()


def test_only_the_opened_files_directory_is_checked_for_deleted_files(tmp_path) -> None:
    reader = FileRecordsReader()
    files = []
    for n in range(2):
        (tmp_path / f"p{n}").mkdir()
        path = tmp_path / f"p{n}" / f"{0:020d}.log"
        files.append((path, segment(path, b"w" * 10)))
    assert reader.read(str(files[0][0]), files[0][1], 0, 1) == b"w"
    files[0][0].unlink()
    assert reader.read(str(files[1][0]), files[1][1], 0, 1) == b"w"
    assert reader.open_files == 2  # another partition's: left to the idle sweep
    reader.close()


def test_spool_files_are_read_only_by_a_spool_reader(tmp_path) -> None:
    spool = tmp_path / f"kbroker-records-{os.getpid()}-{0:016x}.spool"
    inode = segment(spool, b"z" * 4)
    assert FileRecordsReader().read(str(spool), inode, 0, 4) is None
    log_file = tmp_path / f"{0:020d}.log"
    assert FileRecordsReader(names=SPOOL_FILE).read(
        str(log_file), segment(log_file, b"z" * 4), 0, 4) is None
    assert FileRecordsReader(names=SPOOL_FILE).read(str(spool), inode, 0, 4) == b"zzzz"


def test_processes_of_one_host_and_mount_namespace_share_a_key() -> None:
    key = local_host_key()
    assert key and key == local_host_key()
    other = subprocess.run(
        [sys.executable, "-c",
         "from services.common.file_records import local_host_key; print(local_host_key())"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert other == key
