"""Tensor-manipulation kernels compared against onnxruntime, plus the attribute-coverage check."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from minirt import dtypes
from minirt.kernels import lookup, registered
from tests.kernels.test_elementwise import assert_same, check, rand, reference, run_kernel

I64 = np.int64
RNG = np.random.default_rng(1)


def i64(*v):
    return np.array(v, dtype=I64)


# --------------------------------------------------------------------------- registry-wide checks

_MY_MODULES = ("minirt.kernels.elementwise", "minirt.kernels.reduce", "minirt.kernels.tensor")


def _my_entries():
    return [e for e in registered() if e.fn.__module__ in _MY_MODULES]


@pytest.mark.parametrize("entry", _my_entries(), ids=lambda e: f"{e.op_type}-{e.since}")
def test_entry_accepts_every_schema_attribute(entry):
    schema = onnx.defs.get_schema(entry.op_type, entry.since, entry.domain)
    assert schema.since_version == entry.since, f"{entry.op_type}: no schema introduced at {entry.since}"
    if entry.attributes is not None:
        missing = set(schema.attributes) - entry.attributes
        assert not missing, f"{entry.op_type}-{entry.since} does not accept {sorted(missing)}"


def test_dtype_tables():
    for code, dt in dtypes.ONNX_TO_NUMPY.items():
        assert dtypes.NUMPY_TO_ONNX[dt] == code
        if code != 8:
            assert helper.tensor_dtype_to_np_dtype(code) == dt
    assert dtypes.onnx_type_name(1) == "float" and dtypes.onnx_type_name(11) == "double"
    assert dtypes.onnx_type_name(9) == "bool" and dtypes.onnx_type_name(8) == "string"
    # Narrow types resolve through ml_dtypes (tests/test_dtypes.py covers them); complex does not exist.
    assert dtypes.numpy_dtype(16).name == "bfloat16"
    with pytest.raises(ValueError):
        dtypes.numpy_dtype(14)


# --------------------------------------------------------------------------- shapes

DTYPES = [np.float32, np.float16, np.int32, np.int64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_and_shape_ops(dtype):
    x = rand((2, 3, 4), dtype)
    check("Identity", [x])
    check("Size", [x])
    check("Shape", [x], opset=13)
    for start, end in [(0, None), (1, None), (-2, None), (0, -1), (5, None), (-9, 2)]:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        check("Shape", [x], attrs, opset=15)


@pytest.mark.parametrize("shape,target,allowzero", [
    ((2, 3, 4), (6, 4), 0), ((2, 3, 4), (-1,), 0), ((2, 3, 4), (0, -1), 0), ((2, 3, 4), (0, 0, 2, 2), 0),
    ((2, 0, 4), (0, 8), 1), ((2, 3, 4), (4, -1, 2), 0),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_reshape(shape, target, allowzero, dtype):
    x = rand(shape, dtype)
    check("Reshape", [x, np.array(target, I64)], {"allowzero": allowzero}, opset=14)
    if not allowzero:
        check("Reshape", [x, np.array(target, I64)], opset=13)


def test_reshape_legacy_attr():
    out = run_kernel("Reshape", [rand((2, 6))], {"shape": (3, 4)}, opset=1)[0]
    assert out.shape == (3, 4)
    with pytest.raises(ValueError):
        run_kernel("Reshape", [rand((2, 6)), i64(5, -1)], opset=13)


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    check("Flatten", [rand((2, 3, 4))], {"axis": axis}, opset=13)


@pytest.mark.parametrize("perm", [None, (0, 1, 2, 3), (0, 2, 3, 1), (3, 2, 1, 0), (1, 0, 3, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose(perm, dtype):
    attrs = {} if perm is None else {"perm": perm}
    out = check("Transpose", [rand((2, 3, 4, 5), dtype)], attrs)[0]
    assert out.flags.c_contiguous


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_concat(axis, dtype):
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    check("Concat", [rand(s, dtype) for s in shapes], {"axis": axis}, opset=13)
    check("Concat", [rand((2, 3), dtype), rand((2, 1), dtype), rand((2, 0), dtype)], {"axis": 1}, opset=13)


def test_concat_legacy_default_axis():
    a, b = rand((2, 3)), rand((2, 2))
    np.testing.assert_array_equal(run_kernel("Concat", [a, b], opset=1)[0], np.concatenate([a, b], 1))


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("case", ["equal", "sizes", "neg_axis"])
def test_split(opset, case):
    x = rand((6, 4, 5))
    if case == "equal":
        inputs, attrs, n = [x], {"axis": 0}, 3
    elif case == "sizes":
        sizes = (1, 2, 2)
        inputs, attrs, n = ([x, np.array(sizes, I64)], {"axis": -1}, 3) if opset >= 13 else \
            ([x], {"axis": -1, "split": sizes}, 3)
    else:
        inputs, attrs, n = [x], {"axis": -2}, 2
    if opset >= 18 and len(inputs) == 1:
        attrs["num_outputs"] = n
    check("Split", inputs, attrs, opset=opset, n_outputs=n)


def test_split_uneven_opset18():
    check("Split", [rand((7, 3))], {"axis": 0, "num_outputs": 3}, opset=18, n_outputs=3)
    with pytest.raises(ValueError):
        run_kernel("Split", [rand((7, 3))], {"axis": 0}, opset=13, n_outputs=3)


@pytest.mark.parametrize("axes", [None, (0,), (2, 0), (-1,)])
def test_squeeze(axes):
    x = rand((1, 3, 1)) if axes != (-1,) else rand((2, 3, 1))
    inputs = [x] if axes is None else [x, np.array(axes, I64)]
    check("Squeeze", inputs, opset=13)
    attrs = {} if axes is None else {"axes": axes}
    check("Squeeze", [x], attrs, opset=11)
    with pytest.raises(ValueError):
        run_kernel("Squeeze", [rand((2, 3)), i64(0)], opset=13)


@pytest.mark.parametrize("axes", [(0,), (1, 0), (-1,), (0, 4), (3, -1, 1)])
def test_unsqueeze(axes):
    x = rand((2, 3))
    if len(axes) == 2 and 4 in axes:
        x = rand((2, 3, 4))
    check("Unsqueeze", [x, np.array(axes, I64)], opset=13)
    check("Unsqueeze", [x], {"axes": axes}, opset=11)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int32, np.int64, np.uint8, np.int8, np.bool_])
@pytest.mark.parametrize("to", [1, 10, 11, 2, 3, 6, 7, 9])
def test_cast(dtype, to):
    x = rand((3, 4), dtype, -100, 100)
    if np.dtype(dtype).kind == "f" and to in (2, 3, 6, 7):
        x = np.round(x)  # float -> int conversion of out-of-range values is undefined
        if to == 2:
            x = np.abs(x)
        if to == 3:
            x = np.clip(x, -100, 100)
    if np.dtype(dtype).kind == "i" and to == 2:
        x = np.abs(x)
    check("Cast", [x], {"to": to}, opset=13)
    check("CastLike", [x, np.zeros(1, dtypes.ONNX_TO_NUMPY[to])], opset=15)


def test_cast_strings():
    x = np.array([1.5, -2.0, 3.25], np.float32)
    s = check("Cast", [x], {"to": 8}, opset=13)[0]
    back = np.array(["1.5", "-2", "7"], dtype=object)
    check("Cast", [back], {"to": 1}, opset=13)
    check("Cast", [np.array(["1", "-2", "7"], dtype=object)], {"to": 7}, opset=13)
    assert s.dtype == object
    assert run_kernel("Cast", [x], {"to": "INT32"}, opset=1)[0].dtype == np.int32


@pytest.mark.parametrize("attrs", [
    {"value": numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
    {"value_float": 1.5}, {"value_floats": [1.0, 2.0]}, {"value_int": 7}, {"value_ints": [1, 2, 3]},
    {"value_string": "abc"}, {"value_strings": ["a", "b"]},
])
def test_constant(attrs):
    expected = reference("Constant", [], attrs, opset=13)[0]
    kw = dict(attrs)
    if "value" in kw:
        kw["value"] = numpy_helper.to_array(kw["value"])
    if "value_floats" in kw or "value_ints" in kw or "value_strings" in kw:
        kw = {k: tuple(v) for k, v in kw.items()}
    out = run_kernel("Constant", [], kw, opset=13)[0]
    if expected.dtype.kind in "OUS":
        assert out.dtype == object and out.shape == expected.shape
        assert out.tolist() == [str(v) for v in np.asarray(expected).reshape(-1)] or out.reshape(-1).tolist() == \
            np.asarray(expected).reshape(-1).tolist()
    else:
        assert_same(out, expected)
    with pytest.raises(ValueError):
        run_kernel("Constant", [], {"value_int": 1, "value_float": 2.0}, opset=13)


# --------------------------------------------------------------------------- gather / scatter


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("idx_shape", [(), (2,), (2, 3)])
@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
def test_gather(axis, idx_shape, idx_dtype):
    x = rand((4, 5, 6))
    n = x.shape[axis]
    idx = RNG.integers(-n, n, size=idx_shape).astype(idx_dtype)
    check("Gather", [x, idx], {"axis": axis}, opset=13)
    with pytest.raises(ValueError):
        run_kernel("Gather", [x, np.array([n], idx_dtype)], {"axis": axis}, opset=13)


@pytest.mark.parametrize("i", [0, 2, -1, -3])
def test_gather_one_index_of_a_shape(i):
    # shape arithmetic: one dimension of a Shape's result (a 0-d index, no min / max pass)
    check("Gather", [i64(7, 3, 5), np.array(i, I64)], {"axis": 0}, opset=13)
    with pytest.raises(ValueError, match=r"Gather: index out of range \[-3, 2\] \(got -4..-4\)"):
        run_kernel("Gather", [i64(7, 3, 5), np.array(-4, I64)], {"axis": 0}, opset=13)



@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = rand((3, 4, 5))
    n = x.shape[axis]
    idx_shape = list(x.shape)
    idx_shape[axis] = 6
    idx_shape[0] = min(idx_shape[0], 2) if axis != 0 else idx_shape[0]
    idx = RNG.integers(-n, n, size=idx_shape).astype(I64)
    check("GatherElements", [x, idx], {"axis": axis}, opset=13)


@pytest.mark.parametrize("data_shape,idx_shape", [((3234,), (3234, 1)), ((3234, 4), (100, 1)), ((5, 3, 2), (2, 4, 1)),
                                                 ((7,), (0, 1)), ((7,), (1,))])
def test_gather_nd_one_index_per_row(data_shape, idx_shape):
    # index depth 1, no batch dims (the detectors' NonZero -> GatherND): a take along axis 0
    idx = RNG.integers(-data_shape[0], data_shape[0], idx_shape).astype(I64)
    check("GatherND", [rand(data_shape), idx], opset=13)
    with pytest.raises(ValueError, match="GatherND: index out of range"):
        run_kernel("GatherND", [rand(data_shape), np.full((1, 1), data_shape[0], I64)], opset=13)


@pytest.mark.parametrize("batch_dims,data_shape,idx", [
    (0, (2, 2), [[0, 0], [1, 1]]), (0, (2, 2), [[1], [0]]), (0, (2, 2, 2), [[0, 1], [1, 0]]),
    (0, (2, 2, 2), [[[0, 1]], [[1, 0]]]), (1, (2, 2, 2), [[1], [0]]), (1, (2, 3, 4), [[[1, 2]], [[0, -1]]]),
    (2, (2, 3, 4), [[[1], [2], [3]], [[0], [1], [2]]]),
])
def test_gather_nd(batch_dims, data_shape, idx):
    check("GatherND", [rand(data_shape), np.array(idx, I64)], {"batch_dims": batch_dims}, opset=13)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(reduction, axis):
    data = rand((3, 4))
    idx = np.array([[1, 0, 2], [0, 2, -1]], I64) if axis == 1 else np.array([[1, 0, 2, 0], [2, 1, 0, 1]], I64)
    if reduction == "none":  # duplicate targets are undefined without a reduction
        idx = np.array([[1, 0, 2], [0, 2, 3]], I64) if axis == 1 else np.array([[1, 0, 2, 0], [2, 1, 0, 1]], I64)
    upd = rand(idx.shape)
    attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
    check("ScatterElements", [data, idx, upd], attrs, opset=18)


def _expand_scatter_model(data_shape, idx_shape, out_shape, axis, reduction):
    """idx --Expand(out_shape)--> indices; ScatterElements(data, indices, updates): the pattern of
    torchvision's MultiScaleRoIAlign (one RoI row index per slice)."""
    f, i = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    attrs = {"axis": axis} if reduction == "none" else {"axis": axis, "reduction": reduction}
    graph = helper.make_graph(
        [helper.make_node("Expand", ["idx", "shape"], ["indices"]),
         helper.make_node("ScatterElements", ["data", "indices", "updates"], ["y"], **attrs)],
        "expand_scatter",
        [helper.make_tensor_value_info("data", f, data_shape), helper.make_tensor_value_info("idx", i, idx_shape),
         helper.make_tensor_value_info("updates", f, out_shape)],
        [helper.make_tensor_value_info("y", f, data_shape), helper.make_tensor_value_info("indices", i, out_shape)],
        initializer=[numpy_helper.from_array(np.array(out_shape, I64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
@pytest.mark.parametrize("data_shape,idx,out_shape,axis", [
    ((6, 4, 3, 3), [[[[4]]], [[[0]]], [[[-1]]], [[[2]]]], (4, 4, 3, 3), 0),  # whole slices, a negative index
    ((6, 4, 3, 3), [[[[1]]], [[[3]]]], (2, 3, 2, 3), 0),  # updates smaller than data on other axes
    ((2, 5, 3), [[[0], [4], [2]]], (2, 3, 3), 1),  # axis 1
    ((4, 3, 2), [[[2]], [[-1]], [[0]], [[1]]], (4, 3, 2), 0),  # a permutation of every slice: updates reordered
    ((3, 4, 2), [[[1], [0], [3], [2]]], (3, 4, 2), 1),  # the same along axis 1
    ((3, 4, 2), [[[1], [1], [3], [2]]], (3, 4, 2), 1),  # every slice but not a permutation (1 twice, 0 never)
])
def test_scatter_elements_of_expanded_rows(reduction, data_shape, idx, out_shape, axis):
    # Expand returns a zero-stride view; ScatterElements then moves whole slices (one index per slice)
    from tests.kernels.model_run import minirt_run, reference_run

    model = _expand_scatter_model(data_shape, np.shape(idx), out_shape, axis, reduction)
    feeds = {"data": rand(data_shape), "idx": np.array(idx, I64), "updates": rand(out_shape)}
    expected = reference_run(model, feeds)
    actual = minirt_run(model, feeds)
    for a, e in zip(actual, expected):
        assert_same(a, e)
    assert all(a.flags.writeable and a.flags.owndata for a in actual)  # (outputs own their memory)


@pytest.mark.parametrize("reduction", ["none", "add", "mul"])
def test_scatter_elements_row_path_equals_element_path(reduction):
    data = rand((5, 3, 4))
    rows = np.array([3, -5, 1], I64)
    indices = np.broadcast_to(rows[:, None, None], (3, 3, 4))
    updates = rand((3, 3, 4))
    attrs = {"axis": 0, "reduction": reduction}
    fast = run_kernel("ScatterElements", [data, indices, updates], attrs, opset=18)[0]
    slow = run_kernel("ScatterElements", [data, np.ascontiguousarray(indices), updates], attrs, opset=18)[0]
    np.testing.assert_array_equal(fast, slow)
    assert_same(fast, reference("ScatterElements", [data, np.ascontiguousarray(indices), updates], attrs,
                                opset=18)[0])


def test_scatter_elements_with_nothing_to_scatter_returns_data():
    data = rand((3, 4))
    for reduction in ("none", "add"):
        out = check("ScatterElements", [data, np.zeros((0, 4), I64), rand((0, 4))],
                    {"axis": 0, "reduction": reduction}, opset=18)[0]
        np.testing.assert_array_equal(out, data)


def test_scatter_elements_errors_name_the_shapes():
    data = rand((3, 4))
    with pytest.raises(ValueError, match=r"indices rank 1 != data rank 2"):
        run_kernel("ScatterElements", [data, np.zeros(2, I64), rand((2,))], {"axis": 0}, opset=18)
    with pytest.raises(ValueError, match=r"indices shape \(2, 5\) exceeds data shape \(3, 4\) on axis 1"):
        run_kernel("ScatterElements", [data, np.zeros((2, 5), I64), rand((2, 5))], {"axis": 0}, opset=18)
    with pytest.raises(ValueError, match=r"index out of range \[-3, 2\]"):
        run_kernel("ScatterElements", [data, np.broadcast_to(i64(3)[:, None], (1, 4)), rand((1, 4))], {"axis": 0},
                   opset=18)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    data = rand((4, 3, 2))
    idx = np.array([[0], [2]], I64) if reduction == "none" else np.array([[0, 1], [2, 0], [0, 1]], I64)
    upd = rand(idx.shape[:-1] + data.shape[idx.shape[-1]:])
    attrs = {} if reduction == "none" else {"reduction": reduction}
    check("ScatterND", [data, idx, upd], attrs, opset=18)
    if reduction in ("none", "add", "mul"):
        check("ScatterND", [data, idx, upd], attrs, opset=16)


# --------------------------------------------------------------------------- slicing / copying


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([0, 1], [2, 3], None, None), ([1], [-1], [1], None), ([-3], [100], [-1], [2]),
    ([10], [-100], [0], [-1]), ([-1, 0], [-9223372036854775807, 9223372036854775807], [2, 0], [-2, 3]),
    ([2], [1], [0], [1]), ([0, 0, 0], [1, 1, 1], [0, 1, 2], [1, 1, 1]),
])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_slice(starts, ends, axes, steps, dtype):
    x = rand((5, 6, 7), dtype)
    inputs = [x, np.array(starts, I64), np.array(ends, I64)]
    if axes is not None or steps is not None:
        inputs.append(np.array(axes if axes is not None else range(len(starts)), I64))
    if steps is not None:
        inputs.append(np.array(steps, I64))
    check("Slice", inputs, opset=13)
    if steps is None:
        attrs = {"starts": starts, "ends": ends}
        if axes is not None:
            attrs["axes"] = axes
        check("Slice", [x], attrs, opset=1)


@pytest.mark.parametrize("shape,target", [((3, 1), (2, 3, 4)), ((1,), (5,)), ((2, 3), (1, 1)), ((3, 1), (3, 1, 1))])
def test_expand(shape, target):
    out = check("Expand", [rand(shape), np.array(target, I64)], opset=13)[0]
    assert not out.flags.writeable  # a broadcast view of the input, never written (kernels do not write inputs)


@pytest.mark.parametrize("reps", [(1, 1), (2, 3), (0, 2)])
def test_tile(reps):
    check("Tile", [rand((2, 3), np.int32), np.array(reps, I64)], opset=13)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 1, 0, 2), (1, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 0), (0, -1, 1, 0, 1, -2)])
