"""Helpers for the format tests: small artifacts, and byte-level surgery on them.

Surgery helpers re-seal what they touch (section CRC, header CRC) so that a
test can check that the *structural* verifier, not the checksum, catches the
problem it planted.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from minirt.builder.writer import ArtifactWriter
from minirt.format import schema as S

HEADER = struct.Struct("<8sIIIIQQII16s")
ENTRY = struct.Struct("<IIQQII")


def minimal_writer(offset: float = 0) -> ArtifactWriter:
    """y = Add(x, w) over a float32 initializer w = arange(6) + ``offset`` (2 x 3), written straight through
    the writer."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    w.set_metadata("producer.name", "tests")
    op = w.operator("", "Add", 17)
    t = w.tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + np.float32(offset))
    _, g = w.graph("main")
    x = g.value("x", 1, ("N", 3))
    g.inputs.append(x)
    wv = g.value("w", 1, (2, 3))
    g.initializers.append((wv, t))
    y = g.value("y", 1, (2, 3))
    g.add_node("add", op, [x, wv], [y], [])
    g.outputs.append(y)
    return w


def minimal_bytes() -> bytes:
    return minimal_writer().to_bytes()


def section_entries(buf: bytes) -> list[tuple]:
    """[(kind, flags, offset, length, crc32, entry_file_offset)] in table order."""
    _, _, _, count, esize, toff, *_ = HEADER.unpack_from(buf, 0)
    out = []
    for i in range(count):
        pos = toff + i * esize
        kind, flags, off, length, crc, _ = ENTRY.unpack_from(buf, pos)
        out.append((kind, flags, off, length, crc, pos))
    return out


def section(buf: bytes, kind: int) -> tuple[int, int]:
    """(offset, length) of the first section of ``kind``."""
    for k, _, off, length, _, _ in section_entries(buf):
        if k == kind:
            return off, length
    raise KeyError(kind)


def fix_header_crc(buf: bytes | bytearray) -> bytearray:
    """Recompute header_crc32 (header bytes [0, 44) then the section table)."""
    b = bytearray(buf)
    _, _, _, count, esize, toff, *_ = HEADER.unpack_from(b, 0)
    crc = zlib.crc32(bytes(b[toff : toff + count * esize]), zlib.crc32(bytes(b[:44])))
    struct.pack_into("<I", b, 44, crc)
    return b


def fix_section_crcs(buf: bytes | bytearray) -> bytearray:
    """Recompute every section's CRC, then the header CRC."""
    b = bytearray(buf)
    for _, _, off, length, _, pos in section_entries(b):
        struct.pack_into("<I", b, pos + 24, zlib.crc32(bytes(b[off : off + length])))
    return fix_header_crc(b)


def set_header_field(buf: bytes, fmt: str, offset: int, value) -> bytearray:
    b = bytearray(buf)
    struct.pack_into(fmt, b, offset, value)
    return fix_header_crc(b)


def set_entry_field(buf: bytes, index: int, field_offset: int, fmt: str, value) -> bytearray:
    """Patch field of section-table entry ``index`` (kind 0, flags 4, offset 8, length 16) and re-seal."""
    b = bytearray(buf)
    pos = section_entries(b)[index][5]
    struct.pack_into(fmt, b, pos + field_offset, value)
    return fix_header_crc(b)


def relayout(sections: list[tuple[int, int, bytes]], version: int | None = None) -> bytes:
    """A well-formed file (aligned, correct CRCs) holding ``[(kind, flags, payload)]`` in order: a payload
    flagged SECTION_FLAG_DEFLATE is a zlib stream (its inflated length goes into the entry).  ``version``
    by default as the writer's: 2 when a section is compressed, else 1."""
    table_off = 64
    off = -(-(table_off + 32 * len(sections)) // 64) * 64
    if version is None:
        version = 2 if any(flags & S.SECTION_FLAG_DEFLATE for _, flags, _ in sections) else S.MIN_FORMAT_VERSION
    entries, body = [], b""
    for kind, flags, payload in sections:
        inflated = len(zlib.decompress(payload)) if flags & S.SECTION_FLAG_DEFLATE else 0
        entries.append(ENTRY.pack(kind, flags, off, len(payload), zlib.crc32(payload), inflated))
        padded = payload + b"\0" * ((-len(payload)) % 64)
        body += padded
        off += len(padded)
    table = b"".join(entries)
    pad = b"\0" * ((-(table_off + len(table))) % 64)
    head = HEADER.pack(S.MAGIC, version, 64, len(sections), 32, table_off, off, 0, 0, b"\0" * 16)
    return bytes(fix_header_crc(head + table + pad + body))


def split(buf: bytes) -> list[tuple[int, int, bytes]]:
    """The inverse of :func:`relayout`: ``[(kind, flags, payload)]`` in table order."""
    return [(k, f, bytes(buf[o : o + n])) for k, f, o, n, _, _ in section_entries(buf)]


def replace_section(buf: bytes, kind: int, payload: bytes) -> bytes:
    return relayout([(k, f, payload if k == kind else p) for k, f, p in split(buf)])
