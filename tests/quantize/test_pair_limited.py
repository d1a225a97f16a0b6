"""Pair-limited int8 weights for targets whose int8 GEMM adds pairs of u8 x s8 products in int16 (AVX2 without
VNNI, D172): the static int8 build stores weights whose pairs (as the kernels pair them) stay within
|w0| + |w1| <= 128, the report says so, the runtime's packed matrices take the exact vpmaddubsw route, and
other targets keep plain 8-bit weights.  The digits model is the real model the tests ship."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minirt import native
from minirt.builder.quantize import QuantizeOptions, quantize
from minirt.builder.quantize.weights import PAIR_LIMIT
from minirt.targets.profiles import get_target

NO_TIMING = dict(measure_latency=False, accuracy_budget="none")


def _gemm_weights(model) -> dict:
    """{node name: int8 weight as the int8 GEMM's packed rows (rows, K)} of the QConv / QMatMul nodes."""
    out = {}
    for node in model.graph:
        if node.domain != "com.minirt" or node.op_type not in ("QConv", "QMatMul"):
            continue
        w = node.inputs[3].const_value.numpy()
        if node.op_type == "QConv":
            out[node.name] = w.reshape(w.shape[0], -1)
            if w.ndim == 4 and w.shape[2] * w.shape[3] > 1:  # the implicit conv's order: channels of a tap
                out[node.name + " (taps)"] = np.moveaxis(w, 1, -1).reshape(-1, w.shape[1])
        else:
            trans_b = next((a.value for a in node.attributes.values() if a.name == "transB"), 0)
            out[node.name] = w if trans_b else w.T
    return out


def _worst_pair(rows: np.ndarray) -> int:
    r = rows.astype(np.int64)
    if r.shape[1] % 2:
        r = np.pad(r, ((0, 0), (0, 1)))
    return int((np.abs(r[:, 0::2]) + np.abs(r[:, 1::2])).max())


def test_avx2_targets_store_pair_limited_weights_that_take_the_exact_16_bit_route(digits, calib):
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING), target="x86-64-v3")
    assert report.pair_limited_weights and "pair-limited" in str(report)
    weights = _gemm_weights(digits)
    assert weights and report.quantized
    for name, rows in weights.items():
        assert _worst_pair(rows) <= PAIR_LIMIT, name
    assert max(int(np.abs(r.astype(int)).max()) for r in weights.values()) > 63  # (8 bits, not 7)
    if native.available:
        for name, rows in weights.items():
            if "(taps)" not in name:
                m, k = rows.shape
                assert native.qpacked_pairs16(native.qpack(np.ascontiguousarray(rows)), m, k), name


def test_other_targets_and_the_options_keep_plain_weights(digits, calib):
    report = quantize(digits, "int8", calib, QuantizeOptions(**NO_TIMING), target="generic")
    assert not report.pair_limited_weights and "pair-limited" not in str(report)
    weights = _gemm_weights(digits)
    assert any(_worst_pair(r) > PAIR_LIMIT for r in weights.values())  # full 8-bit pairs: the digits weights


@pytest.mark.parametrize("options,limited,bits7", [(dict(pair_limited_weights=False), False, False),
                                                   (dict(reduce_range=True), False, True),
                                                   (dict(pair_limited_weights=True), True, False)])
def test_the_option_overrides_the_target(digits, calib, options, limited, bits7):
    target = dataclasses.replace(get_target("generic"), int8_pair_limited_weights=not limited)
    report = quantize(digits, "int8", calib, QuantizeOptions(**options, **NO_TIMING), target=target)
    assert report.pair_limited_weights is limited
    weights = _gemm_weights(digits)
    if bits7:
        assert max(int(np.abs(r.astype(int)).max()) for r in weights.values()) <= 63
    if limited or bits7:
        assert all(_worst_pair(r) <= PAIR_LIMIT for r in weights.values())


@pytest.mark.parametrize("target,limited", [("x86-64-v3", True), ("x86-64-v4", False)])
def test_dynamic_int8_follows_the_target_too(digits, target, limited):
    report = quantize(digits, "int8-dynamic", None, QuantizeOptions(**NO_TIMING), target=target)
    assert report.pair_limited_weights is limited
    assert all(_worst_pair(r) <= PAIR_LIMIT for r in _gemm_weights(digits).values()) or not limited
