"""Structure-aware mutator for .mrt artifacts.

Random byte flips almost never get past the header CRC, so they only test the
checksum.  This mutator understands the layout (``minirt/format/schema.py``):

* :func:`split` parses the header and section table into editable entries
  (kind, flags, payload; a compressed section inflated, so that mutations edit its
  grammar) and :func:`assemble` lays them out again the way the writer does
  (compressing those again), with fresh section and header CRCs;
* :func:`walk_fields` decodes a section's grammar just far enough to record
  where every field is: ``Field(offset, size, fmt, label)`` for counts,
  indices, dtype codes, ranks, dims, attribute kinds, string lengths ...;
* :class:`Mutator` picks mutations (field values set to interesting numbers,
  items duplicated or dropped at field boundaries, section payloads spliced
  between seeds, section-table and header fields rewritten, truncation,
  extension, plain byte flips) and, in most cases, repairs the CRCs so that
  the mutant reaches the structural verifier and the session.

Everything is driven by one ``random.Random``, so ``Mutator(seeds).mutate(
random.Random(key))`` is reproducible from ``key`` alone.
"""
from __future__ import annotations

import dataclasses
import random
import struct
import zlib

from minirt.format import schema as S

_FMT_SIZE = {"B": 1, "I": 4, "i": 4, "q": 8, "Q": 8, "f": 4, "d": 8}


@dataclasses.dataclass(frozen=True)
class Field:
    offset: int  # relative to the section payload
    size: int
    fmt: str  # struct code, or "s" for a byte-string body
    label: str  # e.g. "graph.value.dtype", "tensor.dim", "node.input"


@dataclasses.dataclass
class Entry:
    kind: int
    flags: int  # without SECTION_FLAG_DEFLATE: the payload here is always the section's grammar
    payload: bytes
    deflate: bool = False  # stored as a zlib stream (format version 2), as the writer stored it


# --- parsing and layout -------------------------------------------------------


def split(data: bytes) -> list[Entry] | None:
    """Section entries of a well-formed artifact, or None if the table is unreadable."""
    if len(data) < S.HEADER.size:
        return None
    _m, _v, _hs, count, esz, table, _fs, _fl, _crc, _r = S.HEADER.unpack_from(data, 0)
    if esz < S.SECTION_ENTRY.size or count > 4096 or table + count * esz > len(data):
        return None
    out = []
    for i in range(count):
        kind, flags, off, length, _c, _ = S.SECTION_ENTRY.unpack_from(data, table + i * esz)
        if off + length > len(data):
            return None
        payload = bytes(data[off : off + length])
        deflate = bool(flags & S.SECTION_FLAG_DEFLATE)
        if deflate:
            try:
                payload = zlib.decompress(payload)
            except zlib.error:
                return None
        out.append(Entry(kind, flags & ~S.SECTION_FLAG_DEFLATE, payload, deflate))
    return out


def assemble(entries: list[Entry], *, table_at_end: bool = False, version: int | None = None) -> bytes:
    """Lay out ``entries`` like the writer does, with correct CRCs and file size; ``version`` by default
    the writer's: 2 when a section is compressed, else 1."""
    n = len(entries)
    table_size = n * S.SECTION_ENTRY.size
    offset = S.aligned_size(S.HEADER.size + (0 if table_at_end else table_size))
    if version is None:
        version = 2 if any(e.deflate for e in entries) else S.MIN_FORMAT_VERSION
    rows, body = [], []
    for e in entries:
        stored = zlib.compress(e.payload, 9) if e.deflate else e.payload
        flags = e.flags | (S.SECTION_FLAG_DEFLATE if e.deflate else 0)
        rows.append((e.kind, flags, offset, len(stored), zlib.crc32(stored), len(e.payload) if e.deflate else 0))
        pad = S.padding_required(len(stored))
        body.append(stored + b"\x00" * pad)
        offset += len(stored) + pad
    table = b"".join(S.SECTION_ENTRY.pack(k, f, o, ln, c, z) for k, f, o, ln, c, z in rows)
    if table_at_end:
        table_offset = offset
        file_size = offset + table_size
    else:
        table_offset = S.HEADER.size
        file_size = offset
    head = S.HEADER.pack(S.MAGIC, version, S.HEADER.size, n, S.SECTION_ENTRY.size, table_offset, file_size, 0, 0, b"\x00" * 16)
    crc = zlib.crc32(table, zlib.crc32(head[: S.HEADER_CRC_SPAN]))
    head = head[:44] + struct.pack("<I", crc) + head[48:]
    if table_at_end:
        first = S.aligned_size(S.HEADER.size)
        out = head + b"\x00" * (first - S.HEADER.size) + b"".join(body) + table
    else:
        first = S.aligned_size(S.HEADER.size + table_size)
        out = head + table + b"\x00" * (first - S.HEADER.size - table_size) + b"".join(body)
    assert len(out) == file_size
    return out


