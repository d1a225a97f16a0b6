"""The native tree-ensemble kernel (minirt/native/trees_impl.h, mrt_tree_votes) against the numpy
reference (minirt/kernels/trees.py: traverse + accumulate): the same bits on random layouts (float32
and float64 thresholds, every comparison, mixed and uniform, NaN features with and without
missing-true, NaN thresholds, SUM / AVERAGE / MIN / MAX, one and three targets, 1 and 1000 samples,
1 and 2 threads) and on real converted models (tests/ml's tree cases)."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from minirt import native
from minirt.kernels import trees
from tests.native.conftest import requires_native

pytestmark = requires_native

BRANCH_MODES = (trees.LEQ, trees.LT, trees.GTE, trees.GT, trees.EQ, trees.NEQ)
# x and thresholds from one small set, so equal values (EQ, LEQ vs LT) happen often
GRID = np.array([-2.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 1.5], dtype=np.float64)


def random_layout(rng, *, dtype, n_targets, modes, missing: float, n_trees=23, n_features=6, max_depth=7,
                  nan_thresholds=False, sparse_weights=True, leaf_p=0.25,
                  spine=False) -> trees.TreeLayout:
    """Random trees (each breadth first from its root, leaves at many depths, some trees a lone leaf),
    comparisons drawn from ``modes``, missing-true on a ``missing`` share of the branch nodes, and leaf
    weights with gaps (targets no weight names) and repeats (two weights of one leaf and target)."""
    feature, threshold, true_next, false_next, mode, roots = [], [], [], [], [], []
    leaf_rows = 0

    def new_node():
        for a in (feature, threshold, true_next, false_next, mode):
            a.append(0)
        return len(feature) - 1

    for t in range(n_trees):
        root = new_node()
        roots.append(root)
        queue = [(root, 0, spine)]
        lone = t % 11 == 5
        while queue:
            node, depth, on_spine = queue.pop(0)
            if lone or depth >= max_depth or (depth >= 1 and not on_spine and rng.random() < leaf_p):
                feature[node], mode[node] = leaf_rows, trees.LEAF
                true_next[node] = false_next[node] = node
                leaf_rows += 1
                continue
            feature[node] = int(rng.integers(n_features))
            threshold[node] = float(rng.choice(GRID)) if not (nan_thresholds and rng.random() < 0.05) else np.nan
            mode[node] = int(rng.choice(modes)) | (trees.MISSING_TRUE if rng.random() < missing else 0)
            a, b = new_node(), new_node()
            true_next[node], false_next[node] = a, b
            queue += [(a, depth + 1, False), (b, depth + 1, on_spine)]
    leaves = np.arange(leaf_rows)
    w_leaf, w_target = [], []
    for leaf in leaves:
        for k in range(n_targets):
            if not sparse_weights or rng.random() < 0.8:
                w_leaf.append(leaf)
                w_target.append(k)
    extra = rng.integers(0, len(w_leaf), size=len(w_leaf) // 10)  # repeated weights add up
    w_leaf = np.concatenate([w_leaf, np.asarray(w_leaf)[extra]])
    w_target = np.concatenate([w_target, np.asarray(w_target)[extra]])
    w_value = rng.normal(size=len(w_leaf)) * 10
    return trees.TreeLayout(feature, np.asarray(threshold, dtype=dtype), true_next, false_next, mode, roots,
                            w_leaf, w_target, w_value.astype(dtype), n_targets)


def random_x(rng, n, n_features=6, dtype=np.float32, nan: float = 0.1):
    x = rng.choice(GRID, size=(n, n_features)) + np.where(rng.random((n, n_features)) < 0.3,
                                                          rng.normal(size=(n, n_features)), 0)
    x[rng.random((n, n_features)) < nan] = np.nan
    return x.astype(dtype)


def numpy_votes(layout, x, aggregate):
    return trees.accumulate(layout, trees.traverse(layout, x), aggregate)


def assert_same_bits(got, want):
    (gs, gh), (ws, wh) = got, want
    assert gs.dtype == ws.dtype and gs.shape == ws.shape
    assert gh.dtype == wh.dtype == np.bool_
    assert np.array_equal(gh, wh)
    bits = np.uint32 if gs.dtype == np.float32 else np.uint64
    assert np.array_equal(gs.view(bits), ws.view(bits)), \
        f"max difference {np.nanmax(np.abs(gs.astype(np.float64) - ws))}"


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def nthreads(request):
    before = native.threads()
    native.set_threads(request.param)
    yield request.param
    native.set_threads(before)


def native_votes(layout, x, aggregate):
    layout._native.clear()
    got = trees.votes(layout, x, aggregate)
    assert layout._native and all(layout._native.values()), "the native path did not run"
    return got


MODE_SETS = {"LEQ": (trees.LEQ,), "LT": (trees.LT,), "GTE": (trees.GTE,), "GT": (trees.GT,), "EQ": (trees.EQ,),
             "NEQ": (trees.NEQ,), "mixed": BRANCH_MODES}


@pytest.mark.parametrize("modes", sorted(MODE_SETS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("n_targets", [1, 3])
@pytest.mark.parametrize("missing", [0.0, 0.5], ids=["nomissing", "missing"])
def test_random_layouts_bit_identical(modes, dtype, n_targets, missing, nthreads):
    rng = np.random.default_rng(zlib.crc32(f"{modes} {n_targets} {missing} {np.dtype(dtype)}".encode()))
    layout = random_layout(rng, dtype=dtype, n_targets=n_targets, modes=MODE_SETS[modes], missing=missing,
                           nan_thresholds=modes == "mixed")
    for n in (1, 1000):
        for x_dtype in (np.float32, np.float64):
            x = random_x(rng, n, dtype=x_dtype)
            for aggregate in (trees.SUM, trees.AVERAGE, trees.MIN, trees.MAX):
                assert_same_bits(native_votes(layout, x, aggregate), numpy_votes(layout, x, aggregate))


@pytest.mark.parametrize("n_trees", [1, 7, 8, 9, 200])
def test_tree_counts_and_deep_trees(n_trees, nthreads):
    """Groups of MRT_TREE_GROUP trees with a partial last group; deep trees (paths of 30 levels)."""
    rng = np.random.default_rng(n_trees)
    layout = random_layout(rng, dtype=np.float32, n_targets=1, modes=(trees.LEQ,), missing=0.2, n_trees=n_trees,
                           max_depth=30 if n_trees < 10 else 8, sparse_weights=False,
                           leaf_p=0.45 if n_trees < 10 else 0.25, spine=n_trees < 10)
    if n_trees < 10:
        assert layout.depth == 30
    x = random_x(rng, 257)
    for aggregate in (trees.SUM, trees.AVERAGE, trees.MIN, trees.MAX):
        assert_same_bits(native_votes(layout, x, aggregate), numpy_votes(layout, x, aggregate))


def test_integer_x_and_noncontiguous_x():
    rng = np.random.default_rng(3)
    layout = random_layout(rng, dtype=np.float32, n_targets=3, modes=BRANCH_MODES, missing=0.3)
    xi = rng.integers(-2, 3, size=(50, 6)).astype(np.int64)
    assert_same_bits(native_votes(layout, xi, trees.SUM), numpy_votes(layout, xi, trees.SUM))
    xt = random_x(rng, 6, n_features=50).T  # (50, 6), Fortran order
    assert_same_bits(native_votes(layout, xt, trees.SUM), numpy_votes(layout, xt, trees.SUM))


def test_member_nodes_take_the_numpy_path():
    rng = np.random.default_rng(4)
    layout = random_layout(rng, dtype=np.float32, n_targets=1, modes=(trees.LEQ,), missing=0.0)
    mode = layout.mode.copy()
    branch = np.flatnonzero((mode & 15) != trees.LEAF)
    mode[branch[:3]] = trees.MEMBER
    thr = layout.threshold.copy()
    thr[branch[:3]] = 0
    member = trees.TreeLayout(layout.feature, thr, layout.true_next, layout.false_next, mode, layout.roots,
                              layout.weight_leaf, layout.weight_target, layout.weight_value, 1,
                              members=[GRID[:4]])
    x = random_x(rng, 100)
    got = trees.votes(member, x, trees.SUM)
    assert member._native and not any(member._native.values())
    assert_same_bits(got, numpy_votes(member, x, trees.SUM))


def test_errors_match_the_numpy_path():
    rng = np.random.default_rng(5)
    layout = random_layout(rng, dtype=np.float32, n_targets=1, modes=(trees.LEQ,), missing=0.0)
    with pytest.raises(ValueError, match="features per sample"):
        trees.votes(layout, np.zeros((3, 2), np.float32), trees.SUM)
    with pytest.raises(ValueError, match="aggregate_function"):
        trees.votes(layout, np.zeros((3, 6), np.float32), 7)
    # no sample: the numpy path's empty result, whatever X's width
    s, h = trees.votes(layout, np.zeros((0, 2), np.float32), trees.SUM)
    assert s.shape == (0, 1) and h.shape == (0, 1)


def test_only_leaves_and_no_features():
    """Every tree a lone leaf: X may have no columns (the kernel then reads no X at all)."""
    layout = trees.TreeLayout([0, 1], np.zeros(2, np.float32), [0, 1], [0, 1], [trees.LEAF, trees.LEAF], [0, 1],
                              [0, 1, 1], [0, 0, 0], np.asarray([1.5, 2.0, -0.25], np.float32), 1)
    x = np.zeros((4, 0), np.float32)
    got = native_votes(layout, x, trees.SUM)
    assert_same_bits(got, numpy_votes(layout, x, trees.SUM))
    assert got[0].tolist() == [[3.25]] * 4


def test_bad_parameters_are_refused():
    rng = np.random.default_rng(6)
    layout = random_layout(rng, dtype=np.float32, n_targets=1, modes=(trees.LEQ,), missing=0.0)
    x = random_x(rng, 4)
    ens = trees._native_ensemble(layout, x, trees.SUM)[0]
    with pytest.raises(ValueError, match="bad parameters"):  # fewer columns than the trees test
        native.tree_votes(ens, np.zeros((4, 1), np.float32), np.empty((4, 1), np.float32), np.empty((4, 1), bool))


# --------------------------------------------------------------------------- real converted models

TREE_CASES = ("DecisionTreeClassifier", "RandomForestClassifier-multi", "RandomForestRegressor",
              "GradientBoostingClassifier-multi-nozipmap", "HistGradientBoostingRegressor", "LGBMClassifier-multi",
              "LGBMRegressor", "XGBClassifier-binary", "XGBRegressor")


@pytest.mark.parametrize("name", TREE_CASES)
def test_converted_models_native_equals_numpy(name, monkeypatch):
    from tests.ml.test_converted_models import CASES, run_minirt

    model, feeds = CASES[name]()
    native_out = run_minirt(model, feeds)[0]
    monkeypatch.setattr(trees, "NATIVE", False)
    numpy_out = run_minirt(model, feeds)[0]
    for a, b in zip(native_out, numpy_out):
        a, b = np.asarray(a), np.asarray(b)
        assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


@pytest.mark.parametrize("acc", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("base", [None, [0.5], [0.25, -1.0, 2.0]], ids=["nobase", "onebase", "allbase"])
def test_native_finish_equals_numpy(acc, base, monkeypatch):
    """mrt_tree_finish (the outputs of post_transform NONE from the votes) against finish_classifier /
    finish_regressor's numpy: ties (the first class), NaN (the first NaN), classes without votes (-inf for
    the label, their score as is), rows without any vote (label 0), base values on some or all classes."""
    scores = np.array([[1.0, 3.0, 3.0], [np.nan, 5.0, np.nan], [2.0, -np.inf, 7.0], [0.0, 0.0, 0.0],
                       [-1.0, 4.0, 4.0]], acc)
    has = np.array([[1, 1, 1], [1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 1, 1]], bool)
    layout = trees.TreeLayout.__new__(trees.TreeLayout)
    layout._native, layout.n_targets = {}, 3
    x = np.zeros((len(scores), 2), np.float32)
    labels = [10, 20, 30]

    def run(native_on: bool, fn, *args):
        layout._native.clear()
        monkeypatch.setattr(trees, "NATIVE", native_on)
        monkeypatch.setattr(trees, "votes", lambda *_: (scores.copy(), has.copy()))
        return fn(layout, x, *args)

    got = run(True, trees.finish_classifier, base, 0, labels)
    assert any(k[0] == "outputs" for k in layout._native), "the native finish did not run"
    want = run(False, trees.finish_classifier, base, 0, labels)
    assert got[0].dtype == want[0].dtype == np.int64
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    for b in (base, None):
        got = run(True, trees.finish_regressor, trees.SUM, b, 0)
        want = run(False, trees.finish_regressor, trees.SUM, b, 0)
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["RandomForestClassifier-multi-nozipmap", "RandomForestRegressor", "LGBMRegressor"])
def test_a_converted_ensemble_replays_as_a_native_program(name):
    """A forest's one node is the votes and the finish, two recordable calls: runs of one batch shape
    replay them from C (an arena with nothing placed holds the program), with the node's outputs."""
    import minirt
    from minirt.builder import build_bytes
    from tests.ml.test_converted_models import CASES, _data, _skl

    if name == "RandomForestClassifier-multi-nozipmap":  # (three classes, no ZipMap: benchmarks/trees.py's form)
        from sklearn.ensemble import RandomForestClassifier

        x, yc, _ = _data()
        model, feeds = _skl(RandomForestClassifier(n_estimators=20, max_depth=6, random_state=0), x, yc, zipmap=False)
    else:
        model, feeds = CASES[name]()
    sess = minirt.InferenceSession(build_bytes(model))
    first = sess.run(None, {k: v[:1] for k, v in feeds.items()})
    for _ in range(3):
        again = sess.run(None, {k: v[:1] for k, v in feeds.items()})
    assert [p["native_program"] for p in sess.memory_plans()] == ["2 native calls"]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    plain = minirt.InferenceSession(build_bytes(model), native_program=False).run(None, {k: v[:1] for k, v in feeds.items()})
    for a, b in zip(plain, again):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
