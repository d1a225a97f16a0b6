"""The NNAPI lowerings that real models need (issue 27): Split, Slice, Gather, Pad reflect / edge / wrap,
Gemm / MatMul with transposed or run-time operands, LayerNormalization, 1-D Conv and Softmax along
an axis other than the internal last one.

Each case is a small ONNX graph, lowered alone (every node, one NNAPI model) at several Android API
levels.  At each level the case either names the NNAPI operations the lowering must choose there (a
SPLIT from API 29, STRIDED_SLICE on API 28, MIRROR_PAD only from API 34...) or the refusal it must
give.  A lowered model is then

* translated to TFLite and run by the TFLite interpreter against onnxruntime (the numerics), and
* replayed through the validating fake NNAPI library (tests/nnapi/fake_nnapi.c: operation
  signatures, constant operands, output shapes of SPLIT / SLICE / STRIDED_SLICE / GATHER /
  MIRROR_PAD / BATCH_MATMUL).

The end-to-end tests build partitioned artifacts (optimizer, partitioner, NNAPI programs run through
their TFLite translation) of small CNN / transformer / audio graphs and of the cached real models.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import minirt
from minirt.builder.load import load_model
from minirt.providers.nnapi import NNAPIProvider
from minirt.targets.nnapi import NNAPISpec, Unsupported
from minirt.targets.nnapi.model import NNModel
from minirt.targets.profiles import get_target
from minirt.targets.providers import PartitionIR, SupportContext
from tests.nnapi.helpers import build_partitioned, tflite_program_from_nnapi_blob

ort = pytest.importorskip("onnxruntime")

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def _graph(nodes, inputs, inits=(), opset=18, domains=(), outputs=None) -> onnx.ModelProto:
    """A float32 graph: ``inputs`` (name, shape), ``inits`` (name, array); its outputs are ``outputs``
    or else the node outputs no node reads, shapes by ONNX shape inference."""
    read = {i for n in nodes for i in n.input}
    outputs = outputs or [o for n in nodes for o in n.output if o and o not in read]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                         [h.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs],
                         [nh.from_array(np.asarray(a), n) for n, a in inits])
    opsets = [h.make_opsetid("", opset)] + [h.make_opsetid(d, 1) for d in domains]
    return onnx.shape_inference.infer_shapes(h.make_model(graph, opset_imports=opsets))


def _f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i64(*values):
    return np.array(values, np.int64)


@dataclasses.dataclass
class Case:
    """``model`` lowered at each level of ``levels``: the NNAPI operations expected there (a set of
    names, or a dict of name -> count), or a refusal (a str the reason contains)."""

    name: str
    model: onnx.ModelProto
    levels: dict
    # the graph onnxruntime runs for the expected outputs (same inputs) when it cannot run ``model``
    # (com.minirt ops); None: ``model`` itself
    reference: onnx.ModelProto | None = None

    def feeds(self) -> dict:
        return {i.name: _f32(*[d.dim_value for d in i.type.tensor_type.shape.dim], seed=k)
                for k, i in enumerate(self.model.graph.input)}


X4 = (1, 6, 5, 7)   # N, C, H, W: rank-4 values are NHWC inside the NNAPI model, so axes are mapped
X3 = (2, 6, 9)


def _split_cases():
    yield Case("split-num-outputs-equal", _graph([h.make_node("Split", ["x"], ["a", "b", "c"], axis=1, num_outputs=3)],
                                                 [("x", X4)]),
               {27: "STRIDED_SLICE needs Android API 28", 28: {"STRIDED_SLICE": 3}, 29: {"SPLIT": 1}, 34: {"SPLIT": 1}})
    yield Case("split-num-outputs-uneven", _graph([h.make_node("Split", ["x"], ["a", "b", "c"], axis=3, num_outputs=3)],
                                                  [("x", X4)]),  # 7 = 3 + 3 + 1
               {28: {"STRIDED_SLICE": 3}, 29: {"SLICE": 3}})
    yield Case("split-input-sizes", _graph([h.make_node("Split", ["x", "s"], ["a", "b"], axis=-1)], [("x", X4)],
                                           [("s", _i64(2, 5))], opset=13),
               {28: {"STRIDED_SLICE": 2}, 29: {"SLICE": 2}, 34: {"SLICE": 2}})
    yield Case("split-attribute-sizes", _graph([h.make_node("Split", ["x"], ["a", "b", "c"], axis=2, split=[1, 2, 6])],
                                               [("x", X3)], opset=11),
               {29: {"SLICE": 3}})
    yield Case("split-default-equal", _graph([h.make_node("Split", ["x"], ["a", "b"], axis=0)], [("x", X3)], opset=11),
               {29: {"SPLIT": 1}})
    # only the parts something reads are sliced out
    yield Case("split-unread-part", _graph([h.make_node("Split", ["x", "s"], ["a", "b", "c"], axis=1),
                                            h.make_node("Relu", ["a"], ["ra"]), h.make_node("Relu", ["c"], ["rc"])],
                                           [("x", X4)], [("s", _i64(1, 2, 3))], opset=13, outputs=["ra", "rc"]),
               {29: {"SLICE": 2, "RELU": 2}})


def _slice_cases():
    yield Case("slice-steps", _graph([h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [("x", X4)],
                                     [("st", _i64(1, -1, 0)), ("en", _i64(5, -100, 7)), ("ax", _i64(1, 3, 2)),
                                      ("sp", _i64(2, -2, 1))]),
               {27: "STRIDED_SLICE needs Android API 28", 28: {"STRIDED_SLICE"}, 29: {"STRIDED_SLICE"}})
    yield Case("slice-reverse-whole-axis", _graph([h.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])],
                                                  [("x", X3)], [("st", _i64(-1)), ("en", _i64(INT64_MIN)),
                                                                ("ax", _i64(2)), ("sp", _i64(-1))]),
               {28: {"STRIDED_SLICE"}, 34: {"STRIDED_SLICE"}})
    yield Case("slice-unit-steps", _graph([h.make_node("Slice", ["x", "st", "en", "ax"], ["y"])], [("x", X4)],
                                          [("st", _i64(1, 2)), ("en", _i64(-2, INT64_MAX)), ("ax", _i64(1, -1))]),
               {28: {"STRIDED_SLICE"}, 29: {"SLICE"}})
    yield Case("slice-opset9-attributes", _graph([h.make_node("Slice", ["x"], ["y"], starts=[0, 3], ends=[1, 8],
                                                              axes=[0, 2])], [("x", X3)], opset=9),
               {29: {"SLICE"}})
    yield Case("slice-whole-tensor", _graph([h.make_node("Slice", ["x", "st", "en"], ["y"])], [("x", X3)],
                                            [("st", _i64(0)), ("en", _i64(INT64_MAX))]),
               {29: {"RESHAPE"}})  # no slice at all: the output is a copy of the input


def _gather_cases():
    yield Case("gather-vector-indices", _graph([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], [("x", X4)],
                                               [("i", _i64(4, 0, -1, 0))]),
               {28: "GATHER needs Android API 29", 29: {"GATHER": 1}, 34: {"GATHER": 1}})
    yield Case("gather-scalar-index", _graph([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], [("x", X3)],
                                             [("i", np.array(0, np.int64))]),  # a ViT's class token
               {29: {"GATHER", "RESHAPE"}})
    yield Case("gather-matrix-indices", _graph([h.make_node("Gather", ["x", "i"], ["y"], axis=2)], [("x", X3)],
                                               [("i", np.array([[0, -1], [2, 3]], np.int64))]),
               {29: {"GATHER", "RESHAPE", "TRANSPOSE"}})  # a rank-4 output: NHWC inside
    yield Case("gather-index-out-of-range", _graph([h.make_node("Gather", ["x", "i"], ["y"], axis=0)], [("x", X3)],
                                                   [("i", _i64(0, 2))]),
               {34: "Gather indices outside [-2, 2)"})


def _pad(mode, pads, shape, opset=18, axes=None):
    inits = [("p", np.array(pads, np.int64))] + ([("ax", np.array(axes, np.int64))] if axes else [])
    ins = ["x", "p"] + (["", "ax"] if axes else [])
    return _graph([h.make_node("Pad", ins, ["y"], mode=mode)], [("x", shape)], inits, opset=opset)


def _pad_cases():
    yield Case("pad-reflect", _pad("reflect", [0, 0, 2, 3, 0, 0, 1, 4], X4),
               {28: "GATHER needs Android API 29", 29: {"GATHER": 2}, 33: {"GATHER": 2}, 34: {"MIRROR_PAD": 1}})
    yield Case("pad-reflect-axes", _pad("reflect", [2, 3], X3, axes=[-1]),
               {30: {"GATHER": 1}, 34: {"MIRROR_PAD": 1}})
    yield Case("pad-edge", _pad("edge", [0, 1, 2, 3, 0, 4, 1, 9], X4), {29: {"GATHER": 3}, 34: {"GATHER": 3}})
    yield Case("pad-wrap", _pad("wrap", [1, 0, 3, 0, 2, 9], X3, opset=19), {29: {"GATHER": 3}})
    yield Case("pad-constant-value", _graph([h.make_node("Pad", ["x", "p", "v"], ["y"])], [("x", X4)],
                                            [("p", _i64(0, 1, 1, 0, 0, 0, 2, 3)), ("v", np.array(1.5, np.float32))]),
               {29: {"PAD_V2"}})
    yield Case("pad-reflect-too-wide", _pad("reflect", [0, 0, 5, 0, 0, 0, 0, 0], X4),
               {34: "reflect Pad wider than its axis minus one"})


def _matmul_cases():
    a, w = (3, 5), _f32(3, 4, seed=7)
    yield Case("gemm-transA-constant-B", _graph([h.make_node("Gemm", ["a", "w", "c"], ["y"], transA=1, alpha=0.5)],
                                                [("a", a)], [("w", w), ("c", _f32(4, seed=8))]),
               {27: "TRANSPOSE needs Android API 28", 28: {"TRANSPOSE", "FULLY_CONNECTED"}})
    yield Case("gemm-runtime-B-transposed", _graph([h.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1,
                                                                alpha=0.5, beta=2.0)],
                                                   [("a", (5, 3)), ("b", (4, 5))], [("c", _f32(4, seed=8))]),
               {30: "BATCH_MATMUL needs Android API 33", 33: {"BATCH_MATMUL", "MUL", "ADD"}})
    yield Case("gemm-runtime-B-and-C", _graph([h.make_node("Gemm", ["a", "b", "c"], ["y"], transB=1)],
                                              [("a", (3, 5)), ("b", (4, 5)), ("c", (3, 4))]),
               {34: {"BATCH_MATMUL", "ADD"}})
    yield Case("matmul-runtime-B-without-batch", _graph([h.make_node("MatMul", ["a", "b"], ["y"])],
                                                        [("a", (2, 3, 5)), ("b", (5, 4))]),
               {34: {"BATCH_MATMUL", "RESHAPE"}})  # A's batch folds into its rows
    yield Case("matmul-constant-B-unit-batch", _graph([h.make_node("MatMul", ["a", "w"], ["y"])], [("a", (2, 3, 5))],
                                                      [("w", _f32(1, 5, 4, seed=9))]),
               {27: {"FULLY_CONNECTED", "RESHAPE"}})
    yield Case("matmul-batched-runtime", _graph([h.make_node("MatMul", ["a", "b"], ["y"])],
                                                [("a", (2, 3, 5)), ("b", (2, 5, 4))]),
               {33: {"BATCH_MATMUL"}})
    # the optimizer's batched FusedMatMul with a bias: BATCH_MATMUL then an ADD of the broadcast bias
    onnx_mm = _graph([h.make_node("MatMul", ["a", "b"], ["ab"]), h.make_node("Add", ["ab", "bias"], ["y"])],
                     [("a", (2, 3, 5)), ("b", (2, 5, 4))], [("bias", _f32(4, seed=10))])
    fused_mm = _graph([h.make_node("FusedMatMul", ["a", "b", "bias"], ["y"], domain="com.minirt")],
                      [("a", (2, 3, 5)), ("b", (2, 5, 4))], [("bias", _f32(4, seed=10))], domains=["com.minirt"])
    fused_mm.graph.output[0].CopyFrom(onnx_mm.graph.output[0])  # ONNX's shape inference does not know the op
    yield Case("fusedmatmul-batched-bias", fused_mm, {33: {"BATCH_MATMUL", "ADD"}}, reference=onnx_mm)
    yield Case("matmul-broadcast-batch", _graph([h.make_node("MatMul", ["a", "b"], ["y"])],
                                                [("a", (1, 3, 5)), ("b", (2, 5, 4))]),
               {34: "NNAPI's BATCH_MATMUL takes equal batches"})


_LN_OPS = {"MEAN": 2, "SUB": 1, "MUL": 3, "ADD": 2, "RSQRT": 1}


def _layernorm_cases():
    def ln(shape, axis, scale_shape, bias=True, domain="", **kw):
        inits = [("g", _f32(*scale_shape, seed=3))] + ([("b", _f32(*scale_shape, seed=4))] if bias else [])
        node = h.make_node("LayerNormalization", ["x", "g"] + (["b"] if bias else []), ["y"], axis=axis,
                           domain=domain, **kw)
        return _graph([node], [("x", shape)], inits, opset=17, domains=[domain] if domain else [])

    yield Case("layernorm-last-axis", ln(X3, -1, (9,), epsilon=1e-3),
               {28: "RSQRT needs Android API 29", 29: _LN_OPS, 34: _LN_OPS})
    yield Case("layernorm-rank4-trailing-axes", ln(X4, 2, (5, 7)), {29: _LN_OPS})  # NHWC axes 1 and 2
    yield Case("layernorm-rank4-channels-on", ln(X4, 1, (6, 5, 7)), {30: _LN_OPS})
    yield Case("layernorm-without-bias", ln(X3, -1, (9,), bias=False), {29: {**_LN_OPS, "ADD": 1}})
    yield Case("layernorm-runtime-scale", _graph([h.make_node("LayerNormalization", ["x", "g"], ["y"])],
                                                 [("x", X3), ("g", (9,))], opset=17),
               {29: {**_LN_OPS, "ADD": 1, "RESHAPE": 1}})  # the scale reshaped to (1, 1, 9)
    onnx_ln, minirt_ln = ln(X3, -1, (9,)), ln(X3, -1, (9,), domain="com.minirt")
    minirt_ln.graph.output[0].CopyFrom(onnx_ln.graph.output[0])  # ONNX's shape inference does not know the op
    yield Case("layernorm-com.minirt", minirt_ln, {29: _LN_OPS}, reference=onnx_ln)
    yield Case("layernorm-mean-output-read", _graph([h.make_node("LayerNormalization", ["x", "g"], ["y", "mean"])],
                                                    [("x", X3)], [("g", _f32(9))], opset=17),
               {34: "LayerNormalization's Mean / InvStdDev outputs"})


def _conv1d(group=1, **attrs):
    w = _f32(4 if group == 1 else 6, 6 // group, 3, seed=5)
    return _graph([h.make_node("Conv", ["x", "w", "b"], ["y"], group=group, **attrs)], [("x", X3)],
                  [("w", w), ("b", _f32(w.shape[0], seed=6))])


def _conv1d_cases():
    ops = {"RESHAPE", "TRANSPOSE", "CONV_2D"}  # (N, C, L) -> NHWC (N, 1, L, C) -> CONV_2D -> (N, M, L')
    yield Case("conv1d-pads-strides-dilations", _conv1d(pads=[1, 2], strides=[2], dilations=[2]),
               {27: "TRANSPOSE needs Android API 28", 28: "a dilated convolution needs Android API 29", 29: ops,
                34: ops})
    yield Case("conv1d-same-upper", _conv1d(auto_pad="SAME_UPPER", strides=[2]), {28: ops})
    yield Case("conv1d-depthwise", _conv1d(group=6, pads=[1, 1]), {28: {"RESHAPE", "TRANSPOSE", "DEPTHWISE_CONV_2D"}})
    # one input channel and a length-1 output: both layout changes are reshapes, so API 27 takes it
    yield Case("conv1d-single-channel", _graph([h.make_node("Conv", ["x", "w"], ["y"])], [("x", (1, 1, 5))],
                                               [("w", _f32(3, 1, 5))]),
               {27: {"RESHAPE", "CONV_2D"}})


def _softmax_cases():
    # attention scores (B, heads, N, N) softmaxed along ONNX's last axis: NHWC's axis 2 inside
    yield Case("softmax-rank4-last-onnx-axis", _graph([h.make_node("Softmax", ["x"], ["y"], axis=-1)], [("x", X4)]),
               {27: "TRANSPOSE needs Android API 28", 28: {"TRANSPOSE": 2, "SOFTMAX": 1}, 29: {"SOFTMAX": 1},
                34: {"SOFTMAX": 1}})
    yield Case("softmax-rank4-channels", _graph([h.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", X4)]),
               {27: {"SOFTMAX": 1}})  # NHWC's last axis: no axis operand
    yield Case("softmax-rank3-middle-axis", _graph([h.make_node("Softmax", ["x"], ["y"], axis=1)], [("x", X3)]),
               {28: "Softmax on a rank-3 tensor needs Android API 29", 29: {"SOFTMAX": 1}})


def _pool_lrn_fill_cases():
    # onnx's light GoogLeNet / AlexNet / ZFNet: LRN of 5 channels; even sizes have a lopsided window
    for size in (3, 5):
        yield Case(f"lrn-size{size}", _graph([h.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.75,
                                                          bias=1.5)], [("x", (1, 7, 5, 6))]),
                   {27: {"LOCAL_RESPONSE_NORMALIZATION": 1}})
    yield Case("lrn-even-size", _graph([h.make_node("LRN", ["x"], ["y"], size=4)], [("x", (1, 7, 5, 6))]),
               {27: "LRN of even size 4"})
    # AveragePool with padding TFLite's SAME does not say (ShuffleNet's 3x3 / 2 with pads 1 on an even
    # plane), or counted: PAD, a pool without padding, and the count correction (MUL) when not counted
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    yield Case("avgpool-pads-not-same", _graph([h.make_node("AveragePool", ["x"], ["y"], **pool)], [("x", (1, 3, 8, 8))]),
               {28: {"PAD": 1, "AVERAGE_POOL_2D": 1, "MUL": 1}})
    yield Case("avgpool-pads-counted", _graph([h.make_node("AveragePool", ["x"], ["y"], count_include_pad=1, **pool)],
                                              [("x", (1, 3, 7, 9))]), {28: {"PAD": 1, "AVERAGE_POOL_2D": 1}})
    yield Case("avgpool-ceil-pads-not-counted", _graph([h.make_node("AveragePool", ["x"], ["y"], ceil_mode=1, kernel_shape=[3, 3],
                                                                    strides=[2, 2], pads=[0, 1, 0, 1])], [("x", (1, 3, 8, 8))]),
               {28: {"PAD": 1, "AVERAGE_POOL_2D": 1, "MUL": 1}})
    yield Case("avgpool-ceil-pads-counted", _graph([h.make_node("AveragePool", ["x"], ["y"], ceil_mode=1, count_include_pad=1,
                                                                kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
                                                   [("x", (1, 3, 8, 8))]), {28: "counting its padding with ceil_mode"})
    yield Case("avgpool-pads-same", _graph([h.make_node("AveragePool", ["x"], ["y"], **pool)], [("x", (1, 3, 7, 7))]),
               {27: {"AVERAGE_POOL_2D": 1}})  # TFLite's SAME: one pool
    # weights made by ConstantOfShape (the light zoo's): constants to the model, the node lowers to nothing
    w_fill = h.make_tensor("v", TP.FLOAT, [1], [0.02])
    yield Case("conv-constant-of-shape-weights", _graph(
        [h.make_node("ConstantOfShape", ["wshape"], ["w"], value=w_fill),
         h.make_node("ConstantOfShape", ["bshape"], ["b"], value=h.make_tensor("v", TP.FLOAT, [1], [-0.5])),
         h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         h.make_node("ConstantOfShape", ["ashape"], ["a"], value=h.make_tensor("v", TP.FLOAT, [1], [0.25])),
         h.make_node("Add", ["c", "a"], ["y"])], [("x", (1, 3, 6, 6))],
        [("wshape", _i64(4, 3, 3, 3)), ("bshape", _i64(4)), ("ashape", _i64(1, 4, 6, 6))]),
        {27: {"CONV_2D": 1, "ADD": 1}})


CASES = [c for gen in (_split_cases, _slice_cases, _gather_cases, _pad_cases, _matmul_cases, _layernorm_cases,
                       _conv1d_cases, _softmax_cases, _pool_lrn_fill_cases) for c in gen()]
LOWERED = [(c, lv) for c in CASES for lv, want in c.levels.items() if not isinstance(want, str)]
REFUSED = [(c, lv) for c in CASES for lv, want in c.levels.items() if isinstance(want, str)]


def _lower(model, level: int):
    """(blob, runtime input names) of every node of ``model`` lowered as one NNAPI model at API ``level``.

    Raises Unsupported with the reason of the first node the provider refuses (its support check is a
    trial lowering of the node alone at that level)."""
    m, _ = load_model(model)
    ctx = SupportContext(m, get_target(f"android-api{level}"), {})
    spec = NNAPISpec(level)
    for node in m.graph:
        ok, why = spec.supports(node, ctx)
        if not ok:
            raise Unsupported(why)
    part = PartitionIR.from_nodes("nnapi", list(m.graph))
    blob, options = spec.lower(part, ctx)
    assert options["min_api_level"] <= level
    return blob, [v.name for v in part.inputs]


def _ops_match(blob, want) -> None:
    ops = NNModel.from_bytes(blob).summary()["ops"]
    if isinstance(want, dict):
        assert ops == want, ops
    else:
        assert set(ops) == set(want), ops


def check_on_tflite(case, level, feeds, atol=1e-5) -> None:
    """``case`` lowered at API ``level`` runs its TFLite translation on LiteRT and gives onnxruntime's
    outputs on ``feeds`` (the NNAPI operations as expected, every graph output there)."""
    blob, names = _lower(case.model, level)
    _ops_match(blob, case.levels[level])
    got = tflite_program_from_nnapi_blob(blob)(*[feeds[n] for n in names])
    reference = case.reference or case.model
    sess = ort.InferenceSession(reference.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    out_names = NNModel.from_bytes(blob).output_names
    assert sorted(out_names) == sorted(o.name for o in case.model.graph.output)
    for name, g in zip(out_names, got):
        assert g.shape == want[name].shape, name
        np.testing.assert_allclose(g, want[name], rtol=1e-5, atol=atol, err_msg=name)


def check_refusal(case, level) -> None:
    """``case`` at API ``level`` is refused, and the reason says what its ``levels`` entry says."""
    with pytest.raises(Unsupported) as err:
        _lower(case.model, level)
    assert case.levels[level] in str(err.value), str(err.value)


def check_fake_library(fake_nnapi, case, level) -> None:
    """The validating fake NNAPI library accepts ``case`` lowered at API ``level`` and frees everything."""
    blob, names = _lower(case.model, level)
    feeds = case.feeds()
    prog = NNAPIProvider().compile(blob, None, None, {})
    outs = prog(*[feeds[n] for n in names])
    assert len(outs) == len(case.model.graph.output)
    prog.close()
    assert fake_nnapi.errors == 0, fake_nnapi.last_error
    assert fake_nnapi.live == 0


def case_tests(lowered, refused, feeds=lambda case: case.feeds(), atol=1e-5):
    """The three tests of a list of cases, for a test module to bind to its own names: the lowered ones
    against onnxruntime on LiteRT (``feeds(case)``) and on the fake library, the refused ones' reasons."""

    @pytest.mark.parametrize("case, level", lowered, ids=[f"{c.name}-api{lv}" for c, lv in lowered])
    def test_lowering_matches_onnxruntime_on_tflite(tflite_interpreter, case, level):
        check_on_tflite(case, level, feeds(case), atol)

    @pytest.mark.parametrize("case, level", refused, ids=[f"{c.name}-api{lv}" for c, lv in refused])
    def test_refusal_names_the_reason(case, level):
        check_refusal(case, level)

    @pytest.mark.parametrize("case, level", lowered, ids=[f"{c.name}-api{lv}" for c, lv in lowered])
    def test_fake_library_accepts_the_lowered_model(fake_nnapi, case, level):
        check_fake_library(fake_nnapi, case, level)

    return test_lowering_matches_onnxruntime_on_tflite, test_refusal_names_the_reason, \
        test_fake_library_accepts_the_lowered_model


