"""Neural-network kernels (minirt/kernels/nn.py) against onnxruntime.

Every case calls the kernel through the registry (so registration and the
since-version lookup are exercised) and compares with onnxruntime running the
same single node.
"""
from __future__ import annotations


import numpy as np
import onnx
import pytest

from minirt.kernels import NodeContext, lookup, nn
from tests.kernels.reference import reference_outputs, single_node_model

# --------------------------------------------------------------------------- helpers


def _reference(op, inputs, attrs, n_outputs, opset, engine="onnxruntime"):
    try:
        return reference_outputs(op, inputs, attrs, n_outputs, opset, engine=engine)
    except Exception as exc:  # noqa: BLE001
        # reference.py declares outputs with an UNDEFINED element type, which
        # onnxruntime refuses to load; retry with the output types left out.
        if engine != "onnxruntime" or "Invalid tensor data type 0" not in str(exc):
            raise
    import onnxruntime as ort

    model = single_node_model(op, inputs, attrs, n_outputs, opset)
    for out in model.graph.output:
        out.ClearField("type")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {f"in{i}": np.asarray(x) for i, x in enumerate(inputs) if x is not None})


def run_kernel(op, inputs, attrs=None, n_outputs=1, opset=17):
    entry = lookup("", op, opset)
    assert entry is not None, f"no kernel for {op} at opset {opset}"
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in (attrs or {}).items()}
    if entry.context:
        ctx = NodeContext(name="node", op_type=op, n_outputs=n_outputs, output_dtypes=(None,) * n_outputs, opset=opset)
        kwargs["ctx"] = ctx
    result = entry.fn(*inputs, **kwargs)
    return list(result) if isinstance(result, tuple) else [result]


def _default_engine(attrs):
    # onnxruntime rejects dilations combined with SAME_* auto padding; the onnx
    # package's reference evaluator implements them.
    if attrs and str(attrs.get("auto_pad", "")).startswith("SAME") and any(d != 1 for d in attrs.get("dilations", ())):
        return "onnx-reference"
    return "onnxruntime"


def check(op, inputs, attrs=None, *, opset=17, n_outputs=1, rtol=1e-5, atol=1e-5, engine=None):
    engine = engine or _default_engine(attrs)
    got = run_kernel(op, inputs, attrs, n_outputs, opset)
    ref = _reference(op, inputs, attrs or {}, n_outputs, opset, engine)
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert isinstance(g, np.ndarray), f"output {i} is {type(g)}, not ndarray"
        assert g.dtype == r.dtype, f"output {i}: dtype {g.dtype}, expected {r.dtype}"
        assert g.shape == r.shape, f"output {i}: shape {g.shape}, expected {r.shape}"
        if r.dtype.kind in "f":
            if r.dtype == np.float16:
                np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=1e-2, atol=1e-2)
            else:
                np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, r)
    return got