def test_pad(mode, pads):
    x = rand((3, 4, 5))
    check("Pad", [x, np.array(pads, I64)], {"mode": mode}, opset=13)
    check("Pad", [x], {"mode": mode, "pads": pads}, opset=2)
    if mode == "constant":
        check("Pad", [x, np.array(pads, I64), np.array(2.5, np.float32)], {"mode": mode}, opset=13)


def test_pad_axes_and_wrap():
    x = rand((3, 4, 5))
    check("Pad", [x, i64(1, 2, 2, 1), None, i64(0, -1)], {"mode": "constant"}, opset=18, constant_inputs=(3,))
    check("Pad", [x, i64(1, 2, 2, 1), None, i64(0, 2)], {"mode": "wrap"}, opset=19, constant_inputs=(3,))
    check("Pad", [rand((2, 3), np.int64), i64(1, 1, 1, 1), np.array(7, I64)], opset=13)


@pytest.mark.parametrize("value", [None, np.array([3], np.int64), np.array([1.5], np.float32), np.array([1], np.bool_),
                                   np.array([0], np.int64), np.array([0.0], np.float32), np.array([-0.0], np.float32),
                                   np.array([0], np.bool_)])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": numpy_helper.from_array(value)}
    expected = reference("ConstantOfShape", [i64(2, 3)], attrs, opset=13)[0]
    kw = {} if value is None else {"value": value}
    actual = run_kernel("ConstantOfShape", [i64(2, 3)], kw, opset=13)[0]
    assert_same(actual, expected)
    assert actual.tobytes() == np.asarray(expected).tobytes()  # (-0.0 stays -0.0)


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 10, 3, np.int64), (10, 0, -3, np.int32), (0.5, 3.2, 0.3, np.float32), (5, 5, 1, np.int64), (1.0, -2.0, -0.5, np.float64),
])
def test_range(start, limit, delta, dtype):
    check("Range", [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)], opset=11)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_non_zero(dtype):
    x = rand((3, 4), dtype, -1, 1)
    check("NonZero", [x], opset=13)


