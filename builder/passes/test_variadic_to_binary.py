"""Tests for variadic_to_binary: Sum becomes a left-to-right chain of Add (Max / Min of 3+ inputs
likewise), with the same bits as the Sum kernel; opset < 8 with differing shapes is left alone."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.variadic_to_binary import VariadicToBinary

R = np.random.default_rng(8)


def _m(op, shapes, out_shape, opset=17):
    names = [f"x{i}" for i in range(len(shapes))]
    return T.make_model([h.make_node(op, names, ["y"])], [T.vinfo(n, list(s)) for n, s in zip(names, shapes)],
                        [T.vinfo("y", list(out_shape))], opset=opset)


def _feeds(shapes):
    return {f"x{i}": R.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}


def test_sum_becomes_add_chain_same_bits():
    shapes = [(2, 3, 4), (3, 1), (2, 3, 4), (4,)]
    model = _m("Sum", shapes, (2, 3, 4))
    m = T.load(model)
    assert VariadicToBinary()(m).modified
    assert T.ops(m) == {"Add": 3}
    feeds = _feeds(shapes)
    want = T.run(T.load(model), feeds)[0]
    (got,) = T.run(m, feeds)
    np.testing.assert_array_equal(got, want)  # the kernel folds left to right too
    assert all(n.outputs[0].shape is not None for n in m.graph)  # intermediate shapes known


def test_two_input_sum_and_max_min_chains():
    for op, n_in, binary in (("Sum", 2, {"Add": 1}), ("Max", 3, {"Max": 2}), ("Min", 4, {"Min": 3})):
        shapes = [(5, 6)] * n_in
        model = _m(op, shapes, (5, 6))
        m = T.load(model)
        assert VariadicToBinary()(m).modified, op
        assert T.ops(m) == binary
        T.run_both(model, _feeds(shapes))


def test_left_alone():
    for op, shapes in (("Max", [(5, 6)] * 2), ("Sum", [(5, 6)])):  # already binary; one input
        m = T.load(_m(op, shapes, (5, 6)))
        assert not VariadicToBinary()(m).modified
    # opset 6: Sum's inputs must share a shape, Add-6 broadcasts only with its legacy attribute
    m = T.load(_m("Sum", [(5, 6), (5, 6)], (5, 6), opset=6))
    assert VariadicToBinary()(m).modified
    m = T.load(_m("Sum", [(5, 6), (6,)], (5, 6), opset=6))
    p = VariadicToBinary()
    assert not p(m).modified and "opset < 8" in p.refusals[0].reason


def test_residual_sum_fuses_into_conv():
    w = T.tensor("w", R.standard_normal((4, 4, 3, 3)).astype(np.float32))
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), h.make_node("Sum", ["c", "x"], ["s"]),
             h.make_node("Relu", ["s"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 6, 6])], [T.vinfo("y", [1, 4, 6, 6])], [w], opset=9)
    m, _, _ = T.run_both(model, {"x": R.standard_normal((1, 4, 6, 6)).astype(np.float32)})
    assert T.ops(m) == {"com.minirt::FusedConv": 1}
