"""Products with B packed once (gemm_impl.h FN(sgemm_pb)): identical to the per-call packing GEMM
(one row of A included: it takes the several-panels-at-once FN(sgemv_pb_task)), and the MatMul /
Gemm kernels use it for a constant (read-only) weight, also on 1-3 rows, where the per-call GEMM
left the product to BLAS."""
from __future__ import annotations

import numpy as np
import pytest

from minirt import native
from minirt.kernels import linalg
from minirt.kernels.registry import NodeContext


@pytest.mark.parametrize("m, k, n", [(4, 3, 17), (33, 300, 70), (64, 128, 128), (9, 600, 33), (16, 257, 64),
                                     (5, 1000, 49), (40, 64, 1),
                                     # one row: FN(sgemv_pb_task), several panels at once (whole and partial
                                     # groups of them, a partial last panel, one and several k blocks)
                                     (1, 3, 17), (1, 300, 70), (1, 600, 33), (1, 1000, 1000), (1, 257, 300),
                                     (1, 64, 1), (1, 512, 256)])
@pytest.mark.parametrize("transb", [0, 1])
def test_packed_b_gives_the_per_call_results_bit_for_bit(m, k, n, transb, every_isa, threads):
    rng = np.random.default_rng(m * k + n)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transb else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    ldb = k if transb else n
    for act in (native.ACTIVATION_CODES[""], native.ACTIVATION_CODES["Relu"], native.ACTIVATION_CODES["Gelu"]):
        want = np.empty((m, n), np.float32)
        native.sgemm_batch(1, m, n, k, a, k, 0, b, ldb, 0, transb, want, n, m * n, bias, None, n, m * n, act, 0.0, 0.0)
        got = np.full((m, n), np.nan, np.float32)
        native.sgemm_pb(a, m, n, k, native.sgemm_pack_b(b, transb, ldb, k, n, owner=b), got, bias, act, 0.0, 0.0)
        np.testing.assert_array_equal(got, want)
        if act == native.ACTIVATION_CODES[""]:
            ref = a.astype(np.float64) @ (b.T if transb else b).astype(np.float64) + bias
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_matmul_and_gemm_pack_a_constant_weight_once_and_repack_after_an_isa_change(every_isa):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 32, 96)).astype(np.float32)
    w = rng.standard_normal((96, 80)).astype(np.float32)
    c = rng.standard_normal(80).astype(np.float32)
    w.flags.writeable = c.flags.writeable = False  # the model's constants are read-only (only those are packed)
    ctx = NodeContext("mm", "MatMul", 1, (np.float32,), 13)
    want = (a.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    first = linalg.matmul(a, w, ctx=ctx)  # prepares the product and packs the read-only weight
    prepared = next(iter(ctx.memo.values()))
    assert prepared.bpack is not None and prepared.bpack[0] == native.isa
    second = linalg.matmul(a, w, ctx=ctx)  # the prepared product on the packed weight
    np.testing.assert_array_equal(second, first)
    # a writeable (computed) weight is never packed nor kept: the same results from the GEMM packing per call
    wc = w.copy()
    cctx = NodeContext("mm2", "MatMul", 1, (np.float32,), 13)
    np.testing.assert_array_equal(linalg.matmul(a, wc, ctx=cctx), first)
    assert not cctx.memo
    np.testing.assert_allclose(second, want, rtol=1e-4, atol=1e-4)
    # another ISA since: the prepared product repacks for it (the panel width depends on it)
    before = native.isa
    try:
        other = "baseline" if before != "baseline" else before
        native.select_isa(other)
        third = linalg.matmul(a, w, ctx=ctx)
        assert prepared.bpack[0] == native.isa
        np.testing.assert_allclose(third, want, rtol=1e-4, atol=1e-4)
    finally:
        native.select_isa(before)
    # Gemm (transB weights, bias) takes the same route
    gctx = NodeContext("g", "Gemm", 1, (np.float32,), 13)
    wt = np.ascontiguousarray(w.T)
    wt.flags.writeable = False
    a2 = a[0]
    want2 = (a2.astype(np.float64) @ w.astype(np.float64) + c).astype(np.float32)
    for _ in range(3):
        got = linalg.gemm_7(a2, wt, c, transB=1, ctx=gctx)
        np.testing.assert_allclose(got, want2, rtol=1e-4, atol=1e-4)
    assert next(iter(gctx.memo.values())).bpack is not None
    # 1-3 rows, small and large weights: all on the packed GEMM (one row: FN(sgemv_pb_task))
    for rows, big in ((1, False), (2, False), (3, False), (1, True), (2, True)):
        kk, nn = (512, 1000) if big else (96, 80)
        wr = rng.standard_normal((kk, nn)).astype(np.float32)
        wr.flags.writeable = False
        rctx = NodeContext("r", "MatMul", 1, (np.float32,), 13)
        ar = rng.standard_normal((rows, kk)).astype(np.float32)
        for _ in range(2):
            np.testing.assert_allclose(linalg.matmul(ar, wr, ctx=rctx), ar.astype(np.float64) @ wr, rtol=1e-4,
                                       atol=1e-4)
        assert next(iter(rctx.memo.values())).bpack is not None, (rows, big)
