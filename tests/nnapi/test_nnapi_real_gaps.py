"""The NNAPI lowerings that closed issue 27's android gaps on real models: values of rank > 4 (ShuffleNet's
channel shuffle, the ViTs' qkv reshape / transpose / split / squeeze), grouped convolution (RegNetY,
wav2vec2), Gelu (erf and tanh forms), and the data-movement planner behind the rank-5 lowering.

Each case is lowered at the API levels it names and checked as in tests/nnapi/test_nnapi_ops.py: the
NNAPI operations chosen (or the refusal given), the TFLite translation run by the TFLite interpreter
against onnxruntime, and the validating fake NNAPI library's acceptance of the model.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper as h

from minirt.targets.nnapi.shapes import atoms, free_order, move_plan
from tests.nnapi.helpers import tflite_program_from_nnapi_blob
from tests.nnapi.test_nnapi_ops import Case, X3, X4, _f32, _graph, _i64, _lower, case_tests

ort = pytest.importorskip("onnxruntime")


# --- values of rank > 4 ---------------------------------------------------------------------------------
def _channel_shuffle(groups=2, shape=(1, 8, 5, 7)):
    n, c, hh, ww = shape
    return _graph([h.make_node("Reshape", ["x", "s5"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
                   h.make_node("Reshape", ["t", "s4"], ["y"])], [("x", shape)],
                  [("s5", _i64(n, groups, c // groups, hh, ww)), ("s4", _i64(n, c, hh, ww))])


def _vit_attention(n=6, heads=2, hd=4, split=True):
    """A ViT's attention: qkv (1, N, 3 * heads * hd) -> (1, N, 3, heads, hd) -> (3, 1, heads, N, hd), Split on
    axis 0 and Squeeze (DeiT) or Gather (timm's other exports) of q, k, v, then softmax(q k^T) v."""
    d = 3 * heads * hd
    nodes = [h.make_node("Reshape", ["x", "s5"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4])]
    if split:
        nodes += [h.make_node("Split", ["t"], ["q5", "k5", "v5"], axis=0, num_outputs=3)]
        nodes += [h.make_node("Squeeze", [f"{a}5", "zero"], [a]) for a in "qkv"]
    else:
        nodes += [h.make_node("Gather", ["t", f"i{j}"], [a], axis=0) for j, a in enumerate("qkv")]
    nodes += [h.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["q", "kt"], ["s"]),
              h.make_node("Softmax", ["s"], ["p"], axis=-1), h.make_node("MatMul", ["p", "v"], ["o"]),
              h.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]), h.make_node("Reshape", ["ot", "s3"], ["y"])]
    inits = [("s5", _i64(1, n, 3, heads, hd)), ("zero", _i64(0)), ("s3", _i64(1, n, heads * hd))]
    inits += [(f"i{j}", np.array(j, np.int64)) for j in range(3)]
    return _graph(nodes, [("x", (1, n, d))], inits, opset=18)


