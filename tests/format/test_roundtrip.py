"""Writer -> reader round trips: every metadata type, dtype, attribute type, and the layout guarantees."""
from __future__ import annotations

import math
import mmap

import numpy as np
import pytest

from minirt.builder.writer import ArtifactWriter, write_atomic
from minirt.format import reader
from minirt.format import schema as S
from tests.format.util import minimal_bytes, minimal_writer, section_entries

NUMERIC_DTYPES = [
    (np.float32, 1), (np.uint8, 2), (np.int8, 3), (np.uint16, 4), (np.int16, 5), (np.int32, 6),
    (np.int64, 7), (np.bool_, 9), (np.float16, 10), (np.float64, 11), (np.uint32, 12), (np.uint64, 13),
]


def _with_tensors(arrays) -> reader.Artifact:
    w = minimal_writer()
    idx = [w.tensor(a) for a in arrays]
    return reader.load(w.to_bytes()), idx


def _sample(dtype, shape=(2, 3)) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt == np.bool_:
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dt.kind == "f":
        return (np.linspace(-2.5, 7.25, n)).astype(dt).reshape(shape)
    info = np.iinfo(dt)
    vals = np.array([info.min, info.max, 0, 1, info.max // 3, info.min // 2 if info.min else 7], dtype=dt)
    return np.resize(vals, n).reshape(shape)


# --- metadata -------------------------------------------------------------------


def test_metadata_every_type_round_trips():
    w = minimal_writer()
    values = {
        "int": -(2**62),
        "int.zero": 0,
        "float": 3.141592653589793,
        "float.inf": math.inf,
        "string": "héllo wörld ✓",
        "string.empty": "",
        "bool.true": True,
        "bool.false": False,
        "json.dict": {"a": [1, 2, {"b": None}], "c": "d"},
        "json.list": [1, "two", 3.0],
    }
    for k, v in values.items():
        w.set_metadata(k, v)
    art = reader.load(w.to_bytes())
    for k, v in values.items():
        got = art.metadata[k]
        assert got == v and type(got) is type(v), k
    assert art.metadata["producer.name"] == "tests"


def test_metadata_type_codes_on_disk():
    w = ArtifactWriter()
    w.graph("g")
    for k, v in {"i": 1, "f": 1.0, "s": "x", "b": True, "j": [1]}.items():
        w.set_metadata(k, v)
    assert {k: code for k, (code, _) in w.metadata.items()} == {
        "i": S.META_INT, "f": S.META_FLOAT, "s": S.META_STRING, "b": S.META_BOOL, "j": S.META_JSON,
    }


def test_metadata_nan_float():
    w = minimal_writer()
    w.set_metadata("nan", float("nan"))
    assert math.isnan(reader.load(w.to_bytes()).metadata["nan"])


# --- operators --------------------------------------------------------------------


def test_opsets_and_operators_round_trip():
    w = minimal_writer()
    w.opsets.update({"": 18, "com.microsoft": 1, "ai.onnx.ml": 3})
    a = w.operator("com.microsoft", "FusedMatMul", 1)
    b = w.operator("", "Relu", 14)
    assert w.operator("com.microsoft", "FusedMatMul", 1) == a  # de-duplicated
    art = reader.load(w.to_bytes())
    assert art.opsets == {"": 18, "com.microsoft": 1, "ai.onnx.ml": 3}
    assert art.operators[0] == reader.Operator("", "Add", 17)
    assert art.operators[a] == reader.Operator("com.microsoft", "FusedMatMul", 1)
    assert art.operators[b] == reader.Operator("", "Relu", 14)
    assert len(art.operators) == 3


# --- tensors ----------------------------------------------------------------------


@pytest.mark.parametrize("dtype,code", NUMERIC_DTYPES, ids=[np.dtype(d).name for d, _ in NUMERIC_DTYPES])
def test_tensor_every_numeric_dtype(dtype, code):
    arr = _sample(dtype)
    art, (i,) = _with_tensors([arr])
    rec = art.tensors[i]
    assert rec.dtype == code and rec.dims == (2, 3) and rec.nbytes == arr.nbytes
    got = art.tensor(i)
    assert got.dtype == arr.dtype and got.shape == arr.shape
    np.testing.assert_array_equal(got, arr)


def test_tensor_strings():
    arr = np.array([["a", "", "héllo"], ["✓✓", "x" * 1000, "z"]], dtype=object)
    art, (i,) = _with_tensors([arr])
    rec = art.tensors[i]
    assert rec.dtype == 8 and rec.dims == (2, 3)
    assert rec.nbytes == sum(4 + len(s.encode()) for s in arr.ravel())
    got = art.tensor(i)
    assert got.dtype == object and got.shape == (2, 3)
    assert got.tolist() == arr.tolist()


def test_tensor_string_scalar_and_empty():
    art, (a, b) = _with_tensors([np.array("only", dtype=object), np.zeros((0, 2), dtype=object)])
    assert art.tensor(a).shape == () and art.tensor(a).item() == "only"
    assert art.tensor(b).shape == (0, 2) and art.tensors[b].nbytes == 0


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_, np.float16])
def test_tensor_zero_d(dtype):
    arr = np.array(7, dtype=dtype)
    art, (i,) = _with_tensors([arr])
    assert art.tensors[i].dims == () and art.tensors[i].nbytes == np.dtype(dtype).itemsize
    got = art.tensor(i)
    assert got.shape == () and got == arr


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 0, 5)])
def test_tensor_empty(shape):
    arr = np.zeros(shape, np.float32)
    art, (first, i, last) = _with_tensors([np.ones(3, np.float32), arr, np.ones(1, np.int8)])
    assert art.tensors[i].nbytes == 0 and art.tensors[i].dims == shape
    assert art.tensor(i).shape == shape
    np.testing.assert_array_equal(art.tensor(first), np.ones(3, np.float32))
    np.testing.assert_array_equal(art.tensor(last), np.ones(1, np.int8))