def fix_crcs(buf: bytearray, sections: bool = True, header: bool = True) -> None:
    """Recompute, in place, whatever CRCs the (possibly damaged) layout still lets us locate."""
    if len(buf) < S.HEADER.size:
        return
    _m, _v, _hs, count, esz, table, _fs, _fl, _crc, _r = S.HEADER.unpack_from(buf, 0)
    if esz < S.SECTION_ENTRY.size or count > 4096 or table + count * esz > len(buf):
        return
    if sections:
        for i in range(count):
            at = table + i * esz
            _k, _f, off, length, _c, _ = S.SECTION_ENTRY.unpack_from(buf, at)
            if off + length <= len(buf):
                struct.pack_into("<I", buf, at + 24, zlib.crc32(bytes(buf[off : off + length])))
    if header:
        crc = zlib.crc32(bytes(buf[: S.HEADER_CRC_SPAN]))
        crc = zlib.crc32(bytes(buf[table : table + count * esz]), crc)
        struct.pack_into("<I", buf, S.HEADER_CRC_SPAN, crc)


# --- the field walker -----------------------------------------------------------


class _Stop(Exception):
    pass


class _Walk:
    """A lenient cursor that records each field it reads; stops at the first impossibility."""

    def __init__(self, buf: bytes):
        self.buf = buf
        self.pos = 0
        self.fields: list[Field] = []

    def take(self, fmt: str, label: str):
        size = _FMT_SIZE[fmt]
        if self.pos + size > len(self.buf):
            raise _Stop
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.fields.append(Field(self.pos, size, fmt, label))
        self.pos += size
        return v

    def count(self, label: str, min_size: int) -> int:
        n = self.take("I", label)
        if n * max(min_size, 1) > len(self.buf) - self.pos:
            raise _Stop
        return n

    def raw(self, label: str) -> None:
        n = self.take("I", label + ".len")
        if self.pos + n > len(self.buf):
            raise _Stop
        if n:
            self.fields.append(Field(self.pos, n, "s", label))
        self.pos += n


def _walk_metadata(w: _Walk) -> None:
    for _ in range(w.count("meta.count", 6)):
        w.raw("meta.key")
        kind = w.take("B", "meta.kind")
        if kind == S.META_INT:
            w.take("q", "meta.int")
        elif kind == S.META_FLOAT:
            w.take("d", "meta.float")
        elif kind in (S.META_STRING, S.META_JSON):
            w.raw("meta.str")
        elif kind == S.META_BOOL:
            w.take("B", "meta.bool")
        else:
            raise _Stop


def _walk_operators(w: _Walk) -> None:
    for _ in range(w.count("opset.count", 12)):
        w.raw("opset.domain")
        w.take("q", "opset.version")
    for _ in range(w.count("op.count", 12)):
        w.raw("op.domain")
        w.raw("op.type")
        w.take("q", "op.opset")


def _walk_tensors(w: _Walk) -> None:
    for _ in range(w.count("tensor.count", 24)):
        w.take("I", "tensor.dtype")
        rank = w.take("I", "tensor.rank")
        if rank > S.MAX_RANK:
            raise _Stop
        for _ in range(rank):
            w.take("q", "tensor.dim")
        w.take("Q", "tensor.offset")
        w.take("Q", "tensor.nbytes")


