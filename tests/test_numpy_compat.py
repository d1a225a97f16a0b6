"""The runtime works on numpy 1.24 (Raspberry Pi OS bookworm) and numpy 2.x.

Runs in the normal suite (numpy 2.x) and, unchanged, inside the emulated
arm64 Debian with Debian's numpy 1.24 (``make test-arm64``), so it needs
nothing but numpy, minirt and pytest.

Three kinds of check:

* static: the runtime's source uses no numpy name or keyword that exists on
  only one side of the 1.x/2.x line (``np.bool``, ``np.concat``,
  ``np.asarray(copy=...)``; ``np.product``, ``np.in1d``, ``np.float_``...);
* the compat shim ``minirt._compat`` behaves the same on both;
* behaviour: the kernels whose results depend on the rules that changed
  (NEP 50 scalar promotion, ``np.unique``'s inverse shape, integer overflow
  of Python scalars) give the ONNX output dtype and values on both.
"""
from __future__ import annotations

import ast
import warnings
from pathlib import Path

import numpy as np
import pytest

import minirt
from minirt import _compat
from minirt.kernels.registry import lookup

RUNTIME_DIR = Path(minirt.__file__).resolve().parent

# numpy-2-only module attributes (absent from 1.24 or re-added in 2.0 with a new meaning).
NUMPY2_ONLY = {
    "bool", "long", "ulong", "concat", "pow", "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh",
    "bitwise_left_shift", "bitwise_right_shift", "bitwise_invert", "permute_dims", "matrix_transpose", "vecdot",
    "matvec", "vecmat", "unstack", "cumulative_sum", "cumulative_prod", "isdtype", "unique_all", "unique_counts",
    "unique_inverse", "unique_values", "astype", "trapezoid", "exceptions", "dtypes", "strings", "StringDType",
}
# Removed (or deprecated with warnings) in numpy 2.x.
NUMPY1_ONLY = {
    "product", "cumproduct", "sometrue", "alltrue", "trapz", "in1d", "row_stack", "float_", "complex_", "NaN",
    "Inf", "NINF", "PINF", "NZERO", "PZERO", "infty", "Infinity", "round_", "msort", "asfarray", "find_common_type",
    "cast", "source", "lookfor", "deprecate", "safe_eval", "set_string_function", "issubclass_", "issctype",
    "maximum_sctype", "obj2sctype", "sctype2char", "sctypes", "unicode_", "string_", "longfloat", "singlecomplex",
    "cfloat", "longcomplex", "clongfloat", "int0", "uint0", "bool8", "object0", "str0", "bytes0", "void0", "mat",
    "recfromcsv", "recfromtxt", "disp", "who", "core", "compat", "byte_bounds", "add_newdoc_ufunc", "tracemalloc_domain",
}
ALLOWED_IN = {"_compat.py"}  # the shim itself names both sides on purpose


def _runtime_sources():
    files = sorted(p for p in RUNTIME_DIR.rglob("*.py") if p.name not in ALLOWED_IN)
    assert files, f"no runtime sources under {RUNTIME_DIR}"
    return files


def _numpy_aliases(tree: ast.AST) -> set[str]:
    names = {"numpy"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names if a.name == "numpy")
    return names


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases = _numpy_aliases(tree)
    out = []
    for node in ast.walk(tree):
        where = f"{path.relative_to(RUNTIME_DIR.parent)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            if node.attr in NUMPY2_ONLY:
                out.append(f"{where}: np.{node.attr} exists on numpy 2.x only (numpy 1.24 lacks it)")
            elif node.attr in NUMPY1_ONLY:
                out.append(f"{where}: np.{node.attr} is removed or deprecated in numpy 2.x")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "numpy":
            for a in node.names:
                if a.name in NUMPY2_ONLY | NUMPY1_ONLY:
                    out.append(f"{where}: from {node.module} import {a.name} is version-specific")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.value.id in aliases:
            kws = {k.arg for k in node.keywords}
            fn = node.func.attr
            if fn in ("asarray", "asanyarray", "ascontiguousarray", "reshape") and "copy" in kws:
                out.append(f"{where}: np.{fn}(copy=...) needs numpy 2.x")
            if fn == "array":
                for k in node.keywords:
                    if k.arg == "copy" and isinstance(k.value, ast.Constant) and k.value.value is False:
                        out.append(f"{where}: np.array(copy=False) means 'never copy' on 2.x, 'if needed' on 1.x "
                                   "(use np.asarray or minirt._compat.COPY_IF_NEEDED)")
            if fn in ("sort", "argsort") and "stable" in kws:
                out.append(f"{where}: np.{fn}(stable=...) needs numpy 2.x (use kind='stable')")
            if fn == "cumsum" and "include_initial" in kws:
                out.append(f"{where}: np.cumsum(include_initial=...) needs numpy 2.1")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("ptp", "itemset", "tostring") and not (
                    isinstance(node.func.value, ast.Name) and node.func.value.id in aliases):
            out.append(f"{where}: ndarray.{node.func.attr}() is removed in numpy 2.x")
    return out


