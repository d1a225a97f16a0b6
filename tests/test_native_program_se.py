"""A squeeze-excite block (Conv -> ReduceMean(2, 3) -> Conv -> Relu -> Conv -> gate -> Mul with the first
conv's output), the pattern that stopped MobileNetV3 / EfficientNet / RegNet-Y from replaying as native
programs: with fixed shapes every node is now one recordable native call (the squeeze on
mrt_plane_means_f32, the gate by the conv's epilogue or mrt_activation_f32, the per-channel Mul on
mrt_binary_rows_f32), so the run replays as one program, with onnxruntime's results."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

import minirt
from minirt.builder.build import build
from tests.native.conftest import requires_native

pytestmark = requires_native


def _se_model(gate: str, opset: int, tail: str | None, c: int = 16, hw: int = 12) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    r = c // 4
    init = {"w1": rng.standard_normal((c, 3, 3, 3)) * 0.3, "b1": rng.standard_normal(c) * 0.1,
            "w2": rng.standard_normal((r, c, 1, 1)) * 0.3, "b2": rng.standard_normal(r) * 0.1,
            "w3": rng.standard_normal((c, r, 1, 1)) * 0.3, "b3": rng.standard_normal(c) * 0.1}
    inits = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in init.items()]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1])]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([2, 3], np.int64), "axes"))
        nodes.append(h.make_node("ReduceMean", ["c1", "axes"], ["s"], keepdims=1))
    else:
        nodes.append(h.make_node("ReduceMean", ["c1"], ["s"], axes=[2, 3], keepdims=1))
    nodes += [h.make_node("Conv", ["s", "w2", "b2"], ["r1"]),
              h.make_node("Relu", ["r1"], ["r"]),
              h.make_node("Conv", ["r", "w3", "b3"], ["g1"]),
              h.make_node(gate, ["g1"], ["g"]),
              h.make_node("Mul", ["c1", "g"], ["y" if tail is None else "m"])]
    if tail is not None:
        nodes.append(h.make_node(tail, ["m"], ["y"]))
    graph = h.make_graph(nodes, "se_block", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, hw, hw])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, c, hw, hw])], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("gate", ["Sigmoid", "HardSigmoid"])
@pytest.mark.parametrize("opset", [14, 18])
@pytest.mark.parametrize("tail", [None, "HardSwish", "Sigmoid"])
@pytest.mark.parametrize("threads", [1, 2])
def test_se_block_replays_as_a_native_program(gate, opset, tail, threads):
    import onnxruntime as ort

    model = _se_model(gate, opset, tail)
    sess = minirt.Session(build(model, None).data, threads=threads)
    nodes = minirt.Session(build(model, None).data, threads=threads, native_program=False)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for _ in range(5):  # run 1 plans memory, run 2 records the program, the rest replay it
        x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, nodes.run(None, {"x": x})[0])
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    (plan,) = sess.memory_plans()
    assert re.fullmatch(r"\d+ native calls", plan["native_program"] or ""), plan


def test_int8_se_block_with_its_scale_folded_into_the_conv_replays(tmp_path, monkeypatch):
    """int8: the quantizer folds the excite Mul into the next conv (QConv's X_mul), whose input pass
    (scale per channel, quantize: mrt_quantize_add_up_u8_f32) is a recordable call too, so the block
    still replays as one program, bit for bit as node by node (EfficientNet-B0 int8: 1.31x -> 0.81x our
    float on an AVX-512 VNNI host, D83)."""
    from minirt import native

    model = _se_model("Sigmoid", 14, None, c=128, hw=16)
    rng = np.random.default_rng(6)
    w4 = numpy_helper.from_array((rng.standard_normal((128, 128, 1, 1)) * 0.1).astype(np.float32), "w4")
    w5 = numpy_helper.from_array((rng.standard_normal((8, 128, 1, 1)) * 0.1).astype(np.float32), "w5")
    model.graph.initializer.extend([w4, w5])
    # (the projection conv after the excite Mul, then a last layer: the quantizer keeps a final one float)
    model.graph.node.extend([h.make_node("Conv", ["y", "w4"], ["p"]), h.make_node("Relu", ["p"], ["pr"]),
                             h.make_node("Conv", ["pr", "w5"], ["out"])])
    model.graph.output[0].CopyFrom(h.make_tensor_value_info("out", TP.FLOAT, [1, 8, 16, 16]))
    for i in range(4):
        np.savez(tmp_path / f"{i}.npz", x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    data = build(model, None, quantize="int8", calibration=str(tmp_path)).data
    sess = minirt.Session(data, threads=1)
    nodes = minirt.Session(data, threads=1, native_program=False)
    calls = []
    real = native._call
    monkeypatch.setattr(native, "_call", lambda entry, args, *d: calls.append(entry.__name__) or real(entry, args, *d))
    for _ in range(4):  # run 1 plans memory, run 2 records the program, the rest replay it
        x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], nodes.run(None, {"x": x})[0])
    assert "mrt_quantize_add_up_u8_f32" in calls  # (the Mul was folded: the input pass ran)
    (plan,) = sess.memory_plans()
    assert re.fullmatch(r"\d+ native calls", plan["native_program"] or ""), plan
