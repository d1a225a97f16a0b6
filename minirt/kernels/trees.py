"""Tree ensembles: one flat layout and one batch traversal for every tree op.

``ai.onnx.ml`` describes an ensemble three ways (TreeEnsembleClassifier and TreeEnsembleRegressor
of opsets 1..3, with their ``*_as_tensor`` attributes, and TreeEnsemble of opset 5).  All three are
turned into one :class:`TreeLayout` (by :func:`layout_from_classic` / :func:`layout_from_v5`), which
the builder may also store ready-made in the artifact as a ``com.minirt::FlatTreeEnsemble`` node
(builder/passes/flatten_tree_ensembles.py; its attributes: :data:`LAYOUT_TENSORS`), so a device
does not rebuild it.  The kernels in minirt/kernels/ml.py and the FlatTreeEnsemble kernel here
then share :func:`votes` (the trees' votes per sample and target) and differ only in how they
finish the scores.  :func:`votes` runs the native kernel (minirt/native/trees_impl.h) when it can,
else the numpy reference: :func:`traverse` (which leaf each sample reaches in each tree) then
:func:`accumulate`; both give the same bits.

The layout (all trees in one set of arrays; tree t's nodes are contiguous, root first, then
breadth first, so a level of one tree is adjacent in memory):

* ``feature[i]``   int32: the feature a branch node tests; for a leaf, its row in the leaf table;
* ``threshold[i]`` float32 or float64 (the model's threshold type): the split value; for a
  BRANCH_MEMBER node, the index of its member set;
* ``true_next[i]``, ``false_next[i]`` int32: the next node; a leaf points at itself, so a sample
  that reached its leaf stays there and every sample can take exactly ``depth`` steps;
* ``mode[i]`` uint8: low 4 bits the comparison (:data:`LEQ` ... :data:`LEAF`), bit 4 set when a
  missing (NaN) feature takes the true branch;
* ``roots[t]`` int32, in tree order (ascending tree id: the order onnxruntime adds trees in);
* leaf weights as a sparse table in the model's order: ``weight_leaf`` (leaf row), ``weight_target``
  (target or class index) and ``weight_value`` (threshold type).

For the native kernel the nodes are also packed once per layout into one array of small structs
(:func:`_native_layout`: threshold, feature and flags, children), so a step reads one cache line.
"""
from __future__ import annotations

import numpy as np

from minirt import native
from minirt.kernels import _ml_scores as sc
from minirt.kernels.registry import kernel
from minirt.vocabulary import MINIRT_DOMAIN

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
MISSING_TRUE = 16
_MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
               "BRANCH_NEQ": NEQ, "LEAF": LEAF}
# aggregate_function codes (TreeEnsemble v5 numbering; the classic ops spell them as strings)
AVERAGE, SUM, MIN, MAX = range(4)
_AGGREGATES = {"AVERAGE": AVERAGE, "SUM": SUM, "MIN": MIN, "MAX": MAX}

# FlatTreeEnsemble's tensor attributes, in the order TreeLayout stores them
LAYOUT_TENSORS = ("feature", "threshold", "true_next", "false_next", "mode", "roots", "weight_leaf",
                  "weight_target", "weight_value")