def test_runtime_uses_only_numpy_api_common_to_1_24_and_2():
    problems = [f for p in _runtime_sources() for f in _findings(p)]
    assert not problems, "version-specific numpy API in the runtime:\n" + "\n".join(problems)


def test_static_check_catches_version_specific_api(tmp_path):
    src = tmp_path / "bad.py"
    src.write_text(
        "import numpy as np\n"
        "a = np.asarray([1], copy=False)\n"
        "b = np.concat([a, a])\n"
        "c = np.product(a)\n"
        "d = np.array(a, copy=False)\n"
        "e = np.sort(a, stable=True)\n"
        "f = a.ptp()\n"
    )
    saved = RUNTIME_DIR
    try:
        globals()["RUNTIME_DIR"] = tmp_path.parent
        found = _findings(src)
    finally:
        globals()["RUNTIME_DIR"] = saved
    assert len(found) == 6, found


def test_numpy_is_a_supported_version():
    assert _compat.NUMPY_VERSION >= (1, 24), np.__version__
    assert _compat.NUMPY2 == (int(np.__version__.split(".")[0]) >= 2)


# --------------------------------------------------------------------------- the shim


def test_copy_if_needed_copies_only_when_needed():
    a = np.arange(6, dtype=np.float32)
    assert np.array(a, copy=_compat.COPY_IF_NEEDED) is a or np.shares_memory(np.array(a, copy=_compat.COPY_IF_NEEDED), a)
    b = np.array(a, dtype=np.float64, copy=_compat.COPY_IF_NEEDED)  # a conversion: must copy, must not raise
    assert b.dtype == np.float64 and not np.shares_memory(a, b)


def test_scalar_keeps_the_array_dtype():
    for dt in (np.float16, np.float32, np.int8, np.uint8):
        x = np.ones(3, dtype=dt)
        assert (x * _compat.scalar(dt, 2)).dtype == dt
        assert (x + _compat.scalar(x.dtype, 1)).dtype == dt


def test_trapezoid_and_unique_inverse():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert _compat.trapezoid(np.array([0.0, 1.0, 2.0])) == pytest.approx(2.0)
    x = np.array([[3, 1], [1, 3]])
    u, inv = np.unique(x, return_inverse=True)
    inv = _compat.unique_inverse(inv)
    assert inv.shape == (4,)
    np.testing.assert_array_equal(u[inv].reshape(x.shape), x)


# --------------------------------------------------------------------------- kernel behaviour


def _kernel(op, opset=17):
    entry = lookup("", op, opset)
    assert entry is not None, f"no kernel for {op}"
    return entry.fn


@pytest.mark.parametrize("op,attrs", [
    ("LeakyRelu", {"alpha": 0.1}),
    ("Elu", {"alpha": 0.5}),
    ("Selu", {}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
    ("ThresholdedRelu", {"alpha": 0.2}),
    ("Celu", {"alpha": 1.5}),
])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_float_attributes_keep_the_input_dtype(op, attrs, dtype):
    """NEP 50: a Python float attribute must not turn float16/32 results into float64 (1.x) or vice versa."""
    x = np.linspace(-2, 2, 9).astype(dtype)
    y = _kernel(op)(x, **attrs)
    assert isinstance(y, np.ndarray) and y.dtype == dtype and y.shape == x.shape


def test_binary_ops_with_a_0d_operand_keep_float32():
    """A 0-d float32 operand (a scalar initializer) is an array, not a Python/numpy scalar: no value-based
    casting on 1.x, no weak-scalar rules on 2.x, so the result is float32 on both."""
    x = np.linspace(0.25, 2, 5).astype(np.float32)
    s = np.array(0.5, dtype=np.float32)
    for op in ("Mul", "Add", "Sub", "Div", "Pow"):
        y = _kernel(op, 15)(x, s)
        assert y.dtype == np.float32, op
    np.testing.assert_allclose(_kernel("Mul", 15)(x, s), x * 0.5)


def test_clip_with_scalar_bounds():
    x = np.arange(-5, 5, dtype=np.float32)
    y = _kernel("Clip", 13)(x, np.array(-1.5, np.float32), np.array(2.5, np.float32))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, np.clip(x, -1.5, 2.5))
    xi = np.array([0, 100, 250], dtype=np.uint8)
    yi = _kernel("Clip", 13)(xi, np.array(10, np.uint8), np.array(200, np.uint8))
    assert yi.dtype == np.uint8
    np.testing.assert_array_equal(yi, [10, 100, 200])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32])
