"""The .mrt file schema: every constant and fixed layout, shared by reader and writer.

The runtime reads with this module and ``builder/writer.py`` writes with it,
so the two can never disagree on a field.  ``docs/format.md`` is the prose
specification of the same layout; keep the two in step (fields are only ever
appended, and a structural change bumps :data:`FORMAT_VERSION`).

All integers are little-endian.  Sections start on 64-byte boundaries and so
does every tensor inside the tensor-data section, which is what lets the
runtime hand out weights as zero-copy ``np.frombuffer`` views of a memory map.
"""
from __future__ import annotations

import struct

# --- file header --------------------------------------------------------------
MAGIC = b"MINIRT\x00\x1a"  # 8 bytes; \x1a stops `type` on Windows, \x00 stops C strings
FORMAT_VERSION = 2  # bumped only for structural changes (2: zlib-compressed sections, SECTION_FLAG_DEFLATE)
# The oldest version this reader accepts.  A writer writes MIN_FORMAT_VERSION when the file uses
# nothing of a later version (no compressed section), so older runtimes still read it.
MIN_FORMAT_VERSION = 1
ALIGNMENT = 64  # sections and tensors start on multiples of this

# Header, 64 bytes:
#   magic            8s   MAGIC
#   format_version   u32  version of the layout this file uses
#   header_size      u32  bytes of this header (64); later versions may append fields
#   section_count    u32  entries in the section table
#   section_entry_sz u32  bytes per section-table entry (32)
#   section_table    u64  file offset of the section table (64 in version 1)
#   file_size        u64  total file length in bytes (detects truncation)
#   flags            u32  reserved, 0
#   header_crc32     u32  CRC-32 of header bytes [0, 44) followed by the whole section table
#   reserved         16s  zero
HEADER = struct.Struct("<8sIIIIQQII16s")
assert HEADER.size == 64
HEADER_CRC_SPAN = 44  # bytes of the header covered by header_crc32 (everything before it)

# Section table entry, 32 bytes:
#   kind     u32  SECTION_* below
#   flags    u32  bit 0: SECTION_FLAG_OPTIONAL (a reader that does not know the kind may skip it)
#                 bit 1: SECTION_FLAG_DEFLATE (version 2: the payload is a zlib stream of the section)
#   offset   u64  absolute file offset, multiple of ALIGNMENT
#   length   u64  bytes stored in the file
#   crc32    u32  CRC-32 (zlib polynomial) of the section's stored bytes
#   inflated u32  DEFLATE: the section's length once inflated; otherwise zero
SECTION_ENTRY = struct.Struct("<IIQQII")
assert SECTION_ENTRY.size == 32

SECTION_METADATA = 1
SECTION_OPERATORS = 2
SECTION_GRAPHS = 3
SECTION_TENSORS = 4
SECTION_TENSOR_DATA = 5
SECTION_PROVIDER_BLOB = 6
SECTION_PARTITIONS = 7  # optional: a runtime that ignores it runs everything on the CPU
SECTION_SIGNATURE = 8  # optional, last: Ed25519 signature over every other section (docs/format.md)
SECTION_PACKED_WEIGHTS = 9  # optional: weights pre-packed for the native kernels (minirt/format/packed_weights.py)

SECTION_NAMES = {
    SECTION_METADATA: "metadata",
    SECTION_OPERATORS: "operators",
    SECTION_GRAPHS: "graphs",
    SECTION_TENSORS: "tensors",
    SECTION_TENSOR_DATA: "tensor_data",
    SECTION_PROVIDER_BLOB: "provider_blob",
    SECTION_PARTITIONS: "partitions",
    SECTION_SIGNATURE: "signature",
    SECTION_PACKED_WEIGHTS: "packed_weights",
}
# Sections every version-1 file has exactly once.
REQUIRED_SECTIONS = (SECTION_METADATA, SECTION_OPERATORS, SECTION_GRAPHS, SECTION_TENSORS, SECTION_TENSOR_DATA)

SECTION_FLAG_OPTIONAL = 1
# Version 2: the stored payload is a zlib stream (RFC 1950) whose inflated bytes are the section as the
# grammar describes it; the entry's last field holds that inflated length.  Only the structure
# sections may be compressed (COMPRESSIBLE_SECTIONS): never the mapped tensor data, packed weights,
# provider blobs or the signature.
SECTION_FLAG_DEFLATE = 2
COMPRESSIBLE_SECTIONS = (SECTION_METADATA, SECTION_OPERATORS, SECTION_GRAPHS, SECTION_TENSORS, SECTION_PARTITIONS)
# The reference writer compresses a compressible section from this many bytes (below, the few bytes
# saved are not worth it: a small model's file stays version 1, readable by every runtime) ...
COMPRESS_MIN_BYTES = 4096
# ... the metadata too since D174: it records no time or timing of the build, so one model built twice
# compresses to the same bytes (compressed, a changed timing moved its stored length from build to build,
# and a sweep ranks candidates by size).
WRITER_COMPRESSES = (SECTION_METADATA, SECTION_OPERATORS, SECTION_GRAPHS, SECTION_TENSORS, SECTION_PARTITIONS)
# An inflated section is never larger than this (a bound for a reader's memory, against zlib bombs).
MAX_INFLATED_BYTES = 1 << 30

