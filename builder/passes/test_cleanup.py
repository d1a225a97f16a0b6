"""Tests for cleanup: each table rule fires on its pattern and not on near misses."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import optimize, testing as T
from minirt.builder.passes.cleanup import Cleanup
from minirt.builder.passes.dce import DeadCodeElimination

X = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)


def _clean(model):
    m = T.load(model)
    changed = Cleanup()(m).modified
    DeadCodeElimination()(m)
    return m, changed


def _m(nodes, inits=(), out_shape=(2, 3, 4), opset=17):
    return T.make_model(nodes, [T.vinfo("x", [2, 3, 4])], [T.vinfo("y", list(out_shape))], inits, opset=opset)


def test_identity_dropout_cast_removed():
    nodes = [h.make_node("Identity", ["x"], ["a"]), h.make_node("Dropout", ["a"], ["b"]),
             h.make_node("Cast", ["b"], ["c"], to=onnx.TensorProto.FLOAT), h.make_node("Relu", ["c"], ["y"])]
    m, changed = _clean(_m(nodes))
    assert changed and T.ops(m) == {"Relu": 1}
    T.run_both(_m(nodes), {"x": X}, opt_level=1)


def test_cast_to_other_dtype_and_used_dropout_mask_kept():
    nodes = [h.make_node("Cast", ["x"], ["c"], to=onnx.TensorProto.DOUBLE), h.make_node("Cast", ["c"], ["d"], to=onnx.TensorProto.FLOAT),
             h.make_node("Relu", ["d"], ["y"])]
    m, changed = _clean(_m(nodes))
    assert not changed and T.ops(m)["Cast"] == 2  # float->double->float is not a no-op in general


def test_identity_between_input_and_output_is_kept():
    m, changed = _clean(_m([h.make_node("Identity", ["x"], ["y"])]))
    assert not changed and T.ops(m) == {"Identity": 1}


def test_transpose_chain_collapses():
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Transpose", ["r"], ["a"], perm=[1, 0, 2]),
             h.make_node("Transpose", ["a"], ["y"], perm=[1, 0, 2])]
    m, changed = _clean(_m(nodes))
    assert changed and T.ops(m) == {"Relu": 1}
    nodes = [h.make_node("Transpose", ["x"], ["a"], perm=[1, 0, 2]), h.make_node("Transpose", ["a"], ["y"], perm=[0, 2, 1])]
    m, _ = _clean(_m(nodes, out_shape=(3, 4, 2)))
    assert T.ops(m) == {"Transpose": 1}
    T.run_both(_m(nodes, out_shape=(3, 4, 2)), {"x": X}, opt_level=1)


def test_reshape_same_shape_and_chain():
    s = T.tensor("s", np.array([2, 3, 4], np.int64))
    m, changed = _clean(_m([h.make_node("Relu", ["x"], ["r"]), h.make_node("Reshape", ["r", "s"], ["y"])], [s]))
    assert changed and T.ops(m) == {"Relu": 1}
    s1, s2 = T.tensor("s1", np.array([6, 4], np.int64)), T.tensor("s2", np.array([4, 6], np.int64))
    nodes = [h.make_node("Reshape", ["x", "s1"], ["a"]), h.make_node("Reshape", ["a", "s2"], ["y"])]
    m, changed = _clean(_m(nodes, [s1, s2], out_shape=(4, 6)))
    assert changed and T.ops(m) == {"Reshape": 1}
    T.run_both(_m(nodes, [s1, s2], out_shape=(4, 6)), {"x": X}, opt_level=1)


def test_reshape_with_zero_copy_dim_not_collapsed():
    s1, s2 = T.tensor("s1", np.array([6, 4], np.int64)), T.tensor("s2", np.array([0, 2, 2], np.int64))
    nodes = [h.make_node("Reshape", ["x", "s1"], ["a"]), h.make_node("Reshape", ["a", "s2"], ["y"])]
    m, _ = _clean(_m(nodes, [s1, s2], out_shape=(6, 2, 2)))
    assert T.ops(m) == {"Reshape": 2}


def test_neutral_arithmetic():
    one, zero = T.tensor("one", np.ones((1, 1), np.float32)), T.tensor("zero", np.zeros((), np.float32))
    nodes = [h.make_node("Mul", ["x", "one"], ["a"]), h.make_node("Add", ["zero", "a"], ["b"]), h.make_node("Relu", ["b"], ["y"])]
    m, changed = _clean(_m(nodes, [one, zero]))
    assert changed and T.ops(m) == {"Relu": 1}


def test_broadcasting_neutral_operand_is_kept():
    big = T.tensor("one", np.ones((5, 2, 3, 4), np.float32))  # x * ones broadcasts x up: not x
    m, changed = _clean(T.make_model([h.make_node("Mul", ["x", "one"], ["y"])], [T.vinfo("x", [2, 3, 4])],
                                     [T.vinfo("y", [5, 2, 3, 4])], [big]))
    assert not changed and T.ops(m) == {"Mul": 1}
    two = T.tensor("two", np.full((1,), 2, np.float32))
    m, changed = _clean(_m([h.make_node("Mul", ["x", "two"], ["y"])], [two]))
    assert not changed


def test_twice_changes_nothing():
    nodes = [h.make_node("Identity", ["x"], ["a"]), h.make_node("Relu", ["a"], ["y"])]
    m = T.load(_m(nodes))
    optimize(m, 1)
    assert not Cleanup()(m).modified


def _resize_model(mode, ctm, out_hw, extra=None):
    """x (1, 2, 5, 6) -> Resize to (1, 2) + out_hw by sizes -> Neg -> y (a node after it: a graph input is
    never renamed to an output)."""
    sizes = h.make_tensor("sizes", onnx.TensorProto.INT64, [4], [1, 2, *out_hw])
    roi = h.make_tensor("roi", onnx.TensorProto.FLOAT, [8], [0, 0, 0.1, 0.1, 1, 1, 0.9, 0.9])
    nodes = [h.make_node("Resize", ["x", "roi", "", "sizes"], ["r"], mode=mode, coordinate_transformation_mode=ctm,
                         **(extra or {})), h.make_node("Neg", ["r"], ["y"])]
    return T.make_model(nodes, [T.vinfo("x", [1, 2, 5, 6])], [T.vinfo("y", [1, 2, *out_hw])], [sizes, roi], opset=19)


def test_resize_to_its_own_shape_removed_and_exact():
    """Scale 1 samples every point at itself: the rule removes the Resize, and onnxruntime's Resize of the
    same model returns its input bit for bit (every mode, the coordinate transformations, antialias)."""
    import onnxruntime as ort

    x = np.random.default_rng(3).standard_normal((1, 2, 5, 6)).astype(np.float32)
    cases = [("linear", "half_pixel", None), ("linear", "pytorch_half_pixel", None), ("nearest", "asymmetric", None),
             ("cubic", "align_corners", None), ("linear", "half_pixel_symmetric", None),
             ("linear", "half_pixel", {"antialias": 1}), ("cubic", "half_pixel", {"exclude_outside": 1})]
    for mode, ctm, extra in cases:
        model = _resize_model(mode, ctm, (5, 6), extra)
        m, changed = _clean(model)
        assert changed and "Resize" not in T.ops(m), (mode, ctm, extra)
        y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, -x)


def test_resize_that_changes_the_shape_or_crops_kept():
    for model in (_resize_model("linear", "half_pixel", (10, 12)), _resize_model("linear", "tf_crop_and_resize", (5, 6))):
        m, changed = _clean(model)
        assert not changed and T.ops(m)["Resize"] == 1
