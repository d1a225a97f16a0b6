"""Micro-benchmark: native kernels vs the numpy path of the same kernel function.

Both paths are timed interleaved in one process (the machine is shared and
noisy; the ratio is what matters).  Run::

    python benchmarks/kernels.py [--threads 1] [--runs 50]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from minirt import native
from minirt.kernels import nn


def _time_pair(fn, runs: int) -> tuple[float, float]:
    """Best-of-runs seconds of fn() with native on and off, interleaved.

    The minimum, not the median: on a shared machine the noise only ever
    adds time, and a kernel's own cost is what this table is about."""
    on, off = [], []
    saved = native.available
    try:
        for _ in range(3):
            native.available = saved
            fn()
            native.available = False
            fn()
        for _ in range(runs):
            native.available = saved
            t0 = time.perf_counter()
            fn()
            on.append(time.perf_counter() - t0)
            native.available = False
            t0 = time.perf_counter()
            fn()
            off.append(time.perf_counter() - t0)
    finally:
        native.available = saved
    return min(on), min(off)


def cases(rng):
    f = np.float32

    def conv(name, n, c, h, m, k, s, group=1, pad=None):
        x = rng.standard_normal((n, c, h, h), dtype=f)
        w = rng.standard_normal((m, c // group, k, k), dtype=f)
        b = rng.standard_normal(m, dtype=f)
        p = k // 2 if pad is None else pad
        return name, lambda: nn.conv(x, w, b, group=group, pads=(p, p, p, p), strides=(s, s))

    yield conv("dw3x3 s1 32x112x112", 1, 32, 112, 32, 3, 1, group=32)
    yield conv("dw3x3 s2 64x112x112", 1, 64, 112, 64, 3, 2, group=64)
    yield conv("dw3x3 s1 256x28x28", 1, 256, 28, 256, 3, 1, group=256)
    yield conv("dw5x5 s1 96x40x40", 1, 96, 40, 96, 5, 1, group=96)
    yield conv("conv3x3 s2 3->32 224", 1, 3, 224, 32, 3, 2)
    yield conv("conv3x3 s1 64->64 56", 1, 64, 56, 64, 3, 1)
    yield conv("conv3x3 s1 128->128 28", 1, 128, 28, 128, 3, 1)
    yield conv("conv1x1 64->128 56", 1, 64, 56, 128, 1, 1, pad=0)
    yield conv("conv1x1 256->256 14", 1, 256, 14, 256, 1, 1, pad=0)
    x = rng.standard_normal((1, 64, 112, 112), dtype=f)
    yield "maxpool3x3 s2 64x112", lambda: nn.max_pool_10(x, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    yield "maxpool5x5 s1 128x20 (SPPF)", (
        lambda xx=rng.standard_normal((1, 128, 20, 20), dtype=f):
        nn.max_pool_10(xx, kernel_shape=(5, 5), strides=(1, 1), pads=(2, 2, 2, 2)))
    yield "avgpool3x3 s1 64x56 pads", (
        lambda xx=rng.standard_normal((1, 64, 56, 56), dtype=f):
        nn.average_pool_10(xx, kernel_shape=(3, 3), strides=(1, 1), pads=(1, 1, 1, 1)))
    yield "avgpool2x2 s2 64x112", lambda: nn.average_pool_10(x, kernel_shape=(2, 2), strides=(2, 2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    if not native.available:
        raise SystemExit(f"native kernels not available: {native.reason}")
    native.set_threads(args.threads)
    from minirt.native import blas

    blas.set_threads(1)  # BLAS single-threaded: this table is about the native kernels
    print(f"native: {native.describe()}; threads {args.threads}")
    print(f"| kernel | native | numpy | speed-up |\n|---|---:|---:|---:|")
    for name, fn in cases(np.random.default_rng(0)):
        on, off = _time_pair(fn, args.runs)
        print(f"| {name} | {on * 1e3:.3f} ms | {off * 1e3:.3f} ms | {off / on:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