# --- signature section (kind 8) -------------------------------------------------
# Payload, 100 bytes: u32 algorithm, 32-byte public key, 64-byte signature.
# Signed message: SIGNATURE_TAGS[format_version] || SHA-256 over, for every other
# section in section-table order, u32 kind, u32 flags, u64 length and the payload.
SIG_ALG_ED25519 = 1
SIGNATURE_PAYLOAD = struct.Struct("<I32s64s")
assert SIGNATURE_PAYLOAD.size == 100
SIGNATURE_DIGEST_ENTRY = struct.Struct("<IIQ")  # kind, flags, length before each payload
SIGNATURE_TAGS = {1: b"MINIRT-SIG-V1", 2: b"MINIRT-SIG-V2"}  # per format version: a signature never verifies across versions

# --- value shapes -------------------------------------------------------------
DIM_FIXED = 0  # followed by i64 size >= 0
DIM_SYMBOLIC = 1  # followed by str symbol
DIM_UNKNOWN = 2  # nothing follows
RANK_UNKNOWN = -1  # i32 rank when the shape is not known at all

DTYPE_UNDEFINED = 0  # value whose element type the builder could not infer

# What a value holds (u8 after its shape); dtype/shape describe the tensor(s) inside.
VALUE_TENSOR = 0
VALUE_SEQUENCE = 1  # a list of tensors
VALUE_OPTIONAL = 2  # a tensor or nothing
VALUE_OPTIONAL_SEQUENCE = 3  # a list of tensors or nothing
# Maps (ai.onnx.ml's DictVectorizer/CastMap inputs, ZipMap outputs; format 1.4): the key type is part of
# the kind, ``dtype`` is the type of the map's values.
VALUE_MAP_INT64 = 4  # map(int64, dtype): a dict
VALUE_MAP_STRING = 5  # map(string, dtype)
VALUE_SEQUENCE_MAP_INT64 = 6  # seq(map(int64, dtype)): a list of dicts
VALUE_SEQUENCE_MAP_STRING = 7  # seq(map(string, dtype))
VALUE_KINDS = (VALUE_TENSOR, VALUE_SEQUENCE, VALUE_OPTIONAL, VALUE_OPTIONAL_SEQUENCE, VALUE_MAP_INT64,
               VALUE_MAP_STRING, VALUE_SEQUENCE_MAP_INT64, VALUE_SEQUENCE_MAP_STRING)
MAP_KINDS = (VALUE_MAP_INT64, VALUE_MAP_STRING, VALUE_SEQUENCE_MAP_INT64, VALUE_SEQUENCE_MAP_STRING)

# --- attributes (codes match onnx.AttributeProto.AttributeType) -------------
ATTR_FLOAT = 1  # f32
ATTR_INT = 2  # i64
ATTR_STRING = 3  # bytes
ATTR_TENSOR = 4  # u32 tensor index
ATTR_GRAPH = 5  # u32 graph index (always greater than the containing graph's index)
ATTR_FLOATS = 6  # u32 n, f32 * n
ATTR_INTS = 7  # u32 n, i64 * n
ATTR_STRINGS = 8  # u32 n, bytes * n
ATTR_TENSORS = 9  # u32 n, u32 * n
ATTR_GRAPHS = 10  # u32 n, u32 * n

ATTR_NAMES = {
    ATTR_FLOAT: "float",
    ATTR_INT: "int",
    ATTR_STRING: "string",
    ATTR_TENSOR: "tensor",
    ATTR_GRAPH: "graph",
    ATTR_FLOATS: "floats",
    ATTR_INTS: "ints",
    ATTR_STRINGS: "strings",
    ATTR_TENSORS: "tensors",
    ATTR_GRAPHS: "graphs",
}

# --- metadata value types -----------------------------------------------------
META_INT = 1  # i64
META_FLOAT = 2  # f64
META_STRING = 3  # str
META_BOOL = 4  # u8 0/1
META_JSON = 5  # str holding a JSON document (structured values: reports, options)

# --- tensor table -------------------------------------------------------------
# Per tensor: u32 dtype (ONNX TensorProto code), u32 rank, i64 * rank dims,
# u64 offset (relative to the tensor-data section, multiple of ALIGNMENT),
# u64 nbytes.  String tensors (dtype 8) store, at that offset, for each element
# a u32 byte length followed by its UTF-8 bytes.

# Bounds a verifier enforces so that a hostile file cannot make the reader
# allocate without limit before it has read a byte of real data.
MAX_RANK = 64
MAX_STRING_BYTES = 1 << 24


def padding_required(offset: int, alignment: int = ALIGNMENT) -> int:
    """Bytes to add after ``offset`` so that the next byte is ``alignment``-aligned."""
    return (-offset) % alignment


def aligned_size(size: int, alignment: int = ALIGNMENT) -> int:
    """``size`` rounded up to a multiple of ``alignment``."""
    return size + padding_required(size, alignment)
