"""Shared fixtures of the sweep tests: one local Ray cluster of 2 workers for the whole session, the
sweep example's OCR data (small sets, made deterministically), and config writers."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits"
EXAMPLE = ROOT / "examples" / "sweep"
TARGETS = ("rpi4", "rpi5", "x86-64-v3")
OCR_EVAL, OCR_CALIB = 120, 16  # crops (2 shards of 60)
# 4 modes x 2 calibration methods x 2 per-channel x 2 opt-levels: 2 float + 2 fp16 + 4 int8-dynamic + 8 int8 = 16
# candidates per model and target
SPACE = """
[space]
quantize = ["none", "fp16", "int8-dynamic", "int8"]
calibration_method = ["minmax", "percentile"]
per_channel = [true, false]
accuracy_budget = ["none"]
opt_level = [1, 2]
"""
CANDIDATES_PER_TARGET = 16


def ocr_cls_model() -> Path:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or spec.origin is None:
        pytest.skip("rapidocr-onnxruntime is not installed (pip install -e '.[dev]')")
    return Path(spec.origin).parent / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance with 2 CPUs (2 workers), started by the tests, shared by them all."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The OCR classifier's eval and calibration crops (examples/sweep/ocr_data.py) and its preprocess module."""
    pytest.importorskip("cv2")
    folder = tmp_path_factory.mktemp("sweep-data")
    shutil.copy(EXAMPLE / "ocr_data.py", folder / "ocr_data.py")
    spec = importlib.util.spec_from_file_location("sweep_example_ocr_data", EXAMPLE / "ocr_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    np.savez(folder / "ocr_eval.npz", **module.make(OCR_EVAL, seed=1))
    np.savez(folder / "ocr_calib.npz", **module.make(OCR_CALIB, seed=2))
    return folder


def digits_model_toml(metric: str = "accuracy") -> str:
    return f"""
[[models]]
name = "digits"
path = "{DIGITS / 'digits_cnn.onnx'}"
calibration = "{DIGITS / 'calibration.npz'}"
eval = "{DIGITS / 'heldout.npz'}"
metric = "{metric}"
max_size = "64 KiB"
"""


def ocr_model_toml(data_dir: Path) -> str:
    ocr_cls_model()
    return f"""
[[models]]
name = "ocr-cls"
package = "rapidocr_onnxruntime"
file = "models/ch_ppocr_mobile_v2.0_cls_infer.onnx"
calibration = "{data_dir / 'ocr_calib.npz'}"
eval = "{data_dir / 'ocr_eval.npz'}"
preprocess = "ocr_data:preprocess"
space = {{ input_shapes = [{{ x = "1x3x48x192" }}] }}
"""


def write_config(folder: Path, *models: str, name: str = "test", shard_size: int = 120, extra: str = "") -> Path:
    """A sweep.toml in ``folder`` over TARGETS and SPACE (max modeled latency 5 ms) with ``models``."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (f'targets = {list(TARGETS)!r}\n'.replace("'", '"') +
            f'\n[sweep]\nname = "{name}"\nshard_size = {shard_size}\nlatency_runs = 3\n{extra}'
            '\n[objective]\nmax_latency_ms = 5.0\n' + SPACE + "".join(models))
    path = folder / "sweep.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def full_sweep(ray_cluster, data_dir, tmp_path_factory):
    """The sweep of the issue's "done when": the digits model and PP-OCR's classifier, 3 targets, 16 candidates
    per model and target, on the 2-worker cluster, from an empty cache."""
    from minirt.builder.sweep import run_sweep

    folder = tmp_path_factory.mktemp("full")
    shutil.copy(data_dir / "ocr_data.py", folder / "ocr_data.py")
    config = write_config(folder, digits_model_toml(), ocr_model_toml(data_dir), name="full", shard_size=60)
    lines: list[str] = []
    result = run_sweep(config, progress=lines.append)
    return config, result, lines
