"""Tests for recognise_one_hot_matmul: MatMul(Cast(Equal(ids, 0..K-1)), W) [+ bias, activation] -> RowLookup."""
import numpy as np
import onnx
from onnx import helper as h

from minirt.builder.passes import testing as T
from minirt.builder.passes.recognise_one_hot_matmul import RecogniseOneHotMatMul

R = np.random.default_rng(11)
K, D, N = 9, 6, 12
W = R.standard_normal((K, D)).astype(np.float32)
BIAS = R.standard_normal((1, 1, D)).astype(np.float32)
# ids inside the classes and outside them (negative, K, far past): an outside id's one-hot row is zeros
IDS = np.array([[0, 3, 8, -1, K, 1000, 5, 5, 2, -7, 1, 7]], np.int32)


def _model(ids_type=onnx.TensorProto.INT32, classes=None, w=W, tail=("Add", "Gelu"), equal_swapped=False,
           bias=BIAS):
    classes = np.arange(K, dtype=np.int32 if ids_type == onnx.TensorProto.INT32 else np.int64).reshape(1, 1, K) \
        if classes is None else classes
    eq_inputs = ["classes", "r"] if equal_swapped else ["r", "classes"]
    nodes = [h.make_node("Reshape", ["ids", "shape"], ["r"]),
             h.make_node("Equal", eq_inputs, ["eq"]),
             h.make_node("Cast", ["eq"], ["oh"], to=onnx.TensorProto.FLOAT),
             h.make_node("MatMul", ["oh", "w"], ["p"])]
    inits = [T.tensor("shape", np.array([1, N, 1], np.int64)), T.tensor("classes", classes), T.tensor("w", w)]
    last = "p"
    if "Add" in tail:
        nodes.append(h.make_node("Add", [last, "bias"], ["pb"]))
        inits.append(T.tensor("bias", bias))
        last = "pb"
    if "Gelu" in tail:  # the tanh form as torch writes it: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        nodes += [h.make_node("Mul", [last, last], ["x2"]), h.make_node("Mul", ["x2", last], ["x3"]),
                  h.make_node("Mul", ["x3", "c"], ["cx3"]), h.make_node("Add", [last, "cx3"], ["in0"]),
                  h.make_node("Mul", ["in0", "s"], ["in1"]), h.make_node("Tanh", ["in1"], ["t"]),
                  h.make_node("Add", ["t", "one"], ["t1"]), h.make_node("Mul", [last, "t1"], ["xt"]),
                  h.make_node("Mul", ["xt", "half"], ["g"])]
        inits += [T.tensor("c", np.float32(0.044715)), T.tensor("s", np.float32(np.sqrt(2 / np.pi))),
                  T.tensor("one", np.float32(1.0)), T.tensor("half", np.float32(0.5))]
        last = "g"
    nodes.append(h.make_node("Identity", [last], ["y"]))
    return T.make_model(nodes, [T.vinfo("ids", [1, N], ids_type)], [T.vinfo("y", [1, N, D])], inits)


def _reference(ids, w=W, bias=BIAS):
    """numpy, written from the pattern's meaning: one-hot rows (zeros for an id outside 0..K-1) times W."""
    onehot = (ids.reshape(1, N, 1) == np.arange(K).reshape(1, 1, K)).astype(np.float32)
    return onehot @ w + bias


def test_one_hot_product_bias_and_gelu_become_one_lookup():
    # (within rounding: recognise_activations makes the Gelu chain one native activation, computed otherwise)
    m, report, (y,) = T.run_both(_model(), {"ids": IDS})
    assert T.ops(m)["com.minirt::RowLookup"] == 1
    assert not {"Equal", "Cast", "MatMul", "Add", "Tanh", "com.minirt::Activation"} & set(T.ops(m))
    x = _reference(IDS)
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    np.testing.assert_allclose(y, gelu, rtol=1e-5, atol=1e-6)
    # an id outside the classes reads the folded row of zeros: gelu(0 + bias)
    np.testing.assert_array_equal(y[0, 3], y[0, 4])
    np.testing.assert_array_equal(y[0, 3], y[0, 5])


def test_int64_ids_swapped_equal_and_no_tail():
    ids = IDS.astype(np.int64)
    m, _, (y,) = T.run_both(_model(onnx.TensorProto.INT64, tail=(), equal_swapped=True), {"ids": ids}, rtol=0, atol=0)
    assert T.ops(m) == {"Reshape": 1, "com.minirt::RowLookup": 1}
    np.testing.assert_array_equal(y, _reference(ids, bias=0))


def test_a_bias_per_position_stays_an_add():
    bias = R.standard_normal((1, N, D)).astype(np.float32)  # (varies along the ids' axis, not only along D)
    m, _, _ = T.run_both(_model(tail=("Add",), bias=bias), {"ids": IDS}, rtol=0, atol=0)
    assert T.ops(m)["com.minirt::RowLookup"] == 1 and T.ops(m)["Add"] == 1


def test_near_misses_are_refused_with_the_reason():
    w_inf = W.copy()
    w_inf[2, 1] = np.inf
    for model, why in [(_model(classes=np.arange(1, K + 1, dtype=np.int32).reshape(1, 1, K)), "0, 1, ..., K - 1"),
                       (_model(w=w_inf, tail=()), "infinity or NaN")]:
        m = T.load(model)
        p = RecogniseOneHotMatMul()
        assert not p(m).modified
        assert why in p.refusals[0].reason
        T.run_both(model, {"ids": IDS})