@pytest.mark.parametrize("axis", [0, -1, 1])
@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_topk(axis, largest, k, dtype):
    x = rand((4, 5, 6), dtype, -3, 3)  # small integer range produces ties
    check("TopK", [x, i64(k)], {"axis": axis, "largest": largest}, opset=11, n_outputs=2)
    if largest and dtype == np.float32:  # opset 10 TopK is float only
        check("TopK", [x, i64(k)], {"axis": axis}, opset=10, n_outputs=2)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("shape,axis", [((3234,), 0), ((1, 500), 1), ((400, 1), 0)])
@pytest.mark.parametrize("k", [1, 37, 120])
def test_topk_one_row_partition(shape, axis, largest, k):
    # a single row and k below half of it: the partition path (k-th value, then only the candidates
    # sorted); values on a coarse grid give ties at the k-th value, +-0.0 ties too
    x = (np.round(RNG.uniform(-4, 4, shape) * 4) / 4).astype(np.float32)
    x.reshape(-1)[::7] = -0.0
    x.reshape(-1)[3::7] = 0.0
    check("TopK", [x, i64(k)], {"axis": axis, "largest": largest}, opset=11, n_outputs=2)


def test_topk_one_row_with_nan_keeps_the_full_sort():
    x = RNG.uniform(-1, 1, 50).astype(np.float32)
    x[[3, 17]] = np.nan
    values, idx = run_kernel("TopK", [x, i64(5)], {"axis": 0}, opset=11, n_outputs=2)
    assert idx[:2].tolist() == [3, 17] and np.isnan(values[:2]).all()  # (NaN above every number, as before)


