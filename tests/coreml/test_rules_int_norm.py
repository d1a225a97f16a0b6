"""Core ML lowering of integer and bool tensors (comparisons, logic, Where, Cast, Gather with run-time
indices: magika's one-hot, BERT's attention mask, embedding lookups), LogSoftmax, InstanceNormalization
and ReduceSum with noop_with_empty_axes: each program is built and converted, read back, run on the MIL
evaluator (minirt/tools/mil_eval.py) and compared with onnxruntime (tests/coreml/test_rules.py's check)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("coremltools")
pytest.importorskip("onnxruntime")

from tests.coreml.test_rules import check, lower_whole  # noqa: E402
from tests.coreml.test_rules_data_rnn import _refusal  # noqa: E402

RNG = np.random.default_rng(2727)
F, I32, I64, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


def _typed_model(nodes, inputs, outputs, inits=(), opset=17):
    """A model whose inputs and outputs are ``(name, onnx type, shape)``; shapes inferred inside."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs], initializer=list(inits))
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))


def _ops(prog) -> set:
    return {op.op_type for op in prog.functions["main"].operations}


# --- magika's one-hot: int32 bytes -> Reshape -> Equal(0..256) -> Cast -> MatMul ------------------------


def test_one_hot_of_int32_input():
    x = RNG.integers(0, 257, (1, 64)).astype(np.int32)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Equal", ["r", "classes"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["oh"], to=F),
        helper.make_node("MatMul", ["oh", "w"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1, 64, 1], np.int64), "shape"),
             numpy_helper.from_array(np.arange(257, dtype=np.int32).reshape(1, 1, 257), "classes"),
             numpy_helper.from_array(RNG.standard_normal((257, 8)).astype(np.float32), "w")]
    m = _typed_model(nodes, [("x", I32, [1, 64])], [("y", F)], inits)
    prog = check(m, {"x": x})
    assert {"equal", "cast"} <= _ops(prog)
    check(m, {"x": x}, precision="fp16", tol=3e-2)


# --- BERT's attention mask: int64 mask -> bool -> Flatten/Gather/Reshape -> And -> Where -> + scores ----


def _mask_model(seq, rows):
    """BERT's mask chain (bert_mini after the builder's passes) with ``rows`` as the [1,1,seq,1] bool constant."""
    nodes = [
        helper.make_node("Cast", ["mask"], ["mb"], to=B),
        helper.make_node("Flatten", ["mb"], ["fl"], axis=2),
        helper.make_node("Gather", ["fl", "gidx"], ["g"], axis=0),
        helper.make_node("Reshape", ["g", "shape"], ["rs"]),
        helper.make_node("And", ["rows", "rs"], ["both"]),
        helper.make_node("Where", ["both", "zero", "lowest"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["s"]),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    inits = [numpy_helper.from_array(np.zeros((1, 1, 1, seq), np.int64), "gidx"),
             numpy_helper.from_array(np.array([1, 1, 1, seq], np.int64), "shape"),
             numpy_helper.from_array(rows, "rows"),
             numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest")]
    return _typed_model(nodes, [("mask", I64, [1, seq]), ("scores", F, [1, 2, seq, seq])], [("y", F)], inits)


def test_attention_mask_arithmetic():
    seq = 16
    mask = np.ones((1, seq), np.int64)
    mask[0, 11:] = 0
    feeds = {"mask": mask, "scores": RNG.standard_normal((1, 2, seq, seq)).astype(np.float32)}
    # fp32: some query rows fully masked too (their scores stay finite: -3.4e38 + s).
    prog = check(_mask_model(seq, RNG.integers(0, 2, (1, 1, seq, 1)).astype(bool)), feeds)
    assert {"select", "logical_and", "gather"} <= _ops(prog)
    # fp16: -3.4e38 becomes -inf in the program; a row with one key left is still exact (a fully
    # masked row would be NaN there, as in any fp16 attention with an -inf mask).
    check(_mask_model(seq, np.ones((1, 1, seq, 1), bool)), feeds, precision="fp16", tol=3e-2)


# --- Cast -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src, dst, values",
    [
        (I64, F, [[-3, 0, 7, 2**20]]),
        (I32, F, [[-3, 0, 7, 12]]),
        (B, F, [[True, False, True, True]]),
        (I64, B, [[-3, 0, 7, 0]]),
        (F, B, [[-0.5, 0.0, 2.0, -0.0]]),
        (I64, I32, [[-3, 0, 7, 9]]),
        (B, I32, [[True, False, False, True]]),
    ],
)
def test_cast(src, dst, values):
    np_src = {F: np.float32, I32: np.int32, I64: np.int64, B: np.bool_}[src]
    x = np.array(values, np_src)
    m = _typed_model([helper.make_node("Cast", ["x"], ["y"], to=dst)], [("x", src, list(x.shape))], [("y", dst)])
    check(m, {"x": x}, tol=0)


def test_cast_refusals():
    m = _typed_model([helper.make_node("Cast", ["x"], ["y"], to=I32)], [("x", F, [2, 3])], [("y", I32)])
    assert "float to integer" in _refusal(m)
    m = _typed_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], [("x", F, [2, 3])],
                     [("y", TensorProto.FLOAT16)])
    assert "float32 and float16" in _refusal(m)


