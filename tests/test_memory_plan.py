"""The static memory plan (minirt.memplan): placement and its independent verifier."""
from __future__ import annotations

import random

import pytest

from minirt import memplan


def _random_buffers(rng: random.Random, n: int, steps: int) -> list:
    out = []
    for _ in range(n):
        a = rng.randrange(steps)
        b = rng.randrange(a, min(steps, a + rng.randrange(1, 8)))
        out.append((a, b, rng.choice([1, 4, 64, 100, 4096, rng.randrange(1, 1 << 20)])))
    return out


@pytest.mark.parametrize("seed", range(200))
def test_random_plans_verify_and_are_tight(seed):
    rng = random.Random(seed)
    bufs = _random_buffers(rng, rng.randrange(1, 60), rng.randrange(1, 40))
    offsets, arena = memplan.plan(bufs)
    memplan.verify(bufs, offsets, arena)
    assert all(o % 64 == 0 for o in offsets)
    lower = memplan.peak_live_bytes(bufs)
    assert lower <= arena <= sum(-(-max(b[2], 1) // 64) * 64 for b in bufs)


def _best_fit_against_every_buffer(buffers, alignment=64):
    """The placement rule of memplan.plan written the plain quadratic way: each buffer (largest first)
    compared with every buffer placed before it."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i][2], buffers[i][0], i))
    size = [-(-max(b[2], 1) // alignment) * alignment for b in buffers]
    offsets, placed = [0] * len(buffers), []
    for i in order:
        busy = sorted((offsets[j], offsets[j] + size[j]) for j in placed if _live_together(buffers[i], buffers[j]))
        best, cursor = None, 0
        for lo, hi in busy:
            if lo - cursor >= size[i] and (best is None or lo - cursor < best[1]):
                best = (cursor, lo - cursor)
            cursor = max(cursor, hi)
        offsets[i] = best[0] if best else cursor
        placed.append(i)
    return offsets


@pytest.mark.parametrize("seed", range(40))
def test_indexed_placement_equals_the_plain_rule(seed):
    # long graphs (more steps than one index block) with a few buffers that live across many blocks
    rng = random.Random(5000 + seed)
    steps = rng.randrange(20, 400)
    bufs = _random_buffers(rng, rng.randrange(1, 300), steps)
    for _ in range(rng.randrange(0, 6)):
        a = rng.randrange(steps)
        bufs.append((a, rng.randrange(a, steps), rng.randrange(1, 1 << 16)))
    offsets, arena = memplan.plan(bufs)
    assert offsets == _best_fit_against_every_buffer(bufs)
    memplan.verify(bufs, offsets, arena)


@pytest.mark.parametrize("seed", range(10))
def test_indexed_placement_at_every_scale_equals_the_plain_rule(seed):
    # lifetimes of every scale of the index (blocks of 16, 128, 1024, 8192 steps) in one graph, as a
    # detector's: most buffers short, some living across most of the graph (SSDlite: up to 1,469 of 1,666)
    rng = random.Random(7000 + seed)
    steps = rng.randrange(2000, 10000)
    bufs = []
    for _ in range(rng.randrange(100, 300)):
        a = rng.randrange(steps)
        span = rng.choice((2, 20, 200, 2000, steps))
        bufs.append((a, min(steps - 1, a + rng.randrange(span)), rng.randrange(1, 1 << 16)))
    offsets, arena = memplan.plan(bufs)
    assert offsets == _best_fit_against_every_buffer(bufs)
    memplan.verify(bufs, offsets, arena)


def test_long_chain_reuses_a_few_slots():
    # 16k buffers of a 16k-step chain plus three that live throughout (the plain rule compares 128M
    # pairs here, minutes of Python; the indexed one about a second: benchmarks/cold_start.py times it)
    bufs = [(i, i + 2, 4096 + (i % 7) * 64) for i in range(16000)] + [(0, 16001, 1 << 20)] * 3
    offsets, arena = memplan.plan(bufs)
    memplan.verify(bufs, offsets, arena)
    # at most 3 chain buffers live at once: a few chain slots beside the three big ones
    assert memplan.peak_live_bytes(bufs) <= arena <= 3 * (1 << 20) + 6 * (4096 + 6 * 64)


def test_reuse_across_lifetimes():
    # a chain: each buffer dies when the next but one is made, so two slots suffice
    bufs = [(i, i + 1, 1000) for i in range(10)]
    offsets, arena = memplan.plan(bufs)
    memplan.verify(bufs, offsets, arena)
    assert arena == 2 * 1024


def _live_together(a, b) -> bool:
    """Whether buffers ``a`` and ``b`` ((first step, last step, nbytes), inclusive) are live at one step."""
    return a[0] <= b[1] and b[0] <= a[1]


@pytest.mark.parametrize("seed", range(50))
def test_verifier_catches_overlaps(seed):
    rng = random.Random(1000 + seed)
    bufs = _random_buffers(rng, rng.randrange(2, 40), 20)
    offsets, arena = memplan.plan(bufs)
    # move one buffer onto another one that is live at the same time
    pairs = [(i, j) for i in range(len(bufs)) for j in range(len(bufs))
             if i != j and _live_together(bufs[i], bufs[j])]
    if not pairs:
        pytest.skip("no buffers live together in this draw")
    i, j = rng.choice(pairs)
    bad = list(offsets)
    bad[i] = offsets[j]
    with pytest.raises(AssertionError, match="overlap"):
        memplan.verify(bufs, bad)


def test_verifier_checks_arena_bounds():
    with pytest.raises(AssertionError, match="outside"):
        memplan.verify([(0, 1, 100)], [10], arena=64)


# --------------------------------------------------------------------------- the plan wired into Session (D17)

import os
import threading

import numpy as np

import minirt
from minirt import plan as plan_mod
from minirt import native
from minirt import session as session_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def checked(monkeypatch):
    """Every plan verified (counted) and every arena buffer checked against live values at run time."""
    calls = []
    real = memplan.verify

    def verify(buffers, offsets, arena=None):
        calls.append(len(buffers))
        return real(buffers, offsets, arena)

    monkeypatch.setattr(memplan, "verify", verify)
    monkeypatch.setattr(plan_mod, "MEMPLAN_CHECK", True)
    return calls


def _same(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes() for x, y in zip(a, b)
    )


def _compare(data, feeds, checked, runs=3):
    plain = minirt.Session(data, memory_plan=False)
    planned = minirt.Session(data, memory_plan=True)
    for feed in feeds:
        want = plain.run(None, feed)
        for _ in range(runs):  # the first run records, the next ones use the arena
            assert _same(planned.run(None, feed), want)
    plans = planned.memory_plans()
    assert plans and any(p["buffers"] for p in plans)
    for p in plans:
        assert p["arena_bytes"] <= max(p["buffer_bytes"], 1) + 64 * p["buffers"]
    assert len(checked) >= sum(1 for p in plans if p["buffers"])
    return planned


def test_demo_model_planned_runs_are_bit_identical(checked):
    builder = pytest.importorskip("minirt.builder")
    path = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")
    if not os.path.exists(path):
        pytest.skip("digits example not present")
    data = builder.build_bytes(path)
    sess = minirt.Session(data)
    arg = sess.get_inputs()[0]
    rng = np.random.default_rng(0)
    feeds = [{arg.name: rng.standard_normal([d if isinstance(d, int) else b for d in arg.shape]).astype(np.float32)}
             for b in (1, 4)]
    _compare(data, feeds, checked)


def test_ppocr_cls_planned_runs_are_bit_identical(checked):
    builder = pytest.importorskip("minirt.builder")
    from tests.test_real_models import PPOCR_CLS, ppocr_input

    if PPOCR_CLS is None:
        pytest.skip("rapidocr-onnxruntime not installed")
    data = builder.build_bytes(PPOCR_CLS)
    _compare(data, [{"x": ppocr_input((1, 3, 48, 192), 1)}, {"x": ppocr_input((2, 3, 48, 320), 2)}], checked)


def _dynamic_model():
    from tests.test_dynamic_shapes import split_heads_model

    from minirt.builder import build_bytes

    return build_bytes(split_heads_model())


def test_dynamic_shapes_lru_eviction(checked):
    data = _dynamic_model()
    probe = minirt.Session(data)
    shapes = [(1, 3), (2, 5), (1, 8), (3, 4), (2, 7), (4, 2)]  # (batch, sequence)
    rng = np.random.default_rng(5)
    feeds = []
    for b, s in shapes:
        feed = {}
        for arg in probe.get_inputs():
            dims, syms = [], iter((b, s))
            for d in arg.shape:
                dims.append(d if isinstance(d, int) else next(syms))
            feed[arg.name] = rng.standard_normal(dims).astype(np.float32)
        feeds.append(feed)
    planned = _compare(data, feeds, checked)
    assert len(planned.memory_plans()) == session_mod.Session._MAX_MEMORY_PLANS  # 6 shapes, 4 kept
    # the evicted shapes come back (re-recorded) and still match
    plain = minirt.Session(data, memory_plan=False)
    for feed in feeds[:2] * 2:
        assert _same(planned.run(None, feed), plain.run(None, feed))
    kept = [p["inputs"] for p in planned.memory_plans()]
    assert {k: tuple(v.shape) for k, v in feeds[0].items()} in kept


def test_concurrent_planned_runs_match_serial(checked):
    from tests.fuzz.seeds import conv_model, mlp_model

    from minirt.builder import build_bytes

    for model_fn in (mlp_model, conv_model):
        data = build_bytes(model_fn())
        plain = minirt.Session(data, memory_plan=False)
        sess = minirt.Session(data, memory_plan=True)
        feeds = []
        for t in range(8):
            rng = np.random.default_rng(100 + t)
            per = []
            for _ in range(60):
                batch = int(rng.integers(1, 4))
                per.append({a.name: rng.standard_normal([d if isinstance(d, int) else batch for d in a.shape])
                            .astype(np.float32) for a in sess.get_inputs()})
            feeds.append(per)
        expected = [[plain.run(None, f) for f in per] for per in feeds]
        results, errors = [None] * 8, []
        start = threading.Barrier(8)

        def worker(t):
            try:
                start.wait()
                results[t] = [sess.run(None, f) for f in feeds[t]]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        for t in range(8):
            for got, want in zip(results[t], expected[t]):
                assert _same(got, want)
        assert any(p["buffers"] for p in sess.memory_plans())


def test_outputs_never_alias_the_arena_or_each_other(checked):
    from tests.fuzz.seeds import conv_model

    from minirt.builder import build_bytes

    sess = minirt.Session(build_bytes(conv_model()), memory_plan=True)
    feed = {a.name: np.random.default_rng(3).standard_normal([d if isinstance(d, int) else 2 for d in a.shape])
            .astype(np.float32) for a in sess.get_inputs()}
    first = sess.run(None, feed)  # records
    second = sess.run(None, feed)  # planned
    keep = [r.copy() for r in second]
    for r in second:
        r[...] = 12345.0  # the caller owns its outputs
    third = sess.run(None, feed)
    assert _same(third, keep) and _same(first, keep)
    for a in second:
        for b in third:
            assert not np.may_share_memory(a, b)


def test_memory_plan_off_builds_no_plans():
    from tests.fuzz.seeds import conv_model

    from minirt.builder import build_bytes

    sess = minirt.Session(build_bytes(conv_model()), memory_plan=False)
    feed = {a.name: np.ones([d if isinstance(d, int) else 1 for d in a.shape], np.float32) for a in sess.get_inputs()}
    sess.run(None, feed)
    sess.run(None, feed)
    assert sess.memory_plans() == []


def test_out_is_not_an_attribute():
    from minirt.kernels.registry import lookup

    for domain, op, opset in (("", "Add", 17), ("", "MatMul", 17), ("", "Relu", 17), ("com.minirt", "FusedConv", 1)):
        entry = lookup(domain, op, opset)
        assert entry.accepts_out and "out" not in entry.attributes


def test_int8_demo_model_planned_runs_are_bit_identical(checked):
    """QConv (and the fused int8 nodes around it) write into arena buffers like the float kernels."""
    builder = pytest.importorskip("minirt.builder")
    path = os.path.join(ROOT, "examples", "digits", "digits_cnn.onnx")
    calib = os.path.join(ROOT, "examples", "digits", "calibration.npz")
    if not (os.path.exists(path) and os.path.exists(calib)):
        pytest.skip("digits example not present")
    data = builder.build_bytes(path, quantize="int8", calibration=calib)
    sess = minirt.Session(data)
    arg = sess.get_inputs()[0]
    rng = np.random.default_rng(5)
    feeds = [{arg.name: rng.random([d if isinstance(d, int) else b for d in arg.shape]).astype(np.float32)}
             for b in (1, 3)]
    planned = _compare(data, feeds, checked)
    ops = {s.op.op_type for s in planned._plan.steps if s.accepts_out}
    assert "QConv" in ops


# --------------------------------------------------------------------------- the first run of fixed input shapes

def _fixed_shape_model() -> bytes:
    """Conv -> Relu -> Add(skip) -> Conv -> Mul on a fixed 1x3x16x16 input: every result's shape is declared."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from minirt.builder import build_bytes

    rng = np.random.default_rng(7)
    w1 = nh.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = nh.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2")
    s = nh.from_array(rng.standard_normal((1, 8, 1, 1)).astype(np.float32), "s")
    nodes = [
        h.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Add", ["c2", "r1"], ["a"]),
        h.make_node("Mul", ["a", "s"], ["y"]),
    ]
    graph = h.make_graph(nodes, "fixed", [h.make_tensor_value_info("x", TP.FLOAT, [1, 3, 16, 16])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [1, 8, 16, 16])], [w1, w2, s])
    return build_bytes(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))


