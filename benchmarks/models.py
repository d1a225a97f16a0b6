"""The benchmark models: ONNX files built with onnx.helper (random weights, seeded) or shipped by packages.

Each entry of :data:`MODELS` is ``name -> (description, factory)`` where the
factory returns ``(onnx_path_or_model, feed)``.  Built models are small
stand-ins with the layer mix of the real architectures (the runtime's cost
depends on the layers and shapes, not on trained weights); BatchNorm is
folded into conv weights and biases as exporters do for inference.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

ROOT = Path(__file__).resolve().parent.parent
OPSET = 17


class _Graph:
    """A tiny graph-building helper: unique names, seeded He-initialised weights."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    def const(self, arr: np.ndarray, prefix: str = "c") -> str:
        name = self.name(prefix)
        self.inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def node(self, op: str, inputs: list, n_out: int = 1, **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(h.make_node(op, inputs, outs, name=self.name("n_" + op), **attrs))
        return outs[0] if n_out == 1 else outs

    def conv(self, x: str, cin: int, cout: int, k: int, s: int = 1, group: int = 1, act: str | None = "relu"):
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.01).astype(np.float32)
        y = self.node("Conv", [x, self.const(w, "w"), self.const(b, "b")], kernel_shape=[k, k], strides=[s, s],
                      pads=[k // 2] * 4, group=group)
        return self.act(y, act)

    def act(self, y: str, act: str | None):
        if act is None:
            return y
        if act == "relu":
            return self.node("Relu", [y])
        if act == "relu6":
            return self.node("Clip", [y, self.const(np.float32(0.0)), self.const(np.float32(6.0))])
        if act == "silu":
            return self.node("Mul", [y, self.node("Sigmoid", [y])])
        raise ValueError(act)

    def model(self, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        g = h.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = h.make_model(g, opset_imports=[h.make_opsetid("", OPSET)], producer_name="minirt-benchmarks")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m


# --------------------------------------------------------------------------- MobileNet-style CNN


def mobilenet(size: int = 224, width: float = 0.5) -> onnx.ModelProto:
    """MobileNetV1-style: 3x3 stem, 13 depthwise-separable blocks (ReLU6), global pool, classifier."""
    g = _Graph(1)

    def ch(c):
        return max(8, int(c * width))

    x = g.conv("image", 3, ch(32), 3, 2, act="relu6")
    cin = ch(32)
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for cout, s in plan:
        x = g.conv(x, cin, cin, 3, s, group=cin, act="relu6")  # depthwise
        x = g.conv(x, cin, ch(cout), 1, 1, act="relu6")  # pointwise
        cin = ch(cout)
    x = g.node("GlobalAveragePool", [x])
    x = g.node("Flatten", [x], axis=1)
    w = (g.rng.standard_normal((1000, cin)) * np.sqrt(1.0 / cin)).astype(np.float32)
    y = g.node("Gemm", [x, g.const(w), g.const(np.zeros(1000, np.float32))], transB=1)
    g.nodes[-1].output[0] = "logits"
    return g.model("mobilenet", [h.make_tensor_value_info("image", TP.FLOAT, [1, 3, size, size])],
                   [h.make_tensor_value_info("logits", TP.FLOAT, [1, 1000])])


# --------------------------------------------------------------------------- YOLO-style detector


def yolo(size: int = 320) -> onnx.ModelProto:
    """YOLOv8n-style: conv/SiLU backbone with C2f-like residual blocks, SPPF, upsample + concat neck, 2-scale head."""
    g = _Graph(2)

    def c2f(x, c, n):
        a = g.conv(x, c, c, 1, act="silu")
        half = c // 2
        y1, y2 = g.node("Split", [a, g.const(np.array([half, half], np.int64))], n_out=2, axis=1)
        parts, cur = [y1, y2], y2
        for _ in range(n):
            b = g.conv(cur, half, half, 3, act="silu")
            b = g.conv(b, half, half, 3, act="silu")
            cur = g.node("Add", [cur, b])
            parts.append(cur)
        cat = g.node("Concat", parts, axis=1)
        return g.conv(cat, half * (2 + n), c, 1, act="silu")

    def sppf(x, c):
        a = g.conv(x, c, c // 2, 1, act="silu")
        p1 = g.node("MaxPool", [a], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
        p2 = g.node("MaxPool", [p1], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
        p3 = g.node("MaxPool", [p2], kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2])
        return g.conv(g.node("Concat", [a, p1, p2, p3], axis=1), c * 2, c, 1, act="silu")

    x = g.conv("images", 3, 16, 3, 2, act="silu")  # 160
    x = g.conv(x, 16, 32, 3, 2, act="silu")  # 80
    x = c2f(x, 32, 1)
    x = g.conv(x, 32, 64, 3, 2, act="silu")  # 40
    p3 = c2f(x, 64, 2)
    x = g.conv(p3, 64, 128, 3, 2, act="silu")  # 20
    p4 = c2f(x, 128, 2)
    x = g.conv(p4, 128, 256, 3, 2, act="silu")  # 10
    x = c2f(x, 256, 1)
    p5 = sppf(x, 256)
    up = g.node("Resize", [p5, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    n4 = c2f(g.conv(g.node("Concat", [up, p4], axis=1), 384, 128, 1, act="silu"), 128, 1)
    up = g.node("Resize", [n4, "", g.const(np.array([1, 1, 2, 2], np.float32))], mode="nearest")
    n3 = c2f(g.conv(g.node("Concat", [up, p3], axis=1), 192, 64, 1, act="silu"), 64, 1)
    outs = []
    for i, (feat, c) in enumerate(((n3, 64), (n4, 128))):
        hd = g.conv(feat, c, 64, 3, act="silu")
        hd = g.conv(hd, 64, 64 + 80, 1, act=None)  # box (4*16) + 80 classes
        outs.append(hd)
        g.nodes[-1].output[0] = f"out{i}"
    cells = [(size // 8), (size // 16)]
    return g.model("yolo", [h.make_tensor_value_info("images", TP.FLOAT, [1, 3, size, size])],
                   [h.make_tensor_value_info(f"out{i}", TP.FLOAT, [1, 144, c, c]) for i, c in enumerate(cells)])


# --------------------------------------------------------------------------- transformer encoder


def transformer(seq: int = 64, d: int = 128, heads: int = 4, layers: int = 2, ff: int = 512) -> onnx.ModelProto:
    """A BERT-style encoder: LayerNorm, multi-head attention (MatMul/Softmax), Erf-GELU feed-forward, residuals."""
    g = _Graph(3)
    dh = d // heads

    def lin(x, cin, cout):
        w = (g.rng.standard_normal((cin, cout)) * np.sqrt(1.0 / cin)).astype(np.float32)
        return g.node("Add", [g.node("MatMul", [x, g.const(w, "w")]), g.const(np.zeros(cout, np.float32), "b")])

    def ln(x):
        return g.node("LayerNormalization", [x, g.const(np.ones(d, np.float32)), g.const(np.zeros(d, np.float32))],
                      axis=-1, epsilon=1e-5)

    def heads_of(x):
        r = g.node("Reshape", [x, g.const(np.array([1, seq, heads, dh], np.int64))])
        return g.node("Transpose", [r], perm=[0, 2, 1, 3])

    x = "tokens"
    for _ in range(layers):
        q, k, v = (heads_of(lin(x, d, d)) for _ in range(3))
        kt = g.node("Transpose", [k], perm=[0, 1, 3, 2])
        s = g.node("Mul", [g.node("MatMul", [q, kt]), g.const(np.float32(1.0 / np.sqrt(dh)))])
        p = g.node("Softmax", [s], axis=-1)
        o = g.node("Transpose", [g.node("MatMul", [p, v])], perm=[0, 2, 1, 3])
        o = g.node("Reshape", [o, g.const(np.array([1, seq, d], np.int64))])
        x = ln(g.node("Add", [x, lin(o, d, d)]))
        f = lin(x, d, ff)
        gelu = g.node("Mul", [g.node("Mul", [f, g.const(np.float32(0.5))]),
                              g.node("Add", [g.node("Erf", [g.node("Div", [f, g.const(np.float32(np.sqrt(2.0)))])]),
                                             g.const(np.float32(1.0))])])
        x = ln(g.node("Add", [x, lin(gelu, ff, d)]))
    g.nodes[-1].output[0] = "hidden"
    return g.model("encoder", [h.make_tensor_value_info("tokens", TP.FLOAT, [1, seq, d])],
                   [h.make_tensor_value_info("hidden", TP.FLOAT, [1, seq, d])])


# --------------------------------------------------------------------------- registry


def _ppocr_det() -> str:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("PP-OCRv4 det needs the rapidocr_onnxruntime package (pip install -e '.[dev]')")
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", "ch_PP-OCRv4_det_infer.onnx")
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    return path


def _feed(name: str, shape: tuple, seed: int = 0) -> dict:
    return {name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


# name -> (description, () -> (ONNX path or ModelProto, feed, input shapes for the builder or None))
MODELS = {
    "digits": ("demo digits CNN, 1x1x8x8",
               lambda: (str(ROOT / "examples" / "digits" / "digits_cnn.onnx"), _feed("image", (1, 1, 8, 8)),
                        {"image": [1, 1, 8, 8]})),
    "mobilenet": ("MobileNetV1-style 0.5x, 1x3x224x224",
                  lambda: (mobilenet(), _feed("image", (1, 3, 224, 224)), None)),
    "ppocr_det": ("PP-OCRv4 det (rapidocr), 1x3x320x320",
                  lambda: (_ppocr_det(), _feed("x", (1, 3, 320, 320)), {"x": [1, 3, 320, 320]})),
    "yolo": ("YOLOv8n-style detector, 1x3x320x320",
             lambda: (yolo(), _feed("images", (1, 3, 320, 320)), None)),
    "transformer": ("2-layer encoder, seq 64, d 128",
                    lambda: (transformer(), _feed("tokens", (1, 64, 128)), None)),
}