def rand(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- registry / attributes

NN_OPS = {
    "Conv": [1, 11, 22],
    "ConvTranspose": [1, 11, 22],
    "MaxPool": [1, 8, 10, 11, 12, 22],
    "AveragePool": [1, 7, 10, 11, 19, 22],
    "GlobalAveragePool": [1, 22],
    "GlobalMaxPool": [1, 22],
    "BatchNormalization": [1, 6, 7, 9, 14, 15],
    "InstanceNormalization": [1, 6, 22],
    "LayerNormalization": [17],
    "LpNormalization": [1, 22],
    "LRN": [1, 13],
    "Softmax": [1, 11, 13],
    "LogSoftmax": [1, 11, 13],
    "Hardmax": [1, 11, 13],
    "Dropout": [1, 6, 7, 10, 12, 13, 22],
}


@pytest.mark.parametrize("op,opset", [(op, v) for op, vs in NN_OPS.items() for v in vs])
def test_attributes_match_schema(op, opset):
    entry = lookup("", op, opset)
    assert entry is not None
    assert entry.since <= opset
    schema = onnx.defs.get_schema(op, opset)
    expected = set(schema.attributes.keys())
    assert entry.attributes is not None
    missing = expected - entry.attributes
    assert not missing, f"{op}@{opset}: ONNX attributes not accepted: {missing}"
    # Entries are registered per attribute-set change, so nothing extra either.
    assert entry.attributes == expected


def test_no_kernel_before_first_opset():
    assert lookup("", "LayerNormalization", 16) is None
    assert lookup("", "Conv", 1) is not None


# --------------------------------------------------------------------------- Conv

CONV2D_CASES = [
    # (x shape, w shape, attrs)
    ((1, 3, 7, 7), (4, 3, 3, 3), {}),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 3, 8, 8), (5, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 9, 8), (5, 3, 3, 2), {"strides": [1, 2], "pads": [0, 1, 2, 0]}),
    ((1, 2, 9, 9), (4, 2, 3, 3), {"dilations": [2, 2]}),
    ((1, 2, 10, 9), (4, 2, 3, 3), {"dilations": [2, 1], "strides": [2, 1], "pads": [2, 1, 1, 2]}),
    ((2, 4, 6, 6), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    ((1, 6, 7, 7), (6, 2, 3, 3), {"group": 3, "strides": [2, 2]}),
    ((1, 4, 7, 7), (8, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),  # depth multiplier 2
    ((2, 5, 8, 7), (5, 1, 3, 3), {"group": 5, "pads": [1, 1, 1, 1]}),  # depthwise
    ((1, 5, 9, 9), (5, 1, 3, 3), {"group": 5, "strides": [2, 2], "dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ((1, 4, 8, 8), (4, 1, 5, 5), {"group": 4, "auto_pad": "SAME_UPPER"}),
    ((2, 3, 9, 8), (3, 1, 3, 2), {"group": 3, "dilations": [2, 3]}),  # depthwise, no padding
    ((1, 3, 9, 8), (3, 1, 3, 3), {"group": 3, "strides": [1, 2], "pads": [1, 1, 1, 1]}),
    ((1, 4, 8, 8), (4, 1, 4, 4), {"group": 4, "auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((2, 3, 5, 5), (4, 3, 1, 1), {}),  # 1x1
    ((1, 3, 6, 6), (4, 3, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 5, 5), (4, 3, 1, 1), {"pads": [1, 0, 1, 2]}),
    ((1, 4, 5, 5), (6, 2, 1, 1), {"group": 2}),
    ((1, 3, 7, 7), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER"}),
    ((1, 3, 7, 7), (4, 3, 4, 4), {"auto_pad": "SAME_UPPER"}),
    ((1, 3, 7, 7), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER"}),
    ((1, 3, 8, 7), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 8, 7), (4, 3, 2, 3), {"auto_pad": "SAME_LOWER", "strides": [3, 2], "dilations": [1, 2]}),
    ((1, 3, 7, 7), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((1, 3, 7, 7), (4, 3, 3, 3), {"auto_pad": "NOTSET", "kernel_shape": [3, 3]}),
    ((1, 3, 3, 3), (4, 3, 3, 3), {}),  # output 1x1
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONV2D_CASES)
def test_conv_2d(xs, ws, attrs, bias):
    rng = np.random.default_rng(0)
    inputs = [rand(rng, xs), rand(rng, ws)]
    if bias:
        inputs.append(rand(rng, (ws[0],)))
    check("Conv", inputs, attrs)


CONV1D_CASES = [
    ((1, 3, 10), (4, 3, 3), {}),
    ((2, 3, 11), (4, 3, 3), {"strides": [2], "pads": [1, 2]}),
    ((1, 4, 12), (6, 2, 3), {"group": 2, "dilations": [3]}),
    ((1, 4, 12), (4, 1, 5), {"group": 4, "pads": [2, 2]}),  # depthwise
    ((1, 4, 12), (4, 1, 4), {"group": 4, "auto_pad": "SAME_LOWER"}),
    ((1, 4, 12), (5, 4, 1), {"strides": [3]}),
    ((1, 3, 10), (4, 3, 4), {"auto_pad": "SAME_UPPER", "strides": [3]}),
    ((1, 3, 10), (4, 3, 3), {"auto_pad": "VALID"}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV1D_CASES)
def test_conv_1d(xs, ws, attrs):
    rng = np.random.default_rng(1)
    check("Conv", [rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))], attrs)


@pytest.mark.parametrize(
    "xs,ws,attrs",
    [
        ((1, 2, 5, 6, 5), (3, 2, 3, 3, 3), {}),
        ((1, 2, 6, 6, 6), (3, 2, 2, 3, 3), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1]}),
        ((1, 4, 5, 5, 5), (4, 1, 3, 3, 3), {"group": 4, "pads": [1, 1, 1, 1, 1, 1]}),
        ((1, 4, 5, 5, 5), (6, 2, 1, 1, 1), {"group": 2}),
        ((1, 2, 7, 6, 5), (3, 2, 3, 2, 3), {"dilations": [2, 1, 1], "auto_pad": "SAME_UPPER"}),
    ],
)
def test_conv_3d(xs, ws, attrs):
    rng = np.random.default_rng(2)
    check("Conv", [rand(rng, xs), rand(rng, ws), rand(rng, (ws[0],))], attrs)


@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_opsets(opset):
    rng = np.random.default_rng(3)
    check("Conv", [rand(rng, (1, 2, 6, 6)), rand(rng, (3, 2, 3, 3))], {"pads": [1, 1, 1, 1]}, opset=opset)


# One case per Conv code path: im2col, depthwise, 1x1.
CONV_PATHS = [((4, 3, 3, 3), {"pads": [1, 1, 1, 1]}), ((3, 1, 3, 3), {"group": 3}), ((4, 3, 1, 1), {})]


@pytest.mark.parametrize("ws,attrs", CONV_PATHS)
def test_conv_float16(ws, attrs):
    rng = np.random.default_rng(4)
    check("Conv", [rand(rng, (1, 3, 6, 6), np.float16), rand(rng, ws, np.float16)], attrs)


@pytest.mark.parametrize("ws,attrs", CONV_PATHS + [((4, 3, 1, 1), {"strides": [2, 2]})])
def test_conv_non_contiguous_input(ws, attrs):
    rng = np.random.default_rng(8)
    x = rand(rng, (1, 7, 6, 3)).transpose(0, 3, 1, 2)  # NHWC data viewed as NCHW
    assert not x.flags.c_contiguous
    check("Conv", [x, rand(rng, ws)], attrs)


@pytest.mark.parametrize("ws,attrs", CONV_PATHS)
def test_conv_float64(ws, attrs):
    # onnxruntime has no float64 Conv; compare with its float32 result.
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((1, 3, 6, 6)), rng.standard_normal(ws)
    (got,) = run_kernel("Conv", [x, w], attrs)
    assert got.dtype == np.float64
    (ref,) = _reference("Conv", [x.astype(np.float32), w.astype(np.float32)], attrs, 1, 17)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_conv_keeps_float32_and_larger_sizes():
    rng = np.random.default_rng(5)
    x, w, b = rand(rng, (2, 16, 20, 20)), rand(rng, (32, 16, 3, 3)), rand(rng, (32,))
    (y,) = check("Conv", [x, w, b], {"pads": [1, 1, 1, 1], "strides": [2, 2]}, rtol=1e-4, atol=1e-4)
    assert y.dtype == np.float32 and y.flags.c_contiguous


@pytest.mark.parametrize(
    "xs,ws,attrs,match",
    [
        ((1, 4, 5, 5), (4, 3, 3, 3), {"group": 2}, "group"),
        ((1, 6, 5, 5), (4, 2, 3, 3), {"group": 3}, "group"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"group": 0}, "group"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"auto_pad": "SAME"}, "auto_pad"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"strides": [1]}, "strides"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"strides": [0, 1]}, "strides"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"dilations": [1, 1, 1]}, "dilations"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [1, 1]}, "pads"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"pads": [-1, 0, 0, 0]}, "pads"),
        ((1, 3, 5, 5), (4, 3, 3, 3), {"kernel_shape": [2, 2]}, "kernel_shape"),
        ((1, 3, 2, 2), (4, 3, 3, 3), {}, "larger than"),
        ((1, 3, 5, 5), (4, 3, 3), {}, "rank"),
        ((3, 5), (4, 3, 3), {}, "spatial"),
    ],
)
def test_conv_rejects_bad_attributes(xs, ws, attrs, match):
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match=match):
        run_kernel("Conv", [rand(rng, xs), rand(rng, ws)], attrs)


