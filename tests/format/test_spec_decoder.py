"""An independent .mrt decoder written only from docs/format.md.

The decoder below uses nothing but ``struct`` and ``zlib``: it does not
import ``minirt.format`` or ``builder.writer``, and every constant in it is
copied from the specification.  The tests check that it recovers the same
graphs, metadata and tensor bytes as the reference reader
(``minirt.format.reader.load``) on real artifacts, which shows the document is
sufficient to implement a reader.
"""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest

# ============================ the decoder (spec only) ============================

MAGIC = b"MINIRT\x00\x1a"
SUPPORTED_VERSION = 2
KINDS = {1: "metadata", 2: "operators", 3: "graphs", 4: "tensors", 5: "tensor_data", 6: "provider_blob"}
REQUIRED = (1, 2, 3, 4, 5)
FLAG_OPTIONAL = 1
FLAG_DEFLATE = 2
COMPRESSIBLE = (1, 2, 3, 4, 7)
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8}
STRING = 8
MAX_RANK = 64
MAX_BYTES = 1 << 24


class SpecError(Exception):
    pass


class Cur:
    def __init__(self, buf: bytes, name: str):
        self.b, self.p, self.name = buf, 0, name

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.p + size > len(self.b):
            raise SpecError(f"{self.name}: truncated at {self.p}")
        (v,) = struct.unpack_from(fmt, self.b, self.p)
        self.p += size
        return v

    u8 = lambda self: self.take("<B")  # noqa: E731
    u32 = lambda self: self.take("<I")  # noqa: E731
    i32 = lambda self: self.take("<i")  # noqa: E731
    i64 = lambda self: self.take("<q")  # noqa: E731
    u64 = lambda self: self.take("<Q")  # noqa: E731
    f32 = lambda self: self.take("<f")  # noqa: E731
    f64 = lambda self: self.take("<d")  # noqa: E731

    def count(self, min_size: int) -> int:
        n = self.u32()
        if n * min_size > len(self.b) - self.p:
            raise SpecError(f"{self.name}: count {n} too large")
        return n

    def bytes_(self) -> bytes:
        n = self.u32()
        if n > MAX_BYTES or self.p + n > len(self.b):
            raise SpecError(f"{self.name}: bad byte string length {n}")
        out = self.b[self.p : self.p + n]
        self.p += n
        return out

    def str_(self) -> str:
        return self.bytes_().decode("utf-8")  # strict

    def end(self) -> None:
        if self.p != len(self.b):
            raise SpecError(f"{self.name}: {len(self.b) - self.p} trailing bytes")


