"""Recognise layer normalisation exported in decomposed form.

Rules (``mean(v)`` is ``ReduceMean(v, axes)`` or ``ReduceSum(v, axes) * 1/N``
or ``ReduceSum(v, axes) / N`` with N the number of reduced elements; both
means use the same axes; ``K(v)`` restores reduced axes dropped by
``keepdims=0``: an Unsqueeze of exactly those axes, a Reshape whose output
shape is the keepdims shape, and an Expand to the shape it already has)::

    m   = mean(x)
    xc  = x - K(m)
    var = mean(xc^2)                               (a) Pow(xc, 2) or xc * xc
        | mean(x^2) - m^2   [Max(., 0) | Relu]     (b) the E[x^2] - E[x]^2 form (magika)
    std = Sqrt(K(var) + eps)
    n   = xc / std | xc * Reciprocal(std) | xc * (1 / std) | xc * Pow(K(var) + eps, -0.5)
    y   = n [* gamma] [+ beta]                     also xc * (inv * gamma) [+ beta]

        -> LayerNormalization(x, gamma, beta, axis=-k, epsilon=eps)

over the last k axes of x.  Models at opset >= 17 get the standard ONNX op,
older ones ``com.minirt::LayerNormalization`` (same semantics,
docs/fused_ops.md).  Every intermediate value must be read only inside the
pattern (and not be a graph output); eps must be a one-element constant,
gamma/beta constants that vary only along the normalised axes (leading 1s
are dropped; broadcast to the normalised shape when it is static).  A gamma
``Mul`` by a non-constant stays a Mul after the fused node (scale = ones).

Refused, with the reason in the report, once the mean/centre/variance
structure matched: axes that are not the trailing ones, the two means over
different axes, no eps (``Sqrt(var)``) or eps added after the Sqrt, a
non-constant gamma inside ``inv * gamma``, gamma/beta that broadcast over
non-normalised axes, keepdims=0 restorations that cannot be verified
(unknown ranks), non-float inputs.

The E[x^2] - E[x]^2 form becomes the centred two-pass computation: same
value in exact arithmetic, less float32 cancellation (closer to float64).
"""
from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

_RESTORE = ("Unsqueeze", "Reshape", "Expand")


class _Refuse(Exception):
    pass


def _readers(v: ir.Value) -> list:
    seen = []
    for n, _ in v.uses():
        if n not in seen:
            seen.append(n)
    return seen


def _reader(v: ir.Value, *ops: str, pred=None) -> ir.Node | None:
    for n in _readers(v):
        if irh.is_onnx(n, *ops) and (pred is None or pred(n)):
            return n
    return None


