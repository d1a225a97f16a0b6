"""Real-model parity of the optimizer: optimized minirt artifacts vs onnxruntime on the original ONNX.

Models: the digits demo CNN, PP-OCR's mobile classifier and v4 detector (from
the installed rapidocr_onnxruntime wheel) and onnx's ``light_*`` backend
models (weights are ConstantOfShape fills; the big ones are slow in numpy, so
they run only with MINIRT_SLOW_TESTS=1).  For the CNNs the node count must
fall by at least 30%.
"""
from __future__ import annotations

import glob
import importlib.util
import os

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

from minirt.builder.passes import optimize  # noqa: E402
from minirt.builder.passes import testing as T  # noqa: E402
import minirt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rapidocr(name):
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        return None
    p = os.path.join(os.path.dirname(spec.origin), "models", name)
    return p if os.path.exists(p) else None


_LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
_FAST_LIGHT = {"squeezenet", "bvlc_alexnet", "zfnet512", "shufflenet", "inception_v1"}
_SLOW = os.environ.get("MINIRT_SLOW_TESTS") == "1"

CASES = [
    ("digits", os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx"), (2, 1, 8, 8)),
    ("ppocr_cls", _rapidocr("ch_ppocr_mobile_v2.0_cls_infer.onnx"), (1, 3, 48, 192)),
    ("ppocr_det", _rapidocr("ch_PP-OCRv4_det_infer.onnx"), (1, 3, 64, 96)),
]
for _p in sorted(glob.glob(os.path.join(_LIGHT, "light_*.onnx"))):
    _name = os.path.basename(_p)[len("light_"):-len(".onnx")]
    CASES.append((_name, _p, None))


@pytest.mark.parametrize("name,path,shape", CASES, ids=[c[0] for c in CASES])
def test_optimized_matches_onnxruntime(name, path, shape):
    if path is None or not os.path.exists(path):
        pytest.skip(f"{name}: model not installed")
    if path.startswith(_LIGHT) and name not in _FAST_LIGHT and not _SLOW:
        pytest.skip(f"{name}: slow in numpy; set MINIRT_SLOW_TESTS=1")
    model = T.load(path)
    x_info = [v for v in model.graph.inputs if v.name not in model.graph.initializers][0]
    if shape is None:
        shape = tuple(d if isinstance(d, int) else 1 for d in x_info.shape)
    before = len(list(model.graph))
    report = optimize(model, 2)
    after = len(list(model.graph))
    feeds = {x_info.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = minirt.Session(T.to_bytes(model)).run(None, feeds)
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4)
    assert report.nodes_before == before and report.nodes_after == after
    assert after <= 0.7 * before, f"{name}: nodes {before} -> {after} is less than a 30% reduction"
