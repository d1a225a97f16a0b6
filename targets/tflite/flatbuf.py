"""A tiny FlatBuffers writer: just what the TFLite translator needs.

Objects are described first (:class:`Table`, :class:`Vector`, :class:`String`)
and serialised front to back by :func:`finish`: a table's vtable is written
just before it, its inline fields next, then the objects it references (an
uoffset always points forward, as the format requires), and the offsets are
patched.  Scalars are aligned to their size, vectors to 4 and to their
element size (``align`` raises it, e.g. 16 for tensor data).
"""
from __future__ import annotations

import struct

import numpy as np

_FMT = {"u8": "<B", "i8": "<b", "bool": "<B", "i16": "<h", "u16": "<H", "i32": "<i", "u32": "<I", "f32": "<f",
        "i64": "<q", "u64": "<Q"}
_SIZE = {k: struct.calcsize(v) for k, v in _FMT.items()}


class Table:
    """Fields: slot -> (kind, value); kind is a scalar kind or "ref" (a Table/Vector/String)."""

    def __init__(self, **_):
        self.fields: dict[int, tuple[str, object]] = {}

    def scalar(self, slot: int, kind: str, value, default=0) -> "Table":
        if value != default:
            self.fields[slot] = (kind, value)
        return self

    def ref(self, slot: int, obj) -> "Table":
        if obj is not None:
            self.fields[slot] = ("ref", obj)
        return self


class Vector:
    """A vector of scalars (``kind``), of raw bytes (kind "bytes") or of objects (kind "ref")."""

    def __init__(self, kind: str, items, align: int = 4):
        self.kind = kind
        self.items = items
        self.align = align


class String:
    def __init__(self, text: str):
        self.data = text.encode()


class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def pad_to(self, align: int, offset: int = 0) -> None:
        # pad so that len(buf) + offset is a multiple of align
        self.buf += b"\0" * ((-(len(self.buf) + offset)) % align)

    def write(self, obj) -> int:
        if isinstance(obj, Table):
            return self._table(obj)
        if isinstance(obj, Vector):
            return self._vector(obj)
        if isinstance(obj, String):
            self.pad_to(4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(obj.data)) + obj.data + b"\0"
            return pos
        raise TypeError(f"cannot serialise {type(obj).__name__}")

    def _table(self, t: Table) -> int:
        slots = sorted(t.fields)
        nslots = (slots[-1] + 1) if slots else 0
        # inline layout: soffset, then fields largest first
        layout = []
        off = 4
        for slot in sorted(slots, key=lambda s: -(4 if t.fields[s][0] == "ref" else _SIZE[t.fields[s][0]])):
            kind = t.fields[slot][0]
            size = 4 if kind == "ref" else _SIZE[kind]
            off += (-off) % size
            layout.append((slot, off, kind, size))
            off += size
        table_size = off + ((-off) % 4)
        vt = struct.pack("<HH", 4 + 2 * nslots, table_size)
        field_off = {slot: o for slot, o, _, _ in layout}
        vt += b"".join(struct.pack("<H", field_off.get(s, 0)) for s in range(nslots))
        # vtable then table; the table start must be 4- (8-)aligned
        align = 8 if any(size == 8 for *_, size in layout) else 4
        self.pad_to(2)
        self.pad_to(align, len(vt))
        vt_pos = len(self.buf)
        self.buf += vt
        pos = len(self.buf)
        assert pos % align == 0
        body = bytearray(table_size)
        struct.pack_into("<i", body, 0, pos - vt_pos)
        refs = []
        for slot, o, kind, _ in layout:
            value = t.fields[slot][1]
            if kind == "ref":
                refs.append((pos + o, value))
            else:
                struct.pack_into(_FMT[kind], body, o, value)
        self.buf += body
        for at, obj in refs:
            child = self.write(obj)
            struct.pack_into("<I", self.buf, at, child - at)
        return pos

    def _vector(self, v: Vector) -> int:
        if v.kind == "bytes":
            data = bytes(v.items)
            self.pad_to(max(v.align, 4), 4)
            pos = len(self.buf)
            self.buf += struct.pack("<I", len(data)) + data
            return pos
        if v.kind == "ref":
            self.pad_to(4)
            pos = len(self.buf)
            n = len(v.items)
            self.buf += struct.pack("<I", n) + b"\0" * (4 * n)
            for i, obj in enumerate(v.items):
                at = pos + 4 + 4 * i
                child = self.write(obj)
                struct.pack_into("<I", self.buf, at, child - at)
            return pos
        size = _SIZE[v.kind]
        self.pad_to(max(4, size), 4)
        pos = len(self.buf)
        self.buf += struct.pack("<I", len(v.items))
        self.buf += b"".join(struct.pack(_FMT[v.kind], x) for x in v.items)
        return pos


def finish(root: Table, identifier: bytes) -> bytes:
    """Serialise the object tree under ``root`` with a 4-byte file identifier."""
    w = _Writer()
    w.buf += b"\0\0\0\0" + identifier
    root_pos = w.write(root)
    struct.pack_into("<I", w.buf, 0, root_pos)
    w.pad_to(16)
    return bytes(w.buf)


def int_vector(values, kind="i32") -> Vector:
    return Vector(kind, [int(x) for x in values])


def float_vector(values) -> Vector:
    return Vector("f32", [float(x) for x in np.asarray(values, np.float32).reshape(-1)])
