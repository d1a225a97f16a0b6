"""Integer attributes at their extremes (issue 22), beyond the window operations
(tests/test_window_geometry_limits.py): axes, block sizes, sizes and counts that select a native path or
size a result.  Each op, with one attribute at 0, 1, -1, 2^31 - 1, 2^31, 2^62 or 2^63 - 1 (its other
attributes ordinary), gives either a clean ``minirt.Error`` or the result onnxruntime gives (onnx's
reference evaluator where onnxruntime refuses the model); never a signal, a hang or a foreign exception,
nothing run that both refuse."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP

import minirt
from tests import single_node

EXTREMES = [0, 1, -1, (1 << 31) - 1, 1 << 31, 1 << 62, (1 << 63) - 1]
RNG = np.random.default_rng(0)
X4 = RNG.standard_normal((1, 4, 4, 6)).astype(np.float32)
X3 = RNG.standard_normal((2, 3, 4)).astype(np.float32)

# name -> (op, x, constant inputs, base attributes, {attribute: how to set it from a value}, opset)
_int = lambda v: v  # noqa: E731
OPS = {
    "Softmax": ("Softmax", X3, [], {}, {"axis": _int}, 13),
    "LogSoftmax": ("LogSoftmax", X3, [], {}, {"axis": _int}, 13),
    "Flatten": ("Flatten", X3, [], {}, {"axis": _int}, 13),
    "Concat": ("Concat", X3, [X3], {"axis": 0}, {"axis": _int}, 13),
    "Gather": ("Gather", X3, [np.array([1, 0], np.int64)], {}, {"axis": _int}, 13),
    "ArgMax": ("ArgMax", X3, [], {}, {"axis": _int}, 13),
    "ReduceMean": ("ReduceMean", X3, [], {}, {"keepdims": _int}, 13),
    "LayerNormalization": ("LayerNormalization", X3, [np.ones(4, np.float32), np.zeros(4, np.float32)], {},
                           {"axis": _int}, 17),
    "DepthToSpace": ("DepthToSpace", X4, [], {"blocksize": 2}, {"blocksize": _int}, 13),
    "SpaceToDepth": ("SpaceToDepth", X4, [], {"blocksize": 2}, {"blocksize": _int}, 13),
    "LRN": ("LRN", X4, [], {"size": 3}, {"size": _int}, 13),
    "Transpose": ("Transpose", X3, [], {}, {"perm": lambda v: [v, 1, 0]}, 13),
    "Split": ("Split", X3, [np.array([1, 2], np.int64)], {"axis": 1}, {"axis": _int}, 13),
    "CumSum": ("CumSum", X3, [np.array(1, np.int64)], {}, {"exclusive": _int}, 14),
    "GatherElements": ("GatherElements", X3, [np.zeros((2, 3, 4), np.int64)], {}, {"axis": _int}, 13),
    "TopK": ("TopK", X3, [np.array([2], np.int64)], {}, {"axis": _int}, 11),
}


OUT_TYPES = {"ArgMax": (TP.INT64,), "TopK": (TP.FLOAT, TP.INT64), "Split": (TP.FLOAT, TP.FLOAT)}


CASES = [(name, attr, v) for name, spec in OPS.items() for attr in spec[4] for v in EXTREMES]


@pytest.mark.parametrize("name,attr,value", CASES, ids=[f"{n}-{a}-{v}" for n, a, v in CASES])
def test_extreme_attribute_gives_a_clean_error_or_the_reference(name, attr, value):
    op, x, consts, base, setters, opset = OPS[name]
    attrs = dict(base, **{attr: setters[attr](value)})
    out_types = OUT_TYPES.get(op, (TP.FLOAT,))
    data = single_node.artifact(op, x, consts, attrs, opset, len(out_types))
    try:
        got = minirt.Session(data, max_tensor_bytes=64 << 20).run(None, {"x": x})
    except minirt.Error:
        return
    ref = single_node.reference(op, x, consts, attrs, opset, out_types)
    assert ref is not None, f"minirt ran {op} with {attr}={value}, which onnxruntime and the reference refuse"
    for a, b in zip(got, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
