"""Encode an artifact into .mrt bytes and write it atomically.

:class:`ArtifactWriter` knows nothing about ONNX or the builder's IR: it
collects operators, tensors, graphs and metadata in the format's own terms
(indices, dtype codes) and lays them out exactly as ``minirt/format/schema.py``
and ``docs/format.md`` describe.  ``builder/lower.py`` turns the IR into calls
on this class.

:func:`write_atomic` writes to a temporary file in the destination folder and
renames it over the target, so a crash or error never leaves a partial file.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from typing import Iterable, Sequence

import numpy as np

from minirt.dtypes import onnx_code
from minirt.format import schema as S


def _round_floats(value):
    """``value`` with every float rounded to 6 significant digits (containers walked)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _round_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round_floats(v) for v in value]
    return value


class _Bytes:
    """Little-endian encoder mirroring the reader's cursor."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self.parts.append(struct.pack("<B", v))

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack("<I", v))

    def i32(self, v: int) -> None:
        self.parts.append(struct.pack("<i", v))

    def i64(self, v: int) -> None:
        self.parts.append(struct.pack("<q", v))

    def u64(self, v: int) -> None:
        self.parts.append(struct.pack("<Q", v))

    def f32(self, v: float) -> None:
        self.parts.append(struct.pack("<f", v))

    def f64(self, v: float) -> None:
        self.parts.append(struct.pack("<d", v))

    def raw(self, b: bytes) -> None:
        self.u32(len(b))
        self.parts.append(bytes(b))

    def str(self, s: str) -> None:
        self.raw(s.encode("utf-8"))

    def getvalue(self) -> bytes:
        return b"".join(self.parts)


class GraphRecord:
    """One graph in format terms.  Build it with the add_* methods, in order."""

    def __init__(self, name: str):
        self.name = name
        self.values: list[tuple[str, int, tuple | None, int]] = []
        self._index: dict[str, int] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.initializers: list[tuple[int, int]] = []
        self.captures: list[int] = []
        self.nodes: list[tuple] = []

    def value(
        self, name: str, dtype: int = S.DTYPE_UNDEFINED, shape: Sequence | None = None, kind: int = S.VALUE_TENSOR
    ) -> int:
        """Index of value ``name``, declaring it on first use (later calls may fill in type facts)."""
        idx = self._index.get(name)
        if idx is None:
            idx = len(self.values)
            self._index[name] = idx
            self.values.append((name, dtype, None if shape is None else tuple(shape), kind))
        elif dtype != S.DTYPE_UNDEFINED or shape is not None or kind != S.VALUE_TENSOR:
            old_name, old_dtype, old_shape, old_kind = self.values[idx]
            self.values[idx] = (
                old_name,
                dtype if dtype != S.DTYPE_UNDEFINED else old_dtype,
                tuple(shape) if shape is not None else old_shape,
                kind if kind != S.VALUE_TENSOR else old_kind,
            )
        return idx

    def has_value(self, name: str) -> bool:
        return name in self._index

    def add_node(self, name: str, op_index: int, inputs: Sequence[int], outputs: Sequence[int], attributes: Sequence[tuple]) -> None:
        """``attributes`` holds (name, schema.ATTR_* kind, value) triples."""
        self.nodes.append((name, op_index, tuple(inputs), tuple(outputs), tuple(attributes)))


class PartitionRecord:
    """A run of contiguous nodes delegated to a provider (see docs/format.md, partitions).

    The nodes stay in the graph: they are the partition's CPU version.
    ``inputs``/``outputs`` are value indices of that graph, in the order the
    provider program takes and returns them; ``blob`` indexes
    ``ArtifactWriter.provider_blobs`` (-1: none); golden tensors are tensor
    indices (the CPU result on a reference input), or empty.
    """

    def __init__(self, provider: str, graph: int, first_node: int, node_count: int, inputs, outputs, blob: int = -1,
                 options: dict | None = None, golden_inputs=(), golden_outputs=()):
        self.provider = provider
        self.graph = graph
        self.first_node = first_node
        self.node_count = node_count
        self.inputs = tuple(inputs)
        self.outputs = tuple(outputs)
        self.blob = blob
        self.options = dict(options or {})
        self.golden_inputs = tuple(golden_inputs)
        self.golden_outputs = tuple(golden_outputs)


class ArtifactWriter:
    def __init__(self, compress_sections: bool = True) -> None:
        # zlib-compress the structure sections of at least S.COMPRESS_MIN_BYTES (format version 2);
        # False: every section stored as is, a version-1 file that older runtimes read
        self.compress_sections = compress_sections
        self.metadata: dict[str, tuple[int, object]] = {}
        self.opsets: dict[str, int] = {}
        self.operators: list[tuple[str, str, int]] = []
        self._op_index: dict[tuple[str, str, int], int] = {}
        self.tensors: list[np.ndarray] = []
        self.graphs: list[GraphRecord] = []
        self.provider_blobs: list[bytes] = []
        self.partitions: list[PartitionRecord] = []
        # (kind, tensor index, panel width, tag, packed float32 array): the optional packed_weights
        # section (builder/prepack.py; layout in minirt/format/packed_weights.py)
        self.packed_weights: list[tuple] = []

    # --- content ---------------------------------------------------------------
    def set_metadata(self, key: str, value: object) -> None:
        """Typed metadata: bool, int, float and str map to their types, anything else to JSON."""
        if isinstance(value, bool):
            self.metadata[key] = (S.META_BOOL, value)
        elif isinstance(value, int):
            self.metadata[key] = (S.META_INT, value)
        elif isinstance(value, float):
            self.metadata[key] = (S.META_FLOAT, value)
        elif isinstance(value, str):
            self.metadata[key] = (S.META_STRING, value)
        else:
            # Compact: metadata ships to every device.  Report floats (timings,
            # error metrics) keep 6 significant digits, plenty for a report.
            self.metadata[key] = (
                S.META_JSON,
                json.dumps(_round_floats(value), sort_keys=True, default=str, separators=(",", ":")),
            )

    def operator(self, domain: str, op_type: str, opset: int) -> int:
        key = (domain, op_type, opset)
        idx = self._op_index.get(key)
        if idx is None:
            idx = self._op_index[key] = len(self.operators)
            self.operators.append(key)
        return idx

    def tensor(self, array: np.ndarray) -> int:
        arr = np.asarray(array)
        if arr.dtype != object and not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        if arr.dtype != object:
            try:
                onnx_code(arr.dtype)
            except ValueError:
                raise ValueError(f"tensor dtype {arr.dtype} has no .mrt dtype code") from None
        self.tensors.append(arr)
        return len(self.tensors) - 1

    def graph(self, name: str) -> tuple[int, GraphRecord]:
        rec = GraphRecord(name)
        self.graphs.append(rec)
        return len(self.graphs) - 1, rec

    # --- encoding --------------------------------------------------------------
    def _encode_metadata(self) -> bytes:
        b = _Bytes()
        b.u32(len(self.metadata))
        for key in sorted(self.metadata):
            kind, value = self.metadata[key]
            b.str(key)
            b.u8(kind)
            if kind == S.META_INT:
                b.i64(value)
            elif kind == S.META_FLOAT:
                b.f64(value)
            elif kind == S.META_BOOL:
                b.u8(1 if value else 0)
            else:
                b.str(value)
        return b.getvalue()

    def _encode_operators(self) -> bytes:
        b = _Bytes()
        b.u32(len(self.opsets))
        for domain in sorted(self.opsets):
            b.str(domain)
            b.i64(self.opsets[domain])
        b.u32(len(self.operators))
        for domain, op_type, opset in self.operators:
            b.str(domain)
            b.str(op_type)
            b.i64(opset)
        return b.getvalue()

    def _encode_tensors(self) -> tuple[bytes, bytes]:
        table, data = _Bytes(), bytearray()
        table.u32(len(self.tensors))
        for arr in self.tensors:
            data.extend(b"\x00" * S.padding_required(len(data)))
            offset = len(data)
            if arr.dtype == object:
                code = 8
                enc = _Bytes()
                for item in arr.reshape(-1):
                    enc.raw(item.encode("utf-8") if isinstance(item, str) else bytes(item))
                payload = enc.getvalue()
            else:
                code = onnx_code(arr.dtype)
                payload = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
            data.extend(payload)
            table.u32(code)
            table.u32(arr.ndim)
            for d in arr.shape:
                table.i64(d)
            table.u64(offset)
            table.u64(len(payload))
        return table.getvalue(), bytes(data)

    @staticmethod
    def _encode_attribute(b: _Bytes, name: str, kind: int, value) -> None:
        b.str(name)
        b.u8(kind)
        if kind == S.ATTR_FLOAT:
            b.f32(value)
        elif kind == S.ATTR_INT:
            b.i64(value)
        elif kind == S.ATTR_STRING:
            b.raw(value)
        elif kind in (S.ATTR_TENSOR, S.ATTR_GRAPH):
            b.u32(value)
        elif kind == S.ATTR_FLOATS:
            b.u32(len(value))
            for v in value:
                b.f32(v)
        elif kind == S.ATTR_INTS:
            b.u32(len(value))
            for v in value:
                b.i64(v)
        elif kind == S.ATTR_STRINGS:
            b.u32(len(value))
            for v in value:
                b.raw(v)
        elif kind in (S.ATTR_TENSORS, S.ATTR_GRAPHS):
            b.u32(len(value))
            for v in value:
                b.u32(v)
        else:
            raise ValueError(f"attribute {name!r}: unknown attribute kind {kind}")

    @staticmethod
    def _encode_shape(b: _Bytes, shape: tuple | None) -> None:
        if shape is None:
            b.i32(S.RANK_UNKNOWN)
            return
        b.i32(len(shape))
        for d in shape:
            if isinstance(d, int):
                b.u8(S.DIM_FIXED)
                b.i64(d)
            elif isinstance(d, str):
                b.u8(S.DIM_SYMBOLIC)
                b.str(d)
            else:
                b.u8(S.DIM_UNKNOWN)

    def _encode_graphs(self) -> bytes:
        b = _Bytes()
        b.u32(len(self.graphs))
        for g in self.graphs:
            b.str(g.name)
            b.u32(len(g.values))
            for name, dtype, shape, kind in g.values:
                b.str(name)
                b.u32(dtype)
                self._encode_shape(b, shape)
                b.u8(kind)
            for seq in (g.inputs, g.outputs):
                b.u32(len(seq))
                for v in seq:
                    b.i32(v)
            b.u32(len(g.initializers))
            for v, t in g.initializers:
                b.i32(v)
                b.i32(t)
            b.u32(len(g.captures))
            for v in g.captures:
                b.i32(v)
            b.u32(len(g.nodes))
            for name, op_index, inputs, outputs, attributes in g.nodes:
                b.str(name)
                b.i32(op_index)
                for seq in (inputs, outputs):
                    b.u32(len(seq))
                    for v in seq:
                        b.i32(v)
                b.u32(len(attributes))
                for aname, kind, value in attributes:
                    self._encode_attribute(b, aname, kind, value)
        return b.getvalue()

    def add_blob(self, payload: bytes) -> int:
        """Store a provider program; returns its blob index."""
        self.provider_blobs.append(bytes(payload))
        return len(self.provider_blobs) - 1

    def _encode_partitions(self) -> bytes:
        b = _Bytes()
        b.u32(len(self.partitions))
        for p in self.partitions:
            b.str(p.provider)
            b.u32(p.graph)
            b.u32(p.first_node)
            b.u32(p.node_count)
            for seq in (p.inputs, p.outputs):
                b.u32(len(seq))
                for v in seq:
                    b.i32(v)
            b.i32(p.blob)
            b.str(json.dumps(p.options, sort_keys=True))
            for seq in (p.golden_inputs, p.golden_outputs):
                b.u32(len(seq))
                for t in seq:
                    b.i32(t)
        return b.getvalue()

    def to_bytes(self, sign_key: bytes | None = None) -> bytes:
        """The artifact's bytes; with ``sign_key`` (a 32-byte Ed25519 seed), signed (section kind 8)."""
        tensor_table, tensor_data = self._encode_tensors()
        structure = [
            (S.SECTION_METADATA, 0, self._encode_metadata()),
            (S.SECTION_OPERATORS, 0, self._encode_operators()),
            (S.SECTION_GRAPHS, 0, self._encode_graphs()),
            (S.SECTION_TENSORS, 0, tensor_table),
        ]
        sections: list[tuple[int, int, bytes]] = [self._stored(*sec) for sec in structure]
        sections += [(S.SECTION_PROVIDER_BLOB, S.SECTION_FLAG_OPTIONAL, blob) for blob in self.provider_blobs]
        if self.partitions:
            sections.append(self._stored(S.SECTION_PARTITIONS, S.SECTION_FLAG_OPTIONAL, self._encode_partitions()))
        # Tensor data goes last so that appending provider blobs or metadata in
        # a later version never moves the (large, mapped) weights.
        sections.append((S.SECTION_TENSOR_DATA, 0, tensor_data))
        if self.packed_weights:
            from minirt.format import packed_weights

            sections.append((S.SECTION_PACKED_WEIGHTS, S.SECTION_FLAG_OPTIONAL, packed_weights.encode(self.packed_weights)))
        if sign_key is not None:
            sections.append(_signature_section(sections, sign_key))
        return layout_sections(sections)

    def _stored(self, kind: int, flags: int, payload: bytes) -> tuple[int, int, bytes]:
        """The section as written: a zlib stream (SECTION_FLAG_DEFLATE) when compression is on, the
        section is large enough to matter and the stream is shorter; else the payload itself."""
        if self.compress_sections and kind in S.WRITER_COMPRESSES and len(payload) >= S.COMPRESS_MIN_BYTES:
            packed = zlib.compress(payload, 9)
            if len(packed) < len(payload):
                return kind, flags | S.SECTION_FLAG_DEFLATE, packed
        return kind, flags, payload


