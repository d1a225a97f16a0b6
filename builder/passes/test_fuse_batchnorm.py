"""Tests for fuse_batchnorm: BN and per-channel affine fold into Conv/ConvTranspose/Gemm; near misses do not."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.fuse_batchnorm import FuseBatchNorm

R = np.random.default_rng(2)


def _bn_inits(c, prefix="bn"):
    return [T.tensor(f"{prefix}_s", R.uniform(0.5, 1.5, c).astype(np.float32)), T.tensor(f"{prefix}_b", R.standard_normal(c).astype(np.float32)),
            T.tensor(f"{prefix}_m", R.standard_normal(c).astype(np.float32)), T.tensor(f"{prefix}_v", R.uniform(0.5, 2, c).astype(np.float32))]


def _conv_bn(op="Conv", group=1, extra_reader=False):
    w = R.standard_normal((4, 4 // group, 3, 3) if op == "Conv" else (4, 4 // group, 3, 3)).astype(np.float32)
    nodes = [h.make_node(op, ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], group=group),
             h.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"], epsilon=1e-3)]
    outs = [T.vinfo("y", [1, 4, 5, 5])]
    if extra_reader:
        nodes.append(h.make_node("Relu", ["c"], ["r"]))
        outs.append(T.vinfo("r", [1, 4, 5, 5]))
    inits = [T.tensor("w", w), T.tensor("cb", R.standard_normal(4).astype(np.float32))] + _bn_inits(4)
    return T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], outs, inits)


def test_conv_bn():
    x = {"x": R.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    for group in (1, 2, 4):
        m, report, _ = T.run_both(_conv_bn(group=group), x, disabled=["fuse_activation"])
        assert T.ops(m) == {"Conv": 1}


def test_conv_transpose_bn():
    x = {"x": R.standard_normal((1, 4, 5, 5)).astype(np.float32)}
    for group in (1, 2):
        m, _, _ = T.run_both(_conv_bn("ConvTranspose", group=group), x, disabled=["fuse_activation"])
        assert T.ops(m) == {"ConvTranspose": 1}


def test_conv_transpose_affine_then_bn():
    # det's FPN head: ConvTranspose without bias, a per-channel Add (the exporter's bias), BatchNormalization;
    # with output_shape larger than the data reaches, the unreached border carries the folded bias too.
    for attrs in ({"strides": [2, 2]}, {"strides": [2, 2], "output_shape": [9, 9], "group": 2}):
        g = attrs.get("group", 1)
        nodes = [h.make_node("ConvTranspose", ["x", "w"], ["c"], **attrs), h.make_node("Mul", ["c", "k"], ["m"]),
                 h.make_node("Add", ["t", "m"], ["a"]),
                 h.make_node("BatchNormalization", ["a", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"])]
        inits = [T.tensor("w", R.standard_normal((4, 4 // g, 2, 2)).astype(np.float32)),
                 T.tensor("k", R.uniform(0.5, 2, (1, 4, 1, 1)).astype(np.float32)),
                 T.tensor("t", R.standard_normal((4, 1, 1)).astype(np.float32))] + _bn_inits(4)
        out = 9 if "output_shape" in attrs else 8
        model = T.make_model(nodes, [T.vinfo("x", [1, 4, 4, 4])], [T.vinfo("y", [1, 4, out, out])], inits)
        m, _, _ = T.run_both(model, {"x": R.standard_normal((1, 4, 4, 4)).astype(np.float32)},
                             disabled=["fuse_activation"])
        assert T.ops(m) == {"ConvTranspose": 1}


def test_gemm_bn_and_affine():
    nodes = [h.make_node("Gemm", ["x", "w", "c"], ["g"], transB=1, alpha=0.5, beta=2.0),
             h.make_node("BatchNormalization", ["g", "bn_s", "bn_b", "bn_m", "bn_v"], ["t"]),
             h.make_node("Mul", ["t", "k"], ["u"]), h.make_node("Sub", ["u", "k"], ["y"])]
    inits = [T.tensor("w", R.standard_normal((6, 5)).astype(np.float32)), T.tensor("c", R.standard_normal(6).astype(np.float32)),
             T.tensor("k", R.standard_normal((1, 6)).astype(np.float32))] + _bn_inits(6)
    model = T.make_model(nodes, [T.vinfo("x", [3, 5])], [T.vinfo("y", [3, 6])], inits)
    m, _, _ = T.run_both(model, {"x": R.standard_normal((3, 5)).astype(np.float32)}, disabled=["fuse_activation"])
    assert T.ops(m) == {"Gemm": 1}


def test_conv_affine_per_channel():
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Mul", ["k", "c"], ["m"]), h.make_node("Add", ["m", "t"], ["y"])]
    inits = [T.tensor("w", R.standard_normal((4, 4, 1, 1)).astype(np.float32)), T.tensor("k", R.standard_normal((4, 1, 1)).astype(np.float32)),
             T.tensor("t", np.float32(0.5))]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, 5, 5])], inits)
    m, _, _ = T.run_both(model, {"x": R.standard_normal((1, 4, 5, 5)).astype(np.float32)}, disabled=["fuse_activation"])
    assert T.ops(m) == {"Conv": 1}


def test_near_misses_not_fused():
    # conv output read twice: BN refused, with a reason
    m = T.load(_conv_bn(extra_reader=True))
    p = FuseBatchNorm()
    assert not p(m).modified
    assert p.refusals and "read elsewhere" in p.refusals[0].reason
    # a spatially varying Mul is not a per-channel affine
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Mul", ["c", "k"], ["y"])]
    inits = [T.tensor("w", R.standard_normal((4, 4, 1, 1)).astype(np.float32)), T.tensor("k", R.standard_normal((5, 5)).astype(np.float32))]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5])], [T.vinfo("y", [1, 4, 5, 5])], inits)
    m = T.load(model)
    assert not FuseBatchNorm()(m).modified
    T.run_both(model, {"x": R.standard_normal((1, 4, 5, 5)).astype(np.float32)})
    # non-constant weight: refused
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["y"])]
    model = T.make_model(nodes, [T.vinfo("x", [1, 4, 5, 5]), T.vinfo("w", [4, 4, 1, 1])], [T.vinfo("y", [1, 4, 5, 5])], _bn_inits(4))
    m = T.load(model)
    p = FuseBatchNorm()
    assert not p(m).modified and "not a constant" in p.refusals[0].reason
