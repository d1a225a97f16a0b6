"""Tests for shape_specialisation: input shapes become static and propagate; bad shapes are errors."""
import numpy as np
import pytest
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.manager import OptimizeContext
from minirt.builder.passes.shape_specialisation import ShapeSpecialisation


def _m():
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Flatten", ["r"], ["y"], axis=1)]
    return T.make_model(nodes, [T.vinfo("x", ["n", 3, "h", "w"])], [T.vinfo("y", ["n", "k"])])


def test_fixes_dims_and_reinfers():
    m = T.load(_m())
    p = ShapeSpecialisation(OptimizeContext(input_shapes={"x": (2, 3, 4, 5)}))
    assert p(m).modified
    assert tuple(m.graph.outputs[0].shape) == (2, 60)
    assert not p(m).modified  # once per model


def test_no_shapes_is_a_no_op():
    m = T.load(_m())
    assert not ShapeSpecialisation()(m).modified


def test_conflicting_shape_is_an_error():
    m = T.load(_m())
    with pytest.raises(ValueError, match="fixed to 3"):
        ShapeSpecialisation(OptimizeContext(input_shapes={"x": (2, 4, 4, 5)}))(m)
    with pytest.raises(ValueError, match="rank"):
        ShapeSpecialisation(OptimizeContext(input_shapes={"x": (2, 3)}))(T.load(_m()))
    with pytest.raises(ValueError, match="inputs are"):
        ShapeSpecialisation(OptimizeContext(input_shapes={"nope": (1,)}))(T.load(_m()))


def test_parity():
    T.run_both(_m(), {"x": np.ones((2, 3, 4, 5), np.float32)}, input_shapes={"x": (2, 3, 4, 5)})


def _computed_pad_model():
    """A Pad whose pads are computed from a Shape through ConstantOfShape (which ONNX data propagation
    does not follow, as in Silero VAD's STFT front), then a Shape of the padded tensor."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["w"], axis=0),
        h.make_node("Sub", ["eight", "w"], ["gap"]),
        h.make_node("Unsqueeze", ["gap", "zero1"], ["gap1"]),
        h.make_node("ConstantOfShape", ["three"], ["zeros"], value=h.make_tensor("v", 7, [1], [0])),
        h.make_node("Concat", ["zeros", "gap1"], ["pads"], axis=0),
        h.make_node("Pad", ["x", "pads"], ["p"]),
        h.make_node("Shape", ["p"], ["ps"]),
        h.make_node("Cast", ["ps"], ["psf"], to=1),
        h.make_node("ReduceSum", ["p", "one1"], ["r"], keepdims=0),
        h.make_node("Mul", ["r", "psf"], ["y"]),
    ]
    inits = [h.make_tensor("one", 7, [], [1]), h.make_tensor("eight", 7, [], [8]),
             h.make_tensor("zero1", 7, [1], [0]), h.make_tensor("three", 7, [1], [3]),
             h.make_tensor("one1", 7, [1], [1])]
    return T.make_model(nodes, [T.vinfo("x", [1, "w"])], [T.vinfo("y", [2])], inits)


def test_shapes_past_folded_shape_arithmetic_are_inferred_and_fold():
    """After the first inference the pads fold to a constant; inferring again gives the Pad its
    shape, and the Shape after it folds too: no Shape node is left."""
    m, report = T.optimized(_computed_pad_model(), 2, input_shapes={"x": (1, 5)})
    assert not [n for n in m.graph if n.op_type == "Shape"]
    T.run_both(_computed_pad_model(), {"x": np.arange(5, dtype=np.float32).reshape(1, 5)},
               input_shapes={"x": (1, 5)})
