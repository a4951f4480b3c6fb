"""Buffers that are filled whole before anything reads them: a large request frame received in
place, a spooled range copied out of its file.

``bytearray(size)`` writes zeros over every byte first, and each of these buffers is then
written over once more. :func:`unfilled` allocates a bytearray whose bytes are left as the
allocator found them (CPython's ``PyByteArray_FromStringAndSize`` with no source), for a caller
that fills every byte before it hands the buffer on or reads it. A frame cut short is dropped
with its connection, so its stale bytes are never read.
"""

from __future__ import annotations

import ctypes

_from_string_and_size = ctypes.pythonapi.PyByteArray_FromStringAndSize
_from_string_and_size.restype = ctypes.py_object
_from_string_and_size.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)


def unfilled(size: int) -> bytearray:
    """A bytearray of ``size`` bytes whose content is undefined until the caller writes it."""
    if size < 0:
        raise ValueError(f"negative buffer size {size}")
    return _from_string_and_size(None, size)
