"""Builder-side provider specifications: what a provider can take and how to lower it.

This is the interface between the partitioner (``builder/partition.py``) and
each accelerator back end (``targets/coreml``, ``targets/nnapi``,
``targets/tflite``).  A back end subclasses :class:`ProviderSpec`:

``name: str``
    The provider's short name ("coreml", "nnapi", "tflite"); the same name the
    runtime's ``minirt.providers`` uses and the artifact's partition records.

``builder_available(ctx) -> (bool, reason)``
    Whether the builder can produce programs for this provider on this
    machine (e.g. coremltools importable).  Default: True.

``supports(node: onnx_ir.Node, ctx: SupportContext) -> (bool, reason)``
    Whether the provider can execute ``node`` on the target described by
    ``ctx.profile``.  Only called for main-graph nodes without subgraphs.  On
    refusal, ``reason`` is a short human sentence, e.g. "Resize mode 'cubic'
    is not supported by Core ML"; the build report prints it for the node.

``node_cost(node, ctx) -> float``
    Estimated FLOPs of the node (default: :func:`targets.flops.node_flops`).

``boundary_cost(value, ctx) -> float``
    FLOP-equivalent cost of moving ``value`` across a partition boundary (a
    copy and a layout change).  Default: ``copy_cost_per_element`` times the
    element count (1024 elements assumed when the shape is unknown).  The
    partitioner sums it over a partition's non-constant inputs and outputs.

``keep_partition(partition, flops, boundary, ctx) -> (bool, reason)``
    The cost model: a partition stays with the provider when its FLOPs pay
    for its boundary copies.  Default rule: keep when ``flops >= min_flops``
    and ``flops >= boundary_ratio * (boundary + dispatch_cost)``; a partition
    that reads only graph inputs and produces only graph outputs is not an
    island (no CPU work around it) and is kept whenever it computes anything.

``lower(partition: PartitionIR, ctx) -> (bytes, dict)``
    The provider program for the partition (opaque bytes stored as a
    provider blob in the artifact) and its options (a JSON-serialisable dict
    stored in the partition record: precision, compute units...).  The
    program takes ``partition.inputs`` and returns ``partition.outputs``
    *in that order*, matched by position (names are the ONNX value names).
    Raising :class:`LoweringError` (or anything) keeps the partition on the
    CPU with the error as its reason.

Registry: :func:`get_spec` maps a provider name to its spec class, imported
lazily ("coreml" -> ``targets.coreml:CoreMLSpec``, "nnapi" ->
``targets.nnapi:NNAPISpec``, "tflite" -> ``targets.tflite:TFLiteSpec``).  A
back end that is missing (module not installed / import error) raises
:class:`ProviderNotOffered` carrying the reason; the partitioner then leaves
every node on the CPU for that provider and says why in the report.

:class:`SupportContext` is what a spec sees of the model: the model and the
target profile, value shape/dtype helpers and constant-value lookup.
:class:`PartitionIR` is a partition in IR terms: nodes (topological order),
inputs (non-constant values read from outside, program order), constants
(constant values read from outside; the program embeds them) and outputs
(values used outside the partition or graph outputs, production order).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.dtypes import ONNX_TO_NUMPY
from minirt.vocabulary import PROVIDERS

# provider name -> "module:Class" (imported on first use), from the provider table (minirt/vocabulary.py)
SPEC_CLASSES: dict[str, str] = {p.name: p.spec for p in PROVIDERS.values() if p.spec is not None}


class ProviderNotOffered(Exception):
    """The builder cannot produce programs for this provider (reason in ``str()``)."""


class LoweringError(Exception):
    """A partition could not be lowered; the partition stays on the CPU with this reason."""


@dataclasses.dataclass
class PartitionIR:
    """A partition in IR terms (all nodes in the main graph).

    ``nodes``: ir.Node list in topological order;
    ``inputs``: the *non-constant* ir.Values the nodes read from outside the
    partition (graph inputs, outputs of other nodes), in program order (order
    of first use) -- exactly what the provider program takes at run time;
    ``constants``: constant ir.Values read from outside (initializers,
    outputs of Constant nodes outside the partition); the program embeds them
    (``ctx.const(value)`` gives the array);
    ``outputs``: ir.Values the nodes produce that are used outside the
    partition (including inside subgraphs of other nodes) or are graph
    outputs, in production order -- what the program returns.
    """

    provider: str
    nodes: list
    inputs: list
    outputs: list
    constants: list = dataclasses.field(default_factory=list)
    index: int = 0  # partition number in the plan

    @property
    def name(self) -> str:
        return f"{self.provider}_p{self.index}"

    @classmethod
    def from_nodes(cls, provider: str, nodes: list, index: int = 0) -> "PartitionIR":
        inside = set(id(n) for n in nodes)
        produced = set()
        for n in nodes:
            for o in n.outputs:
                produced.add(id(o))
        inputs, constants, seen = [], [], set()
        for n in nodes:
            for v in n.inputs:
                if v is None or id(v) in produced or id(v) in seen:
                    continue
                seen.add(id(v))
                (constants if _is_constant(v) else inputs).append(v)
        outputs = []
        for n in nodes:
            for o in n.outputs:
                if not o.name:
                    continue
                if o.is_graph_output() or any(id(user) not in inside for user, _ in o.uses()):
                    outputs.append(o)
        return cls(provider, list(nodes), inputs, outputs, constants, index)


class SupportContext:
    """What a :class:`ProviderSpec` sees while deciding support, costing and lowering.

    ``model``: the onnx-ir model (main graph = ``model.graph``);
    ``profile``: the target profile (``targets.profiles.TargetProfile``);
    ``options``: build options (``input_shapes``, ...).
    """

    def __init__(self, model: ir.Model, profile: Any, options: dict | None = None):
        self.model = model
        self.profile = profile
        self.options = dict(options or {})
        self._const_cache: dict[int, Any] = {}

    # --- target -------------------------------------------------------------
    def provider_info(self, name: str) -> dict:
        """The profile's facts about provider ``name`` (version, precision...), or {}."""
        info = getattr(self.profile, "provider_info", None) or {}
        return dict(info.get(name, {}))

    # --- nodes --------------------------------------------------------------
    def opset(self, node: ir.Node) -> int:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        if node.version is not None:
            return int(node.version)
        v = self.model.opset_imports.get(domain)
        if v is None and domain == "":
            v = self.model.opset_imports.get("ai.onnx")
        return int(v) if v is not None else 1

    attr = staticmethod(irh.attr)  # one definition: builder.ir_helpers.attr

    @staticmethod
    def is_onnx(node: ir.Node) -> bool:
        return node.domain in ("", "ai.onnx")

    def unknown_shape_hint(self) -> str:
        """Why a value's shape is not known, for a refusal's message: without fixed input shapes, the
        missing --input-shape; with them, the real cause (a size computed from the data)."""
        if not self.options.get("input_shapes"):
            return "build with --input-shape to fix it"
        return ("the input shapes are fixed, but this size depends on the input's values (data-dependent "
                "output, or shape arithmetic the builder could not fold)")

    # --- values -------------------------------------------------------------
    @staticmethod
    def shape(value: ir.Value | None) -> tuple | None:
        """Dims as ints (known) or None (symbolic/unknown); None when the rank is unknown."""
        if value is None or value.shape is None:
            return None
        return tuple(d if isinstance(d, int) and d >= 0 else None for d in value.shape)

    @staticmethod
    def static_shape(value: ir.Value | None) -> tuple | None:
        """The shape when every dim is a known int, else None."""
        return irh.static_shape(value)

    @staticmethod
    def rank(value: ir.Value | None) -> int | None:
        if value is None or value.shape is None:
            return None
        return len(value.shape)

    @staticmethod
    def dtype(value: ir.Value | None) -> np.dtype | None:
        if value is None or value.dtype is None:
            return None
        return ONNX_TO_NUMPY.get(int(value.dtype.value))

    def numel(self, value: ir.Value | None) -> int | None:
        s = self.static_shape(value)
        return None if s is None else int(np.prod(s, dtype=np.int64))

    def const(self, value: ir.Value | None) -> np.ndarray | None:
        """The constant array behind ``value`` (initializer, Constant output or ConstantOfShape of a constant
        shape), else None."""
        if value is None:
            return None
        key = id(value)
        if key not in self._const_cache:
            self._const_cache[key] = _const_array(value)
        return self._const_cache[key]


