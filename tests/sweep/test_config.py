"""Sweep configurations: TOML and YAML read alike; every mistake names the file, the key, the value and what
was expected, and reaches the command line as ``minirt sweep: error: ...`` (status 2), never a traceback.
No Ray here: configs are checked before anything runs."""
from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from minirt.builder.sweep import ConfigError, load_config
from minirt.builder.sweep.config import parse_size
from minirt.builder.sweep.space import expand
from minirt.cli import main

from .conftest import DIGITS

GOOD = f"""
targets = ["rpi4", {{ name = "rpi5", max_latency_ms = 1.5 }}]

[objective]
max_size = "64 KiB"
max_latency_ms = 2

[space]
quantize = ["none", "fp16", "int8-dynamic", "int8"]
calibration_method = ["minmax", "percentile", "entropy"]
per_channel = [true, false]

[[models]]
name = "digits"
path = "{DIGITS / 'digits_cnn.onnx'}"
calibration = "{DIGITS / 'calibration.npz'}"
eval = "{DIGITS / 'heldout.npz'}"
"""


def _write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def _error(tmp_path: Path, text: str, name: str = "sweep.toml") -> str:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text, name))
    return str(info.value)


def test_a_good_config(tmp_path):
    cfg = load_config(_write(tmp_path, GOOD))
    assert [t.name for t in cfg.targets] == ["rpi4", "rpi5"]
    assert cfg.limits("digits", "rpi4") == (65536, 2.0) and cfg.limits("digits", "rpi5") == (65536, 1.5)
    assert cfg.cache_dir == tmp_path / ".minirt-sweep" and cfg.output_dir == tmp_path / "sweep-results"
    assert cfg.models[0].input_names == ["image"] and cfg.models[0].metric.name == "accuracy"
    # 1 float + 1 fp16 + 2 int8-dynamic (per-channel or not) + 6 int8, per target: the options that do not
    # matter for a mode are not searched twice
    candidates = expand(cfg)
    assert len(candidates) == 2 * 10
    assert len({c.id for c in candidates}) == 20
    assert sum(c.options["quantize"] == "none" for c in candidates) == 2
    assert expand(load_config(_write(tmp_path, GOOD))) == candidates  # (ids are stable)


def test_yaml_reads_as_toml(tmp_path):
    pytest.importorskip("yaml")
    yaml_text = f"""
    targets: [rpi4, {{name: rpi5, max_latency_ms: 1.5}}]
    objective: {{max_size: 64 KiB, max_latency_ms: 2}}
    space:
      quantize: [none, fp16, int8-dynamic, int8]
      calibration_method: [minmax, percentile, entropy]
      per_channel: [true, false]
    models:
      - name: digits
        path: {DIGITS / 'digits_cnn.onnx'}
        calibration: {DIGITS / 'calibration.npz'}
        eval: {DIGITS / 'heldout.npz'}
    """
    a = expand(load_config(_write(tmp_path, yaml_text, "sweep.yaml")))
    b = expand(load_config(_write(tmp_path, GOOD)))
    assert a == b


def test_yaml_without_pyyaml_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # (find_spec then says: not installed)
    msg = _error(tmp_path, "targets: [rpi4]\n", "sweep.yaml")
    assert "PyYAML" in msg and "pip install pyyaml" in msg


