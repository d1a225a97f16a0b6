"""The real-world timing scripts (benchmarks/run.py, benchmarks/quant_real.py) refuse to time minirt without
its native kernels unless asked: a checkout whose extension was never compiled measured the numpy
fallback (1.4-18x slower), said only in the table's header."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import run
from minirt import native

ROOT = Path(__file__).resolve().parents[1]


def _says_why(err: str) -> None:
    assert "native kernels are not active" in err and "--allow-numpy-kernels" in err
    assert "build_native.py" in err


def test_run_refuses_without_native_kernels(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(native, "available", False)
    with pytest.raises(SystemExit) as exc:
        run.main(["--models", "mobilenet_v2", "--out", str(tmp_path)])
    assert exc.value.code == 2
    _says_why(capsys.readouterr().err)
    assert not any(tmp_path.iterdir())  # (nothing was written)


def test_run_takes_numpy_kernels_when_asked(monkeypatch, capsys):
    """With --allow-numpy-kernels the check passes; the next one (an unknown model) stops it before any
    work."""
    monkeypatch.setattr(native, "available", False)
    with pytest.raises(SystemExit) as exc:
        run.main(["--allow-numpy-kernels", "--models", "no_such_model"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "native kernels" not in err


def test_quant_real_refuses_without_native_kernels(tmp_path):
    """The int8 benchmark, as a user runs it, with the native kernels switched off (MINIRT_DISABLE_NATIVE)."""
    env = {**os.environ, "MINIRT_DISABLE_NATIVE": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "quant_real.py"), "--models", "mobilenet_v2",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    _says_why(proc.stderr)
    assert not any(tmp_path.iterdir())
