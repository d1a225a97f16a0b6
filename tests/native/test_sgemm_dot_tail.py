"""A GEMM's last 1-3 columns past whole panels, summed as dot products (gemm_impl.h,
FN(sgemm_dot_tail)): a 7 x 7 output is 3 panels of 16 columns and 1 more, which the microkernel
computed as a whole vector per row and k.  Checked against numpy in float64 (written independently
of minirt) for every tail width around the panel widths of each ISA, one and several K blocks
(K = 700: blocks of 234), a K that is not a multiple of the vector (the masked last loads), row
counts that leave partial groups of rows, the epilogue (bias per column, residual, activations
computed in registers and on the stored tile), and 1 or 2 threads giving the same bits."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native

pytestmark = pytest.mark.skipif(not native.available, reason="native GEMM not available")

ACTS = {"": lambda v: v, "Relu": lambda v: np.maximum(v, 0.0), "Sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v))}


def _gemm(m, n, k, a, b, bias, res, act, threads):
    before = native.threads()
    try:
        native.set_threads(threads)
        c = np.full((m, n), np.nan, np.float32)
        native.sgemm_batch(1, m, n, k, a, k, 0, b, n, 0, 0, c, n, m * n, bias, res, n, m * n,
                           native.ACTIVATION_CODES[act], 0.0, 0.0)
        return c
    finally:
        native.set_threads(before)


@pytest.mark.parametrize("tail", [1, 2, 3, 4])
@pytest.mark.parametrize("m, k", [(2, 5), (7, 160), (13, 700), (64, 37)])
@pytest.mark.parametrize("act", list(ACTS))
def test_dot_tail_matches_reference_and_threads(tail, m, k, act, every_isa):
    panel = native.packed_panel_width()
    rng = np.random.default_rng(m * 1000 + k + tail)
    for n in (tail, 3 * panel + tail):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        bias = rng.standard_normal(n).astype(np.float32)
        res = rng.standard_normal((m, n)).astype(np.float32)
        want = ACTS[act](a.astype(np.float64) @ b.astype(np.float64) + bias + res)
        one = _gemm(m, n, k, a, b, bias, res, act, 1)
        np.testing.assert_allclose(one, want, rtol=2e-5, atol=2e-4 * np.sqrt(k))
        np.testing.assert_array_equal(_gemm(m, n, k, a, b, bias, res, act, 2), one)
