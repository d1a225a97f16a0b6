"""int8-dynamic MatMul in one native call (docs/decisions.md D89): the kernel derives the input's
scale and zero point itself (x_scale 0), bit for bit as the numpy rule does, so a transformer built
``--quantize int8-dynamic`` replays as a native program; a per-column residual is the bias; and a
layer that other layers follow is not "final" (kept float) because a skip connection bypasses them."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minirt
from minirt import native
from minirt.builder.build import build
from minirt.builder.quantize.candidates import find_candidates
from minirt.kernels.qlinear import _dynamic_quant
from tests.quantize.test_cost_model import _optimized

RNG = np.random.default_rng(9)

pytestmark = pytest.mark.skipif(not native.available, reason="the native kernels are not built")


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("shift", [0.0, 3.0, -3.0])  # ranges across zero, all positive, all negative
def test_the_kernel_derives_the_numpy_parameters(rows, shift):
    k, n = 40, 24
    w = RNG.integers(-127, 128, (n, k), dtype=np.int8)
    ws = (RNG.random(n) * 0.01 + 0.001).astype(np.float32)
    packed = native.qpack(w)
    a = (RNG.standard_normal((rows, k)) + shift).astype(np.float32)
    dynamic, static = np.empty((rows, n), np.float32), np.empty((rows, n), np.float32)
    native.qmatmul_call(native.qmatmul_prepare(rows, k, 0.0, 0, packed, n, ws, None), a, dynamic)
    # the numpy rule (uint8), then the same kernel with those as constants
    sc, zp, scale = _dynamic_quant(a, ws)
    native.qmatmul_call(native.qmatmul_prepare(rows, k, sc, zp, packed, n, scale, None), a, static)
    np.testing.assert_array_equal(dynamic, static)
    zero = np.zeros((rows, k), np.float32)  # a range of 0: scale 1, zero point 0, products 0
    native.qmatmul_call(native.qmatmul_prepare(rows, k, 0.0, 0, packed, n, ws, None), zero, dynamic)
    assert not dynamic.any()


def _residual_mlp(d: int = 32, skip: bool = True) -> bytes:
    """x -> MatMul + bias -> Relu -> MatMul + bias [-> + x (``skip``)] -> MatMul + bias -> y."""
    inits, nodes, cur = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((RNG.standard_normal((d, d)) * 0.2).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((RNG.standard_normal(d) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("MatMul", [cur, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"l{i}"], name=f"bias{i}")]
        cur = f"l{i}"
        if i == 0:
            nodes.append(helper.make_node("Relu", [cur], ["r0"], name="relu0"))
            cur = "r0"
        if i == 1:
            nodes.append(helper.make_node("Add", [cur, "x"], ["skip"], name="skip") if skip
                         else helper.make_node("Relu", [cur], ["skip"], name="relu1"))
            cur = "skip"
    nodes.append(helper.make_node("Identity", [cur], ["y"], name="out"))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, d]),
                               helper.make_tensor_value_info("skip", TensorProto.FLOAT, [16, d])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_an_int8_dynamic_mlp_replays_natively_with_fresh_scales():
    """(Without the skip: a QMatMul with a residual of its output's shape still adds it in numpy, and
    is not replayed.)"""
    data = build(_residual_mlp(skip=False), None, quantize="int8-dynamic", accuracy_budget="none").data
    sess = minirt.Session(data, threads=1)
    nodes = minirt.Session(data, threads=1, native_program=False)
    for i in range(5):  # new ranges on every run: a replay that kept the first scales would differ
        x = (RNG.standard_normal((16, 32)) * (i + 1) + i).astype(np.float32)
        for got, want in zip(sess.run(None, {"x": x}), nodes.run(None, {"x": x})):
            np.testing.assert_array_equal(got, want)
    (plan,) = sess.memory_plans()
    assert plan["native_program"].endswith("native calls"), plan["native_program"]


def test_a_layer_that_others_follow_is_not_final():
    """mm1's output reaches the output "skip" with no layer on the way, but mm2 follows it: only mm2,
    which nothing follows, is final."""
    model = _optimized(_residual_mlp())
    candidates, _ = find_candidates(model)
    final = {c.name for c in candidates if c.final}
    assert len(candidates) == 3 and len(final) == 1
    last = [n.name for n in model.graph if n.name in {c.name for c in candidates}][-1]
    assert final == {last}


def _dense(bias_shape: tuple, rows: int = 4, k: int = 24, n: int = 10) -> bytes:
    """x (rows, k) -> Tanh -> MatMul -> Add (a constant bias of ``bias_shape``, n values) -> y: magika's last
    Dense, whose bias is (1, n)."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((k, n)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(n) * 0.5).astype(np.float32).reshape(bias_shape)
    graph = helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("MatMul", ["t", "w"], ["m"], name="mm"),
         helper.make_node("Add", ["m", "b"], ["y"])], "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1] * (len(bias_shape) - 2) + [rows, n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def test_a_bias_of_one_row_is_the_native_calls_bias():
    """A final Dense whose bias is (1, n) (a Gemm's C) runs as the one native call a (n,) bias gives, and
    replays (it did not: the numpy path, and magika's int8-dynamic build ran node by node); a (1, 1, n)
    bias over a 2-D input keeps numpy's broadcast to 3-D."""
    x = np.random.default_rng(8).standard_normal((4, 24)).astype(np.float32)
    want = minirt.Session(build(_dense((10,)), None, quantize="int8-dynamic").data, threads=1).run(None, {"x": x})[0]
    sess = minirt.Session(build(_dense((1, 10)), None, quantize="int8-dynamic").data, threads=1)
    for _ in range(3):
        got = sess.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
    if native.available:
        assert sess.native_program_status().startswith("yes"), sess.native_program_status()
    got = minirt.Session(build(_dense((1, 1, 10)), None, quantize="int8-dynamic").data).run(None, {"x": x})[0]
    assert got.shape == (1, 4, 10)
    np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=1e-6)