def test_only_empty_tensors_give_empty_data_section():
    w = ArtifactWriter()
    w.graph("g")
    w.tensor(np.zeros((0,), np.float32))
    data = w.to_bytes()
    (_, length), = [(o, n) for k, _, o, n, _, _ in section_entries(data) if k == S.SECTION_TENSOR_DATA]
    assert length == 0
    art = reader.load(data)
    assert art.tensor(0).shape == (0,)


def test_non_contiguous_source():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[::2, 1::2]  # non-contiguous
    art, (i,) = _with_tensors([view])
    np.testing.assert_array_equal(art.tensor(i), view)


def test_big_endian_source_is_stored_little_endian():
    arr = np.arange(6, dtype=">f4").reshape(2, 3)
    art, (i,) = _with_tensors([arr])
    assert art.tensors[i].dtype == 1
    np.testing.assert_array_equal(art.tensor(i), arr)


def test_every_tensor_offset_and_section_is_64_aligned():
    sizes = [1, 3, 63, 64, 65, 127, 0, 5]
    arrays = [np.ones(n, np.int8) for n in sizes] + [np.ones((3, 5), np.float64), np.array(["ab", "c"], dtype=object)]
    w = minimal_writer()
    w.provider_blobs.append(b"xyz" * 7)
    for a in arrays:
        w.tensor(a)
    data = w.to_bytes()
    art = reader.load(data)
    data_off = None
    for kind, flags, off, length, _, _ in section_entries(data):
        assert off % 64 == 0, (kind, off)
        if kind == S.SECTION_TENSOR_DATA:
            data_off = off
    assert len(data) % 64 == 0
    for rec in art.tensors:
        assert rec.offset % 64 == 0
        assert (data_off + rec.offset) % 64 == 0
    # tensors are laid out in order, each at the next aligned offset
    prev_end = 0
    for rec in art.tensors:
        assert rec.offset == S.aligned_size(prev_end)
        prev_end = rec.offset + rec.nbytes


def test_section_order_and_provider_blob_is_optional():
    w = minimal_writer()
    w.provider_blobs += [b"one", b"two"]
    data = w.to_bytes()
    entries = section_entries(data)
    kinds = [e[0] for e in entries]
    assert kinds == [1, 2, 3, 4, 6, 6, 5]  # tensor data last
    assert all(e[1] == S.SECTION_FLAG_OPTIONAL for e in entries if e[0] == S.SECTION_PROVIDER_BLOB)
    assert all(e[1] == 0 for e in entries if e[0] != S.SECTION_PROVIDER_BLOB)
    art = reader.load(data)
    assert [s.kind for s in art.sections] == kinds