def _plans_made(monkeypatch) -> list:
    """The record of every ArenaPlan the session makes (a list that fills as they are made)."""
    from minirt import arena as arena_mod

    made = []
    real = arena_mod.ArenaPlan

    class Counting(real):
        __slots__ = ()

        def __init__(self, plan, record):
            made.append(list(record))
            super().__init__(plan, record)

    monkeypatch.setattr(arena_mod, "ArenaPlan", Counting)
    return made


def test_first_run_of_fixed_shapes_writes_into_the_declared_plan(checked, monkeypatch):
    """A model whose input shapes are fixed runs its first run in an arena planned from the shapes
    the graph declares (no fresh allocation per result: D57); the run confirms them, so
    that plan stays, and every run gives the unplanned session's bits."""
    data = _fixed_shape_model()
    feed = {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    want = minirt.Session(data, memory_plan=False).run(None, feed)
    made = _plans_made(monkeypatch)
    sess = minirt.Session(data, memory_plan=True)
    assert _same(sess.run(None, feed), want)
    assert len(made) == 1 and any(made[0])  # the declared plan, made before the run
    (info,) = sess.memory_plans()
    assert info["buffers"] and info["arenas"] == 1  # its arena was used by that first run
    for _ in range(3):  # (then: the native program is recorded on it and replayed)
        assert _same(sess.run(None, feed), want)
    assert len(made) == 1 and sess.memory_plans()[0]["arenas"] == 1


def test_wrong_declared_shapes_cost_speed_not_results(checked, monkeypatch):
    """Declared shapes or dtypes that are wrong (a builder bug) give those nodes buffers that do not fit:
    the kernels then allocate (the out= contract), the results are still right, and the plan the
    session keeps is made from the shapes the run recorded."""
    data = _fixed_shape_model()
    feed = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    want = minirt.Session(data, memory_plan=False).run(None, feed)
    real = plan_mod.Plan.declared_results

    def wrong(plan):
        results = real(plan)
        placed = [i for i, r in enumerate(results) if r is not None]
        shape, dtype = results[placed[0]]
        results[placed[0]] = ((shape[0], shape[1] * 2) + tuple(shape[2:]), dtype)  # too big
        shape, dtype = results[placed[-1]]
        results[placed[-1]] = (shape, np.dtype(np.float64))  # the right size in bytes for half as many
        return results

    monkeypatch.setattr(plan_mod.Plan, "declared_results", wrong)
    made = _plans_made(monkeypatch)
    sess = minirt.Session(data, memory_plan=True)
    assert _same(sess.run(None, feed), want)
    # the declared plan, then the one of the real shapes (again by the warm-up's run for real when its dry
    # run, D92, recorded no program on them)
    assert len(made) >= 2 and made[1] != made[0] and all(m == made[1] for m in made[1:])
    assert sess._mplans[sess._STATIC_SIGNATURE].results == made[1]
    count = len(made)
    for _ in range(3):
        assert _same(sess.run(None, feed), want)
    assert len(made) == count


def test_symbolic_shapes_record_before_planning(checked, monkeypatch):
    """Input shapes that are not fixed: no declared plan; the first run of a shape records its results and
    makes no plan (a shape seen once, a text crop of its own width, would not repay one); the second run of
    those shapes makes it from that record and runs on its arena."""
    from tests.fuzz.seeds import conv_model

    from minirt.builder import build_bytes

    made = _plans_made(monkeypatch)
    sess = minirt.Session(build_bytes(conv_model()), memory_plan=True)
    feeds = [{a.name: np.full([d if isinstance(d, int) else size for d in a.shape], 0.5, np.float32)
              for a in sess.get_inputs()} for size in (2, 3)]
    want = [minirt.Session(build_bytes(conv_model()), memory_plan=False).run(None, f) for f in feeds]
    assert _same(sess.run(None, feeds[0]), want[0])
    assert made == [] and sess.memory_plans() == []  # recorded, not planned
    assert _same(sess.run(None, feeds[1]), want[1])  # another shape, once: still no plan
    assert made == [] and sess.memory_plans() == []
    assert _same(sess.run(None, feeds[0]), want[0])  # the first shape again: planned now, and run on it
    assert len(made) == 1 and [p["arenas"] for p in sess.memory_plans()] == [1]
    assert _same(sess.run(None, feeds[0]), want[0])
    assert len(made) == 1


def test_declared_shapes_beyond_the_memory_guard_are_not_planned(checked, monkeypatch):
    """The declared shapes come from the file: one that declares a result of 2^64 bytes (a hostile or
    broken artifact) must not make the first run allocate that arena; it allocates and records."""
    data = _fixed_shape_model()
    feed = {"x": np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    want = minirt.Session(data, memory_plan=False).run(None, feed)
    real = plan_mod.Plan.declared_results

    def huge(plan):
        results = real(plan)
        i = next(i for i, r in enumerate(results) if r is not None)
        results[i] = ((2**31, 2**31), np.dtype(np.float32))
        return results

    monkeypatch.setattr(plan_mod.Plan, "declared_results", huge)
    made = _plans_made(monkeypatch)
    sess = minirt.Session(data, memory_plan=True)
    assert _same(sess.run(None, feed), want)
    assert made == [] and sess.memory_plans() == []  # the first run only records what it made (D166)
    assert _same(sess.run(None, feed), want)  # the second makes the plan from that, and runs on it
    assert len(made) == 1 and sess.memory_plans()[0]["arenas"] == 1
    assert _same(sess.run(None, feed), want)


def test_fixed_shapes_that_follow_the_data_are_planned_on_the_second_run(checked, monkeypatch):
    """Fixed input shapes, but a NonZero result in the middle (a detector's post-processing): no declared
    plan, so the first run runs unplanned and keeps a sighting; the plan (SSDlite's took a third of its
    first run) is made on the second run, which then runs on it, and later runs reuse it (D166)."""
    from onnx import TensorProto as TP
    from onnx import helper as h

    from minirt.builder import build_bytes

    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["r"]), h.make_node("NonZero", ["r"], ["nz"]),
         h.make_node("Transpose", ["nz"], ["t"]), h.make_node("Cast", ["t"], ["f"], to=TP.FLOAT),
         h.make_node("Mul", ["f", "f"], ["y"])],
        "g", [h.make_tensor_value_info("x", TP.FLOAT, [4, 64])], [h.make_tensor_value_info("y", TP.FLOAT, ["n", 2])])
    data = build_bytes(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]))
    rng = np.random.default_rng(5)
    feed = {"x": rng.standard_normal((4, 64)).astype(np.float32)}
    want = minirt.Session(data, memory_plan=False).run(None, feed)
    made = _plans_made(monkeypatch)
    sess = minirt.Session(data, memory_plan=True)
    assert _same(sess.run(None, feed), want)
    assert made == [] and sess.memory_plans() == []
    for _ in range(3):
        assert _same(sess.run(None, feed), want)
        assert len(made) == 1 and len(sess.memory_plans()) == 1
    other = {"x": rng.standard_normal((4, 64)).astype(np.float32)}  # (another count of non-zeros)
    assert _same(sess.run(None, other), minirt.Session(data, memory_plan=False).run(None, other))


