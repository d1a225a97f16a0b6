"""Read and verify .mrt artifacts.

:func:`load` maps a file (or takes bytes), checks the header, the section
table and each section's CRC-32, then decodes the sections into plain
immutable records.  Every count, offset, length and index is bounds-checked before
it is used, and every failure is a :class:`minirt.FormatError` naming the
section and byte offset, so a damaged or hostile file can never surface as an
``IndexError`` or ``struct.error`` from deep inside.

Weights are never copied: :meth:`Artifact.tensor` returns a read-only
``np.frombuffer`` view into the mapped file.

The records are named tuples, not frozen dataclasses: defining a dataclass
generates and compiles its methods (~0.5 ms a class), which every
``import minirt`` paid on its cold start (docs/decisions.md D57).  And they are
collections.namedtuple, not typing.NamedTuple classes: those cost ~0.13 ms each to
define against ~0.06 (D165).

JSON metadata values (the build report, options) are decoded when first read, not at load: importing
``json`` alone is ~1.2 ms of a cold start, and a session reads no JSON value of a plain CPU artifact
(docs/decisions.md D165).  A value that is not valid JSON fails with a FormatError naming the key when
it is read.
"""

import collections
import functools
import math
import mmap
import os
import struct
import sys
from typing import Any

import numpy as np

from minirt import pages
from minirt.dtypes import EXTENDED_CODES, ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import ChecksumError, FormatError, MissingFile, UnsupportedType, VersionError
from minirt.format import schema as S

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_MAX_SPAN = 2**63 - 1
_LITTLE_ENDIAN_HOST = sys.byteorder == "little"
# Subgraphs nest at most this deep; each is referenced by exactly one attribute.
MAX_GRAPH_DEPTH = 32
_F32 = struct.Struct("<f")
_F64 = struct.Struct("<d")
_DIM_FIXED = struct.Struct("<Bq")  # a shape's dimension: its kind, and for a fixed one its size


@functools.lru_cache(maxsize=64)
def _i32_array(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}i")


class Section(collections.namedtuple("Section", "kind flags offset length crc32 inflated", defaults=(0,))):
    """A section-table entry; ``inflated``: the section's length once inflated when it is stored
    compressed (SECTION_FLAG_DEFLATE, format version 2), else 0."""

    __slots__ = ()

    @property
    def deflated(self) -> bool:
        return bool(self.flags & S.SECTION_FLAG_DEFLATE)

    @property
    def name(self) -> str:
        return S.SECTION_NAMES.get(self.kind, f"unknown({self.kind})")


# kind: schema.VALUE_*: tensor, sequence, optional, optional sequence
ValueInfo = collections.namedtuple("ValueInfo", "name dtype shape kind", defaults=(S.VALUE_TENSOR,))
ValueInfo.__doc__ = """A value of a graph: name, ONNX dtype code (0 = unknown) and shape.

``shape`` is ``None`` when the rank is unknown; otherwise a tuple whose
items are an ``int`` (fixed), a ``str`` (symbolic) or ``None`` (unknown).
For sequence and optional values, dtype and shape describe the tensors inside.
"""


# kind: schema.ATTR_*; value: int, float, bytes, tuple, or tensor/graph index (or tuple of them)
Attribute = collections.namedtuple("Attribute", "kind value")


# inputs / outputs: value indices, -1 marking an absent optional one; attributes: name -> Attribute
Node = collections.namedtuple("Node", "name op_index inputs outputs attributes")


# values: ValueInfo; inputs / outputs: value indices; initializers: (value index, tensor index);
# captures: value indices taken by name from the enclosing graph; nodes: Node, in an order where every
# input is produced before use
Graph = collections.namedtuple("Graph", "name values inputs outputs initializers captures nodes")


Operator = collections.namedtuple("Operator", "domain op_type opset")


# offset: relative to the tensor-data section
TensorRecord = collections.namedtuple("TensorRecord", "dtype dims offset nbytes")


Partition = collections.namedtuple("Partition", "provider graph first_node node_count inputs outputs blob options "
                                   "golden_inputs golden_outputs")
Partition.__doc__ = """Nodes [first_node, first_node + node_count) of ``graph`` delegated to ``provider``.

Those nodes remain the partition's CPU version.  ``inputs``/``outputs``
are value indices of the graph in the provider program's order; ``blob``
indexes :meth:`Artifact.provider_blob` (-1: none); ``golden_inputs`` /
``golden_outputs`` are tensor indices of a reference run (may be empty).
"""