def test_header_fields():
    data = minimal_bytes()
    magic, version, hsize, count, esize, toff, fsize, flags, _crc, reserved = S.HEADER.unpack_from(data)
    assert (magic, version, hsize, esize, toff, fsize, flags) == (S.MAGIC, 1, 64, 32, 64, len(data), 0)
    assert count == 5 and reserved == b"\0" * 16
    assert reader.load(data).format_version == 1


# --- zero copy ----------------------------------------------------------------------


def _base_chain(arr):
    seen = []
    obj = arr
    while obj is not None:
        seen.append(obj)
        obj = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else getattr(obj, "obj", None)
    return seen


def test_tensors_are_zero_copy_views_of_the_mmap(tmp_path):
    w = minimal_writer()
    big = np.arange(10_000, dtype=np.float32).reshape(100, 100)
    i = w.tensor(big)
    path = tmp_path / "m.mrt"
    write_atomic(w.to_bytes(), path)
    art = reader.load(path)
    assert isinstance(art._buffer, mmap.mmap)
    arr = art.tensor(i)
    np.testing.assert_array_equal(arr, big)
    assert not arr.flags.owndata
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0, 0] = 1.0
    chain = _base_chain(arr)
    assert any(isinstance(o, mmap.mmap) for o in chain), chain
    # and the view really points into the map: its address is inside the mapping
    buf_addr = np.frombuffer(art._buffer, dtype=np.uint8).ctypes.data
    assert buf_addr <= arr.ctypes.data < buf_addr + art.size
    assert (arr.ctypes.data - buf_addr) % 64 == 0


def test_tensors_from_bytes_are_read_only_views():
    art, (i,) = _with_tensors([np.ones((4, 4), np.float64)])
    arr = art.tensor(i)
    assert not arr.flags.owndata and not arr.flags.writeable
    assert any(isinstance(o, bytes) for o in _base_chain(arr))


# --- graphs and attributes ------------------------------------------------------------