def decode(buf: bytes) -> dict:
    # --- header (docs/format.md "Header", rules 1-7)
    if len(buf) < 64:
        raise SpecError("shorter than the header")
    magic, version, hsize, count, esize, toff, fsize, _flags, hcrc = struct.unpack_from("<8sIIIIQQII", buf, 0)
    if magic != MAGIC:
        raise SpecError("bad magic")
    if version > SUPPORTED_VERSION or version == 0:
        raise SpecError(f"file version {version}, reader version {SUPPORTED_VERSION}")
    if fsize != len(buf) or hsize < 64 or esize < 32:
        raise SpecError("bad sizes")
    tend = toff + count * esize
    if count > 4096 or toff < hsize or tend > len(buf):
        raise SpecError("bad section table")
    if zlib.crc32(buf[toff:tend], zlib.crc32(buf[0:44])) != hcrc:
        raise SpecError("header crc")
    # --- section table (rules 8-12)
    sections = []
    for i in range(count):
        kind, flags, off, length, crc, inflated = struct.unpack_from("<IIQQII", buf, toff + i * esize)
        if off % 64 or off < tend or off + length > len(buf):
            raise SpecError(f"section {i} misplaced")
        if zlib.crc32(buf[off : off + length]) != crc:
            raise SpecError(f"section {i} crc")
        if flags & FLAG_DEFLATE and (version < 2 or (kind in KINDS and kind not in COMPRESSIBLE)
                                     or not 0 < inflated <= 1 << 30):
            raise SpecError(f"section {i} compressed where it may not be")
        sections.append((kind, flags, off, length, inflated))
    spans = sorted((off, off + length) for _, _, off, length, _ in sections)
    if any(a_end > b_off for (_, a_end), (b_off, _) in zip(spans, spans[1:])):
        raise SpecError("overlap")
    body: dict[int, bytes] = {}
    blobs = []
    for kind, flags, off, length, inflated in sections:
        payload = buf[off : off + length]
        if flags & FLAG_DEFLATE:  # a zlib stream of exactly `inflated` bytes
            d = zlib.decompressobj()
            payload = d.decompress(payload, inflated + 1)
            if len(payload) != inflated or not d.eof or d.unused_data:
                raise SpecError(f"section of kind {kind}: bad zlib stream")
        if kind == 6:
            blobs.append(payload)
        elif kind in KINDS:
            if kind in body:
                raise SpecError("duplicate")
            body[kind] = payload
        elif not flags & FLAG_OPTIONAL:
            raise SpecError(f"unknown required kind {kind}")
    if any(k not in body for k in REQUIRED):
        raise SpecError("missing section")

    # --- metadata
    c = Cur(body[1], "metadata")
    metadata = {}
    for _ in range(c.count(6)):
        key, t = c.str_(), c.u8()
        metadata[key] = {1: c.i64, 2: c.f64, 3: c.str_, 4: lambda: c.u8() != 0, 5: lambda: ("json", c.str_())}[t]()
    c.end()

    # --- operators
    c = Cur(body[2], "operators")
    opsets = {}
    for _ in range(c.count(12)):
        d = c.str_()
        opsets[d] = c.i64()
    operators = []
    for _ in range(c.count(12)):
        operators.append((c.str_(), c.str_(), c.i64()))
    c.end()

    # --- tensors + tensor data
    data = body[5]
    c = Cur(body[4], "tensors")
    tensors = []
    for _ in range(c.count(24)):
        dtype, rank = c.u32(), c.u32()
        if rank > MAX_RANK:
            raise SpecError("rank")
        dims = tuple(c.i64() for _ in range(rank))
        off, nbytes = c.u64(), c.u64()
        if off % 64 or off + nbytes > len(data) or any(d < 0 for d in dims):
            raise SpecError("tensor placement")
        n = 1
        for d in dims:
            n *= d
        raw = data[off : off + nbytes]
        if dtype == STRING:
            sc = Cur(raw, "string tensor")
            value = [sc.str_() for _ in range(n)]
            sc.end()
        else:
            if nbytes != n * ITEMSIZE[dtype]:
                raise SpecError("nbytes")
            value = raw
        tensors.append({"dtype": dtype, "dims": dims, "offset": off, "value": value})
    c.end()

    # --- graphs
    c = Cur(body[3], "graphs")
    n_graphs = c.count(28)
    if n_graphs == 0:
        raise SpecError("no graph")
    graphs = []
    for gi in range(n_graphs):
        g = {"name": c.str_(), "values": []}
        for _ in range(c.count(13)):
            name, dtype, rank = c.str_(), c.u32(), c.i32()
            if rank == -1:
                shape = None
            else:
                shape = []
                for _ in range(rank):
                    kind = c.u8()
                    shape.append(c.i64() if kind == 0 else c.str_() if kind == 1 else None)
                shape = tuple(shape)
            value_kind = c.u8()
            if value_kind > 7:  # (0-3 tensors, sequences, optionals; 4-7 maps, revision 1.4)
                raise SpecError(f"unknown value kind {value_kind}")
            g["values"].append((name, dtype, shape, value_kind))
        nv = len(g["values"])

        def idx(limit, absent=False):
            v = c.i32()
            if not (0 <= v < limit or (absent and v == -1)):
                raise SpecError("index")
            return v

        g["inputs"] = [idx(nv) for _ in range(c.count(4))]
        g["outputs"] = [idx(nv) for _ in range(c.count(4))]
        g["initializers"] = [(idx(nv), idx(len(tensors))) for _ in range(c.count(8))]
        g["captures"] = [idx(nv) for _ in range(c.count(4))]
        g["nodes"] = []
        for _ in range(c.count(16)):
            node = {"name": c.str_(), "op": idx(len(operators))}
            node["inputs"] = [idx(nv, True) for _ in range(c.count(4))]
            node["outputs"] = [idx(nv, True) for _ in range(c.count(4))]
            attrs = {}
            for _ in range(c.count(5)):
                aname, t = c.str_(), c.u8()
                if t == 1:
                    v = c.f32()
                elif t == 2:
                    v = c.i64()
                elif t == 3:
                    v = c.bytes_()
                elif t in (4, 5):
                    v = c.u32()
                elif t == 6:
                    v = tuple(c.f32() for _ in range(c.count(4)))
                elif t == 7:
                    v = tuple(c.i64() for _ in range(c.count(8)))
                elif t == 8:
                    v = tuple(c.bytes_() for _ in range(c.count(4)))
                elif t in (9, 10):
                    v = tuple(c.u32() for _ in range(c.count(4)))
                else:
                    raise SpecError(f"attribute type {t}")
                refs = (v,) if t == 5 else v if t == 10 else ()
                if any(not gi < r < n_graphs for r in refs):
                    raise SpecError("subgraph order")
                if t in (4, 9) and any(r >= len(tensors) for r in ((v,) if t == 4 else v)):
                    raise SpecError("tensor ref")
                attrs[aname] = (t, v)
            node["attributes"] = attrs
            g["nodes"].append(node)
        # data flow (rule 22)
        defined = set(g["inputs"])
        for v, _ in g["initializers"]:
            defined.add(v)
        for v in g["captures"]:
            if v in defined:
                raise SpecError("defined twice")
            defined.add(v)
        for node in g["nodes"]:
            if any(v != -1 and v not in defined for v in node["inputs"]):
                raise SpecError("use before definition")
            for v in node["outputs"]:
                if v != -1:
                    if v in defined:
                        raise SpecError("defined twice")
                    defined.add(v)
        if any(v not in defined for v in g["outputs"]):
            raise SpecError("undefined output")
        graphs.append(g)
    c.end()
    return {"version": version, "metadata": metadata, "opsets": opsets, "operators": operators,
            "tensors": tensors, "graphs": graphs, "blobs": blobs}


