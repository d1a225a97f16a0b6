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
    """x -> Pad(pads = Cast(Cast(Shape(x), float) * 0, int64)) -> Relu -> r; Shape(r) as the second output.
    Inference cannot see through the float Mul, so the pads (and every shape after the Pad) are unknown
    until folding makes them zeros and cleanup drops the Pad: SSDlite's transform in miniature."""
    f = 1  # FLOAT
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Cast", ["s"], ["sf"], to=f),
        h.make_node("Mul", ["sf", "zero"], ["zf"]),
        h.make_node("Cast", ["zf"], ["z"], to=7),
        h.make_node("Concat", ["z", "z"], ["pads"], axis=0),
        h.make_node("Pad", ["x", "pads"], ["p"]),
        h.make_node("Relu", ["p"], ["y"]),
        h.make_node("Shape", ["y"], ["ys"]),
    ]
    zero = h.make_tensor("zero", f, [], [0.0])
    return T.make_model(nodes, [T.vinfo("x", ["n", 3, "h", "w"])], [T.vinfo("y", ["a", "b", "c", "d"]), T.vinfo("ys", [4], 7)],
                        initializers=[zero])


def test_folding_rounds_make_shapes_after_a_computed_pad_static():
    m = T.load(_computed_pad_model())
    assert ShapeSpecialisation(OptimizeContext(input_shapes={"x": (1, 3, 8, 8)}))(m).modified
    assert "Pad" not in T.ops(m) and "Shape" not in T.ops(m)  # (Shape(y) folded once y's shape was static)
    assert tuple(m.graph.outputs[0].shape) == (1, 3, 8, 8)


def test_folding_rounds_leave_disabled_passes_out():
    m = T.load(_computed_pad_model())
    context = OptimizeContext(input_shapes={"x": (1, 3, 8, 8)}, disabled=frozenset({"constant_folding"}))
    ShapeSpecialisation(context)(m)
    assert "Pad" in T.ops(m)


def test_folding_rounds_parity():
    T.run_both(_computed_pad_model(), {"x": np.ones((1, 3, 8, 8), np.float32)}, input_shapes={"x": (1, 3, 8, 8)})
