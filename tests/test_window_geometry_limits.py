"""Extreme window attributes (issue 22): every window operation that reaches the native kernels (Conv, a
depthwise Conv, ConvTranspose, MaxPool, AveragePool, LpPool), with each of its strides,
pads, dilations, kernel shape and group set to 0, 1, -1, 2^31 - 1, 2^31, 2^62 or 2^63 - 1, gives either
a clean ``minirt.Error`` (never a signal, never a foreign exception) or the result onnxruntime gives
(onnx's reference evaluator where onnxruntime refuses the model).  The geometry that reaches C is checked in one place, minirt.native.check_geometry, and
again in C (geometry_overflows in kernels.c)."""
from __future__ import annotations

import numpy as np
import pytest

import minirt
from minirt import native
from tests import single_node

EXTREMES = [0, 1, -1, 2, (1 << 31) - 1, 1 << 31, 1 << 62, (1 << 63) - 1]
X = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)

# op -> (constant inputs after x, base attributes, the attributes to push to the extremes, opset)
W = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
WDW = np.random.default_rng(2).standard_normal((2, 1, 3, 3)).astype(np.float32)
WT = np.random.default_rng(3).standard_normal((2, 3, 2, 2)).astype(np.float32)
OPS = {
    "Conv": ([W], {"kernel_shape": [3, 3]}, ["strides", "pads", "dilations", "kernel_shape", "group"], 17),
    "Conv-depthwise": ([WDW], {"group": 2}, ["strides", "pads", "dilations", "group"], 17),
    "ConvTranspose": ([WT], {}, ["strides", "pads", "dilations", "output_padding"], 17),
    "MaxPool": ([], {"kernel_shape": [2, 2]}, ["strides", "pads", "dilations", "kernel_shape"], 12),
    "AveragePool": ([], {"kernel_shape": [2, 2]}, ["strides", "pads", "kernel_shape"], 19),
    "LpPool": ([], {"kernel_shape": [2, 2]}, ["strides", "pads", "kernel_shape"], 18),
}


def _values(attr: str, v: int):
    return v if attr == "group" else [v] * (4 if attr == "pads" else 2)


CASES = [(name, attr, v) for name, (_, _, attrs, _) in OPS.items() for attr in attrs for v in EXTREMES]


@pytest.mark.parametrize("name,attr,value", CASES, ids=[f"{n}-{a}-{v}" for n, a, v in CASES])
def test_extreme_window_attributes_give_a_clean_error_or_the_reference(name, attr, value):
    op = name.split("-")[0]
    consts, base, _, opset = OPS[name]
    attrs = dict(base, **{attr: _values(attr, value)})
    data = single_node.artifact(op, X, consts, attrs, opset)  # (every value here fits the format's int64)
    try:
        got = minirt.Session(data, max_tensor_bytes=64 << 20).run(None, {"x": X})[0]
    except minirt.Error:
        return  # a clean, named error: what a model the kernels cannot run must give (135 of the 184 cases)
    ref = single_node.reference(op, X, consts, attrs, opset)
    ref = None if ref is None else ref[0]
    assert ref is not None, f"minirt ran {name} with {attr}={value}, which onnxruntime and the reference refuse"
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)

@pytest.mark.skipif(not native.available, reason="native kernels not available")
@pytest.mark.parametrize("field,value", [("sh", (1 << 31) - 1), ("kh", 0), ("n", -1), ("c", 1 << 40),
                                         ("oh", (1 << 31) - 1)])
def test_check_geometry_refuses_what_the_kernels_cannot_compute(field, value):
    fields = {"n": 1, "c": 3, "h": 8, "w": 8, "m": 4, "group": 1, "kh": 3, "kw": 3, "sh": 1, "sw": 1, "dh": 1,
              "dw": 1, "pt": 1, "pl": 1, "oh": 8, "ow": 8}
    native.check_geometry(fields)  # an ordinary 3x3 conv passes
    fields[field] = value
    if field in ("sh", "oh"):  # (both axes: one huge stride or output side alone stays under 2^59)
        fields[{"sh": "sw", "oh": "ow"}[field]] = value
    with pytest.raises(minirt.UnsupportedGeometry, match="native kernels cannot take"):
        native.check_geometry(fields)
