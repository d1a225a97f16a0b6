"""quant_layers: the chosen candidates become QConv / QMatMul (static or dynamic) or int8-stored weights;
a candidate without a calibrated input range is refused and stays float."""
import dataclasses

import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.quantize.candidates import find_candidates
from minirt.builder.quantize.passes import testing as Q
from minirt.builder.quantize.passes.quantize_layers import QuantizeLayers
from minirt.builder.quantize.qir import QuantContext

X = {"x": Q.R.standard_normal((1, 2, 6, 6)).astype(np.float32)}


def _model():
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], name="conv"), h.make_node("Flatten", ["c"], ["f"]),
             h.make_node("Gemm", ["f", "g", "b"], ["y"], name="gemm", transB=1, alpha=0.5)]
    inits = [Q.tensor("w", Q.weight(3, 2, 3, 3)), Q.tensor("g", Q.weight(5, 48)), Q.tensor("b", Q.weight(5))]
    return Q.make_model(nodes, [Q.vinfo("x", [1, 2, 6, 6])], [Q.vinfo("y", [1, 5])], inits)


def _context(m, ranges="static", **changes):
    candidates, refused = find_candidates(m)
    assert not refused and [c.name for c in candidates] == ["conv", "gemm"]
    candidates = [dataclasses.replace(c, **changes) for c in candidates]
    if ranges == "static":
        ranges = {c.input: (-4.0, 4.0) for c in candidates}
    return QuantContext(selected=candidates, ranges=ranges)


def test_static_and_dynamic():
    for ranges in ("static", None):
        m = T.load(_model())
        before = m.clone()
        p = QuantizeLayers(_context(m, ranges))
        assert p(m).modified and not p.refusals
        assert Q.ops(m) == {"com.minirt::QConv": 1, "Flatten": 1, "com.minirt::QMatMul": 1}
        qconv = next(iter(m.graph))
        assert (qconv.inputs[1] is not None) == (ranges is not None)  # X_scale: static only
        assert "w" not in m.graph.initializers or m.graph.initializers["w"].uses() == ()
        y, y_ref = Q.run(m, X)[0], Q.run(before, X)[0]
        assert np.abs(y - y_ref).max() <= 0.05 * np.abs(y_ref).max()
        assert not p(m).modified  # later sweeps change nothing


def test_missing_range_is_refused_every_sweep():
    m = T.load(_model())
    context = _context(m)
    context.ranges.pop("x")
    p = QuantizeLayers(context)
    assert p(m).modified  # the Gemm
    assert Q.ops(m) == {"Conv": 1, "Flatten": 1, "com.minirt::QMatMul": 1}
    assert [(r.node, "no calibration range" in r.reason) for r in p.refusals] == [("conv", True)]
    p.refusals = []  # as the pass manager does before every sweep
    assert not p(m).modified and len(p.refusals) == 1 and p.skipped == [("conv", p.refusals[0].reason)]


def test_weight_only():
    m = T.load(_model())
    before = m.clone()
    assert QuantizeLayers(_context(m, None, weight_only=True))(m).modified
    assert Q.ops(m) == {"com.minirt::DequantizeWeights": 2, "Conv": 1, "Flatten": 1, "Gemm": 1}
    np.testing.assert_allclose(Q.run(m, X)[0], Q.run(before, X)[0], atol=0.05)


def test_nothing_selected_and_empty_graph():
    m = T.load(_model())
    assert not QuantizeLayers(QuantContext())(m).modified
    assert not QuantizeLayers()(Q.empty_model()).modified
