"""Compile progress during a source install (minirt/native/build_progress.py, setup.py's build_ext):
pip hides the build's output, so the build writes to the terminal itself."""
from __future__ import annotations

import io
import threading

import pytest

from minirt.native import build_progress


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_reporting_says_what_runs_beats_and_the_time_it_took():
    out, clock = io.StringIO(), _Clock()
    beat = threading.Event()
    real_write = out.write

    def write(text):
        if "still compiling" in text:
            beat.set()
        return real_write(text)

    out.write = write
    out.close = lambda: None  # (keep the text readable after reporting() closes its stream)
    with build_progress.reporting(out, every=0.01, clock=clock):
        clock.t = 130.0
        assert beat.wait(5), "no heartbeat while the step ran"
        clock.t = 197.0
    lines = out.getvalue().splitlines()
    assert lines[0] == build_progress.MESSAGE and "pip install -v" in lines[0]
    assert any(line.startswith("minirt: still compiling (") for line in lines[1:-1])
    assert lines[-1] == "minirt: native kernels done in 97 s"


def test_a_failed_step_is_reported_and_still_raises():
    out = io.StringIO()
    out.close = lambda: None
    with pytest.raises(RuntimeError, match="compiler"):
        with build_progress.reporting(out, every=60):
            raise RuntimeError("compiler crashed")
    assert out.getvalue().splitlines()[-1].startswith("minirt: native kernels failed after")


def test_no_terminal_no_output_and_a_broken_terminal_never_fails_the_build():
    with build_progress.reporting(None):
        pass

    class Gone(io.StringIO):
        def write(self, text):
            raise OSError("terminal went away")

    with build_progress.reporting(Gone(), every=0.01):
        pass


def test_setup_py_compiles_through_the_progress_build_ext():
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "setup.py").read_text()
    assert '"build_ext": BuildExtWithProgress' in text and "progress.reporting(" in text