class TreeLayout:
    """The flat arrays of one ensemble (see the module docstring) and what is derived from them."""

    __slots__ = (*LAYOUT_TENSORS, "members", "n_targets", "depth", "_dense", "_walk", "_native")

    def __init__(self, feature, threshold, true_next, false_next, mode, roots, weight_leaf, weight_target,
                 weight_value, n_targets: int, members=()):
        self.feature = np.asarray(feature, dtype=np.int32)
        self.threshold = np.asarray(threshold)
        self.true_next = np.asarray(true_next, dtype=np.int32)
        self.false_next = np.asarray(false_next, dtype=np.int32)
        self.mode = np.asarray(mode, dtype=np.uint8)
        self.roots = np.asarray(roots, dtype=np.int32)
        self.weight_leaf = np.asarray(weight_leaf, dtype=np.int32)
        self.weight_target = np.asarray(weight_target, dtype=np.int32)
        self.weight_value = np.asarray(weight_value, dtype=self.threshold.dtype)
        self.n_targets = int(n_targets)
        self.members = tuple(np.asarray(m, dtype=np.float64) for m in members)  # BRANCH_MEMBER sets
        self._dense = None  # dense_leaf_values(), computed on first use
        self._walk = None  # _traversal_arrays(), computed on first use
        self._native = {}  # _native_ensemble(): (X dtype, aggregate) -> the native call; "binary": see finish_classifier
        self.depth = self._check()

    @property
    def n_trees(self) -> int:
        return len(self.roots)

    def _check(self) -> int:
        """Validate the arrays (a stored layout comes from a file) and return the deepest tree's depth."""
        n = len(self.feature)
        arrays = (self.threshold, self.true_next, self.false_next, self.mode)
        if any(a.ndim != 1 or len(a) != n for a in arrays):
            raise ValueError("tree layout: feature, threshold, true_next, false_next and mode must have one entry per node")
        if self.threshold.dtype not in (np.float32, np.float64):
            raise ValueError(f"tree layout: thresholds must be float32 or float64, got {self.threshold.dtype}")
        for name in ("true_next", "false_next", "roots"):
            a = getattr(self, name)
            if a.size and (a.min() < 0 or a.max() >= n):
                raise ValueError(f"tree layout: {name} points outside the {n} nodes")
        leaves = (self.mode & 15) == LEAF
        n_leaves = int(leaves.sum())
        if len({len(self.weight_leaf), len(self.weight_target), len(self.weight_value)}) != 1:
            raise ValueError("tree layout: the weight arrays differ in length")
        if self.weight_leaf.size and (self.weight_leaf.min() < 0 or self.weight_leaf.max() >= n_leaves):
            raise ValueError("tree layout: a weight names a leaf that does not exist")
        if self.weight_target.size and (self.weight_target.min() < 0 or self.weight_target.max() >= self.n_targets):
            raise ValueError(f"tree layout: a weight's target is outside [0, {self.n_targets})")
        if ((self.mode & 15) > LEAF).any():
            raise ValueError("tree layout: unknown node mode")
        member = (self.mode & 15) == MEMBER
        if member.any():
            idx = self.threshold[member]
            if idx.min() < 0 or idx.max() >= len(self.members):
                raise ValueError("tree layout: a BRANCH_MEMBER node names a member set that does not exist")
        if leaves.any() and (self.true_next[leaves] != np.flatnonzero(leaves)).any():
            raise ValueError("tree layout: a leaf must point at itself")
        # depth: steps until every root reaches a leaf; a cycle among branch nodes never gets there
        node = self.roots.astype(np.int64)
        for depth in range(n + 1):
            if leaves[node].all() if node.size else True:
                return depth
            node = np.concatenate([self.true_next[node], self.false_next[node]])
            node = np.unique(node[~leaves[node]]) if node.size > 4096 else node
            if node.size == 0:
                return depth + 1
        raise ValueError("tree layout: the trees do not terminate (a cycle among the nodes)")

    def dense_leaf_values(self) -> tuple[np.ndarray, np.ndarray]:
        """([n_leaves, K] summed weights in the threshold type, [n_leaves, K] whether a weight exists)."""
        if self._dense is None:
            n_leaves = int(((self.mode & 15) == LEAF).sum())
            values = np.zeros((n_leaves, self.n_targets), dtype=self.threshold.dtype)
            has = np.zeros((n_leaves, self.n_targets), dtype=bool)
            np.add.at(values, (self.weight_leaf, self.weight_target), self.weight_value)
            has[self.weight_leaf, self.weight_target] = True
            self._dense = (values, has)
        return self._dense

    def tensors(self) -> dict:
        return {name: getattr(self, name) for name in LAYOUT_TENSORS}


# --------------------------------------------------------------------------- building the layout


def _flatten(n_nodes: int, roots_in: list, feature, threshold, true_id, false_id, mode, missing,
             member_of=None) -> tuple:
    """Lay out nodes given by index (``true_id``/``false_id`` index the same arrays): per tree, breadth
    first from its root.  Returns the layout arrays and, per source node, its new index (-1: unreachable)."""
    new_index = np.full(n_nodes, -1, dtype=np.int64)
    order: list[int] = []
    for root in roots_in:
        head = len(order)
        if new_index[root] >= 0:
            raise ValueError("two trees share the node with index " + str(root))
        new_index[root] = len(order)
        order.append(root)
        while head < len(order):
            i = order[head]
            head += 1
            if mode[i] == LEAF:
                continue
            for child in (true_id[i], false_id[i]):
                if not 0 <= child < n_nodes:
                    raise ValueError(f"node {i} has a child {child} outside the tree's nodes")
                if new_index[child] < 0:
                    new_index[child] = len(order)
                    order.append(child)
    order_arr = np.asarray(order, dtype=np.int64)
    modes = np.asarray(mode, dtype=np.uint8)[order_arr]
    leaf_mask = modes == LEAF
    n = len(order_arr)
    new_feature = np.asarray(feature, dtype=np.int64)[order_arr]
    leaf_rows = np.cumsum(leaf_mask) - 1
    new_feature = np.where(leaf_mask, leaf_rows, new_feature).astype(np.int32)
    self_index = np.arange(n)
    t_next = np.where(leaf_mask, self_index, new_index[np.asarray(true_id, dtype=np.int64)[order_arr].clip(0, n_nodes - 1)])
    f_next = np.where(leaf_mask, self_index, new_index[np.asarray(false_id, dtype=np.int64)[order_arr].clip(0, n_nodes - 1)])
    flags = modes | np.where(np.asarray(missing, dtype=bool)[order_arr], MISSING_TRUE, 0).astype(np.uint8)
    thr = np.asarray(threshold)[order_arr]
    if member_of is not None:
        thr = np.where(modes == MEMBER, np.asarray(member_of)[order_arr], thr).astype(thr.dtype)
    roots = new_index[np.asarray(roots_in, dtype=np.int64)]
    return (new_feature, thr, t_next.astype(np.int32), f_next.astype(np.int32), flags, roots.astype(np.int32),
            new_index, leaf_rows)


def _mode_codes(op: str, modes) -> np.ndarray:
    try:
        return np.asarray([_MODE_NAMES[m.decode() if isinstance(m, bytes) else str(m)] for m in modes], dtype=np.uint8)
    except KeyError as exc:
        raise ValueError(f"{op}: unknown nodes_modes value {exc.args[0]!r}; expected one of {sorted(_MODE_NAMES)}") from None


