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

* folding can make static what the first inference could not see: a ``Pad``
  whose pads are computed from the input size folds to zero pads and is
  removed as a no-op, and the values after it keep the unknown shapes of the
  first inference (SSDlite's transform: every feature map of the backbone
  then had symbolic height and width, so its ~100 Shape nodes never folded).
  So inference alternates with constant folding, constant-If folding, cleanup
  and dead-code elimination (those of them not disabled) until a round folds
  nothing or changes no shape, at most ``SETTLE_ROUNDS`` rounds, before the
  rest of the pipeline (whose fusions bring ops inference does not know).

The pass runs once per model (the first sweep); it is a no-op without input
shapes.  Graphs holding minirt's own ops are never re-inferred (ONNX
inference does not know them), which is why this pass comes first.  The
nodes its rounds fold away count as this pass's in the report.
"""
from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from minirt.builder import ir_helpers as irh
from minirt.builder.passes.manager import Pass

# Rounds of inference and folding at most (each round can only make more shapes static; real models
# settle in one or two).
SETTLE_ROUNDS = 4


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
        inferred = self._infer(model)
        if inferred is None:
            return changed
        changed |= inferred
        # (imported here: those modules import the manager, as this one does)
        from minirt.builder.passes.cleanup import Cleanup
        from minirt.builder.passes.constant_folding import ConstantFolding
        from minirt.builder.passes.dce import DeadCodeElimination
        from minirt.builder.passes.fold_constant_if import FoldConstantIf

        disabled = self.context.disabled
        settle = [cls(self.context) for cls in (ConstantFolding, FoldConstantIf, Cleanup, DeadCodeElimination)
                  if cls.name not in disabled]
        for _ in range(SETTLE_ROUNDS if settle else 0):
            folded = [p(model).modified for p in settle]  # (a list: every pass runs)
            if not any(folded):
                break
            changed = True
            if not self._infer(model):
                break
        return changed

    def _infer(self, model: ir.Model) -> bool | None:
        """Recompute every intermediate shape from scratch; whether one changed (None: inference failed,
        the previous shapes restored and the refusal reported)."""
        saved = {}
        for graph in irh.graphs(model):
            for node in graph:
                for v in node.outputs:
                    saved[id(v)] = (v, v.shape)
                    v.shape = None
        try:
            ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
        except Exception:  # noqa: BLE001
            for v, shape in saved.values():
                v.shape = shape
            self.refuse("shape inference", "<model>", "ONNX shape inference failed; kept the previous shapes")
            return None
        # Whatever inference could not recompute keeps its earlier shape.
        changed = False
        for v, shape in saved.values():
            if v.shape is None and shape is not None:
                v.shape = shape
            elif v.shape != shape:
                changed = True
        return changed