def _filled_constant(value: ir.Value) -> tuple | None:
    """``(shape, fill)`` when ``value`` is made by a ConstantOfShape of a constant shape, else None.

    Constant folding keeps such a node when its result is large (``fold_size_limit``: a few bytes of
    graph stay a few bytes in the artifact; onnx's "light" model zoo makes every weight so).  For a
    provider program it is a constant like any other: the program embeds the filled array, as it
    embeds initializers, and the node itself lowers to nothing (ConstantOfShape rules)."""
    producer = value.producer()
    if (producer is None or producer.domain not in ("", "ai.onnx") or producer.op_type != "ConstantOfShape"
            or not producer.inputs or producer.inputs[0] is None):
        return None
    shape = _const_array(producer.inputs[0])
    if shape is None or shape.ndim != 1 or shape.dtype.kind not in "iu" or (shape < 0).any():
        return None
    attr = producer.attributes.get("value")
    try:
        fill = np.asarray(attr.value.numpy()).reshape(-1)[:1] if attr is not None else np.zeros(1, np.float32)
    except Exception:  # noqa: BLE001 - a malformed value attribute: not a constant we can embed
        return None
    if fill.size != 1:
        return None
    return tuple(int(d) for d in shape), fill


def _is_constant(value: ir.Value) -> bool:
    """Whether ``value`` is a constant to a provider program (:func:`_const_array` without making it)."""
    if value.is_graph_input():
        return False
    return value.const_value is not None or _filled_constant(value) is not None or _const_array(value) is not None