(test_lowering_matches_onnxruntime_on_tflite, test_refusal_names_the_reason,
 test_fake_library_accepts_the_lowered_model) = case_tests(LOWERED, REFUSED)


SHAPE_CASES = ["split-num-outputs-uneven", "split-input-sizes", "split-attribute-sizes", "split-default-equal",
               "slice-steps", "slice-reverse-whole-axis", "slice-opset9-attributes", "gather-scalar-index",
               "gather-matrix-indices", "layernorm-rank4-trailing-axes"]


@pytest.mark.parametrize("name", SHAPE_CASES)
def test_shape_inference_agrees_with_onnxruntime(name):
    """``targets.nnapi.shapes.infer`` (for values ONNX's inference left without a shape) on the new ops."""
    from minirt.targets.nnapi import shapes

    case = next(c for c in CASES if c.name == name)
    m, _ = load_model(case.model)
    ctx = SupportContext(m, get_target("android-api34"), {})
    (node,) = [n for n in m.graph if n.op_type in ("Split", "Slice", "Gather", "LayerNormalization")]
    in_shapes = [None if v is None else shapes._static(v) or tuple(np.asarray(ctx.const(v)).shape)
                 for v in node.inputs]
    got = shapes.infer(node, in_shapes, ctx.const)
    sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, case.feeds())))
    assert got == [want[o.name].shape for o in node.outputs]