# ============================ comparison with the reference reader ============================

NP = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?", 10: "<f2", 11: "<f8", 12: "<u4", 13: "<u8"}


def _assert_same(buf: bytes) -> dict:
    from minirt.format import reader  # the reference, only for comparison

    mine = decode(buf)
    ref = reader.load(buf)
    assert mine["version"] == ref.format_version
    meta = {k: json.loads(v[1]) if isinstance(v, tuple) else v for k, v in mine["metadata"].items()}
    assert meta == ref.metadata
    assert mine["opsets"] == ref.opsets
    assert mine["operators"] == [(o.domain, o.op_type, o.opset) for o in ref.operators]
    assert len(mine["tensors"]) == len(ref.tensors)
    for i, (t, rec) in enumerate(zip(mine["tensors"], ref.tensors)):
        assert (t["dtype"], t["dims"], t["offset"]) == (rec.dtype, rec.dims, rec.offset)
        if t["dtype"] == STRING:
            assert t["value"] == ref.tensor(i).reshape(-1).tolist()
        else:
            arr = np.frombuffer(t["value"], dtype=NP[t["dtype"]]).reshape(t["dims"])
            np.testing.assert_array_equal(arr, ref.tensor(i))
    assert len(mine["graphs"]) == len(ref.graphs)
    for g, rg in zip(mine["graphs"], ref.graphs):
        assert g["name"] == rg.name
        assert [(n, d, s, k) for n, d, s, k in g["values"]] == [(v.name, v.dtype, v.shape, v.kind) for v in rg.values]
        assert tuple(g["inputs"]) == rg.inputs and tuple(g["outputs"]) == rg.outputs
        assert tuple(g["initializers"]) == rg.initializers and tuple(g["captures"]) == rg.captures
        assert len(g["nodes"]) == len(rg.nodes)
        for n, rn in zip(g["nodes"], rg.nodes):
            assert n["name"] == rn.name
            assert mine["operators"][n["op"]][1] == ref.operators[rn.op_index].op_type
            assert tuple(n["inputs"]) == rn.inputs and tuple(n["outputs"]) == rn.outputs
            assert {k: v for k, v in n["attributes"].items()} == {k: (a.kind, a.value) for k, a in rn.attributes.items()}
    return mine


def _onnx_models():
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    x = h.make_tensor_value_info("x", TP.FLOAT, ["N", 2])
    y = h.make_tensor_value_info("y", TP.FLOAT, ["N", 2])
    b = nh.from_array(np.array([1, 2], np.float32), "b")
    tiny = h.make_model(
        h.make_graph([h.make_node("Add", ["x", "b"], ["s"]), h.make_node("Relu", ["s"], ["y"])], "tiny", [x], [y], [b]),
        opset_imports=[h.make_opsetid("", 17)],
    )
    w = nh.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "w")
    shape = nh.from_array(np.array([3, -1], np.int64), "shape")
    mlp = h.make_model(
        h.make_graph(
            [
                h.make_node("MatMul", ["x", "w"], ["m"]),
                h.make_node("Reshape", ["m", "shape"], ["r"]),
                h.make_node("Concat", ["r", "r"], ["y"], axis=0),
            ],
            "mlp",
            [h.make_tensor_value_info("x", TP.FLOAT, [2, 2])],
            [h.make_tensor_value_info("y", TP.FLOAT, [6, 2])],
            [w, shape],
        ),
        opset_imports=[h.make_opsetid("", 17)],
    )
    onnx.checker.check_model(mlp)
    return {"tiny": tiny, "mlp": mlp}


