"""Replacing log segments by rewritten ones, crash-safely (Kafka's ``.cleaned``/``.swap``/
``.deleted`` protocol of ``UnifiedLog.replaceSegments`` and ``LogLoader``).

The log cleaner writes a group of consecutive old segments, cleaned, as one new segment whose
base offset is the first old segment's: ``<base>.log.cleaned`` with ``<base>.index.cleaned``,
``<base>.timeindex.cleaned`` and ``<base>.txnindex.cleaned``, flushed to disk. :func:`commit`
then swaps it in:

1. rename the new files ``.cleaned`` -> ``.swap``, the indexes first and the log last, then
   fsync the directory. The log's ``.swap`` file is the commit point: once it exists the new
   segment wins.
2. rename every file of the old segments to ``<name>.deleted``; fsync the directory.
3. rename the new files ``.swap`` -> their final names, indexes first and the log last; fsync
   the directory. The caller then closes the old segments and removes the ``.deleted`` files
   (:func:`remove_deleted`).

:func:`recover` runs before a replica's segments are loaded and finishes or undoes whatever a
crash interrupted, so the log holds either the old segments or the new one, never a mix that
loses data:

- ``*.cleaned`` files are an unfinished cleaning: deleted.
- each ``<base>.log.swap`` is a committed new segment covering offsets [base, end), where end
  is one past its last batch (found by walking its batch headers): every ordinary segment
  whose base offset lies in [base, max(end, base + 1)) is deleted, then the ``.swap`` files of
  that base take their final names. An old segment of the group at or past ``end`` (all its
  records were cleaned away) may survive; it holds valid, merely uncleaned, data.
- any other ``*.swap`` file (an index renamed before its log in step 1) and every
  ``*.deleted`` file are deleted.

Indexes that do not match their log after all this are rebuilt by the segment loading that
follows (see :meth:`services.log.segment.LogSegment.load`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from .checkpoint import fsync_directory
from .segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    file_offsets,
    file_stem,
    scan_batches,
)

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"

# A segment's files, in the order they are renamed: the log file last, as the commit point.
_SEGMENT_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LOG_SUFFIX)


def segment_files(directory: Path, base_offset: int, suffix: str = "") -> list[Path]:
    """The files of the segment at ``base_offset`` (log last), with ``suffix`` appended."""
    stem = file_stem(base_offset)
    return [directory / (stem + kind + suffix) for kind in _SEGMENT_SUFFIXES]


def discard(directory: Path, base_offset: int) -> None:
    """Remove the ``.cleaned`` files of a cleaning that will not be committed."""
    for path in segment_files(directory, base_offset, CLEANED_SUFFIX):
        path.unlink(missing_ok=True)


def commit(directory: Path, base_offset: int, old_bases: Iterable[int]) -> list[Path]:
    """Swap the cleaned segment at ``base_offset`` in for the segments at ``old_bases``
    (steps 1-3 of the module docstring). Returns the ``.deleted`` files left to remove once
    the old segments are closed."""
    *indexes, cleaned_log = segment_files(directory, base_offset, CLEANED_SUFFIX)
    for path in indexes:
        if path.exists():  # a missing index is rebuilt when the segment is loaded
            os.replace(path, _with_suffix(path, CLEANED_SUFFIX, SWAP_SUFFIX))
    os.replace(cleaned_log, _with_suffix(cleaned_log, CLEANED_SUFFIX, SWAP_SUFFIX))
    fsync_directory(directory)
    deleted = []
    for old in old_bases:
        for path in segment_files(directory, old):
            if path.exists():
                target = path.with_name(path.name + DELETED_SUFFIX)
                os.replace(path, target)
                deleted.append(target)
    fsync_directory(directory)
    for path in segment_files(directory, base_offset, SWAP_SUFFIX):
        if path.exists():
            os.replace(path, _with_suffix(path, SWAP_SUFFIX, ""))
    fsync_directory(directory)
    return deleted


def remove_deleted(paths: Iterable[Path]) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:  # removed again at the next start-up
            log.warning("%s: cannot remove: %s", path, exc)


def recover(directory: Path) -> None:
    """Finish or undo a segment swap that a crash interrupted (see the module docstring).
    Does nothing (and costs one directory listing) when there is nothing to do."""
    names = [path.name for path in directory.iterdir()]
    if not any(name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)) for name in names):
        return
    for name in names:
        if name.endswith(CLEANED_SUFFIX):
            log.info("%s: removing an unfinished cleaning's file %s", directory, name)
            (directory / name).unlink(missing_ok=True)
    for base in file_offsets(directory, LOG_SUFFIX + SWAP_SUFFIX):
        swapped = segment_files(directory, base, SWAP_SUFFIX)
        end = max(_next_offset(swapped[-1], base), base + 1)
        for old in file_offsets(directory, LOG_SUFFIX):
            if base <= old < end:
                log.info("%s: deleting segment %d replaced by cleaned segment %d",
                         directory, old, base)
                for path in segment_files(directory, old):
                    path.unlink(missing_ok=True)
        for path in swapped:
            if path.exists():
                os.replace(path, _with_suffix(path, SWAP_SUFFIX, ""))
        log.info("%s: completed the swap of cleaned segment %d", directory, base)
    for path in directory.iterdir():
        if path.name.endswith((SWAP_SUFFIX, DELETED_SUFFIX)):
            path.unlink(missing_ok=True)
    fsync_directory(directory)


def _with_suffix(path: Path, old: str, new: str) -> Path:
    return path.with_name(path.name[:len(path.name) - len(old)] + new)


def _next_offset(path: Path, base_offset: int) -> int:
    """One past the last offset of the whole batches in the log file at ``path``, by their
    framing (the base offset if there are none)."""
    next_offset = base_offset
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        for position, header in scan_batches(file.fileno(), 0, size):
            if position + header.size > size:
                break
            next_offset = header.next_offset
    return next_offset