def test_conv_rejects_bad_bias_and_dtype_mismatch():
    rng = np.random.default_rng(7)
    x, w = rand(rng, (1, 3, 5, 5)), rand(rng, (4, 3, 3, 3))
    with pytest.raises(ValueError, match="bias"):
        run_kernel("Conv", [x, w, rand(rng, (3,))])
    with pytest.raises(ValueError, match="dtype"):
        run_kernel("Conv", [x, w.astype(np.float64)])


# --------------------------------------------------------------------------- ConvTranspose

CONVT_CASES = [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 1]}),
    ((1, 3, 5, 4), (3, 2, 3, 2), {"strides": [3, 2], "dilations": [2, 1]}),
    ((1, 4, 4, 4), (4, 3, 3, 3), {"group": 2, "strides": [2, 2]}),
    ((1, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [9, 9]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [8, 8]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 8], "output_padding": [1, 1]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [7, 6]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "output_shape": [10, 10]}),  # one beyond the data
    ((1, 3, 4, 4), (3, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_shape": [9, 7]}),
    ((1, 3, 4, 4), (3, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER", "output_shape": [9, 7]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 4, 4), (3, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 3, 4, 4), (3, 2, 4, 4), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_shape": [7, 7]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER", "output_shape": [7, 7]}),
    ((1, 3, 4, 4), (3, 2, 3, 3), {"strides": [1, 2], "auto_pad": "VALID"}),
    ((1, 3, 4, 4), (3, 2, 1, 1), {"strides": [2, 2]}),
    ((1, 3, 4, 4), (3, 2, 2, 2), {"strides": [2, 2], "kernel_shape": [2, 2]}),
]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
def test_conv_transpose_2d(xs, ws, attrs, bias):
    rng = np.random.default_rng(10)
    inputs = [rand(rng, xs), rand(rng, ws)]
    if bias:
        inputs.append(rand(rng, (ws[1] * attrs.get("group", 1),)))
    check("ConvTranspose", inputs, attrs)


@pytest.mark.parametrize(
    "xs,ws,attrs",
    [
        ((1, 3, 6), (3, 2, 3), {"strides": [2]}),
        ((1, 4, 6), (4, 1, 4), {"strides": [2], "group": 2, "pads": [1, 1], "output_padding": [1]}),
        ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 2]}),
        ((1, 2, 3, 4, 3), (2, 2, 3, 2, 3), {"strides": [1, 2, 2], "pads": [1, 0, 1, 1, 0, 0]}),
    ],
)
def test_conv_transpose_1d_3d(xs, ws, attrs):
    rng = np.random.default_rng(11)
    check("ConvTranspose", [rand(rng, xs), rand(rng, ws)], attrs)


