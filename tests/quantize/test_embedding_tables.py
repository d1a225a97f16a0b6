"""Embedding tables (a Gather of a constant float32 table's rows by run-time indices) are stored int8 by
row, weights-only, in int8 and int8-dynamic builds (docs/decisions.md D170): BERT's word embeddings were
31 MB of its 33 MB int8-dynamic file.  The rows computed from them stay within each row's own scale;
small tables, Gathers of activations and Gathers with constant indices are left alone."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt.builder import build
from minirt.format import reader

VOCAB, DIM, OUT = 500, 48, 16


def _model(vocab: int = VOCAB) -> onnx.ModelProto:
    """ids (2, 7) int64 -> Gather(table) -> MatMul -> y, plus a Gather of the product's rows (activations)
    and a small table looked up by the same ids.  Rows differ in scale by up to 1000x: one scale for the
    whole table would lose the small rows."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((vocab, DIM)) * (10.0 ** (np.arange(vocab) % 4 - 2))[:, None]).astype(np.float32)
    small = rng.standard_normal((4, DIM)).astype(np.float32)
    w = (rng.standard_normal((DIM, OUT)) * 0.2).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("Gather", ["small", "types"], ["t"], name="token_types"),
             helper.make_node("Add", ["e", "t"], ["s"]),
             helper.make_node("MatMul", ["s", "w"], ["p"], name="proj"),
             helper.make_node("Gather", ["p", "pick"], ["y"], name="rows", axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 7]),
                     helper.make_tensor_value_info("types", TensorProto.INT64, [2, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, OUT]),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 7, DIM])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(small, "small"),
         numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([0, 3, 6], np.int64), "pick")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feed(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, VOCAB, (2, 7)).astype(np.int64), "types": rng.integers(0, 4, (2, 7)).astype(np.int64)}


@pytest.mark.parametrize("mode", ["int8-dynamic", "int8"])
def test_embedding_table_stored_int8_by_row(tmp_path, mode):
    model = _model()
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    out = tmp_path / "m.mrt"
    calib = [_feed(s) for s in range(4)] if mode == "int8" else None
    report = build(str(src), str(out), quantize=mode, calibration=calib)
    q = report.quantization
    assert "embed" in q["weight_only"], q
    kept = {k["node"]: k["reason"] for k in q["kept_float"]}
    assert "embedding table of 192 values" in kept["token_types"]  # under EMBEDDING_MIN_ELEMENTS
    assert "rows" not in q["weight_only"] and "rows" not in kept  # a Gather of activations: not a layer
    art = reader.load(str(out))
    sized = [t.dtype for t in art.tensors if int(np.prod(t.dims)) == VOCAB * DIM]  # (ONNX codes: 1 float, 3 int8)
    assert sized == [3], f"the table is stored as dtype {sized}, not int8 only"
    assert out.stat().st_size < 0.5 * VOCAB * DIM * 4

    import onnxruntime as ort

    ref_sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = minirt.Session(str(out))
    for seed in (7, 8):
        feed = _feed(seed)
        (y_ref, e_ref), (y, e) = ref_sess.run(None, feed), sess.run(None, feed)
        # each looked-up row within its own scale (int8 by row): the 0.01-scale rows are not lost
        rel = np.abs(e - e_ref).max(axis=-1) / np.abs(e_ref).max(axis=-1)
        assert rel.max() < 0.005, rel.max()
        if mode == "int8-dynamic":  # (static int8 also quantizes the product's input, rows of 1000x scales)
            assert np.allclose(y, y_ref, rtol=0.03, atol=0.03 * np.abs(y_ref).max()), np.abs(y - y_ref).max()


def test_constant_indices_and_other_axes_are_not_embeddings():
    from minirt.builder.load import load_model
    from minirt.builder.quantize.candidates import find_candidates

    model = _model()
    for node in model.graph.node:
        if node.name == "embed":
            node.attribute.append(helper.make_attribute("axis", 1))
    m, _ = load_model(model)
    found, refused = find_candidates(m)
    assert [c.name for c in found if c.op_type == "Gather"] == ["token_types"] and not refused
