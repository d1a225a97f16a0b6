"""The memory guard: kernels that size outputs from input values refuse huge tensors before allocating."""
from __future__ import annotations

import resource
import threading
import time

import numpy as np
import pytest

import minirt
from minirt.builder.writer import ArtifactWriter
from minirt.format import schema as S
from minirt.kernels import _limits
from tests.format.util import fix_section_crcs, section

GiB = 2**30


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _one_node(op, consts, *, x=np.ones((2, 3), np.float32), opset=18, attrs=(), first_input=True) -> bytes:
    """y = op(x?, *consts) over initializers; ``consts`` are arrays (None = absent input)."""
    w = ArtifactWriter()
    w.opsets[""] = opset
    o = w.operator("", op, opset)
    _, g = w.graph("g")
    ins = []
    if first_input:
        xv = g.value("x", 1 if x.dtype == np.float32 else 7, x.shape)
        g.inputs.append(xv)
        ins.append(xv)
    for i, c in enumerate(consts):
        if c is None:
            ins.append(-1)
            continue
        t = w.tensor(np.asarray(c))
        v = g.value(f"c{i}")
        g.initializers.append((v, t))
        ins.append(v)
    y = g.value("y")
    g.add_node("n", o, ins, [y], list(attrs))
    g.outputs.append(y)
    return w.to_bytes()


def _run(data: bytes, x=np.ones((2, 3), np.float32), **kw):
    sess = minirt.Session(data, **kw)
    feed = {"x": x} if sess.get_inputs() else {}
    return sess.run(None, feed)[0]


HUGE = 2**40
i64 = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731

CASES = {
    "Expand": lambda n: _one_node("Expand", [i64(n, 2, 3)]),
    "Tile": lambda n: _one_node("Tile", [i64(n, 1)]),
    "Pad": lambda n: _one_node("Pad", [i64(0, 0, n, 0)]),
    "ConstantOfShape": lambda n: _one_node("ConstantOfShape", [i64(n, 4)], first_input=False),
    "Range": lambda n: _one_node("Range", [np.array(0, np.int64), np.array(n, np.int64), np.array(1, np.int64)],
                                 first_input=False),
    "Range-float": lambda n: _one_node("Range", [np.array(0, np.float32), np.array(n, np.float32),
                                                 np.array(1, np.float32)], first_input=False),
    "OneHot": lambda n: _one_node("OneHot", [np.array(n, np.int64), f32(0, 1)], x=i64(0, 1, 2)),
    "Resize-sizes": lambda n: _one_node("Resize", [None, None, i64(2, n)], opset=19),
    "Resize-scales": lambda n: _one_node("Resize", [None, f32(1, n)], opset=19),
    "Upsample": lambda n: _one_node("Upsample", [f32(1, n)], opset=9),
    "ConvTranspose": lambda n: _one_node(
        "ConvTranspose", [np.ones((1, 1, 1, 1), np.float32)], x=np.ones((1, 1, 2, 2), np.float32), opset=11,
        attrs=[("output_shape", S.ATTR_INTS, (n, 2))]),
}


