"""com.minirt::RowLookup (minirt/kernels/row_lookup.py): numpy and native paths against a reference written
from the op's meaning (a one-hot row of each id, zeros for an id outside the classes, times the matrix, the
out-of-range row added where the one-hot row is all zeros), and replayed in a native program."""
import numpy as np
import onnx
import pytest
from onnx import helper as h

import minirt
from minirt import native
from minirt.kernels import row_lookup as rl

R = np.random.default_rng(5)


def _reference(ids, table):
    """sum over classes c of onehot(id)[c] * table[c], plus table[K] when the id is no class (float64)."""
    k = table.shape[0] - 1
    flat = ids.reshape(-1)
    onehot = (flat[:, None] == np.arange(k)[None, :]).astype(np.float64)
    rows = onehot @ table[:k].reshape(k, -1).astype(np.float64)
    rows += (onehot.sum(axis=1) == 0)[:, None] * table[k].reshape(1, -1)
    return rows.reshape(ids.shape[:-1] + table.shape[1:]).astype(table.dtype)


CASES = [((1, 16, 1), (258, 64)), ((3, 1), (5, 2, 3)), ((2, 3, 4, 1), (10, 7)), ((1,), (4, 8))]


@pytest.mark.parametrize("native_path", [False, True])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("ids_shape,table_shape", CASES)
def test_row_lookup_matches_the_one_hot_product(monkeypatch, native_path, id_dtype, ids_shape, table_shape):
    if native_path and not native.available:
        pytest.skip("native kernels not built")
    # the native copy is taken for big results or while a program records; force either way here
    monkeypatch.setattr(rl, "_worth", lambda nbytes: native_path)
    monkeypatch.setattr(native, "available", native.available and native_path)
    k = table_shape[0] - 1
    ids = R.integers(-3, k + 4, ids_shape).astype(id_dtype)  # (some ids outside 0..k-1 on purpose)
    ids.reshape(-1)[0] = np.iinfo(id_dtype).min  # extremes read the last row, wrap nowhere
    ids.reshape(-1)[-1] = np.iinfo(id_dtype).max
    table = R.standard_normal(table_shape).astype(np.float32)
    out = np.full(ids_shape[:-1] + table_shape[1:], np.nan, np.float32)
    y = rl.row_lookup(ids, table, out=out)
    np.testing.assert_array_equal(y, _reference(ids, table))
    if native_path:
        assert y is out  # (written into the memory plan's buffer)


def test_bad_inputs_say_what_was_expected():
    table = np.zeros((4, 2), np.float32)
    with pytest.raises(TypeError, match="int32 or int64"):
        rl.row_lookup(np.zeros((2, 1), np.float32), table)
    with pytest.raises(ValueError, match="last axis of size 1"):
        rl.row_lookup(np.zeros((2, 3), np.int32), table)
    with pytest.raises(ValueError, match="at least 2 axes"):
        rl.row_lookup(np.zeros((2, 1), np.int32), np.zeros(4, np.float32))


def test_a_built_one_hot_product_replays_as_a_native_program():
    if not native.available:
        pytest.skip("native kernels not built")
    from minirt.builder import build_bytes

    k, d, n = 257, 64, 2048  # (magika's byte embedding)
    w = R.standard_normal((k, d)).astype(np.float32)
    nodes = [h.make_node("Reshape", ["ids", "shape"], ["r"]), h.make_node("Equal", ["r", "classes"], ["eq"]),
             h.make_node("Cast", ["eq"], ["oh"], to=onnx.TensorProto.FLOAT), h.make_node("MatMul", ["oh", "w"], ["p"]),
             h.make_node("Relu", ["p"], ["q"]), h.make_node("Add", ["q", "q"], ["y"])]  # (the lookup's result
    # then sits in the memory plan's arena: a graph whose only node writes the output records no program)
    inits = [onnx.numpy_helper.from_array(np.array([1, n, 1], np.int64), "shape"),
             onnx.numpy_helper.from_array(np.arange(k, dtype=np.int32).reshape(1, 1, k), "classes"),
             onnx.numpy_helper.from_array(w, "w")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT32, [1, n])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, n, d])], initializer=inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    sess = minirt.Session(build_bytes(model))
    assert "RowLookup" in [o.op_type for o in sess._artifact.operators]
    ids = R.integers(-5, k + 5, (1, n)).astype(np.int32)
    for _ in range(3):  # (the warm-up recorded the program; these runs replay it)
        (y,) = sess.run(None, {"ids": ids})
    assert sess.native_program_status().startswith("yes"), sess.native_program_status()
    table = 2 * np.maximum(np.concatenate([w, np.zeros((1, d), np.float32)]), 0)
    np.testing.assert_array_equal(y, _reference(ids.reshape(1, n, 1), table))
