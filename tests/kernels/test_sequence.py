"""Sequence / optional kernels, inside models whose graph inputs and outputs are tensors
(the Session binds and returns tensors only), compared with onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.kernels.model_run import minirt_run, reference_run

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _run_both(nodes, inputs, outputs, feeds, opset=18):
    graph = helper.make_graph(nodes, "seq", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    expected = reference_run(model, feeds)
    actual = minirt_run(model, feeds)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        np.testing.assert_allclose(a, e)


@pytest.mark.parametrize("keepdims, new_axis", [(1, 0), (0, 1)])
def test_split_to_sequence_then_concat(keepdims, new_axis):
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    _run_both(
        [helper.make_node("SplitToSequence", ["x"], ["seq"], axis=1, keepdims=keepdims),
         helper.make_node("ConcatFromSequence", ["seq"], ["y"], axis=1, new_axis=new_axis)],
        [helper.make_tensor_value_info("x", F, [2, 3, 4])],
        [helper.make_tensor_value_info("y", F, [None, None, None])],
        {"x": x},
    )


def test_construct_insert_erase_at_length():
    a = np.ones((2,), np.float32)
    b = np.full((3,), 2.0, np.float32)

    def const(name, v):
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, I64, [], [v]))

    _run_both(
        [const("zero", 0), const("one", 1), const("minus_one", -1),
         helper.make_node("SequenceConstruct", ["a", "b"], ["s1"]),
         helper.make_node("SequenceInsert", ["s1", "b", "zero"], ["s2"]),
         helper.make_node("SequenceErase", ["s2", "minus_one"], ["s3"]),
         helper.make_node("SequenceAt", ["s3", "one"], ["y"]),
         helper.make_node("SequenceLength", ["s3"], ["n"])],
        [helper.make_tensor_value_info("a", F, [2]), helper.make_tensor_value_info("b", F, [3])],
        [helper.make_tensor_value_info("y", F, [None]), helper.make_tensor_value_info("n", I64, [])],
        {"a": a, "b": b},
    )


def test_optional_has_and_get_element():
    x = np.arange(3, dtype=np.float32)
    _run_both(
        [helper.make_node("Optional", ["x"], ["opt"]),
         helper.make_node("OptionalHasElement", ["opt"], ["has"]),
         helper.make_node("OptionalGetElement", ["opt"], ["y"])],
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("has", TensorProto.BOOL, []), helper.make_tensor_value_info("y", F, [3])],
        {"x": x},
    )