@pytest.mark.parametrize("seed", range(30))
def test_peak_live_bytes_is_the_largest_live_total(seed):
    rng = random.Random(7000 + seed)
    bufs = _random_buffers(rng, rng.randrange(1, 80), rng.randrange(1, 50))
    plain = max(sum(b[2] for b in bufs if b[0] <= t <= b[1]) for t in {b[0] for b in bufs})
    assert memplan.peak_live_bytes(bufs) == plain


def test_fixed_shapes_get_their_declared_plan_and_arena_with_the_session():
    """With fixed input shapes the session makes the memory plan of the declared shapes, and its first
    arena, when it is created (D82): the first run uses that arena (no second one), gives the unplanned
    results, and keeps the plan when the real shapes are the declared ones."""
    builder = pytest.importorskip("minirt.builder")
    from tests.test_real_models import PPOCR_CLS, ppocr_input

    if PPOCR_CLS is None:
        pytest.skip("rapidocr-onnxruntime not installed")
    data = builder.build(PPOCR_CLS, None, input_shapes={"x": [1, 3, 48, 192]}).data
    sess = minirt.Session(data, warm_up=False)  # (a warm-up would be that first run, D90)
    declared = sess._declared_plan
    assert declared is not None and declared.arenas == 1 and len(declared._free) == 1
    assert sess.memory_plans() == []  # (kept once a run confirms it)
    feed = {"x": ppocr_input((1, 3, 48, 192), 1)}
    want = minirt.Session(data, memory_plan=False).run(None, feed)
    for _ in range(3):
        assert _same(sess.run(None, feed), want)
    (plan,) = sess.memory_plans()
    assert plan["arenas"] == 1 and sess._mplans[session_mod.Session._STATIC_SIGNATURE] is declared
    # no plan made up front without fixed shapes, or with the memory plan off
    assert minirt.Session(data, memory_plan=False)._declared_plan is session_mod._NOT_RECORDED
    dynamic = minirt.Session(builder.build_bytes(PPOCR_CLS))
    assert dynamic._declared_plan is session_mod._NOT_RECORDED