def _close(a: float | None, b: float, rel=1e-5) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _dims_equal(a, b) -> bool:
    """Provably equal dimensions: same int, or the same named symbol."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, ir.SymbolicDim) and isinstance(b, ir.SymbolicDim):
        return a.value is not None and a.value == b.value
    return False


def _axes_of(model: ir.Model, node: ir.Node) -> list | None:
    """The reduction axes as given (None: not a usable reduction)."""
    if node.op_type == "ReduceMean" and irh.opset_of(model, node) < 18 or (
            node.op_type == "ReduceSum" and irh.opset_of(model, node) < 13):
        axes = irh.attr(node, "axes")
    else:
        axes = None
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            arr = irh.const_array(node.inputs[1])
            if arr is None:
                return None
            axes = arr.reshape(-1).tolist()
        if not axes and irh.attr(node, "noop_with_empty_axes", 0):
            return None
    if axes is None or len(axes) == 0:
        r = irh.rank(node.inputs[0])
        return None if r is None else list(range(r))
    return [int(a) for a in axes]


def _norm_axes(axes: list, rank: int | None) -> tuple | None:
    """Axes as negative positions (-k..-1 order), or None when positive axes meet an unknown rank."""
    out = []
    for a in axes:
        if a < 0:
            out.append(a)
        elif rank is None:
            return None
        else:
            out.append(a - rank)
    return tuple(sorted(set(out)))


class _Match:
    def __init__(self, x, axes, nodes):
        self.x = x
        self.axes = axes  # negative, sorted
        self.nodes = list(nodes)
        self.eps = None
        self.gamma = None
        self.beta = None
        self.root = None


class RecogniseLayerNorm(Pass):
    """Replace decomposed layer normalisation subgraphs by one LayerNormalization node."""

    name = "recognise_layernorm"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            for node in irh.live_nodes(graph):
                if not irh.is_onnx(node, "ReduceMean", "ReduceSum"):
                    continue
                try:
                    match = self._match(model, node)
                except _Refuse as exc:
                    self.refuse("layernorm", node, str(exc))
                    continue
                if match is not None:
                    changed |= self._emit(model, graph, match)
        return changed

    # ------------------------------------------------------------------ means
    def _mean(self, model, node):
        """(x, axes as given, keepdims, mean value, nodes) for a mean node, else None."""
        if not irh.is_onnx(node, "ReduceMean", "ReduceSum") or not node.inputs or node.inputs[0] is None:
            return None
        x = node.inputs[0]
        axes = _axes_of(model, node)
        if axes is None:
            return None
        keep = int(irh.attr(node, "keepdims", 1))
        if node.op_type == "ReduceMean":
            return x, axes, keep, node.outputs[0], [node]
        shape = x.shape
        r = irh.rank(x)
        if shape is None:
            return None
        try:
            dims = [shape[a] for a in axes]
        except IndexError:
            return None
        if not all(isinstance(d, int) and d > 0 for d in dims) or r is None:
            return None
        n = float(np.prod(dims))
        s = node.outputs[0]
        for post in _readers(s):
            if irh.is_onnx(post, "Mul") and _close(irh.scalar(irh.other_input(post, s)), 1.0 / n):
                return x, axes, keep, post.outputs[0], [node, post]
            if irh.is_onnx(post, "Div") and post.inputs[0] is s and _close(irh.scalar(post.inputs[1]), n):
                return x, axes, keep, post.outputs[0], [node, post]
        return None

    def _restore_ok(self, node, v, x, axes) -> bool:
        """Whether ``node`` (reading ``v``) only re-inserts the reduced ``axes`` of ``x``."""
        if node.inputs[0] is not v:
            return False
        rx = irh.rank(x)
        if node.op_type == "Unsqueeze":
            if len(node.inputs) > 1 and node.inputs[1] is not None:
                a = irh.const_array(node.inputs[1])
                a = None if a is None else a.reshape(-1).tolist()
            else:
                a = irh.attr(node, "axes")
            if a is None or rx is None:
                return False
            return _norm_axes([int(i) for i in a], rx) == axes and irh.rank(v) == rx - len(axes)
        out = node.outputs[0]
        if rx is None or out.shape is None or len(out.shape) != rx:
            return False
        if node.op_type == "Expand":
            return v.shape is not None and len(v.shape) == rx and all(
                _dims_equal(a, b) for a, b in zip(v.shape, out.shape))
        # Reshape: the output must be the keepdims shape; one dimension may be
        # unproven (the element count then forces it).
        unproven = 0
        for i, (d, xd) in enumerate(zip(out.shape, x.shape)):
            if i - rx in axes:
                if d != 1:
                    return False
            elif not _dims_equal(d, xd):
                unproven += 1
        return unproven <= 1

    def _skip_restore(self, v, x, axes, nodes):
        """Follow the chain of restoring nodes from ``v``; return the restored value."""
        while True:
            rs = _readers(v)
            if len(rs) != 1 or not irh.is_onnx(rs[0], *_RESTORE) or v.is_graph_output():
                return v
            if not self._restore_ok(rs[0], v, x, axes):
                if irh.rank(x) is None:
                    raise _Refuse(f"{rs[0].op_type} after a keepdims=0 reduction cannot be verified (rank of the input unknown)")
                return v
            nodes.append(rs[0])
            v = rs[0].outputs[0]

    # ------------------------------------------------------------------ match
    def _match(self, model, node):
        mean = self._mean(model, node)
        if mean is None:
            return None
        x, axes_given, keep, m, nodes = mean
        if x.dtype is not None and x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE):
            return None
        rx = irh.rank(x)
        axes = _norm_axes(axes_given, rx)
        nodes = list(nodes)
        # centre: Sub(x, K(m))
        sub, chain = self._find_centre(m, x, axes)
        if sub is None:
            return None
        xc = sub.outputs[0]
        var, vnodes = self._variance(model, x, m, xc, axes)
        if var is None:
            return None
        # The structure is a layer norm from here: failures are refusals.
        if axes is None:
            raise _Refuse(f"reduction axes {axes_given} with the input rank unknown: cannot tell whether they are trailing")
        k = len(axes)
        if axes != tuple(range(-k, 0)):
            raise _Refuse(f"reduction axes {axes_given} are not the trailing axes of the input")
        match = _Match(x, axes, nodes + chain + [sub] + vnodes)
        if not keep and rx is None:
            raise _Refuse("keepdims=0 reduction with the input rank unknown")
        v = self._skip_restore(var, x, axes, match.nodes)
        add = _reader(v, "Add")
        if add is None or len(_readers(v)) != 1:
            sq = _reader(v, "Sqrt")
            if sq is not None:
                after = _reader(sq.outputs[0], "Add")
                if after is not None and irh.is_const(irh.other_input(after, sq.outputs[0])):
                    raise _Refuse("epsilon added after the Sqrt (std + eps is not a layer norm)")
                raise _Refuse("no epsilon: Sqrt(variance) without an Add of a constant")
            return None
        eps = irh.const_array(irh.other_input(add, v))
        if eps is None or eps.size != 1:
            raise _Refuse("epsilon is not a one-element constant")
        if eps.ndim > 1 and (rx is None or eps.ndim > rx):
            raise _Refuse(f"epsilon of shape {eps.shape} may broadcast the variance to a higher rank")
        match.eps = float(eps.reshape(-1)[0])
        match.nodes.append(add)
        v = self._skip_restore(add.outputs[0], x, axes, match.nodes)
        rs = _readers(v)
        if len(rs) != 1:
            return None
        step = rs[0]
        inv = None
        n = None
        if irh.is_onnx(step, "Pow") and step.inputs[0] is v and _close(irh.scalar(step.inputs[1]), -0.5):
            match.nodes.append(step)
            inv = step.outputs[0]
        elif irh.is_onnx(step, "Sqrt"):
            match.nodes.append(step)
            std = self._skip_restore(step.outputs[0], x, axes, match.nodes)
            rs = _readers(std)
            if len(rs) != 1:
                return None
            step = rs[0]
            if irh.is_onnx(step, "Add") and irh.is_const(irh.other_input(step, std)):
                raise _Refuse("epsilon added after the Sqrt (std + eps is not a layer norm)")
            if irh.is_onnx(step, "Div") and step.inputs[0] is xc and step.inputs[1] is std:
                match.nodes.append(step)
                n = step.outputs[0]
            elif irh.is_onnx(step, "Reciprocal") or (
                    irh.is_onnx(step, "Div") and step.inputs[1] is std and _close(irh.scalar(step.inputs[0]), 1.0)):
                match.nodes.append(step)
                inv = step.outputs[0]
            else:
                return None
        else:
            return None
        if n is None:
            inv = self._skip_restore(inv, x, axes, match.nodes)
            rs = _readers(inv)
            if len(rs) != 1 or not irh.is_onnx(rs[0], "Mul"):
                return None
            mul = rs[0]
            o = irh.other_input(mul, inv)
            if o is xc:
                match.nodes.append(mul)
                n = mul.outputs[0]
            else:  # xc * (inv * gamma)
                g = irh.const_array(o)
                if g is None:
                    raise _Refuse("gamma is not a constant (inv * gamma)")
                match.gamma = self._affine(g, x, axes, "gamma")
                match.nodes.append(mul)
                r2 = _readers(mul.outputs[0])
                if len(r2) != 1 or not irh.is_onnx(r2[0], "Mul") or irh.other_input(r2[0], mul.outputs[0]) is not xc:
                    return None
                match.nodes.append(r2[0])
                n = r2[0].outputs[0]
        y = n
        if match.gamma is None:
            rs = _readers(y)
            if len(rs) == 1 and irh.is_onnx(rs[0], "Mul") and not y.is_graph_output():
                g = irh.const_array(irh.other_input(rs[0], y))
                if g is not None:
                    match.gamma = self._affine(g, x, axes, "gamma")
                    match.nodes.append(rs[0])
                    y = rs[0].outputs[0]
        rs = _readers(y)
        if len(rs) == 1 and irh.is_onnx(rs[0], "Add") and not y.is_graph_output():
            b = irh.const_array(irh.other_input(rs[0], y))
            if b is not None:
                match.beta = self._affine(b, x, axes, "beta")
                match.nodes.append(rs[0])
                y = rs[0].outputs[0]
        match.root = y.producer()
        return match

    def _find_centre(self, m, x, axes):
        """The Sub(x, K(m)) node and the restoring chain between m and it."""
        for r in _readers(m):
            if irh.is_onnx(r, "Sub") and r.inputs[0] is x and r.inputs[1] is m:
                return r, []
        for r in _readers(m):
            chain = []
            v = m
            node = r
            while irh.is_onnx(node, *_RESTORE) and node.inputs[0] is v and len(chain) < 3:
                chain.append(node)
                v = node.outputs[0]
                nxt = _readers(v)
                if len(nxt) != 1:
                    break
                node = nxt[0]
            else:
                if irh.is_onnx(node, "Sub") and node.inputs[0] is x and node.inputs[1] is v and chain:
                    if all(self._restore_ok(c, c.inputs[0], x, axes) for c in chain if axes is not None):
                        return node, chain
        return None, []

    def _square_of(self, v):
        for r in _readers(v):
            if irh.is_onnx(r, "Mul") and r.inputs[0] is v and r.inputs[1] is v:
                return r
            if irh.is_onnx(r, "Pow") and r.inputs[0] is v and _close(irh.scalar(r.inputs[1]), 2.0):
                return r
        return None

    def _mean_reader(self, model, v, x_axes, rank):
        for r in _readers(v):
            got = self._mean(model, r)
            if got is not None and got[0] is v and _norm_axes(got[1], rank) == x_axes:
                return got
        for r in _readers(v):  # a mean over other axes: a near miss
            got = self._mean(model, r)
            if got is not None and got[0] is v:
                raise _Refuse(f"the variance is reduced over axes {got[1]}, the mean over other axes")
        return None

    def _variance(self, model, x, m, xc, axes):
        rank = irh.rank(x)
        sq = self._square_of(xc)
        if sq is not None:  # (a) mean((x - m)^2)
            got = self._mean_reader(model, sq.outputs[0], axes, rank)
            if got is None:
                return None, []
            return got[3], [sq] + got[4]
        sqx = self._square_of(x)  # (b) mean(x^2) - m^2
        sqm = self._square_of(m)
        if sqx is None or sqm is None:
            return None, []
        got = self._mean_reader(model, sqx.outputs[0], axes, rank)
        if got is None:
            return None, []
        ex2 = got[3]
        sub = _reader(ex2, "Sub", pred=lambda n: n.inputs[0] is ex2 and n.inputs[1] is sqm.outputs[0])
        if sub is None:
            return None, []
        nodes = [sqx] + got[4] + [sqm, sub]
        var = sub.outputs[0]
        rs = _readers(var)
        if len(rs) == 1 and not var.is_graph_output():
            clamp = rs[0]
            if irh.is_onnx(clamp, "Relu") or (
                    irh.is_onnx(clamp, "Max") and len(clamp.inputs) == 2 and _close(irh.scalar(irh.other_input(clamp, var)), 0.0)
                    and irh.const_array(irh.other_input(clamp, var)).ndim <= 1):
                nodes.append(clamp)
                var = clamp.outputs[0]
        return var, nodes

    def _affine(self, arr: np.ndarray, x: ir.Value, axes: tuple, what: str) -> np.ndarray:
        """gamma/beta as an array over the normalised axes; _Refuse when it is not per-element of them."""
        k = len(axes)
        rx = irh.rank(x)
        if rx is not None and arr.ndim > rx:
            raise _Refuse(f"{what} of shape {arr.shape} has a higher rank than the input")
        if rx is None and arr.ndim > k and any(d != 1 for d in arr.shape[: arr.ndim - k]):
            raise _Refuse(f"{what} of shape {arr.shape} varies along non-normalised axes")
        core = arr
        while core.ndim > 0 and core.shape[0] == 1:
            core = core.reshape(core.shape[1:])
        if rx is None and arr.ndim > k:
            raise _Refuse(f"{what} of shape {arr.shape} may raise the rank (input rank unknown)")
        if core.ndim > k:
            raise _Refuse(f"{what} of shape {arr.shape} varies along non-normalised axes")
        if x.dtype is not None and core.dtype != irh.numpy_dtype(x):
            raise _Refuse(f"{what} has dtype {core.dtype}, the input {irh.numpy_dtype(x)}")
        norm = None
        if x.shape is not None:
            dims = [x.shape[a] for a in axes]
            if all(isinstance(d, int) and d >= 0 for d in dims):
                norm = tuple(dims)
        if norm is not None:
            try:
                return np.ascontiguousarray(np.broadcast_to(core, norm))
            except ValueError:
                raise _Refuse(f"{what} of shape {arr.shape} does not broadcast to the normalised shape {norm}") from None
        if core.ndim == 0:
            raise _Refuse(f"scalar {what} with the normalised dimensions unknown")
        return np.ascontiguousarray(core)

    # ------------------------------------------------------------------ emit
    def _emit(self, model, graph, match: _Match) -> bool:
        root = match.root
        out = root.outputs[0]
        for n in match.nodes:
            for v in n.outputs:
                if n is not root and v.is_graph_output():
                    self.refuse("layernorm", root, f"intermediate {v.name} is a graph output")
                    return False
                if any(u not in match.nodes for u in _readers(v)) and n is not root:
                    self.refuse("layernorm", root, f"intermediate {v.name} is read outside the pattern")
                    return False
        x = match.x
        k = len(match.axes)
        standard = irh.opset_of(model, root) >= 17
        gamma = match.gamma
        if gamma is None:
            norm = None
            if x.shape is not None:
                dims = [x.shape[a] for a in match.axes]
                if all(isinstance(d, int) and d >= 0 for d in dims):
                    norm = tuple(dims)
            if norm is not None:
                gamma = np.ones(norm, dtype=irh.numpy_dtype(x) or np.float32)
            elif standard:
                standard = False  # the minirt op takes an absent scale
        inputs = [x]
        if gamma is not None:
            inputs.append(irh.new_initializer(graph, gamma, (root.name or "ln") + "_scale"))
        elif match.beta is not None:
            inputs.append(None)
        if match.beta is not None:
            inputs.append(irh.new_initializer(graph, match.beta, (root.name or "ln") + "_bias"))
        attrs = [ir.AttrInt64("axis", -k), ir.AttrFloat32("epsilon", match.eps)]
        if standard:
            new = ir.Node("", "LayerNormalization", inputs, attributes=attrs, name=root.name)
        else:
            irh.ensure_minirt_opset(model)
            new = ir.Node(irh.MINIRT_DOMAIN, "LayerNormalization", inputs, attributes=attrs, name=root.name)
        new.outputs[0].type = out.type if out.type is not None else x.type
        new.outputs[0].shape = out.shape if out.shape is not None else x.shape
        graph.insert_before(root, new)
        if not irh.replace_value(out, new.outputs[0]):
            graph.remove(new, safe=True)
            return False
        irh.remove_nodes(graph, reversed(match.nodes))
        return True