@pytest.mark.parametrize("name", ["tiny", "mlp"])
def test_spec_decoder_matches_reader_on_built_models(name):
    from minirt import builder

    data = builder.build_bytes(_onnx_models()[name])
    mine = _assert_same(data)
    assert mine["metadata"]["producer.name"] == "minirt-builder"


def test_spec_decoder_node_op_types_and_names():
    from minirt import builder

    mine = _assert_same(builder.build_bytes(_onnx_models()["tiny"]))
    g = mine["graphs"][0]
    assert [mine["operators"][n["op"]][1] for n in g["nodes"]] == ["Add", "Relu"]
    assert [v[0] for v in g["values"]] == ["x", "b", "s", "y"]
    (v, t), = g["initializers"]
    assert g["values"][v][0] == "b"
    assert np.frombuffer(mine["tensors"][t]["value"], "<f4").tolist() == [1.0, 2.0]


def test_spec_decoder_every_attribute_type_and_subgraphs():
    from tests.format.test_roundtrip import _graph_artifact

    w, _, _ = _graph_artifact()
    w.provider_blobs.append(b"blob")
    for code, dt in NP.items():
        w.tensor(np.zeros((2, 1), dtype=dt))
    mine = _assert_same(w.to_bytes())
    assert mine["blobs"] == [b"blob"]
    assert [g["name"] for g in mine["graphs"]] == ["main", "then", "else", "third"]


def test_spec_decoder_on_if_model_with_captures():
    from tests.test_session import if_model, lower_bytes  # onnx.helper model with nested captures

    mine = _assert_same(lower_bytes(if_model()))
    assert len(mine["graphs"]) >= 3


def test_spec_decoder_refuses_what_the_reader_refuses():
    from minirt import builder

    data = bytearray(builder.build_bytes(_onnx_models()["tiny"]))
    data[-1] ^= 1  # padding after the last section: covered by no CRC (docs/format.md)
    decode(bytes(data))
    count, _, toff = struct.unpack_from("<IIQ", data, 16)
    off = struct.unpack_from("<Q", data, toff + (count - 1) * 32 + 8)[0]
    data[off] ^= 1
    with pytest.raises(SpecError, match="crc"):
        decode(bytes(data))
    data = bytearray(builder.build_bytes(_onnx_models()["tiny"]))
    struct.pack_into("<I", data, 8, 3)
    with pytest.raises(SpecError, match="file version 3, reader version 2"):
        decode(bytes(data))


def test_spec_decoder_on_compressed_sections():
    """A model whose graph and tensor table pass COMPRESS_MIN_BYTES: format version 2, those sections
    stored as zlib streams, decoded from the document alone."""
    from minirt import builder

    data = builder.build_bytes(_chain_model(200))
    version = struct.unpack_from("<I", data, 8)[0]
    count, _, toff = struct.unpack_from("<IIQ", data, 16)
    flags = {struct.unpack_from("<I", data, toff + 32 * i)[0]: struct.unpack_from("<I", data, toff + 32 * i + 4)[0]
             for i in range(count)}
    assert version == 2 and flags[3] & FLAG_DEFLATE and not flags[5] & FLAG_DEFLATE
    mine = _assert_same(data)
    assert len(mine["graphs"][0]["nodes"]) == 200


def _chain_model(n: int):
    """n Relu / Neg nodes in a chain: a graph section of a few tens of KB."""
    from onnx import TensorProto as TP
    from onnx import helper as h

    nodes = [h.make_node("Relu" if i % 2 else "Neg", [f"t{i}"], [f"t{i + 1}"], name=f"node_{i}") for i in range(n)]
    return h.make_model(h.make_graph(nodes, "chain", [h.make_tensor_value_info("t0", TP.FLOAT, [1, 8])],
                                     [h.make_tensor_value_info(f"t{n}", TP.FLOAT, [1, 8])]),
                        opset_imports=[h.make_opsetid("", 17)])


def test_decoder_does_not_use_the_reference_modules():
    import ast
    import pathlib

    tree = ast.parse(pathlib.Path(__file__).read_text())
    top_imports = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_imports |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_imports.add(node.module)
    assert top_imports <= {"__future__", "json", "struct", "zlib", "numpy", "pytest"}
    src = pathlib.Path(__file__).read_text().split("# ============================ comparison")[0]
    assert "minirt" not in src.split('"""', 2)[2] and "builder" not in src.split('"""', 2)[2]
