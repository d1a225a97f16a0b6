"""Builds that follow the target profile: ``--quantize auto``."""
import os

import numpy as np

import minirt
from minirt.builder.build import build
from tests.quantize.conftest import DIGITS, ROOT


def test_quantize_auto_follows_the_target():
    """The target's mode when its cost model estimates it worth it on this model (D87): the digits
    CNN's small convs are not, in int8-dynamic without dot products (rpi4: float32); rpi5 int8 with
    calibration data (int8-dynamic without); generic float32.  The artifact records the mode used and
    the build says which it chose."""
    model, calib = DIGITS, os.path.join(ROOT, "examples", "digits", "calibration.npz")
    x = np.load(calib)["image"][:4]
    for target, calibration, mode in (("rpi4", None, None), ("rpi5", calib, "int8"),
                                      ("rpi5", None, "int8-dynamic"), ("generic", calib, None)):
        said = []
        report = build(model, None, target=target, quantize="auto", calibration=calibration, progress=said.append)
        assert any(m.startswith("--quantize auto") for m in said), said
        sess = minirt.Session(report.data)
        assert sess.metadata["build.options"]["quantize"] == mode, (target, calibration)
        assert sess.run(None, {"image": x})[0].shape == (4, 10)
