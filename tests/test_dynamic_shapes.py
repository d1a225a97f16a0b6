"""Dynamic shapes: symbolic dims, run-time shape arithmetic, shapes that change from run to run.

Hand-built ONNX graphs whose shapes are computed at run time
(Shape -> Gather/Slice -> arithmetic -> Concat -> Reshape/Expand/Resize/...)
with symbolic batch, sequence and spatial dims.  Each graph is built once
(default options) into ONE minirt session that then runs at several input
shapes, each compared with onnxruntime.  With ``--input-shape``
(``build(input_shapes=...)``) the same chains fold to constants: fewer nodes,
identical results, and the specialised artifact refuses other shapes.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

ort = pytest.importorskip("onnxruntime")

from minirt import builder  # noqa: E402
import minirt  # noqa: E402

OPSET = 17
I64 = TP.INT64


def _const(name, values, dtype=np.int64):
    return nh.from_array(np.asarray(values, dtype=dtype), name)


def _model(nodes, inputs, outputs, inits=()):
    m = h.make_model(
        h.make_graph(nodes, "dyn", inputs, outputs, list(inits)),
        opset_imports=[h.make_opsetid("", OPSET)],
        producer_name="tests",
    )
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def _ort(model):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _count(data: bytes) -> int:
    return len(minirt.Session(data).artifact.graphs[0].nodes)


def _check_runs(model, feeds_list, rtol=1e-5, atol=1e-6):
    """One minirt session, several shapes, each against onnxruntime; returns the session."""
    sess = minirt.Session(builder.build_bytes(model))
    ref = _ort(model)
    for feeds in feeds_list:
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return sess


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- graphs


def flatten_model():
    """x[N, 4, H, W] -> Reshape(x, Concat(Gather(Shape(x), 0), [-1])) -> y[N, 4*H*W]; then y @ w needs H, W fixed,
    so the output is ReduceSum over the flattened axis plus the flattened tensor itself."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        h.make_node("Concat", ["n1", "minus1"], ["flat_shape"], axis=0),
        h.make_node("Reshape", ["x", "flat_shape"], ["y"]),
        h.make_node("ReduceSum", ["y", "ax1"], ["total"], keepdims=0),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 4, "H", "W"])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["N", None]), h.make_tensor_value_info("total", TP.FLOAT, ["N"])],
        [_const("i0", 0), _const("ax0", [0]), _const("minus1", [-1]), _const("ax1", [1])],
    )


def split_heads_model(heads=4, d_model=32):
    """Attention-style head split and merge on x[B, S, D] with B and S symbolic.

    [B, S, D] -> Reshape [B, S, h, D/h] (from Shape/Gather/Concat) -> Transpose -> scores = q k^T / sqrt(d)
    -> Softmax -> @ v -> Transpose -> Reshape back to [B, S, D] via Shape(x).
    """
    dh = d_model // heads
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i0"], ["b"], axis=0),
        h.make_node("Gather", ["s", "i1"], ["t"], axis=0),
        h.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        h.make_node("Unsqueeze", ["t", "ax0"], ["t1"]),
        h.make_node("Concat", ["b1", "t1", "hd"], ["split_shape"], axis=0),
        h.make_node("MatMul", ["x", "wq"], ["q0"]),
        h.make_node("Reshape", ["q0", "split_shape"], ["q1"]),
        h.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["x", "split_shape"], ["k1"]),
        h.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        h.make_node("MatMul", ["q", "kt"], ["scores0"]),
        h.make_node("Mul", ["scores0", "scale"], ["scores"]),
        h.make_node("Softmax", ["scores"], ["p"], axis=-1),
        h.make_node("Transpose", ["k1"], ["v"], perm=[0, 2, 1, 3]),
        h.make_node("MatMul", ["p", "v"], ["o0"]),
        h.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        # merge back: the target shape is Shape(x) itself, sliced and re-concatenated
        h.make_node("Slice", ["s", "start0", "end2"], ["bs"]),
        h.make_node("Concat", ["bs", "dm"], ["merge_shape"], axis=0),
        h.make_node("Reshape", ["o1", "merge_shape"], ["y"]),
    ]
    rng = np.random.default_rng(1)
    inits = [
        _const("i0", 0), _const("i1", 1), _const("ax0", [0]), _const("hd", [heads, dh]),
        _const("start0", [0]), _const("end2", [2]), _const("dm", [d_model]),
        nh.from_array((rng.standard_normal((d_model, d_model)) / np.sqrt(d_model)).astype(np.float32), "wq"),
        nh.from_array(np.array(1.0 / np.sqrt(dh), np.float32), "scale"),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", TP.FLOAT, ["B", "S", d_model])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["B", "S", d_model])],
        inits,
    )