def _signature_section(sections: list[tuple[int, int, bytes]], sign_key: bytes) -> tuple[int, int, bytes]:
    if len(sign_key) != 32:
        raise ValueError(f"sign_key must be a 32-byte Ed25519 private key (seed), got {len(sign_key)} bytes")
    # Imported here: only signing builds need the signature code.
    from minirt.format.signature import signature_payload

    return (S.SECTION_SIGNATURE, S.SECTION_FLAG_OPTIONAL,
            signature_payload(bytes(sign_key), sections, file_version(sections)))


def file_version(sections: list[tuple[int, int, bytes]]) -> int:
    """The format version of a file of these sections: 2 when one is compressed, else 1."""
    return 2 if any(flags & S.SECTION_FLAG_DEFLATE for _, flags, _ in sections) else S.MIN_FORMAT_VERSION


def sign_artifact(data: bytes, sign_key: bytes) -> bytes:
    """``data`` (a valid artifact) re-laid out with a signature by ``sign_key``, replacing any old one.

    The other sections keep their order and bytes; the signature section goes last.
    """
    from minirt.format import reader

    art = reader.load(bytes(data))
    view = memoryview(bytes(data))
    sections = [
        (sec.kind, sec.flags, bytes(view[sec.offset : sec.offset + sec.length]))
        for sec in art.sections
        if sec.kind != S.SECTION_SIGNATURE
    ]
    sections.append(_signature_section(sections, sign_key))
    return layout_sections(sections)