@pytest.mark.parametrize("change, where, expected", [
    (("[space]", "[space]\nquantise = [\"int8\"]"), "sweep.toml: space.quantise", "unknown build option"),
    (('"int8"]', '"int4"]'), "sweep.toml: space.quantize[3]", "unknown value 'int4'; expected one of none, fp16, int8-dynamic, int8, auto"),
    (("per_channel = [true, false]", "per_channel = [1]"), "sweep.toml: space.per_channel[0]", "unknown value 1; expected true or false"),
    (("[space]", "[space]\nopt_level = [4]"), "sweep.toml: space.opt_level[0]", "unknown value 4; expected one of 0, 1, 2, 3"),
    (("[space]", "[space]\naccuracy_budget = [\"cosine<=0.9\"]"), "sweep.toml: space.accuracy_budget[0]",
     "not an accuracy budget"),
    (('"rpi4"', '"rpi9"'), "sweep.toml: targets[0].name", "unknown target 'rpi9'; expected one of generic"),
    (('"rpi4"', '"rpi5"'), "sweep.toml: targets[1].name", "listed twice"),
    (("digits_cnn.onnx", "nope.onnx"), "sweep.toml: models[0].path", "nope.onnx: no such file"),
    (("heldout.npz", "held.npz"), "sweep.toml: models[0].eval", "held.npz: no such file"),
    (('eval = "', 'metric = "accurracy"\neval = "'), "sweep.toml: models[0].metric", "unknown metric 'accurracy'"),
    (('eval = "', 'metric = "no_such_module:f"\neval = "'), "sweep.toml: models[0].metric",
     "cannot import module 'no_such_module'"),
    (('eval = "', 'colour = "red"\neval = "'), "sweep.toml: models[0].colour", "unknown key; expected one of name"),
    (("max_size = \"64 KiB\"", "max_size = \"64 parsecs\""), "sweep.toml: objective.max_size", "not a size"),
    (("max_latency_ms = 2", "max_latency_ms = -2"), "sweep.toml: objective.max_latency_ms", "not a positive number"),
    (("[objective]", "[objectives]"), "sweep.toml: objectives", "unknown key; expected one of sweep, models"),
    (('eval = "', 'space = { input_shapes = [{ img = "1x1x8x8" }] }\neval = "'), "sweep.toml: models[0].space.input_shapes",
     "input(s) ['img'] are not inputs of digits_cnn.onnx"),
])
def test_mistakes_name_the_key_and_what_was_expected(tmp_path, change, where, expected):
    old, new = change
    assert old in GOOD
    msg = _error(tmp_path, GOOD.replace(old, new, 1))
    assert msg.startswith(where), msg
    assert expected in msg, msg


def test_a_target_without_a_speed_cannot_take_a_latency_limit(tmp_path):
    msg = _error(tmp_path, GOOD.replace('"rpi4"', '"generic"'))
    assert msg.startswith("sweep.toml: targets[0]") and "add gmacs = N" in msg
    cfg = load_config(_write(tmp_path, GOOD.replace('"rpi4"', '{ name = "generic", gmacs = 2.5 }')))
    assert cfg.targets[0].gmacs == 2.5 and "config" in cfg.targets[0].gmacs_basis


def test_models_sharing_a_task_need_the_same_data(tmp_path):
    two = GOOD + f"""
[[models]]
name = "digits-b"
task = "digits"
path = "{DIGITS / 'digits_cnn.onnx'}"
eval = "{DIGITS / 'calibration.npz'}"
"""
    msg = _error(tmp_path, two)
    assert msg.startswith("sweep.toml: models[1].task") and "same eval data" in msg


def test_invalid_toml(tmp_path):
    assert _error(tmp_path, "targets = [rpi4\n").startswith("sweep.toml: not valid TOML")
    assert "expected .toml, .yaml or .yml" in _error(tmp_path, "x", "sweep.ini")


def test_sizes():
    assert parse_size(1000) == 1000 and parse_size("64 KiB") == 65536 and parse_size("1.5 MB") == 1_500_000
    assert parse_size("2048") == 2048
    for bad in ("", "-1", "12 parsecs", 0, True, 1.5):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_preprocess_that_gives_the_wrong_inputs_fails_before_any_task(tmp_path):
    (tmp_path / "bad_prep.py").write_text("def prep(arrays, shapes):\n    return {'pixels': arrays['image']}\n")
    path = _write(tmp_path, GOOD.replace('eval = "', 'preprocess = "bad_prep:prep"\neval = "'))
    from minirt.builder.sweep import run_sweep

    with pytest.raises(ConfigError) as info:
        run_sweep(path)
    msg = str(info.value)
    assert msg.startswith("sweep.toml: models[0].preprocess") and "missing ['image']" in msg


def test_command_line_errors_are_one_line(tmp_path, capsys):
    path = _write(tmp_path, GOOD.replace('"int8"]', '"int4"]'))
    assert main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minirt sweep: error: sweep.toml: space.quantize[3]: unknown value 'int4'; expected one of")
    assert "Traceback" not in err and err.count("\n") == 1


def test_without_ray_the_message_names_the_extra(tmp_path, monkeypatch):
    from minirt.builder.sweep import SweepError, run_sweep

    monkeypatch.setitem(sys.modules, "ray", None)  # (as where Ray is not installed)
    with pytest.raises(SweepError) as info:
        run_sweep(_write(tmp_path, GOOD), cache_dir=tmp_path / "empty-cache")
    assert "pip install 'minirt[sweep]'" in str(info.value)