def test_conv_transpose_output_shape_with_batch_and_channels():
    # Some exporters write output_shape as (N, C, *spatial); onnxruntime's
    # shape inference rejects that, minirt takes the spatial tail.
    rng = np.random.default_rng(15)
    x, w = rand(rng, (1, 3, 4, 4)), rand(rng, (3, 2, 3, 3))
    full = run_kernel("ConvTranspose", [x, w], {"strides": [2, 2], "output_shape": [1, 2, 8, 7]})[0]
    spatial = check("ConvTranspose", [x, w], {"strides": [2, 2], "output_shape": [8, 7]})[0]
    np.testing.assert_array_equal(full, spatial)


@pytest.mark.parametrize("opset", [1, 11])
def test_conv_transpose_opsets(opset):
    rng = np.random.default_rng(12)
    check("ConvTranspose", [rand(rng, (1, 2, 3, 3)), rand(rng, (2, 2, 3, 3))], {"strides": [2, 2]}, opset=opset)


def test_conv_transpose_float16():
    rng = np.random.default_rng(13)
    x, w = rand(rng, (1, 3, 4, 4), np.float16), rand(rng, (3, 2, 3, 3), np.float16)
    check("ConvTranspose", [x, w], {"strides": [2, 2]})


@pytest.mark.parametrize(
    "ws,attrs,match",
    [
        ((4, 2, 3, 3), {}, "W.shape"),
        ((3, 2, 3, 3), {"group": 2}, "group"),
        ((3, 2, 3, 3), {"auto_pad": "FOO"}, "auto_pad"),
        ((3, 2, 3, 3), {"output_shape": [5]}, "output_shape"),
        ((3, 2, 3, 3), {"output_padding": [1]}, "output_padding"),
        ((3, 2, 3, 3), {"pads": [3, 3, 3, 3]}, "empty"),
    ],
)
def test_conv_transpose_rejects_bad_attributes(ws, attrs, match):
    rng = np.random.default_rng(14)
    with pytest.raises(ValueError, match=match):
        run_kernel("ConvTranspose", [rand(rng, (1, 3, 4, 4)), rand(rng, ws)], attrs)


# --------------------------------------------------------------------------- MaxPool / AveragePool

POOL2D_CASES = [
    ((1, 2, 6, 6), {"kernel_shape": [2, 2]}),
    ((2, 3, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 2, 0]}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 8, 8), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 7, 8), {"kernel_shape": [2, 3], "strides": [3, 2], "auto_pad": "SAME_UPPER"}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}),
    ((1, 2, 7, 7), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 8, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 6, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [3, 3], "pads": [0, 0, 1, 1], "ceil_mode": 1}),
    # ceil_mode windows that would start inside the end padding are dropped
    ((1, 2, 5, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}),
    ((1, 2, 6, 5), {"kernel_shape": [3, 2], "strides": [2, 3], "pads": [1, 0, 1, 1], "ceil_mode": 1}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER", "ceil_mode": 1}),
    ((1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [3, 3], "auto_pad": "VALID", "ceil_mode": 1}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 3], "dilations": [2, 2]}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ((1, 2, 9, 8), {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 1, 1, 1), {"kernel_shape": [1, 1]}),
]


@pytest.mark.parametrize("n_outputs", [1, 2])
@pytest.mark.parametrize("xs,attrs", POOL2D_CASES)
def test_max_pool_2d(xs, attrs, n_outputs):
    rng = np.random.default_rng(20)
    check("MaxPool", [rand(rng, xs)], attrs, n_outputs=n_outputs)


@pytest.mark.parametrize("xs,attrs", POOL2D_CASES[:6])
def test_max_pool_indices_column_major(xs, attrs):
    rng = np.random.default_rng(21)
    check("MaxPool", [rand(rng, xs)], dict(attrs, storage_order=1), n_outputs=2)


def test_max_pool_first_maximum_wins():
    x = np.zeros((1, 1, 4, 4), dtype=np.float32)
    check("MaxPool", [x], {"kernel_shape": [2, 2], "strides": [1, 1]}, n_outputs=2)


@pytest.mark.parametrize(
    "xs,attrs",
    [
        ((1, 2, 10), {"kernel_shape": [3], "strides": [2]}),
        ((2, 2, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
        ((1, 2, 10), {"kernel_shape": [2], "dilations": [3], "auto_pad": "SAME_UPPER"}),
        ((1, 2, 5, 6, 5), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}),
        ((1, 2, 5, 6, 5), {"kernel_shape": [3, 2, 3], "pads": [1, 0, 1, 1, 1, 0]}),
    ],
)
@pytest.mark.parametrize("n_outputs", [1, 2])
def test_max_pool_1d_3d(xs, attrs, n_outputs):
    rng = np.random.default_rng(22)
    check("MaxPool", [rand(rng, xs)], attrs, n_outputs=n_outputs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_max_pool_dtypes(dtype):
    rng = np.random.default_rng(23)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (1, 2, 7, 7), endpoint=True).astype(dtype)
    else:
        x = rand(rng, (1, 2, 7, 7), dtype)
    check("MaxPool", [x], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})