def layout_sections(sections: list[tuple[int, int, bytes]]) -> bytes:
    """Header, section table and 64-byte aligned payloads for ``[(kind, flags, payload)]``, in order.

    A payload flagged SECTION_FLAG_DEFLATE is the section's zlib stream (its inflated length goes into the
    entry); the file is format version 2 when there is one, else version 1 (what every runtime reads)."""
    table_offset = S.HEADER.size
    offset = S.aligned_size(table_offset + len(sections) * S.SECTION_ENTRY.size)
    entries, body = [], []
    version = file_version(sections)
    for kind, flags, payload in sections:
        inflated = len(zlib.decompress(payload)) if flags & S.SECTION_FLAG_DEFLATE else 0
        entries.append(S.SECTION_ENTRY.pack(kind, flags, offset, len(payload), zlib.crc32(payload), inflated))
        pad = S.padding_required(len(payload))
        body.append(payload + b"\x00" * pad)
        offset += len(payload) + pad
    table = b"".join(entries)
    file_size = offset
    head_wo_crc = S.HEADER.pack(
        S.MAGIC, version, S.HEADER.size, len(sections), S.SECTION_ENTRY.size, table_offset, file_size, 0, 0, b"\x00" * 16
    )
    crc = zlib.crc32(table, zlib.crc32(head_wo_crc[: S.HEADER_CRC_SPAN]))
    header = S.HEADER.pack(
        S.MAGIC, version, S.HEADER.size, len(sections), S.SECTION_ENTRY.size, table_offset, file_size, 0, crc, b"\x00" * 16
    )
    first = S.aligned_size(table_offset + len(table))
    out = header + table + b"\x00" * (first - table_offset - len(table)) + b"".join(body)
    assert len(out) == file_size
    return out


def write_atomic(data: bytes | Iterable[bytes], path: str | os.PathLike) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    A ``path`` that exists and is not a regular file (``/dev/null``, a named pipe, ``/dev/stdout``) is
    written in place instead: a rename would replace the device node or pipe itself.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        if os.path.isdir(path):
            raise IsADirectoryError(f"{path!r} is a directory, not an artifact file path")
        with open(path, "wb") as f:
            for chunk in (data,) if isinstance(data, (bytes, bytearray, memoryview)) else data:
                f.write(chunk)
        return
    from minirt.tools import atomic_file

    atomic_file.write(path, data)