# --- comparisons and logic --------------------------------------------------------------------------


@pytest.mark.parametrize("op, dtype", [(op, t) for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")
                                        for t in (I64, F)] + [("Equal", B)])  # (ONNX orders numbers only)
def test_comparisons(op, dtype):
    np_t = {F: np.float32, I64: np.int64, B: np.bool_}[dtype]
    a = RNG.integers(-2, 3, (2, 5)).astype(np_t)
    b = RNG.integers(-2, 3, (1, 5)).astype(np_t)
    m = _typed_model([helper.make_node(op, ["a", "b"], ["c"]), helper.make_node("Not", ["c"], ["y"])],
                     [("a", dtype, [2, 5]), ("b", dtype, [1, 5])], [("y", B)], opset=17)
    check(m, {"a": a, "b": b}, tol=0)


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    a = RNG.integers(0, 2, (3, 4)).astype(bool)
    b = RNG.integers(0, 2, (3, 4)).astype(bool)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    # bool partition inputs and a float output through Where.
    m = _typed_model([helper.make_node(op, ["a", "b"], ["c"]), helper.make_node("Where", ["c", "x", "zero"], ["y"])],
                     [("a", B, [3, 4]), ("b", B, [3, 4]), ("x", F, [3, 4])], [("y", F)],
                     [numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    prog = check(m, {"a": a, "b": b, "x": x}, tol=0)
    assert "select" in _ops(prog)


def test_integer_tensor_refused_by_a_float_rule():
    m = _typed_model([helper.make_node("Add", ["a", "a"], ["y"])], [("a", I64, [2, 3])], [("y", I64)])
    why = _refusal(m)
    assert "int64" in why and "Gather" in why


# --- Gather with run-time indices ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [I64, I32])
def test_embedding_gather_run_time_indices(dtype):
    table = RNG.standard_normal((50, 8)).astype(np.float32)
    ids = RNG.integers(-50, 50, (2, 7)).astype(np.int64 if dtype == I64 else np.int32)  # negatives too
    m = _typed_model([helper.make_node("Gather", ["table", "ids"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
                     [("ids", dtype, [2, 7])], [("y", F)], [numpy_helper.from_array(table, "table")])
    prog = check(m, {"ids": ids}, tol=0)
    assert {"gather", "select"} <= _ops(prog)


def test_gather_run_time_data_and_indices():
    x = RNG.standard_normal((3, 6, 4)).astype(np.float32)
    idx = np.array([[5, -1], [0, 2]], np.int64)
    m = _typed_model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)],
                     [("x", F, [3, 6, 4]), ("idx", I64, [2, 2])], [("y", F)])
    check(m, {"x": x, "idx": idx}, tol=0)


def test_gather_bool_data_and_bool_output():
    x = RNG.integers(0, 2, (4, 5)).astype(bool)
    m = _typed_model([helper.make_node("Gather", ["x", "idx"], ["y"], axis=1)], [("x", B, [4, 5])], [("y", B)],
                     [numpy_helper.from_array(np.array([4, 0, -2], np.int64), "idx")])
    check(m, {"x": x}, tol=0)


# --- LogSoftmax -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape, axis, scale", [((3, 2, 29), -1, 1.0), ((2, 5, 4), 1, 1.0), ((2, 7), -1, 80.0)])
def test_log_softmax(shape, axis, scale):
    x = (RNG.standard_normal(shape) * scale).astype(np.float32)  # scale 80: exp underflows in log(softmax)
    m = _typed_model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=axis)], [("x", F, list(shape))], [("y", F)])
    prog = check(m, {"x": x}, tol=1e-4)
    assert "softmax" not in _ops(prog)


