"""Host side of the emulated-Pi tests: build the subset's artifacts and expected outputs, package
models for the device root, compare what the device computed.

    python -m tests.arm64.prepare OUT_DIR [--arch arm64|arm32]
    python -m tests.arm64.prepare package OUT_DIR PACKAGES_DIR --wheel minirt-...whl
    python -m tests.arm64.prepare compare OUT_DIR NAME OUTPUTS.npz

For every case in :mod:`tests.arm64.subset` writes ``OUT_DIR/NAME.mrt`` (built
with minirt's builder) and ``OUT_DIR/NAME.npz`` (``in.INPUT`` arrays,
``out.OUTPUT`` arrays computed by onnxruntime on the source ONNX model and, for
the int8 artifacts minirt quantized, ``x86.OUTPUT``: minirt's own outputs on
this host), plus ``manifest.json`` and the ONNX files of the packaged cases in
``OUT_DIR/models``.  Inside the emulated Pi nothing but minirt, numpy and
pytest is then needed.  ``package`` runs `minirt package` for the cases of
subset.PACKAGED with the given runtime wheel; ``compare`` checks the outputs
the device wrote.  Needs the dev extra (onnx, onnx-ir, onnxruntime, the
rapidocr-onnxruntime wheel's models).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from minirt.builder import build
from tests.arm64.compare import greedy_tokens
from tests.arm64.subset import (CASES, DECODER, DECODER_PROMPT, DECODER_TOKENS, LABELLED, MANIFEST, PACKAGED,
                                PI_TARGETS, QUANT_STEPS, X86_REL)

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


def attention(rng):
    """Self-attention as torch exports it (projections, heads split by Reshape + Transpose, Q K^T, scale,
    an additive mask per query, Softmax, the product with V): the builder makes it one
    ScaledDotProductAttention for the Pi (no accelerator), whose native call (sdpa_impl.h) runs it."""
    n, d, heads = 40, 32, 2
    w = lambda *s: (rng.standard_normal(s) * 0.2).astype(np.float32)  # noqa: E731
    inits = [_init("wq", w(d, d)), _init("wk", w(d, d)), _init("wv", w(d, d)),
             _init("split", np.array([1, n, heads, d // heads], np.int64)), _init("merge", np.array([1, n, d], np.int64)),
             _init("scale", np.array(1 / np.sqrt(d // heads), np.float32)),
             _init("mask", np.where(rng.random((n, n)) < 0.2, -1e4, 0).astype(np.float32))]
    nodes = []
    for name in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", "w" + name], [name + "0"]),
                  helper.make_node("Reshape", [name + "0", "split"], [name + "1"]),
                  helper.make_node("Transpose", [name + "1"], [name], perm=[0, 2, 1, 3])]
    nodes += [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["s1", "mask"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "merge"], ["y"]),
    ]
    m = _model(nodes, [_vi("x", F, [1, n, d])], [_vi("y", F, [1, n, d])], inits)
    return m, {"x": rng.standard_normal((1, n, d)).astype(np.float32)}


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


def _digits_data():
    data = np.load(DIGITS / "heldout.npz")
    return {"image": data["image"][:48]}, data["label"][:48]


def _ort_int8_digits(path: Path) -> None:
    """digits quantized by onnxruntime.quantization (static, QOperator: QLinearConv / QGemm, per-channel int8
    weights, uint8 activations; calibrated on the example's calibration images) into ``path``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    cal = np.load(DIGITS / "calibration.npz")["image"]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": cal[i:i + 32]} for i in range(0, len(cal), 32)])

        def get_next(self):
            return next(self.it, None)

    import logging

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # (its advice to pre-process the model, logged as warnings on the root logger)
    try:
        quantize_static(str(DIGITS / "digits_cnn.onnx"), str(path), Reader(), quant_format=QuantFormat.QOperator,
                        per_channel=True, weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    finally:
        root.setLevel(level)


def _output_step(model: onnx.ModelProto, output: str) -> float:
    """The quantization step of ``output``: the scale of the DequantizeLinear that makes it."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    node = next(n for n in model.graph.node if output in n.output)
    assert node.op_type == "DequantizeLinear", f"{output} is made by {node.op_type}, not DequantizeLinear"
    return float(np.max(inits[node.input[1]]))


def _reference(model: onnx.ModelProto, feeds: dict, exact_int8: bool = False) -> dict:
    import onnxruntime as ort

    if exact_int8:  # exact int32 sums on every x86-64 CPU (tests/quantize/conftest.py)
        from tests.quantize.conftest import ort_reference_session

        sess = ort_reference_session(model.SerializeToString())
    else:
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


GRAPHS = {"conv_block": conv_block, "conv_strided": conv_strided, "mlp_norm": mlp_norm, "attention": attention,
          "tensor_ops": tensor_ops, "int_ops": int_ops}
# real models: ONNX file (tests/test_real_models.py's) and input shape (rapidocr's normalisation of
# synthetic text images, seeded)
REAL = {"ppocr_cls": ("PPOCR_CLS", (2, 3, 48, 192), 10), "ppocr_det": ("PPOCR_DET", (1, 3, 96, 160), 0)}


def _case(name: str, arch: str, rng, models: Path):
    """(model, feeds, labels, target, build options, exact int8 reference) of case ``name``; the ONNX file
    of a packaged case is written to ``models``."""
    target = PI_TARGETS[arch].get(name, "generic")
    if name.startswith("digits_") and name.split("_", 1)[1] not in ("int8_ort", "int8_static", "int8_dynamic"):
        feeds, labels = _digits_data()
        return onnx.load(str(DIGITS / "digits_cnn.onnx")), feeds, labels, name.split("_", 1)[1], {}, False
    if name == "digits_int8_ort":
        feeds, labels = _digits_data()
        path = models / f"{name}.onnx"
        _ort_int8_digits(path)
        return onnx.load(str(path)), feeds, labels, target, {}, True
    if name in ("digits_int8_static", "digits_int8_dynamic"):
        feeds, labels = _digits_data()
        opts = ({"quantize": "int8", "calibration": str(DIGITS / "calibration.npz")} if name.endswith("static")
                else {"quantize": "int8-dynamic"})
        return onnx.load(str(DIGITS / "digits_cnn.onnx")), feeds, labels, target, opts, False
    if name in REAL:
        from tests import test_real_models as real

        attr, shape, seed = REAL[name]
        path = getattr(real, attr)
        if path is None:
            raise RuntimeError(f"{name}: its model is not installed (rapidocr-onnxruntime: pip install -e '.[dev]')")
        shutil.copyfile(path, models / f"{name}.onnx")
        return onnx.load(path), {"x": real.ppocr_input(shape, seed=seed)}, None, target, {}, False
    model, feeds = GRAPHS[name](rng)
    return model, feeds, None, target, {}, False


def prepare(out_dir: str | Path, names=None, arch: str = "arm64") -> Path:
    """Write the artifacts, data and manifest for ``names`` (default: every case) into ``out_dir``, the
    cases built for the Pi with ``arch``'s target (subset.PI_TARGETS)."""
    import onnxruntime as ort

    import minirt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(exist_ok=True)
    rng = np.random.default_rng(20240601)
    manifest = {"host": {"numpy": np.__version__, "onnxruntime": ort.__version__, "onnx": onnx.__version__},
                "arch": arch, "cases": {}}
    for name in names or CASES:
        model, feeds, labels, target, options, exact_int8 = _case(name, arch, rng, out / "models")
        expected = _reference(model, feeds, exact_int8)
        # (float32 unless the case says otherwise: the float cases compare with onnxruntime's float outputs;
        # a Pi target would otherwise choose its int8 mode, D87)
        report = build(model.SerializeToString(), out / f"{name}.mrt", target=target,
                       **({"quantize": "none"} | options))
        arrays = {f"in.{k}": v for k, v in feeds.items()}
        arrays.update({f"out.{k}": v for k, v in expected.items()})
        if labels is not None:
            arrays["label"] = labels
        rtol, atol = CASES[name]
        if name in QUANT_STEPS:
            atol = QUANT_STEPS[name] * max(_output_step(model, o) for o in expected)
        if name in X86_REL:  # minirt's own outputs here (x86-64), for the cross-architecture bound
            got = minirt.Session(str(out / f"{name}.mrt")).run(list(expected), feeds)
            arrays.update({f"x86.{k}": v for k, v in zip(expected, got)})
        np.savez(out / f"{name}.npz", **arrays)
        manifest["cases"][name] = {
            "artifact": f"{name}.mrt", "data": f"{name}.npz", "target": target, "rtol": rtol, "atol": atol,
            "x86_rel": X86_REL.get(name), "inputs": list(feeds), "outputs": list(expected),
            "labelled": name in LABELLED, "ops": report.op_histogram,
            "quantize": report.as_dict().get("quantize"),
        }
    manifest["decoder"] = _decoder(out / "decoder") if names is None else None
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out


def _decoder(out: Path) -> dict | None:
    """The subset's language model (subset.DECODER) in ``out``: genai_config.json naming ``model.mrt``, the
    .mrt minirt built from onnxruntime-genai's int4 conversion, the tokenizer files (for the special ids),
    and the greedy tokens minirt and onnxruntime-genai generate here from subset.DECODER_PROMPT.  None (the
    Pi test then skips) when the host cannot make the model (onnxruntime-genai, transformers or torch missing)."""
    import importlib.util
    import os

    if any(importlib.util.find_spec(m) is None for m in ("onnxruntime_genai", "transformers", "torch")):
        return None
    import minirt.genai as mg
    import onnxruntime_genai as og

    from tests.genai import make_decoders as md

    import tempfile

    with tempfile.TemporaryDirectory(prefix="minirt-genai-") as tmp:  # (the Pi gets only `out`)
        return _decoder_from(Path(md.make(os.environ.get("MINIRT_GENAI_TEST_CACHE") or tmp, [DECODER[0]],
                                          [DECODER[1]], size="tiny")[DECODER]), out, mg, og)


def _decoder_from(src: Path, out: Path, mg, og) -> dict:
    arch, kind = DECODER
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "genai_config.json").read_text())
    config["model"]["decoder"]["filename"] = "model.mrt"
    (out / "genai_config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    build(str(src / "model.onnx"), out / "model.mrt")

    return {"folder": out.name, "arch": arch, "kind": kind, "prompt": list(DECODER_PROMPT),
            "x86": greedy_tokens(mg, mg.Model(str(out)), DECODER_PROMPT, DECODER_TOKENS),
            "onnxruntime_genai": greedy_tokens(og, og.Model(str(src)), DECODER_PROMPT, DECODER_TOKENS)}


def package(artifacts: str | Path, out_dir: str | Path, wheel: str, names=PACKAGED) -> Path:
    """`minirt package` each case of ``names`` (their ONNX files in ``artifacts``/models, prepared) for its
    target with ``wheel`` into ``out_dir``/NAME, and write its inputs as ``out_dir``/NAME.input.npz."""
    import subprocess

    artifacts, out = Path(artifacts), Path(out_dir)
    manifest = json.loads((artifacts / MANIFEST).read_text())
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        case = manifest["cases"][name]
        cmd = [sys.executable, "-m", "minirt", "package", str(artifacts / "models" / f"{name}.onnx"),
               "--target", case["target"], "-o", str(out / name), "--wheel", str(wheel), "--quantize", "none", "-q"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        print(proc.stdout.strip())
        with np.load(artifacts / case["data"]) as data:
            np.savez(out / f"{name}.input.npz", **{k: data[f"in.{k}"] for k in case["inputs"]})
    return out


def compare(artifacts: str | Path, name: str, outputs: str | Path) -> list[str]:
    """Check the outputs a packaged case wrote on the device (``run.py run ... --out outputs``) against the
    prepared expected ones (compare.check_outputs)."""
    from tests.arm64.compare import check_outputs, load_case

    manifest = json.loads((Path(artifacts) / MANIFEST).read_text())
    case, _feeds, expected, labels, x86 = load_case(artifacts, manifest, name)
    with np.load(outputs) as data:
        got = {k: data[k] for k in data.files}
    return check_outputs(name, case, got, expected, labels, x86)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["package"]:
        p = argparse.ArgumentParser(prog="prepare.py package", description=package.__doc__.splitlines()[0])
        p.add_argument("artifacts")
        p.add_argument("out_dir")
        p.add_argument("--wheel", required=True)
        args = p.parse_args(argv[1:])
        package(args.artifacts, args.out_dir, args.wheel)
        return 0
    if argv[:1] == ["compare"]:
        p = argparse.ArgumentParser(prog="prepare.py compare", description=compare.__doc__.splitlines()[0])
        p.add_argument("artifacts")
        p.add_argument("name")
        p.add_argument("outputs")
        args = p.parse_args(argv[1:])
        try:
            lines = compare(args.artifacts, args.name, args.outputs)
        except AssertionError as exc:
            print(f"device check {args.name}: FAILED: {exc}")
            return 1
        print("\n".join(f"device check {line}" for line in lines))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("cases", nargs="*", help="case names (default: all)")
    p.add_argument("--arch", choices=sorted(PI_TARGETS), default="arm64",
                   help="the emulated architecture: the Pi target of the cases built for the Pi")
    args = p.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    out = prepare(args.out_dir, args.cases or None, args.arch)
    print(f"wrote {len(args.cases or CASES)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
