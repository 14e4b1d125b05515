"""A minimal protobuf (proto2) wire-format decoder, enough to read CRIU images without generated code.

Only the wire format is decoded: a message becomes, per field number, the list of raw values in the
order met (varint and fixed-width fields as ``int``, length-delimited fields as ``bytes``). The
caller knows the schema and asks for a field as an unsigned integer, a bool, bytes or a nested
message. Groups (wire types 3 and 4) are not used by CRIU and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from ferry.criu.errors import ImageError

__all__ = ["Message", "WireType", "read_varint"]

_U64 = (1 << 64) - 1


class WireType(IntEnum):
    VARINT = 0
    I64 = 1
    LEN = 2
    I32 = 5


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Decode a base-128 varint at ``pos``; return (value, next position)."""
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise ImageError("protobuf: truncated varint")
        if shift >= 70:
            raise ImageError("protobuf: varint longer than 10 bytes")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & _U64, pos
        shift += 7


@dataclass(frozen=True)
class Message:
    """A decoded message: field number -> raw values in wire order."""

    fields: dict[int, list[int | bytes]] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes | memoryview) -> Message:
        fields: dict[int, list[int | bytes]] = {}
        pos = 0
        end = len(data)
        while pos < end:
            key, pos = read_varint(data, pos)
            number, wire = key >> 3, key & 0x7
            if number == 0:
                raise ImageError("protobuf: field number 0")
            value: int | bytes
            if wire == WireType.VARINT:
                value, pos = read_varint(data, pos)
            elif wire == WireType.I64:
                if pos + 8 > end:
                    raise ImageError("protobuf: truncated 64-bit field")
                value = int.from_bytes(data[pos : pos + 8], "little")
                pos += 8
            elif wire == WireType.I32:
                if pos + 4 > end:
                    raise ImageError("protobuf: truncated 32-bit field")
                value = int.from_bytes(data[pos : pos + 4], "little")
                pos += 4
            elif wire == WireType.LEN:
                length, pos = read_varint(data, pos)
                if pos + length > end:
                    raise ImageError("protobuf: truncated length-delimited field")
                value = bytes(data[pos : pos + length])
                pos += length
            else:
                raise ImageError(f"protobuf: unsupported wire type {wire} (field {number})")
            fields.setdefault(number, []).append(value)
        return cls(fields)

    def has(self, number: int) -> bool:
        return number in self.fields

    def _last(self, number: int) -> int | bytes | None:
        values = self.fields.get(number)
        return values[-1] if values else None

    def uint(self, number: int, default: int | None = None) -> int:
        """A scalar numeric field (last one wins, as protobuf says); ``default`` when absent."""
        value = self._last(number)
        if value is None:
            if default is None:
                raise ImageError(f"protobuf: required field {number} missing")
            return default
        if isinstance(value, bytes):
            raise ImageError(f"protobuf: field {number} is length-delimited, expected a number")
        return value

    def optional_uint(self, number: int) -> int | None:
        return self.uint(number) if self.has(number) else None

    def boolean(self, number: int, default: bool = False) -> bool:
        return bool(self.uint(number, int(default)))

    def raw(self, number: int) -> bytes | None:
        value = self._last(number)
        if value is None:
            return None
        if isinstance(value, int):
            raise ImageError(f"protobuf: field {number} is numeric, expected bytes")
        return value

    def message(self, number: int) -> Message | None:
        """A nested message field; ``None`` when absent. Repeated occurrences merge, as in protobuf."""
        values = self.fields.get(number)
        if not values:
            return None
        merged: dict[int, list[int | bytes]] = {}
        for value in values:
            if isinstance(value, int):
                raise ImageError(f"protobuf: field {number} is numeric, expected a message")
            for key, items in Message.parse(value).fields.items():
                merged.setdefault(key, []).extend(items)
        return Message(merged)

    def messages(self, number: int) -> list[Message]:
        """A repeated nested message field."""
        result = []
        for value in self.fields.get(number, []):
            if isinstance(value, int):
                raise ImageError(f"protobuf: field {number} is numeric, expected a message")
            result.append(Message.parse(value))
        return result