def test_log_softmax_fp16_program_is_close():
    x = RNG.standard_normal((4, 29)).astype(np.float32)
    m = _typed_model([helper.make_node("LogSoftmax", ["x"], ["y"], axis=-1)], [("x", F, [4, 29])], [("y", F)])
    check(m, {"x": x}, precision="fp16", tol=3e-2)


# --- InstanceNormalization ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 6, 40), (2, 3, 5, 7)])
def test_instance_norm(shape):
    c = shape[1]
    x = (RNG.standard_normal(shape) * 3 + 1).astype(np.float32)
    inits = [numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "s"),
             numpy_helper.from_array(RNG.standard_normal(c).astype(np.float32), "b")]
    m = _typed_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-5)],
                     [("x", F, list(shape))], [("y", F)], inits)
    prog = check(m, {"x": x}, tol=1e-4)
    assert "instance_norm" in _ops(prog)


# --- ReduceSum with noop_with_empty_axes ------------------------------------------------------------


def test_reduce_sum_noop_flag_with_axes():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    m = _typed_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, noop_with_empty_axes=1)],
                     [("x", F, [2, 5, 3])], [("y", F)], [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    check(m, {"x": x}, tol=1e-5)
    m = _typed_model([helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)],
                     [("x", F, [2, 5, 3])], [("y", F)])
    assert "without axes" in _refusal(m)


def test_lower_whole_int_interface():
    """An int64 graph input is an int32 program input; a bool output an int32 program output."""
    m = _typed_model([helper.make_node("Cast", ["x"], ["y"], to=B)], [("x", I64, [2, 3])], [("y", B)])
    part, blob, options, ctx = lower_whole(m)
    from minirt.tools.mil_eval import read_package

    spec, _ = read_package(blob)
    from coremltools.proto import FeatureTypes_pb2 as ft

    assert spec.description.input[0].type.multiArrayType.dataType == ft.ArrayFeatureType.INT32
    assert spec.description.output[0].type.multiArrayType.dataType == ft.ArrayFeatureType.INT32


def test_one_hot_product_as_a_row_lookup():
    """The builder makes magika's one-hot product a com.minirt::RowLookup (D141): lowered as select + gather,
    ids outside the classes (negative, past the last) included."""
    x = RNG.integers(0, 257, (1, 64)).astype(np.int32)
    x[0, :4] = [-1, 257, 1000, -300]
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Equal", ["r", "classes"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["oh"], to=F),
        helper.make_node("MatMul", ["oh", "w"], ["p"]),
        helper.make_node("Add", ["p", "b"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1, 64, 1], np.int64), "shape"),
             numpy_helper.from_array(np.arange(257, dtype=np.int32).reshape(1, 1, 257), "classes"),
             numpy_helper.from_array(RNG.standard_normal((257, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "b")]
    m = _typed_model(nodes, [("x", I32, [1, 64])], [("y", F)], inits)
    part, _, _, _ = lower_whole(m, opt_level=2)
    assert [n.op_type for n in part.nodes] == ["Reshape", "RowLookup"]
    prog = check(m, {"x": x}, opt_level=2)
    assert {"select", "gather"} <= _ops(prog)
