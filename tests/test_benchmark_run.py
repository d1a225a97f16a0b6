"""benchmarks/run.py refuses to time minirt without its native kernels unless asked: a checkout whose
extension was never compiled measured the numpy fallback (1.4-18x slower), said only in the table's header."""
from __future__ import annotations

import pytest

from benchmarks import run


def test_refuses_without_native_kernels(monkeypatch, capsys):
    monkeypatch.setattr(run.native, "available", False)
    with pytest.raises(SystemExit) as exc:
        run.main(["--models", "mobilenet_v2", "--out", "unused"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "native kernels are not active" in err and "--allow-numpy-kernels" in err
    assert "build_native.py" in err


def test_numpy_kernels_when_asked(monkeypatch, capsys):
    """With --allow-numpy-kernels the check passes; the next one (an unknown model) stops it before any
    work."""
    monkeypatch.setattr(run.native, "available", False)
    with pytest.raises(SystemExit) as exc:
        run.main(["--allow-numpy-kernels", "--models", "no_such_model"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model" in err and "native kernels" not in err