def _floats(plain, as_tensor, name: str, op: str):
    """A float attribute given as a list (float32) or as a tensor (its own float type, e.g. double)."""
    if as_tensor is not None:
        if plain is not None:
            raise ValueError(f"{op}: {name} and {name}_as_tensor are both set")
        arr = np.asarray(as_tensor).reshape(-1)
        if arr.dtype not in (np.float32, np.float64):
            raise ValueError(f"{op}: {name}_as_tensor must be float or double, got {arr.dtype}")
        return arr
    return None if plain is None else np.asarray(plain, dtype=np.float32).reshape(-1)


def layout_from_classic(op: str, *, nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, nodes_values,
                        nodes_values_as_tensor, nodes_truenodeids, nodes_falsenodeids,
                        nodes_missing_value_tracks_true, w_treeids, w_nodeids, w_ids, w_weights,
                        w_weights_as_tensor, n_targets: int) -> TreeLayout:
    """The layout of a TreeEnsembleClassifier/Regressor (opsets 1..3): nodes named by (tree id, node id),
    leaf weights by (tree id, node id, target or class id, weight).  The threshold type is double when
    the thresholds (or the weights) come as a double tensor, else float32, as onnxruntime chooses."""
    if nodes_treeids is None or nodes_nodeids is None or nodes_modes is None:
        raise ValueError(f"{op}: nodes_treeids, nodes_nodeids and nodes_modes are required")
    tree = np.asarray(nodes_treeids, dtype=np.int64).reshape(-1)
    nid = np.asarray(nodes_nodeids, dtype=np.int64).reshape(-1)
    n = len(tree)
    modes = _mode_codes(op, nodes_modes)
    thr = _floats(nodes_values, nodes_values_as_tensor, "nodes_values", op)
    weights = _floats(w_weights, w_weights_as_tensor, "weights", op)
    dtype = np.float64 if (thr is not None and thr.dtype == np.float64) or (
        weights is not None and weights.dtype == np.float64) else np.float32
    thr = np.zeros(n, dtype) if thr is None else thr.astype(dtype)
    feat = np.asarray(nodes_featureids if nodes_featureids is not None else np.zeros(n), dtype=np.int64).reshape(-1)
    tid = np.asarray(nodes_truenodeids if nodes_truenodeids is not None else np.zeros(n), dtype=np.int64).reshape(-1)
    fid = np.asarray(nodes_falsenodeids if nodes_falsenodeids is not None else np.zeros(n), dtype=np.int64).reshape(-1)
    miss = np.asarray(nodes_missing_value_tracks_true if nodes_missing_value_tracks_true else np.zeros(n),
                      dtype=np.int64).reshape(-1)
    if miss.size == 0:
        miss = np.zeros(n, dtype=np.int64)
    sizes = {"nodes_treeids": n, "nodes_nodeids": len(nid), "nodes_modes": len(modes), "nodes_values": len(thr),
             "nodes_featureids": len(feat), "nodes_truenodeids": len(tid), "nodes_falsenodeids": len(fid),
             "nodes_missing_value_tracks_true": len(miss)}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"{op}: the nodes_* attributes must have one entry per node, got lengths {sizes}")
    position = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(tree.tolist(), nid.tolist()))}
    if len(position) != n:
        raise ValueError(f"{op}: a (tree id, node id) pair is listed twice in nodes_treeids/nodes_nodeids")
    branch = modes != LEAF

    def child(ids, what):
        out = np.zeros(n, dtype=np.int64)
        for k in np.flatnonzero(branch):
            key = (int(tree[k]), int(ids[k]))
            if key not in position:
                raise ValueError(f"{op}: node {int(nid[k])} of tree {int(tree[k])} has a {what} child {int(ids[k])} "
                                 f"that is not a node of that tree")
            out[k] = position[key]
        return out

    true_idx, false_idx = child(tid, "true"), child(fid, "false")
    tree_ids = sorted(set(tree.tolist()))
    # a tree's root: its node no other node of the tree points at (onnxruntime takes the smallest id)
    pointed = np.zeros(n, dtype=bool)
    pointed[true_idx[branch]] = True
    pointed[false_idx[branch]] = True
    roots = []
    for t in tree_ids:
        cand = np.flatnonzero((tree == t) & ~pointed)
        if cand.size == 0:
            raise ValueError(f"{op}: tree {t} has no root (every node is some node's child)")
        roots.append(int(cand[np.argmin(nid[cand])]))
    if n and (feat[branch].min(initial=0) < 0):
        raise ValueError(f"{op}: nodes_featureids must be >= 0")
    arrays = _flatten(n, roots, feat, thr, true_idx, false_idx, modes, miss)
    feature, threshold, t_next, f_next, flags, root_idx, new_index, leaf_rows = arrays
    # leaf weights
    wt = np.asarray(w_treeids if w_treeids is not None else (), dtype=np.int64).reshape(-1)
    wn = np.asarray(w_nodeids if w_nodeids is not None else (), dtype=np.int64).reshape(-1)
    wi = np.asarray(w_ids if w_ids is not None else (), dtype=np.int64).reshape(-1)
    wv = np.zeros(0, dtype) if weights is None else weights.astype(dtype)
    if not len(wt) == len(wn) == len(wi) == len(wv):
        raise ValueError(f"{op}: the weight attributes (*_treeids, *_nodeids, *_ids, *_weights) differ in length: "
                         f"{len(wt)}, {len(wn)}, {len(wi)}, {len(wv)}")
    if wi.size and (wi.min() < 0 or wi.max() >= n_targets):
        raise ValueError(f"{op}: a weight's target/class id is outside [0, {n_targets})")
    leaf_of = np.empty(len(wt), dtype=np.int64)
    for k, key in enumerate(zip(wt.tolist(), wn.tolist())):
        src = position.get(key)
        if src is None or modes[src] != LEAF:
            raise ValueError(f"{op}: a weight names node {key[1]} of tree {key[0]}, which is not a leaf")
        leaf_of[k] = leaf_rows[new_index[src]]
    return TreeLayout(feature, threshold, t_next, f_next, flags, root_idx, leaf_of, wi, wv, n_targets)