@pytest.mark.parametrize("opset", [1, 8, 10, 11, 12])
def test_max_pool_opsets(opset):
    rng = np.random.default_rng(24)
    n_out = 1 if opset < 8 else 2
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    check("MaxPool", [rand(rng, (1, 2, 6, 6))], attrs, opset=opset, n_outputs=n_out)


@pytest.mark.parametrize(
    "attrs,match",
    [
        ({}, "kernel_shape"),
        ({"kernel_shape": [2]}, "kernel_shape"),
        ({"kernel_shape": [2, 2], "auto_pad": "same_upper"}, "auto_pad"),
        ({"kernel_shape": [2, 2], "storage_order": 2}, "storage_order"),
        ({"kernel_shape": [2, 2], "pads": [1, 1, 1]}, "pads"),
        ({"kernel_shape": [9, 9]}, "larger than"),
        ({"kernel_shape": [2, 2], "pads": [2, 0, 0, 0]}, "smaller than kernel"),
        ({"kernel_shape": [2, 2], "pads": [0, 0, 0, 2]}, "smaller than kernel"),
    ],
)
def test_max_pool_rejects_bad_attributes(attrs, match):
    with pytest.raises(ValueError, match=match):
        run_kernel("MaxPool", [np.zeros((1, 1, 5, 5), np.float32)], attrs)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("xs,attrs", POOL2D_CASES)
def test_average_pool_2d(xs, attrs, count_include_pad):
    rng = np.random.default_rng(30)
    check("AveragePool", [rand(rng, xs)], dict(attrs, count_include_pad=count_include_pad), opset=19)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize(
    "xs,attrs",
    [
        ((1, 2, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 2]}),
        ((1, 2, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "ceil_mode": 1}),
        ((1, 2, 5, 6, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1], "pads": [1, 1, 0, 0, 1, 1]}),
    ],
)
def test_average_pool_1d_3d(xs, attrs, count_include_pad):
    rng = np.random.default_rng(31)
    check("AveragePool", [rand(rng, xs)], dict(attrs, count_include_pad=count_include_pad))


@pytest.mark.parametrize("opset", [1, 7, 10, 11, 19])
def test_average_pool_opsets(opset):
    rng = np.random.default_rng(32)
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}
    x = rand(rng, (1, 2, 7, 7))
    if opset >= 7:
        check("AveragePool", [x], dict(attrs, count_include_pad=1), opset=opset)
    else:
        # onnxruntime has no AveragePool-1 kernel and the onnx reference
        # evaluator includes the padding; opset 1 specifies "divided by the
        # number of elements exclude pad", i.e. count_include_pad=0 later on.
        got = run_kernel("AveragePool", [x], attrs, opset=1)[0]
        np.testing.assert_array_equal(got, check("AveragePool", [x], attrs, opset=7)[0])


def test_average_pool_float16():
    rng = np.random.default_rng(33)
    check("AveragePool", [rand(rng, (1, 2, 7, 7), np.float16)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})


def test_average_pool_rejects_bad_attributes():
    x = np.zeros((1, 1, 5, 5), np.float32)
    with pytest.raises(ValueError, match="kernel_shape"):
        run_kernel("AveragePool", [x], {})
    with pytest.raises(ValueError, match="auto_pad"):
        run_kernel("AveragePool", [x], {"kernel_shape": [2, 2], "auto_pad": "BOGUS"})
    with pytest.raises(ValueError, match="dilations"):
        run_kernel("AveragePool", [x], {"kernel_shape": [2, 2], "dilations": [0, 1]}, opset=19)
    with pytest.raises(ValueError, match="smaller than kernel"):
        run_kernel("AveragePool", [x], {"kernel_shape": [2, 2], "pads": [2, 2, 0, 0]})
    with pytest.raises(ValueError, match="dtype"):
        run_kernel("AveragePool", [x.astype(np.int32)], {"kernel_shape": [2, 2]})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_global_pools(op, shape, dtype):
    rng = np.random.default_rng(40)
    check(op, [rand(rng, shape, dtype)])


def test_global_pool_rejects_rank2():
    with pytest.raises(ValueError, match="spatial"):
        run_kernel("GlobalAveragePool", [np.zeros((2, 3), np.float32)])


# --------------------------------------------------------------------------- normalisation


def _bn_inputs(rng, shape, dtype=np.float32):
    c = shape[1]
    return [
        rand(rng, shape, dtype),
        rand(rng, (c,), dtype),
        rand(rng, (c,), dtype),
        rand(rng, (c,), dtype),
        rng.uniform(0.5, 2.0, (c,)).astype(dtype),
    ]


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 5), (1, 4, 3, 5), (1, 2, 3, 3, 3)])
def test_batch_norm(opset, shape):
    rng = np.random.default_rng(50)
    check("BatchNormalization", _bn_inputs(rng, shape), {"epsilon": 1e-3}, opset=opset)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_batch_norm_dtypes(dtype):
    rng = np.random.default_rng(51)
    check("BatchNormalization", _bn_inputs(rng, (1, 3, 4, 4), dtype), opset=15)


