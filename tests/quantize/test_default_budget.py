"""int8 accuracy defended by default (issue 20, item 5): without ``--accuracy-budget``, an int8 build
with data keeps the outputs' cosine to the float model's >= 0.99, returning the most sensitive layers
to float when it does not hold; the per-layer sensitivity table is in the report and in ``minirt
inspect``; "none" switches it off; without data it is not applied and the report says so."""
from __future__ import annotations

import os

from minirt.builder.quantize import QuantizeOptions, quantize
from minirt.cli import main
from tests.quantize.conftest import DIGITS, ROOT

NO_TIMING = dict(measure_latency=False)
CALIBRATION = os.path.join(ROOT, "examples", "digits", "calibration.npz")


def test_the_default_budget_holds_on_digits(digits, calib):
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING))
    assert report.budget["default"] is True and report.budget["spec"] == "cosine>=0.99"
    assert report.budget["met"] and report.budget["value"] >= 0.99 and not report.budget["reverted"]
    assert report.accuracy["logits"]["cosine"] >= 0.99
    assert "sensitivity: not measured (the budget held with every layer quantized)" in str(report)


def test_a_missed_default_budget_returns_layers_to_float_with_the_table(digits, calib):
    """A default budget the all-int8 model misses (here made strict): the layers return to float most
    sensitive first until it holds, and the report lists every layer's sensitivity."""
    strict = QuantizeOptions(**NO_TIMING, int8_budget="cosine>=0.99999")
    report = quantize(digits.clone(), "int8", calib, strict)
    b = report.budget
    assert b["default"] is True and b["reverted"], b
    assert set(b["sensitivity"]) == set(report.quantized) | {r["node"] for r in b["reverted"]}
    assert [r["node"] for r in b["reverted"]] == list(b["sensitivity"])[:len(b["reverted"])]  # most sensitive first
    assert b["met"] == (b["value"] >= 0.99999)
    text = str(report)
    assert "sensitivity (each layer quantized alone, the others float), most sensitive first:" in text
    assert all(f"returned to float: {r['node']}" in text for r in b["reverted"])
    # "none": no budget at all, the same layers as before the default existed
    off = quantize(digits.clone(), "int8", calib, QuantizeOptions(**NO_TIMING, accuracy_budget="none"))
    assert not off.budget and len(off.quantized) == len(report.quantized) + len(b["reverted"])


def test_no_data_no_default_budget(digits):
    report = quantize(digits, "int8-dynamic", None, QuantizeOptions(**NO_TIMING))
    assert not report.budget
    assert any("the default budget cosine>=0.99 was not applied" in w for w in report.warnings)


def test_inspect_prints_the_sensitivity_table(tmp_path, capsys):
    out = tmp_path / "digits.int8.mrt"
    assert main(["build", DIGITS, "-o", str(out), "--quantize", "int8", "--calibration", CALIBRATION,
                 "--accuracy-budget", "cosine>=0.99999", "-q"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert "accuracy budget cosine>=0.99999" in text and "layer(s) returned to float" in text
    assert "most sensitive first:" in text and "/0/Conv" in text