def _feed_x(name):
    if name == "OneHot":
        return i64(0, 1, 2)
    if name == "ConvTranspose":
        return np.ones((1, 1, 2, 2), np.float32)
    return np.ones((2, 3), np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_huge_value_driven_output_is_refused_before_allocating(name):
    data = CASES[name](HUGE)
    before, t0 = _maxrss_mib(), time.monotonic()
    with pytest.raises(minirt.ResourceError, match="max_tensor_bytes") as exc:
        _run(data, _feed_x(name))
    assert isinstance(exc.value, minirt.KernelError)
    assert time.monotonic() - t0 < 2 and _maxrss_mib() - before < 64


@pytest.mark.parametrize("name", sorted(CASES))
def test_limit_is_per_session(name):
    data = CASES[name](4000)  # a few tens of KiB to a few hundred KiB
    out = _run(data, _feed_x(name))  # the default limit lets it through
    assert out.size >= 4000
    with pytest.raises(minirt.ResourceError):
        _run(data, _feed_x(name), max_tensor_bytes=1000)
    assert _run(data, _feed_x(name), max_tensor_bytes=out.nbytes * 8).shape == out.shape


def _loop_artifact(trips: int) -> bytes:
    """Loop(M=trips) whose body emits a 64 KiB scan output every iteration."""
    w = ArtifactWriter()
    w.opsets[""] = 16
    loop_op, ident = w.operator("", "Loop", 16), w.operator("", "Identity", 16)
    _, g = w.graph("main")
    m = g.value("M", 7, ())
    g.initializers.append((m, w.tensor(np.array(trips, np.int64))))
    big = g.value("big", 1, (16384,))
    g.initializers.append((big, w.tensor(np.zeros(16384, np.float32))))
    x = g.value("x", 1, (2, 3))
    g.inputs.append(x)
    scan = g.value("scan", 1, None)
    bi, body = w.graph("body")
    it, cond_in = body.value("i", 7, ()), body.value("cond", 9, ())
    body.inputs += [it, cond_in]
    cap = body.value("big", 1, (16384,))
    body.captures.append(cap)
    cond_out, item = body.value("cond_out", 9, ()), body.value("item", 1, (16384,))
    body.add_node("c", ident, [cond_in], [cond_out], [])
    body.add_node("s", ident, [cap], [item], [])
    body.outputs += [cond_out, item]
    cond = g.value("cond", 9, ())
    g.initializers.append((cond, w.tensor(np.array(True))))
    g.add_node("loop", loop_op, [m, cond], [scan], [("body", S.ATTR_GRAPH, bi)])
    g.outputs.append(scan)
    return w.to_bytes()


def test_loop_accumulation_is_bounded():
    x = np.ones((2, 3), np.float32)
    assert _run(_loop_artifact(4), x).shape == (4, 16384)
    with pytest.raises(minirt.ResourceError, match="Loop scan output 0 after 17 iterations"):
        _run(_loop_artifact(10**9), x, max_tensor_bytes=2**20)


def test_session_option_validation():
    data = CASES["Expand"](4)
    assert minirt.Session(data).max_tensor_bytes == _limits.DEFAULT_MAX_TENSOR_BYTES
    for bad in (0, -1, 1.5, "1", True):
        with pytest.raises(minirt.InvalidArgument, match="max_tensor_bytes"):
            minirt.Session(data, max_tensor_bytes=bad)


def test_default_limit_is_sane():
    default = _limits.default_max_tensor_bytes()
    assert 2**26 <= default <= 2**34
    total = _limits._physical_memory()
    if total is not None:
        assert default <= total


def test_check_alloc_and_limit_scope():
    _limits.check_alloc((1024, 1024), np.float32, "t")
    with _limits.limit(1000):
        assert _limits.current_limit() == 1000
        with pytest.raises(minirt.ResourceError, match=r"t of shape \[1000, 1\] .* 3\.9 KiB"):
            _limits.check_alloc((1000, 1), np.float32, "t")
        _limits.check_alloc((0, 2**62), np.float32, "empty")  # empty: nothing to allocate
    assert _limits.current_limit() == _limits.DEFAULT_MAX_TENSOR_BYTES


def test_concurrent_sessions_keep_their_own_limits():
    data = CASES["Expand"](5000)  # 120 KB
    small = minirt.Session(data, max_tensor_bytes=1000)
    large = minirt.Session(data)
    x = np.ones((2, 3), np.float32)
    results = {"small": [], "large": []}
    barrier = threading.Barrier(4)

    def work(name, sess):
        barrier.wait()
        for _ in range(50):
            try:
                sess.run(None, {"x": x})
                results[name].append("ok")
            except minirt.ResourceError:
                results[name].append("refused")

    threads = [threading.Thread(target=work, args=(n, s)) for n, s in
               (("small", small), ("large", large), ("small", small), ("large", large))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["small"]) == {"refused"} and set(results["large"]) == {"ok"}


# --- fuzz regression: a bit flip in a shape constant -------------------------------------------


@pytest.mark.parametrize("name", ["Expand", "Tile", "Pad", "ConstantOfShape"])
def test_bit_flipped_shape_constant_fails_fast(name):
    data = bytearray(CASES[name](4))
    off, length = section(data, S.SECTION_TENSOR_DATA)
    # the constant holds small int64s; set bit 38 of its first non-zero element (4 -> ~1.1e12)
    words = np.frombuffer(bytes(data[off : off + length]), dtype="<i8")
    i = int(np.flatnonzero(words)[0])
    data[off + 8 * i + 4] ^= 0x40
    data = bytes(fix_section_crcs(data))
    before, t0 = _maxrss_mib(), time.monotonic()
    with pytest.raises(minirt.KernelError):
        _run(data, np.ones((2, 3), np.float32))
    assert time.monotonic() - t0 < 2 and _maxrss_mib() - before < 64


# Shape-driven growth (issue 22): no value asks for the size, the shapes and attributes do.  A pad of 20,000
# turns a 4 x 4 image into a 40,004 x 40,004 plane; (40000, 1) + (1, 40000) broadcast is 1.6e9 values.
PAD = 20000
SHAPE_CASES = {
    "Conv-pads": (lambda: _one_node("Conv", [np.ones((1, 1, 1, 1), np.float32)], x=np.ones((1, 1, 4, 4), np.float32),
                                    attrs=[("pads", S.ATTR_INTS, (PAD,) * 4)]), np.ones((1, 1, 4, 4), np.float32)),
    "MaxPool-pads": (lambda: _one_node("MaxPool", [], x=np.ones((1, 1, 4, 4), np.float32),
                                       attrs=[("kernel_shape", S.ATTR_INTS, (1, 1)), ("pads", S.ATTR_INTS, (PAD,) * 4)]),
                     np.ones((1, 1, 4, 4), np.float32)),
    "AveragePool-pads": (lambda: _one_node("AveragePool", [], x=np.ones((1, 1, 4, 4), np.float32),
                                           attrs=[("kernel_shape", S.ATTR_INTS, (3, 3)),
                                                  ("pads", S.ATTR_INTS, (PAD,) * 4)]),
                         np.ones((1, 1, 4, 4), np.float32)),
    "Add-broadcast": (lambda: _one_node("Add", [np.ones((1, 40000), np.float32)], x=np.ones((40000, 1), np.float32)),
                      np.ones((40000, 1), np.float32)),
    "Mul-broadcast-int": (lambda: _one_node("Mul", [np.ones((1, 40000), np.int64)], x=np.ones((40000, 1), np.int64)),
                          np.ones((40000, 1), np.int64)),
    "Where-broadcast": (lambda: _one_node("Where", [np.ones((40000, 1), bool), np.ones((1, 40000), np.float32),
                                                    np.ones((1, 1), np.float32)], first_input=False), None),
    "Max-broadcast": (lambda: _one_node("Max", [np.ones((1, 40000), np.float32)], x=np.ones((40000, 1), np.float32)),
                      np.ones((40000, 1), np.float32)),
    "Sum-broadcast": (lambda: _one_node("Sum", [np.ones((1, 40000), np.float32), np.ones((1, 1), np.float32)],
                                        x=np.ones((40000, 1), np.float32)), np.ones((40000, 1), np.float32)),
}


@pytest.mark.parametrize("name", sorted(SHAPE_CASES))
def test_growth_from_pads_and_broadcasting_is_refused_before_allocating(name):
    make, x = SHAPE_CASES[name]
    before, t0 = _maxrss_mib(), time.monotonic()
    with pytest.raises(minirt.ResourceError, match="max_tensor_bytes of 256.0 MiB") as exc:
        _run(make(), np.ones((2, 3), np.float32) if x is None else x, max_tensor_bytes=256 << 20)
    assert "refused before allocating" in str(exc.value)
    assert time.monotonic() - t0 < 2 and _maxrss_mib() - before < 64


def test_ordinary_broadcasts_and_pads_pass_the_guard():
    """A per-channel scale and a padded conv well under the limit are not refused (the bound on a broadcast
    is the product of the operand sizes: only above the limit is the result's shape worked out)."""
    x = np.ones((1, 8, 16, 16), np.float32)
    y = _run(_one_node("Mul", [np.full((1, 8, 1, 1), 2.0, np.float32)], x=x), x, max_tensor_bytes=1 << 16)
    np.testing.assert_array_equal(y, 2 * x)
    y = _run(_one_node("Conv", [np.ones((1, 8, 3, 3), np.float32)], x=x, attrs=[("pads", S.ATTR_INTS, (1,) * 4)]),
             x, max_tensor_bytes=1 << 16)
    assert y.shape == (1, 1, 16, 16) and y[0, 0, 8, 8] == 72


def _lstm_artifact(seq: int, inputs: int, hidden: int) -> bytes:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 4 * hidden, inputs)) * 0.1).astype(np.float32)
    r = (rng.standard_normal((1, 4 * hidden, hidden)) * 0.1).astype(np.float32)
    return _one_node("LSTM", [w, r], x=np.ones((seq, 1, inputs), np.float32), opset=14,
                     attrs=[("hidden_size", S.ATTR_INT, hidden)])


