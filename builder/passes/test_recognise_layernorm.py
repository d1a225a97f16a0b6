"""Tests for recognise_layernorm: decomposed layer norms become one LayerNormalization."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import optimize, testing as T
from minirt.builder.passes.recognise_layernorm import RecogniseLayerNorm

R = np.random.default_rng(11)
SHAPE = [2, 3, 8]
X = {"x": (R.standard_normal(SHAPE) * 3 + 1).astype(np.float32)}
C = [T.tensor("two", np.float32(2)), T.tensor("eps", np.float32(1e-5)), T.tensor("one", np.float32(1)),
     T.tensor("zero", np.float32(0)), T.tensor("mhalf", np.float32(-0.5)), T.tensor("inv_n", np.float32(1 / 8)),
     T.tensor("gamma", R.uniform(0.5, 1.5, 8).astype(np.float32)), T.tensor("beta", R.standard_normal(8).astype(np.float32)),
     T.tensor("gamma2", R.uniform(0.5, 1.5, (1, 1, 8)).astype(np.float32)),
     T.tensor("gamma38", R.uniform(0.5, 1.5, (3, 8)).astype(np.float32)),
     T.tensor("gamma_ch", R.uniform(0.5, 1.5, (3, 1)).astype(np.float32)),
     T.tensor("ax_last", np.array([-1], np.int64)), T.tensor("ax_1", np.array([1], np.int64))]


def _m(nodes, opset=17, out_shape=SHAPE, outputs=("y",)):
    """x -> Neg -> v -> pattern -> y (v, not the graph input, is the normalised tensor)."""
    return T.make_model([h.make_node("Neg", ["x"], ["v"])] + nodes, [T.vinfo("x", SHAPE)],
                        [T.vinfo(o, out_shape if o == "y" else [2, 3, 1]) for o in outputs], C, opset=opset)


def _mean(src, out, axes=(-1,), opset=17, keepdims=1):
    if opset >= 18:
        return h.make_node("ReduceMean", [src, "ax_last" if list(axes) == [-1] else "ax_1"], [out], keepdims=keepdims)
    return h.make_node("ReduceMean", [src], [out], axes=list(axes), keepdims=keepdims)


def _centre_var(opset=17, square="pow", axes=(-1,), axes2=None):
    sq = (h.make_node("Pow", ["xc", "two"], ["sq"]) if square == "pow" else h.make_node("Mul", ["xc", "xc"], ["sq"]))
    return [_mean("v", "m", axes, opset), h.make_node("Sub", ["v", "m"], ["xc"]), sq,
            _mean("sq", "var", axes2 or axes, opset)]


def _std():
    return [h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"])]


PATTERNS = {
    # (nodes, opset, expected fused op)
    "div_gamma_beta": (_centre_var() + _std() + [h.make_node("Div", ["xc", "std"], ["n"]),
                                                 h.make_node("Mul", ["n", "gamma"], ["g"]),
                                                 h.make_node("Add", ["g", "beta"], ["y"])], 17, "LayerNormalization"),
    "opset18_axes_input": (_centre_var(18) + _std() + [h.make_node("Div", ["xc", "std"], ["n"]),
                                                       h.make_node("Mul", ["gamma", "n"], ["g"]),
                                                       h.make_node("Add", ["beta", "g"], ["y"])], 18, "LayerNormalization"),
    "reciprocal_old_opset": (_centre_var(13, "mul") + _std() + [h.make_node("Reciprocal", ["std"], ["inv"]),
                                                                 h.make_node("Mul", ["xc", "inv"], ["n"]),
                                                                 h.make_node("Mul", ["n", "gamma2"], ["g"]),
                                                                 h.make_node("Add", ["g", "beta"], ["y"])],
                             13, "com.minirt::LayerNormalization"),
    "one_over_std_no_affine": (_centre_var() + _std() + [h.make_node("Div", ["one", "std"], ["inv"]),
                                                         h.make_node("Mul", ["inv", "xc"], ["y"])], 17, "LayerNormalization"),
    "pow_minus_half_gamma_in_inv": (_centre_var() + [h.make_node("Add", ["var", "eps"], ["ve"]),
                                                     h.make_node("Pow", ["ve", "mhalf"], ["inv"]),
                                                     h.make_node("Mul", ["inv", "gamma"], ["ig"]),
                                                     h.make_node("Mul", ["xc", "ig"], ["n"]),
                                                     h.make_node("Add", ["n", "beta"], ["y"])], 17, "LayerNormalization"),
    "last_two_axes": (_centre_var(axes=(-2, -1)) + _std() + [h.make_node("Div", ["xc", "std"], ["n"]),
                                                             h.make_node("Mul", ["n", "gamma38"], ["y"])], 17,
                      "LayerNormalization"),
    # magika: sum * 1/N with keepdims=0, E[x^2] - E[x]^2, Max(0, .), restored by Unsqueeze
    "ex2_minus_mean2": ([h.make_node("ReduceSum", ["v", "ax_last"], ["s"], keepdims=0),
                         h.make_node("Mul", ["s", "inv_n"], ["m"]),
                         h.make_node("Mul", ["v", "v"], ["x2"]),
                         h.make_node("ReduceSum", ["x2", "ax_last"], ["s2"], keepdims=0),
                         h.make_node("Mul", ["s2", "inv_n"], ["ex2"]),
                         h.make_node("Mul", ["m", "m"], ["m2"]),
                         h.make_node("Sub", ["ex2", "m2"], ["d"]),
                         h.make_node("Max", ["zero", "d"], ["var0"]),
                         h.make_node("Unsqueeze", ["var0", "ax_last"], ["var"]),
                         h.make_node("Unsqueeze", ["m", "ax_last"], ["mk"]),
                         h.make_node("Sub", ["v", "mk"], ["xc"]),
                         h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
                         h.make_node("Reciprocal", ["std"], ["inv"]),
                         h.make_node("Mul", ["inv", "gamma2"], ["ig"]),
                         h.make_node("Mul", ["xc", "ig"], ["n"]),
                         h.make_node("Add", ["n", "beta"], ["y"])], 15, "com.minirt::LayerNormalization"),
}


def test_patterns_recognised():
    for name, (nodes, opset, op) in PATTERNS.items():
        m, report, _ = T.run_both(_m(nodes, opset), X, opt_level=3, rtol=1e-4, atol=1e-4)
        assert T.ops(m) == {"Neg": 1, op: 1}, (name, T.ops(m))
        assert not [r for r in report.refused if r["pattern"] == "layernorm"], name


def test_level2_does_not_fuse():
    nodes, opset, _ = PATTERNS["div_gamma_beta"]
    m, _ = T.optimized(_m(nodes, opset), 2)
    assert "LayerNormalization" not in T.ops(m)


def _refusals(model):
    m = T.load(model)
    p = RecogniseLayerNorm()
    changed = p(m).modified
    return changed, [r.reason for r in p.refusals]


def test_near_misses_refused_with_reasons():
    tail = [h.make_node("Div", ["xc", "std"], ["n"]), h.make_node("Mul", ["n", "gamma_ch"], ["y"])]
    cases = {
        "not the trailing": (_centre_var(axes=(1,)) + _std() + tail, SHAPE),
        "other axes": (_centre_var(axes=(-1,), axes2=(-2,)) + [h.make_node("Identity", ["var"], ["y"])], [2, 1, 8]),
        "no epsilon": (_centre_var() + [h.make_node("Sqrt", ["var"], ["std"]), h.make_node("Div", ["xc", "std"], ["y"])], SHAPE),
        "after the Sqrt": (_centre_var() + [h.make_node("Sqrt", ["var"], ["s"]), h.make_node("Add", ["s", "eps"], ["std"]),
                                            h.make_node("Div", ["xc", "std"], ["y"])], SHAPE),
        "not a constant": (_centre_var() + [h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["std"]),
                                            h.make_node("Reciprocal", ["std"], ["inv"]), h.make_node("Mul", ["inv", "v"], ["ig"]),
                                            h.make_node("Mul", ["xc", "ig"], ["y"])], SHAPE),
        "non-normalised": (_centre_var() + _std() + [h.make_node("Reciprocal", ["std"], ["inv"]),
                                                     h.make_node("Mul", ["inv", "gamma_ch"], ["ig"]),
                                                     h.make_node("Mul", ["xc", "ig"], ["y"])], SHAPE),
    }
    for reason, (nodes, out_shape) in cases.items():
        model = _m(nodes, out_shape=out_shape)
        changed, reasons = _refusals(model)
        assert not changed and any(reason in r for r in reasons), (reason, reasons)
        T.run_both(model, X, opt_level=3, rtol=1e-4, atol=1e-4)


def test_intermediate_read_elsewhere_is_kept():
    nodes = _centre_var() + _std() + [h.make_node("Div", ["xc", "std"], ["y"])]
    model = _m(nodes, outputs=("y", "var"))  # the variance is also a graph output
    changed, reasons = _refusals(model)
    assert not changed and any("graph output" in r for r in reasons)
    T.run_both(model, X, opt_level=3, rtol=1e-4, atol=1e-4)


def test_non_constant_gamma_after_normalisation_stays_a_mul():
    nodes = _centre_var() + _std() + [h.make_node("Div", ["xc", "std"], ["n"]), h.make_node("Mul", ["n", "v"], ["y"])]
    m, _, _ = T.run_both(_m(nodes), X, opt_level=3, rtol=1e-4, atol=1e-4)
    assert T.ops(m) == {"Neg": 1, "LayerNormalization": 1, "Mul": 1}


def test_empty_graph_and_twice():
    model = T.make_model([h.make_node("Identity", ["x"], ["y"])], [T.vinfo("x", [2])], [T.vinfo("y", [2])])
    assert not RecogniseLayerNorm()(T.load(model)).modified
    nodes, opset, _ = PATTERNS["ex2_minus_mean2"]
    m = T.load(_m(nodes, opset))
    optimize(m, 3)
    assert not RecogniseLayerNorm()(m).modified
