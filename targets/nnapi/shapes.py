"""Static shapes of a model's values, for the NNAPI lowering.

onnx-ir carries the shapes ONNX shape inference found; after shape
specialisation some values (behind a Reshape whose target came from a folded
Shape computation, for instance) still lack one.  :func:`static_shapes`
fills the gaps for the operators the lowering handles, so a partition is
only refused for a truly dynamic shape.
"""
from __future__ import annotations

import numpy as np

from minirt.builder.ir_helpers import static_shape
from minirt import vocabulary as V


_static = static_shape  # one definition: builder.passes.irh.static_shape


def _broadcast(*shapes):
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _reshape(in_shape, target, allowzero=0):
    target = [int(t) for t in target]
    out = []
    for i, t in enumerate(target):
        out.append(in_shape[i] if t == 0 and not allowzero else t)
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        total = int(np.prod(in_shape, dtype=np.int64))
        if known == 0:
            return None
        out[out.index(-1)] = total // known
    return tuple(out)


def _ints(v, const):
    """A constant input as a list of ints, [] for an absent one, None for a run-time one."""
    if v is None or not v.name:
        return []
    c = const(v)
    return None if c is None else [int(i) for i in np.asarray(c).reshape(-1)]


def slice_bounds(node, in_shape, const):
    """ONNX Slice of an ``in_shape`` tensor as per-axis (begins, ends, steps) and the output shape.

    Every axis gets an entry (an unsliced one: 0, dim, 1).  The bounds are normalised the way the
    ONNX spec clamps them: a negative start / end counts from the back; with a positive step both
    are clamped to [0, dim]; with a negative step the start to [0, dim - 1] and the end to
    [-1, dim - 1], where -1 means "through index 0" (no index names it).  None when the starts,
    ends, axes or steps are not constants (or an axis is out of range / repeated, or a step is 0).
    Opset < 10 carries them as attributes, later opsets as inputs 1-4.
    """
    r = len(in_shape)
    if "starts" in node.attributes:  # opset 1-9
        starts, ends = list(node.attributes["starts"].value), list(node.attributes["ends"].value)
        axes = list(node.attributes["axes"].value) if "axes" in node.attributes else []
        steps = []
    else:
        ins = list(node.inputs) + [None] * (5 - len(node.inputs))
        starts, ends, axes, steps = (_ints(v, const) for v in ins[1:5])
        if starts is None or ends is None or axes is None or steps is None:
            return None
    axes = axes or list(range(len(starts)))
    steps = steps or [1] * len(starts)
    if not (len(starts) == len(ends) == len(axes) == len(steps)):
        return None
    begins, stops, strides = [0] * r, list(in_shape), [1] * r
    seen = set()
    for a, b, e, st in zip(axes, starts, ends, steps):
        if not -r <= a < r or a % r in seen or st == 0:
            return None
        a %= r
        seen.add(a)
        d = in_shape[a]
        b = b + d if b < 0 else b
        e = e + d if e < 0 else e
        if st > 0:
            b, e = min(max(b, 0), d), min(max(e, 0), d)
        else:
            b, e = min(max(b, 0), d - 1), min(max(e, -1), d - 1)
        begins[a], stops[a], strides[a] = b, e, st
    out = tuple(max(0, -(-(e - b) // st)) for b, e, st in zip(begins, stops, strides))
    return begins, stops, strides, out


def split_sizes(node, dim: int, const):
    """The sizes of an ONNX Split's outputs along its axis (of size ``dim``), or None (run-time sizes).

    Opset 13+ takes them from input 1, opset 2-12 from the ``split`` attribute; without either,
    opset 18's ``num_outputs`` cuts ceil(dim / n) chunks (the last one smaller), and earlier opsets
    cut ``dim`` into one equal part per output.
    """
    if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].name:
        return _ints(node.inputs[1], const)
    if "split" in node.attributes:
        return [int(i) for i in node.attributes["split"].value]
    if "num_outputs" in node.attributes:
        n = int(node.attributes["num_outputs"].value)
        chunk = -(-dim // n)
        return [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    n = len(node.outputs)
    return [dim // n] * n


# Ops whose output has the input's shape, of those the NNAPI lowering handles: a subset of the
# vocabulary's one-input families (tests/test_vocabulary.py checks the relation).
_SAME_SHAPE = {"Relu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "LeakyRelu", "Clip", "Softmax", "LogSoftmax",
               "Activation", "Identity", "Dropout", "Abs", "Exp", "Log", "Neg", "Sqrt", "Floor", "Elu", "Erf",
               "QuantizeLinear", "DequantizeLinear", "BatchNormalization", "PRelu", "Reciprocal"}
_BINARY = V.BINARY_MATH - {"Mod"}  # broadcast shapes; NNAPI has no Mod


def infer(node, in_shapes, const) -> list:
    """Output shapes of ``node`` from its input shapes (None where unknown)."""
    op = node.op_type
    x = in_shapes[0] if in_shapes else None
    if op in _SAME_SHAPE:
        return [x]
    if op in _BINARY:
        if any(s is None for s in in_shapes):
            return [None]
        return [_broadcast(*in_shapes)]
    if op == "Reshape" and x is not None and len(node.inputs) > 1:
        t = const(node.inputs[1])
        if t is not None:
            a = node.attributes.get("allowzero")
            return [_reshape(x, t.reshape(-1), a.value if a else 0)]
    if op == "Flatten" and x is not None:
        a = node.attributes.get("axis")
        axis = a.value if a else 1
        axis = axis + len(x) if axis < 0 else axis
        return [(int(np.prod(x[:axis], dtype=np.int64)), int(np.prod(x[axis:], dtype=np.int64)))]
    if op in ("MatMul", "FusedMatMul") and x is not None and in_shapes[1] is not None:
        a, b = x, in_shapes[1]
        if len(a) >= 1 and len(b) >= 2:
            batch = _broadcast(a[:-2], b[:-2]) if len(a) >= 2 else b[:-2]
            if batch is None:
                return [None]
            out = tuple(batch) + ((a[-2],) if len(a) >= 2 else ()) + (b[-1],)
            return [out]
    if op in ("Gemm", "FusedGemm") and x is not None and in_shapes[1] is not None:
        ta = node.attributes.get("transA")
        tb = node.attributes.get("transB")
        m = x[1] if ta and ta.value else x[0]
        n = in_shapes[1][0] if tb and tb.value else in_shapes[1][1]
        return [(m, n)]
    if op == "LayerNormalization":  # (ONNX and com.minirt) the Mean / InvStdDev outputs are not lowered
        return [x] + [None] * (len(node.outputs) - 1)
    if op == "Slice" and x is not None:
        bounds = slice_bounds(node, x, const)
        return [None if bounds is None else bounds[3]]
    if op == "Split" and x is not None:
        a = node.attributes.get("axis")
        axis = (a.value if a else 0) % len(x)
        sizes = split_sizes(node, x[axis], const)
        if sizes is None or len(sizes) != len(node.outputs):
            return [None for _ in node.outputs]
        return [x[:axis] + (n,) + x[axis + 1:] for n in sizes]
    if op == "Gather" and x is not None and in_shapes[1] is not None:
        a = node.attributes.get("axis")
        axis = (a.value if a else 0) % len(x)
        return [x[:axis] + tuple(in_shapes[1]) + x[axis + 1:]]
    if op in V.GLOBAL_POOL and x is not None:
        return [tuple(x[:2]) + (1,) * (len(x) - 2)]
    return [None for _ in node.outputs]


def static_shapes(graph, const) -> dict:
    """id(value) -> static shape tuple (or None) for every value of ``graph`` (topological order)."""
    shapes: dict = {}
    for v in list(graph.inputs) + list(graph.initializers.values()):
        shapes[id(v)] = _static(v)
        if shapes[id(v)] is None and v.const_value is not None:
            shapes[id(v)] = tuple(int(d) for d in v.const_value.shape)
    for node in graph:
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(None)
                continue
            s = shapes.get(id(v))
            if s is None:
                s = _static(v)
                if s is None:
                    c = const(v)
                    s = None if c is None else tuple(c.shape)
                shapes[id(v)] = s
            ins.append(s)
        inferred = None
        for i, o in enumerate(node.outputs):
            s = _static(o)
            if s is None:
                if inferred is None:
                    try:
                        inferred = infer(node, [s for s in ins], const)
                    except Exception:  # noqa: BLE001 - unknown stays unknown
                        inferred = [None] * len(node.outputs)
                s = inferred[i] if i < len(inferred) else None
            shapes[id(o)] = s
    return shapes


# --- data movement plans: Reshape / Transpose between stored layouts ---------------------------------
#
# A value is stored as ``np.transpose(value, order)`` (its "order": the ONNX axis of each stored axis;
# NHWC for rank 4, ONNX's own order for ranks 1-3, a free order for ranks above 4: emitter.Lowerer).
# A Reshape or Transpose from one stored order to another moves "atoms": the common refinement of the
# input and output shapes, the pieces every input axis and every output axis is a row-major product of.
# The move is one RESHAPE when the atoms keep their order, else one TRANSPOSE of the atoms with the unit
# ones dropped and the runs that stay together merged, between two RESHAPEs.


def atoms(in_shape, out_shape):
    """(sizes, in_groups, out_groups) of the common refinement of a reshape ``in_shape`` -> ``out_shape``,
    or None when there is none (e.g. (6, 4) -> (4, 6): an output axis straddles an input axis boundary
    inside a non-divisible extent).

    ``sizes[k]`` is atom k's extent (atoms in row-major order, unit axes own no atom);
    ``in_groups[a]`` / ``out_groups[a]``: the atoms that input / output axis ``a`` is made of, outer first.
    """
    if int(np.prod(in_shape, dtype=np.int64)) != int(np.prod(out_shape, dtype=np.int64)):
        return None
    ins = [(a, int(d)) for a, d in enumerate(in_shape) if d != 1]
    outs = [(a, int(d)) for a, d in enumerate(out_shape) if d != 1]
    sizes: list = []
    in_groups: list = [[] for _ in in_shape]
    out_groups: list = [[] for _ in out_shape]
    i = j = 0
    ri = ins[0][1] if ins else 1
    rj = outs[0][1] if outs else 1
    while i < len(ins) and j < len(outs):
        # the outer remaining part of input axis i and of output axis j start at the same flat stride:
        # the smaller one is an atom when it divides the larger (else the axes interleave)
        if ri % rj and rj % ri:
            return None
        size = min(ri, rj)
        in_groups[ins[i][0]].append(len(sizes))
        out_groups[outs[j][0]].append(len(sizes))
        sizes.append(size)
        ri //= size
        rj //= size
        if ri == 1:
            i += 1
            ri = ins[i][1] if i < len(ins) else 1
        if rj == 1:
            j += 1
            rj = outs[j][1] if j < len(outs) else 1
    return sizes, in_groups, out_groups


def merged_permutation(sizes, src, dst):
    """(dims, perm) of the TRANSPOSE taking atoms stored in sequence ``src`` to sequence ``dst`` (both
    lists of atom indices, each atom once), with unit atoms dropped and every run of atoms that is
    consecutive in both sequences merged into one axis; perm is the identity when no data moves."""
    src = [k for k in src if sizes[k] != 1]
    dst = [k for k in dst if sizes[k] != 1]
    runs: list = []  # runs of dst, each a list of atoms consecutive in src too
    pos = {k: n for n, k in enumerate(src)}
    for k in dst:
        if runs and pos[runs[-1][-1]] + 1 == pos[k]:
            runs[-1].append(k)
        else:
            runs.append([k])
    by_src = sorted(range(len(runs)), key=lambda r: pos[runs[r][0]])
    dims = [int(np.prod([sizes[k] for k in runs[r]], dtype=np.int64)) for r in by_src]
    perm = [by_src.index(r) for r in range(len(runs))]
    return dims, perm


def move_plan(in_shape, in_order, out_shape, out_order, perm=None):
    """(dims, perm) of the one TRANSPOSE (identity perm: none) that takes a value stored in ``in_order``
    to ``np.transpose(value.transpose(perm).reshape(out_shape), out_order)``, or None (no common
    refinement of the shapes).  ``perm``: an ONNX Transpose between the two (then ``out_shape`` is the
    transposed shape); without it, a Reshape."""
    if perm is not None:
        sizes = [int(d) for d in in_shape]
        src = [a for a in in_order]
        dst = [perm[a] for a in out_order]
        return merged_permutation(sizes, src, dst)
    refined = atoms(in_shape, out_shape)
    if refined is None:
        return None
    sizes, in_groups, out_groups = refined
    src = [k for a in in_order for k in in_groups[a]]
    dst = [k for a in out_order for k in out_groups[a]]
    return merged_permutation(sizes, src, dst)


def free_order(in_shape, in_order, out_shape):
    """The stored order of a Reshape's output (of rank > 4, which has no fixed layout) that makes the
    Reshape move no data: the output axes in the order their atoms are stored in the input, unit axes
    first; None when no order does (an output axis' atoms are not stored together, outer first)."""
    refined = atoms(in_shape, out_shape)
    if refined is None:
        return None
    sizes, in_groups, out_groups = refined
    stored = [k for a in in_order for k in in_groups[a]]
    pos = {k: n for n, k in enumerate(stored)}
    units = [a for a, g in enumerate(out_groups) if not g]
    rest = sorted((a for a, g in enumerate(out_groups) if g), key=lambda a: pos[out_groups[a][0]])
    for a in rest:
        if [pos[k] for k in out_groups[a]] != list(range(pos[out_groups[a][0]], pos[out_groups[a][0]] + len(out_groups[a]))):
            return None
    return tuple(units + rest)


def compact_dims(dims, max_rank: int = 4) -> tuple:
    """Operand dims for the stored elements ``dims`` of a value of rank > ``max_rank``: unit axes
    dropped, then the leading axes merged until the rank is at most ``max_rank`` (at least rank 1)."""
    d = [int(x) for x in dims if x != 1] or [1]
    while len(d) > max_rank:
        d[:2] = [d[0] * d[1]]
    return tuple(d)
