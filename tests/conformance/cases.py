"""The ONNX node test cases and how one of them is run against minirt.

The installed onnx package generates its node cases in memory
(``onnx.backend.test.case.node.collect_testcases``): each has a model and
data sets of (inputs, expected outputs).  :func:`run_case` builds the model
once through :class:`tests.conformance.backend.MinirtBackend` and checks every
data set; :func:`outcome` memoises that so the per-case tests and the pass-rate
test share one build and run per case.
"""
from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from tests.conformance.backend import MinirtBackend

HERE = os.path.dirname(os.path.abspath(__file__))
UNSUPPORTED_FILE = os.path.join(HERE, "unsupported.txt")

DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7

# Per-case tolerance overrides: name -> (rtol, atol, reason).  Only with a reason.
TOLERANCES: dict[str, tuple[float, float, str]] = {
    "test_attention_4d_causal_fp16_expanded": (
        2e-3, 1e-7,
        "the expected data were computed with Softmax in float16 arithmetic; minirt widens float16 "
        "Softmax to float32 (as onnxruntime does), so 2 of 192 outputs differ by 2 float16 ulp "
        "(rel. 1.2e-3) - and both are closer to the float64 result than the expected values",
    ),
}
# bfloat16 keeps 8 significant bits: one ulp is 2**-8..2**-7 relative, far above the
# default rtol of 1e-3.  The expected data round every intermediate op to bfloat16,
# minirt computes bfloat16 in float32 and rounds once; outputs differ by up to 2 ulp
# and are as close to the float64 result (max error 0.0049) as the expected values.
for _name in (
    "test_attention_3d_causal_bf16_expanded",
    "test_attention_4d_attn_mask_causal_bf16",
    "test_attention_4d_attn_mask_causal_bf16_expanded",
    "test_attention_4d_causal_bf16_expanded",
    "test_attention_4d_causal_padded_kv_bf16",
    "test_attention_4d_causal_padded_kv_bf16_expanded",
    "test_attention_4d_padded_kv_bf16",
    "test_attention_4d_padded_kv_bf16_expanded",
):
    TOLERANCES[_name] = (2.0**-6, 1e-7, "bfloat16 attention: 2-ulp rounding differences (see comment above)")
del _name


@functools.lru_cache(maxsize=None)
def node_cases() -> dict[str, Any]:
    """name -> onnx TestCase, for every node case the installed onnx generates."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            cases = node.collect_testcases(None)
    out: dict[str, Any] = {}
    for case in cases:
        out[case.name] = case
    return out


# The phrase unsupported.txt uses for cases whose expected values are one random draw: their xfail is
# not strict (a chance match is not a fix), every other listed case is.
RANDOM_SAMPLING = "random sampling"


def load_unsupported(path: str = UNSUPPORTED_FILE) -> dict[str, str]:
    """``unsupported.txt`` as name -> reason (lines ``test_name  # reason``)."""
    listed: dict[str, str] = {}
    if not os.path.exists(path):
        return listed
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, reason = line.partition("#")
            name, reason = name.strip(), reason.strip()
            if not sep or not reason or " " in name:
                raise ValueError(f"{path}:{lineno}: expected 'test_name  # reason', got {raw!r}")
            if name in listed:
                raise ValueError(f"{path}:{lineno}: {name} is listed twice")
            listed[name] = reason
    return listed


def _normalise(value: Any) -> Any:
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def assert_similar(expected: Any, actual: Any, rtol: float, atol: float, where: str = "output") -> None:
    """onnx's backend-runner comparison: same shape and dtype, allclose (exact for strings)."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{where}: expected a sequence, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{where}: sequence length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_similar(e, a, rtol, atol, f"{where}[{i}]")
        return
    if expected is None:
        assert actual is None, f"{where}: expected an empty optional, got {type(actual).__name__}"
        return
    assert isinstance(actual, np.ndarray), f"{where}: expected an array, got {type(actual).__name__}"
    assert actual.shape == expected.shape, f"{where}: shape {actual.shape} != expected {expected.shape}"
    if expected.dtype == object:
        np.testing.assert_array_equal(actual, expected, err_msg=where)
        return
    assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype} != expected {expected.dtype}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=where)


def run_case(name: str) -> None:
    """Build and run node case ``name``; raises on any failure."""
    case = node_cases()[name]
    rtol, atol = case.rtol, case.atol
    if name in TOLERANCES:
        rtol, atol, _ = TOLERANCES[name]
    rep = MinirtBackend.prepare(case.model, "CPU")
    for k, (inputs, expected) in enumerate(case.data_sets):
        inputs = [_normalise(x) for x in inputs]
        expected = [_normalise(x) for x in expected]
        with np.errstate(all="ignore"):
            actual = list(rep.run(inputs))
        assert len(actual) == len(expected), f"data set {k}: {len(actual)} outputs, expected {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_similar(e, a, rtol, atol, f"data set {k} output {i}")


@functools.lru_cache(maxsize=None)
def outcome(name: str) -> BaseException | None:
    """``None`` if case ``name`` passes, else the exception it failed with (memoised)."""
    try:
        run_case(name)
    except Exception as exc:  # noqa: BLE001 - any failure is the case's outcome
        return exc
    return None