def test_batch_norm_spatial0_legacy():
    # spatial=0 (opset 7-8): statistics are per activation, shaped like X[0].
    rng = np.random.default_rng(52)
    x = rand(rng, (2, 3, 4))
    params = [rand(rng, (3, 4)), rand(rng, (3, 4)), rand(rng, (3, 4)), rng.uniform(0.5, 2, (3, 4)).astype(np.float32)]
    got = run_kernel("BatchNormalization", [x, *params], {"spatial": 0}, opset=7)[0]
    scale, b, mean, var = params
    np.testing.assert_allclose(got, (x - mean) / np.sqrt(var + 1e-5) * scale + b, rtol=1e-5, atol=1e-5)


def test_batch_norm_old_opsets_ignore_is_test():
    rng = np.random.default_rng(53)
    inputs = _bn_inputs(rng, (1, 3, 4, 4))
    expected = run_kernel("BatchNormalization", inputs, opset=9)[0]
    for opset, attrs in [(1, {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 1}), (6, {"is_test": 0})]:
        np.testing.assert_array_equal(run_kernel("BatchNormalization", inputs, attrs, opset=opset)[0], expected)


@pytest.mark.parametrize("n_outputs", [1, 3])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 2), (2, 3, 2, 2, 2)])
def test_batch_norm_training_mode(n_outputs, shape):
    # onnxruntime's CPU build has no training-mode BatchNormalization: the onnx reference evaluator does
    rng = np.random.default_rng(54)
    inputs = _bn_inputs(rng, shape)
    attrs = {"training_mode": 1, "momentum": 0.8, "epsilon": 1e-3}
    ref = _reference("BatchNormalization", inputs, attrs, n_outputs, 15, engine="onnx-reference")
    out = run_kernel("BatchNormalization", inputs, attrs, opset=15, n_outputs=n_outputs)
    assert len(out) == n_outputs
    for a, e in zip(out, ref):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)


def test_batch_norm_rejects_legacy_training_outputs():
    rng = np.random.default_rng(54)
    inputs = _bn_inputs(rng, (1, 3, 4, 4))
    with pytest.raises(ValueError, match="training"):
        run_kernel("BatchNormalization", inputs, n_outputs=5, opset=9)
    with pytest.raises(ValueError, match="scale shape"):
        run_kernel("BatchNormalization", [inputs[0], inputs[1][:2], *inputs[2:]], opset=15)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 3, 5), (2, 2, 3, 4, 3), (2, 24, 1003)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_instance_norm(shape, dtype):
    rng = np.random.default_rng(60)
    c = shape[1]
    inputs = [rand(rng, shape, dtype), rand(rng, (c,), dtype), rand(rng, (c,), dtype)]
    check("InstanceNormalization", inputs, {"epsilon": 1e-4})


def test_instance_norm_float32_is_a_native_call_per_image_and_keeps_a_large_mean(monkeypatch):
    """float32 InstanceNormalization is one mrt_instancenorm_f32 per image (a program replays it: wav2vec2's
    feature extractor); planes with a large mean keep their small variance (the centred form)."""
    from minirt import native
    if not native.available:
        pytest.skip(native.reason)
    calls = []
    real = native._call
    monkeypatch.setattr(native, "_call", lambda entry, *a: calls.append(entry.__name__) or real(entry, *a))
    rng = np.random.default_rng(62)
    x = (rng.standard_normal((2, 5, 77)) + 1000.0).astype(np.float32)
    s, b = rand(rng, (5,)), rand(rng, (5,))
    check("InstanceNormalization", [x, s, b], {"epsilon": 1e-5}, rtol=1e-3, atol=1e-3)
    assert calls == ["mrt_instancenorm_f32"] * 2  # (one per image)


def test_instance_norm_opset1_and_errors():
    rng = np.random.default_rng(61)
    x, s, b = rand(rng, (1, 3, 4, 4)), rand(rng, (3,)), rand(rng, (3,))
    np.testing.assert_allclose(
        run_kernel("InstanceNormalization", [x, s, b], {"consumed_inputs": [0]}, opset=1)[0],
        run_kernel("InstanceNormalization", [x, s, b], opset=6)[0],
    )
    with pytest.raises(ValueError, match="scale"):
        run_kernel("InstanceNormalization", [x, s[:2], b])


