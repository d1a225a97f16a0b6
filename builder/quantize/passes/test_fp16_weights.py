"""fp16_weights: large float32 weights stored float16 behind a DequantizeWeights; out-of-range ones refused."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.fp16_weights import FP16Weights
from minirt.builder.quantize.qir import QuantContext

X = {"x": Q.R.standard_normal((2, 64)).astype(np.float32)}


def _model(w):
    return Q.make_model([h.make_node("MatMul", ["x", "w"], ["y"])], [Q.vinfo("x", [2, 64])], [Q.vinfo("y", [2, 32])],
                        [Q.tensor("w", w)])


def test_converts_large_weights_once():
    m = T.load(_model(Q.weight(64, 32)))
    before = m.clone()
    p = FP16Weights(QuantContext(fp16_only={"w"}))
    assert p(m).modified and p.stats["initializers"] == 1
    assert Q.ops(m) == {"com.minirt::DequantizeWeights": 1, "MatMul": 1}
    Q.parity(before, m, X, atol=1e-2)
    assert not p(m).modified and p.stats["initializers"] == 1  # later sweeps: nothing, the counts kept


def test_out_of_range_and_small_weights_stay():
    m = T.load(_model(np.full((64, 32), 1e5, np.float32)))
    p = FP16Weights(QuantContext(fp16_only={"w"}))
    assert not p(m).modified and "float16's range" in p.refusals[0].reason
    m = T.load(_model(Q.weight(64, 32)))
    assert not FP16Weights(QuantContext(fp16_only={"w"}, fp16_min_elements=4096))(m).modified
    assert not FP16Weights(QuantContext(fp16_only=set()))(m).modified
    assert not FP16Weights()(Q.empty_model()).modified