def _rank5_cases():
    yield Case("channel-shuffle", _channel_shuffle(),
               {27: "TRANSPOSE needs Android API 28", 28: {"TRANSPOSE": 1, "RESHAPE": 2}, 34: {"TRANSPOSE": 1, "RESHAPE": 2}})
    yield Case("channel-shuffle-3-groups", _channel_shuffle(3, (2, 12, 3, 4)), {29: {"TRANSPOSE": 1, "RESHAPE": 2}})
    yield Case("vit-qkv-split-squeeze", _vit_attention(), {34: {"SPLIT", "TRANSPOSE", "RESHAPE", "BATCH_MATMUL", "SOFTMAX"}})
    yield Case("vit-qkv-gather", _vit_attention(split=False), {34: "rank 5"})
    # unit axes drop out: the (2, 1, 6, 1, 1, 9) value is stored as (2, 6, 9), its transpose is a rank-3 one
    yield Case("rank6-unsqueeze-transpose", _graph([
        h.make_node("Unsqueeze", ["x", "ax"], ["u"]), h.make_node("Transpose", ["u"], ["t"], perm=[0, 1, 5, 3, 4, 2]),
        h.make_node("Reshape", ["t", "s"], ["y"])], [("x", (2, 6, 9))], [("ax", _i64(1, 3, 4)), ("s", _i64(2, 9, 6))]),
        {29: {"TRANSPOSE": 1}})
    yield Case("rank5-at-the-partition-edge", _graph([h.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1, 3, 4])],
                                                     [("x", (1, 2, 3, 4, 5))]),
               {34: "would be an input of the NNAPI partition"})
    yield Case("rank5-transpose-of-rank-5", _graph([
        h.make_node("Reshape", ["x", "s5"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[4, 2, 0, 3, 1]),
        h.make_node("Reshape", ["t", "s2"], ["y"])], [("x", (2, 3, 20))], [("s5", _i64(2, 3, 2, 5, 2)), ("s2", _i64(20, 6))]),
        {34: "a transpose of rank > 4"})


# --- grouped convolution --------------------------------------------------------------------------------
def _grouped_conv(shape, group, cout, k, **attrs):
    w = _f32(cout, shape[1] // group, *k, seed=5) * 0.3
    return _graph([h.make_node("Conv", ["x", "w", "b"], ["y"], group=group, **attrs)], [("x", shape)],
                  [("w", w), ("b", _f32(cout, seed=6))])


def _grouped_conv_cases():
    yield Case("grouped-conv-2d", _grouped_conv(X4, 2, 4, (3, 3), pads=[1, 1, 1, 1], strides=[2, 1]),
               {28: "GROUPED_CONV_2D needs Android API 29", 29: {"GROUPED_CONV_2D": 1}, 34: {"GROUPED_CONV_2D": 1}})
    yield Case("grouped-conv-2d-valid", _grouped_conv((1, 6, 6, 6), 3, 9, (1, 3)), {29: {"GROUPED_CONV_2D": 1}})
    # wav2vec2's positional convolution: a 1-D grouped conv with a long kernel and "same" padding
    yield Case("grouped-conv-1d", _grouped_conv(X3, 3, 6, (4,), pads=[2, 2]),
               {29: {"GROUPED_CONV_2D": 1, "RESHAPE": 2, "TRANSPOSE": 2}})
    yield Case("grouped-conv-dilated", _grouped_conv(X4, 2, 4, (3, 3), dilations=[2, 2]),
               {34: "NNAPI's GROUPED_CONV_2D has no dilation"})
    fused = _graph([h.make_node("Conv", ["x", "w", "b"], ["c"], group=3, pads=[1, 1, 1, 1]),
                    h.make_node("Relu", ["c"], ["y"])], [("x", X4)], [("w", _f32(6, 2, 3, 3, seed=1)), ("b", _f32(6))])
    yield Case("grouped-conv-relu", fused, {29: {"GROUPED_CONV_2D": 1, "RELU": 1}})


# --- Gelu ------------------------------------------------------------------------------------------------
def _gelu(approximate="none", shape=X3):
    return _graph([h.make_node("Gelu", ["x"], ["y"], approximate=approximate)], [("x", shape)], opset=20)


_GELU_ERF = {"ABS": 1, "MUL": 10, "ADD": 5, "DIV": 1, "EXP": 1, "RELU": 1, "SUB": 1}


def _gelu_cases():
    yield Case("gelu-erf", _gelu(), {28: "ABS needs Android API 29", 29: _GELU_ERF, 34: _GELU_ERF})
    yield Case("gelu-erf-rank4", _gelu(shape=X4), {29: _GELU_ERF})
    yield Case("gelu-tanh", _gelu("tanh"), {27: {"MUL": 5, "ADD": 1, "LOGISTIC": 1}})
    ref = _graph([h.make_node("MatMul", ["a", "w"], ["m"]), h.make_node("Add", ["m", "bias"], ["s"]),
                  h.make_node("Gelu", ["s"], ["y"])], [("a", (1, 5, 6))], [("w", _f32(6, 8, seed=2)), ("bias", _f32(8))],
                 opset=20)
    fused = _graph([h.make_node("FusedMatMul", ["a", "w", "", "bias"], ["y"], domain="com.minirt", activation="Gelu")],
                   [("a", (1, 5, 6))], [("w", _f32(6, 8, seed=2)), ("bias", _f32(8))], opset=20, domains=["com.minirt"])
    fused.graph.output[0].CopyFrom(ref.graph.output[0])
    yield Case("fusedmatmul-gelu", fused, {29: {**_GELU_ERF, "FULLY_CONNECTED": 1, "RESHAPE": 2}}, reference=ref)


# --- InstanceNormalization (wav2vec2's feature extractor: a GroupNorm with one group per channel) ----------
def _instance_norm(shape):
    c = shape[1]
    return _graph([h.make_node("InstanceNormalization", ["x", "g", "b"], ["y"], epsilon=1e-4)], [("x", shape)],
                  [("g", _f32(c, seed=3) + 1), ("b", _f32(c, seed=4))])


_IN_OPS = {"MEAN": 2, "SUB": 1, "MUL": 3, "ADD": 2, "RSQRT": 1}


def _instance_norm_cases():
    yield Case("instance-norm-1d", _instance_norm(X3), {28: "RSQRT needs Android API 29", 29: _IN_OPS})
    yield Case("instance-norm-2d", _instance_norm(X4), {34: _IN_OPS})


# --- elementwise and reductions: Pow, Reciprocal, ReduceSum / ReduceMax, rank-3 global pooling, LogSoftmax ------
def _pow(exponent, dtype=np.float32):
    return _graph([h.make_node("Abs", ["x"], ["a"]), h.make_node("Pow", ["a", "e"], ["y"])], [("x", X3)],
                  [("e", np.array(exponent, dtype))], opset=15)


def _reduce(op, axes, keepdims, shape=X3, opset=18):
    return _graph([h.make_node(op, ["x", "ax"], ["y"], keepdims=keepdims)], [("x", shape)], [("ax", _i64(*axes))],
                  opset=opset)


def _math_cases():
    yield Case("pow-square", _pow(2.0), {29: {"ABS": 1, "MUL": 1}})
    yield Case("pow-square-int-exponent", _pow(2, np.int64), {29: {"ABS": 1, "MUL": 1}})
    yield Case("pow-cube", _pow(3.0), {29: {"ABS": 1, "MUL": 2}})
    yield Case("pow-sqrt", _pow(0.5), {29: {"ABS": 1, "SQRT": 1}})
    yield Case("pow-rsqrt", _pow(-0.5), {29: {"ABS": 1, "RSQRT": 1}})
    yield Case("pow-reciprocal", _pow(-1.0), {29: {"ABS": 1, "DIV": 1}})
    yield Case("pow-general", _pow(1.7), {28: "ABS needs Android API 29", 29: {"ABS": 1, "POW": 1}})
    yield Case("reciprocal", _graph([h.make_node("Abs", ["x"], ["a"]), h.make_node("Reciprocal", ["a"], ["y"])],
                                    [("x", X4)]), {29: {"ABS": 1, "DIV": 1}})
    yield Case("reducesum-last-axis", _reduce("ReduceSum", [-1], 0, opset=13),
               {28: "REDUCE_SUM needs Android API 29", 29: {"REDUCE_SUM": 1}})
    yield Case("reducesum-rank4-keepdims", _reduce("ReduceSum", [1, 3], 1, X4, opset=13), {34: {"REDUCE_SUM": 1}})
    yield Case("reducemax-rank4-squeezed", _reduce("ReduceMax", [2], 0, X4), {34: {"REDUCE_MAX": 1, "TRANSPOSE": 1}})
    yield Case("reducemean-opset18", _reduce("ReduceMean", [0, 2], 1), {28: {"MEAN": 1}})
    yield Case("globalmaxpool-rank3", _graph([h.make_node("GlobalMaxPool", ["x"], ["y"])], [("x", X3)]),
               {29: {"REDUCE_MAX": 1}})
    yield Case("globalaveragepool-rank3", _graph([h.make_node("GlobalAveragePool", ["x"], ["y"])], [("x", X3)]),
               {28: {"MEAN": 1}})
    yield Case("logsoftmax-last", _graph([h.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], [("x", X3)]),
               {28: "LOG_SOFTMAX needs Android API 29", 29: {"LOG_SOFTMAX": 1}})
    yield Case("logsoftmax-rank4-width", _graph([h.make_node("LogSoftmax", ["x"], ["y"], axis=3)], [("x", X4)]),
               {34: {"LOG_SOFTMAX": 1}})
    # PP-OCR's attention: q, k, v sliced (not split) out of the (3, 1, heads, N, hd) tensor
    ppocr = _graph([h.make_node("Reshape", ["x", "s5"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[2, 0, 3, 1, 4])]
                   + [h.make_node("Slice", ["t", f"b{j}", f"e{j}", "ax"], [f"s{j}"]) for j in range(3)]
                   + [h.make_node("Squeeze", [f"s{j}", "ax"], [f"o{j}"]) for j in range(3)], [("x", (1, 6, 24))],
                   [("s5", _i64(1, 6, 3, 2, 4)), ("ax", _i64(0))] + [(f"b{j}", _i64(j)) for j in range(3)]
                   + [(f"e{j}", _i64(j + 1)) for j in range(3)])
    yield Case("rank5-slice-squeeze", ppocr, {34: {"SLICE": 3, "TRANSPOSE": 3, "RESHAPE": 7}})


CASES = [c for gen in (_rank5_cases, _grouped_conv_cases, _gelu_cases, _instance_norm_cases, _math_cases)
         for c in gen()]
LOWERED = [(c, lv) for c in CASES for lv, want in c.levels.items() if not isinstance(want, str)]
REFUSED = [(c, lv) for c in CASES for lv, want in c.levels.items() if isinstance(want, str)]


def _feeds(case, scale=3.0):
    # a wide range: Gelu's erf approximation is checked where the exponential is tiny too
    return {k: v * np.float32(scale) for k, v in case.feeds().items()}


(test_lowering_matches_onnxruntime_on_tflite, test_refusal_names_the_reason,
 test_fake_library_accepts_the_lowered_model) = case_tests(LOWERED, REFUSED, _feeds, atol=2e-6)


def test_gelu_erf_is_accurate_over_the_whole_line(tflite_interpreter):
    """The A&S 7.1.26 form against onnxruntime's Gelu, on [-12, 12] and its tails: below 1e-6 absolute."""
    model = _graph([h.make_node("Gelu", ["x"], ["y"])], [("x", (1, 24001))], opset=20)
    blob, _ = _lower(model, 34)
    x = np.linspace(-12, 12, 24001, dtype=np.float32).reshape(1, -1)
    (got,) = tflite_program_from_nnapi_blob(blob)(x)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert float(np.abs(got - want).max()) < 1e-6


# --- the data-movement planner ---------------------------------------------------------------------------
def _stored(a, order):
    return np.transpose(a, order)


def _run_plan(x_stored, plan, out_stored_shape):
    dims, perm = plan
    return np.transpose(x_stored.reshape(dims), perm).reshape(out_stored_shape)


def test_atoms_refine_both_shapes_or_say_none():
    assert atoms((1, 6, 4), (2, 3, 4)) == ([2, 3, 4], [[], [0, 1], [2]], [[0], [1], [2]])
    assert atoms((6, 4), (4, 6)) is None  # the 6 and the 4 interleave
    assert atoms((2, 3), (7,)) is None


@pytest.mark.parametrize("seed", range(4))
def test_move_plan_reproduces_numpy(seed):
    """Every Reshape / Transpose between random stored orders, planned by move_plan, equals numpy's."""
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(300):
        shape = tuple(int(d) for d in rng.choice([1, 2, 3, 4, 6], size=rng.integers(1, 6)))
        a = np.arange(int(np.prod(shape))).reshape(shape)
        in_order = tuple(int(i) for i in rng.permutation(len(shape)))
        perm = tuple(int(i) for i in rng.permutation(len(shape)))
        t = a.transpose(perm)
        out_order = tuple(int(i) for i in rng.permutation(len(shape)))
        got = _run_plan(_stored(a, in_order), move_plan(shape, in_order, t.shape, out_order, perm),
                        _stored(t, out_order).shape)
        np.testing.assert_array_equal(got, _stored(t, out_order))
        out_shape = tuple(int(d) for d in rng.permutation(shape))  # a reshape to a shuffled shape
        plan = move_plan(shape, in_order, out_shape, tuple(range(len(out_shape))))
        if plan is not None:
            r = a.reshape(out_shape)
            np.testing.assert_array_equal(_run_plan(_stored(a, in_order), plan, r.shape), r)
            checked += 1
            free = free_order(shape, in_order, out_shape)
            if free is not None:  # the free order moves no data
                assert move_plan(shape, in_order, out_shape, free)[1] == sorted(move_plan(shape, in_order, out_shape,
                                                                                          free)[1])
    assert checked > 50


def test_channel_shuffle_of_nhwc_data_is_one_rank3_transpose():
    # (N, C, H, W) stored NHWC, reshaped to (N, g, C/g, H, W): the free order keeps the bytes where they are
    order = free_order((1, 8, 5, 7), (0, 2, 3, 1), (1, 2, 4, 5, 7))
    assert order == (0, 3, 4, 1, 2)
    # the transpose relabels the order; the reshape back to NHWC swaps g and C/g inside each pixel
    t_order = tuple([0, 2, 1, 3, 4].index(b) for b in order)
    dims, perm = move_plan((1, 4, 2, 5, 7), t_order, (1, 8, 5, 7), (0, 2, 3, 1))
    assert (dims, perm) == ([35, 2, 4], [0, 2, 1])
    assert list(itertools.accumulate(dims, lambda a, b: a * b))[-1] == 280