@pytest.mark.parametrize("n_outputs", [1, 2, 3])
@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
@pytest.mark.parametrize("bias", [False, True])
def test_layer_norm(axis, n_outputs, bias):
    rng = np.random.default_rng(70)
    x = rand(rng, (2, 3, 4))
    norm_shape = x.shape[axis % x.ndim :]
    inputs = [x, rand(rng, norm_shape)]
    if bias:
        inputs.append(rand(rng, norm_shape))
    check("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, n_outputs=n_outputs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_layer_norm_dtypes(dtype):
    rng = np.random.default_rng(71)
    check("LayerNormalization", [rand(rng, (3, 8), dtype), rand(rng, (8,), dtype), rand(rng, (8,), dtype)], n_outputs=3)


@pytest.mark.parametrize("op, opset, shape, attrs", [("LayerNormalization", 17, (2, 5, 24), {"axis": -1}),
                                                      ("InstanceNormalization", 6, (2, 5, 24), {})])
def test_normalizations_write_into_the_memory_plans_buffer(op, opset, shape, attrs):
    """float32 Layer / InstanceNormalization write their result into ``out`` (the memory plan's buffer)
    when it fits, as onnxruntime computes it; one that overlaps the input or has another shape is left
    alone (a fresh array, the same values)."""
    from minirt import native
    if not native.available:
        pytest.skip(native.reason)
    rng = np.random.default_rng(72)
    x = rand(rng, shape)
    c = shape[-1] if op == "LayerNormalization" else shape[1]
    inputs = [x, rand(rng, (c,)), rand(rng, (c,))]
    want = _reference(op, inputs, attrs, 1, opset)[0]
    entry = lookup("", op, opset)
    kw = dict(attrs)
    if entry.context:
        kw["ctx"] = NodeContext(name="n", op_type=op, n_outputs=1, output_dtypes=(None,), opset=opset)
    out = np.full(shape, np.nan, np.float32)
    got = entry.fn(*inputs, out=out, **kw)
    assert got is out
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    for other in (x, np.empty((shape[0], shape[1] * shape[2]), np.float32)):  # (the input itself; another shape)
        before = other.copy()
        got = entry.fn(*inputs, out=other, **kw)
        assert got is not other
        np.testing.assert_array_equal(other, before)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_rejects_bad_attributes():
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="axis"):
        run_kernel("LayerNormalization", [x, np.ones(3, np.float32)], {"axis": 2})
    with pytest.raises(ValueError, match="stash_type"):
        run_kernel("LayerNormalization", [x, np.ones(3, np.float32)], {"stash_type": 7})
    with pytest.raises(ValueError, match="broadcast"):
        run_kernel("LayerNormalization", [x, np.ones(4, np.float32)])


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_lp_normalization(p, axis, dtype):
    rng = np.random.default_rng(80)
    check("LpNormalization", [rand(rng, (3, 4, 5), dtype)], {"p": p, "axis": axis})


def test_lp_normalization_zero_slice_stays_zero():
    x = np.array([[0, 0, 0], [1, -2, 3]], dtype=np.float32)
    for p in (1, 2):
        (y,) = check("LpNormalization", [x], {"p": p})
        assert not np.isnan(y).any()


def test_lp_normalization_rejects_p3():
    with pytest.raises(ValueError, match="p must be"):
        run_kernel("LpNormalization", [np.ones((2, 3), np.float32)], {"p": 3})


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 9])
@pytest.mark.parametrize("opset", [1, 13])
def test_lrn(size, opset):
    rng = np.random.default_rng(90)
    # onnxruntime only accepts odd sizes; ONNX allows any, so even sizes are
    # checked against the onnx reference evaluator (whose channel loop runs
    # over the batch axis, hence N == C there).
    engine = "onnxruntime" if size % 2 else "onnx-reference"
    shape = (2, 6, 3, 4) if size % 2 else (6, 6, 3, 4)
    attrs = {"size": size, "alpha": 1e-2, "beta": 0.6, "bias": 1.5}
    check("LRN", [rand(rng, shape)], attrs, opset=opset, engine=engine)


def test_lrn_defaults_float16_and_errors():
    rng = np.random.default_rng(91)
    check("LRN", [rand(rng, (1, 5, 3, 3))], {"size": 3})
    check("LRN", [rand(rng, (1, 5, 3, 3), np.float16)], {"size": 3})
    with pytest.raises(ValueError, match="size"):
        run_kernel("LRN", [rand(rng, (1, 5, 3, 3))], {})


# --------------------------------------------------------------------------- softmax family


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -3])
def test_softmax_family(op, opset, axis):
    if opset == 1 and axis is not None and axis < 0:
        pytest.skip("negative axis is only valid from opset 11")
    rng = np.random.default_rng(100)
    x = rand(rng, (2, 3, 4)) * 3
    attrs = {} if axis is None else {"axis": axis}
    check(op, [x], attrs, opset=opset)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_softmax_dtypes(op, dtype):
    rng = np.random.default_rng(101)
    check(op, [rand(rng, (3, 5), dtype)], {"axis": 1})


def test_softmax_opsets_really_differ():
    x = np.random.default_rng(102).standard_normal((2, 3, 4)).astype(np.float32)
    old = run_kernel("Softmax", [x], {"axis": 1}, opset=11)[0]
    new = run_kernel("Softmax", [x], {"axis": 1}, opset=13)[0]
    np.testing.assert_allclose(old.reshape(2, -1).sum(axis=1), 1, rtol=1e-5)
    np.testing.assert_allclose(new.sum(axis=1), 1, rtol=1e-5)
    assert not np.allclose(old, new)


def test_softmax_large_values_and_ties():
    x = np.array([[1000.0, 1000.0, -1000.0], [3.0, 3.0, 3.0]], dtype=np.float32)
    check("Softmax", [x], opset=13)
    check("LogSoftmax", [x], opset=13)
    check("Hardmax", [x], opset=13)  # ties: first maximum wins


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
def test_softmax_rejects_bad_axis(op):
    with pytest.raises(ValueError, match="axis"):
        run_kernel(op, [np.zeros((2, 3), np.float32)], {"axis": 2}, opset=13)
    with pytest.raises(ValueError, match="axis"):
        run_kernel(op, [np.zeros((2, 3), np.float32)], {"axis": -3}, opset=11)