def _walk_attribute(w: _Walk) -> None:
    kind = w.take("B", "attr.kind")
    simple = {S.ATTR_FLOAT: "f", S.ATTR_INT: "q", S.ATTR_TENSOR: "I", S.ATTR_GRAPH: "I"}
    lists = {S.ATTR_FLOATS: ("f", 4), S.ATTR_INTS: ("q", 8), S.ATTR_TENSORS: ("I", 4), S.ATTR_GRAPHS: ("I", 4)}
    if kind in simple:
        w.take(simple[kind], f"attr.{S.ATTR_NAMES[kind]}")
    elif kind == S.ATTR_STRING:
        w.raw("attr.string")
    elif kind in lists:
        fmt, size = lists[kind]
        for _ in range(w.count(f"attr.{S.ATTR_NAMES[kind]}.count", size)):
            w.take(fmt, f"attr.{S.ATTR_NAMES[kind]}.item")
    elif kind == S.ATTR_STRINGS:
        for _ in range(w.count("attr.strings.count", 4)):
            w.raw("attr.strings.item")
    else:
        raise _Stop


def _walk_graphs(w: _Walk) -> None:
    for _ in range(w.count("graph.count", 28)):
        w.raw("graph.name")
        for _ in range(w.count("value.count", 9)):
            w.raw("value.name")
            w.take("I", "value.dtype")
            rank = w.take("i", "value.rank")
            if rank != S.RANK_UNKNOWN:
                if not 0 <= rank <= S.MAX_RANK:
                    raise _Stop
                for _ in range(rank):
                    kind = w.take("B", "value.dim.kind")
                    if kind == S.DIM_FIXED:
                        w.take("q", "value.dim")
                    elif kind == S.DIM_SYMBOLIC:
                        w.raw("value.dim.symbol")
                    elif kind != S.DIM_UNKNOWN:
                        raise _Stop
            if hasattr(S, "VALUE_KINDS"):  # format revision with sequence/optional values
                w.take("B", "value.kind")
        for what in ("graph.input", "graph.output"):
            for _ in range(w.count(what + ".count", 4)):
                w.take("i", what)
        for _ in range(w.count("init.count", 8)):
            w.take("i", "init.value")
            w.take("i", "init.tensor")
        for _ in range(w.count("capture.count", 4)):
            w.take("i", "capture")
        for _ in range(w.count("node.count", 16)):
            w.raw("node.name")
            w.take("i", "node.op")
            for what in ("node.input", "node.output"):
                for _ in range(w.count(what + ".count", 4)):
                    w.take("i", what)
            for _ in range(w.count("attr.count", 5)):
                w.raw("attr.name")
                _walk_attribute(w)


def _walk_signature(w: _Walk) -> None:
    w.take("I", "sig.algorithm")
    for label, n in (("sig.public_key", 32), ("sig.signature", 64)):
        if w.pos + n > len(w.buf):
            raise _Stop
        w.fields.append(Field(w.pos, n, "s", label))
        w.pos += n


_WALKERS = {
    S.SECTION_METADATA: _walk_metadata,
    S.SECTION_OPERATORS: _walk_operators,
    S.SECTION_TENSORS: _walk_tensors,
    S.SECTION_GRAPHS: _walk_graphs,
    S.SECTION_SIGNATURE: _walk_signature,
}

_walk_cache: dict[tuple[int, bytes], tuple] = {}


def walk_fields(kind: int, payload: bytes) -> tuple:
    """Fields of a section payload, in order (as far as the payload parses)."""
    key = (kind, payload)
    hit = _walk_cache.get(key)
    if hit is not None:
        return hit
    walker = _WALKERS.get(kind)
    fields: tuple = ()
    if walker is not None:
        w = _Walk(payload)
        try:
            walker(w)
        except _Stop:
            pass
        fields = tuple(w.fields)
    if len(_walk_cache) > 512:
        _walk_cache.clear()
    _walk_cache[key] = fields
    return fields


# --- interesting values ------------------------------------------------------------