def layout_from_v5(*, leaf_targetids, leaf_weights, membership_values, n_targets, nodes_falseleafs,
                   nodes_falsenodeids, nodes_featureids, nodes_missing_value_tracks_true, nodes_modes, nodes_splits,
                   nodes_trueleafs, nodes_truenodeids, tree_roots, dtype) -> TreeLayout:
    """The layout of a TreeEnsemble (opset 5): branch nodes by index, leaves in their own arrays, the
    children of a node flagged as leaves or nodes.  ``dtype``: the input's float type (v5's thresholds
    and weights are tensors of the input's type)."""
    op = "TreeEnsemble"
    if n_targets is None or tree_roots is None or leaf_weights is None:
        raise ValueError(f"{op}: n_targets, tree_roots and leaf_weights are required")
    ints = lambda v: np.asarray(v if v is not None else (), dtype=np.int64).reshape(-1)  # noqa: E731
    feat, modes = ints(nodes_featureids), ints(nodes_modes)
    nb = len(feat)
    splits = np.asarray(nodes_splits if nodes_splits is not None else np.zeros(nb)).reshape(-1).astype(dtype)
    t_ids, f_ids = ints(nodes_truenodeids), ints(nodes_falsenodeids)
    t_leaf, f_leaf = ints(nodes_trueleafs).astype(bool), ints(nodes_falseleafs).astype(bool)
    miss = ints(nodes_missing_value_tracks_true).astype(bool)
    if miss.size == 0:
        miss = np.zeros(nb, dtype=bool)
    lengths = {len(a) for a in (feat, modes, splits, t_ids, f_ids, t_leaf, f_leaf, miss)}
    if len(lengths) != 1:
        raise ValueError(f"{op}: the nodes_* attributes must all have the same length")
    if modes.size and (modes.min() < 0 or modes.max() > MEMBER):
        raise ValueError(f"{op}: nodes_modes must be in 0..6, got {sorted(set(modes.tolist()))}")
    weights = np.asarray(leaf_weights).reshape(-1).astype(dtype)
    targets = ints(leaf_targetids)
    nl = len(weights)
    if len(targets) != nl:
        raise ValueError(f"{op}: leaf_targetids and leaf_weights differ in length ({len(targets)}, {nl})")
    # one index space: branch nodes 0..nb-1, then leaves nb..nb+nl-1
    true_idx = np.where(t_leaf, t_ids + nb, t_ids)
    false_idx = np.where(f_leaf, f_ids + nb, f_ids)
    for name, ids, is_leaf in (("true", t_ids, t_leaf), ("false", f_ids, f_leaf)):
        bound = np.where(is_leaf, nl, nb)
        if ids.size and ((ids < 0) | (ids >= bound)).any():
            raise ValueError(f"{op}: a nodes_{name}nodeids entry is outside its node or leaf list")
    all_modes = np.concatenate([modes.astype(np.uint8), np.full(nl, LEAF, np.uint8)])
    all_feat = np.concatenate([feat, np.zeros(nl, np.int64)])
    all_thr = np.concatenate([splits, np.zeros(nl, dtype)])
    all_true = np.concatenate([true_idx, np.zeros(nl, np.int64)])
    all_false = np.concatenate([false_idx, np.zeros(nl, np.int64)])
    all_miss = np.concatenate([miss, np.zeros(nl, bool)])
    # BRANCH_MEMBER sets: NaN-separated, one per member node in node order
    members: list = []
    member_of = np.zeros(nb + nl, dtype=np.float64)
    if (modes == MEMBER).any():
        mv = np.asarray(membership_values if membership_values is not None else (), dtype=np.float64).reshape(-1)
        groups = [g[~np.isnan(g)] for g in np.split(mv, np.flatnonzero(np.isnan(mv)))]
        for i, node in enumerate(np.flatnonzero(modes == MEMBER)):
            member_of[node] = len(members)
            members.append(groups[i] if i < len(groups) else np.zeros(0))
    roots_in = ints(tree_roots)
    if roots_in.size and (roots_in.min() < 0 or roots_in.max() >= nb):
        # a tree that is a single leaf is not expressible in v5: roots index branch nodes
        raise ValueError(f"{op}: tree_roots must index nodes_* entries (0..{nb - 1})")
    arrays = _flatten(nb + nl, roots_in.tolist(), all_feat, all_thr, all_true, all_false, all_modes, all_miss,
                      member_of if members else None)
    feature, threshold, t_next, f_next, flags, root_idx, new_index, leaf_rows = arrays
    reached = new_index[nb:] >= 0
    # a leaf shared by two trees is laid out once: its weights count once per visit, as in the source
    w_leaf = np.where(reached, leaf_rows[new_index[nb:].clip(0)], -1)
    keep = w_leaf >= 0
    if targets.size and (targets.min() < 0 or targets.max() >= int(n_targets)):
        raise ValueError(f"{op}: leaf_targetids must be in [0, {int(n_targets)})")
    return TreeLayout(feature, threshold, t_next, f_next, flags, root_idx, w_leaf[keep], targets[keep],
                      weights[keep], int(n_targets), members)


