"""The NNAPI lowering checked on real kernels: its TFLite translation against onnxruntime.

Every NNAPI model the builder lowers is translated op for op into a TFLite
flatbuffer and run by the TFLite interpreter (ai-edge-litert / tflite-runtime);
the results must match onnxruntime on the public real models (at several
Android API levels) and on the ONNX conformance cases whose operators the
lowering supports.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import minirt
from tests.nnapi.helpers import REAL_MODELS, build_partitioned, random_feeds

ort = pytest.importorskip("onnxruntime")




LEVEL_CASES = [("digits", 27), ("digits", 29), ("ppocr_cls", 27), ("ppocr_cls", 29), ("ppocr_cls", 30),
               ("ppocr_det", 28), ("ppocr_det", 29), ("ppocr_det", 30), ("ppocr_det", 33),
               ("ppocr_rec", 27), ("ppocr_rec", 33), ("transformer", 27), ("transformer", 33)]


@pytest.mark.parametrize("name, level", LEVEL_CASES, ids=[f"{n}-api{lv}" for n, lv in LEVEL_CASES])
def test_real_model_matches_onnxruntime(nnapi_on_tflite, name, level):
    path_fn, shapes = REAL_MODELS[name]
    path = path_fn()
    art, plan, _ = build_partitioned(path, f"android-api{level}", shapes)
    report = plan.report()
    assert report["partitions"], f"nothing lowered: {report['cpu_nodes'][:5]}"
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    assert all(p["runs_on"] == "nnapi" for p in sess.get_partitions()), sess.get_partitions()
    feeds = random_feeds(shapes)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = sess.run(None, feeds)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-3, atol=1e-4)
    # every partition's program stays within the target's API level
    for p in report["partitions"]:
        assert p["options"]["min_api_level"] <= level


def test_api_level_limits_what_is_lowered(nnapi_on_tflite):
    path_fn, shapes = REAL_MODELS["ppocr_det"]
    _, plan27, _ = build_partitioned(path_fn(), "android-api27", shapes)
    _, plan30, _ = build_partitioned(path_fn(), "android-api30", shapes)
    reasons = {c["reason"] for c in plan27.report()["cpu_nodes"]}
    assert any("RESIZE_NEAREST_NEIGHBOR needs Android API 29" in r for r in reasons), reasons
    assert plan30.report()["accelerated_share"] > plan27.report()["accelerated_share"]
    assert not plan30.report()["cpu_nodes"]


# --- ONNX conformance cases ----------------------------------------------------------------
def _conformance_candidates():
    from tests.conformance.cases import node_cases

    return sorted(node_cases())


def _lower_case(case):
    from minirt.builder.load import load_model
    from minirt.targets.nnapi import NNAPISpec
    from minirt.targets.profiles import get_target
    from minirt.targets.providers import PartitionIR, SupportContext

    model, _ = load_model(case.model)
    ctx = SupportContext(model, get_target("android-api34"), {})
    spec = NNAPISpec(34)
    nodes = list(model.graph)
    if not nodes or any(not spec.supports(n, ctx)[0] for n in nodes):
        return None
    part = PartitionIR.from_nodes("nnapi", nodes)
    if [v.name for v in part.outputs] != [v.name for v in model.graph.outputs]:
        return None
    try:
        blob, _ = spec.lower(part, ctx)
    except Exception:  # noqa: BLE001 - a case the lowering refuses as a whole is not one of "its" cases
        return None
    inputs = [v.name for v in part.inputs if ctx.const(v) is None]
    graph_inputs = [v.name for v in model.graph.inputs]
    return blob, [graph_inputs.index(n) for n in inputs]


def test_conformance_cases_match_on_tflite(tflite_interpreter):
    from tests.conformance.cases import _normalise, node_cases
    from tests.nnapi.helpers import tflite_program_from_nnapi_blob

    lowered, failures = [], []
    for name in _conformance_candidates():
        case = node_cases()[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                got = _lower_case(case)
            except Exception:  # noqa: BLE001
                got = None
        if got is None:
            continue
        blob, positions = got
        try:
            prog = tflite_program_from_nnapi_blob(blob)
            for inputs, expected in case.data_sets:
                inputs = [_normalise(x) for x in inputs]
                outs = prog(*[inputs[i] for i in positions])
                for e, a in zip(expected, outs):
                    e = _normalise(e)
                    np.testing.assert_allclose(a, e, rtol=max(case.rtol, 1e-3), atol=max(case.atol, 1e-5))
        except Exception as exc:  # noqa: BLE001
            failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        lowered.append(name)
    assert len(lowered) >= 40, lowered
    assert not failures, "\n".join(failures)