def test_fake_library_checks_the_new_operations(fake_nnapi):
    """The fake's shape rules catch a wrong SLICE size (so its acceptance above means something)."""
    blob, _ = _lower(_graph([h.make_node("Split", ["x", "s"], ["a", "b"], axis=2)], [("x", X3)],
                            [("s", _i64(4, 5))], opset=13), 29)
    model = NNModel.from_bytes(blob)
    code, ins, _ = model.operations[0]
    assert code == 86  # SLICE
    model.operands[ins[2]].value = model.operands[ins[2]].value + 1  # one element too many on every axis
    from minirt.providers.nnapi import NNAPIError

    with pytest.raises(NNAPIError, match="ANEURALNETWORKS_BAD_DATA"):
        NNAPIProvider().compile(model.to_bytes(), None, None, {})
    assert fake_nnapi.errors == 1 and "SLICE: axis 0" in fake_nnapi.last_error, fake_nnapi.last_error


# --- end to end: optimizer, partitioner, NNAPI programs run through their TFLite translation ----------


def _conv(name, x, cin, cout, k=3, **attrs):
    pad = k // 2
    return (h.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [name], pads=[pad] * 4, **attrs),
            [(f"{name}_w", _f32(cout, cin, k, k, seed=cout) * 0.2), (f"{name}_b", _f32(cout, seed=cin))])


