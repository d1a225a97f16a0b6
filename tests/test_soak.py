"""Soak: resident memory stays flat over many runs (Linux: reads /proc/self/status)."""
from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import minirt
from tests.fuzz.seeds import mlp_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc/self/status")

TOLERANCE_KIB = 2 * 1024


def _rss_kib() -> int:
    gc.collect()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


@pytest.fixture(scope="module")
def artifact() -> bytes:
    from minirt.builder import build_bytes

    return build_bytes(mlp_model())


def test_rss_flat_over_10000_runs(artifact):
    sess = minirt.Session(artifact)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((b, 4)).astype(np.float32)} for b in (1, 2, 3, 1, 2)]
    for i in range(1000):  # warm up: caches, allocator arenas, lazily imported code
        sess.run(None, feeds[i % len(feeds)])
    before = _rss_kib()
    for i in range(10_000):
        sess.run(None, feeds[i % len(feeds)])
    growth = _rss_kib() - before
    assert growth < TOLERANCE_KIB, f"RSS grew by {growth} KiB over 10,000 runs"


# The loads run in a fresh interpreter: in the test suite's process, whatever the earlier tests left
# (allocator arenas, caches, collectable cycles) moved the figure by 2-5 MB in 2 of 4 full runs, while
# this loop stays flat over 16,000 loads on its own.
_LOADS = r"""
import gc, sys
import numpy as np
import minirt

def rss_kib():
    gc.collect()
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))

def mappings(path):
    gc.collect()
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(path))

path = sys.argv[1]
x = {"x": np.ones((1, 4), np.float32)}
for _ in range(200):
    minirt.Session(path).run(None, x)
before, maps_before = rss_kib(), mappings(path)
for _ in range(2000):
    minirt.Session(path).run(None, x)
print(rss_kib() - before, mappings(path) - maps_before)
"""


def test_rss_flat_over_repeated_loads_from_a_file(artifact, tmp_path):
    """Sessions on a memory-mapped file release their mapping when dropped."""
    import subprocess
    from pathlib import Path

    path = tmp_path / "mlp.mrt"
    path.write_bytes(artifact)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", _LOADS, str(path)], capture_output=True, text=True, timeout=300,
                          cwd=str(root))
    assert proc.returncode == 0, proc.stderr[-2000:]
    growth, mappings = (int(v) for v in proc.stdout.split())
    assert growth < TOLERANCE_KIB, f"RSS grew by {growth} KiB over 2,000 loads"
    assert mappings <= 1, f"{mappings} more mappings of the file after 2,000 loads"