# --------------------------------------------------------------------------- evaluation


def compare_dtype(x: np.ndarray, threshold_dtype) -> np.dtype:
    """The type a feature is compared with thresholds in: a float32 threshold meets a float32 or
    integer feature in float32 and a double feature in double (exact); double thresholds compare in double."""
    if threshold_dtype == np.float64 or x.dtype == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def traverse(layout: TreeLayout, x: np.ndarray) -> np.ndarray:
    """The leaf row each sample reaches in each tree: int array [N, n_trees].

    Vectorised over samples and trees at once: ``depth`` steps, each moving every (sample, tree)
    pair one level down (a leaf points at itself, so pairs that arrived early just stay)."""
    n, n_features = x.shape
    xs = np.ascontiguousarray(x, dtype=compare_dtype(x, layout.threshold.dtype))
    if layout.n_trees == 0 or n == 0:
        return np.zeros((n, layout.n_trees), dtype=np.int64)
    branch = (layout.mode & 15) < LEAF
    if branch.any() and int(layout.feature[branch].max()) >= n_features:
        raise ValueError(f"the trees test feature {int(layout.feature[branch].max())}, but X has {n_features} "
                         f"features per sample")
    feature, threshold, children, mode, uniform, missing = _traversal_arrays(layout)
    xflat = xs.reshape(-1)
    row_base = (np.arange(n, dtype=np.int64) * n_features)[:, None]
    node = np.broadcast_to(layout.roots.astype(np.int64), (n, layout.n_trees))
    thr = threshold.astype(xs.dtype, copy=False)
    for _ in range(layout.depth):
        v = xflat[row_base + feature[node]]
        t = thr[node]
        if uniform is not None:
            go = _COMPARE[uniform](v, t)
        else:
            go = _branch_mixed(layout, node, mode[node], v, t)
        if missing is not None:
            go |= np.isnan(v) & missing[node]
        node = children[2 * node + go]
    return node


def _traversal_arrays(layout: TreeLayout) -> tuple:
    """The arrays :func:`traverse` indexes, derived once per layout: children interleaved as
    [false, true] so that one gather ``children[2 * node + go]`` takes the step."""
    if layout._walk is not None:
        return layout._walk
    kind = layout.mode & 15
    branch = kind < LEAF
    # leaves read feature 0 (any valid column): the comparison's result does not matter at a self-loop
    feature = np.where(branch, layout.feature, 0).astype(np.int64)
    children = np.stack([layout.false_next, layout.true_next], axis=1).reshape(-1).astype(np.int64)
    branch_modes = set(np.unique(kind[branch]).tolist())
    uniform = branch_modes.pop() if len(branch_modes) == 1 and MEMBER not in branch_modes else None
    if not branch.any():
        uniform = LEQ
    missing = (layout.mode & MISSING_TRUE) != 0
    layout._walk = (feature, layout.threshold, children, kind, uniform, missing if missing.any() else None)
    return layout._walk

_COMPARE = {
    LEQ: np.less_equal, LT: np.less, GTE: np.greater_equal, GT: np.greater, EQ: np.equal, NEQ: np.not_equal,
}


def _branch_mixed(layout: TreeLayout, node, kind, v, t) -> np.ndarray:
    go = np.zeros(v.shape, dtype=bool)
    for code, cmp in _COMPARE.items():
        sel = kind == code
        if sel.any():
            go[sel] = cmp(v[sel], t[sel])
    sel = kind == MEMBER
    if sel.any():
        for set_index in np.unique(t[sel]).tolist():
            here = sel & (t == set_index)
            go[here] = np.isin(v[here], layout.members[int(set_index)])
    return go


def accumulate(layout: TreeLayout, leaves: np.ndarray, aggregate: int) -> tuple[np.ndarray, np.ndarray]:
    """The trees' votes per sample and target: ([N, K] in the threshold type, [N, K] whether any tree
    gave the target a weight).  SUM and AVERAGE add the trees one after the other in tree order, in the
    threshold type (float32 for most models), the order and precision onnxruntime adds them in, so the
    rounding matches; AVERAGE divides by the number of trees; MIN/MAX keep the extreme weight."""
    values, has = layout.dense_leaf_values()
    n = leaves.shape[0]
    k = layout.n_targets
    if layout.n_trees == 0:
        return np.zeros((n, k), dtype=values.dtype), np.zeros((n, k), dtype=bool)
    rows = layout.feature[leaves]  # a leaf's feature slot holds its leaf row
    got = has[rows]  # [N, T, K]
    any_has = got.any(axis=1)
    if aggregate in (SUM, AVERAGE):
        votes = values[rows]  # [N, T, K]
        total = np.add.accumulate(votes, axis=1)[:, -1, :] if layout.n_trees > 1 else votes[:, 0, :].copy()
        if aggregate == AVERAGE:
            total = total / total.dtype.type(layout.n_trees)
        return total.astype(values.dtype, copy=False), any_has
    if aggregate not in (MIN, MAX):
        raise ValueError(f"aggregate_function must be AVERAGE, SUM, MIN or MAX (0..3), got {aggregate}")
    votes = np.where(got, values[rows], np.inf if aggregate == MIN else -np.inf)
    out = votes.min(axis=1) if aggregate == MIN else votes.max(axis=1)
    return np.where(any_has, out, 0).astype(values.dtype), any_has


