"""The sweep's pieces without Ray: canonical options, shard-merged metrics, the objective, the cache, the
modeled cost."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from minirt.builder.quantize.report import compare
from minirt.builder.sweep import metrics, objective
from minirt.builder.sweep import options as opts
from minirt.builder.sweep.cache import Cache
from minirt.builder.sweep.data import shard_bounds

from .conftest import DIGITS


def test_canonical_options_drop_what_the_mode_ignores():
    point = {"quantize": "none", "calibration_method": "entropy", "per_channel": False, "opt_level": 1}
    assert opts.canonical(point) == {"quantize": "none", "opt_level": 1, "input_shapes": {}, "weight_pack": "target"}
    dyn = opts.canonical({"quantize": "int8-dynamic", "calibration_method": "entropy", "per_channel": False})
    assert "calibration_method" not in dyn and dyn["per_channel"] is False
    full = opts.canonical({"quantize": "int8"})
    assert full["calibration_method"] == "minmax" and full["accuracy_budget"] is None
    kwargs = opts.build_kwargs(opts.canonical({"quantize": "fp16", "accuracy_budget": "none",
                                               "input_shapes": {"x": [1, 3, 48, 160]}}), {})
    assert kwargs["quantize"] == "fp16" and kwargs["accuracy_budget"] == "none"
    assert kwargs["input_shapes"] == {"x": (1, 3, 48, 160)} and kwargs["weight_pack"] is None
    assert opts.check_value("accuracy_budget", "cosine >= 0.995") == "cosine>=0.995"
    with pytest.raises(opts.OptionValueError):
        opts.check_value("opt_level", True)


def test_shard_bounds_cover_every_sample_once():
    for n, size in ((360, 60), (361, 60), (5, 60), (120, 7), (1, 1)):
        b = shard_bounds(n, size)
        assert b[0][0] == 0 and b[-1][1] == n and all(b[i][1] == b[i + 1][0] for i in range(len(b) - 1))
        assert all(0 < stop - start <= size for start, stop in b)


@pytest.mark.parametrize("name", ["cosine", "max-abs", "mean-abs", "top1-agreement", "accuracy", "accuracy-drop",
                                  "top1-drop"])
def test_merged_shards_equal_the_whole_set(name):
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((50, 10)).astype(np.float32)
    got = ref + rng.normal(0, 0.4, ref.shape).astype(np.float32)
    aux_ref, aux_got = rng.standard_normal((50, 3)), rng.standard_normal((50, 3))
    labels = rng.integers(0, 10, 50)
    metric = metrics.BUILTIN[name]
    shards = []
    for start, stop in shard_bounds(50, 12):
        out = {"logits": got[start:stop], "aux": aux_got[start:stop]}
        refs = {"logits": ref[start:stop], "aux": aux_ref[start:stop]}
        shards.append(metrics.shard_stats(metric, out, {"label": labels[start:stop]}, refs, labels[start:stop], None))
    merged = metrics.merge(metric, shards)
    whole = compare({"logits": [ref], "aux": [aux_ref]}, {"logits": [got], "aux": [aux_got]}, labels)
    from minirt.builder.quantize.sensitivity import Budget

    expected = {
        "cosine": min(r["cosine"] for r in whole.values()),
        "max-abs": max(r["max_abs"] for r in whole.values()),
        "mean-abs": max(r["mean_abs"] for r in whole.values()),
        "top1-agreement": whole["logits"]["top1_agreement"],
        "accuracy": whole["logits"]["quant_accuracy"],
        "accuracy-drop": Budget("accuracy-drop", 0).value({"logits": whole["logits"]}),
        "top1-drop": Budget("top1-drop", 0).value({"logits": whole["logits"]}),
    }[name]
    assert merged == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_a_user_metric_is_merged_by_sample_count():
    def frac_positive(outputs, data):
        return float((outputs["y"] > 0).mean())

    metric = metrics.Metric("m:f", True, user=frac_positive, user_name="m:f")
    y = np.array([1.0, -1, 1, 1, -1, 1, 1])
    shards = [metrics.shard_stats(metric, {"y": y[a:b]}, {"x": y[a:b]}, None, None, None) for a, b in ((0, 2), (2, 7))]
    assert metrics.merge(metric, shards) == pytest.approx(5 / 7)


def _row(cid, acc, lat, size, status="ok"):
    return {"candidate": cid, "accuracy": acc, "latency_modeled_ms": lat, "size_bytes": size, "status": status}


def test_choice_and_pareto():
    rows = [_row("a", 0.90, 1.0, 100), _row("b", 0.95, 3.0, 100), _row("c", 0.95, 2.0, 200),
            _row("d", 0.99, 9.0, 50), _row("e", 0.97, None, 10), _row("f", 0.999, 0.1, 1, status="failed")]
    ok = [r for r in rows if objective.feasibility(r, 150, 5.0)[0]]
    assert [r["candidate"] for r in ok] == ["a", "b"]
    assert objective.feasibility(rows[2], 150, 5.0) == (False, "size 200 B > 150 B")
    assert objective.feasibility(rows[4], None, 5.0)[1] == "modeled latency unknown"
    assert objective.best(ok, True)["candidate"] == "b"
    # ties on the metric: the lower modeled latency, then the smaller artifact
    assert objective.best([rows[1], rows[2]], True)["candidate"] == "c"
    assert objective.best([_row("x", 0.9, 1.0, 300), _row("w", 0.9, 1.0, 200)], True)["candidate"] == "w"
    # lower is better (an error metric): the smallest value wins
    assert objective.best([_row("p", 0.2, 1, 1), _row("q", 0.1, 1, 1)], False)["candidate"] == "q"
    # b is beaten by nothing (c is faster but bigger); a is the fastest; d the most accurate; e the smallest
    assert objective.pareto(rows, True) == {"a", "b", "c", "d", "e"}
    assert objective.pareto([_row("a", 0.9, 1, 1), _row("b", 0.9, 1, 2)], True) == {"a"}


def test_cache_entries_are_whole_and_checked(tmp_path):
    cache = Cache(tmp_path)
    data = b"artifact bytes"
    meta = {"status": "ok", "artifact_sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data)}
    cache.put_build("k1", meta, data)
    assert cache.get_build("k1") == (meta, data)
    assert not list(tmp_path.rglob("*.minirt-tmp"))
    (tmp_path / "builds" / "k1.mrt").write_bytes(b"another artifact")  # (not what the meta describes)
    assert cache.get_build("k1") is None
    cache.put_build("k2", {"status": "failed", "error": "BuildError: nothing to quantize"}, None)
    assert cache.get_build("k2") == ({"status": "failed", "error": "BuildError: nothing to quantize"}, None)
    (tmp_path / "evals" / "e1.json").write_text("{ half a fi")  # (damaged: recomputed)
    assert cache.get_eval("e1") is None
    cache.put_eval("e2", {"accuracy": 0.5})
    assert cache.get_eval("e2") == {"accuracy": 0.5}
    assert Cache(tmp_path, enabled=False).get_eval("e2") is None
    assert json.loads((tmp_path / "evals" / "e2.json").read_text()) == {"accuracy": 0.5}


def test_modeled_cost_is_the_builders_cost_model():
    from minirt.builder import build
    from minirt.builder.sweep import latency
    from minirt.targets.profiles import get_target

    model = str(DIGITS / "digits_cnn.onnx")
    profile = get_target("rpi4")
    fcost, basis = latency.float_cost(model, "digits", 2, None, None, profile)
    assert fcost > 0 and "rpi4 cost model" in basis
    report = build(model, None, target="rpi4", quantize="int8", calibration=str(DIGITS / "calibration.npz"))
    est = report.quantization["estimate"]
    cost, how = latency.modeled_cost(fcost, "int8", report.quantization)
    assert cost == pytest.approx(fcost * est["ratio"]) and "int8" in how
    # the cost model's own float total for this graph agrees with ours within its int8-layer accounting
    assert est["float_cost"] == pytest.approx(fcost, rel=0.05)
    assert latency.modeled_cost(fcost, "fp16", {})[0] == fcost
    assert latency.modeled_cost(fcost, "int8", {"estimate": {"ratio": None}})[0] is None