@pytest.mark.parametrize("axis", [-1, 0, 1, -3])
@pytest.mark.parametrize("types", [(np.int64, np.int64, np.float32), (np.int64, np.int64, np.int64),
                                   (np.float32, np.float32, np.float32), (np.int32, np.float32, np.float32),
                                   (np.int64, np.float32, np.int64)])
def test_one_hot(axis, types):
    idx_t, depth_t, val_t = types
    idx = np.array([[0, 2, -1], [1, 5, -7]], idx_t)
    check("OneHot", [idx, np.array(4, depth_t), np.array([0, 3], val_t)], {"axis": axis}, opset=11)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_cumsum(exclusive, reverse, axis, dtype):
    check("CumSum", [rand((3, 4), dtype), np.array(axis, I64)], {"exclusive": exclusive, "reverse": reverse}, opset=14)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -2])
def test_trilu(upper, k):
    x = rand((2, 4, 5))
    inputs = [x] if k is None else [x, np.array(k, I64)]
    check("Trilu", inputs, {"upper": upper}, opset=14)


@pytest.mark.parametrize("k", [0, 1, -2])
@pytest.mark.parametrize("dtype", [None, 1, 7])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", [rand((3, 5), np.int32)], attrs, opset=9)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("b", [2, 3])
def test_depth_space(mode, b):
    x = rand((2, 2 * b * b, 3, 4))
    check("DepthToSpace", [x], {"blocksize": b, "mode": mode}, opset=13)
    y = rand((2, 3, 2 * b, 3 * b))
    check("SpaceToDepth", [y], {"blocksize": b}, opset=13)
    # SpaceToDepth inverts DepthToSpace (DCR) exactly.
    d2s = run_kernel("DepthToSpace", [x], {"blocksize": b}, opset=13)[0]
    np.testing.assert_array_equal(run_kernel("SpaceToDepth", [d2s], {"blocksize": b}, opset=13)[0], x)


