"""Tests for recognise_attention: MatMul -> scale -> [mask] -> Softmax -> MatMul becomes one node."""
import numpy as np
from onnx import helper as h

from minirt.builder.passes import optimize, testing as T
from minirt.builder.passes.recognise_attention import RecogniseAttention

R = np.random.default_rng(12)
B, H, N, D = 2, 2, 5, 4
FEEDS = {k: R.standard_normal((B, H, N, D)).astype(np.float32) for k in "qkv"}
FEEDS["mask"] = np.where(R.random((B, 1, N, N)) < 0.2, -1e4, 0).astype(np.float32)
C = [T.tensor("sqrt_d", np.float32(np.sqrt(D))), T.tensor("inv_sqrt_d", np.float32(1 / np.sqrt(D))),
     T.tensor("qs", np.array([D ** -0.25], np.float32)), T.tensor("vec", R.random(N).astype(np.float32))]
OUT = (B, H, N, D)


def _m(nodes, opset=17, outputs=(("y", OUT),)):
    inputs = [T.vinfo(k, [B, H, N, D]) for k in "qkv"] + [T.vinfo("mask", [B, 1, N, N])]
    return T.make_model(nodes, inputs, [T.vinfo(n, list(s)) for n, s in outputs], C, opset=opset)


def _tail(src="s", axis=-1):
    return [h.make_node("Softmax", [src], ["p"], axis=axis), h.make_node("MatMul", ["p", "v"], ["y"])]


KT = h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2])
PATTERNS = {
    # name: (nodes, opset, transpose_k, has mask)
    "div_mask": ([KT, h.make_node("MatMul", ["q", "kt"], ["qk"]), h.make_node("Div", ["qk", "sqrt_d"], ["sc"]),
                  h.make_node("Add", ["sc", "mask"], ["s"])] + _tail(), 17, 1, True),
    "mul_no_mask_old_opset_axis3": ([KT, h.make_node("MatMul", ["q", "kt"], ["qk"]),
                                     h.make_node("Mul", ["inv_sqrt_d", "qk"], ["s"])] + _tail(axis=3), 12, 1, False),
    "split_scale_pretransposed_k": ([KT, h.make_node("Relu", ["kt"], ["kr"]), h.make_node("Mul", ["q", "qs"], ["q2"]),
                                     h.make_node("Mul", ["kr", "qs"], ["k2"]), h.make_node("MatMul", ["q2", "k2"], ["s"])]
                                    + _tail(), 17, 0, False),
    "mask_first_operand": ([KT, h.make_node("MatMul", ["q", "kt"], ["qk"]), h.make_node("Mul", ["qk", "inv_sqrt_d"], ["sc"]),
                            h.make_node("Add", ["mask", "sc"], ["s"])] + _tail(), 17, 1, True),
}


def test_patterns_recognised():
    for name, (nodes, opset, tk, has_mask) in PATTERNS.items():
        m, _, _ = T.run_both(_m(nodes, opset), FEEDS, opt_level=3, rtol=1e-5, atol=1e-5)
        ops = T.ops(m)
        assert ops["com.minirt::ScaledDotProductAttention"] == 1 and "Softmax" not in ops, (name, ops)
        node = next(n for n in m.graph if n.op_type == "ScaledDotProductAttention")
        assert node.attributes["transpose_k"].value == tk, name
        assert abs(node.attributes["scale"].value - 1 / np.sqrt(D)) < 1e-6, name
        assert (len(node.inputs) == 4) == has_mask, name


def test_level2_does_not_fuse():
    m, _ = T.optimized(_m(PATTERNS["div_mask"][0]), 2)
    assert "Softmax" in T.ops(m)


def test_near_misses():
    base = [KT, h.make_node("MatMul", ["q", "kt"], ["qk"])]
    cases = [
        base + [h.make_node("Div", ["qk", "sqrt_d"], ["s"])] + _tail(axis=2),  # softmax over the wrong axis
        base + [h.make_node("Mul", ["qk", "vec"], ["s"])] + _tail(),  # scale is not a scalar
    ]
    for nodes in cases:
        assert not RecogniseAttention()(T.load(_m(nodes))).modified
        T.run_both(_m(nodes), FEEDS, opt_level=3, rtol=1e-5, atol=1e-5)
    # probabilities on the right of the second MatMul: not attention
    nodes = base + [h.make_node("Div", ["qk", "sqrt_d"], ["s"]), h.make_node("Softmax", ["s"], ["p"], axis=-1),
                    h.make_node("Transpose", ["v"], ["vt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["vt", "p"], ["y"])]
    model = _m(nodes, outputs=(("y", (B, H, D, N)),))
    assert not RecogniseAttention()(T.load(model)).modified
    T.run_both(model, FEEDS, opt_level=3, rtol=1e-5, atol=1e-5)
    # attention weights also returned: the probabilities are read elsewhere
    nodes = base + [h.make_node("Div", ["qk", "sqrt_d"], ["s"])] + _tail()
    model = _m(nodes, outputs=(("y", OUT), ("p", (B, H, N, N))))
    assert not RecogniseAttention()(T.load(model)).modified
    T.run_both(model, FEEDS, opt_level=3, rtol=1e-5, atol=1e-5)


def test_unknown_shapes_rank_from_producers():
    # old opset, positive axis, no shape annotations on the intermediates: the rank comes from the Transpose
    nodes, opset, _, _ = PATTERNS["mul_no_mask_old_opset_axis3"]
    m = T.load(_m(nodes, opset))
    for node in m.graph:
        for out in node.outputs:
            out.shape = None
    assert RecogniseAttention()(m).modified


def test_empty_graph_and_twice():
    model = T.make_model([h.make_node("Identity", ["q"], ["y"])], [T.vinfo("q", [2])], [T.vinfo("y", [2])])
    assert not RecogniseAttention()(T.load(model)).modified
    m = T.load(_m(PATTERNS["div_mask"][0]))
    optimize(m, 3)
    assert not RecogniseAttention()(m).modified


def test_kernel_contract():
    """com.minirt::ScaledDotProductAttention against numpy: scale, broadcast mask, transpose_k, inputs untouched."""
    from minirt.kernels import lookup

    fn = lookup("com.minirt", "ScaledDotProductAttention", 1).fn
    q, k, v, mask = (FEEDS[n].copy() for n in ("q", "k", "v", "mask"))
    saved = [a.copy() for a in (q, k, v, mask)]

    def ref(q, kt, v, mask, scale):
        s = (q.astype(np.float64) @ kt.astype(np.float64)) * scale + (0 if mask is None else mask)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    kt = np.swapaxes(k, -1, -2)
    for got, want in [
        (fn(q, k, v, mask, scale=0.5, transpose_k=1), ref(q, kt, v, mask, 0.5)),
        (fn(q, np.ascontiguousarray(kt), v, scale=2.0, transpose_k=0), ref(q, kt, v, None, 2.0)),
        (fn(q, k, v, np.broadcast_to(mask, (B, H, N, N)), transpose_k=1), ref(q, kt, v, mask, 1.0)),
    ]:
        assert got.dtype == np.float32 and got.shape == (B, H, N, D)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip((q, k, v, mask), saved):
        np.testing.assert_array_equal(a, b)