def _c2f_block():
    """A YOLOv8 C2f-style block: conv, Split in halves, a conv on the second half, Concat of all three, conv."""
    nodes, inits = [], []
    for node, w in (_conv("c1", "x", 3, 16), _conv("c2", "h1", 8, 8), _conv("c3", "cat", 24, 8)):
        nodes.append(node)
        inits += w
    nodes[1:1] = [h.make_node("Relu", ["c1"], ["r1"]), h.make_node("Split", ["r1", "s"], ["h0", "h1"], axis=1)]
    nodes.insert(4, h.make_node("Concat", ["h0", "h1", "c2"], ["cat"], axis=1))
    return _graph(nodes, [("x", (1, 3, 32, 32))], inits + [("s", _i64(8, 8))], opset=13)


def _transformer_block():
    """LayerNorm, a projection, run-time attention scores (MatMul of two activations), the class token."""
    d = 32
    nodes = [h.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1),
             h.make_node("MatMul", ["n", "wq"], ["q"]), h.make_node("MatMul", ["n", "wk"], ["k"]),
             h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]), h.make_node("MatMul", ["q", "kt"], ["s"]),
             h.make_node("MatMul", ["s", "n"], ["o"]), h.make_node("Add", ["o", "x"], ["r"]),
             h.make_node("LayerNormalization", ["r", "g", "b"], ["n2"], axis=-1),
             h.make_node("Gather", ["n2", "zero"], ["cls"], axis=1),
             h.make_node("Gemm", ["cls", "wc"], ["logits"], transB=1)]
    inits = [("g", _f32(d, seed=1) + 1), ("b", _f32(d, seed=2)), ("wq", _f32(d, d, seed=3) * 0.1),
             ("wk", _f32(d, d, seed=4) * 0.1), ("zero", np.array(0, np.int64)), ("wc", _f32(10, d, seed=5))]
    return _graph(nodes, [("x", (1, 16, d))], inits, opset=17)


