"""Sizes, counts, indices and scales at their extremes (issue 22) for the operations whose native entry
points the window test (tests/test_window_geometry_limits.py) and the attribute test
(tests/test_attribute_extremes.py) do not reach: GEMM and MatMul (transposes, empty sides), the
recurrent layers (hidden size, sequence lengths), NonMaxSuppression, RoiAlign, Resize and Upsample
(scales and sizes), and the operations whose constant inputs size their result (Pad, Tile, Expand,
Reshape, Slice, TopK, OneHot, Range, ConstantOfShape, Gather, CumSum, QuantizeLinear).

Each case sets one value to 0, 1, -1, 2^31 - 1, 2^31, 2^62, 2^63 - 1 or -2^63 (integers; the int32
ones to what int32 holds) or to 0, -1, 1e-30, 1e30, inf, -inf, nan (floats), the rest ordinary, and
must give either a clean ``minirt.Error`` or the result onnxruntime gives (onnx's reference evaluator
where onnxruntime refuses the model): never a signal, a hang, a foreign exception or an allocation past
the memory bound, and nothing run that both references refuse."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import minirt
from tests import single_node

INTS = [0, 1, -1, (1 << 31) - 1, 1 << 31, 1 << 62, (1 << 63) - 1, -(1 << 63)]
INT32S = [0, 1, -1, (1 << 31) - 1, -(1 << 31)]
FLOATS = [0.0, -1.0, 1e-30, 1e30, np.inf, -np.inf, np.nan]
RNG = np.random.default_rng(7)
X4 = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
X2 = RNG.standard_normal((3, 4)).astype(np.float32)
B2 = RNG.standard_normal((4, 5)).astype(np.float32)
EMPTY_F = np.zeros(0, np.float32)


def i64(*v):
    return np.array(v, np.int64)


def f32(*v):
    return np.array(v, np.float32)


def _rnn(op: str, gates: int, hidden: int = 3):
    seq_x = RNG.standard_normal((2, 1, 4)).astype(np.float32)  # (seq, batch, input)
    w = RNG.standard_normal((1, gates * hidden, 4)).astype(np.float32)
    r = RNG.standard_normal((1, gates * hidden, hidden)).astype(np.float32)
    b = RNG.standard_normal((1, 2 * gates * hidden)).astype(np.float32)
    return seq_x, w, r, b


# Each case: (id, op, x, constant inputs (None: absent), attributes, opset, output types).
CASES: list[tuple] = []


def case(ident, op, x, consts, attrs, opset, out_types=(TP.FLOAT,)):
    CASES.append((ident, op, x, consts, attrs, opset, out_types))


for v in INTS:
    case(f"Gemm-transA-{v}", "Gemm", X2, [B2], {"transA": v}, 13)
    case(f"Gemm-transB-{v}", "Gemm", X2, [B2], {"transB": v}, 13)
    case(f"Pad-constant-{v}", "Pad", X4, [i64(0, 0, v, v, 0, 0, v, v)], {}, 13)
    case(f"Pad-reflect-{v}", "Pad", X4, [i64(0, 0, v, 0, 0, 0, 0, v)], {"mode": "reflect"}, 13)
    case(f"Pad-edge-{v}", "Pad", X4, [i64(0, 0, 0, v, 0, 0, v, 0)], {"mode": "edge"}, 13)
    case(f"Tile-{v}", "Tile", X4, [i64(1, 1, v, 1)], {}, 13)
    case(f"Expand-{v}", "Expand", X4, [i64(v, 2, 4, 4)], {}, 13)
    case(f"Reshape-{v}", "Reshape", X4, [i64(v, -1)], {}, 14)
    case(f"Reshape-two-{v}", "Reshape", X4, [i64(v, 16)], {}, 14)
    case(f"Slice-start-{v}", "Slice", X4, [i64(v), i64((1 << 63) - 1), i64(2), i64(1)], {}, 13)
    case(f"Slice-end-{v}", "Slice", X4, [i64(0), i64(v), i64(3), i64(1)], {}, 13)
    case(f"Slice-step-{v}", "Slice", X4, [i64(0), i64(4), i64(2), i64(v)], {}, 13)
    case(f"Slice-axis-{v}", "Slice", X4, [i64(0), i64(2), i64(v), i64(1)], {}, 13)
    case(f"TopK-k-{v}", "TopK", X2, [i64(v)], {}, 11, (TP.FLOAT, TP.INT64))
    case(f"OneHot-depth-{v}", "OneHot", i64(0, 1, 2), [i64(v), f32(0, 1)], {}, 11)
    case(f"Range-limit-{v}", "Range", np.array(0, np.int64), [np.array(v, np.int64), np.array(1, np.int64)], {}, 11,
         (TP.INT64,))
    case(f"Range-delta-{v}", "Range", np.array(0, np.int64), [np.array(1 << 20, np.int64), np.array(v, np.int64)],
         {}, 11, (TP.INT64,))
    case(f"ConstantOfShape-{v}", "ConstantOfShape", i64(v, 2), [], {}, 9)
    case(f"Gather-index-{v}", "Gather", X2, [i64(v)], {}, 13)
    case(f"CumSum-axis-{v}", "CumSum", X4, [np.array(v, np.int64)], {}, 14)
    case(f"Resize-sizes-{v}", "Resize", X4, [None, None, i64(1, 2, v, v)], {"mode": "nearest"}, 13)
    case(f"Resize-sizes-linear-{v}", "Resize", X4, [None, None, i64(1, 2, 4, v)], {"mode": "linear"}, 13)
    case(f"RoiAlign-output-{v}", "RoiAlign", X4, [f32(0, 0, 3, 3).reshape(1, 4), i64(0)],
         {"output_height": v, "output_width": 2}, 16)
    case(f"RoiAlign-sampling-{v}", "RoiAlign", X4, [f32(0, 0, 3, 3).reshape(1, 4), i64(0)],
         {"sampling_ratio": v}, 16)
    case(f"RoiAlign-batch-{v}", "RoiAlign", X4, [f32(0, 0, 3, 3).reshape(1, 4), i64(v)], {}, 16)
    boxes = f32(0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, 2, 1, 3).reshape(1, 3, 4)
    scores = f32(0.9, 0.8, 0.7).reshape(1, 1, 3)
    case(f"NMS-max-{v}", "NonMaxSuppression", boxes, [scores, i64(v), f32(0.5), f32(0.0)], {}, 11, (TP.INT64,))
    case(f"NMS-center-{v}", "NonMaxSuppression", boxes, [scores, i64(2), f32(0.5)], {"center_point_box": v}, 11,
         (TP.INT64,))
    for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        seq_x, w, r, b = _rnn(op, gates)
        case(f"{op}-hidden-{v}", op, seq_x, [w, r, b], {"hidden_size": v}, 14)
        case(f"{op}-layout-{v}", op, seq_x, [w, r, b], {"hidden_size": 3, "layout": v}, 14)

for v in INT32S:
    for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        seq_x, w, r, b = _rnn(op, gates)
        case(f"{op}-sequence_lens-{v}", op, seq_x, [w, r, b, np.array([v], np.int32)], {"hidden_size": 3}, 14)

for v in FLOATS:
    case(f"Gemm-alpha-{v}", "Gemm", X2, [B2], {"alpha": v}, 13)
    case(f"Resize-scales-{v}", "Resize", X4, [None, f32(1, 1, v, v)], {"mode": "nearest"}, 13)
    case(f"Resize-scales-linear-{v}", "Resize", X4, [None, f32(1, 1, 2, v)], {"mode": "linear"}, 13)
    case(f"Resize-scales-cubic-{v}", "Resize", X4, [None, f32(1, 1, v, 2)], {"mode": "cubic"}, 13)
    case(f"Upsample-{v}", "Upsample", X4, [f32(1, 1, v, v)], {"mode": "nearest"}, 9)
    case(f"Upsample-linear-{v}", "Upsample", X4, [f32(1, 1, 2, v)], {"mode": "linear"}, 9)
    case(f"RoiAlign-scale-{v}", "RoiAlign", X4, [f32(0, 0, 3, 3).reshape(1, 4), i64(0)], {"spatial_scale": v}, 16)
    case(f"RoiAlign-box-{v}", "RoiAlign", X4, [f32(0, 0, v, 3).reshape(1, 4), i64(0)], {"mode": "max"}, 16)
    boxes = f32(0, 0, 1, 1, 0, 0.1, 1, 1.1, 0, 2, 1, 3).reshape(1, 3, 4)
    scores = f32(0.9, 0.8, 0.7).reshape(1, 1, 3)
    case(f"NMS-iou-{v}", "NonMaxSuppression", boxes, [scores, i64(3), f32(v), f32(0.0)], {}, 11, (TP.INT64,))
    case(f"NMS-score-{v}", "NonMaxSuppression", boxes, [scores, i64(3), f32(0.5), f32(v)], {}, 11, (TP.INT64,))
    case(f"NMS-box-{v}", "NonMaxSuppression", f32(0, 0, v, 1, 0, 0, 1, v, 0, 2, 1, 3).reshape(1, 3, 4),
         [scores, i64(3), f32(0.5)], {}, 11, (TP.INT64,))
    case(f"Range-float-delta-{v}", "Range", np.array(0, np.float32), [np.array(1e6, np.float32), np.array(v, np.float32)],
         {}, 11)
    case(f"LayerNormalization-epsilon-{v}", "LayerNormalization", X2, [np.ones(4, np.float32)], {"epsilon": v}, 17)
    case(f"InstanceNormalization-epsilon-{v}", "InstanceNormalization", X4, [np.ones(2, np.float32),
                                                                            np.zeros(2, np.float32)], {"epsilon": v}, 6)
    case(f"QuantizeLinear-scale-{v}", "QuantizeLinear", X2, [np.array(v, np.float32), np.array(3, np.uint8)], {}, 13,
         (TP.UINT8,))
    case(f"LeakyRelu-alpha-{v}", "LeakyRelu", X2, [], {"alpha": v}, 6)

for shape_a, shape_b in (((0, 4), (4, 5)), ((3, 0), (0, 5)), ((3, 4), (4, 0)), ((2, 0, 4), (4, 5))):
    a = np.zeros(shape_a, np.float32)
    b = RNG.standard_normal(shape_b).astype(np.float32)
    case(f"MatMul-{shape_a}x{shape_b}", "MatMul", a, [b], {}, 13)
    if len(shape_a) == 2:
        case(f"Gemm-{shape_a}x{shape_b}", "Gemm", a, [b, np.ones(shape_b[1], np.float32)], {}, 13)


@pytest.mark.parametrize("ident,op,x,consts,attrs,opset,out_types", CASES, ids=[c[0] for c in CASES])
def test_extreme_size_gives_a_clean_error_or_the_reference(ident, op, x, consts, attrs, opset, out_types):
    data = single_node.artifact(op, x, consts, attrs, opset, len(out_types))
    try:
        got = minirt.Session(data, max_tensor_bytes=64 << 20).run(None, {"x": x})
    except minirt.Error:
        return  # a clean, named error
    ref = single_node.reference(op, x, consts, attrs, opset, out_types)
    assert ref is not None, f"minirt ran {ident}, which onnxruntime and the reference refuse"
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape, f"{ident}: shape {a.shape}, the reference's {b.shape}"
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, equal_nan=True)
