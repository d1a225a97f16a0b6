"""Tests for matmul_to_gemm: 2-D MatMul + constant bias becomes Gemm; batched or computed biases do not."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.matmul_to_gemm import MatMulAddToGemm

R = np.random.default_rng(4)


def _m(a_shape, bias_shape, out_shape):
    nodes = [h.make_node("MatMul", ["a", "w"], ["mm"]), h.make_node("Add", ["mm", "c"], ["y"])]
    inits = [T.tensor("w", R.standard_normal((5, 6)).astype(np.float32)), T.tensor("c", R.standard_normal(bias_shape).astype(np.float32))]
    return T.make_model(nodes, [T.vinfo("a", list(a_shape))], [T.vinfo("y", list(out_shape))], inits)


def test_matmul_add_to_gemm():
    for bias in [(6,), (1, 6), (3, 6), ()]:
        model = _m((3, 5), bias, (3, 6))
        m = T.load(model)
        assert MatMulAddToGemm()(m).modified
        assert T.ops(m) == {"Gemm": 1}
        T.run_both(model, {"a": R.standard_normal((3, 5)).astype(np.float32)}, disabled=["fuse_activation"])


def test_batched_matmul_not_gemm():
    model = _m((2, 3, 5), (6,), (2, 3, 6))
    m = T.load(model)
    p = MatMulAddToGemm()
    assert not p(m).modified and "2-D" in p.refusals[0].reason
    m, _, _ = T.run_both(model, {"a": R.standard_normal((2, 3, 5)).astype(np.float32)})
    assert T.ops(m) == {"com.minirt::FusedMatMul": 1}  # fuse_activation takes it as a residual


def test_bias_that_broadcasts_up_not_gemm():
    model = _m((1, 5), (4, 6), (4, 6))
    m = T.load(model)
    assert not MatMulAddToGemm()(m).modified
