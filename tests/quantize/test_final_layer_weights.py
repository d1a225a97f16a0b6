"""A final layer kept float for accuracy stores its weights int8 (weights-only), as the layers kept float
for speed do (docs/decisions.md, D127): the layer computes in float32 from its dequantized weights, the
artifact holds one byte per weight, and each output column keeps its own scale whatever the layout of W
(Gemm with and without transB, MatMul)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt.builder import build
from minirt.format import reader

IN, HID, OUT = 64, 96, 40


def _model(final: str) -> onnx.ModelProto:
    """x (4, 64) -> Gemm 64 -> 96 -> Relu -> final layer 96 -> 40 -> y.  The final weight's output
    columns differ in scale by up to 1000x: a weight quantized along the wrong axis (one scale for
    columns of very different sizes) would lose the small columns."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((HID, IN)) * 0.2).astype(np.float32)
    col_scale = (10.0 ** (np.arange(OUT) % 4 - 1)).astype(np.float32)  # 0.1, 1, 10, 100, ...
    w2 = (rng.standard_normal((HID, OUT)) * col_scale).astype(np.float32)  # (K, N)
    b2 = (rng.standard_normal(OUT) * 0.1).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["h"], name="hidden", transB=1),
             helper.make_node("Relu", ["h"], ["r"], name="relu")]
    if final == "gemm_transB":
        inits = [numpy_helper.from_array(np.ascontiguousarray(w2.T), "w2"), numpy_helper.from_array(b2, "b2")]
        nodes.append(helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="final", transB=1))
    elif final == "gemm":
        inits = [numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(b2, "b2")]
        nodes.append(helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="final"))
    else:
        inits = [numpy_helper.from_array(w2, "w2")]
        nodes.append(helper.make_node("MatMul", ["r", "w2"], ["y"], name="final"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, OUT])],
                              [numpy_helper.from_array(w1, "w1"), *inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("final", ["gemm_transB", "gemm", "matmul"])
def test_final_layer_is_float_with_int8_weights(tmp_path, final):
    model = _model(final)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((4, IN)).astype(np.float32)} for _ in range(4)]
    out = tmp_path / "m.mrt"
    report = build(str(path), str(out), quantize="int8", calibration=calib, quantize_final=False)

    q = report.quantization
    kept = {k["node"]: k["reason"] for k in q["kept_float"]}
    assert "final" in kept and "weights stored int8 (weights-only)" in kept["final"]
    assert "final" in q["weight_only"] and "final" not in q["quantized"]
    art = reader.load(str(out))
    assert [op.op_type for op in art.operators].count("DequantizeWeights") == 1
    sized = [t.dtype for t in art.tensors if int(np.prod(t.dims)) == HID * OUT]  # (ONNX codes: 1 float, 3 int8)
    assert sized == [3], f"the final layer's weights are stored as dtype {sized}, not int8 only"

    x = rng.standard_normal((4, IN)).astype(np.float32)
    import onnxruntime as ort

    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = minirt.Session(str(out)).run(None, {"x": x})[0]
    # each output column within its own scale: int8 per-column weights (and the int8 hidden layer) keep the
    # relative error of every column small, the 0.1-scale columns included
    rel = np.abs(got - ref).max(axis=0) / np.abs(ref).max(axis=0)
    assert rel.max() < 0.05, rel


def test_quantize_final_computes_the_final_layer_in_int8(tmp_path):
    model = _model("gemm_transB")
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((4, IN)).astype(np.float32)} for _ in range(4)]
    report = build(str(path), str(tmp_path / "m.mrt"), quantize="int8", calibration=calib, quantize_final=True)
    assert "final" in report.quantization["quantized"] and "final" not in report.quantization["weight_only"]
