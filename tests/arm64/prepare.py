"""Host side of the arm64 tests: build the subset's artifacts and expected outputs.

    python -m tests.arm64.prepare OUT_DIR

For every case in :mod:`tests.arm64.subset` writes ``OUT_DIR/NAME.mrt`` (built
with minirt's builder) and ``OUT_DIR/NAME.npz`` (``in.INPUT`` arrays and
``out.OUTPUT`` arrays computed by onnxruntime on the source ONNX model), plus
``manifest.json``.  Inside the emulated Pi nothing but minirt, numpy and
pytest is then needed.  Needs the dev extra (onnx, onnx-ir, onnxruntime).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from minirt.builder import build
from tests.arm64.subset import CASES, LABELLED, MANIFEST

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
F = TensorProto.FLOAT


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    # Outputs declared without a type get the one shape inference finds.
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    types = {vi.name: vi.type for vi in inferred.graph.value_info}
    for out in m.graph.output:
        if not out.HasField("type"):
            out.type.CopyFrom(types[out.name])
    onnx.checker.check_model(m, full_check=True)
    return m


def _vi(name, elem, shape):
    if shape is None:  # type and shape inferred by the builder and onnxruntime
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, elem, shape)


def conv_block(rng):
    c = 8
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [
        _init("w1", w(c, 3, 3, 3)), _init("b1", w(c)),
        _init("bn_s", 1 + 0.1 * w(c)), _init("bn_b", w(c)), _init("bn_m", w(c)), _init("bn_v", 1 + np.abs(w(c))),
        _init("wd", w(c, 1, 3, 3)), _init("bd", w(c)),
        _init("lo", np.array(0, np.float32)), _init("hi", np.array(6, np.float32)),
        _init("wp", w(c, c, 1, 1)), _init("bp", w(c)),
        _init("wg", w(c, 5)), _init("bg", w(5)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("Conv", ["r1", "wd", "bd"], ["d1"], pads=[1, 1, 1, 1], group=c),
        helper.make_node("Clip", ["d1", "lo", "hi"], ["d2"]),
        helper.make_node("Conv", ["d2", "wp", "bp"], ["p1"]),
        helper.make_node("Add", ["p1", "r1"], ["res"]),
        helper.make_node("MaxPool", ["res"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["mp"], ["ap"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         count_include_pad=0),
        helper.make_node("GlobalAveragePool", ["ap"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["fl"]),
        helper.make_node("Gemm", ["fl", "wg", "bg"], ["y"]),
    ]
    m = _model(nodes, [_vi("x", F, [2, 3, 12, 12])], [_vi("y", F, [2, 5]), _vi("ap", F, None)], inits)
    return m, {"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)}


def conv_strided(rng):
    w = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)  # noqa: E731
    inits = [_init("w1", w(6, 4, 3, 3)), _init("b1", w(6)), _init("w2", w(6, 3, 3, 3)), _init("w3", w(4, 6, 1, 1))]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["a"], strides=[2, 2], pads=[1, 0, 2, 1]),
        helper.make_node("LeakyRelu", ["a"], ["a1"], alpha=0.1),
        helper.make_node("Conv", ["a1", "w2"], ["b"], dilations=[2, 2], pads=[2, 2, 2, 2], group=2),
        helper.make_node("Sigmoid", ["b"], ["bs"]),
        helper.make_node("Conv", ["bs", "w3"], ["c"]),
        helper.make_node("HardSwish", ["c"], ["y"]),
        helper.make_node("MaxPool", ["x"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                         dilations=[1, 1]),
    ]
    m = _model(nodes, [_vi("x", F, [1, 4, 15, 13])], [_vi("y", F, None), _vi("mp", F, None)], inits)
    return m, {"x": rng.standard_normal((1, 4, 15, 13)).astype(np.float32)}


def mlp_norm(rng):
    d, h = 16, 32
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    inits = [
        _init("w1", w(d, h)), _init("b1", w(h)), _init("g", 1 + w(h)), _init("beta", w(h)),
        _init("w2", w(h, 10)), _init("half", np.array(0.5, np.float32)), _init("one", np.array(1.0, np.float32)),
        _init("k", np.array(0.7978845608, np.float32)), _init("c3", np.array(0.044715, np.float32)),
        _init("three", np.array(3.0, np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("LayerNormalization", ["h1", "g", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        # tanh-approximated GELU, spelled out
        helper.make_node("Pow", ["ln", "three"], ["cube"]),
        helper.make_node("Mul", ["cube", "c3"], ["t0"]),
        helper.make_node("Add", ["ln", "t0"], ["t1"]),
        helper.make_node("Mul", ["t1", "k"], ["t2"]),
        helper.make_node("Tanh", ["t2"], ["t3"]),
        helper.make_node("Add", ["t3", "one"], ["t4"]),
        helper.make_node("Mul", ["ln", "t4"], ["t5"]),
        helper.make_node("Mul", ["t5", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["y"], axis=-1),
        helper.make_node("ReduceMean", ["gelu"], ["m"], axes=[-1], keepdims=0),
    ]
    m = _model(nodes, [_vi("x", F, [4, 3, d])], [_vi("y", F, None), _vi("m", F, None)], inits)
    return m, {"x": rng.standard_normal((4, 3, d)).astype(np.float32)}


def tensor_ops(rng):
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = [
        _init("shape", i64(2, 12, 5)), _init("starts", i64(1, 0)), _init("ends", i64(12, 4)),
        _init("axes", i64(1, 2)), _init("steps", i64(2, 1)), _init("idx", i64(3, 0, 3)),
        _init("pads", i64(0, 1, 0, 0, 2, 1)), _init("scales", np.array([1, 1, 2, 1.5], np.float32)),
        _init("k", i64(3)), _init("zero", np.array(0, np.float32)),
    ]
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),            # 2,2,5,6
        helper.make_node("Reshape", ["t", "shape"], ["r"]),                       # 2,12,5
        helper.make_node("Slice", ["r", "starts", "ends", "axes", "steps"], ["s"]),
        helper.make_node("Gather", ["s", "idx"], ["ga"], axis=1),
        helper.make_node("Pad", ["ga", "pads"], ["pd"], mode="reflect"),
        helper.make_node("Concat", ["ga", "ga"], ["cc"], axis=-1),
        helper.make_node("Resize", ["x", "", "scales"], ["rs"], mode="linear"),
        helper.make_node("TopK", ["rs", "k"], ["tv", "ti"], axis=-1),
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Where", ["pos", "x", "zero"], ["relu"]),
    ]
    outs = [_vi(n, e, None) for n, e in (("pd", F), ("cc", F), ("tv", F), ("ti", TensorProto.INT64),
                                        ("am", TensorProto.INT64), ("relu", F))]
    m = _model(nodes, [_vi("x", F, [2, 6, 2, 5])], outs, inits, opset=18)
    return m, {"x": rng.standard_normal((2, 6, 2, 5)).astype(np.float32)}


def int_ops(rng):
    inits = [
        _init("sc", np.array(0.05, np.float32)), _init("zp", np.array(10, np.uint8)),
        _init("sc8", np.array(0.02, np.float32)), _init("zp8", np.array(-3, np.int8)),
        _init("add", np.array([1, 200, 255], np.uint8)), _init("lo", np.array(-100, np.int32)),
        _init("hi", np.array(100, np.int32)), _init("ax", np.array(1, np.int64)),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sc", "zp"], ["q"]),
        helper.make_node("Add", ["q", "add"], ["qa"]),                 # uint8 wraps around
        helper.make_node("DequantizeLinear", ["qa", "sc", "zp"], ["dq"]),
        helper.make_node("QuantizeLinear", ["x", "sc8", "zp8"], ["q8"]),
        helper.make_node("Cast", ["q8"], ["q32"], to=TensorProto.INT32),
        helper.make_node("Mul", ["q32", "q32"], ["sq"]),
        helper.make_node("Clip", ["sq", "lo", "hi"], ["cl"]),
        helper.make_node("CumSum", ["cl", "ax"], ["cs"]),
    ]
    outs = [_vi("qa", TensorProto.UINT8, None), _vi("dq", F, None), _vi("q8", TensorProto.INT8, None),
            _vi("cs", TensorProto.INT32, None)]
    m = _model(nodes, [_vi("x", F, [4, 3])], outs, inits, opset=14)
    return m, {"x": (rng.standard_normal((4, 3)) * 4).astype(np.float32)}


def _digits(target):
    data = np.load(DIGITS / "heldout.npz")
    return onnx.load(str(DIGITS / "digits_cnn.onnx")), {"image": data["image"][:48]}, data["label"][:48], target


def _reference(model: onnx.ModelProto, feeds: dict) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


GRAPHS = {"conv_block": conv_block, "conv_strided": conv_strided, "mlp_norm": mlp_norm,
          "tensor_ops": tensor_ops, "int_ops": int_ops}


def prepare(out_dir: str | Path, names=None) -> Path:
    """Write the artifacts, data and manifest for ``names`` (default: every case) into ``out_dir``."""
    import onnxruntime as ort

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240601)
    manifest = {"host": {"numpy": np.__version__, "onnxruntime": ort.__version__, "onnx": onnx.__version__},
                "cases": {}}
    for name in names or CASES:
        labels = None
        target = "generic"
        if name.startswith("digits_"):
            model, feeds, labels, target = _digits(name.split("_", 1)[1])
        else:
            model, feeds = GRAPHS[name](rng)
        expected = _reference(model, feeds)
        # (float32 on every target: the cases compare with onnxruntime's float outputs; a Pi target would
        # otherwise choose its int8 mode, D87)
        report = build(model.SerializeToString(), out / f"{name}.mrt", target=target, quantize="none")
        arrays = {f"in.{k}": v for k, v in feeds.items()}
        arrays.update({f"out.{k}": v for k, v in expected.items()})
        if labels is not None:
            arrays["label"] = labels
        np.savez(out / f"{name}.npz", **arrays)
        rtol, atol = CASES[name]
        manifest["cases"][name] = {
            "artifact": f"{name}.mrt", "data": f"{name}.npz", "target": target, "rtol": rtol, "atol": atol,
            "inputs": list(feeds), "outputs": list(expected), "labelled": name in LABELLED,
            "ops": report.op_histogram,
        }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("cases", nargs="*", help="case names (default: all)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    out = prepare(args.out_dir, args.cases or None)
    print(f"wrote {len(args.cases or CASES)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