def _audio_frontend():
    """Whisper / wav2vec2-style 1-D convolutions (FusedConv with Relu after the optimizer), a reflect Pad, a Slice."""
    nodes = [h.make_node("Pad", ["x", "p"], ["xp"], mode="reflect"),
             h.make_node("Conv", ["xp", "w1", "b1"], ["c1"], pads=[1, 1]), h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2], pads=[1, 1]),
             h.make_node("Relu", ["c2"], ["r2"]), h.make_node("Add", ["r2", "skip"], ["s"]),
             h.make_node("Slice", ["s", "st", "en", "ax"], ["y"])]
    inits = [("p", _i64(0, 0, 2, 0, 0, 2)), ("w1", _f32(16, 8, 3, seed=1) * 0.3), ("b1", _f32(16, seed=2)),
             ("w2", _f32(16, 16, 3, seed=3) * 0.3), ("b2", _f32(16, seed=4)), ("skip", _f32(1, 16, 1, seed=5)),
             ("st", _i64(1)), ("en", _i64(-1)), ("ax", _i64(2))]
    return _graph(nodes, [("x", (1, 8, 40))], inits, opset=18)


END_TO_END = [("c2f", _c2f_block, 29), ("c2f", _c2f_block, 28), ("c2f", _c2f_block, 34),
              ("transformer", _transformer_block, 34), ("audio", _audio_frontend, 29),
              ("audio", _audio_frontend, 34)]


