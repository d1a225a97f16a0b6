"""Unmodified onnxruntime applications under ``python -m minirt.shim`` (minirt/shim.py): the OCR
pipeline of rapidocr-onnxruntime on rendered text, and magika's file-type identification on real
files, each run once on onnxruntime and once on minirt (fresh processes), with the same results."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

OCR_APP = """
import json, sys
from rapidocr_onnxruntime import RapidOCR
import onnxruntime
result, _ = RapidOCR()(sys.argv[1])
print(json.dumps({"runtime": onnxruntime.__name__,
                  "result": [[box, text, float(score)] for box, text, score in (result or [])]}))
"""

MAGIKA_APP = """
import json, sys
from pathlib import Path
from magika import Magika
import onnxruntime
m = Magika()
out = []
for p in sys.argv[1:]:
    r = m.identify_path(Path(p))
    out.append([p, str(r.output.label), str(r.dl.label), float(r.score)])
print(json.dumps({"runtime": onnxruntime.__name__, "result": out}))
"""


def _run(app: Path, args: list, shim: bool, cache: Path) -> dict:
    cmd = [sys.executable, *(["-m", "minirt.shim"] if shim else []), str(app), *map(str, args)]
    env = dict(os.environ, MINIRT_CACHE_DIR=str(cache))  # (ONNX files built once per test, not in ~/.cache)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(ROOT), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _text_image(path: Path) -> Path:
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (640, 200), "white")
    draw = ImageDraw.Draw(img)
    try:
        font = ImageFont.load_default(size=36)
    except TypeError:  # (Pillow < 10.1: one small bitmap font)
        font = ImageFont.load_default()
    draw.text((20, 30), "minirt runs OCR 2026", fill="black", font=font)
    draw.text((20, 110), "Hello edge devices", fill="black", font=font)
    img.save(path)
    return path


def test_rapidocr_pipeline_reads_the_same_text_under_the_shim(tmp_path):
    pytest.importorskip("rapidocr_onnxruntime")
    pytest.importorskip("PIL")
    image = _text_image(tmp_path / "text.png")
    app = tmp_path / "ocr_app.py"
    app.write_text(OCR_APP)
    ort = _run(app, [image], shim=False, cache=tmp_path / "cache")
    mine = _run(app, [image], shim=True, cache=tmp_path / "cache")
    assert (ort["runtime"], mine["runtime"]) == ("onnxruntime", "minirt")
    assert [t for _, t, _ in ort["result"]] == [t for _, t, _ in mine["result"]]
    assert len(mine["result"]) >= 2 and "Hello edge devices" in [t for _, t, _ in mine["result"]]
    for (box_o, _, score_o), (box_m, _, score_m) in zip(ort["result"], mine["result"]):
        assert box_o == box_m  # (the boxes are integer pixel corners)
        assert abs(score_o - score_m) < 1e-5


def test_magika_identifies_real_files_the_same_under_the_shim(tmp_path):
    pytest.importorskip("magika")
    pytest.importorskip("PIL")
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "minirt" / "session.py",
             ROOT / "minirt" / "native" / "kernels.c", ROOT / "Makefile", ROOT / "docs" / "format.md",
             _text_image(tmp_path / "image.png")]
    app = tmp_path / "magika_app.py"
    app.write_text(MAGIKA_APP)
    ort = _run(app, files, shim=False, cache=tmp_path / "cache")
    mine = _run(app, files, shim=True, cache=tmp_path / "cache")
    assert (ort["runtime"], mine["runtime"]) == ("onnxruntime", "minirt")
    assert [r[:3] for r in ort["result"]] == [r[:3] for r in mine["result"]]
    assert {r[1] for r in mine["result"]} >= {"markdown", "python", "c", "png"}
    for o, m in zip(ort["result"], mine["result"]):
        assert abs(o[3] - m[3]) < 1e-4


def test_the_shim_says_how_to_use_it():
    proc = subprocess.run([sys.executable, "-m", "minirt.shim"], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT))
    assert proc.returncode == 2 and "usage: python -m minirt.shim" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "minirt.shim", "no_such_app.py"], capture_output=True, text=True,
                          timeout=60, cwd=str(ROOT))
    assert proc.returncode == 2 and "cannot open 'no_such_app.py'" in proc.stderr


def test_install_makes_onnxruntime_minirt_in_this_process():
    code = ("import minirt.shim; minirt.shim.install(); import onnxruntime; "
            "from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument; "
            "import minirt; print(onnxruntime is minirt, onnxruntime.get_device(), "
            "onnxruntime.disable_telemetry_events())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert proc.stdout.split() == ["True", "CPU", "None"], proc.stderr