class Artifact:
    """A decoded, verified .mrt file.  Keeps the underlying buffer alive."""

    __slots__ = ("format_version", "sections", "_metadata", "opsets", "operators", "graphs", "tensors",
                 "_data", "_buffer", "size", "partitions", "_blobs", "signer", "packed_weights", "mapped_file")

    def __init__(
        self,
        format_version: int,
        sections: tuple,
        metadata: dict,
        opsets: dict,  # domain -> version
        operators: tuple,
        graphs: tuple,
        tensors: tuple,
        _data: memoryview,  # the tensor-data section
        _buffer: Any,  # mmap or bytes kept alive for the zero-copy views
        size: int,
        partitions: tuple = (),
        _blobs: tuple = (),  # memoryviews of the provider_blob sections, in section-table order
        # (algorithm, public key) from a well-formed signature section, else None.
        # Informational unless load() was given verify_key (then it is verified).
        signer: tuple | None = None,
        # minirt.format.packed_weights.PackedWeight entries of the packed_weights section (or ()).
        packed_weights: tuple = (),
    ):
        self.format_version = format_version
        self.sections = sections
        self._metadata = metadata  # (JSON values still as _JsonText until read: see metadata_value)
        self.opsets = opsets
        self.operators = operators
        self.graphs = graphs
        self.tensors = tensors
        self._data = _data
        self._buffer = _buffer
        self.size = size
        self.partitions = partitions
        self._blobs = _blobs
        self.signer = signer
        self.packed_weights = packed_weights
        # a MappedFile when the tensors are views of the file's own pages (load(map_file=...)), else None:
        # the data is this process's private copy, which nothing done to the file afterwards reaches
        self.mapped_file = None

    @property
    def metadata(self) -> dict:
        """The metadata, every JSON value decoded (FormatError naming the key of one that is not JSON)."""
        for key in self._metadata:
            self.metadata_value(key)
        return self._metadata

    def metadata_value(self, key: str, default: Any = None) -> Any:
        """One metadata value, decoding it first if it is JSON still undecoded (the rest stay as they are)."""
        value = self._metadata.get(key, default)
        if type(value) is _JsonText:
            value = self._metadata[key] = value.decode(key)
        return value

    def provider_blob(self, index: int) -> memoryview:
        """The payload of provider blob ``index`` (zero-copy view of the file)."""
        return self._blobs[index]

    def tensor(self, index: int) -> np.ndarray:
        """Tensor ``index`` as a read-only array viewing the file (strings are decoded)."""
        rec = self.tensors[index]
        if rec.dtype == 8:
            return _decode_strings(self._data, rec)
        dtype = ONNX_TO_NUMPY[rec.dtype]
        count = math.prod(rec.dims)
        # (the file is little-endian: on a little-endian host the native dtype itself, since an array of
        # dtype('<f4') is not of np.float32 to numpy's identity checks: np.asarray(w, np.float32) would
        # make a new view, and the kernels' caches keyed on the weight array would miss)
        arr = np.frombuffer(self._data, dtype=dtype if _LITTLE_ENDIAN_HOST else dtype.newbyteorder("<"),
                            count=count, offset=rec.offset)
        return arr.reshape(rec.dims)

    @property
    def main_graph(self) -> Graph:
        return self.graphs[0]

    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Cursor:
    """Bounds-checked little-endian reads over one section."""

    __slots__ = ("buf", "pos", "end", "section")

    def __init__(self, buf: memoryview, section: str):
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.section = section

    def where(self) -> str:
        """The place of the next read, as errors name it."""
        return f"malformed {self.section} section at byte {self.pos}"

    def fail(self, what: str) -> FormatError:
        return FormatError(f"{self.where()}: {what}")

    # The fixed-size reads below each repeat the same four lines rather than call one shared helper:
    # a graph section is thousands of reads, and the extra call per read was a fifth of its decoding
    # (PP-OCR det: 2.25 -> 1.74 ms, best of 30; docs/decisions.md D57).
    def _truncated(self, size: int) -> FormatError:
        return self.fail(f"needs {size} more bytes but the section ends at {self.end} (truncated?)")

    def u8(self) -> int:
        pos = self.pos
        if pos + 1 > self.end:
            raise self._truncated(1)
        self.pos = pos + 1
        return self.buf[pos]  # (a memoryview of bytes: item access gives the int)

    def u32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise self._truncated(4)
        self.pos = pos + 4
        return _U32.unpack_from(self.buf, pos)[0]

    def i32(self) -> int:
        pos = self.pos
        if pos + 4 > self.end:
            raise self._truncated(4)
        self.pos = pos + 4
        return _I32.unpack_from(self.buf, pos)[0]

    def i64(self) -> int:
        pos = self.pos
        if pos + 8 > self.end:
            raise self._truncated(8)
        self.pos = pos + 8
        return _I64.unpack_from(self.buf, pos)[0]

    def u64(self) -> int:
        pos = self.pos
        if pos + 8 > self.end:
            raise self._truncated(8)
        self.pos = pos + 8
        return _U64.unpack_from(self.buf, pos)[0]

    def f32(self) -> float:
        pos = self.pos
        if pos + 4 > self.end:
            raise self._truncated(4)
        self.pos = pos + 4
        return _F32.unpack_from(self.buf, pos)[0]

    def f64(self) -> float:
        pos = self.pos
        if pos + 8 > self.end:
            raise self._truncated(8)
        self.pos = pos + 8
        return _F64.unpack_from(self.buf, pos)[0]

    def count(self, min_item_size: int, what: str) -> int:
        """A u32 element count, refused if the remaining bytes cannot hold that many items."""
        n = self.u32()
        if n * max(min_item_size, 1) > self.end - self.pos:
            raise self.fail(f"{what} count {n} cannot fit in the {self.end - self.pos} bytes left")
        return n

    def raw(self) -> bytes:
        n = self.u32()
        if n > S.MAX_STRING_BYTES or self.pos + n > self.end:
            raise self.fail(f"byte string of length {n} runs past the end of the section")
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def str(self) -> str:
        # (raw()'s checks inline, and decoded from the view without the copy to bytes: names are read
        # once per value and node)
        pos = self.pos
        if pos + 4 > self.end:
            raise self._truncated(4)
        n = _U32.unpack_from(self.buf, pos)[0]
        pos += 4
        self.pos = pos
        if n > S.MAX_STRING_BYTES or pos + n > self.end:
            raise self.fail(f"byte string of length {n} runs past the end of the section")
        self.pos = pos + n
        try:
            return str(self.buf[pos:pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"string is not valid UTF-8 ({exc.reason})") from None

    def indices(self, limit: int, what: str, allow_absent: bool = False) -> tuple:
        """A u32 count, then that many i32 indices each in [0, limit) (or -1 when ``allow_absent``): one
        unpack for the whole list, the range checked on its extremes (a node's inputs and outputs: a
        16,000-node graph read them one call each in a quarter of its decoding)."""
        n = self.count(4, what)
        if n == 0:
            return ()
        pos = self.pos
        items = _i32_array(n).unpack_from(self.buf, pos)
        lo, hi = min(items), max(items)
        if hi >= limit or lo < (-1 if allow_absent else 0):
            bad = next(i for i in items if not (0 <= i < limit or (allow_absent and i == -1)))
            self.pos = pos + 4 * (items.index(bad) + 1)  # (where reading it one by one stops)
            raise self.fail(f"{what} index {bad} is out of range [0, {limit})")
        self.pos = pos + 4 * n
        return items

    def index(self, limit: int, what: str, allow_absent: bool = False) -> int:
        i = self.i32()
        if allow_absent and i == -1:
            return -1
        if not 0 <= i < limit:
            raise self.fail(f"{what} index {i} is out of range [0, {limit})")
        return i

    def done(self) -> None:
        if self.pos != self.end:
            raise self.fail(f"{self.end - self.pos} unexpected trailing bytes")


def _unknown_dtype(cur: _Cursor, what: str, code: int) -> Exception:
    if code in EXTENDED_CODES:
        return UnsupportedType(
            f"{what} has element type {onnx_type_name(code)}, which needs the ml_dtypes package "
            f"(pip install ml_dtypes); it is not installed"
        )
    return cur.fail(f"{what} has unknown dtype code {code}")


def _decode_strings(data: memoryview, rec: TensorRecord) -> np.ndarray:
    cur = _Cursor(data[rec.offset : rec.offset + rec.nbytes], "tensor_data")
    count = math.prod(rec.dims)
    items = [cur.raw().decode("utf-8", errors="replace") for _ in range(count)]
    return np.array(items, dtype=object).reshape(rec.dims)


# --- header and section table -------------------------------------------------


def _read_header(buf: memoryview, total_size: int | None = None) -> tuple[int, list[Section]]:
    """(format version, sections) from the header and section table at the start of ``buf``: the whole
    file, or (``total_size`` given: the file's size) its first bytes, which must hold the table."""
    size = len(buf) if total_size is None else total_size
    if size < S.HEADER.size:
        raise FormatError(f"not a .mrt file: {size} bytes is shorter than the {S.HEADER.size}-byte header (truncated?)")
    magic, version, header_size, count, entry_size, table_offset, file_size, _flags, header_crc, _ = S.HEADER.unpack_from(buf, 0)
    if magic != S.MAGIC:
        raise FormatError(f"not a .mrt file: magic bytes are {bytes(magic)!r}, expected {S.MAGIC!r}")
    if version > S.FORMAT_VERSION:
        raise VersionError(
            f"this artifact uses .mrt format version {version}, but this runtime (minirt "
            f"{_runtime_version()}) reads format versions up to {S.FORMAT_VERSION}; upgrade minirt"
        )
    if version < S.MIN_FORMAT_VERSION:
        raise FormatError(f"invalid .mrt format version {version}")
    if file_size != size:
        raise FormatError(f"file is {size} bytes but its header says {file_size} bytes (truncated or padded)")
    if header_size < S.HEADER.size or entry_size < S.SECTION_ENTRY.size:
        raise FormatError(f"header size {header_size} / section entry size {entry_size} below the version-1 minimum")
    table_end = table_offset + count * entry_size
    if table_offset < header_size or table_end > size or count > 4096:
        raise FormatError(f"section table ({count} entries at offset {table_offset}) does not fit in the {size}-byte file")
    if table_end > len(buf):
        raise FormatError(f"section table ends at {table_end}, past the first {len(buf)} bytes read")
    from minirt.native import crc32  # (zlib's when the CPU has no CRC instructions: zlib is not imported else)

    crc = crc32(buf[: S.HEADER_CRC_SPAN])
    crc = crc32(buf[table_offset:table_end], crc)
    if crc != header_crc:
        raise ChecksumError(f"header or section table is corrupted: CRC-32 {crc:#010x}, stored {header_crc:#010x}")
    sections = []
    for i in range(count):
        kind, flags, offset, length, scrc, inflated = S.SECTION_ENTRY.unpack_from(buf, table_offset + i * entry_size)
        sec = Section(kind, flags, offset, length, scrc, inflated if flags & S.SECTION_FLAG_DEFLATE else 0)
        _check_section_flags(i, sec, version)
        if offset % S.ALIGNMENT:
            raise FormatError(f"section {i} ({sec.name}) starts at offset {offset}, not a multiple of {S.ALIGNMENT}")
        if offset < table_end or offset + length > size:
            raise FormatError(f"section {i} ({sec.name}) [{offset}, {offset + length}) lies outside the file's data area [{table_end}, {size})")
        sections.append(sec)
    ordered = sorted(sections, key=lambda s: s.offset)
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.length > b.offset:
            raise FormatError(f"sections {a.name} and {b.name} overlap")
    return version, sections


def _check_section_flags(i: int, sec: Section, version: int) -> None:
    """Flags and inflated length of section entry ``i`` as its file's format version allows them."""
    if not sec.deflated:
        return
    if version < 2:
        raise FormatError(f"section {i} ({sec.name}) is marked compressed (flag {S.SECTION_FLAG_DEFLATE}), which "
                          f"format version {version} does not have (compressed sections are version 2)")
    if sec.kind in S.SECTION_NAMES and sec.kind not in S.COMPRESSIBLE_SECTIONS:
        raise FormatError(f"section {i} ({sec.name}) is marked compressed, but only the metadata, operators, graphs, "
                          "tensors and partitions sections may be")
    if not 0 < sec.inflated <= S.MAX_INFLATED_BYTES:
        raise FormatError(f"section {i} ({sec.name}) is compressed with an inflated length of {sec.inflated} bytes; "
                          f"expected 1 to {S.MAX_INFLATED_BYTES}")


def _inflate(stored: memoryview, sec: Section) -> bytes:
    """The section's bytes from its zlib stream ``stored``: exactly ``sec.inflated`` bytes, never more."""
    import zlib  # (only for compressed sections)

    d = zlib.decompressobj()
    try:
        out = d.decompress(stored, sec.inflated + 1)
    except zlib.error as e:
        raise FormatError(f"section {sec.name}: its zlib stream is damaged ({e})") from None
    if len(out) != sec.inflated or not d.eof or d.unused_data:
        got = f"{len(out)}{'+' if len(out) > sec.inflated else ''}"
        raise FormatError(f"section {sec.name}: its zlib stream inflates to {got} bytes"
                          f"{'' if d.eof else ' (stream incomplete)'}{' with trailing bytes' if d.unused_data else ''}, "
                          f"but its entry says {sec.inflated}")
    return out


def _runtime_version() -> str:
    from minirt import __version__

    return __version__


# --- section decoders ---------------------------------------------------------


class _JsonText:
    """A META_JSON metadata value not decoded yet; ``where`` names its place in the file for the error."""

    __slots__ = ("text", "where")

    def __init__(self, text: str, where: str):
        self.text = text
        self.where = where

    def decode(self, key: str) -> Any:
        names = _plain_name_list(self.text)
        if names is not None:  # (target.providers, read by every session: no json import for it)
            return names
        import json  # (here, not at the top: see the module docstring)

        try:
            return json.loads(self.text)
        except (ValueError, RecursionError):
            raise FormatError(f"{self.where}: metadata {key!r} is not valid JSON") from None


_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _plain_name_list(text: str) -> list | None:
    """``text`` decoded when it is a JSON list of names ([A-Za-z0-9_.-]+ strings, as json.dumps writes
    it: '["cpu"]', '["coreml", "cpu"]'), else None (json decodes it: anything else, escapes included)."""
    if not (text.startswith('["') and text.endswith('"]')):
        return None
    names = text[2:-2].split('", "')
    for name in names:
        if not name or not _NAME_CHARS.issuperset(name):
            return None
    return names


def _read_metadata(cur: _Cursor) -> dict:
    out = {}
    for _ in range(cur.count(6, "metadata entry")):
        key = cur.str()
        kind = cur.u8()
        if kind == S.META_INT:
            out[key] = cur.i64()
        elif kind == S.META_FLOAT:
            out[key] = cur.f64()
        elif kind == S.META_STRING:
            out[key] = cur.str()
        elif kind == S.META_BOOL:
            out[key] = bool(cur.u8())
        elif kind == S.META_JSON:
            where = cur.where()  # (before the read: the place of the value itself)
            out[key] = _JsonText(cur.str(), where)
        else:
            raise cur.fail(f"metadata {key!r} has unknown value type {kind}")
    cur.done()
    return out


def _read_operators(cur: _Cursor) -> tuple[dict, tuple]:
    opsets = {}
    for _ in range(cur.count(12, "opset")):
        domain = cur.str()
        opsets[domain] = cur.i64()
    ops = []
    for _ in range(cur.count(12, "operator")):
        domain, op_type, opset = cur.str(), cur.str(), cur.i64()
        ops.append(Operator(domain, op_type, opset))
    cur.done()
    return opsets, tuple(ops)


def _read_tensors(cur: _Cursor, data_len: int) -> tuple:
    out = []
    for i in range(cur.count(24, "tensor")):
        dtype, rank = cur.u32(), cur.u32()
        if dtype != 8 and dtype not in ONNX_TO_NUMPY:
            raise _unknown_dtype(cur, f"tensor {i}", dtype)
        if rank > S.MAX_RANK:
            raise cur.fail(f"tensor {i} has rank {rank}, above the limit {S.MAX_RANK}")
        dims = tuple(cur.i64() for _ in range(rank))
        if any(d < 0 for d in dims):
            raise cur.fail(f"tensor {i} has a negative dimension {dims}")
        # numpy cannot index an array whose byte span (ignoring zero dims)
        # exceeds the signed 64-bit range, even when it is empty.
        span = 1
        for d in dims:
            span *= max(d, 1)
        if span * ONNX_TO_NUMPY[dtype].itemsize > _MAX_SPAN:  # strings: object pointers
            raise cur.fail(f"tensor {i} has dimensions {list(dims)} too large to address")
        offset, nbytes = cur.u64(), cur.u64()
        if offset % S.ALIGNMENT:
            raise cur.fail(f"tensor {i} data offset {offset} is not {S.ALIGNMENT}-byte aligned")
        if offset + nbytes > data_len:
            raise cur.fail(f"tensor {i} data [{offset}, {offset + nbytes}) runs past the tensor-data section ({data_len} bytes)")
        count = math.prod(dims)
        if dtype != 8:
            expected = count * ONNX_TO_NUMPY[dtype].itemsize
            if expected != nbytes:
                raise cur.fail(f"tensor {i} of {onnx_type_name(dtype)}{list(dims)} needs {expected} bytes but records {nbytes}")
        elif count * 4 > nbytes:  # every string element needs at least its u32 length
            raise cur.fail(f"string tensor {i} of {count} elements cannot fit in {nbytes} bytes")
        out.append(TensorRecord(dtype, dims, offset, nbytes))
    cur.done()
    return tuple(out)


def _read_attribute(cur: _Cursor, n_tensors: int, n_graphs: int, graph_index: int) -> Attribute:
    kind = cur.u8()

    def graph_ref() -> int:
        g = cur.u32()
        # Subgraphs always come after the graph that holds them, which rules out cycles.
        if not graph_index < g < n_graphs:
            raise cur.fail(f"subgraph index {g} must be in ({graph_index}, {n_graphs})")
        return g

    def tensor_ref() -> int:
        t = cur.u32()
        if t >= n_tensors:
            raise cur.fail(f"tensor index {t} is out of range [0, {n_tensors})")
        return t

    if kind == S.ATTR_FLOAT:
        return Attribute(kind, cur.f32())
    if kind == S.ATTR_INT:
        return Attribute(kind, cur.i64())
    if kind == S.ATTR_STRING:
        return Attribute(kind, cur.raw())
    if kind == S.ATTR_TENSOR:
        return Attribute(kind, tensor_ref())
    if kind == S.ATTR_GRAPH:
        return Attribute(kind, graph_ref())
    if kind == S.ATTR_FLOATS:
        return Attribute(kind, tuple(cur.f32() for _ in range(cur.count(4, "float"))))
    if kind == S.ATTR_INTS:
        return Attribute(kind, tuple(cur.i64() for _ in range(cur.count(8, "int"))))
    if kind == S.ATTR_STRINGS:
        return Attribute(kind, tuple(cur.raw() for _ in range(cur.count(4, "string"))))
    if kind == S.ATTR_TENSORS:
        return Attribute(kind, tuple(tensor_ref() for _ in range(cur.count(4, "tensor"))))
    if kind == S.ATTR_GRAPHS:
        return Attribute(kind, tuple(graph_ref() for _ in range(cur.count(4, "graph"))))
    raise cur.fail(f"unknown attribute type {kind}")


def _read_shape(cur: _Cursor) -> tuple | None:
    rank = cur.i32()
    if rank == S.RANK_UNKNOWN:
        return None
    if not 0 <= rank <= S.MAX_RANK:
        raise cur.fail(f"rank {rank} outside [0, {S.MAX_RANK}]")
    dims = []
    for _ in range(rank):
        pos = cur.pos
        if pos + 9 <= cur.end:  # (room for a fixed dimension: its kind and size in one read)
            kind, d = _DIM_FIXED.unpack_from(cur.buf, pos)
            if kind == S.DIM_FIXED:
                if d < 0:
                    raise cur.fail(f"negative fixed dimension {d}")
                cur.pos = pos + 9
                dims.append(d)
                continue
        kind = cur.u8()
        if kind == S.DIM_FIXED:
            d = cur.i64()
            if d < 0:
                raise cur.fail(f"negative fixed dimension {d}")
            dims.append(d)
        elif kind == S.DIM_SYMBOLIC:
            dims.append(cur.str())
        elif kind == S.DIM_UNKNOWN:
            dims.append(None)
        else:
            raise cur.fail(f"unknown dimension kind {kind}")
    return tuple(dims)


def _read_graph(cur: _Cursor, gi: int, n_graphs: int, n_ops: int, n_tensors: int) -> Graph:
    name = cur.str()
    values = []
    for _ in range(cur.count(13, "value")):
        vname = cur.str()
        dtype = cur.u32()
        if dtype != S.DTYPE_UNDEFINED and dtype != 8 and dtype not in ONNX_TO_NUMPY:
            raise _unknown_dtype(cur, f"value {vname!r}", dtype)
        shape = _read_shape(cur)
        kind = cur.u8()
        if kind not in S.VALUE_KINDS:
            raise cur.fail(f"value {vname!r} has unknown value kind {kind} (this reader knows kinds "
                           f"{S.VALUE_KINDS[0]}..{S.VALUE_KINDS[-1]}; a newer minirt may read it)")
        values.append(ValueInfo(vname, dtype, shape, kind))
    nv = len(values)
    inputs = tuple(cur.index(nv, "graph input value") for _ in range(cur.count(4, "graph input")))
    outputs = tuple(cur.index(nv, "graph output value") for _ in range(cur.count(4, "graph output")))
    inits = []
    for _ in range(cur.count(8, "initializer")):
        v = cur.index(nv, "initializer value")
        t = cur.index(n_tensors, "initializer tensor")
        inits.append((v, t))
    captures = tuple(cur.index(nv, "captured value") for _ in range(cur.count(4, "capture")))
    nodes = []
    for _ in range(cur.count(16, "node")):
        nname = cur.str()
        op = cur.index(n_ops, "operator")
        ins = cur.indices(nv, "node input", allow_absent=True)
        outs = cur.indices(nv, "node output", allow_absent=True)
        attrs = {}
        for _ in range(cur.count(5, "attribute")):
            aname = cur.str()
            attrs[aname] = _read_attribute(cur, n_tensors, n_graphs, gi)
        nodes.append(Node(nname, op, ins, outs, attrs))
    graph = Graph(name, tuple(values), inputs, outputs, tuple(inits), captures, tuple(nodes))
    _check_dataflow(graph, gi)
    return graph


def _check_dataflow(g: Graph, gi: int) -> None:
    """Every value is defined once, and before any node uses it; outputs are defined."""
    defined = bytearray(len(g.values))

    def define(v: int, where: str) -> None:
        if defined[v]:
            raise FormatError(f"graph {gi} ({g.name!r}): value {g.values[v].name!r} is defined twice ({where})")
        defined[v] = 1

    for v in g.inputs:
        define(v, "graph input")
    for v, _ in g.initializers:
        if not defined[v]:  # an initializer may double as an overridable graph input
            define(v, "initializer")
    for v in g.captures:
        define(v, "captured value")
    for n in g.nodes:
        for v in n.inputs:
            if v >= 0 and not defined[v]:
                raise FormatError(
                    f"graph {gi} ({g.name!r}): node {n.name!r} reads {g.values[v].name!r} before it is produced"
                )
        for v in n.outputs:
            if v >= 0:
                define(v, f"output of node {n.name!r}")
    for v in g.outputs:
        if not defined[v]:
            raise FormatError(f"graph {gi} ({g.name!r}): output {g.values[v].name!r} is never produced")


def _read_partitions(cur: _Cursor, graphs: tuple, n_tensors: int, n_blobs: int) -> tuple:
    out = []
    claimed: dict[int, list[tuple[int, int]]] = {}
    for i in range(cur.count(37, "partition")):
        provider = cur.str()
        gi = cur.u32()
        if gi >= len(graphs):
            raise cur.fail(f"partition {i} names graph {gi}, but there are {len(graphs)} graphs")
        graph = graphs[gi]
        first, count = cur.u32(), cur.u32()
        if count == 0 or first + count > len(graph.nodes):
            raise cur.fail(f"partition {i} covers nodes [{first}, {first + count}) of a graph with {len(graph.nodes)} nodes")
        for a, b in claimed.get(gi, ()):
            if first < b and a < first + count:
                raise cur.fail(f"partition {i} overlaps another partition's nodes [{a}, {b})")
        claimed.setdefault(gi, []).append((first, first + count))
        nv = len(graph.values)
        ins = tuple(cur.index(nv, "partition input value") for _ in range(cur.count(4, "partition input")))
        outs = tuple(cur.index(nv, "partition output value") for _ in range(cur.count(4, "partition output")))
        produced = {v for n in graph.nodes[first : first + count] for v in n.outputs if v >= 0}
        for v in outs:
            if v not in produced:
                raise cur.fail(f"partition {i} output {graph.values[v].name!r} is not produced by its nodes")
        for v in ins:
            if v in produced:
                raise cur.fail(f"partition {i} input {graph.values[v].name!r} is produced inside the partition")
        blob = cur.index(n_blobs, "provider blob", allow_absent=True)
        import json  # (only artifacts with accelerator partitions get here: see the module docstring)

        try:
            options = json.loads(cur.str())
        except ValueError:
            raise cur.fail(f"partition {i} options are not valid JSON") from None
        if not isinstance(options, dict):
            raise cur.fail(f"partition {i} options must be a JSON object")
        g_in = tuple(cur.index(n_tensors, "golden input tensor") for _ in range(cur.count(4, "golden input")))
        g_out = tuple(cur.index(n_tensors, "golden output tensor") for _ in range(cur.count(4, "golden output")))
        if g_in and len(g_in) != len(ins) or g_out and len(g_out) != len(outs):
            raise cur.fail(f"partition {i} golden tensors do not match its {len(ins)} inputs / {len(outs)} outputs")
        out.append(Partition(provider, gi, first, count, ins, outs, blob, options, g_in, g_out))
    cur.done()
    return tuple(out)


def _read_graphs(cur: _Cursor, n_ops: int, n_tensors: int) -> tuple:
    n = cur.count(28, "graph")
    if n == 0:
        raise cur.fail("an artifact needs at least one graph")
    graphs = tuple(_read_graph(cur, gi, n, n_ops, n_tensors) for gi in range(n))
    cur.done()
    _check_graph_tree(graphs)
    return graphs


def _check_graph_tree(graphs: tuple) -> None:
    """Subgraphs form a tree: each is held by one attribute, nesting is bounded.

    Without this a small file could reference one subgraph from many
    attributes at every level and make compilation exponential.
    """
    depth = [0] * len(graphs)
    held = [False] * len(graphs)
    for gi, g in enumerate(graphs):
        for node in g.nodes:
            for attr in node.attributes.values():
                subs = (attr.value,) if attr.kind == S.ATTR_GRAPH else attr.value if attr.kind == S.ATTR_GRAPHS else ()
                for si in subs:
                    if held[si]:
                        raise FormatError(f"graph {si} is used by more than one attribute (node {node.name!r})")
                    held[si] = True
                    depth[si] = depth[gi] + 1
                    if depth[si] > MAX_GRAPH_DEPTH:
                        raise FormatError(f"subgraphs nest deeper than {MAX_GRAPH_DEPTH} levels (graph {si})")
    for gi in range(1, len(graphs)):
        if not held[gi]:
            raise FormatError(f"graph {gi} is not used by any attribute")


# --- entry point --------------------------------------------------------------


def sha256_file(path) -> str:
    """The hex SHA-256 of a file's bytes, read in blocks of 1 MB (package manifests, genai's build cache).
    hashlib is imported here, not with the reader: loading OpenSSL would lengthen every cold start."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# Files up to this size are read into a private copy by default (load's map_file=None): see load.
PRIVATE_COPY_MAX_BYTES = 256 << 20


class MappedFile:
    """The file a mapped artifact's tensors are views of, watched for changes: its size and modification
    time when it was loaded, read again from the descriptor this object holds (the loaded file itself, not
    whatever the path names now: an atomic rename that puts a new file at the path leaves it untouched)."""

    __slots__ = ("path", "fd", "size", "mtime_ns")

    def __init__(self, path: str, fd: int, size: int, mtime_ns: int):
        self.path, self.fd, self.size, self.mtime_ns = path, fd, size, mtime_ns

    def changed(self) -> str | None:
        """How the file changed since it was loaded (truncated, rewritten), or None."""
        try:
            st = os.fstat(self.fd)
        except OSError as exc:
            return f"cannot be checked ({exc})"
        if st.st_size != self.size:
            return f"is now {st.st_size:,} bytes, was {self.size:,} when it was loaded"
        if st.st_mtime_ns != self.mtime_ns:
            return "was rewritten since it was loaded"
        return None

    def __del__(self):
        try:
            os.close(self.fd)
        except (OSError, TypeError, AttributeError):  # (closed already, or interpreter shutdown)
            pass


# A private copy is read by chunks of this size, each CRC-checked (for the sections it overlaps) while it
# is still in the cache: 256 KB leaves the check 1.8 of its 4.3 ms on a 37 MB file read then checked whole
# (EfficientNet-B0, this x86-64 host; 1 MB chunks: 3.4 ms, they no longer stay in a 2 MB L2 beside the copy).
_COPY_CHUNK = 256 << 10


def _private_copy(f, path: str, size: int, checksums: bool = False) -> tuple[Any, memoryview, dict]:
    """The whole file read into this process's memory: (the buffer to keep alive, a read-only view of it;
    tensor views must not be written, as with a mapping, and ``{(offset, length): CRC-32}`` of the
    sections, computed chunk by chunk as it was read when ``checksums`` and the section table lies in the
    first chunk, else empty: _decode compares those and computes any other).  Anonymous pages,
    page-aligned (the alignment the format gives tensors within the file), as huge pages below 32 MB
    (minirt.pages: reading resnet18's 93 MB took 75-90 ms into 4 KiB pages, a page fault each, 32-50 ms
    into 2 MiB ones, but now and then 330-530 ms on a virtual machine whose free huge pages were handed
    back to the hypervisor, D134)."""
    buf = pages.anonymous(size)
    view, done = memoryview(buf), 0
    spans, crcs, first = None, {}, 0  # (sections sorted by offset, their CRCs so far, first not yet done)
    while done < size:
        stop = min(done + _COPY_CHUNK, size)
        at = done
        while done < stop:
            n = f.readinto(view[done:stop])
            if not n:
                raise FormatError(f"{path}: the file shrank to {done:,} bytes while it was read (was {size:,})")
            done += n
        if not checksums:
            continue
        if spans is None:
            spans = _section_spans(view[:done], size)
            if not spans:
                checksums = False  # (a table past the first chunk, or a bad header: _decode finds out)
                continue
            from minirt.native import crc32
        while first < len(spans) and spans[first][0] + spans[first][1] <= at:
            first += 1
        for offset, length in spans[first:]:
            if offset >= done:
                break
            lo, hi = max(offset, at), min(offset + length, done)
            crcs[offset, length] = crc32(view[lo:hi], crcs.get((offset, length), 0))
    return buf, view.toreadonly(), crcs


def _section_spans(prefix: memoryview, size: int) -> list | None:
    """The (offset, length) of every section, sorted by offset, read from a file's first bytes when its
    header and section table are there and the header's CRC holds; else None (_decode checks it all)."""
    try:
        _version, sections = _read_header(prefix, total_size=size)
    except (FormatError, struct.error):  # (ChecksumError, VersionError: FormatErrors too)
        return None
    return sorted((sec.offset, sec.length) for sec in sections)


