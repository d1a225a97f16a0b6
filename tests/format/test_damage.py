"""Damaged and hostile artifacts: each problem gives its own error class and a clear message."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

import minirt
from minirt.errors import ChecksumError, FormatError, VersionError
from minirt.format import reader
from minirt.format import schema as S
from tests.format.util import (
    fix_header_crc,
    fix_section_crcs,
    minimal_bytes,
    minimal_writer,
    relayout,
    replace_section,
    section,
    section_entries,
    set_entry_field,
    set_header_field,
    split,
)

GOOD = minimal_bytes()


def _load_fails(data, cls=FormatError, match=None, **kw):
    with pytest.raises(cls, match=match) as info:
        reader.load(bytes(data), **kw)
    return info.value


def test_good_file_loads():
    art = reader.load(GOOD)
    assert [v.name for v in art.main_graph.values] == ["x", "w", "y"]


def test_errors_are_minirt_errors():
    assert issubclass(ChecksumError, FormatError) and issubclass(VersionError, FormatError)
    assert issubclass(FormatError, minirt.Error)
    assert minirt.ChecksumError is ChecksumError and minirt.VersionError is VersionError


# --- empty, truncated, not a .mrt --------------------------------------------------------


def test_empty_bytes():
    err = _load_fails(b"", match="0 bytes is shorter than the 64-byte header")
    assert type(err) is FormatError


def test_empty_file(tmp_path):
    p = tmp_path / "empty.mrt"
    p.write_bytes(b"")
    with pytest.raises(FormatError, match="file is empty") as info:
        reader.load(p)
    assert str(p) in str(info.value) and type(info.value) is FormatError


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        reader.load(tmp_path / "nope.mrt")
    with pytest.raises(FormatError, match="is a directory"):
        reader.load(tmp_path)


def _cut_points():
    entries = section_entries(GOOD)
    points = {1: "header", 8: "header", 40: "header", 63: "header", 64: "table", 64 + 17: "table", 64 + 32 * 5 - 1: "table"}
    for kind, _, off, length, _, _ in entries:
        points[off + max(length // 2, 1) - 1] = S.SECTION_NAMES[kind]
    points[len(GOOD) - 1] = "last byte"
    return sorted(points.items())


@pytest.mark.parametrize("cut,where", _cut_points(), ids=[f"{c}-{w}" for c, w in _cut_points()])
def test_truncated(cut, where):
    err = _load_fails(GOOD[:cut])
    assert type(err) is FormatError  # not a checksum or version error: the size tells
    assert "truncated" in str(err)
    if cut < 64:
        assert f"{cut} bytes is shorter than the 64-byte header" in str(err)
    else:
        assert f"file is {cut} bytes but its header says {len(GOOD)} bytes" in str(err)


def test_truncated_file_names_path(tmp_path):
    p = tmp_path / "cut.mrt"
    p.write_bytes(GOOD[:300])
    with pytest.raises(FormatError, match="truncated") as info:
        reader.load(p)
    assert str(p) in str(info.value)


def test_trailing_garbage():
    _load_fails(GOOD + b"\0" * 64, match="header says")


def test_wrong_magic():
    err = _load_fails(b"PK\x03\x04" + GOOD[4:], match="not a .mrt file: magic bytes")
    assert type(err) is FormatError


def test_onnx_file_is_not_mrt():
    _load_fails(b"\x08\x07\x12\x07pytorch" + b"\0" * 100, match="not a .mrt file")


# --- checksums ----------------------------------------------------------------------------


def _with_blob() -> bytes:
    """A file holding every section kind, including a provider blob, a partition and packed weights."""
    from minirt.builder.writer import PartitionRecord
    from minirt.format import packed_weights as P

    w = minimal_writer()
    blob = w.add_blob(b"provider payload " * 5)
    g = w.graphs[0]
    node = g.nodes[0]
    w.partitions.append(PartitionRecord("test", 0, 0, 1, [v for v in node[2] if v >= 0], [node[3][0]], blob))
    w.packed_weights.append((P.PACK_SGEMM_B, 0, 8, (0, 2, 3), P.pack_sgemm_b(w.tensors[0], 0, 8)))
    return w.to_bytes(sign_key=bytes(32))  # signed: the signature section is a section kind too


@pytest.mark.parametrize("kind", sorted(S.SECTION_NAMES), ids=[S.SECTION_NAMES[k] for k in sorted(S.SECTION_NAMES)])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_flipped_byte_in_every_section(kind, where):
    data = bytearray(_with_blob())
    off, length = section(data, kind)
    pos = {"first": off, "middle": off + length // 2, "last": off + length - 1}[where]
    data[pos] ^= 0x01
    err = _load_fails(data, ChecksumError)
    assert f"section {S.SECTION_NAMES[kind]} is corrupted" in str(err)


@pytest.mark.parametrize("chunk", [64, 360, 4096], ids=["table-past-first-chunk", "many-chunks", "one-chunk"])
@pytest.mark.parametrize("kind", sorted(S.SECTION_NAMES), ids=[S.SECTION_NAMES[k] for k in sorted(S.SECTION_NAMES)])
def test_a_private_copy_checks_every_section_while_it_reads(tmp_path, monkeypatch, kind, chunk):
    """A file read from its path into a private copy is CRC-checked chunk by chunk as it is read
    (reader._COPY_CHUNK): each section's CRC continues across chunks, and a flipped byte in any section,
    at its first, middle or last byte, is found as when the check reads it whole; with the section table
    past the first chunk (64 bytes) the check falls back to reading each section whole."""
    monkeypatch.setattr(reader, "_COPY_CHUNK", chunk)
    good = _with_blob()
    path = tmp_path / "m.mrt"
    path.write_bytes(good)
    art = reader.load(path, map_file=False)
    assert art.mapped_file is None and art.signer is not None
    with open(path, "rb") as f:
        _buf, view, crcs = reader._private_copy(f, str(path), len(good), checksums=True)
    assert bytes(view) == good
    expected = {} if chunk == 64 else {(sec.offset, sec.length): zlib.crc32(good[sec.offset:sec.offset + sec.length])
                                       for sec in art.sections}
    assert crcs == expected
    off, length = section(good, kind)
    for pos in (off, off + length // 2, off + length - 1):
        data = bytearray(good)
        data[pos] ^= 0x01
        path.write_bytes(data)
        with pytest.raises(ChecksumError, match=f"section {S.SECTION_NAMES[kind]} is corrupted"):
            reader.load(path, map_file=False)


def _table_positions():
    n = len(section_entries(GOOD))
    return list(range(64, 64 + 32 * n))


@pytest.mark.parametrize("pos", _table_positions())
def test_flipped_byte_in_section_table(pos):
    data = bytearray(GOOD)
    data[pos] ^= 0x01
    err = _load_fails(data, ChecksumError)
    assert "header or section table is corrupted" in str(err)


@pytest.mark.parametrize("pos", [20, 40, 41, 42, 43, 44, 45, 46, 47], ids=lambda p: f"byte{p}")
def test_flipped_byte_in_header_fields_covered_only_by_crc(pos):
    # section_entry_size (still plausible), flags, header_crc32 itself
    data = bytearray(GOOD)
    data[pos] ^= 0x40
    err = _load_fails(data, ChecksumError)
    assert "header or section table is corrupted" in str(err)


@pytest.mark.parametrize("pos", range(48))
def test_any_flipped_header_byte_is_a_format_error(pos):
    data = bytearray(GOOD)
    data[pos] ^= 0x40
    _load_fails(data, FormatError)


def test_reserved_header_bytes_are_ignored():
    # Not covered by the CRC by design (docs/format.md: Header).
    data = bytearray(GOOD)
    data[50] = 0x7F
    reader.load(bytes(data))


def test_verify_checksums_false_skips_section_crcs_only():
    data = bytearray(GOOD)
    off, length = section(data, S.SECTION_TENSOR_DATA)
    data[off] ^= 0xFF  # weights damaged, structure intact
    _load_fails(data, ChecksumError, match="section tensor_data")
    art = reader.load(bytes(data), verify_checksums=False)
    assert art.tensor(0).shape == (2, 3)
    # the header CRC is always checked
    data[64] ^= 0x01
    _load_fails(data, ChecksumError, match="header", verify_checksums=False)


def test_verify_checksums_false_still_catches_structural_damage():
    good_w, bad_w = minimal_writer(), minimal_writer()
    name, _op, ins, outs, attrs = bad_w.graphs[0].nodes[0]
    bad_w.graphs[0].nodes[0] = (name, 7, ins, outs, attrs)  # operator index out of range
    good, bad = good_w.to_bytes(), bad_w.to_bytes()
    off, length = section(good, S.SECTION_GRAPHS)
    assert section(bad, S.SECTION_GRAPHS) == (off, length)
    spliced = bytearray(good)
    spliced[off : off + length] = bad[off : off + length]  # damaged bytes, stale CRC
    _load_fails(spliced, ChecksumError, match="section graphs is corrupted")
    err = _load_fails(spliced, FormatError, match="operator index 7 is out of range", verify_checksums=False)
    assert type(err) is FormatError


# --- versions and section kinds ---------------------------------------------------------------


def test_newer_format_version_names_both_versions():
    newer = S.FORMAT_VERSION + 1
    err = _load_fails(set_header_field(GOOD, "<I", 8, newer), VersionError)
    msg = str(err)
    assert f"version {newer}" in msg and f"up to {S.FORMAT_VERSION}" in msg
    assert minirt.__version__ in msg and "upgrade" in msg


def test_much_newer_version_is_refused_before_anything_else():
    # A future file whose header grew and whose CRC layout we cannot know.
    data = bytearray(GOOD)
    struct.pack_into("<I", data, 8, 1000)
    struct.pack_into("<I", data, 44, 0)  # stale CRC: must not matter
    _load_fails(data, VersionError, match="version 1000")


def test_version_zero_is_invalid():
    err = _load_fails(set_header_field(GOOD, "<I", 8, 0), FormatError, match="invalid .mrt format version 0")
    assert type(err) is FormatError


# --- compressed sections (format version 2) --------------------------------------------------------


def _deflated(kinds=(S.SECTION_GRAPHS, S.SECTION_TENSORS)):
    """GOOD with the sections of ``kinds`` stored as zlib streams (a version-2 file)."""
    return [(k, f | S.SECTION_FLAG_DEFLATE, zlib.compress(p)) if k in kinds else (k, f, p) for k, f, p in split(GOOD)]


def test_compressed_sections_load_as_the_stored_ones():
    data = relayout(_deflated((S.SECTION_METADATA, S.SECTION_OPERATORS, S.SECTION_GRAPHS, S.SECTION_TENSORS)))
    art = reader.load(data)
    assert art.format_version == 2
    assert [s.deflated for s in art.sections] == [True, True, True, True, False]
    assert art.sections[2].inflated == len(dict((k, p) for k, _, p in split(GOOD))[S.SECTION_GRAPHS])
    assert [v.name for v in art.main_graph.values] == ["x", "w", "y"]
    assert art.metadata == reader.load(GOOD).metadata
    np.testing.assert_array_equal(art.tensor(0), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_compressed_section_in_a_version_1_file():
    _load_fails(relayout(_deflated(), version=1), match=r"section 2 \(graphs\) is marked compressed .* format version 1")


@pytest.mark.parametrize("kind", [S.SECTION_TENSOR_DATA], ids=["tensor_data"])
def test_section_that_may_not_be_compressed(kind):
    _load_fails(relayout(_deflated((kind,))), match="tensor_data.* is marked compressed, but only the metadata")


@pytest.mark.parametrize("inflated", [0, S.MAX_INFLATED_BYTES + 1, 7, 10**6])
def test_wrong_inflated_length(inflated):
    data = relayout(_deflated())
    index = [k for k, _, _ in split(data)].index(S.SECTION_GRAPHS)
    data = set_entry_field(data, index, 28, "<I", inflated)
    match = "inflated length of" if inflated in (0, S.MAX_INFLATED_BYTES + 1) else "graphs: its zlib stream inflates to"
    err = _load_fails(data, match=match)
    assert type(err) is FormatError and str(inflated) in str(err)


def test_damaged_zlib_stream():
    """The CRC covers the stored stream; without the check, a damaged stream is still a clear FormatError."""
    data = bytearray(relayout(_deflated()))
    off, _ = section(data, S.SECTION_GRAPHS)
    for i in range(off + 2, off + 12):
        data[i] ^= 0x5A
    _load_fails(bytes(data), ChecksumError, match="section graphs is corrupted")
    err = _load_fails(bytes(data), verify_checksums=False, match="section graphs: its zlib stream")
    assert type(err) is FormatError


def test_compressed_stream_with_trailing_bytes():
    data = bytearray(relayout(_deflated()))
    index = [k for k, _, _, _, _, _ in section_entries(data)].index(S.SECTION_GRAPHS)
    _, _, off, length, _, pos = section_entries(data)[index]
    assert S.padding_required(length)  # (a byte of padding follows the stream: take it into the section)
    struct.pack_into("<Q", data, pos + 16, length + 1)
    data[off + length] = 0x55
    _load_fails(bytes(fix_section_crcs(data)), match="graphs: its zlib stream inflates to .* with trailing bytes")


def test_unknown_required_section_kind():
    data = relayout(split(GOOD) + [(77, 0, b"future stuff")])
    err = _load_fails(data, VersionError)
    assert "unknown kind 77" in str(err) and "newer" in str(err)


def test_unknown_optional_section_is_ignored():
    data = relayout([(99, S.SECTION_FLAG_OPTIONAL, b"ignore me")] + split(GOOD) + [(77, S.SECTION_FLAG_OPTIONAL, b"")])
    art = reader.load(data)
    assert [s.kind for s in art.sections] == [99, 1, 2, 3, 4, 5, 77]
    assert art.sections[0].name == "unknown(99)"
    np.testing.assert_array_equal(art.tensor(0), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_unknown_optional_section_is_still_checksummed():
    data = bytearray(relayout(split(GOOD) + [(99, S.SECTION_FLAG_OPTIONAL, b"ignore me")]))
    off, _ = section(data, 99)
    data[off] ^= 1
    _load_fails(data, ChecksumError, match=r"unknown\(99\)")


def test_newer_header_and_entry_sizes_are_accepted():
    """Append-only growth: a bigger header and bigger entries still load (fields are read by stride)."""
    parts = split(GOOD)
    hsize, esize = 128, 48
    table_off = hsize
    off = table_off + esize * len(parts)
    off += (-off) % 64
    entries, body = b"", b""
    for kind, flags, payload in parts:
        entries += S.SECTION_ENTRY.pack(kind, flags, off, len(payload), zlib.crc32(payload), 0) + b"\xee" * (esize - 32)
        padded = payload + b"\0" * ((-len(payload)) % 64)
        body += padded
        off += len(padded)
    head = S.HEADER.pack(S.MAGIC, 1, hsize, len(parts), esize, table_off, off, 0, 0, b"\0" * 16) + b"\xaa" * (hsize - 64)
    pad = b"\0" * ((-(table_off + len(entries))) % 64)
    art = reader.load(bytes(fix_header_crc(head + entries + pad + body)))
    assert [v.name for v in art.main_graph.values] == ["x", "w", "y"]


def test_duplicate_section():
    parts = split(GOOD)
    _load_fails(relayout(parts + [parts[0]]), match="section metadata appears twice")


@pytest.mark.parametrize("kind", S.REQUIRED_SECTIONS, ids=[S.SECTION_NAMES[k] for k in S.REQUIRED_SECTIONS])
def test_missing_required_section(kind):
    parts = [p for p in split(GOOD) if p[0] != kind]
    _load_fails(relayout(parts), match=f"required section {S.SECTION_NAMES[kind]} is missing")


# --- section placement ----------------------------------------------------------------------------


def test_overlapping_sections():
    entries = section_entries(GOOD)
    meta_off = entries[0][2]
    data = set_entry_field(GOOD, 1, 8, "<Q", meta_off)  # operators now starts where metadata does
    _load_fails(data, match="sections metadata and operators overlap")


def test_overlap_by_length():
    entries = section_entries(GOOD)
    length = entries[2][2] - entries[0][2] + 1  # metadata runs one byte into graphs
    _load_fails(set_entry_field(GOOD, 0, 16, "<Q", length), match="overlap")


def test_misaligned_section():
    off = section_entries(GOOD)[2][2]
    err = _load_fails(set_entry_field(GOOD, 2, 8, "<Q", off + 8))
    assert "section 2 (graphs) starts at offset" in str(err) and "not a multiple of 64" in str(err)


def test_section_past_end_of_file():
    _load_fails(set_entry_field(GOOD, 4, 16, "<Q", 10**6), match=r"section 4 \(tensor_data\) .* lies outside")


def test_section_inside_header_area():
    _load_fails(set_entry_field(GOOD, 0, 8, "<Q", 0), match="lies outside the file's data area")


def test_section_table_too_large():
    _load_fails(set_header_field(GOOD, "<I", 16, 5000), match="section table")


# --- section contents (structurally bad, correctly checksummed) -------------------------------------


def _tensor_field_pos(rank: int, field: str) -> int:
    """Position of a field of tensor 0 inside the tensors section."""
    base = 4 + 4 + 4 + 8 * rank
    return {"offset": base, "nbytes": base + 8}[field]


def _patch_section(data: bytes, kind: int, pos: int, fmt: str, value) -> bytes:
    b = bytearray(data)
    off, _ = section(b, kind)
    struct.pack_into(fmt, b, off + pos, value)
    return bytes(fix_section_crcs(b))


def test_tensor_offset_out_of_range():
    data = _patch_section(GOOD, S.SECTION_TENSORS, _tensor_field_pos(2, "offset"), "<Q", 64 * 100)
    err = _load_fails(data)
    assert "malformed tensors section" in str(err) and "runs past the tensor-data section" in str(err)


def test_tensor_offset_misaligned():
    data = _patch_section(GOOD, S.SECTION_TENSORS, _tensor_field_pos(2, "offset"), "<Q", 4)
    _load_fails(data, match="tensor 0 data offset 4 is not 64-byte aligned")


def test_tensor_nbytes_mismatch():
    data = _patch_section(GOOD, S.SECTION_TENSORS, _tensor_field_pos(2, "nbytes"), "<Q", 20)
    _load_fails(data, match=r"tensor 0 of float\[2, 3\] needs 24 bytes but records 20")


def test_tensor_unknown_dtype():
    data = _patch_section(GOOD, S.SECTION_TENSORS, 4, "<I", 99)
    _load_fails(data, match="tensor 0 has unknown dtype code 99")


def test_tensor_rank_above_limit():
    payload = struct.pack("<III", 1, 1, S.MAX_RANK + 1) + b"\0" * (8 * (S.MAX_RANK + 1) + 16)
    _load_fails(replace_section(GOOD, S.SECTION_TENSORS, payload), match="rank 65, above the limit 64")


def test_tensor_negative_dim():
    payload = struct.pack("<IIIqQQ", 1, 1, 1, -1, 0, 0)
    _load_fails(replace_section(GOOD, S.SECTION_TENSORS, payload), match="negative dimension")


def test_hostile_count_is_refused_before_allocating():
    for kind, what in [(S.SECTION_METADATA, "metadata entry"), (S.SECTION_TENSORS, "tensor"), (S.SECTION_GRAPHS, "graph"), (S.SECTION_OPERATORS, "opset")]:
        data = _patch_section(GOOD, kind, 0, "<I", 0xFFFFFFFF)
        err = _load_fails(data)
        assert f"{what} count 4294967295 cannot fit" in str(err), str(err)


def test_hostile_string_length():
    data = _patch_section(GOOD, S.SECTION_METADATA, 4, "<I", 0xFFFFFFF0)  # first key's length
    _load_fails(data, match="malformed metadata section at byte 8: byte string of length 4294967280 runs past")


def test_invalid_utf8_string():
    payload = struct.pack("<II", 1, 2) + b"\xff\xfe" + struct.pack("<BB", S.META_BOOL, 1)
    _load_fails(replace_section(GOOD, S.SECTION_METADATA, payload), match="not valid UTF-8")


def test_unknown_metadata_type():
    payload = struct.pack("<II", 1, 1) + b"k" + struct.pack("<B", 9)
    _load_fails(replace_section(GOOD, S.SECTION_METADATA, payload), match="metadata 'k' has unknown value type 9")


def test_invalid_json_metadata():
    # JSON values are decoded when read (D165): the load succeeds, reading the value fails, naming it and its place
    payload = struct.pack("<II", 1, 1) + b"k" + struct.pack("<BI", S.META_JSON, 3) + b"{x]"
    art = reader.load(bytes(replace_section(GOOD, S.SECTION_METADATA, payload)))
    with pytest.raises(FormatError, match=r"metadata section at byte 10: metadata 'k' is not valid JSON"):
        art.metadata_value("k")
    with pytest.raises(FormatError, match="metadata 'k' is not valid JSON"):
        art.metadata
    assert art.metadata_value("missing", 7) == 7


def test_json_metadata_is_decoded_when_read():
    art = reader.load(GOOD)
    assert art.metadata == {k: art.metadata_value(k) for k in art.metadata}
    payload = struct.pack("<II", 1, 1) + b"j" + struct.pack("<BI", S.META_JSON, 10) + b'{"a": [1]}'
    art = reader.load(bytes(replace_section(GOOD, S.SECTION_METADATA, payload)))
    assert art.metadata_value("j") == {"a": [1]}
    assert art.metadata == {"j": {"a": [1]}}


def test_trailing_bytes_in_section():
    off, length = section(GOOD, S.SECTION_OPERATORS)
    payload = GOOD[off : off + length] + b"\0\0\0"
    _load_fails(replace_section(GOOD, S.SECTION_OPERATORS, payload), match="malformed operators section at byte .*3 unexpected trailing bytes")


def test_truncated_section_payload():
    off, length = section(GOOD, S.SECTION_GRAPHS)
    payload = GOOD[off : off + length - 3]
    _load_fails(replace_section(GOOD, S.SECTION_GRAPHS, payload), match="malformed graphs section .*truncated")


def test_zero_graphs():
    _load_fails(replace_section(GOOD, S.SECTION_GRAPHS, struct.pack("<I", 0)), match="at least one graph")


# --- graphs: indices and data flow ---------------------------------------------------------------


def _bad_graph(mutate) -> bytes:
    w = minimal_writer()
    mutate(w, w.graphs[0])
    return w.to_bytes()


def _replace_node(g, **changes):
    name, op, ins, outs, attrs = g.nodes[0]
    vals = dict(name=name, op=op, ins=ins, outs=outs, attrs=attrs)
    vals.update(changes)
    g.nodes[0] = (vals["name"], vals["op"], tuple(vals["ins"]), tuple(vals["outs"]), tuple(vals["attrs"]))


def test_node_reads_undefined_value():
    def m(w, g):
        z = g.value("ghost", 1, (1,))
        _replace_node(g, ins=(0, z))

    _load_fails(_bad_graph(m), match="graph 0 \\('main'\\): node 'add' reads 'ghost' before it is produced")


def test_node_reads_value_produced_later():
    def m(w, g):
        op = w.operator("", "Relu", 14)
        y = g.value("y")
        late = g.value("late", 1, None)
        g.nodes.insert(0, ("early", op, (late,), (g.value("e"),), ()))
        g.add_node("producer", op, [y], [late], [])

    _load_fails(_bad_graph(m), match="node 'early' reads 'late' before it is produced")


def test_value_defined_twice():
    def m(w, g):
        g.add_node("again", 0, [0, 1], [g.value("y")], [])

    _load_fails(_bad_graph(m), match="value 'y' is defined twice \\(output of node 'again'\\)")


def test_input_defined_twice():
    def m(w, g):
        g.inputs.append(0)

    _load_fails(_bad_graph(m), match="value 'x' is defined twice \\(graph input\\)")


def test_output_never_produced():
    def m(w, g):
        g.outputs.append(g.value("nowhere", 1, None))

    _load_fails(_bad_graph(m), match="output 'nowhere' is never produced")


def test_operator_index_out_of_range():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, op=3)), match="operator index 3 is out of range \\[0, 1\\)")


def test_negative_operator_index():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, op=-1)), match="operator index -1 is out of range")


def test_node_value_index_out_of_range():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, ins=(0, 42))), match="node input index 42 is out of range \\[0, 3\\)")


def test_node_value_index_minus_two():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, outs=(-2,))), match="node output index -2 is out of range")


def test_absent_optional_input_and_output_allowed():
    def m(w, g):
        _replace_node(g, ins=(0, 1, -1), outs=(2, -1))

    art = reader.load(_bad_graph(m))
    assert art.main_graph.nodes[0].inputs == (0, 1, -1) and art.main_graph.nodes[0].outputs == (2, -1)


def test_graph_input_index_out_of_range():
    _load_fails(_bad_graph(lambda w, g: g.inputs.append(9)), match="graph input value index 9 is out of range")


def test_initializer_tensor_out_of_range():
    def m(w, g):
        g.initializers[0] = (1, 5)

    _load_fails(_bad_graph(m), match="initializer tensor index 5 is out of range \\[0, 1\\)")


def test_attribute_tensor_out_of_range():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, attrs=[("t", S.ATTR_TENSOR, 3)])), match="tensor index 3 is out of range")


@pytest.mark.parametrize("kind", [S.ATTR_GRAPH, S.ATTR_GRAPHS])
def test_subgraph_index_not_after_own_graph(kind):
    def m(w, g):
        w.graph("sub")  # graph 1 exists, but the attribute points at graph 0 (itself)
        _replace_node(g, attrs=[("body", kind, 0 if kind == S.ATTR_GRAPH else (1, 0))])

    _load_fails(_bad_graph(m), match="subgraph index 0 must be in \\(0, 2\\)")


def test_subgraph_cannot_point_backwards():
    def m(w, g):
        _, sub = w.graph("sub")
        _, sub2 = w.graph("sub2")
        sub.add_node("n", 0, [], [sub.value("o")], [("g", S.ATTR_GRAPH, 1)])  # graph 1 -> graph 1
        _replace_node(g, attrs=[("g", S.ATTR_GRAPH, 1)])

    _load_fails(_bad_graph(m), match="subgraph index 1 must be in \\(1, 3\\)")


def test_subgraph_index_past_end():
    _load_fails(_bad_graph(lambda w, g: _replace_node(g, attrs=[("g", S.ATTR_GRAPH, 1)])), match="subgraph index 1 must be in \\(0, 1\\)")


def test_unknown_attribute_type_on_disk():
    w = minimal_writer()
    _replace_node(w.graphs[0], attrs=[("a", S.ATTR_INT, 5)])
    data = w.to_bytes()
    off, length = section(data, S.SECTION_GRAPHS)
    payload = bytearray(data[off : off + length])
    pos = payload.index(b"\x01\x00\x00\x00a\x02") + 5  # the attribute's type byte
    payload[pos] = 42
    _load_fails(replace_section(data, S.SECTION_GRAPHS, bytes(payload)), match="unknown attribute type 42")


def test_unknown_dim_kind_and_bad_rank():
    w = minimal_writer()
    data = w.to_bytes()
    off, length = section(data, S.SECTION_GRAPHS)
    payload = bytearray(data[off : off + length])
    # graph name "main", 3 values; value 0 = "x": str, u32 dtype, i32 rank, then dim 0's kind byte
    vpos = 4 + 4 + 4 + 4
    assert payload[vpos : vpos + 5] == b"\x01\x00\x00\x00x"
    kind_pos = vpos + 5 + 4 + 4
    bad = bytearray(payload)
    bad[kind_pos] = 7
    _load_fails(replace_section(data, S.SECTION_GRAPHS, bytes(bad)), match="unknown dimension kind 7")
    bad = bytearray(payload)
    struct.pack_into("<i", bad, kind_pos - 4, 65)
    _load_fails(replace_section(data, S.SECTION_GRAPHS, bytes(bad)), match="rank 65 outside \\[0, 64\\]")
    bad = bytearray(payload)
    struct.pack_into("<I", bad, kind_pos - 8, 99)
    _load_fails(replace_section(data, S.SECTION_GRAPHS, bytes(bad)), match="value 'x' has unknown dtype code 99")


def test_string_tensor_whose_dims_cannot_fit_is_refused_at_load():
    w = minimal_writer()
    w.tensor(np.array(["a", "b"], dtype=object))  # 10 payload bytes
    data = w.to_bytes()
    off, length = section(data, S.SECTION_TENSORS)
    payload = bytearray(data[off : off + length])
    struct.pack_into("<q", payload, 4 + (4 + 4 + 16 + 16) + 8, 3)
    with pytest.raises(FormatError, match="string tensor 1 of 3 elements cannot fit in 10 bytes"):
        reader.load(replace_section(data, S.SECTION_TENSORS, bytes(payload)))


def test_string_tensor_shorter_than_its_dims():
    w = minimal_writer()
    w.tensor(np.array(["abcdef", "b"], dtype=object))  # 15 payload bytes
    data = w.to_bytes()
    # claim 3 elements: 3 length prefixes fit in 15 bytes, so the table passes
    # (string sizes are variable); reading the strings then fails cleanly
    off, length = section(data, S.SECTION_TENSORS)
    payload = bytearray(data[off : off + length])
    rec1 = 4 + (4 + 4 + 16 + 16)  # after count and tensor 0 (rank 2)
    struct.pack_into("<q", payload, rec1 + 8, 3)
    art = reader.load(replace_section(data, S.SECTION_TENSORS, bytes(payload)))
    with pytest.raises(FormatError, match="malformed tensor_data section"):
        art.tensor(1)