# --------------------------------------------------------------------------- Resize / Upsample

COORD_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
SCALES = [(1, 1, 2, 2), (1, 1, 0.5, 0.5), (1, 1, 1.7, 0.6), (1, 1, 3, 1)]


def _scales_engine(coord, shape, scales):
    """The reference to compare a scales-driven Resize against.

    With align_corners and a scale that does not divide the input length, the
    ONNX spec (and its conformance data) takes ``length_resized`` to be the
    fractional ``in_len * scale``; onnxruntime uses the truncated output
    length instead.  minirt follows the spec, so such cases are checked
    against the onnx reference evaluator.
    """
    if coord == "align_corners" and any(float(d * s) != int(d * s) for d, s in zip(shape, scales)):
        return "onnx-reference"
    return "onnxruntime"


@pytest.mark.parametrize("coord", COORD_MODES)
@pytest.mark.parametrize("nearest", NEAREST_MODES)
@pytest.mark.parametrize("scales", SCALES)
def test_resize_nearest_scales(coord, nearest, scales):
    x = rand((1, 2, 5, 7))
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    check("Resize", [x, None, np.array(scales, np.float32)], attrs, opset=13, constant_inputs=(2,),
          engine=_scales_engine(coord, x.shape, scales))


@pytest.mark.parametrize("coord", COORD_MODES[:4])
@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_resize_linear_scales(coord, scales, dtype):
    if coord == "tf_half_pixel_for_nn":
        pytest.skip("tf_half_pixel_for_nn is only meant for nearest")
    x = rand((2, 3, 5, 7), dtype)
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    check("Resize", [x, None, np.array(scales, np.float32)], attrs, opset=13, constant_inputs=(2,),
          engine=_scales_engine(coord, x.shape, scales))


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [(1, 2, 10, 14), (1, 2, 3, 4), (1, 2, 1, 9), (1, 2, 5, 7)])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel"])
def test_resize_sizes(mode, sizes, coord):
    x = rand((1, 2, 5, 7))
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    check("Resize", [x, None, None, np.array(sizes, I64)], attrs, opset=13, constant_inputs=(3,))
    check("Resize", [x, np.zeros(0, np.float32), np.zeros(0, np.float32), np.array(sizes, I64)], attrs,
          opset=11, constant_inputs=(1, 2, 3))


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("a", [-0.75, -0.5])
def test_resize_cubic(scales, exclude_outside, a):
    x = rand((1, 2, 6, 8))
    attrs = {"mode": "cubic", "exclude_outside": exclude_outside, "cubic_coeff_a": a}
    check("Resize", [x, None, np.array(scales, np.float32)], attrs, opset=13, constant_inputs=(2,), atol=1e-4)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("roi", [(0, 0, 0.2, 0.3, 1, 1, 0.8, 0.9), (0, 0, -0.2, 0.1, 1, 1, 1.3, 0.6)])
