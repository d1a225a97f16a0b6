"""Every Core ML lowering rule: build + convert its ML Program (skip_model_load),
read it back with coremltools' milproto loader, check its interface and
weights, and run it with the test-only MIL evaluator against onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("coremltools")
ort = pytest.importorskip("onnxruntime")

from minirt.builder.build import _normalise  # noqa: E402
from minirt.builder.load import load_model  # noqa: E402
from minirt.builder.passes import optimize  # noqa: E402
from minirt.targets.coreml import CoreMLSpec  # noqa: E402
from minirt.targets.profiles import get_target  # noqa: E402
from minirt.targets.providers import PartitionIR, SupportContext  # noqa: E402
from minirt.tools.mil_eval import read_package, run_program  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.5, name)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs], initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def lower_whole(model, precision="fp32", opt_level=0):
    """(PartitionIR, blob, options, ctx) for a partition of every node of ``model``."""
    model_ir, _ = load_model(model)
    _normalise(model_ir)
    if opt_level:
        optimize(model_ir, opt_level)
    ctx = SupportContext(model_ir, get_target("macos"), {"coreml_precision": precision})
    spec = CoreMLSpec()
    for node in model_ir.graph:
        ok, why = spec.supports(node, ctx)
        assert ok, f"{node.op_type}: {why}"
    part = PartitionIR.from_nodes("coreml", list(model_ir.graph))
    blob, options = spec.lower(part, ctx)
    return part, blob, options, ctx


def check(model, feeds, precision="fp32", tol=1e-4, opt_level=0):
    part, blob, options, ctx = lower_whole(model, precision, opt_level)
    spec, prog = read_package(blob)
    # Interface: one input per run-time partition input with its shape, fp32 in/out.
    desc_in = {i.name: tuple(i.type.multiArrayType.shape) for i in spec.description.input}
    assert list(desc_in) == [f"in_{i}" for i in range(len(part.inputs))]
    for i, v in enumerate(part.inputs):
        assert desc_in[f"in_{i}"] == ctx.static_shape(v)
    out_names = [o.name for o in spec.description.output]
    assert out_names == [f"out_{i}" for i in range(len(part.outputs))]
    assert spec.specificationVersion >= 7 and spec.WhichOneof("Type") == "mlProgram"
    assert options["onnx_inputs"] == [v.name for v in part.inputs]
    # Weights: conv / deconv / matmul weights are stored unchanged (coremltools may
    # legitimately rewrite other constants, e.g. Div by a constant -> Mul).
    consts = [np.asarray(op.outputs[0].val) for op in prog.functions["main"].operations if op.op_type == "const"]
    weights = [n.inputs[1] for n in part.nodes
               if n.op_type in ("Conv", "FusedConv", "ConvTranspose", "MatMul") and ctx.const(n.inputs[1]) is not None]
    for v in weights:
        want = ctx.const(v).astype(np.float16 if precision == "fp16" else np.float32)
        assert any(c.shape == want.shape and np.array_equal(c, want) for c in consts) or any(
            c.shape == want.T.shape and np.array_equal(c, want.T) for c in consts
        ), f"weight {v.name} not found in the program"
    # Numbers: MIL evaluator vs onnxruntime.
    got = run_program(prog, {f"in_{i}": feeds[v.name] for i, v in enumerate(part.inputs)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    ref = dict(zip(names, sess.run(None, feeds)))
    for i, v in enumerate(part.outputs):
        np.testing.assert_allclose(got[f"out_{i}"].astype(np.float32), ref[v.name], rtol=tol, atol=tol, err_msg=v.name)
    return prog


X4 = RNG.standard_normal((1, 4, 9, 11)).astype(np.float32)


@pytest.mark.parametrize(
    "attrs, wshape",
    [
        ({"pads": [1, 0, 2, 1], "strides": [2, 1]}, (6, 4, 3, 3)),
        ({"dilations": [2, 1], "pads": [2, 1, 2, 1]}, (6, 4, 3, 3)),
        ({"group": 2, "pads": [1, 1, 1, 1]}, (6, 2, 3, 3)),
        ({"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]}, (4, 1, 3, 3)),  # depthwise
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, (5, 4, 4, 4)),
        ({"auto_pad": "SAME_LOWER", "strides": [2, 2]}, (5, 4, 4, 4)),
        ({"auto_pad": "VALID"}, (5, 4, 1, 1)),
    ],
)
def test_conv(attrs, wshape):
    m = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], [("x", X4.shape)], ["y"],
               [_w("w", *wshape), _w("b", wshape[0])])
    check(m, {"x": X4})


@pytest.mark.parametrize("attrs", [{"strides": [2, 2]}, {"strides": [2, 2], "pads": [1, 0, 1, 0]},
                                   {"strides": [2, 2], "output_padding": [1, 1], "pads": [1, 1, 1, 1]}])
def test_conv_transpose(attrs):
    m = _model([helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)], [("x", X4.shape)], ["y"],
               [_w("w", 4, 3, 3, 3), _w("b", 3)])
    check(m, {"x": X4})


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("AveragePool", {"kernel_shape": [2, 3], "strides": [1, 2]}),
    ],
)
def test_pool(op, attrs):
    check(_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", X4.shape)], ["y"]), {"x": X4})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    check(_model([helper.make_node(op, ["x"], ["y"])], [("x", X4.shape)], ["y"]), {"x": X4})


@pytest.mark.parametrize("attrs, bshape, cshape", [({}, (8, 5), (5,)), ({"transB": 1, "alpha": 0.5, "beta": 2.0}, (5, 8), (1, 5)),
                                                  ({"transA": 1}, (8, 5), (3, 5))])
def test_gemm(attrs, bshape, cshape):
    a_shape = (8, 3) if attrs.get("transA") else (3, 8)
    a = RNG.standard_normal(a_shape).astype(np.float32)
    m = _model([helper.make_node("Gemm", ["a", "b", "c"], ["y"], **attrs)], [("a", a_shape)], ["y"], [_w("b", *bshape), _w("c", *cshape)])
    check(m, {"a": a})


def test_matmul_const_and_batched():
    a = RNG.standard_normal((2, 3, 6)).astype(np.float32)
    b = RNG.standard_normal((2, 6, 4)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["a", "w"], ["p"]), helper.make_node("MatMul", ["a", "b"], ["q"])],
               [("a", a.shape), ("b", b.shape)], ["p", "q"], [_w("w", 6, 5)])
    check(m, {"a": a, "b": b})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_broadcast(op):
    y = (RNG.random((1, 4, 1, 1)).astype(np.float32) + 0.5)
    m = _model([helper.make_node(op, ["x", "c"], ["t"]), helper.make_node(op, ["t", "y"], ["z"])],
               [("x", X4.shape), ("y", y.shape)], ["z"], [_w("c", 9, 1)])
    check(m, {"x": X4, "y": y})


@pytest.mark.parametrize(
    "op, attrs",
    [("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("LeakyRelu", {"alpha": 0.1}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
     ("HardSwish", {}), ("Erf", {}), ("Exp", {}), ("Neg", {}), ("Abs", {}), ("Softplus", {}), ("Identity", {})],
)
def test_unary(op, attrs):
    check(_model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", X4.shape)], ["y"], opset=17), {"x": X4})


def test_clip_relu6_and_pow():
    lo = numpy_helper.from_array(np.array(0, np.float32), "lo")
    hi = numpy_helper.from_array(np.array(6, np.float32), "hi")
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    m = _model([helper.make_node("Mul", ["x", "x"], ["s"]), helper.make_node("Clip", ["s", "lo", "hi"], ["c"]),
                helper.make_node("Pow", ["c", "two"], ["y"])], [("x", X4.shape)], ["y"], [lo, hi, two])
    check(m, {"x": X4 * 3})


def test_softmax_layernorm_batchnorm():
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    m = _model(
        [helper.make_node("Softmax", ["x"], ["s"], axis=1),
         helper.make_node("LayerNormalization", ["s", "g", "b"], ["l"], axis=-1, epsilon=1e-3),
         helper.make_node("BatchNormalization", ["l", "sc", "bi", "mu", "var"], ["y"], epsilon=1e-4)],
        [("x", x.shape)], ["y"],
        [_w("g", 6), _w("b", 6), _w("sc", 4), _w("bi", 4), _w("mu", 4),
         numpy_helper.from_array(RNG.random(4).astype(np.float32) + 0.5, "var")])
    check(m, {"x": x})


def test_shuffles():
    shape = numpy_helper.from_array(np.array([1, 0, -1], np.int64), "shape")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    starts = numpy_helper.from_array(np.array([1, -7], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([3, 100], np.int64), "ends")
    sl_axes = numpy_helper.from_array(np.array([1, 3], np.int64), "sl_axes")
    steps = numpy_helper.from_array(np.array([1, 2], np.int64), "steps")
    m = _model(
        [helper.make_node("Concat", ["x", "x"], ["c"], axis=1),
         helper.make_node("Slice", ["c", "starts", "ends", "sl_axes", "steps"], ["s"]),
         helper.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 3, 1]),
         helper.make_node("Reshape", ["t", "shape"], ["r"]),
         helper.make_node("Squeeze", ["r", "axes"], ["q"]),
         helper.make_node("Unsqueeze", ["q", "axes"], ["u"]),
         helper.make_node("Flatten", ["u"], ["f"], axis=2),
         helper.make_node("Split", ["x"], ["p0", "p1"], axis=1, num_outputs=2) if False else
         helper.make_node("Split", ["x", "split"], ["p0", "p1"], axis=1),
         helper.make_node("Add", ["p0", "p1"], ["y"])],
        [("x", X4.shape)], ["f", "y"],
        [shape, axes, starts, ends, sl_axes, steps, numpy_helper.from_array(np.array([1, 3], np.int64), "split")], opset=17)
    check(m, {"x": X4})


def test_reduce_mean():
    axes = numpy_helper.from_array(np.array([1, -1], np.int64), "axes")
    m = _model([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=0)], [("x", X4.shape)], ["y"], [axes], opset=18)
    check(m, {"x": X4})


@pytest.mark.parametrize(
    "attrs, scales",
    [
        ({"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, [1, 1, 2, 3]),
        ({"mode": "linear", "coordinate_transformation_mode": "half_pixel"}, [1, 1, 2, 2]),
        ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 2, 3]),
        ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, [1, 1, 3, 2]),
    ],
)
def test_resize(attrs, scales):
    sc = numpy_helper.from_array(np.array(scales, np.float32), "scales")
    m = _model([helper.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)], [("x", X4.shape)], ["y"], [sc])
    check(m, {"x": X4})


def test_fused_ops_from_the_optimizer():
    """FusedConv (bias, residual, HardSwish), FusedGemm and Activation as the optimizer emits them."""
    three = numpy_helper.from_array(np.array(3, np.float32), "three")
    six = numpy_helper.from_array(np.array(6, np.float32), "six")
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    m = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Add", ["c", "x"], ["r"]),
         helper.make_node("Relu", ["r"], ["a"]),
         helper.make_node("Add", ["a", "three"], ["a3"]),
         helper.make_node("Clip", ["a3", "zero", "six"], ["cl"]),
         helper.make_node("Mul", ["a", "cl"], ["m"]),
         helper.make_node("Div", ["m", "six"], ["hs"]),
         helper.make_node("GlobalAveragePool", ["hs"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("Gemm", ["f", "fw", "fb"], ["gm"], transB=1),
         helper.make_node("Sigmoid", ["gm"], ["y"])],
        [("x", X4.shape)], ["y"], [_w("w", 4, 4, 3, 3), _w("b", 4), three, six, zero, _w("fw", 7, 4), _w("fb", 7)])
    part, *_ = lower_whole(m, opt_level=2)
    ops = {n.op_type for n in part.nodes}
    assert "FusedConv" in ops and ({"FusedGemm", "Gemm"} & ops), ops
    check(m, {"x": X4}, opt_level=2)


def test_fp16_program_is_close():
    m = _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], [("x", X4.shape)], ["y"], [_w("w", 6, 4, 3, 3)])
    prog = check(m, {"x": X4}, precision="fp16", tol=2e-2)
    assert "cast" in {op.op_type for op in prog.functions["main"].operations}


@pytest.mark.parametrize(
    "node, shape, reason",
    [
        (helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="cubic"), (1, 4, 9, 11), "Resize mode 'cubic' is not supported by Core ML"),
        (helper.make_node("Relu", ["x"], ["y"]), ("N", 4, 9, 11), "dynamic shape"),
        (helper.make_node("Det", ["x"], ["y"]), (1, 4, 9, 9), "has no Core ML lowering rule"),
    ],
)
def test_refusals_have_reasons(node, shape, reason):
    sc = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    m = _model([node], [("x", shape)], ["y"], [sc])
    model_ir, _ = load_model(m)
    _normalise(model_ir)
    ctx = SupportContext(model_ir, get_target("macos"))
    ok, why = CoreMLSpec().supports(next(iter(model_ir.graph)), ctx)
    assert not ok and reason in why
