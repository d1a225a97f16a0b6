"""The NNAPI provider's C API call sequence, against a fake libneuralnetworks.so that validates every call.

The fake (tests/nnapi/fake_nnapi.c, built by the fixture with gcc) checks the
operand types and counts per operation, the create/finish order and the
lifetimes of handles and referenced constant buffers; any misuse is counted
and printed.  Numerics are not computed there (outputs are zeros): the
TFLite verification checks them.
"""
from __future__ import annotations

import gc
import json
import logging
import struct

import numpy as np
import pytest

import minirt
from minirt import providers
from minirt.providers.nnapi import NNAPIError, NNAPIProvider, decode_blob
from tests.nnapi.helpers import REAL_MODELS, build_partitioned, random_feeds

LEVELS = [("digits", 27), ("digits", 30), ("ppocr_cls", 28), ("ppocr_cls", 31), ("ppocr_det", 29),
          ("ppocr_det", 33)]


@pytest.mark.parametrize("name, level", LEVELS, ids=[f"{n}-api{lv}" for n, lv in LEVELS])
def test_fake_library_accepts_every_lowered_model(fake_nnapi, name, level):
    path_fn, shapes = REAL_MODELS[name]
    art, plan, _ = build_partitioned(path_fn(), f"android-api{level}", shapes)
    assert plan.report()["partitions"]
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    assert all(p["runs_on"] == "nnapi" for p in sess.get_partitions()), sess.get_partitions()
    assert fake_nnapi.errors == 0, fake_nnapi.last_error
    sess.run(None, random_feeds(shapes))
    sess.run(None, random_feeds(shapes, 1))
    assert fake_nnapi.errors == 0, fake_nnapi.last_error
    assert fake_nnapi.computes == 2 * len(plan.report()["partitions"])
    # one model + one compilation per partition stay alive; executions were released after each run
    assert fake_nnapi.live == 2 * len(plan.report()["partitions"])
    del sess
    gc.collect()
    assert fake_nnapi.live == 0, "model / compilation handles leaked"
    assert fake_nnapi.errors == 0, fake_nnapi.last_error


def test_start_and_wait_without_compute(fake_nnapi27):
    """A library without ANeuralNetworksExecution_compute (API 27-28): startCompute + Event_wait."""
    path_fn, shapes = REAL_MODELS["digits"]
    art, _, _ = build_partitioned(path_fn(), "android-api27", shapes)
    sess = minirt.Session(art, providers=["nnapi", "cpu"])
    (out,) = sess.run(None, random_feeds(shapes))
    assert out.shape == (1, 10) and not out.any()  # the fake's zeros: it ran through NNAPI
    assert fake_nnapi27.errors == 0, fake_nnapi27.last_error
    assert fake_nnapi27.computes == 1
    del sess
    gc.collect()
    assert fake_nnapi27.live == 0


def test_driver_refusal_falls_back_to_cpu(fake_nnapi, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_NNAPI_REFUSE_COMPILE", "1")
    path_fn, shapes = REAL_MODELS["digits"]
    art, _, _ = build_partitioned(path_fn(), "android-api29", shapes)
    with caplog.at_level(logging.INFO, logger="minirt"):
        sess = minirt.Session(art, providers=["nnapi", "cpu"])
    lines = [r.getMessage() for r in caplog.records if "partition 0" in r.getMessage()]
    assert len(lines) == 1 and "ANeuralNetworksCompilation_finish" in lines[0] and "OP_FAILED" in lines[0]
    assert sess.get_partitions()[0]["runs_on"] == "cpu"
    feeds = random_feeds(shapes)
    cpu = minirt.Session(art, providers=["cpu"]).run(None, feeds)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], cpu[0])
    gc.collect()
    assert fake_nnapi.live == 0, "handles of the refused compilation leaked"
    assert fake_nnapi.errors == 0, fake_nnapi.last_error


def _tamper(blob: bytes, edit) -> bytes:
    mv = memoryview(blob)
    _, hlen = struct.unpack_from("<II", mv, 8)
    header = json.loads(bytes(mv[16:16 + hlen]))
    base = 16 + hlen + ((-(16 + hlen)) % 16)
    edit(header)
    hj = json.dumps(header, separators=(",", ":")).encode()
    head = b"MRTNNAPI" + struct.pack("<II", 1, len(hj)) + hj
    head += b"\0" * ((-len(head)) % 16)
    return head + bytes(mv[base:])


def _digits_blob():
    path_fn, shapes = REAL_MODELS["digits"]
    # (a program on its own: no constant refers to the artifact's tensors, targets/nnapi/share.py)
    _, plan, _ = build_partitioned(path_fn(), "android-api29", shapes, share_weights=False)
    return plan.partitions[0].blob


@pytest.mark.parametrize("edit, message", [
    (lambda h: h["operations"][0][1].pop(), "CONV_2D: 9 inputs match no signature"),
    (lambda h: h["operands"][h["operations"][0][1][3]].update(t=0), "CONV_2D input 3: must be a constant INT32"),
    (lambda h: h.update(outputs=[h["inputs"][0]]), "produced by no operation"),
], ids=["operand-count", "operand-type", "output-not-produced"])
def test_fake_library_rejects_misuse_and_the_provider_says_so(fake_nnapi, edit, message):
    blob = _tamper(_digits_blob(), edit)
    with pytest.raises(NNAPIError, match="ANEURALNETWORKS_BAD_DATA"):
        NNAPIProvider().compile(blob, None, None, {})
    assert fake_nnapi.errors == 1 and message in fake_nnapi.last_error, fake_nnapi.last_error
    gc.collect()
    assert fake_nnapi.live == 0


def test_unknown_preference_is_refused(fake_nnapi):
    with pytest.raises(NNAPIError, match="unknown NNAPI preference"):
        NNAPIProvider().compile(_digits_blob(), None, None, {"preference": "fastest"})


@pytest.mark.parametrize("pref", ["low_power", "fast_single_answer", "sustained_speed"])
def test_preferences(fake_nnapi, pref):
    prog = NNAPIProvider().compile(_digits_blob(), None, None, {"preference": pref, "relax_fp32_to_fp16": True})
    prog(np.zeros((1, 1, 8, 8), np.float32))
    prog.close()
    assert fake_nnapi.errors == 0 and fake_nnapi.live == 0


def test_unavailable_without_the_library(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIRT_NNAPI_LIBRARY", str(tmp_path / "libneuralnetworks.so"))
    ok, why = NNAPIProvider().available()
    assert not ok and "does not load here" in why


def test_blob_decodes(fake_nnapi):
    d = decode_blob(_digits_blob())
    assert d["inputs"] and d["outputs"] and d["input_perm"] == [[0, 2, 3, 1]]
    assert {c for c, _, _ in d["operations"]} >= {3, 9, 17}  # CONV_2D, FULLY_CONNECTED, MAX_POOL_2D


def test_provider_registry_reports_nnapi_available(fake_nnapi):
    providers._instances.pop("nnapi", None)
    assert providers.availability("nnapi")[0]
    assert "NnapiExecutionProvider" in minirt.get_available_providers()
