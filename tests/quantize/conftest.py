import os

import numpy as np
import pytest

from minirt.builder.build import _normalise
from minirt.builder.load import load_model
from minirt.builder.passes import optimize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")
HELDOUT = os.path.join(ROOT, "examples", "digits", "heldout.npz")

# onnxruntime's default u8 x s8 kernels (MatMulInteger, ConvInteger, QLinearConv, QLinearMatMul, QGemm, fused
# QDQ) on x86-64 CPUs without VNNI (AVX2, AVX-512F/BW) add pairs of products with vpmaddubsw, which saturates at
# int16: 255*127 + 255*127 = 64770 comes out as 32767.  They are exact on VNNI CPUs and arm64, so a test using
# onnxruntime as the reference for an int8 model would pass or fail depending on the CI machine's ISA.  This
# session config makes onnxruntime rewrite constant s8 weights to u8 (exact u8 x u8 kernels) on the CPUs that
# need it; it is a graph optimization, so it only acts with optimizations on and on constant weights.
ORT_EXACT_INT8 = ("session.x64quantprecision", "1")


def ort_reference_session(model):
    """An onnxruntime CPU session (path or serialized model) whose integer products are exact int32 sums on
    every CPU, as the ONNX spec and minirt compute them (see ORT_EXACT_INT8)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.add_session_config_entry(*ORT_EXACT_INT8)
    assert opts.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the rewrite needs them
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def optimized(path, opt_level=2):
    model, _ = load_model(path)
    _normalise(model)
    optimize(model, opt_level)
    return model


@pytest.fixture(scope="session")
def heldout():
    with np.load(HELDOUT) as d:
        return d["image"], d["label"]


@pytest.fixture
def digits():
    return optimized(DIGITS)


@pytest.fixture(scope="session")
def calib(heldout):
    images, _ = heldout
    return [{"image": images[i:i + 32]} for i in range(0, 128, 32)]