def _graph_artifact():
    """Main graph with a node carrying every attribute type; two subgraphs with captures."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    t0 = w.tensor(np.array([1.5, 2.5], np.float32))
    t1 = w.tensor(np.array([[1, 2]], np.int64))
    t2 = w.tensor(np.array(["s"], dtype=object))
    op_all = w.operator("test.domain", "Everything", 1)
    op_add = w.operator("", "Add", 17)
    main_i, main = w.graph("main")
    x = main.value("x", 1, ("batch", None, 4))
    main.inputs.append(x)
    k = main.value("k", 1, (2,))
    main.initializers.append((k, t0))
    u = main.value("u", 0, None)  # unknown dtype and rank
    main.add_node("pre", op_add, [x, k], [u], [])
    out = main.value("out", 1, ())
    # subgraphs are numbered after main
    sub1_i, sub1 = w.graph("then")
    cap_u = sub1.value("u")
    sub1.captures.append(cap_u)
    s_in = sub1.value("s_in", 7, (1,))
    sub1.inputs.append(s_in)
    s_out = sub1.value("s_out", 1, None)
    sub1.add_node("inner", op_add, [cap_u, s_in], [s_out], [("alpha", S.ATTR_FLOAT, 0.5)])
    sub1.outputs.append(s_out)
    sub2_i, sub2 = w.graph("else")
    cap_x = sub2.value("x")
    sub2.captures.append(cap_x)
    sub2.outputs.append(cap_x)
    # Each subgraph is held by exactly one attribute (the reader checks it).
    sub3_i, sub3 = w.graph("third")
    cap_x3 = sub3.value("x")
    sub3.captures.append(cap_x3)
    sub3.outputs.append(cap_x3)
    attrs = [
        ("f", S.ATTR_FLOAT, 0.25),
        ("i", S.ATTR_INT, -(2**40)),
        ("s", S.ATTR_STRING, b"bytes \xff not utf8"),
        ("t", S.ATTR_TENSOR, t1),
        ("g", S.ATTR_GRAPH, sub1_i),
        ("fs", S.ATTR_FLOATS, (1.0, -2.5, 0.0)),
        ("is", S.ATTR_INTS, (1, -1, 2**62)),
        ("ss", S.ATTR_STRINGS, (b"a", b"", "ü".encode())),
        ("ts", S.ATTR_TENSORS, (t0, t2)),
        ("gs", S.ATTR_GRAPHS, (sub2_i, sub3_i)),
        ("empty_ints", S.ATTR_INTS, ()),
    ]
    main.add_node("everything", op_all, [u, -1, x], [out, -1], attrs)
    main.outputs.append(out)
    return w, (main_i, sub1_i, sub2_i), (t0, t1, t2)


def test_graph_round_trip_every_attribute_type():
    w, (mi, s1, s2), (t0, t1, t2) = _graph_artifact()
    art = reader.load(w.to_bytes())
    main = art.graphs[mi]
    assert main.name == "main" and art.main_graph is main
    assert [v.name for v in main.values] == ["x", "k", "u", "out"]
    assert main.values[0] == reader.ValueInfo("x", 1, ("batch", None, 4))
    assert main.values[2] == reader.ValueInfo("u", 0, None)
    assert main.values[3].shape == ()
    assert main.inputs == (0,) and main.outputs == (3,) and main.initializers == ((1, t0),) and main.captures == ()
    pre, node = main.nodes
    assert pre.name == "pre" and pre.inputs == (0, 1) and pre.outputs == (2,)
    assert node.inputs == (2, -1, 0) and node.outputs == (3, -1)
    assert art.operators[node.op_index] == reader.Operator("test.domain", "Everything", 1)
    a = node.attributes
    assert list(a) == ["f", "i", "s", "t", "g", "fs", "is", "ss", "ts", "gs", "empty_ints"]
    assert {n: at.kind for n, at in a.items()} == {
        "f": S.ATTR_FLOAT, "i": S.ATTR_INT, "s": S.ATTR_STRING, "t": S.ATTR_TENSOR, "g": S.ATTR_GRAPH,
        "fs": S.ATTR_FLOATS, "is": S.ATTR_INTS, "ss": S.ATTR_STRINGS, "ts": S.ATTR_TENSORS,
        "gs": S.ATTR_GRAPHS, "empty_ints": S.ATTR_INTS,
    }
    assert a["f"].value == 0.25
    assert a["i"].value == -(2**40)
    assert a["s"].value == b"bytes \xff not utf8"
    assert a["t"].value == t1
    np.testing.assert_array_equal(art.tensor(a["t"].value), [[1, 2]])
    assert a["g"].value == s1
    assert a["fs"].value == (1.0, -2.5, 0.0)
    assert a["is"].value == (1, -1, 2**62)
    assert a["ss"].value == (b"a", b"", "ü".encode())
    assert a["ts"].value == (t0, t2)
    assert art.tensor(t2).tolist() == ["s"]
    assert a["gs"].value == (s2, s2 + 1)
    assert a["empty_ints"].value == ()
    # subgraphs and their captures
    then, other = art.graphs[s1], art.graphs[s2]
    assert then.name == "then" and [then.values[v].name for v in then.captures] == ["u"]
    assert then.nodes[0].attributes["alpha"] == reader.Attribute(S.ATTR_FLOAT, 0.5)
    assert other.captures == (0,) and other.outputs == (0,) and other.nodes == ()
    assert s1 > mi and s2 > mi


def test_float_attribute_is_f32():
    w, _, _ = _graph_artifact()
    g = w.graphs[0]
    name, op, ins, outs, attrs = g.nodes[1]
    g.nodes[1] = (name, op, ins, outs, tuple(("f", S.ATTR_FLOAT, 0.1) if a[0] == "f" else a for a in attrs))
    art = reader.load(w.to_bytes())
    assert art.graphs[0].nodes[1].attributes["f"].value == float(np.float32(0.1))


def test_unknown_attribute_kind_refused_by_writer():
    w, _, _ = _graph_artifact()
    w.graphs[0].add_node("bad", 0, [], [], [("z", 99, 0)])
    with pytest.raises(ValueError, match="unknown attribute kind 99"):
        w.to_bytes()


def test_writer_rejects_unsupported_dtype():
    with pytest.raises(ValueError, match="complex64"):
        ArtifactWriter().tensor(np.zeros(2, np.complex64))


def test_weight_bytes():
    art = reader.load(minimal_bytes())
    assert art.weight_bytes() == 24
