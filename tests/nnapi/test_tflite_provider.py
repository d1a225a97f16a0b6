"""The "tflite" provider: partitions built for TFLite, run by the installed TFLite interpreter."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import minirt
from minirt.builder.load import load_model
from minirt.builder.lower import lower_model
from minirt.builder.partition import apply_plan, plan_partitions
from minirt.builder.passes import optimize
from minirt.builder.writer import ArtifactWriter
from minirt.providers.tflite import TFLiteProvider, decode_blob
from minirt.targets.profiles import get_target
from tests.nnapi.helpers import REAL_MODELS, random_feeds

ort = pytest.importorskip("onnxruntime")


def _build(name):
    path_fn, shapes = REAL_MODELS[name]
    m, _ = load_model(path_fn())
    optimize(m, 2, input_shapes=shapes)
    profile = dataclasses.replace(get_target("rpi4"), providers=("tflite", "cpu"))
    plan = plan_partitions(m, profile, {"input_shapes": shapes})
    w = ArtifactWriter()
    lower_model(m, w)
    apply_plan(plan, w)
    return w.to_bytes(), plan, path_fn(), shapes


@pytest.mark.parametrize("name", ["digits", "ppocr_cls", "ppocr_det"])
def test_tflite_provider_matches_onnxruntime(tflite_interpreter, name):
    art, plan, path, shapes = _build(name)
    assert plan.report()["partitions"]
    sess = minirt.Session(art, providers=["tflite", "cpu"])
    assert all(p["runs_on"] == "tflite" for p in sess.get_partitions()), sess.get_partitions()
    feeds = random_feeds(shapes)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for r, g in zip(ref, sess.run(None, feeds)):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4)


def test_blob_layout(tflite_interpreter):
    art, plan, _, _ = _build("digits")
    header, flat = decode_blob(plan.partitions[0].blob)
    assert flat[4:8] == b"TFL3"
    assert header["input_perm"] == [[0, 2, 3, 1]] and header["output_perm"] == [None]


def test_available_names_the_interpreter(tflite_interpreter):
    ok, why = TFLiteProvider().available()
    assert ok and "TFLite interpreter" in why
