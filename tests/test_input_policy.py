"""The runtime's input policy (docs/runtime.md): what run() checks, what it accepts as-is, what it returns.

* dtype, rank and fixed dimensions are checked (InvalidArgument);
* NaN and Inf pass through unchecked;
* non-contiguous and read-only arrays are accepted as they are and never written to;
* outputs never alias the session's internal buffers, the caller's inputs or the mapped weights.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import minirt
from minirt.builder.writer import ArtifactWriter
from tests.format.util import minimal_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readonly_strided(x: np.ndarray) -> np.ndarray:
    """The same values as ``x``, as a read-only, non-contiguous view (every other element of a buffer)."""
    if x.dtype == object or x.ndim == 0:
        y = x.copy()
        y.setflags(write=False)
        return y
    buf = np.zeros(x.shape + (2,), dtype=x.dtype)
    buf[..., 0] = x
    view = buf[..., 0]
    assert not view.flags.c_contiguous or x.size <= 1
    view.setflags(write=False)
    return view


# --- checks -------------------------------------------------------------------------------------


def test_dtype_rank_and_fixed_dims_are_checked():
    sess = minirt.Session(minimal_bytes())  # x: float32 ["N", 3]
    with pytest.raises(minirt.InvalidArgument, match="expected dtype tensor\\(float\\)"):
        sess.run(None, {"x": np.ones((2, 3), np.float64)})
    with pytest.raises(minirt.InvalidArgument, match="expected rank 2"):
        sess.run(None, {"x": np.ones((3,), np.float32)})
    with pytest.raises(minirt.InvalidArgument, match="dimension 1 must be 3"):
        sess.run(None, {"x": np.ones((2, 4), np.float32)})


def test_nan_and_inf_pass_through():
    sess = minirt.Session(minimal_bytes())  # y = x + [[0, 1, 2], [3, 4, 5]]
    x = np.array([[np.nan, np.inf, -np.inf], [1, 2, 3]], np.float32)
    y = sess.run(None, {"x": x})[0]
    assert np.isnan(y[0, 0]) and y[0, 1] == np.inf and y[0, 2] == -np.inf
    np.testing.assert_array_equal(y[1], [4, 6, 8])


# --- read-only and non-contiguous inputs --------------------------------------------------------


def test_readonly_noncontiguous_input_on_the_minimal_model():
    sess = minirt.Session(minimal_bytes())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for feed in (readonly_strided(x), np.asfortranarray(x), x.T.copy().T, x[:, ::-1][:, ::-1]):
        before = feed.copy()
        np.testing.assert_array_equal(sess.run(None, {"x": feed})[0], sess.run(None, {"x": x})[0])
        np.testing.assert_array_equal(feed, before)


def test_demo_model_with_readonly_noncontiguous_input():
    builder = pytest.importorskip("minirt.builder")
    path = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")
    if not os.path.exists(path):
        pytest.skip("digits example not present")
    sess = minirt.Session(builder.build_bytes(path))
    arg = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 4 for d in arg.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ro = readonly_strided(x)
    before = ro.copy()
    expected = sess.run(None, {arg.name: x})
    got = sess.run(None, {arg.name: ro})
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    np.testing.assert_array_equal(ro, before)


def test_no_kernel_writes_into_its_inputs():
    """Every ONNX node case that minirt passes, re-run with read-only, non-contiguous inputs.

    A kernel that wrote into an input would fail on the read-only view (numpy
    refuses the write) or change its values; a kernel that assumed contiguity
    would produce different results.
    """
    pytest.importorskip("onnx")
    from tests.conformance import cases as C
    from tests.conformance.backend import MinirtBackend

    checked, failures = 0, []
    # (cases whose expected values are one random draw are left out: a chance match of the ordinary run
    # then made the read-only run's mismatch look like a broken policy)
    random_draws = {n for n, why in C.load_unsupported().items() if C.RANDOM_SAMPLING in why}
    for name, case in sorted(C.node_cases().items()):
        if name in random_draws:
            continue
        try:
            rep = MinirtBackend.prepare(case.model, "CPU")
        except Exception:  # noqa: BLE001 - cases minirt cannot build are the conformance suite's business
            continue
        rtol, atol = (C.TOLERANCES[name][:2] if name in C.TOLERANCES else (case.rtol, case.atol))
        for k, (inputs, expected) in enumerate(case.data_sets):
            inputs = [C._normalise(x) for x in inputs]
            feeds = [readonly_strided(x) if isinstance(x, np.ndarray) else x for x in inputs]
            snapshots = [f.copy() if isinstance(f, np.ndarray) else None for f in feeds]
            try:
                with np.errstate(all="ignore"):
                    actual = list(rep.run(feeds))
                for i, (e, a) in enumerate(zip(expected, actual)):
                    C.assert_similar(C._normalise(e), a, rtol, atol, f"data set {k} output {i}")
            except Exception as exc:  # noqa: BLE001
                if C.outcome(name) is None:  # passes with ordinary inputs: the policy is broken
                    failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
                break
            for f, snap in zip(feeds, snapshots):
                if snap is None:
                    continue
                same = f.tolist() == snap.tolist() if f.dtype == object else f.tobytes() == snap.tobytes()
                if not same:  # bitwise for numbers: NaN-safe, covers ml_dtypes types
                    failures.append(f"{name}: data set {k}: an input was modified")
            checked += 1
    assert checked > 1000
    assert not failures, "\n".join(failures[:20])


# --- outputs never alias -------------------------------------------------------------------------


def _identity_and_constant() -> bytes:
    """Outputs: x itself (Identity), a reshape view of x, and an initializer."""
    w = ArtifactWriter()
    w.opsets[""] = 17
    ident, reshape = w.operator("", "Identity", 17), w.operator("", "Reshape", 17)
    _, g = w.graph("g")
    x = g.value("x", 1, (2, 3))
    g.inputs.append(x)
    c = g.value("c", 1, (3,))
    g.initializers.append((c, w.tensor(np.array([1, 2, 3], np.float32))))
    shape = g.value("shape", 7, (1,))
    g.initializers.append((shape, w.tensor(np.array([6], np.int64))))
    y1, y2, y3 = g.value("same", 1), g.value("flat", 1), g.value("const", 1)
    g.add_node("i", ident, [x], [y1], [])
    g.add_node("r", reshape, [x, shape], [y2], [])
    g.add_node("c", ident, [c], [y3], [])
    g.outputs += [y1, y2, y3, c, x]
    return w.to_bytes()


def test_outputs_never_alias_inputs_weights_or_each_other():
    sess = minirt.Session(_identity_and_constant())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = sess.run(None, {"x": x})
    for o in outs:
        assert o.flags.writeable and not np.may_share_memory(o, x)
    for a in range(len(outs)):
        for b in range(a + 1, len(outs)):
            assert not np.may_share_memory(outs[a], outs[b])
    for o in outs:
        o[...] = -1  # the caller owns its outputs: writing them changes nothing inside the session
    again = sess.run(None, {"x": x})
    np.testing.assert_array_equal(again[2], [1, 2, 3])
    np.testing.assert_array_equal(again[3], [1, 2, 3])
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_outputs_survive_the_next_run():
    sess = minirt.Session(minimal_bytes())
    first = sess.run(None, {"x": np.zeros((2, 3), np.float32)})[0]
    kept = first.copy()
    sess.run(None, {"x": np.full((2, 3), 7, np.float32)})
    np.testing.assert_array_equal(first, kept)