_INT_LIMITS = {
    "B": (0, 0xFF),
    "I": (0, 0xFFFFFFFF),
    "i": (-(2**31), 2**31 - 1),
    "q": (-(2**63), 2**63 - 1),
    "Q": (0, 2**64 - 1),
}


def _interesting_ints(fmt: str, old: int, label: str, section_len: int) -> list[int]:
    vals = [0, 1, 2, -1, old + 1, old - 1, old * 2, old + 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF,
            0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 2**32, 2**62, 2**63 - 1, -(2**31), -(2**63),
            section_len, section_len + 1, section_len // 2, 64, 63, 65]
    if label.endswith("dtype"):
        vals += list(range(0, 18)) + [8, 8, 16, 255]
    if label.endswith("rank"):
        vals += [0, 1, 3, S.MAX_RANK, S.MAX_RANK + 1, -2]
    if label.endswith("dim") or label.endswith("nbytes"):
        vals += [0, 2**31, 2**40, 2**61, 3 * 2**61, 10**9]
    if label.endswith("kind"):
        vals += list(range(0, 12))
    if label.endswith("offset"):
        vals += [0, 64, 128, old + 64, old - 64, section_len - 64]
    lo, hi = _INT_LIMITS[fmt]
    span = hi - lo + 1
    # Wrap into the field's range, the way a C cast would.
    return [((v - lo) % span) + lo for v in vals]


_INDEX_LABELS = frozenset({
    "graph.input", "graph.output", "init.value", "init.tensor", "capture", "node.op", "node.input",
    "node.output", "attr.tensor", "attr.graph", "attr.tensors.item", "attr.graphs.item", "tensor.dim",
    "value.dim", "value.dtype", "tensor.dtype", "attr.int", "attr.ints.item",
})

_INTERESTING_F32 = [0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 3.4e38, 1e-45, 2.0**31, -(2.0**63)]


def _interesting_bytes(n: int, rng: random.Random) -> bytes:
    pick = rng.random()
    if pick < 0.25:
        return b"\x00" * n
    if pick < 0.5:
        return b"\xff" * n
    if pick < 0.6:
        return b"\x80" * n
    if pick < 0.7:
        return ("\udcff" * n).encode("utf-8", "surrogatepass")[:n]  # invalid UTF-8
    return bytes(rng.getrandbits(8) for _ in range(n))


# --- the mutator ---------------------------------------------------------------------


class Mutator:
    """Mutates valid seed artifacts.  ``mutate(rng)`` returns ``(bytes, description)``."""

    def __init__(self, seeds: list[tuple[str, bytes]]):
        self.seeds = [(name, data, split(data)) for name, data in seeds]
        for name, _data, entries in self.seeds:
            if entries is None:
                raise ValueError(f"seed {name} is not a well-formed artifact")
        # Same-kind payloads from every seed, for cross-seed splicing.
        self.payloads: dict[int, list[bytes]] = {}
        for _n, _d, entries in self.seeds:
            for e in entries:
                self.payloads.setdefault(e.kind, []).append(e.payload)

        self.content_ops = [
            (30, self._field_set),
            (6, self._field_copy),
            (8, self._field_delete),
            (8, self._field_duplicate),
            (6, self._byte_flip),
            (4, self._bytes_set),
            (4, self._insert_bytes),
            (4, self._splice_payload),
            (6, self._tensor_data),
            (3, self._truncate_payload),
            (8, self._tensor_record),
        ]
        self.table_ops = [
            (3, self._drop_entry),
            (3, self._duplicate_entry),
            (2, self._swap_entries),
            (3, self._retag_entry),
        ]
        self.raw_ops = [
            (5, self._raw_table_field),
            (3, self._raw_header_field),
            (3, self._raw_truncate),
            (2, self._raw_extend),
            (2, self._raw_flip),
        ]

    # --- driver ---------------------------------------------------------------
    def mutate(self, rng: random.Random) -> tuple[bytes, list[str]]:
        name, _data, entries = rng.choice(self.seeds)
        entries = [Entry(e.kind, e.flags, e.payload, e.deflate) for e in entries]
        log = [f"seed={name}"]
        # 1-3 structural/content mutations, then maybe a raw one.
        for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
            if rng.random() < 0.93:
                op = _weighted(rng, self.content_ops)
                i = self._pick_section(rng, entries)
                if i is None:
                    continue
                new, what = op(rng, entries[i])
                entries[i] = Entry(entries[i].kind, entries[i].flags, new, entries[i].deflate)
                log.append(f"{op.__name__.lstrip('_')}[{_kind_name(entries[i].kind)}]: {what}")
            else:
                op = _weighted(rng, self.table_ops)
                log.append(f"{op.__name__.lstrip('_')}: {op(rng, entries)}")
        table_at_end = rng.random() < 0.05
        out = bytearray(assemble(entries, table_at_end=table_at_end))
        if table_at_end:
            log.append("table_at_end")
        if rng.random() < 0.2:
            op = _weighted(rng, self.raw_ops)
            log.append(f"{op.__name__.lstrip('_')}: {op(rng, out)}")
            roll = rng.random()
            if roll < 0.75:
                fix_crcs(out)
                log.append("crcs fixed")
            elif roll < 0.85:
                fix_crcs(out, sections=False)
                log.append("header crc fixed")
            else:
                log.append("crcs left stale")
        elif rng.random() < 0.03:
            # A stale section CRC with a correct header: the ChecksumError path.
            i = rng.randrange(len(entries)) if entries else 0
            at = S.HEADER.size + i * S.SECTION_ENTRY.size + 24
            if not table_at_end and at + 4 <= len(out):
                out[at] ^= 1
                fix_crcs(out, sections=False)
                log.append(f"section {i} crc stale")
        return bytes(out), log

    @staticmethod
    def _pick_section(rng: random.Random, entries: list[Entry]) -> int | None:
        if not entries:
            return None
        weights = {S.SECTION_GRAPHS: 6, S.SECTION_TENSORS: 5, S.SECTION_OPERATORS: 2, S.SECTION_METADATA: 1,
                   S.SECTION_TENSOR_DATA: 2, S.SECTION_PROVIDER_BLOB: 1}
        w = [weights.get(e.kind, 1) for e in entries]
        return rng.choices(range(len(entries)), weights=w)[0]

    # --- content mutations: (rng, entry) -> (new payload, description) ------
    def _fields(self, entry: Entry) -> tuple:
        return walk_fields(entry.kind, entry.payload)

    def _field_set(self, rng, entry):
        fields = [f for f in self._fields(entry) if f.fmt != "s"]
        if not fields:
            return self._byte_flip(rng, entry)
        f = rng.choice(fields)
        buf = bytearray(entry.payload)
        if f.fmt in ("f", "d"):
            v = rng.choice(_INTERESTING_F32)
        else:
            (old,) = struct.unpack_from("<" + f.fmt, buf, f.offset)
            if f.label in _INDEX_LABELS and rng.random() < 0.6:
                v = rng.randint(-1, max(old, 1) + 3)  # a plausible, often in-range, index
            elif f.label.endswith("count") and rng.random() < 0.3:
                v = max(0, old + rng.choice((-2, -1, 1, 2)))
            else:
                v = rng.choice(_interesting_ints(f.fmt, old, f.label, len(buf)))
            lo, hi = _INT_LIMITS[f.fmt]
            v = ((v - lo) % (hi - lo + 1)) + lo
        struct.pack_into("<" + f.fmt, buf, f.offset, v)
        return bytes(buf), f"{f.label}@{f.offset} := {v!r}"

    def _field_copy(self, rng, entry):
        fields = self._fields(entry)
        if len(fields) < 2:
            return self._byte_flip(rng, entry)
        a = rng.choice(fields)
        same = [f for f in fields if f.size == a.size and f is not a] or [a]
        b = rng.choice(same)
        buf = bytearray(entry.payload)
        buf[b.offset : b.offset + b.size] = entry.payload[a.offset : a.offset + a.size]
        return bytes(buf), f"{a.label}@{a.offset} copied over {b.label}@{b.offset}"

    def _field_delete(self, rng, entry):
        fields = self._fields(entry)
        if not fields:
            return self._truncate_payload(rng, entry)
        i = rng.randrange(len(fields))
        j = min(len(fields), i + rng.choice((1, 1, 2, 3, 5, 8)))
        start, end = fields[i].offset, fields[j - 1].offset + fields[j - 1].size
        p = entry.payload
        return p[:start] + p[end:], f"deleted fields {i}..{j - 1} ({fields[i].label}..{fields[j - 1].label}) bytes [{start},{end})"

    def _field_duplicate(self, rng, entry):
        fields = self._fields(entry)
        if not fields:
            return self._insert_bytes(rng, entry)
        i = rng.randrange(len(fields))
        j = min(len(fields), i + rng.choice((1, 2, 3, 4, 6, 10)))
        start, end = fields[i].offset, fields[j - 1].offset + fields[j - 1].size
        p = entry.payload
        return p[:end] + p[start:end] + p[end:], f"duplicated fields {i}..{j - 1} ({fields[i].label}..{fields[j - 1].label})"

    def _byte_flip(self, rng, entry):
        p = bytearray(entry.payload)
        if not p:
            return self._insert_bytes(rng, entry)
        flips = []
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            i = rng.randrange(len(p))
            bit = rng.randrange(8)
            p[i] ^= 1 << bit
            flips.append((i, bit))
        return bytes(p), f"bit flips {flips}"

    def _bytes_set(self, rng, entry):
        p = bytearray(entry.payload)
        if not p:
            return self._insert_bytes(rng, entry)
        n = min(len(p), rng.choice((1, 2, 4, 8, 16)))
        i = rng.randrange(len(p) - n + 1)
        p[i : i + n] = _interesting_bytes(n, rng)
        return bytes(p), f"bytes [{i},{i + n}) := {bytes(p[i:i + n]).hex()}"

    def _insert_bytes(self, rng, entry):
        fields = self._fields(entry)
        p = entry.payload
        at = rng.choice([f.offset for f in fields] + [len(p)]) if fields else rng.randint(0, len(p))
        ins = _interesting_bytes(rng.choice((1, 4, 8, 9, 16, 64)), rng)
        return p[:at] + ins + p[at:], f"inserted {ins.hex()} at {at}"

    def _splice_payload(self, rng, entry):
        others = [q for q in self.payloads.get(entry.kind, []) if q != entry.payload]
        if not others:
            return self._byte_flip(rng, entry)
        other = rng.choice(others)
        if rng.random() < 0.5:
            return other, f"payload replaced by another seed's ({len(other)} bytes)"
        cut_a = rng.randint(0, len(entry.payload))
        cut_b = rng.randint(0, len(other))
        return entry.payload[:cut_a] + other[cut_b:], f"crossover at {cut_a}/{cut_b}"

    def _tensor_data(self, rng, entry):
        """Overwrite 4/8-byte words with values that upset kernels (NaN, huge, negative)."""
        p = bytearray(entry.payload)
        if len(p) < 8:
            return self._byte_flip(rng, entry)
        done = []
        for _ in range(rng.choice((1, 2, 4))):
            size = rng.choice((4, 8))
            i = rng.randrange(0, len(p) - size + 1, size) if len(p) >= size else 0
            if size == 4:
                v = rng.choice(_INTERESTING_F32 + [0x7FFFFFFF, -1, 2**20])
                struct.pack_into("<f" if isinstance(v, float) else "<i", p, i, v)
            else:
                v = rng.choice([-1, 0, 2**31, 2**40, 2**62, -(2**63), 10**6, 7])
                struct.pack_into("<q", p, i, v)
            done.append((i, v))
        return bytes(p), f"words {done}"

    def _truncate_payload(self, rng, entry):
        p = entry.payload
        if not p:
            return p + b"\x00", "appended a zero byte"
        n = rng.randint(0, len(p) - 1)
        return p[:n], f"truncated {len(p)} -> {n}"

    def _tensor_record(self, rng, entry):
        """Rewrite one tensor-table record consistently: new dims/dtype that keep (or break) nbytes."""
        if entry.kind != S.SECTION_TENSORS:
            return self._field_set(rng, entry)
        recs = decode_tensor_table(entry.payload)
        if not recs:
            return self._field_set(rng, entry)
        i = rng.randrange(len(recs))
        dtype, dims, offset, nbytes = recs[i]
        count = 1
        for d in dims:
            count *= d
        choice = rng.randrange(8)
        if choice == 0 and len(dims) > 1:
            dims = rng.sample(dims, len(dims))
            what = "dims shuffled"
        elif choice == 1:
            dims = [count] if rng.random() < 0.5 else [1] * rng.randint(0, 3) + list(dims) + [1] * rng.randint(0, 2)
            what = "dims flattened / padded with 1s"
        elif choice == 2:
            big = rng.choice((2**31, 2**32, 2**40, 2**61, 2**62, 2**63 - 1))
            dims = [0, big] + [rng.choice((big, 1, 3))] * rng.randint(0, 2)
            nbytes = 0
            what = f"empty with huge dims {dims}"
        elif choice == 3:
            # Same bytes, other element type of the same or a smaller size.
            sizes = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8}
            new = rng.choice([c for c in sizes if c != dtype] + [8])
            if new == 8 or dtype == 8 or dtype not in sizes:
                dims = [max(1, nbytes // 4)] if new == 8 else dims
            else:
                total = count * sizes[dtype]
                dims = [total // sizes[new]] if total % sizes[new] == 0 else dims
            dtype = new
            what = f"dtype := {new}, dims {dims}"
        elif choice == 4:
            dims = [rng.choice((2**32 + 1, 2**33, 3, 2**62)), rng.choice((2**32, 2**31 + 1, 2**62))]
            what = f"dims whose product overflows int64: {dims}"
        elif choice == 5:
            offset = rng.choice((0, offset + 64, offset - 64 if offset >= 64 else 0, 2**63, 2**64 - 64))
            what = f"offset := {offset}"
        elif choice == 6:
            j = rng.randrange(len(recs))
            dtype, dims, offset, nbytes = recs[j]
            what = f"copy of record {j}"
        else:
            dims = []
            nbytes = {1: 4, 7: 8, 6: 4, 9: 1}.get(dtype, nbytes)
            what = "rank 0"
        recs[i] = (dtype, list(dims), offset % 2**64, nbytes)
        return encode_tensor_table(recs), f"tensor {i}: {what}"

    # --- section-table mutations: (rng, entries) -> description, in place ----
    def _drop_entry(self, rng, entries):
        if not entries:
            return "nothing to drop"
        i = rng.randrange(len(entries))
        e = entries.pop(i)
        return f"dropped {_kind_name(e.kind)}"

    def _duplicate_entry(self, rng, entries):
        if not entries:
            return "nothing to duplicate"
        i = rng.randrange(len(entries))
        entries.insert(rng.randint(0, len(entries)), Entry(entries[i].kind, entries[i].flags, entries[i].payload,
                                                           entries[i].deflate))
        return f"duplicated {_kind_name(entries[i].kind)}"

    def _swap_entries(self, rng, entries):
        if len(entries) < 2:
            return "nothing to swap"
        i, j = rng.sample(range(len(entries)), 2)
        entries[i].kind, entries[j].kind = entries[j].kind, entries[i].kind
        return f"swapped kinds of entries {i} and {j}"

    def _retag_entry(self, rng, entries):
        if not entries:
            return "nothing to retag"
        i = rng.randrange(len(entries))
        kind = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 99, 0xFFFFFFFF])
        flags = rng.choice([entries[i].flags, 0, 1, 2, 0xFFFFFFFF])
        entries[i].kind, entries[i].flags = kind, flags
        if rng.random() < 0.3:  # stored compressed or not: any kind, any format version
            entries[i].deflate = not entries[i].deflate
        return f"entry {i} := kind {kind} flags {flags:#x}{' deflated' if entries[i].deflate else ''}"

    # --- raw mutations on the assembled bytes: (rng, bytearray) -> description ---
    def _raw_table_field(self, rng, buf):
        _m, _v, _hs, count, esz, table, _fs, _fl, _c, _r = S.HEADER.unpack_from(buf, 0)
        if not count or table + count * esz > len(buf):
            return "no table"
        i = rng.randrange(count)
        at = table + i * esz
        kind, flags, off, length, crc, res = S.SECTION_ENTRY.unpack_from(buf, at)
        name, fmt, pos, old = rng.choice([
            ("kind", "I", 0, kind), ("flags", "I", 4, flags), ("offset", "Q", 8, off),
            ("length", "Q", 16, length), ("crc", "I", 24, crc), ("reserved", "I", 28, res),
        ])
        vals = _interesting_ints(fmt, old, name, len(buf)) + [len(buf) - off, len(buf), off + 64, off - 64, length + 64]
        lo, hi = _INT_LIMITS[fmt]
        v = rng.choice([x for x in vals if lo <= x <= hi])
        struct.pack_into("<" + fmt, buf, at + pos, v)
        return f"section entry {i}.{name} {old} -> {v}"

    def _raw_header_field(self, rng, buf):
        fields = [("version", "I", 8), ("header_size", "I", 12), ("section_count", "I", 16),
                  ("entry_size", "I", 20), ("table_offset", "Q", 24), ("file_size", "Q", 32),
                  ("flags", "I", 40), ("magic", "B", rng.randrange(8))]
        name, fmt, pos = rng.choice(fields)
        (old,) = struct.unpack_from("<" + fmt, buf, pos)
        v = rng.choice(_interesting_ints(fmt, old, name, len(buf)) + [old + 32, old - 32, 2, 0])
        lo, hi = _INT_LIMITS[fmt]
        v = ((v - lo) % (hi - lo + 1)) + lo
        struct.pack_into("<" + fmt, buf, pos, v)
        return f"header.{name} {old} -> {v}"

    def _raw_truncate(self, rng, buf):
        n = rng.choice([0, 1, 8, 43, 63, 64, 65, rng.randrange(len(buf)), len(buf) - 1, len(buf) - 64])
        n = max(0, min(n, len(buf)))
        old = len(buf)
        del buf[n:]
        if rng.random() < 0.6 and n >= 40:
            struct.pack_into("<Q", buf, 32, n)
            return f"truncated {old} -> {n}, file_size updated"
        return f"truncated {old} -> {n}"

    def _raw_extend(self, rng, buf):
        n = rng.choice([1, 63, 64, 4096])
        buf.extend(_interesting_bytes(n, rng))
        if rng.random() < 0.7:
            struct.pack_into("<Q", buf, 32, len(buf))
            return f"extended by {n}, file_size updated"
        return f"extended by {n}"

    def _raw_flip(self, rng, buf):
        flips = []
        for _ in range(rng.choice((1, 2, 8))):
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
            flips.append(i)
        return f"raw bit flips at {flips}"


def decode_tensor_table(payload: bytes) -> list | None:
    """[(dtype, dims, offset, nbytes)] of a tensor-table payload, or None if it does not parse."""
    try:
        (n,) = struct.unpack_from("<I", payload, 0)
        pos, out = 4, []
        for _ in range(n):
            dtype, rank = struct.unpack_from("<II", payload, pos)
            pos += 8
            if rank > S.MAX_RANK:
                return None
            dims = list(struct.unpack_from(f"<{rank}q", payload, pos))
            pos += 8 * rank
            offset, nbytes = struct.unpack_from("<QQ", payload, pos)
            pos += 16
            out.append((dtype, dims, offset, nbytes))
        return out
    except struct.error:
        return None


def encode_tensor_table(recs: list) -> bytes:
    parts = [struct.pack("<I", len(recs))]
    for dtype, dims, offset, nbytes in recs:
        parts.append(struct.pack("<II", dtype, len(dims)))
        parts.append(struct.pack(f"<{len(dims)}q", *[((d + 2**63) % 2**64) - 2**63 for d in dims]))
        parts.append(struct.pack("<QQ", offset, nbytes))
    return b"".join(parts)


def _weighted(rng: random.Random, ops: list):
    return rng.choices([op for _, op in ops], weights=[w for w, _ in ops])[0]


def _kind_name(kind: int) -> str:
    return S.SECTION_NAMES.get(kind, f"kind{kind}")