def test_resize_tf_crop_and_resize(mode, roi):
    x = rand((1, 1, 6, 8))
    attrs = {"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.0}
    check("Resize", [x, np.array(roi, np.float32), None, i64(1, 1, 5, 4)], attrs, opset=13,
          constant_inputs=(1, 3))


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 0.5, 0.5), (1, 1, 2.5, 1.5)])
def test_resize_opset10(mode, scales):
    check("Resize", [rand((1, 2, 4, 6)), np.array(scales, np.float32)], {"mode": mode}, opset=10,
          constant_inputs=(1,))


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_resize_opset18_axes_policy(policy):
    x = rand((1, 2, 6, 8))
    attrs = {"mode": "linear", "axes": (2, 3), "keep_aspect_ratio_policy": policy}
    check("Resize", [x, None, None, i64(9, 10)], attrs, opset=18, constant_inputs=(3,))
    check("Resize", [x, None, np.array([2.0, 0.5], np.float32)], {"mode": "nearest", "axes": (-2, -1)}, opset=18,
          constant_inputs=(2,))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("sizes", [(1, 1, 3, 4), (1, 1, 5, 3)])
def test_resize_antialias(mode, sizes):
    x = rand((1, 1, 11, 9))
    attrs = {"mode": mode, "antialias": 1}
    check("Resize", [x, None, None, np.array(sizes, I64)], attrs, opset=18, constant_inputs=(3,), atol=1e-4)


def test_resize_half_pixel_symmetric():
    x = rand((1, 1, 5, 7))
    attrs = {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}
    check("Resize", [x, None, None, i64(1, 1, 8, 4)], attrs, opset=19, constant_inputs=(3,))


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64])
def test_resize_nearest_int(dtype):
    x = rand((1, 3, 4, 4), dtype, 0, 200)
    check("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "nearest"}, opset=13,
          constant_inputs=(2,))


def test_resize_linear_uint8():
    x = rand((1, 3, 4, 4), np.uint8, 0, 255)
    check("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], {"mode": "linear"}, opset=13,
          constant_inputs=(2,), atol=1)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 2, 3), (1, 1, 1.5, 2.5)])
def test_upsample(mode, scales):
    x = rand((1, 2, 3, 4))
    check("Upsample", [x, np.array(scales, np.float32)], {"mode": mode}, opset=9, constant_inputs=(1,))
    out7 = run_kernel("Upsample", [x], {"mode": mode, "scales": scales}, opset=7)[0]
    assert_same(out7, run_kernel("Upsample", [x, np.array(scales, np.float32)], {"mode": mode}, opset=9)[0])
