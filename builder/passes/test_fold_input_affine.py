"""Tests for fold_input_affine: a scalar Mul/Add map folds into the 1x1 Conv / Gemm reading it; near misses do not."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.fold_input_affine import FoldInputAffine

R = np.random.default_rng(7)


def _f32(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


def _lab_model(reader_kernel=1, group=1, bias=True, mul=True, add=True, pads=0, readers=1, output_map=False):
    """x -> 3x3 conv -> HardSwish -> [Mul s] -> [Add t] -> `readers` convs (kernel `reader_kernel`)."""
    nodes = [h.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), h.make_node("HardSwish", ["c0"], ["a"])]
    inits = [T.tensor("w0", _f32(8, 4, 3, 3)), T.tensor("s", np.array([1.7], np.float32)),
             T.tensor("t", np.array(0.3, np.float32))]
    cur = "a"
    if mul:
        nodes.append(h.make_node("Mul", [cur, "s"], ["m"]))
        cur = "m"
    if add:
        nodes.append(h.make_node("Add", ["t", cur], ["lab"]))  # the constant first: either side folds
        cur = "lab"
    outs = []
    k = reader_kernel
    for i in range(readers):
        ins = [cur, f"w{i + 1}"] + ([f"b{i + 1}"] if bias else [])
        nodes.append(h.make_node("Conv", ins, [f"y{i}"], group=group, pads=[pads] * 4))
        inits.append(T.tensor(f"w{i + 1}", _f32(6, 8 // group, k, k)))
        if bias:
            inits.append(T.tensor(f"b{i + 1}", _f32(6)))
        side = 6 + 2 * pads - k + 1
        outs.append(T.vinfo(f"y{i}", [2, 6, side, side]))
    if output_map:
        outs.append(T.vinfo(cur, [2, 8, 6, 6]))
    return T.make_model(nodes, [T.vinfo("x", [2, 4, 6, 6])], outs, inits)


X = {"x": _f32(2, 4, 6, 6, lo=-3, hi=3)}


def test_mul_add_fold_into_pointwise_conv():
    for group in (1, 2):
        for bias in (True, False):
            m, _, _ = T.run_both(_lab_model(group=group, bias=bias), X)
            ops = T.ops(m)
            assert "Mul" not in ops and "Add" not in ops, ops


def test_mul_alone_and_add_alone_fold():
    for mul, add in ((True, False), (False, True)):
        m, _, _ = T.run_both(_lab_model(mul=mul, add=add), X)
        ops = T.ops(m)
        assert "Mul" not in ops and "Add" not in ops, ops


def test_every_reader_gets_its_own_folded_weights():
    m, _, _ = T.run_both(_lab_model(readers=2), X)
    ops = T.ops(m)
    assert "Mul" not in ops and "Add" not in ops, ops


def test_padded_or_larger_kernel_reader_keeps_the_map():
    # A padded window reads zeros where the unfolded conv reads the shift: refused with the reason.
    for kernel, pads in ((3, 1), (1, 1), (3, 0)):
        model = _lab_model(reader_kernel=kernel, pads=pads)
        m = T.load(model)
        p = FoldInputAffine()
        assert not p(m).modified
        assert p.refusals and ("1x1" in p.refusals[0].reason or "pads" in p.refusals[0].reason), p.refusals
        m, _, _ = T.run_both(model, X)
        ops = T.ops(m)
        assert ops["Mul"] == 1 and ops["Add"] == 1, ops


def test_map_that_is_a_graph_output_or_has_another_reader_stays():
    m, _, _ = T.run_both(_lab_model(output_map=True), X)
    assert T.ops(m)["Add"] == 1
    # one reader a pointwise conv, the other not a conv: nothing folds (the map is still needed)
    model = _lab_model()
    model.graph.node.append(h.make_node("Relu", ["lab"], ["r"]))
    model.graph.output.append(T.vinfo("r", [2, 8, 6, 6]))
    m, _, _ = T.run_both(model, X)
    assert T.ops(m)["Add"] == 1


def test_per_channel_constant_is_not_this_pattern():
    model = _lab_model(add=False)
    for init in model.graph.initializer:
        if init.name == "s":
            init.CopyFrom(T.tensor("s", _f32(1, 8, 1, 1, lo=0.5, hi=2)))
    m, _, _ = T.run_both(model, X)
    assert T.ops(m)["Mul"] == 1


def _gemm_model(trans_b, alpha, beta, bias_shape):
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Mul", ["r", "s"], ["m"]),
             h.make_node("Add", ["m", "t"], ["lab"])]
    ins = ["lab", "w"] + (["c"] if bias_shape is not None else [])
    nodes.append(h.make_node("Gemm", ins, ["y"], transB=trans_b, alpha=alpha, beta=beta))
    inits = [T.tensor("s", np.array([0.6], np.float32)), T.tensor("t", np.array([[-0.4]], np.float32)),
             T.tensor("w", _f32(*((5, 7) if trans_b else (7, 5))))]
    if bias_shape is not None:
        inits.append(T.tensor("c", _f32(*bias_shape)))
    return T.make_model(nodes, [T.vinfo("x", [3, 7])], [T.vinfo("y", [3, 5])], inits)


def test_gemm_reader_folds_with_alpha_beta_and_every_bias_shape():
    x = {"x": _f32(3, 7, lo=-2, hi=2)}
    for trans_b in (0, 1):
        for alpha, beta in ((1.0, 1.0), (0.5, 2.0)):
            for bias_shape in (None, (5,), (1, 5), (3, 5), ()):
                m, _, _ = T.run_both(_gemm_model(trans_b, alpha, beta, bias_shape), x)
                ops = T.ops(m)
                assert "Mul" not in ops and "Add" not in ops, (trans_b, alpha, beta, bias_shape, ops)