def _const_array(value: ir.Value) -> np.ndarray | None:
    if value.is_graph_input():
        return None
    filled = _filled_constant(value) if value.const_value is None else None
    if filled is not None:
        shape, fill = filled
        return np.full(shape, fill[0], dtype=fill.dtype)
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.domain not in ("", "ai.onnx") or producer.op_type != "Constant":
            return None
        try:
            tensor = ir.convenience.get_const_tensor(value)
        except Exception:  # noqa: BLE001 - malformed Constant
            return None
        if tensor is None:
            return None
    try:
        return np.asarray(tensor.numpy())
    except Exception:  # noqa: BLE001 - external data, exotic dtypes
        return None


class ProviderSpec:
    """Base class of a provider's builder-side description (see the module docstring)."""

    name: str = ""
    # Cost model parameters (FLOP-equivalents); back ends may override.
    copy_cost_per_element: float = 8.0  # copy + layout change of one element at a boundary
    dispatch_cost: float = 2.0e5  # fixed cost of one provider call
    boundary_ratio: float = 1.0  # keep when flops >= boundary_ratio * boundary cost
    min_flops: float = 1.0e6  # below this a partition is not worth a provider call

    def builder_available(self, ctx: SupportContext) -> tuple[bool, str]:
        return True, ""

    def supports(self, node: ir.Node, ctx: SupportContext) -> tuple[bool, str]:
        return False, f"{self.name} supports no operators"

    def node_cost(self, node: ir.Node, ctx: SupportContext) -> float:
        from minirt.targets.flops import node_flops

        return node_flops(node, ctx)

    def boundary_cost(self, value: ir.Value, ctx: SupportContext) -> float:
        n = ctx.numel(value)
        return self.copy_cost_per_element * (n if n is not None else 1024)

    def keep_partition(self, partition: PartitionIR, flops: float, boundary: float, ctx: SupportContext) -> tuple[bool, str]:
        total = boundary + self.dispatch_cost
        if flops > 0 and _is_whole_model(partition):
            # Not an island: the partition takes the model's inputs and makes its
            # outputs, so no CPU work sits on either side of it to save a copy for.
            return True, ""
        if flops < self.min_flops:
            return False, (
                f"{self.name} island too small: {len(partition.nodes)} node(s), {flops / 1e6:.2f} MFLOPs "
                f"< {self.min_flops / 1e6:.2f} MFLOPs minimum"
            )
        if flops < self.boundary_ratio * total:
            return False, (
                f"{self.name} island not worth its boundary: {flops / 1e6:.2f} MFLOPs of compute vs "
                f"{total / 1e6:.2f} MFLOP-equivalents of copies/layout changes"
            )
        return True, ""

    def lower(self, partition: PartitionIR, ctx: SupportContext) -> tuple[bytes, dict]:
        raise LoweringError(f"{self.name} cannot lower partitions")


def _is_whole_model(partition: PartitionIR) -> bool:
    return all(v.is_graph_input() for v in partition.inputs) and all(v.is_graph_output() for v in partition.outputs)


_specs: dict[str, ProviderSpec] = {}
_registered: dict[str, ProviderSpec] = {}


def register_spec(spec: ProviderSpec) -> None:
    """Register a spec instance at run time (tests, plug-ins); it shadows the built-in table."""
    _registered[spec.name] = spec


def unregister_spec(name: str) -> None:
    _registered.pop(name, None)


def get_spec(name: str) -> ProviderSpec:
    """The :class:`ProviderSpec` for provider ``name``.

    Raises :class:`ProviderNotOffered` (with the reason) when the provider is
    unknown or its back-end module cannot be imported.
    """
    if name in _registered:
        return _registered[name]
    if name in _specs:
        return _specs[name]
    target = SPEC_CLASSES.get(name)
    if target is None:
        raise ProviderNotOffered(f"the builder knows no provider called {name!r} (known: {sorted(SPEC_CLASSES)})")
    module_name, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise ProviderNotOffered(f"builder back end {target} for {name!r} is not installed ({exc})") from None
    _specs[name] = spec = cls()
    return spec
