"""Fixtures shared by test modules."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def runtime_wheel(tmp_path_factory) -> Path:
    """The device wheel (``MINIRT_WHEEL=runtime pip wheel .``, setup.py) of this machine, built once per
    session (it compiles the kernels: about a minute and a half of one core)."""
    out = tmp_path_factory.mktemp("wheel")
    env = dict(os.environ, MINIRT_WHEEL="runtime")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-q", "-w", str(out)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("minirt-*.whl")
    return wheel
