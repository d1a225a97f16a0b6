import os

import numpy as np
import pytest

from builder.build import _normalise
from builder.load import load_model
from builder.passes import optimize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")
HELDOUT = os.path.join(ROOT, "examples", "digits", "heldout.npz")


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
