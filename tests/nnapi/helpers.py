"""Shared helpers of the NNAPI / TFLite tests: build partitioned artifacts, run NNAPI programs on TFLite."""
from __future__ import annotations

import os

import numpy as np

from minirt.builder.load import load_model
from minirt.builder.lower import lower_model
from minirt.builder.partition import apply_plan, plan_partitions
from minirt.builder.passes import optimize
from minirt.builder.writer import ArtifactWriter
from minirt.targets.profiles import get_target
from minirt.tools.verify import _nnapi_on_tflite

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def rapidocr_model(name: str) -> str:
    import rapidocr_onnxruntime

    return os.path.join(os.path.dirname(rapidocr_onnxruntime.__file__), "models", name)


REAL_MODELS = {
    "digits": (lambda: os.path.join(MODELS, "digits", "digits_cnn.onnx"), {"image": (1, 1, 8, 8)}),
    "ppocr_cls": (lambda: rapidocr_model("ch_ppocr_mobile_v2.0_cls_infer.onnx"), {"x": (1, 3, 48, 192)}),
    "ppocr_det": (lambda: rapidocr_model("ch_PP-OCRv4_det_infer.onnx"), {"x": (1, 3, 320, 320)}),
    "ppocr_rec": (lambda: rapidocr_model("ch_PP-OCRv4_rec_infer.onnx"), {"x": (1, 3, 48, 320)}),
    "transformer": (lambda: os.path.join(MODELS, "transformer", "encoder.onnx"), {"x": (1, 16, 128)}),
}


def tflite_program_from_nnapi_blob(blob, artifact=None):
    """Compile an NNAPI provider blob by translating it to TFLite (what `minirt verify` runs off the device);
    ``artifact``: where the constants it shares with the CPU version are (targets/nnapi/share.py)."""
    return _nnapi_on_tflite(blob, None, artifact, {})


class NNAPIOnTFLite:
    """Test provider "nnapi": runs the NNAPI programs through their TFLite translation."""

    name = "nnapi"

    def __init__(self):
        self.compiled = 0

    def available(self):
        return True, "NNAPI programs translated to TFLite (tests)"

    def compile(self, blob, partition, artifact, options):
        self.compiled += 1
        return tflite_program_from_nnapi_blob(blob, artifact)


def build_partitioned(model, target: str, shapes: dict, opt_level: int = 2, share_weights: bool = True):
    """(artifact bytes, plan, model_ir) of ``model`` partitioned for ``target``; ``share_weights=False``:
    programs that hold all their constants (readable without the artifact)."""
    m, _ = load_model(model)
    optimize(m, opt_level, input_shapes=shapes)
    plan = plan_partitions(m, get_target(target), {"input_shapes": shapes})
    w = ArtifactWriter()
    lower_model(m, w)
    apply_plan(plan, w, share_weights=share_weights)
    return w.to_bytes(), plan, m


def random_feeds(shapes: dict, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
