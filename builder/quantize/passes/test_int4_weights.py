"""int4_weights: MatMul / FusedMatMul / Gemm with a constant float weight become MatMulNBits; the 4-bit
blocks against their definition and onnxruntime's MatMulNBits kernel, the rewritten graph against float."""
import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from minirt.builder.passes import testing as T
from minirt.builder.quantize.passes.int4_weights import Int4Weights, quantize_blocks
from minirt.builder.quantize.qir import QuantContext
from minirt.kernels.decoder import dequantize_nbits

R = np.random.default_rng(40)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("K,block_size", [(64, 32), (100, 32), (256, 128), (48, 16)])
def test_blocks_round_to_the_nearest_level(symmetric, K, block_size):
    N = 9
    w = (R.standard_normal((K, N)) * 0.5 + (0 if symmetric else 0.3)).astype(np.float32)
    w[:block_size, 0] = 0.0  # an all-zero block: exact
    packed, scales, zp = quantize_blocks(w, block_size, symmetric)
    kb = -(-K // block_size)
    assert packed.shape == (N, kb, block_size // 2) and scales.shape == (N, kb)
    assert (zp is None) == symmetric and (zp is None or zp.shape == (N, -(-kb // 2)))
    back = dequantize_nbits(packed, scales, zp, K, N, 4, block_size)  # [N, K], checked against onnxruntime
    step = np.repeat(scales, block_size, axis=1)[:, :K]
    assert np.all(np.abs(back - w.T) <= step / 2 + 1e-6)  # the nearest of the 16 levels
    np.testing.assert_array_equal(back[0, :block_size], 0.0)


def _model(nodes, inits, k=64, n=96):
    return T.make_model(nodes, [T.vinfo("x", [2, 5, k])], [T.vinfo("y", [2, 5, n])], [T.tensor(a, v) for a, v in inits])


def test_rewrites_matmul_fused_matmul_and_gemm():
    k, n = 64, 96
    w1, w2 = R.standard_normal((k, n)).astype(np.float32), R.standard_normal((n, n)).astype(np.float32)
    b2 = R.standard_normal(n).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["m"]), h.make_node("MatMul", ["m", "w2"], ["m2"]),
             h.make_node("Add", ["m2", "b2"], ["a"]), h.make_node("Relu", ["a"], ["y"])]
    model, _ = T.optimized(_model(nodes, [("w1", w1), ("w2", w2), ("b2", b2)]))  # MatMul, FusedMatMul(bias, Relu)
    assert T.ops(model) == {"MatMul": 1, "com.minirt::FusedMatMul": 1}
    feeds = {"x": R.standard_normal((2, 5, k)).astype(np.float32)}
    ref = T.run(model, feeds)[0]
    p = Int4Weights(QuantContext(int4_min_elements=1024))
    assert p(model).modified
    assert T.ops(model) == {"com.microsoft::MatMulNBits": 2, "com.minirt::Activation": 1}
    assert p.converted == 2 and p.weight_bytes[1] < p.weight_bytes[0] / 5
    got = T.run(model, feeds)[0]
    cos = float((ref * got).sum() / np.linalg.norm(ref) / np.linalg.norm(got))
    assert cos > 0.99 and (got >= 0).all()  # (the Relu kept)
    assert not Int4Weights(QuantContext(int4_min_elements=1024))(model).modified  # (nothing left)


def test_gemm_with_transposed_weight_and_small_weights_stay():
    k, n = 64, 80
    wt = R.standard_normal((n, k)).astype(np.float32)  # [N, K]: transB
    c = R.standard_normal(n).astype(np.float32)
    small = R.standard_normal((n, 4)).astype(np.float32)
    nodes = [h.make_node("Gemm", ["x", "wt", "c"], ["g"], transB=1), h.make_node("MatMul", ["g", "small"], ["y"])]
    m = T.load(T.make_model(nodes, [T.vinfo("x", [3, k])], [T.vinfo("y", [3, 4])],
                            [T.tensor("wt", wt), T.tensor("c", c), T.tensor("small", small)]))
    feeds = {"x": R.standard_normal((3, k)).astype(np.float32)}
    ref = T.run(m, feeds)[0]
    p = Int4Weights(QuantContext(int4_min_elements=1024, int4_symmetric=False, int4_block_size=16))
    assert p(m).modified
    assert T.ops(m) == {"com.microsoft::MatMulNBits": 1, "MatMul": 1}  # (320 weights: below the threshold)
    assert [r.reason for r in p.refusals][:1] and "below the int4 threshold" in p.refusals[0].reason
    got = T.run(m, feeds)[0]
    np.testing.assert_allclose(got, ref, rtol=0.1, atol=0.15 * np.abs(ref).max())


def test_matmulnbits_of_these_blocks_matches_onnxruntime():
    # the pass's output format is onnxruntime's: its MatMulNBits kernel on the same bytes gives minirt's result
    ort = pytest.importorskip("onnxruntime")
    import minirt
    from minirt.builder import build

    K, N, bs = 96, 40, 32
    w = R.standard_normal((K, N)).astype(np.float32)
    for symmetric in (True, False):
        packed, scales, zp = quantize_blocks(w, bs, symmetric)
        ins = ["x", "B", "s"] + ([] if zp is None else ["zp"])
        inits = [nh.from_array(packed, "B"), nh.from_array(scales, "s")] + ([] if zp is None else [nh.from_array(zp, "zp")])
        node = h.make_node("MatMulNBits", ins, ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=bs,
                           accuracy_level=4)
        g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [3, K])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [3, N])], inits)
        model = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
        x = R.standard_normal((3, K)).astype(np.float32)
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = minirt.Session(build(model.SerializeToString(), None).data).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_empty_graph():
    assert not Int4Weights(QuantContext())(T.load(T.make_model([], [T.vinfo("x", [1])], [T.vinfo("x", [1])]))).modified