@pytest.mark.skipif(not minirt.native.available, reason="the bound over native scratch needs the native kernels")
def test_native_scratch_above_the_bound_is_refused():
    # An LSTM's input projection (seq x 4H floats: 7.8 MiB here) is the native kernel's scratch, larger
    # than every tensor of the node (Y 2 MiB, R 1 MiB): a 4 MiB bound refuses it before allocating, with
    # the sizes named; 64 MiB runs it.  Each session runs on a thread of its own: a thread's scratch,
    # once grown, is reused without allocating again.
    data = _lstm_artifact(2000, 16, 256)
    x = np.ones((2000, 1, 16), np.float32)
    results = {}

    def run(limit):
        try:
            results[limit] = minirt.Session(data, threads=1, max_tensor_bytes=limit, warm_up=False).run(
                None, {"x": x})[0]
        except minirt.Error as exc:
            results[limit] = exc

    for limit in (4 << 20, 64 << 20):
        t = threading.Thread(target=run, args=(limit,))
        t.start()
        t.join()
    refused = results[4 << 20]
    assert isinstance(refused, minirt.ResourceError), refused
    assert "LSTM" in str(refused) and "scratch of 7.8 MiB" in str(refused) and "4.0 MiB" in str(refused)
    assert isinstance(results[64 << 20], np.ndarray) and results[64 << 20].shape == (2000, 1, 1, 256)
