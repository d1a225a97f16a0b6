"""Tree ensembles laid out for the runtime, stored once.

Rule: every ``ai.onnx.ml`` TreeEnsembleClassifier / TreeEnsembleRegressor (opsets 1..3, any attribute
form) and TreeEnsemble (opset 5) whose layout builds becomes one ``com.minirt::FlatTreeEnsemble`` node
with the same input and outputs.  Its attributes are the flat layout of minirt/kernels/trees.py
(``trees.LAYOUT_TENSORS``, as tensors in the tensor-data section, each in the narrowest integer type
that holds it) plus what finishes the scores (kind, post_transform, aggregate_function, base_values,
class labels); the source attributes are dropped, so the ensemble is stored once and a device reads
it ready to walk.  Two arrays are left out when they are implied: ``weight_leaf`` when leaf i has
exactly weight i (single-target models), ``weight_target`` when every weight is for target 0.

Kept as it is (the kernel builds the same layout at run time): a node whose attributes the layout
rejects (the kernel then reports the same problem when it runs) or whose input is not a tensor.
"""
from __future__ import annotations

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass
from minirt.kernels import _ml_scores as sc
from minirt.kernels import trees

ML = "ai.onnx.ml"
_OPS = ("TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble")


def _value(node: ir.Node, name: str):
    a = node.attributes.get(name)
    if a is None:
        return None
    v = a.value
    if a.type == ir.AttributeType.TENSOR:
        return v.numpy()
    if a.type in (ir.AttributeType.STRINGS,):
        return [s.decode() if isinstance(s, bytes) else s for s in v]
    if a.type in (ir.AttributeType.INTS, ir.AttributeType.FLOATS):
        return list(v)
    return v


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` (non-negative integers) in the smallest of uint8 / uint16 / int32 that holds it."""
    top = int(a.max()) if a.size else 0
    for dt in (np.uint8, np.uint16, np.int32):
        if top <= np.iinfo(dt).max:
            return a.astype(dt)
    raise ValueError("tree layout index beyond int32")


def layout_of(node: ir.Node, x_dtype) -> tuple[trees.TreeLayout, dict]:
    """The node's layout and the attributes that finish its scores (raises ValueError if it does not build)."""
    g = lambda name: _value(node, name)  # noqa: E731
    if node.op_type == "TreeEnsemble":
        dtype = np.float64 if x_dtype == np.float64 else np.float32
        layout = trees.layout_from_v5(
            leaf_targetids=g("leaf_targetids"), leaf_weights=g("leaf_weights"), membership_values=g("membership_values"),
            n_targets=g("n_targets"), nodes_falseleafs=g("nodes_falseleafs"), nodes_falsenodeids=g("nodes_falsenodeids"),
            nodes_featureids=g("nodes_featureids"), nodes_missing_value_tracks_true=g("nodes_missing_value_tracks_true"),
            nodes_modes=g("nodes_modes"), nodes_splits=g("nodes_splits"), nodes_trueleafs=g("nodes_trueleafs"),
            nodes_truenodeids=g("nodes_truenodeids"), tree_roots=g("tree_roots"), dtype=dtype)
        extra = {"kind": "ensemble5", "aggregate_function": int(g("aggregate_function") if g("aggregate_function")
                                                                  is not None else 1),
                 "post_transform": sc.post_transform_code(node.op_type, g("post_transform") or 0)}
        return layout, extra
    classifier = node.op_type == "TreeEnsembleClassifier"
    w = "class" if classifier else "target"
    if classifier:
        labels = g("classlabels_strings") or g("classlabels_int64s") or []
        n_targets = len(labels)
    else:
        n_targets = int(g("n_targets") or 0)
    layout = trees.layout_from_classic(
        node.op_type, nodes_treeids=g("nodes_treeids"), nodes_nodeids=g("nodes_nodeids"),
        nodes_featureids=g("nodes_featureids"), nodes_modes=g("nodes_modes"), nodes_values=g("nodes_values"),
        nodes_values_as_tensor=g("nodes_values_as_tensor"), nodes_truenodeids=g("nodes_truenodeids"),
        nodes_falsenodeids=g("nodes_falsenodeids"),
        nodes_missing_value_tracks_true=g("nodes_missing_value_tracks_true"), w_treeids=g(f"{w}_treeids"),
        w_nodeids=g(f"{w}_nodeids"), w_ids=g(f"{w}_ids"), w_weights=g(f"{w}_weights"),
        w_weights_as_tensor=g(f"{w}_weights_as_tensor"), n_targets=n_targets)
    base = trees._floats(g("base_values"), g("base_values_as_tensor"), "base_values", node.op_type)
    extra = {"kind": "classifier" if classifier else "regressor",
             "post_transform": sc.post_transform_code(node.op_type, g("post_transform") or "NONE")}
    if base is not None and base.size:
        extra["base_values"] = base
    if classifier:
        if g("classlabels_strings"):
            extra["classlabels_strings"] = list(g("classlabels_strings"))
        else:
            extra["classlabels_int64s"] = [int(v) for v in g("classlabels_int64s")]
    else:
        text = g("aggregate_function") or "SUM"
        extra["aggregate_function"] = trees._AGGREGATES.get(text.decode() if isinstance(text, bytes) else text, -1)
        if extra["aggregate_function"] < 0:
            raise ValueError(f"unknown aggregate_function {text!r}")
    return layout, extra


def _attributes(layout: trees.TreeLayout, extra: dict) -> list:
    attrs = [ir.AttrInt64("n_targets", layout.n_targets)]
    arrays = layout.tensors()
    n_leaves = int(((layout.mode & 15) == trees.LEAF).sum())
    if np.array_equal(arrays["weight_leaf"], np.arange(n_leaves)):
        del arrays["weight_leaf"]  # (implied: leaf i has weight i)
    if not arrays["weight_target"].any():
        del arrays["weight_target"]  # (implied: every weight is for target 0)
    for name, arr in arrays.items():
        if arr.dtype.kind in "iu":
            arr = _narrow(arr.astype(np.int64))
        attrs.append(ir.AttrTensor(name, ir.tensor(np.ascontiguousarray(arr), name=name)))
    if layout.members:
        sep = [np.concatenate([m, [np.nan]]) for m in layout.members]
        attrs.append(ir.AttrTensor("membership_values", ir.tensor(np.concatenate(sep)[:-1], name="membership_values")))
    for key, value in extra.items():
        if key == "kind":
            attrs.append(ir.AttrString(key, value))
        elif key == "base_values":
            attrs.append(ir.AttrTensor(key, ir.tensor(np.asarray(value), name=key)))
        elif key == "classlabels_strings":
            attrs.append(ir.AttrStrings(key, value))
        elif key == "classlabels_int64s":
            attrs.append(ir.AttrInt64s(key, value))
        else:
            attrs.append(ir.AttrInt64(key, int(value)))
    return attrs


class FlattenTreeEnsembles(Pass):
    """Replace ai.onnx.ml tree-ensemble nodes by com.minirt::FlatTreeEnsemble with their layout."""

    name = "flatten_tree_ensembles"

    def run(self, model: ir.Model) -> bool:
        changed = False
        for graph in list(irh.graphs(model)):
            for node in list(graph):
                if node.domain != ML or node.op_type not in _OPS or not node.inputs or node.inputs[0] is None:
                    continue
                x = node.inputs[0]
                x_dtype = irh.numpy_dtype(x)
                if node.op_type == "TreeEnsemble" and x_dtype is None:
                    continue  # (v5's threshold type is X's: unknown here, the kernel decides at run time)
                try:
                    layout, extra = layout_of(node, x_dtype)
                except (ValueError, TypeError, KeyError):
                    continue  # (the runtime kernel reports it, naming the node)
                flat = ir.Node(irh.MINIRT_DOMAIN, "FlatTreeEnsemble", [x], attributes=_attributes(layout, extra),
                               num_outputs=len(node.outputs), version=irh.MINIRT_OPSET, name=node.name)
                for old, new in zip(node.outputs, flat.outputs):
                    irh.copy_type(new, old)
                graph.insert_before(node, flat)
                if not all(irh.can_replace(old, new) for old, new in zip(node.outputs, flat.outputs)):
                    graph.remove(flat, safe=True)
                    continue
                for old, new in zip(node.outputs, flat.outputs):
                    irh.replace_value(old, new)
                graph.remove(node, safe=True)
                irh.ensure_minirt_opset(model)
                changed = True
        return changed