def test_narrow_integers_stay_narrow(dtype):
    """uint8 + a Python int: 1.x upcasts, 2.x raises on overflow; ONNX wraps and keeps the type."""
    info = np.iinfo(dtype)
    x = np.array([info.min, 0, info.max], dtype=dtype)
    one = np.array(1, dtype=dtype)
    for op in ("Add", "Sub", "Mul"):
        y = _kernel(op, 14)(x, one)
        assert y.dtype == dtype, op
    assert _kernel("Relu", 14)(x).dtype == dtype
    assert _kernel("Abs", 13)(x).dtype == dtype


def test_reductions_to_a_scalar_are_0d_arrays_of_the_input_dtype():
    """np.sum of float32 returns a numpy scalar; mixed with Python floats 1.x would make it float64."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / np.float32(7)
    for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare"):
        y = _kernel(op, 18)(x, None, keepdims=0)
        assert isinstance(y, np.ndarray) and y.shape == () and y.dtype == np.float32, op


def test_softmax_and_layer_norm_keep_float16():
    x = np.linspace(-3, 3, 24).astype(np.float16).reshape(2, 3, 4)
    assert _kernel("Softmax", 13)(x, axis=-1).dtype == np.float16
    out = _kernel("LayerNormalization", 17)(x, np.ones(4, np.float16), np.zeros(4, np.float16))
    y = out[0] if isinstance(out, tuple) else out
    assert y.dtype == np.float16


def test_unique_inverse_is_1d_with_axis():
    """numpy 2.0.0 returned an N-d inverse for np.unique(axis=...); 1.x and >= 2.0.1 a 1-D one."""
    x = np.array([[1, 2], [3, 4], [1, 2]], dtype=np.float32)
    y, idx, inv, cnt = _kernel("Unique", 11)(x, axis=0, sorted=1)
    np.testing.assert_array_equal(y, [[1, 2], [3, 4]])
    assert inv.shape == (3,) and inv.dtype == np.int64
    np.testing.assert_array_equal(inv, [0, 1, 0])
    y, idx, inv, cnt = _kernel("Unique", 11)(np.array([[2, 1], [2, 3]], np.int64))
    assert inv.shape == (4,)
    np.testing.assert_array_equal(y[inv], [2, 1, 2, 3])


def test_topk_and_argmax_ties_are_stable():
    x = np.array([[1, 3, 3, 2, 3]], dtype=np.float32)
    values, indices = _kernel("TopK", 11)(x, np.array([2], np.int64), axis=-1, largest=1, sorted=1)
    np.testing.assert_array_equal(indices, [[1, 2]])
    assert values.dtype == np.float32 and indices.dtype == np.int64
    assert _kernel("ArgMax", 13)(x, axis=1).tolist() == [[1]]


def test_cumsum_and_range_dtypes():
    x = np.arange(5, dtype=np.int32)
    assert _kernel("CumSum", 14)(x, np.array(0, np.int64)).dtype == np.int32
    r = _kernel("Range", 11)(np.array(0.0, np.float32), np.array(1.0, np.float32), np.array(0.25, np.float32))
    assert r.dtype == np.float32 and r.tolist() == [0.0, 0.25, 0.5, 0.75]


def test_bfloat16_softmax_rows_when_ml_dtypes_is_installed():
    """numpy 1.x cannot promote a Python int with bfloat16: the attention softmax uses typed scalars."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from minirt.kernels.transformer import _softmax_rows

    x = np.array([[0.0, 1.0, -np.inf], [-np.inf, -np.inf, -np.inf]], dtype=ml_dtypes.bfloat16)
    y = _softmax_rows(x)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(y.astype(np.float32)[0], [0.2689, 0.7311, 0.0], atol=5e-3)
    assert not y.astype(np.float32)[1].any()


def test_session_on_a_hand_made_artifact_returns_float32():
    """End to end without the builder: write a tiny artifact with the runtime's own test helper if present."""
    try:
        from minirt.builder.writer import ArtifactWriter  # noqa: F401  (desktop side only)
    except ImportError:
        pytest.skip("builder not installed (the device side runs prebuilt artifacts in tests/arm64)")
    import onnx
    from onnx import TensorProto, helper

    from minirt.builder import build_bytes

    g = helper.make_graph(
        [helper.make_node("LeakyRelu", ["x"], ["h"], alpha=0.2), helper.make_node("ReduceMean", ["h"], ["y"], keepdims=0)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = minirt.Session(build_bytes(model.SerializeToString()))
    (y,) = sess.run(None, {"x": np.array([[-1, 2, 3], [4, -5, 6]], np.float32)})
    assert y.dtype == np.float32 and y.shape == ()
    assert float(y) == pytest.approx((-0.2 + 2 + 3 + 4 - 1 + 6) / 6, rel=1e-6)
    del onnx