# --------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("opset", [12, 13, 22])
@pytest.mark.parametrize("n_outputs", [1, 2])
def test_dropout_inference(opset, n_outputs):
    rng = np.random.default_rng(110)
    check("Dropout", [rand(rng, (2, 3))], opset=opset, n_outputs=n_outputs)


@pytest.mark.parametrize("opset,mask_dtype", [(7, np.float32), (10, np.bool_)])
def test_dropout_legacy_mask(opset, mask_dtype):
    # Output 0 matches onnxruntime.  For the mask, onnxruntime's opset 7-11
    # kernels emit zeros, while the ONNX reference evaluator (and opset 12+
    # onnxruntime) report "kept" = ones; minirt reports ones at every opset.
    rng = np.random.default_rng(112)
    x = rand(rng, (2, 3))
    y, mask = run_kernel("Dropout", [x], {"ratio": 0.3}, n_outputs=2, opset=opset)
    ref_y, ref_mask = _reference("Dropout", [x], {"ratio": 0.3}, 2, opset)
    np.testing.assert_array_equal(y, ref_y)
    assert mask.dtype == ref_mask.dtype == mask_dtype
    assert mask.shape == x.shape and np.all(mask == 1)
    assert len(run_kernel("Dropout", [x], {"ratio": 0.3}, n_outputs=1, opset=opset)) == 1


def test_dropout_opset12_inputs():
    rng = np.random.default_rng(111)
    x = rand(rng, (2, 3))
    ratio = np.array(0.4, dtype=np.float32)
    check("Dropout", [x, ratio], opset=13, n_outputs=2)
    check("Dropout", [x, ratio, np.array(False)], opset=13, n_outputs=2)
    # training_mode with ratio 0 is still the identity
    y, mask = run_kernel("Dropout", [x, np.array(0.0, np.float32), np.array(True)], opset=13, n_outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()


def test_dropout_old_opsets():
    x = np.ones((2, 2), np.float32)
    for opset, attrs in [(1, {"is_test": 1, "consumed_inputs": [0]}), (6, {"is_test": 1})]:
        y, mask = run_kernel("Dropout", [x], attrs, opset=opset, n_outputs=2)
        np.testing.assert_array_equal(y, x)
        assert mask.shape == x.shape


@pytest.mark.parametrize("ratio", [None, 0.2, 0.75])
def test_dropout_training_mode(ratio):
    x = np.random.default_rng(3).uniform(1, 2, (50, 40)).astype(np.float32)
    r = np.array(ratio, np.float32) if ratio is not None else None
    y, mask = run_kernel("Dropout", [x, r, np.array(True)], {"seed": 5}, opset=13, n_outputs=2)
    p = 0.5 if ratio is None else ratio
    assert mask.dtype == np.bool_ and y.dtype == np.float32
    assert abs(1 - mask.mean() - p) < 0.05
    np.testing.assert_allclose(y, np.where(mask, x / (1 - p), 0), rtol=1e-6)
    # the same seed gives the same mask; no seed gives fresh ones
    y2, mask2 = run_kernel("Dropout", [x, r, np.array(True)], {"seed": 5}, opset=13, n_outputs=2)
    np.testing.assert_array_equal(mask, mask2)
    if ratio is None:
        return  # the onnx reference evaluator cannot run Dropout without its ratio input
    # with a seed, the onnx reference evaluator draws the same mask (both use numpy's seeded Mersenne-Twister)
    ref_y, ref_mask = _reference("Dropout", [x, r, np.array(True)], {"seed": 5}, 2, 13, engine="onnx-reference")
    np.testing.assert_array_equal(mask, ref_mask)
    np.testing.assert_allclose(y, ref_y, rtol=1e-6)


def test_fused_conv_geometry_cache_keys_and_list_attributes():
    """conv_fused_native derives its geometry per call here (no node memo) and from a node's memo in a
    session; list attributes and calls that differ only in pads or shapes must each get their own."""
    from minirt import native

    if not native.available:
        pytest.skip("native kernels not available")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 3, 7, 6)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    for pads in ((1, 1, 1, 1), (0, 0, 0, 0), [1, 0, 1, 0], (0, 2, 1, 0)):
        got = nn.conv_fused_native(x, w, pads=pads, activation="Relu")
        want = np.maximum(nn.conv(x, w, pads=tuple(pads)), 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    x2 = rng.standard_normal((2, 3, 9, 5)).astype(np.float32)
    got = nn.conv_fused_native(x2, w, pads=(1, 1, 1, 1), activation="Relu")
    np.testing.assert_allclose(got, np.maximum(nn.conv(x2, w, pads=(1, 1, 1, 1)), 0), rtol=1e-5, atol=1e-5)
    # an invalid geometry is not fused (the standard kernel reports it)
    assert nn.conv_fused_native(x, w, pads=(1, 1), activation="Relu") is None