# --------------------------------------------------------------------------- votes: native or numpy

NATIVE = True  # (False: always the numpy reference; tests and benchmarks/trees.py --native 0)

# the packed nodes of trees_impl.h: threshold (a leaf's value, or its leaf row's bits), info, children
_NODE_F32 = np.dtype([("thr", "<f4"), ("info", "<u4"), ("next", "<i4", (2,))])
_NODE_F64 = np.dtype([("thr", "<f8"), ("info", "<u4"), ("next", "<i4", (2,)), ("row", "<i4")])
_FEATURE_LIMIT = 1 << 24  # features a packed node can name
_LEAF_BIT, _HAS_SHIFT, _MISSING_SHIFT = np.uint32(1 << 31), 30, 27


def votes(layout: TreeLayout, x: np.ndarray, aggregate: int) -> tuple[np.ndarray, np.ndarray]:
    """The trees' votes per sample and target, ([N, K] in the threshold type, [N, K] bool whether any
    tree gave the target a weight): :func:`accumulate` of :func:`traverse`, computed by the native
    kernel when the native module is there and the layout suits it (no BRANCH_MEMBER node), with the
    same bits (each sample's trees added in tree order in the threshold type)."""
    if NATIVE and native.available and x.ndim == 2 and len(x):
        # (the per-call work is kept small: at batch 1 it is a good part of the op's time)
        ens = layout._native.get((x.dtype, aggregate))
        if ens is None:
            ens = _native_ensemble(layout, x, aggregate)
        if ens:
            struct, cmp, max_feature, shape_k, dtype = ens
            if x.shape[1] <= max_feature:
                raise ValueError(f"the trees test feature {max_feature}, but X has {x.shape[1]} features per sample")
            xs = x if x.dtype == cmp and x.flags.c_contiguous else np.ascontiguousarray(x, dtype=cmp)
            n = len(xs)
            scores = np.empty((n, shape_k), dtype=dtype)
            has = np.empty((n, shape_k), dtype=bool)
            native.tree_votes(struct, xs, scores, has)
            return scores, has
    return accumulate(layout, traverse(layout, x), aggregate)


def _native_ensemble(layout: TreeLayout, x: np.ndarray, aggregate: int):
    """(the native struct, X's dtype for it, the largest feature tested, K, the scores' dtype) for this
    layout, X's dtype and ``aggregate``, made once and kept in ``layout._native`` under (X's dtype,
    aggregate); False where the numpy path runs (no tree, a BRANCH_MEMBER node, a layout the packed
    nodes cannot hold).  Raises as the numpy path does for a bad aggregate."""
    if aggregate not in (AVERAGE, SUM, MIN, MAX):
        if not layout.n_trees:
            return False  # (numpy's accumulate returns zeros without looking at it)
        raise ValueError(f"aggregate_function must be AVERAGE, SUM, MIN or MAX (0..3), got {aggregate}")
    cmp = compare_dtype(x, layout.threshold.dtype)
    ens = layout._native.get((cmp, aggregate))  # (the same struct serves every dtype compared in cmp)
    if ens is None:
        packed = _native_layout(layout, cmp == np.float64) if layout.n_trees else None
        ens = False
        if packed is not None:
            nodes, roots, values, has, max_feature, mode = packed
            ens = (native.tree_ensemble(nodes, roots, values, has, layout.n_trees, len(values), layout.n_targets,
                                        max_feature, cmp == np.float64, layout.threshold.dtype == np.float64, mode,
                                        aggregate), cmp, max_feature, layout.n_targets, layout.threshold.dtype)
        layout._native[(cmp, aggregate)] = ens
    layout._native[(x.dtype, aggregate)] = ens
    return ens