def load(
    source: str | os.PathLike | bytes | bytearray | memoryview,
    verify_checksums: bool = True,
    verify_key: Any = None,
    map_file: bool | None = None,
) -> Artifact:
    """Read or wrap ``source`` and return the verified :class:`Artifact`.

    ``verify_key`` (32 raw bytes, 64 hex digits, a path to a ``.pub`` file, a folder of them, or a list:
    the trusted keys) requires a valid Ed25519 signature by one of those keys; it is checked right after
    the section table, before any section is decoded (:class:`SignatureError`).

    ``map_file`` (a path only): False reads the file into a private copy, which nothing done to the file
    afterwards can change (rewritten in place, truncated by a ``cp`` over it); True maps it (its pages
    shared with other processes and the page cache, loaded as they are read), the artifact's
    ``mapped_file`` then tells whether it changed; None (default) copies files up to
    :data:`PRIVATE_COPY_MAX_BYTES` and maps larger ones.  A signed load (``verify_key``) always copies:
    what was verified is what runs (docs/runtime.md, D97).
    """
    trusted = None
    if verify_key is not None:
        from minirt.format.keys import load_trusted_keys  # only sessions that verify pay for the import

        trusted = load_trusted_keys(verify_key)
    mapped, crcs = None, None
    if isinstance(source, (bytes, bytearray, memoryview)):
        buffer = bytes(source) if not isinstance(source, bytes) else source
        view = memoryview(buffer)
    else:
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                size = st.st_size
                if size == 0:
                    raise FormatError(f"{path}: file is empty, not a .mrt artifact")
                if trusted is None and (map_file or (map_file is None and size > PRIVATE_COPY_MAX_BYTES)):
                    buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                    view = memoryview(buffer)
                    mapped = MappedFile(path, os.dup(f.fileno()), size, st.st_mtime_ns)
                else:
                    buffer, view, crcs = _private_copy(f, path, size, checksums=verify_checksums)
        except FileNotFoundError:
            raise MissingFile(f"{path}: no such file") from None
        except IsADirectoryError:
            raise FormatError(f"{path}: is a directory, not a .mrt file") from None
        except (OSError, ValueError) as exc:  # permissions, special files mmap refuses
            raise FormatError(f"{path}: cannot open: {exc}") from None
    try:
        artifact = _decode(view, buffer, verify_checksums, trusted, file_mapped=mapped is not None, crcs=crcs)
    except FormatError as exc:
        if not isinstance(source, (bytes, bytearray, memoryview)):
            raise type(exc)(f"{os.fspath(source)}: {exc}") from None
        raise
    artifact.mapped_file = mapped
    return artifact


