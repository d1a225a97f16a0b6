"""Small helpers over onnx-ir shared by the passes, the quantizer and the target lowerings.

A public leaf module: it imports nothing from ``builder`` or ``targets``, so every
part of the desktop side can import it without an import circle.

Invariants every pass relies on:

* a value is *constant* when it has a ``const_value`` and is not a graph input
  (an initializer that is also a graph input can be overridden at run time);
* a graph output keeps its name: :func:`replace_value` moves the name onto the
  replacement, and refuses when that would rename a graph input or another
  output (the caller then keeps the node);
* new nodes are inserted next to the node they replace, so the graph stays
  topologically sorted without a re-sort inside a pass.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx_ir as ir

from minirt import vocabulary
from minirt.dtypes import ONNX_TO_NUMPY

MINIRT_DOMAIN = vocabulary.MINIRT_DOMAIN
MINIRT_OPSET = 1


def graphs(model: ir.Model) -> Iterator[ir.Graph]:
    """The main graph, then every subgraph (depth first)."""
    yield from model.graphs()


def count_nodes(model: ir.Model) -> int:
    return sum(1 for g in graphs(model) for _ in g)


def opset_of(model: ir.Model, node: ir.Node) -> int:
    """The opset ``node`` is interpreted at (the model's import for its domain)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if node.version is not None:
        return int(node.version)
    v = model.opset_imports.get(domain)
    if v is None and domain == "":
        v = model.opset_imports.get("ai.onnx")
    return int(v) if v is not None else 1


def is_onnx(node: ir.Node, *op_types: str) -> bool:
    return node.domain in ("", "ai.onnx") and node.op_type in op_types


def subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs ``node`` holds as attributes (If's branches, a Loop's or a Scan's body), in order."""
    out: list[ir.Graph] = []
    for a in node.attributes.values():
        if a.type == ir.AttributeType.GRAPH:
            out.append(a.value)
        elif a.type == ir.AttributeType.GRAPHS:
            out.extend(a.value)
    return out


def has_subgraph(node: ir.Node) -> bool:
    return any(a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for a in node.attributes.values())


def const_tensor(value: ir.Value | None):
    """The constant tensor behind ``value`` (initializer or Constant node), else None."""
    if value is None or value.is_graph_input():
        return None
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    if producer is None or not is_onnx(producer, "Constant"):
        return None
    try:
        return ir.convenience.get_const_tensor(value)
    except Exception:  # noqa: BLE001 - malformed Constant: treat as not constant
        return None


def const_array(value: ir.Value | None) -> np.ndarray | None:
    t = const_tensor(value)
    if t is None:
        return None
    try:
        arr = t.numpy()
    except Exception:  # noqa: BLE001 - external data, exotic dtypes
        return None
    return arr


def is_const(value: ir.Value | None) -> bool:
    return const_tensor(value) is not None


def scalar(value: ir.Value | None) -> float | None:
    """The single element of a constant with one element, else None."""
    arr = const_array(value)
    if arr is None or arr.size != 1 or arr.dtype.kind not in "fiub":
        return None
    return float(arr.reshape(-1)[0])


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def other_input(node: ir.Node, v: ir.Value) -> ir.Value | None:
    """The input of a two-input ``node`` that is not ``v`` (None if ``v`` is not one of them)."""
    if len(node.inputs) != 2:
        return None
    if node.inputs[0] is v:
        return node.inputs[1]
    if node.inputs[1] is v:
        return node.inputs[0]
    return None


def live_nodes(graph: ir.Graph):
    """``graph``'s nodes in order, skipping any that an earlier rewrite in the same sweep removed."""
    for node in list(graph):
        if node.graph is graph:
            yield node


def static_shape(value: ir.Value | None) -> tuple[int, ...] | None:
    """The shape as ints when every dimension is known, else None."""
    if value is None or value.shape is None:
        return None
    dims = []
    for d in value.shape:
        if not isinstance(d, int) or d < 0:
            return None
        dims.append(d)
    return tuple(dims)


def rank(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def numpy_dtype(value: ir.Value | None) -> np.dtype | None:
    if value is None or value.dtype is None:
        return None
    return ONNX_TO_NUMPY.get(int(value.dtype.value))


def single_use(value: ir.Value) -> ir.Node | None:
    """The one node reading ``value`` when it has exactly one use and is not a graph output."""
    if value.is_graph_output():
        return None
    uses = list(value.uses())
    if len(uses) != 1:
        return None
    return uses[0][0]


def new_initializer(graph: ir.Graph, array: np.ndarray, name_hint: str) -> ir.Value:
    """Register ``array`` as a new initializer of ``graph`` under a fresh name."""
    name = unique_name(graph, name_hint)
    array = array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
    value = ir.Value(
        name=name,
        shape=ir.Shape(array.shape),
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        const_value=ir.tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value


def unique_name(graph: ir.Graph, hint: str) -> str:
    taken = _names(graph)
    name = hint or "v"
    if name not in taken:
        taken.add(name)
        return name
    i = 1
    while f"{name}_{i}" in taken:
        i += 1
    taken.add(f"{name}_{i}")
    return f"{name}_{i}"


def _names(graph: ir.Graph) -> set:
    # Recomputed per call is O(graph); cached on the graph's metadata store
    # for the duration of one pass run (invalidated by ``forget_names``).
    cache = graph.meta.get("_minirt_names")
    if cache is None:
        cache = {v.name for v in graph.inputs} | set(graph.initializers)
        for node in graph:
            cache.update(v.name for v in node.outputs if v.name)
            if node.name:
                cache.add(node.name)
        graph.meta["_minirt_names"] = cache
    return cache


def forget_names(model: ir.Model) -> None:
    for g in graphs(model):
        g.meta.pop("_minirt_names", None)


def replace_value(old: ir.Value, new: ir.Value) -> bool:
    """Make every reader of ``old`` (graph outputs included) read ``new``.

    When ``old`` is a graph output, ``new`` takes its name so the model's
    interface does not change.  Returns False (and changes nothing) when that
    is impossible: ``new`` is a graph input or already a graph output.
    """
    if old is new:
        return True
    if old.is_graph_output():
        if new.is_graph_input() or new.is_graph_output():
            return False
        name = old.name
        graph = old.graph
        old.name = None
        if name is not None:
            if graph is not None:
                graph.meta.pop("_minirt_names", None)
            new.name = name
        if new.type is None:
            new.type = old.type
        if new.shape is None and old.shape is not None:
            new.shape = old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        return True
    old.replace_all_uses_with(new)
    return True


def can_replace(old: ir.Value, new: ir.Value) -> bool:
    """Whether :func:`replace_value` would succeed."""
    return old is new or not old.is_graph_output() or not (new.is_graph_input() or new.is_graph_output())


def remove_nodes(graph: ir.Graph, nodes) -> None:
    """Remove ``nodes`` (which no surviving node reads) from ``graph``."""
    nodes = [n for n in nodes if n.graph is graph]
    if nodes:
        graph.remove(nodes, safe=True)


def ensure_minirt_opset(model: ir.Model) -> None:
    model.opset_imports.setdefault(MINIRT_DOMAIN, MINIRT_OPSET)


def copy_type(dst: ir.Value, src: ir.Value) -> None:
    dst.type = src.type
    dst.shape = src.shape


def copy_attrs(node: ir.Node, drop=()) -> list:
    """Fresh copies of ``node``'s attributes (an Attr belongs to one node), minus ``drop``."""
    return [ir.Attr(a.name, a.type, a.value) for name, a in node.attributes.items() if name not in drop]
