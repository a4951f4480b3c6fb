"""Variable-length integers: unsigned (protobuf's keys and lengths, Kafka's compact sizes) and
zigzag-signed (Kafka's record fields). Seven bits a byte, least significant group first, the high
bit set on every byte but the last; at most ten bytes (64 bits)."""

from __future__ import annotations

_MASK_64 = 0xFFFFFFFFFFFFFFFF


class VarintError(ValueError):
    """Bytes that end inside a varint, or a varint longer than ten bytes."""


_ONE_BYTE = [bytes([n]) for n in range(0x80)]


def encode_uvarint(value: int) -> bytes:
    """``value`` (0 <= value < 2**64) as an unsigned varint."""
    if 0 <= value <= 0x7F:
        return _ONE_BYTE[value]  # most lengths and counts
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """``value`` (a signed 64-bit integer) as a zigzag varint."""
    return encode_uvarint(((value << 1) ^ (value >> 63)) & _MASK_64)


def decode_uvarint(data: bytes | bytearray | memoryview, position: int,
                   end: int | None = None) -> tuple[int, int]:
    """The unsigned varint at ``position`` (reading no further than ``end``, default the end of
    ``data``) and the position after it. Raises :class:`VarintError`."""
    if end is None:
        end = len(data)
    result = shift = 0
    while True:
        if position >= end:
            raise VarintError("truncated varint")
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift > 63:
            raise VarintError("varint longer than ten bytes")


def decode_varint(data: bytes | bytearray | memoryview, position: int,
                  end: int | None = None) -> tuple[int, int]:
    """The zigzag varint at ``position`` and the position after it. Raises
    :class:`VarintError`."""
    raw, position = decode_uvarint(data, position, end)
    return (raw >> 1) ^ -(raw & 1), position