@pytest.mark.parametrize("name, make, level", END_TO_END, ids=[f"{n}-api{lv}" for n, _, lv in END_TO_END])
def test_partitioned_graph_runs_in_one_nnapi_partition(nnapi_on_tflite, name, make, level):
    model = make()
    shapes = {i.name: tuple(d.dim_value for d in i.type.tensor_type.shape.dim) for i in model.graph.input}
    art, plan, _ = build_partitioned(model, f"android-api{level}", shapes)
    report = plan.report()
    assert len(report["partitions"]) == 1 and not report["cpu_nodes"], report["cpu_nodes"]
    assert report["partitions"][0]["options"]["min_api_level"] <= level
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    assert [p["runs_on"] for p in sess.get_partitions()] == ["nnapi"]
    feeds = {k: _f32(*v, seed=11) for k, v in shapes.items()}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


# --- the cached real models (benchmarks/.cache/real, written by the benchmark scripts) -----------------
REAL_CACHE = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", ".cache", "real")
# model file, feed file, API level, most NNAPI partitions (measured: issue 27; one partition each at API 34
# since the rank-5 values, grouped convolutions, Gelu and InstanceNormalization lower)
CACHED = [("shufflenet_v2_x1_0", "shufflenet_v2", 34, 1), ("mobilevit_xs", "mobilevit_xs", 34, 1),
          ("mobilevit_xs", "mobilevit_xs", 28, 31), ("deit_tiny_patch16_224", "deit_tiny", 34, 1),
          ("whisper_encoder", "whisper_tiny_enc", 34, 1), ("bert", "bert_mini", 34, 1),
          ("regnet_y_400mf", "regnet_y_400mf", 34, 1), ("wav2vec2", "wav2vec2", 34, 1)]


@pytest.mark.parametrize("model, feed, level, most", CACHED, ids=[f"{f}-api{lv}" for _, f, lv, _ in CACHED])
def test_cached_real_model_matches_onnxruntime(nnapi_on_tflite, model, feed, level, most):
    path, feed_path = os.path.join(REAL_CACHE, model + ".onnx"), os.path.join(REAL_CACHE, feed + ".feed.npz")
    if not (os.path.exists(path) and os.path.exists(feed_path)):
        pytest.skip(f"{model} is not in benchmarks/.cache/real (the benchmark scripts export it)")
    feeds = dict(np.load(feed_path))
    art, plan, _ = build_partitioned(path, f"android-api{level}", {k: v.shape for k, v in feeds.items()})
    report = plan.report()
    assert 0 < len(report["partitions"]) <= most, len(report["partitions"])
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    assert all(p["runs_on"] == "nnapi" for p in sess.get_partitions()), sess.get_partitions()
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want):
        scale = max(1.0, float(np.abs(w).max()))
        assert float(np.abs(g - w).max()) <= 1e-4 * scale
