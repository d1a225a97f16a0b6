"""The matrix-vector product (gemm_impl.h FN(sgemv), ``native.sgemv``) for 1-3 rows against float64
numpy, on every ISA and thread count, B stored K x N or N x K (Gemm's transB), with sizes that leave
partial vectors and partial column blocks, bias and activations; and the Gemm / MatMul kernels that
use it for one row of a large weight (and for a computed weight, with a residual)."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import linalg
from minirt.kernels.registry import NodeContext

from .conftest import requires_native

pytestmark = requires_native


def _silu(x):
    return x / (1.0 + np.exp(-x))


@pytest.mark.parametrize("m, k, n", [(1, 512, 1000), (1, 1, 1), (2, 17, 5), (3, 100, 37), (1, 33, 129),
                                     (1, 64, 200), (2, 300, 71), (1, 7, 8), (3, 0, 9)])
@pytest.mark.parametrize("transb", [0, 1])
def test_sgemv_matches_float64_numpy(m, k, n, transb, every_isa, threads):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    stored = rng.standard_normal((n, k) if transb else (k, n)).astype(np.float32)
    b = stored.T if transb else stored
    bias = rng.standard_normal(n).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    for act, f in ((native.ACTIVATION_CODES[""], lambda x: x), (native.ACTIVATION_CODES["Relu"], lambda x: np.maximum(x, 0)),
                   (native.ACTIVATION_CODES["SiLU"], _silu)):
        for with_bias in (False, True):
            got = np.full((m, n), np.nan, np.float32)
            native.sgemv(a, m, n, k, stored, k if transb else n, transb, got, bias if with_bias else None, act)
            want = f(ref + (bias if with_bias else 0.0))
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1.0, np.sqrt(k)))


def test_sgemv_rows_of_a_wider_buffer_and_results_independent_of_threads(every_isa):
    """B with a row stride larger than its width; the same bits at 1 and 2 threads (one item sums each
    output whole)."""
    rng = np.random.default_rng(7)
    k, n = 300, 90
    wide = rng.standard_normal((k, n + 13)).astype(np.float32)
    a = rng.standard_normal((1, k)).astype(np.float32)
    outs = []
    for t in (1, 2):
        before = native.threads()
        native.set_threads(t)
        try:
            got = np.empty((1, n), np.float32)
            native.sgemv(a, 1, n, k, wide, n + 13, 0, got)
        finally:
            native.set_threads(before)
        outs.append(got)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ wide[:, :n], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transb", [0, 1])
def test_gemm_and_matmul_on_one_row_use_the_gemv(transb, every_isa, threads, monkeypatch):
    rng = np.random.default_rng(11)
    k, n = 512, 1000  # one row of a large weight
    a = rng.standard_normal((1, k)).astype(np.float32)
    w = rng.standard_normal((n, k) if transb else (k, n)).astype(np.float32)
    c = rng.standard_normal(n).astype(np.float32)
    w.flags.writeable = c.flags.writeable = False
    wk = w.T if transb else w
    calls = []
    real = native.sgemv
    monkeypatch.setattr(native, "sgemv", lambda *args, **kw: (calls.append(args[1]), real(*args, **kw)))
    ctx = NodeContext("g", "Gemm", 1, (np.float32,), 13)
    want = a.astype(np.float64) @ wk.astype(np.float64) + c
    for _ in range(2):  # prepared on the first call, then run from the memo
        got = linalg.gemm_7(a, w, c, transB=transb, ctx=ctx)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # a constant weight is packed once: its one row runs on the packed GEMM's gemv (D32), not this one
    assert calls == [] and next(iter(ctx.memo.values())).bpack is not None
    # a computed (writeable) weight of one row: this gemv, B read in place
    wc1 = np.array(wk)
    got = linalg.matmul_native(a, wc1, bias=c)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert calls == [1]
    # a computed (writeable) weight and a full-size residual: the gemv, then the residual's epilogue
    wc = np.array(wk)
    z = rng.standard_normal((2, n)).astype(np.float32)
    a2 = rng.standard_normal((2, k)).astype(np.float32)
    got = linalg.matmul_native(a2, wc, bias=c, z=z, act=native.ACTIVATION_CODES["Relu"])
    np.testing.assert_allclose(got, np.maximum(a2.astype(np.float64) @ wc + c + z, 0), rtol=1e-4, atol=1e-4)
    assert calls[-1] == 2
