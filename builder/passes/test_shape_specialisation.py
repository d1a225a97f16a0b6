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
