"""Hypothesis strategies that damage valid encodings: bit flips, truncation, extension, and
length prefixes or varints overwritten with extreme values (the inputs a decoder most often
trusts). Shared by the fuzz tests of every decoder and by ``bench/fuzz.py``."""

from __future__ import annotations

import struct
from collections.abc import Sequence

from hypothesis import strategies as st

# Values a length or count field is most likely to be mishandled with.
_EXTREME_INT32 = (-2, -1, 0, 1, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -0x80000000)
_EXTREME_VARINTS = (b"\xff\xff\xff\xff\x07", b"\xff\xff\xff\xff\x0f", b"\x80" * 10 + b"\x01",
                    b"\xff" * 11, b"\x80", b"\x00", b"\x01", b"\xfe\xff\xff\xff\x0f")


@st.composite
def mutated(draw: st.DrawFn, valid: Sequence[bytes], max_mutations: int = 4) -> bytes:
    """One of ``valid`` with up to ``max_mutations`` damages applied."""
    data = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.integers(1, max_mutations))):
        kind = draw(st.sampled_from(("flip", "truncate", "extend", "int16", "int32", "varint",
                                     "delete")))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=16))
        elif kind == "int16":
            data[at:at + 2] = struct.pack(">h", draw(st.sampled_from((-2, -1, 0x7FFF, 1))))
        elif kind == "int32":
            data[at:at + 4] = struct.pack(">i", draw(st.sampled_from(_EXTREME_INT32)))
        elif kind == "varint":
            data[at:at + 1] = draw(st.sampled_from(_EXTREME_VARINTS))
        elif kind == "delete" and data:
            del data[at:at + draw(st.integers(1, 8))]
    return bytes(data)