def _vm_flags_of(address: int) -> list[str] | None:
    """The kernel's VmFlags of the mapping that holds ``address`` (/proc/self/smaps), or None."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_big_arenas_are_not_advised_huge_pages():
    # numpy advises huge pages for its large buffers ("hg"), and under the usual defrag=madvise a
    # first touch may then stall in compaction: a big arena (32 MB and more) comes without that advice (D85, D134)
    from minirt import arena as arena_mod
    from minirt import pages

    nbytes = pages.PLAIN_PAGES_FROM_BYTES
    big = arena_mod._arena_memory(nbytes)
    big[::4096] = 1  # written through: the mapping is ordinary private memory
    assert big.nbytes == nbytes and big.flags.writeable
    flags = _vm_flags_of(big.ctypes.data + nbytes // 2)  # (the middle: advice may split a mapping)
    assert flags is not None and "hg" not in flags, flags
    if np._core.multiarray._get_madvise_hugepage():  # the contrast: numpy's own big buffer is advised
        reference = np.empty(nbytes, dtype=np.uint8)
        assert "hg" in (_vm_flags_of(reference.ctypes.data + nbytes // 2) or [])
        smaller = arena_mod._arena_memory(16 << 20)  # (smaller arenas keep numpy's advice, cheaper to fault)
        assert "hg" in (_vm_flags_of(smaller.ctypes.data + (8 << 20)) or [])


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc/self/smaps")
def test_a_big_private_copy_of_the_file_is_not_advised_huge_pages():
    # the session's private copy of its file (D97) follows the arena's rule (minirt.pages, D134): a
    # 93 MB ResNet-18 artifact read into huge pages took 330-530 ms now and then on a virtual machine
    from minirt import pages

    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    thp_on = os.path.exists(thp) and "[never]" not in open(thp).read()
    for nbytes, advised in ((pages.PLAIN_PAGES_FROM_BYTES, False), (16 << 20, True)):
        buf = pages.anonymous(nbytes)
        view = np.frombuffer(buf, dtype=np.uint8)
        flags = _vm_flags_of(view.ctypes.data + nbytes // 2)
        assert flags is not None
        if advised and thp_on:
            assert "hg" in flags, flags
        if not advised:
            assert "hg" not in flags, flags
        del view
        buf.close()


def test_softmax_writes_its_result_over_its_dying_input(checked):
    """Attention scores -> Softmax -> product: the probabilities go over the scores' buffer (D143), so the
    arena holds one [heads, n, n] buffer, not two, and planned runs (checked against every live value)
    give the unplanned run's bits; so do its native program's replays."""
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from minirt.builder import build_bytes

    heads, n, d = 2, 48, 16
    rng = np.random.default_rng(3)
    kt = nh.from_array(rng.standard_normal((heads, d, n)).astype(np.float32), "kt")
    v = nh.from_array(rng.standard_normal((heads, n, d)).astype(np.float32), "v")
    nodes = [h.make_node("MatMul", ["q", "kt"], ["scores"]), h.make_node("Softmax", ["scores"], ["p"], axis=-1),
             h.make_node("MatMul", ["p", "v"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("q", TP.FLOAT, [heads, n, d])],
                         [h.make_tensor_value_info("y", TP.FLOAT, [heads, n, d])], initializer=[kt, v])
    # (the three nodes as they are: recognised, they are one attention node keeping its scores in cache, D153)
    data = build_bytes(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
                       disabled_passes=["recognise_attention"])
    feeds = [{"q": rng.standard_normal((heads, n, d)).astype(np.float32)} for _ in range(2)]
    planned = _compare(data, feeds, checked)
    (plan,) = planned.memory_plans()
    scores_bytes = heads * n * n * 4
    assert plan["arena_bytes"] < 2 * scores_bytes, plan  # (a buffer of its own: 2 x 18,432 bytes)
    if native.available:  # (MEMPLAN_CHECK records no program: a session without it)
        plan_mod.MEMPLAN_CHECK = False
        replayed = minirt.Session(data)
        for feed in feeds * 2:
            assert _same(replayed.run(None, feed), minirt.Session(data, memory_plan=False).run(None, feed))
        assert replayed.native_program_status().startswith("yes"), replayed.native_program_status()