# Bytes CRC-checked at a time in a mapped file, whose pages are then given back (_decode).
_CHECK_CHUNK = 8 << 20


def _give_back(buffer: mmap.mmap, start: int, stop: int, advice: int) -> None:
    """Drop this process's pages of the mapped ``buffer`` wholly inside [start, stop) (page-aligned)."""
    page = mmap.PAGESIZE
    lo, hi = -(-start // page) * page, stop // page * page
    if hi > lo:
        try:
            buffer.madvise(advice, lo, hi - lo)
        except (OSError, ValueError):  # (advice refused: the pages just stay)
            pass


def _section_crc(view: memoryview, buffer: Any, sec: Section, drop: int | None, crc32) -> int:
    """The CRC-32 of section ``sec`` of ``view``; with ``drop`` (a mapped file), by chunks whose pages are then
    given back to the page cache (_decode)."""
    if drop is None or sec.length <= _CHECK_CHUNK:
        return crc32(view[sec.offset : sec.offset + sec.length])
    crc, end = 0, sec.offset + sec.length
    for at in range(sec.offset, end, _CHECK_CHUNK):
        stop = min(at + _CHECK_CHUNK, end)
        crc = crc32(view[at:stop], crc)
        _give_back(buffer, at, stop, drop)
    return crc


def _decode(view: memoryview, buffer: Any, verify_checksums: bool, trusted: list | None = None,
            file_mapped: bool = False, crcs: dict | None = None) -> Artifact:
    """The artifact of the file bytes ``view`` (kept alive by ``buffer``); ``crcs``: section CRCs
    already computed from these bytes, {(offset, length): CRC-32} (_private_copy), the others computed here."""
    version, sections = _read_header(view)
    by_kind: dict[int, Section] = {}
    for sec in sections:
        if sec.kind in S.SECTION_NAMES:
            if sec.kind != S.SECTION_PROVIDER_BLOB and sec.kind in by_kind:
                raise FormatError(f"section {sec.name} appears twice")
            by_kind.setdefault(sec.kind, sec)
        elif not sec.flags & S.SECTION_FLAG_OPTIONAL:
            raise VersionError(
                f"artifact has a required section of unknown kind {sec.kind}; it was written for a newer "
                f"runtime than minirt {_runtime_version()} (format version {S.FORMAT_VERSION})"
            )
    for kind in S.REQUIRED_SECTIONS:
        if kind not in by_kind:
            raise FormatError(f"required section {S.SECTION_NAMES[kind]} is missing")
    if trusted is not None:  # authenticate before trusting (or even CRC-checking) any payload
        from minirt.format import signature as _signature  # hashlib + Ed25519: only for signed loads

        _signature.verify_sections(
            trusted, [(sec.kind, sec.flags, view[sec.offset : sec.offset + sec.length]) for sec in sections], version
        )
    if verify_checksums:
        # the native CRC when the CPU has the instructions (about half of zlib's time on the weights,
        # D82); zlib's otherwise
        from minirt.native import crc32

        # A mapped file is checked by chunks whose pages are then given back (MADV_DONTNEED: a clean file
        # page, read again from the page cache if ever touched): the check reads every byte, and the
        # process must not keep the weights resident that its kernels never read (the originals of
        # weights packed in the file, --weight-pack: a decoder's float products, D123).
        # (a file mapping only: on the anonymous memory of a private copy the advice would zero the bytes)
        drop = getattr(mmap, "MADV_DONTNEED", None) if file_mapped else None
        for sec in sections:
            crc = crcs.get((sec.offset, sec.length)) if crcs else None  # (computed while the copy was read)
            if crc is None:
                crc = _section_crc(view, buffer, sec, drop, crc32)
            if crc != sec.crc32:
                raise ChecksumError(
                    f"section {sec.name} is corrupted: CRC-32 of its {sec.length} bytes is {crc:#010x}, stored {sec.crc32:#010x}"
                )

    def cursor(kind: int) -> _Cursor:
        sec = by_kind[kind]
        stored = view[sec.offset : sec.offset + sec.length]
        return _Cursor(memoryview(_inflate(stored, sec)) if sec.deflated else stored, sec.name)

    data_sec = by_kind[S.SECTION_TENSOR_DATA]
    data = view[data_sec.offset : data_sec.offset + data_sec.length]
    metadata = _read_metadata(cursor(S.SECTION_METADATA))
    opsets, operators = _read_operators(cursor(S.SECTION_OPERATORS))
    tensors = _read_tensors(cursor(S.SECTION_TENSORS), data_sec.length)
    graphs = _read_graphs(cursor(S.SECTION_GRAPHS), len(operators), len(tensors))
    blobs = tuple(
        view[sec.offset : sec.offset + sec.length] for sec in sections if sec.kind == S.SECTION_PROVIDER_BLOB
    )
    partitions = (
        _read_partitions(cursor(S.SECTION_PARTITIONS), graphs, len(tensors), len(blobs))
        if S.SECTION_PARTITIONS in by_kind
        else ()
    )
    packed = ()
    if S.SECTION_PACKED_WEIGHTS in by_kind:
        from minirt.format import packed_weights as _packed  # only files built with --weight-pack

        sec = by_kind[S.SECTION_PACKED_WEIGHTS]
        packed = _packed.decode(view[sec.offset : sec.offset + sec.length], tensors)
    return Artifact(
        format_version=version,
        sections=tuple(sections),
        metadata=metadata,
        opsets=opsets,
        operators=operators,
        graphs=graphs,
        tensors=tensors,
        _data=data,
        _buffer=buffer,
        size=len(view),
        partitions=partitions,
        _blobs=blobs,
        signer=_signer(view, by_kind.get(S.SECTION_SIGNATURE)),
        packed_weights=packed,
    )


def _signer(view: memoryview, sec: Section | None) -> tuple | None:
    """(algorithm, public key) of a well-formed signature section; its contents are not checked here."""
    if sec is None:
        return None
    from minirt.format import signature as _signature

    decoded = _signature.decode_payload(view[sec.offset : sec.offset + sec.length])
    return None if decoded is None else decoded[:2]
