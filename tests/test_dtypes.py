"""Narrow element types (bfloat16, float8, int4...) through builder, format and session."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import builder
import minirt
from minirt.dtypes import EXTENDED_CODES, numpy_dtype, onnx_code, onnx_type_name


def _identity_model(elem: int, values: np.ndarray) -> onnx.ModelProto:
    init = numpy_helper.from_array(values, "w")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "narrow",
        [],
        [helper.make_tensor_value_info("y", elem, list(values.shape))],
        initializer=[init],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize(
    "elem, dtype",
    [
        (TensorProto.BFLOAT16, ml_dtypes.bfloat16),
        (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn),
        (TensorProto.FLOAT8E5M2, ml_dtypes.float8_e5m2),
        (TensorProto.INT4, ml_dtypes.int4),
        (TensorProto.UINT4, ml_dtypes.uint4),
    ],
)
def test_narrow_initializer_round_trips(elem, dtype):
    values = np.array([[1, 2, 3], [-1 if np.dtype(dtype).name != "uint4" else 4, 0, 5]], dtype=np.float32).astype(dtype)
    sess = minirt.Session(builder.build_bytes(_identity_model(elem, values)))
    (y,) = sess.run(None, {})
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y.astype(np.float32), values.astype(np.float32))
    assert sess.get_outputs()[0].type == f"tensor({onnx_type_name(elem)})"


def test_code_tables_agree():
    for code in sorted(EXTENDED_CODES):
        dt = numpy_dtype(code)
        assert onnx_code(dt) == code


def test_without_ml_dtypes_a_narrow_artifact_is_a_clear_error(tmp_path):
    values = np.array([1, 2], dtype=np.float32).astype(ml_dtypes.bfloat16)
    path = tmp_path / "bf16.mrt"
    builder.build(_identity_model(TensorProto.BFLOAT16, values), path)
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["ml_dtypes"] = None  # makes `import ml_dtypes` fail
        import minirt
        try:
            minirt.Session({str(path)!r})
        except minirt.UnsupportedType as exc:
            print("OK", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("OK") and "bfloat16" in out and "ml_dtypes" in out
