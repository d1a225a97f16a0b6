"""examples/raspberry_pi's sensor example end to end: make_sensor_model.py trains, converts (skl2onnx) and
builds a 200-tree gradient-boosted classifier; sensor_classify.py classifies the held-out CSV one reading
at a time with minirt, with the labels onnxruntime gives on the same ONNX; bad CSVs get a clear message."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")
ort = pytest.importorskip("onnxruntime")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "raspberry_pi"
sys.path.insert(0, str(EXAMPLE))
import sensors  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("sensor")
    proc = subprocess.run([sys.executable, str(EXAMPLE / "make_sensor_model.py"), "--out", str(out), "--samples",
                           str(out / "readings.csv"), "--trees", "60"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_the_pi_script_classifies_the_readings_as_onnxruntime_does(built):
    proc = subprocess.run([sys.executable, str(EXAMPLE / "sensor_classify.py"), str(built / "readings.csv"), "--model",
                           str(built / "sensor_gbm.mrt"), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    x, truth = sensors.read_csv(built / "readings.csv")
    assert len(rows) == len(x) == 200
    sess = ort.InferenceSession(str(built / "sensor_gbm.onnx"), providers=["CPUExecutionProvider"])
    labels, probs = sess.run(None, {sess.get_inputs()[0].name: x})
    assert [r["state"] for r in rows] == [sensors.STATES[int(i)] for i in labels]
    np.testing.assert_allclose([r["probability"] for r in rows], probs.max(axis=1), atol=1e-4)
    accuracy = np.mean([r["state"] == t for r, t in zip(rows, truth)])
    assert accuracy > 0.9, accuracy  # (the simulated states overlap a little)
    assert (built / "sensor_gbm.mrt").stat().st_size < (built / "sensor_gbm.onnx").stat().st_size


def test_the_committed_readings_match_the_simulator():
    x, truth = sensors.read_csv(EXAMPLE / "samples" / "sensor_readings.csv")
    want_x, want_states = sensors.simulate(200, seed=2)
    np.testing.assert_allclose(x, want_x, rtol=1e-3)
    assert truth == [sensors.STATES[int(s)] for s in want_states]


@pytest.mark.parametrize("text, says", [("a,b\n1,2\n", "the header lacks temperature_c"),
                                        ("temperature_c,vibration_rms_g,current_a,humidity_pct,rpm\n1,2,x,4,5\n",
                                         "line 2: expected a number"),
                                        ("", "empty file")])
def test_a_bad_csv_is_named_with_what_was_expected(tmp_path, built, text, says):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    proc = subprocess.run([sys.executable, str(EXAMPLE / "sensor_classify.py"), str(bad), "--model",
                           str(built / "sensor_gbm.mrt")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