def _native_layout(layout: TreeLayout, node_double: bool):
    """The arrays of the native kernel (trees_impl.h's node format), or None where it cannot run this
    layout: (nodes [n + 1] of _NODE_F32 / _NODE_F64, the last a pad leaf; roots padded to whole groups
    with the pad leaf; dense leaf values and has-weight flags; the largest feature a branch tests, -1
    for none; the comparison every branch node makes, MRT_TREE_MIXED when they differ).  Every index
    is checked here: the C code trusts them."""
    kind = layout.mode & 15
    if (kind == MEMBER).any():
        return None
    n = len(layout.feature)
    leaves = kind == LEAF
    branch = ~leaves
    values, has = layout.dense_leaf_values()
    n_leaves = len(values)
    rows = layout.feature[leaves].astype(np.int64)
    if n + 1 >= 2**31 or (rows.size and (rows.min() < 0 or rows.max() >= n_leaves)):
        return None
    feat = layout.feature[branch]
    max_feature = int(feat.max()) if feat.size else -1
    if feat.size and (feat.min() < 0 or max_feature >= _FEATURE_LIMIT):
        return None
    k = layout.n_targets
    nodes = np.zeros(n + 1, dtype=_NODE_F64 if node_double else _NODE_F32)
    info = np.where(branch, layout.feature, 0).astype(np.uint32)
    info |= (kind.astype(np.uint32) & 7) << 24
    info |= (((layout.mode & MISSING_TRUE) != 0) & branch).astype(np.uint32) << _MISSING_SHIFT
    info |= leaves.astype(np.uint32) << 31
    thr = layout.threshold.astype(nodes["thr"].dtype)
    leaf_index = np.flatnonzero(leaves)
    if k == 1:  # inline leaves: a leaf's value and weight flag in its node
        thr[leaf_index] = values[rows, 0]
        info[leaf_index] |= has[rows, 0].astype(np.uint32) << _HAS_SHIFT
    nodes["thr"][:n] = thr
    if k != 1:
        if node_double:
            nodes["row"][leaf_index] = rows
        else:
            nodes.view(np.int32).reshape(-1, 4)[leaf_index, 0] = rows
    nodes["info"][:n] = info
    self_index = np.arange(n + 1, dtype=np.int32)
    nodes["next"][:n, 0] = np.where(leaves, self_index[:n], layout.false_next)
    nodes["next"][:n, 1] = np.where(leaves, self_index[:n], layout.true_next)
    nodes["info"][n] = _LEAF_BIT
    nodes["next"][n] = n
    group = native.tree_group()
    roots = np.full(-(-layout.n_trees // group) * group, n, dtype=np.int32)
    roots[:layout.n_trees] = layout.roots
    modes = set(np.unique(kind[branch]).tolist())
    mode = modes.pop() if len(modes) == 1 else (LEQ if not modes else 6)  # (6: MRT_TREE_MIXED)
    return nodes, roots, np.ascontiguousarray(values), np.ascontiguousarray(has), max_feature, mode


# --------------------------------------------------------------------------- finishing the scores


def _native_outputs(layout: TreeLayout, scores: np.ndarray, has: np.ndarray, base_values, labels):
    """(label or None, out) of a tree op finished natively (mrt_tree_finish: post_transform NONE, int labels):
    with the native votes, the op is two recordable calls (a batch-1 forest replays as a native program:
    its Python finishing was most of its time); None where it does not apply."""
    if not (NATIVE and native.available and scores.dtype.kind == "f" and scores.flags.c_contiguous
            and has.flags.c_contiguous and (labels is None or not (len(labels) and isinstance(labels[0], str)))):
        return None
    n, k = scores.shape
    key = ("outputs", scores.dtype, labels is None)
    struct = layout._native.get(key)  # (one op per layout: its base values and labels are constants)
    if struct is None:
        base = None if base_values is None else np.ascontiguousarray(np.asarray(base_values, np.float64).reshape(-1))
        table = None if labels is None else np.ascontiguousarray(np.asarray(labels, np.int64))
        if table is not None and len(table) < k:
            return None
        struct = layout._native[key] = native.tree_outputs(k, scores.dtype == np.float64, base, table)
    label = np.empty(n, np.int64) if labels is not None else None
    out = np.empty((n, k), np.float32)
    native.tree_finish(struct, scores, has, label, out)
    return label, out


def finish_regressor(layout: TreeLayout, x: np.ndarray, aggregate: int, base_values, post: int) -> np.ndarray:
    """TreeEnsembleRegressor's Y [N, n_targets] (float32)."""
    scores, has = votes(layout, x, aggregate)  # (a fresh array: updated in place below)
    if post == sc.NONE:
        done = _native_outputs(layout, scores, has, base_values, None)
        if done is not None:
            return native.final(done[1])
    base = None if base_values is None else np.asarray(base_values).reshape(-1).astype(scores.dtype)
    k = layout.n_targets
    if base is not None and len(base) == k:
        scores += base  # (onnxruntime: base values only when there is one per target)
    if k == 1 and post != sc.PROBIT:
        # (what finalize_scores does for one target without PROBIT: the score as float32, one column)
        return scores.astype(np.float32, copy=False)
    return sc.finalize_scores(scores, post)


def finish_classifier(layout: TreeLayout, x: np.ndarray, base_values, post: int, labels) -> tuple:
    """TreeEnsembleClassifier's (label [N], scores [N, n_classes]) by onnxruntime's rules.

    More than two classes: base values are added (a class no tree voted for takes its base value) and
    the label is the first class of highest score among those with a score.  Two classes: the
    "binary case" (every leaf weight names the same class) decides with the single score (> 0.5
    for all-positive weights, > 0 otherwise) and writes the two columns from it; see the comments."""
    scores, has = votes(layout, x, SUM)
    n, k = scores.shape
    if k != 2 and post == sc.NONE:
        done = _native_outputs(layout, scores, has, base_values, labels)
        if done is not None:
            return native.final(done)
    dt = scores.dtype.type
    base = np.zeros(0, scores.dtype) if base_values is None else np.asarray(base_values).reshape(-1).astype(scores.dtype)
    if k != 2:
        if len(base):
            nb = min(len(base), k)
            scores[:, :nb] = scores[:, :nb] + base[:nb]
            has[:, :nb] = True
        # first class with the highest score among those that have one
        if has.all():  # (a forest's leaves usually weigh every class)
            best = np.argmax(scores, axis=1)
        else:
            masked = np.where(has, scores, -np.inf)
            best = np.argmax(masked, axis=1)
            best = np.where(has.any(axis=1), best, 0)
        return sc.labels_array(labels, best), sc.transform(scores, post)
    facts = layout._native.get("binary")  # (per layout: O(weights) each, too dear per run at batch 1)
    if facts is None:
        facts = layout._native["binary"] = (len(np.unique(layout.weight_target)) == 1,
                                            bool((layout.weight_value >= 0).all()))
    binary_case, all_positive = facts
    s0, s1 = scores[:, 0].copy(), scores[:, 1].copy()
    h0, h1 = has[:, 0], has[:, 1].copy()
    asc = np.full(n, sc.KEEP_ONE)
    if len(base) == 2:
        # with a class-1 score, onnxruntime keeps only base_values[1] and mirrors: s1 = b1 + s0, s0 = -s1
        # (it assumes b0 == b1); without one, each class gets its own base value
        mirrored1 = dt(base[1]) + s0
        s1 = np.where(h1, mirrored1, s1 + dt(base[1]))
        s0 = np.where(h1, -mirrored1, s0 + dt(base[0]))
    elif len(base) == 1:
        s0 = s0 + dt(base[0])
    elif len(base) == 0:
        asc[:] = sc.MIRROR_NEG
    one_column = ~h1 & (len(base) != 2)  # onnxruntime drops the empty class-1 column: one score left
    pos = np.where(h1 & ~one_column, s1, np.where(h0, s0, 0))
    if binary_case:
        if all_positive:
            win = pos > dt(0.5)
            asc = np.where(win, sc.COMPLEMENT, sc.COMPLEMENT_NEG)
        else:
            win = pos > 0
            asc = np.where(win, sc.MIRROR_POS, sc.MIRROR_NEG)
        label_index = win.astype(np.int64)
    else:
        # onnxruntime labels a two-class model that is not the binary case by the sign of the positive
        # score, with the fixed labels 1 / 0 mapped through the label list's positions
        label_index = (pos > 0).astype(np.int64)
    out = np.empty((n, 2), dtype=np.float32)
    two = ~one_column
    if two.any():
        out[two] = sc.transform(np.stack([s0[two], s1[two]], axis=1), post)
    if one_column.any():
        out[one_column] = sc.finalize_scores(s0[one_column, None], post, asc[one_column])
    return sc.labels_array(labels, label_index), out


def finish_v5(layout: TreeLayout, x: np.ndarray, aggregate: int, post: int) -> np.ndarray:
    """TreeEnsemble (opset 5)'s Y [N, n_targets], in X's float type."""
    scores, _ = votes(layout, x, aggregate)
    return sc.finalize_scores(scores, post).astype(x.dtype)


# --------------------------------------------------------------------------- the builder's stored form


def layout_from_tensors(feature, threshold, true_next, false_next, mode, roots, weight_leaf, weight_target,
                        weight_value, n_targets: int, members=()) -> TreeLayout:
    return TreeLayout(feature, threshold, true_next, false_next, mode, roots, weight_leaf, weight_target,
                      weight_value, n_targets, members)


def memo_layout(ctx, build) -> TreeLayout:
    """The node's layout: made once by ``build()`` and kept in its memo (every tree op's kernel)."""
    layout = None if ctx is None else ctx.memo.get("layout")
    if layout is None:
        layout = build()
        if ctx is not None:
            ctx.memo["layout"] = layout
    return layout


@kernel("FlatTreeEnsemble", since=1, domain=MINIRT_DOMAIN, context=True)
def flat_tree_ensemble(x, /, *, kind="regressor", n_targets=1, aggregate_function=SUM, post_transform=0,
                       base_values=None, classlabels_int64s=None, classlabels_strings=None, feature=None,
                       threshold=None, true_next=None, false_next=None, mode=None, roots=None, weight_leaf=None,
                       weight_target=None, weight_value=None, membership_values=None, ctx=None):
    """An ensemble the builder laid out (builder/passes/flatten_tree_ensembles.py): ``kind`` says which
    op it came from ("classifier", "regressor" or "ensemble5": TreeEnsemble v5), whose results it returns."""
    def stored_layout():
        if feature is None or threshold is None or roots is None:
            raise ValueError("FlatTreeEnsemble: the layout tensors (feature, threshold, roots, ...) are required")
        members = ()
        if membership_values is not None:
            mv = np.asarray(membership_values, dtype=np.float64).reshape(-1)
            members = tuple(g[~np.isnan(g)] for g in np.split(mv, np.flatnonzero(np.isnan(mv))))
        n_weights = len(np.asarray(weight_value).reshape(-1)) if weight_value is not None else 0
        leaves = np.arange(n_weights) if weight_leaf is None else weight_leaf  # (left out: leaf i has weight i)
        # (left out: every weight is for target 0)
        targets = np.zeros(n_weights, dtype=np.int32) if weight_target is None else weight_target
        return layout_from_tensors(feature, threshold, true_next, false_next, mode, roots, leaves, targets,
                                   weight_value, int(n_targets), members)

    layout = memo_layout(ctx, stored_layout)
    x = sc.as_float_rows("FlatTreeEnsemble", x, dtype=None) if kind != "ensemble5" else np.asarray(x)
    if kind == "classifier":
        labels = list(classlabels_strings) if classlabels_strings else list(classlabels_int64s or ())
        return finish_classifier(layout, x, base_values, int(post_transform), labels)
    if kind == "regressor":
        return finish_regressor(layout, x, int(aggregate_function), base_values, int(post_transform))
    if kind == "ensemble5":
        if x.ndim != 2:
            raise ValueError(f"TreeEnsemble: X must be [N, F], got shape {list(x.shape)}")
        return finish_v5(layout, x, int(aggregate_function), int(post_transform))
    raise ValueError(f"FlatTreeEnsemble: kind must be classifier, regressor or ensemble5, got {kind!r}")