def spatial_model():
    """x[N, 3, H, W]: upsample to 2H x 2W with Resize(sizes=...) computed from Shape, add a positional ramp
    Range(0, W) broadcast with Expand to Shape(x), and a ConstantOfShape mask of x's shape; global spatial
    mean through a Reshape to [N, 3, H*W] whose H*W is a Mul of two gathered dims."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Slice", ["s", "start0", "end2"], ["nc"]),
        h.make_node("Slice", ["s", "start2", "end4"], ["hw"]),
        h.make_node("Mul", ["hw", "two"], ["hw2"]),
        h.make_node("Concat", ["nc", "hw2"], ["up_sizes"], axis=0),
        h.make_node("Resize", ["x", "", "", "up_sizes"], ["up"], mode="nearest"),
        # positional ramp over W, expanded to x's shape
        h.make_node("Gather", ["s", "i3"], ["w"], axis=0),
        h.make_node("Cast", ["w"], ["wf"], to=TP.FLOAT),
        h.make_node("Range", ["zero_f", "wf", "one_f"], ["ramp"]),
        h.make_node("Expand", ["ramp", "s"], ["ramp_x"]),
        h.make_node("ConstantOfShape", ["s"], ["ones"], value=h.make_tensor("v", TP.FLOAT, [1], [0.5])),
        h.make_node("Add", ["x", "ramp_x"], ["xr"]),
        h.make_node("Mul", ["xr", "ones"], ["xm"]),
        # [N, 3, H*W]
        h.make_node("Gather", ["s", "i2"], ["hh"], axis=0),
        h.make_node("Mul", ["hh", "w"], ["area"]),
        h.make_node("Unsqueeze", ["area", "ax0"], ["area1"]),
        h.make_node("Concat", ["nc", "area1"], ["pooled_shape"], axis=0),
        h.make_node("Reshape", ["xm", "pooled_shape"], ["flat"]),
        h.make_node("ReduceMean", ["flat"], ["mean"], axes=[2], keepdims=0),  # axes: attribute until opset 18
    ]
    inits = [
        _const("start0", [0]), _const("end2", [2]), _const("start2", [2]), _const("end4", [4]),
        _const("two", [2]), _const("i2", 2), _const("i3", 3), _const("ax0", [0]),
        nh.from_array(np.array(0.0, np.float32), "zero_f"), nh.from_array(np.array(1.0, np.float32), "one_f"),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, "H", "W"])],
        [h.make_tensor_value_info("up", TP.FLOAT, ["N", 3, None, None]),
         h.make_tensor_value_info("mean", TP.FLOAT, ["N", 3])],
        inits,
    )


def two_inputs_model():
    """x[B, T, 8] and mask[B, T] share symbolic B and T: masked mean over T, with the mask reshaped to
    [B, T, 1] from Shape(mask) and the divisor from ReduceSum; plus Tile of a learned row to [B, 1, 8]."""
    nodes = [
        h.make_node("Shape", ["mask"], ["ms"]),
        h.make_node("Concat", ["ms", "one"], ["ms1"], axis=0),
        h.make_node("Reshape", ["mask", "ms1"], ["m3"]),
        h.make_node("Mul", ["x", "m3"], ["xm"]),
        h.make_node("ReduceSum", ["xm", "ax1"], ["num"], keepdims=1),
        h.make_node("ReduceSum", ["m3", "ax1"], ["den0"], keepdims=1),
        h.make_node("Max", ["den0", "eps"], ["den"]),
        h.make_node("Div", ["num", "den"], ["avg"]),
        h.make_node("Shape", ["x"], ["xs"]),
        h.make_node("Slice", ["xs", "start0", "end1"], ["b1"]),
        h.make_node("Concat", ["b1", "one", "one"], ["reps"], axis=0),
        h.make_node("Tile", ["row", "reps"], ["rows"]),
        h.make_node("Add", ["avg", "rows"], ["y"]),
    ]
    inits = [
        _const("one", [1]), _const("ax1", [1]), _const("start0", [0]), _const("end1", [1]),
        nh.from_array(np.array(1e-6, np.float32), "eps"),
        nh.from_array(np.arange(8, dtype=np.float32).reshape(1, 1, 8) / 8, "row"),
    ]
    return _model(
        nodes,
        [h.make_tensor_value_info("x", TP.FLOAT, ["B", "T", 8]), h.make_tensor_value_info("mask", TP.FLOAT, ["B", "T"])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["B", 1, 8])],
        inits,
    )


# --------------------------------------------------------------------------- one session, many shapes


def test_flatten_chain_batch_and_spatial_change_per_run():
    shapes = [(1, 4, 5, 7), (3, 4, 2, 2), (2, 4, 16, 1), (1, 4, 5, 7)]
    sess = _check_runs(flatten_model(), [{"x": _rand(*s)} for s in shapes])
    # the session reports the symbolic dims by name, as onnxruntime does
    assert sess.get_inputs()[0].shape == ["N", 4, "H", "W"]


def test_split_heads_batch_and_sequence_change_per_run():
    shapes = [(1, 16, 32), (3, 40, 32), (2, 1, 32), (5, 7, 32)]
    _check_runs(split_heads_model(), [{"x": _rand(*s)} for s in shapes], rtol=1e-5, atol=1e-5)


def test_spatial_resize_range_expand_change_per_run():
    shapes = [(1, 3, 4, 6), (2, 3, 9, 5), (1, 3, 1, 1), (3, 3, 8, 8)]
    sess = _check_runs(spatial_model(), [{"x": _rand(*s)} for s in shapes])
    up, _ = sess.run(None, {"x": _rand(2, 3, 9, 5)})
    assert up.shape == (2, 3, 18, 10)


def test_shared_symbolic_dims_across_inputs():
    feeds = []
    for b, t in ((1, 5), (4, 12), (2, 1)):
        mask = (np.random.default_rng(b * 100 + t).random((b, t)) > 0.3).astype(np.float32)
        feeds.append({"x": _rand(b, t, 8), "mask": mask})
    _check_runs(two_inputs_model(), feeds)


def test_zero_sized_batch():
    """A batch of 0 flows through the shape arithmetic like any other size (onnxruntime agrees) ..."""
    _check_runs(split_heads_model(), [{"x": _rand(0, 5, 32)}, {"x": _rand(2, 5, 32)}])
    # ... except where Reshape's -1 would have to divide by 0: both runtimes refuse [0, -1] of [0, 4, 3, 3]
    sess = minirt.Session(builder.build_bytes(flatten_model()))
    with pytest.raises(minirt.Error, match="Reshape"):
        sess.run(None, {"x": _rand(0, 4, 3, 3)})
    with pytest.raises(Exception, match="Reshape"):
        _ort(flatten_model()).run(None, {"x": _rand(0, 4, 3, 3)})
    sess.run(None, {"x": _rand(1, 4, 3, 3)})  # the session is still usable


# --------------------------------------------------------------------------- static dims fold without --input-shape


def test_static_dims_of_a_partly_symbolic_shape_fold():
    """Gather(Shape(x), i) of a static dim folds even when other dims are symbolic."""
    x = h.make_tensor_value_info("x", TP.FLOAT, ["N", 6, "L"])
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "i1"], ["c"], axis=0),  # static: 6
        h.make_node("Gather", ["s", "i0"], ["n"], axis=0),  # symbolic
        h.make_node("Div", ["c", "two"], ["half"]),
        h.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        h.make_node("Unsqueeze", ["half", "ax0"], ["half1"]),
        h.make_node("Concat", ["n1", "two1", "half1", "minus1"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    model = _model(nodes, [x], [h.make_tensor_value_info("y", TP.FLOAT, ["N", 2, 3, "L"])],
                   [_const("i0", 0), _const("i1", 1), _const("two", 2), _const("two1", [2]),
                    _const("ax0", [0]), _const("minus1", [-1])])
    report = builder.build(model)
    # the static branch (Gather c, Div, Unsqueeze) is gone; the batch branch stays
    assert "Div" not in report.op_histogram
    assert report.op_histogram.get("Gather", 0) == 1
    sess = minirt.Session(report.data)
    ref = _ort(model)
    for shape in ((1, 6, 4), (3, 6, 9)):
        feeds = {"x": _rand(*shape)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])


# --------------------------------------------------------------------------- --input-shape specialisation


SPECIALISE = [
    ("flatten", flatten_model, {"x": (2, 4, 5, 7)}),
    ("split_heads", split_heads_model, {"x": (3, 40, 32)}),
    ("spatial", spatial_model, {"x": (2, 3, 9, 5)}),
    ("two_inputs", two_inputs_model, {"x": (4, 12, 8), "mask": (4, 12)}),
]


@pytest.mark.parametrize("name,make,shapes", SPECIALISE, ids=[s[0] for s in SPECIALISE])
def test_input_shape_folds_shape_chains(name, make, shapes):
    model = make()
    generic = builder.build(model)
    special = builder.build(model, input_shapes=shapes)
    hist = special.op_histogram
    # every shape computation is gone: no Shape, and fewer nodes than the generic build
    assert "Shape" not in hist, hist
    assert special.nodes_after < generic.nodes_after, (generic.op_histogram, hist)
    assert _count(special.data) == special.nodes_after
    rng = np.random.default_rng(5)
    feeds = {}
    for k, s in shapes.items():
        arr = rng.standard_normal(s).astype(np.float32)
        feeds[k] = (arr > 0).astype(np.float32) if k == "mask" else arr
    want = _ort(model).run(None, feeds)
    got_generic = minirt.Session(generic.data).run(None, feeds)
    sess = minirt.Session(special.data)
    got_special = sess.run(None, feeds)
    for gs, gg, w in zip(got_special, got_generic, want):
        assert gs.shape == w.shape
        np.testing.assert_array_equal(gs, gg)  # identical to the generic build
        np.testing.assert_allclose(gs, w, rtol=1e-5, atol=1e-5)
    # the specialised artifact declares the fixed shape and refuses others
    assert [a.shape for a in sess.get_inputs()] == [list(shapes[a.name]) for a in sess.get_inputs()]
    other = {k: np.concatenate([v, v]) for k, v in feeds.items()}  # batch doubled
    with pytest.raises(minirt.InvalidArgument):
        sess.run(None, other)
