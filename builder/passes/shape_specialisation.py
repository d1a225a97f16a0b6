"""Shape specialisation: fix symbolic input dimensions and re-infer every shape.

Rules:

* for each ``--input-shape name=1x3x224x224``, the graph input ``name`` gets
  that static shape (a dimension the model fixes must agree, and the rank
  must match; otherwise ``ValueError`` naming the input);
* then shapes of every intermediate value are recomputed by ONNX shape
  inference with data propagation, starting from scratch (stale symbolic
  shapes are cleared first), so constant folding can turn ``Shape``/``Size``
  and the arithmetic on them into constants.  If inference fails, the
  previous shapes are restored: a model always keeps at least what it had.

The pass runs once per model (the first sweep); it is a no-op without input
shapes.  After the first inference it folds constants (and constant ``If``s)
and infers again, a few rounds while folding changes something: shapes that
depend on folded shape arithmetic (a ``Pad`` whose pads come from ``Shape``)
are known only then.  Graphs holding minirt's own ops are never re-inferred
(ONNX inference does not know them), which is why this pass comes first.
"""
from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.constant_folding import ConstantFolding
from minirt.builder.passes.fold_constant_if import FoldConstantIf
from minirt.builder.passes.manager import Pass


def apply_input_shapes(model: ir.Model, shapes: dict) -> bool:
    by_name = {v.name: v for v in model.graph.inputs}
    changed = False
    for name, shape in shapes.items():
        value = by_name.get(name)
        if value is None:
            raise ValueError(f"input shape given for {name!r}, but the model's inputs are {list(by_name)}")
        shape = tuple(int(d) for d in shape)
        if value.shape is not None:
            if len(value.shape) != len(shape):
                raise ValueError(f"input {name!r}: rank {len(shape)} given, the model's rank is {len(value.shape)}")
            for axis, (old, new) in enumerate(zip(value.shape, shape)):
                if isinstance(old, int) and old >= 0 and old != new:
                    raise ValueError(f"input {name!r}: dimension {axis} is fixed to {old} in the model, got {new}")
        if irh.static_shape(value) != shape:
            value.shape = ir.Shape(shape)
            changed = True
    return changed


class ShapeSpecialisation(Pass):
    """Apply ``--input-shape`` and recompute static shapes."""

    name = "shape_specialisation"

    def run(self, model: ir.Model) -> bool:
        shapes = dict(self.context.input_shapes or {})
        if not shapes or model.meta.get("_minirt_specialised"):
            return False
        model.meta["_minirt_specialised"] = True
        if any(n.domain not in ("", "ai.onnx") for g in irh.graphs(model) for n in g):
            self.refuse("shape inference", "<model>", "the graph already holds non-ONNX ops; shapes not re-inferred")
            changed = apply_input_shapes(model, shapes)
            return changed
        changed = apply_input_shapes(model, shapes)
        inferred = _infer(model)
        if inferred is None:
            self.refuse("shape inference", "<model>", "ONNX shape inference failed; kept the previous shapes")
            return changed
        changed |= inferred
        # Fold what the new shapes made constant (Shape, Size, the arithmetic on them, an If on them) and
        # infer again: a value past an op whose shape came from such arithmetic (a Pad whose pads are
        # computed from a Shape, Silero's STFT front) gets its shape only then.  A few rounds suffice.
        for _ in range(_REFOLD_ROUNDS):
            folded = ConstantFolding(self.context).call(model).modified
            folded |= FoldConstantIf(self.context).call(model).modified
            if not folded or any(n.domain not in ("", "ai.onnx") for g in irh.graphs(model) for n in g):
                break
            changed = True
            if not _infer(model):
                break
        return changed


# Rounds of folding and re-inference after the first inference (each one only when the last folded something).
_REFOLD_ROUNDS = 4


def _infer(model: ir.Model) -> bool | None:
    """ONNX shape inference with data propagation from scratch over every node output; True when a
    shape changed, None when inference failed (the previous shapes are then restored).  Whatever
    inference cannot recompute keeps its earlier shape."""
    saved = {}
    for graph in irh.graphs(model):
        for node in graph:
            for v in node.outputs:
                saved[id(v)] = (v, v.shape)
                v.shape = None
    try:
        result = ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
    except Exception:  # noqa: BLE001
        for v, shape in saved.values():
            v.shape = shape
        return None
    changed = False
    for v, shape in saved.values():
        if v.shape is None and shape is not None:
            v.shape = shape
        elif shape is not None and v.shape != shape:
            changed = True
    return changed or bool(result and result.modified)
