"""Control flow: If, Loop, Scan.

Graph attributes arrive as :class:`minirt.session.BoundSubgraph` objects
(``.run(*inputs) -> list``); values a body reads from an enclosing scope are
captured by the runtime, so kernels only pass the formal inputs.

Values that are sequences (Python lists of arrays) or optionals (``None``
for an empty optional) flow through unchanged: a body may carry them.
Kernels return a tuple so that a list-valued output is never mistaken for a
multi-output result.
"""
from __future__ import annotations

import numpy as np

from minirt.kernels._limits import check_alloc
from minirt.kernels.registry import kernel


def _scalar_bool(x) -> bool:
    return bool(np.asarray(x).reshape(-1)[0])


# --------------------------------------------------------------------------- If


@kernel("If", since=1)
def if_(cond, then_branch=None, else_branch=None):
    branch = then_branch if _scalar_bool(cond) else else_branch
    return tuple(branch.run())


# --------------------------------------------------------------------------- Loop


def _declared_shape(body, k: int) -> tuple:
    """The declared shape of body output ``k`` when fully static, else ``()``.

    Used only for the empty scan output of a zero-trip Loop.  BoundSubgraph
    has no public accessor for output shapes yet, so read its plan defensively.
    """
    try:
        graph = body._plan.graph
        shape = graph.values[graph.outputs[k]].shape
    except (AttributeError, IndexError, KeyError):
        return ()
    if shape is None or not all(isinstance(d, int) for d in shape):
        return ()
    return tuple(shape)


def _stack(items: list, dtype, elem_shape: tuple = ()) -> np.ndarray:
    if not items:
        return np.zeros((0,) + elem_shape, dtype=dtype if dtype is not None else np.float32)
    return np.stack([np.asarray(a) for a in items], axis=0)


@kernel("Loop", since=1, context=True)
def loop(max_trip_count, cond, *v_initial, body=None, ctx=None):
    n_carried = len(v_initial)
    n_scan = ctx.n_outputs - n_carried
    trip_limit = None if max_trip_count is None else int(np.asarray(max_trip_count).reshape(-1)[0])
    keep_going = True if cond is None else _scalar_bool(cond)
    carried = list(v_initial)
    scans: list[list] = [[] for _ in range(n_scan)]
    scan_bytes = [0] * n_scan  # memory guard: what the stacked scan outputs will need
    i = 0
    while (trip_limit is None or i < trip_limit) and keep_going:
        cond_in = np.array(keep_going, dtype=np.bool_)
        outs = body.run(np.array(i, dtype=np.int64), cond_in, *carried)
        if cond is not None:
            keep_going = _scalar_bool(outs[0])
        carried = list(outs[1 : 1 + n_carried])
        for k in range(n_scan):
            item = outs[1 + n_carried + k]
            scans[k].append(item)
            scan_bytes[k] += getattr(item, "nbytes", 0)
            check_alloc((scan_bytes[k],), np.uint8, f"Loop scan output {k} after {i + 1} iterations")
        i += 1
    dtypes = ctx.output_dtypes[n_carried:]
    return tuple(carried) + tuple(
        _stack(s, dtypes[k] if k < len(dtypes) else None, () if s else _declared_shape(body, 1 + n_carried + k))
        for k, s in enumerate(scans)
    )


# --------------------------------------------------------------------------- Scan


def _scan_core(states, scan_inputs, body, n_outputs, in_axes, in_dirs, out_axes, out_dirs):
    """One Scan over unbatched inputs; returns final states + stacked scan outputs."""
    m = len(scan_inputs)
    in_axes = list(in_axes) if in_axes else [0] * m
    in_dirs = list(in_dirs) if in_dirs else [0] * m
    seqs = []
    for x, ax in zip(scan_inputs, in_axes):
        ax = ax + x.ndim if ax < 0 else ax
        seqs.append(np.moveaxis(x, ax, 0))
    length = seqs[0].shape[0] if seqs else 0
    for s in seqs:
        if s.shape[0] != length:
            raise ValueError(f"Scan: scan inputs have different sequence lengths ({s.shape[0]} vs {length})")
    n_states = len(states)
    n_scan_out = n_outputs - n_states
    out_axes = list(out_axes) if out_axes else [0] * n_scan_out
    out_dirs = list(out_dirs) if out_dirs else [0] * n_scan_out
    states = list(states)
    collected: list[list] = [[] for _ in range(n_scan_out)]
    for t in range(length):
        elems = [s[length - 1 - t] if d else s[t] for s, d in zip(seqs, in_dirs)]
        outs = body.run(*states, *elems)
        states = list(outs[:n_states])
        for k in range(n_scan_out):
            collected[k].append(np.asarray(outs[n_states + k]))
    results = []
    for k in range(n_scan_out):
        items = collected[k]
        if out_dirs[k]:
            items = items[::-1]
        stacked = np.stack(items, axis=0) if items else np.zeros((0,), np.float32)
        ax = out_axes[k]
        ax = ax + stacked.ndim if ax < 0 else ax
        results.append(np.moveaxis(stacked, 0, ax))
    return states, results


@kernel("Scan", since=9, context=True)
def scan(*inputs, body=None, num_scan_inputs=0, scan_input_axes=(), scan_input_directions=(),
         scan_output_axes=(), scan_output_directions=(), ctx=None):
    n_states = len(inputs) - num_scan_inputs
    states, outs = _scan_core(
        inputs[:n_states], inputs[n_states:], body, ctx.n_outputs,
        scan_input_axes, scan_input_directions, scan_output_axes, scan_output_directions,
    )
    return tuple(states) + tuple(outs)


@kernel("Scan", since=8, context=True)
def scan8(sequence_lens=None, /, *inputs, body=None, num_scan_inputs=0, directions=(), ctx=None):
    """Opset 8 Scan: every input has a leading batch axis; scan axis is 1."""
    n_states = len(inputs) - num_scan_inputs
    batch = inputs[0].shape[0]
    per_batch = []
    for b in range(batch):
        states = [x[b] for x in inputs[:n_states]]
        scans = [x[b] for x in inputs[n_states:]]
        if sequence_lens is not None:
            n = int(sequence_lens[b])
            scans = [s[:n] for s in scans]
        st, outs = _scan_core(states, scans, body, ctx.n_outputs, (), directions, (), ())
        per_batch.append(st + outs)
    return tuple(np.stack([pb[k] for pb in per_batch], axis=0) for k in range(ctx.n_outputs))
