"""Core ML lowering of what onnx's "light" model zoo (tests/test_real_models.py) needs besides convs:
LRN (GoogLeNet, AlexNet, ZFNet), Softmax-1/11 over flattened axes (a classifier's [1, 1000, 1, 1]),
and weights made by ConstantOfShape (every weight of that zoo; constant folding keeps the large ones
as nodes): each program is built and converted, read back, run on the MIL evaluator
(minirt/tools/mil_eval.py) and compared with onnxruntime (tests/coreml/test_rules.py's check)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("coremltools")
pytest.importorskip("onnxruntime")

from tests.coreml.test_rules import _model, check, lower_whole  # noqa: E402
from tests.coreml.test_rules_data_rnn import _refusal  # noqa: E402

RNG = np.random.default_rng(2728)


def _ops(prog) -> list:
    return [op.op_type for op in prog.functions["main"].operations]


@pytest.mark.parametrize("size, shape", [(5, (1, 9, 6, 7)), (3, (2, 4, 5, 5)), (1, (1, 3, 4, 4))])
def test_lrn(size, shape):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    m = _model([helper.make_node("LRN", ["x"], ["y"], size=size, alpha=1e-2, beta=0.75, bias=2.0)], [("x", shape)], ["y"])
    prog = check(m, {"x": x})
    assert "local_response_norm" in _ops(prog)
    check(m, {"x": x}, precision="fp16", tol=3e-2)


def test_lrn_even_size_refused():
    m = _model([helper.make_node("LRN", ["x"], ["y"], size=4)], [("x", (1, 6, 3, 3))], ["y"])
    assert "even size 4" in _refusal(m)


@pytest.mark.parametrize("opset, axis, shape", [(11, 1, (1, 10, 1, 1)), (9, 1, (2, 3, 4, 5)), (11, 2, (2, 3, 4, 5))])
def test_softmax_over_flattened_axes(opset, axis, shape):
    x = RNG.standard_normal(shape).astype(np.float32) * 2
    m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [("x", shape)], ["y"], opset=opset)
    prog = check(m, {"x": x})
    assert _ops(prog).count("reshape") == 2


def test_log_softmax_over_flattened_axes_still_refused():
    m = _model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)], [("x", (2, 3, 4))], ["y"], opset=11)
    assert "flattened axes" in _refusal(m)


def test_constant_of_shape_weights():
    """A conv whose weight and bias come from ConstantOfShape and an Add of a filled tensor: the program
    embeds the filled weight as a conv constant (check() looks for it) and the node lowers to nothing."""
    fill = lambda v: helper.make_tensor("value", TensorProto.FLOAT, [1], [v])  # noqa: E731
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"], value=fill(0.02)),
             helper.make_node("ConstantOfShape", ["bshape"], ["b"], value=fill(-0.5)),
             helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("ConstantOfShape", ["ashape"], ["a"], value=fill(0.25)),
             helper.make_node("Add", ["c", "a"], ["y"])]
    inits = [numpy_helper.from_array(np.array(s, np.int64), n)
             for n, s in (("wshape", [4, 3, 3, 3]), ("bshape", [4]), ("ashape", [1, 4, 6, 6]))]
    m = _model(nodes, [("x", (1, 3, 6, 6))], ["y"], inits)
    part, _, _, _ = lower_whole(m)
    assert [v.name for v in part.inputs] == ["x"]  # the filled values are constants, not inputs
    prog = check(m, {"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)})
    assert "conv" in _ops(prog)
