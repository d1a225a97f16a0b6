"""``build()``: ONNX in, .mrt out, with a report of what happened.

The pipeline, one way only::

    load (checker, shape inference, onnx-ir)
      -> normalise (inline functions, name every value, topological order)
      -> check support (every node has a CPU kernel at its opset)
      -> lower to format records -> encode -> atomic write

Later stages (graph optimisation, quantisation, provider partitioning) slot
in between "normalise" and "check support"; their options are accepted and
validated here and recorded in the artifact's metadata.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx_ir as ir
from onnx_ir.passes import common as ir_passes

import minirt
from minirt.builder.errors import BuildError, UnsupportedModel
from minirt.builder.feasible_branches import derive_pins as derive_branch_pins
from minirt.builder.ir_helpers import has_subgraph, subgraphs
from minirt.builder.load import SourceInfo, load_model
from minirt.builder.lower import lower_model
from minirt.builder.partition import apply_plan, drop_cpu_versions, plan_partitions
from minirt.tools.reports import format_partition_report
from minirt.builder.passes import format_report
from minirt.builder.passes import optimize as optimize_graph
from minirt.builder.passes import pass_names as optimizer_pass_names
from minirt.builder.quantize import QuantizeOptions
from minirt.builder.quantize import quantize as quantize_model
from minirt.builder.weight_shapes import check_weight_shapes
from minirt.builder.quantize.passes import pass_names as quantizer_pass_names
from minirt.builder.prepack import add_packed_weights
from minirt.builder.writer import ArtifactWriter, write_atomic
from minirt.format.packed_weights import PANEL_WIDTHS
from minirt.kernels.registry import lookup
from minirt.tools.timing import fmt_bytes
from minirt.vocabulary import ACCELERATORS, CPU
from minirt.targets.profiles import get_target

PRODUCER_NAME = "minirt-builder"
# auto: what the target profile says is faster (its default mode, kept when its cost model estimates it
# faster than float); "none": float32 even on a target whose profile would quantize (None: "auto" on
# such a target, float32 elsewhere)
QUANTIZE_MODES = (None, "none", "fp16", "int4", "int8-dynamic", "int8", "auto")
OPT_LEVELS = (0, 1, 2, 3)


@dataclasses.dataclass
class BuildReport:
    """What a build did; ``str(report)`` is the short summary the CLI prints."""

    source: str
    output: str | None
    target: str
    opt_level: int
    quantize: str | None
    source_sha256: str
    source_bytes: int
    artifact_bytes: int
    weight_bytes: int
    nodes_before: int
    nodes_after: int
    op_histogram: dict
    inputs: list
    outputs: list
    timings: dict  # phase -> seconds
    warnings: list = dataclasses.field(default_factory=list)
    optimizer: dict = dataclasses.field(default_factory=dict)  # per-pass rows (builder.passes)
    quantization: dict = dataclasses.field(default_factory=dict)  # builder.quantize report
    partitions: dict = dataclasses.field(default_factory=dict)  # builder.partition plan report

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [
            f"built {self.output or '<bytes>'} from {self.source}",
            f"  target {self.target}, opt-level {self.opt_level}, quantize {self.quantize or 'none'}",
            f"  nodes {self.nodes_before} -> {self.nodes_after}; weights {fmt_bytes(self.weight_bytes)}; "
            f"artifact {fmt_bytes(self.artifact_bytes)} (source {fmt_bytes(self.source_bytes)})",
            "  inputs:  " + ", ".join(f"{n} {t}{s}" for n, t, s in self.inputs),
            "  outputs: " + ", ".join(f"{n} {t}{s}" for n, t, s in self.outputs),
            "  time: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in self.timings.items()),
        ]
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.partitions:
            lines += format_partition_report(self.partitions)
        if self.optimizer:
            lines.append(format_report(self.optimizer))
        if getattr(self, "_quantization_text", ""):
            lines.append(self._quantization_text)
        return "\n".join(lines)


def parse_input_shapes(specs: Mapping[str, Any] | list[str] | None) -> dict[str, tuple]:
    """``{"x": (1, 3, 224, 224)}`` or ``["x=1x3x224x224"]`` -> ``{"x": (1, 3, 224, 224)}``."""
    if not specs:
        return {}
    if isinstance(specs, Mapping):
        items = list(specs.items())
    else:
        items = []
        for spec in specs:
            name, sep, dims = str(spec).rpartition("=")
            if not sep or not name:
                raise BuildError(f"--input-shape {spec!r}: expected NAME=DIMxDIMx..., e.g. image=1x3x224x224")
            # (1x3x224x224, or with commas as numpy prints shapes: 1,3,224,224)
            items.append((name, dims.replace(",", "x").split("x") if dims.strip("[]()") else []))
    out = {}
    for name, dims in items:
        try:
            shape = tuple(int(d) for d in dims)
        except (TypeError, ValueError):
            raise BuildError(f"input shape for {name!r}: {dims!r} is not a list of integers") from None
        if any(d < 0 for d in shape):
            raise BuildError(f"input shape for {name!r}: dimensions must be >= 0, got {shape}")
        out[name] = shape
    return out


# Most elements an input may be pinned to (--input-value): the values are stored in the metadata.
PIN_MAX_ELEMENTS = 4096


def parse_input_values(specs: Mapping[str, Any] | list[str] | None) -> dict[str, Any]:
    """``{"sr": 16000}`` or ``["sr=16000", "ids=1,2,3", "mask=mask.npy"]`` -> name -> value (array-like)."""
    if not specs:
        return {}
    if isinstance(specs, Mapping):
        return dict(specs)
    out: dict[str, Any] = {}
    for spec in specs:
        name, sep, text = str(spec).partition("=")
        if not sep or not name or not text:
            raise BuildError(f"--input-value {spec!r}: expected NAME=VALUE[,VALUE...] or NAME=FILE.npy, e.g. sr=16000")
        if text.endswith(".npy"):
            try:
                out[name] = np.load(text, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise BuildError(f"--input-value {name}: cannot read {text!r}: {exc}") from None
            continue
        try:
            numbers = [float(v) if any(c in v for c in ".eEn") else int(v) for v in text.split(",")]
        except ValueError:
            raise BuildError(f"--input-value {name}: {text!r} is not a number or a comma-separated list of numbers") from None
        out[name] = numbers[0] if len(numbers) == 1 else numbers
    return out


def _pin_input_values(model: ir.Model, values: Mapping[str, Any]) -> dict:
    """Fix inputs to known values (``--input-value``): every reader of such an input reads a constant
    instead, so the optimizer folds what depends on it (an ``If`` on the sample rate, shape arithmetic).
    The input stays a graph input, which nothing reads: callers keep feeding it, and the runtime checks
    that they feed the pinned value.  Returns the metadata entry: name -> dtype, shape, values."""
    by_name = {v.name: v for v in model.graph.inputs}
    pinned = {}
    for name, value in values.items():
        inp = by_name.get(name)
        if inp is None:
            raise BuildError(f"--input-value names {name!r}, but the model's inputs are {list(by_name)}")
        if inp.dtype is None:
            raise BuildError(f"--input-value {name}: the model does not declare the input's element type")
        dtype = inp.dtype.numpy()
        try:
            arr = np.asarray(value, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise BuildError(f"--input-value {name}: {value!r} is not a {dtype} value: {exc}") from None
        if arr.size > PIN_MAX_ELEMENTS:
            raise BuildError(f"--input-value {name}: {arr.size} elements; at most {PIN_MAX_ELEMENTS} can be pinned")
        declared = inp.shape
        if declared is not None:
            dims = list(declared)
            if arr.ndim != len(dims) and not (arr.size == 1 and math.prod(d if isinstance(d, int) else 1
                                                                          for d in dims) == 1):
                raise BuildError(f"--input-value {name}: shape {list(arr.shape)} does not match the input's "
                                 f"rank {len(dims)} (shape {dims})")
            arr = arr.reshape([d if isinstance(d, int) else 1 for d in dims]) if arr.ndim != len(dims) else arr
            for axis, (want, got) in enumerate(zip(dims, arr.shape)):
                if isinstance(want, int) and want != got:
                    raise BuildError(f"--input-value {name}: dimension {axis} is {want} in the model, the value has {got}")
        inp.shape = ir.Shape(arr.shape)
        const = ir.Value(name=f"{name}__pinned", shape=ir.Shape(arr.shape), type=inp.type,
                         const_value=ir.tensor(arr, name=f"{name}__pinned"))
        model.graph.register_initializer(const)
        for node, index in list(inp.uses()):
            node.replace_input_with(index, const)
        pinned[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape), "values": arr.reshape(-1).tolist()}
    return pinned


_BUILD_PROVIDERS = (*ACCELERATORS, CPU)  # the provider table's names (minirt/vocabulary.py), the CPU last


def _parse_providers(providers: Sequence[str] | str) -> tuple:
    """``"tflite,cpu"`` or a list -> the provider priority tuple, the CPU always last."""
    names = [p.strip() for p in providers.split(",")] if isinstance(providers, str) else [str(p) for p in providers]
    unknown = [p for p in names if p not in _BUILD_PROVIDERS]
    if unknown or not names:
        raise BuildError(f"--providers {names}: expected names from {list(_BUILD_PROVIDERS)}, e.g. tflite,cpu")
    ordered = [p for p in dict.fromkeys(names) if p != CPU]
    return (*ordered, CPU)


def _normalise(model: ir.Model) -> None:
    """Make the IR well-formed for lowering: no functions, named values, sorted nodes."""
    for p in (ir_passes.InlinePass(), ir_passes.NameFixPass(), ir_passes.TopologicalSortPass()):
        p(model)


def _apply_input_shapes(model: ir.Model, shapes: dict[str, tuple]) -> None:
    by_name = {v.name: v for v in model.graph.inputs}
    for name, shape in shapes.items():
        value = by_name.get(name)
        if value is None:
            raise BuildError(f"--input-shape names {name!r}, but the model's inputs are {list(by_name)}")
        if value.shape is not None:
            if len(value.shape) != len(shape):
                raise BuildError(
                    f"--input-shape {name}: rank {len(shape)} does not match the model's rank {len(value.shape)} "
                    f"(shape {value.shape})"
                )
            for axis, (old, new) in enumerate(zip(value.shape, shape)):
                if isinstance(old, int) and old >= 0 and old != new:
                    raise BuildError(f"--input-shape {name}: dimension {axis} is fixed to {old} in the model, got {new}")
        value.shape = ir.Shape(shape)


def _iter_nodes(graph: ir.Graph):
    for node in graph:
        yield node
        for body in subgraphs(node):
            yield from _iter_nodes(body)


def check_support(model: ir.Model) -> None:
    """Every node (subgraphs included) has a CPU kernel; otherwise one error listing them all."""
    problems = []
    for node in _iter_nodes(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = node.version if node.version is not None else model.opset_imports.get(domain, model.opset_imports.get("ai.onnx"))
        if opset is None:
            problems.append(f"node {node.name!r}: domain {domain!r} of {node.op_type} has no opset import")
            continue
        entry = lookup(domain, node.op_type, opset)
        if entry is None:
            problems.append(
                f"node {node.name!r}: operator {domain or 'ai.onnx'}::{node.op_type} at opset {opset} "
                f"is not supported by any provider (cpu has no kernel for it)"
            )
            continue
        if entry.attributes is not None:
            unknown = sorted(set(node.attributes) - entry.attributes)
            if unknown:
                problems.append(
                    f"node {node.name!r}: {node.op_type} attribute(s) {unknown} are not supported by the cpu kernel"
                )
    if problems:
        shown = problems[:20]
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise UnsupportedModel("the model cannot be built:\n  " + "\n  ".join(shown) + more)


def _value_signature(values) -> list:
    out = []
    for v in values:
        dtype = v.dtype.name.lower() if v.dtype is not None else "undefined"
        shape = "" if v.shape is None else "[" + ",".join(_fmt_dim(d) for d in v.shape) + "]"
        out.append((v.name, dtype, shape))
    return out


def _fmt_dim(d) -> str:
    if isinstance(d, int):
        return str(d) if d >= 0 else "?"
    sym = getattr(d, "value", None)
    return sym if isinstance(sym, str) and sym else "?"


def _count_nodes(model: ir.Model) -> int:
    return sum(1 for _ in _iter_nodes(model.graph))


def _metadata(writer: ArtifactWriter, info: SourceInfo, options: dict, profile) -> None:
    writer.set_metadata("producer.name", PRODUCER_NAME)
    writer.set_metadata("producer.version", minirt.__version__)
    writer.set_metadata("source.sha256", info.sha256)
    writer.set_metadata("source.bytes", info.size)
    if info.path:
        writer.set_metadata("source.file", os.path.basename(info.path))
    writer.set_metadata("source.producer_name", info.producer_name)
    writer.set_metadata("source.producer_version", info.producer_version)
    writer.set_metadata("source.ir_version", info.ir_version)
    writer.set_metadata("source.opsets", info.opsets)
    writer.set_metadata("source.graph_name", info.graph_name)
    writer.set_metadata("source.model_version", info.model_version)
    if info.doc_string:
        writer.set_metadata("source.doc_string", info.doc_string)
    if info.metadata_props:
        writer.set_metadata("source.metadata_props", info.metadata_props)
    writer.set_metadata("target.name", profile.name)
    writer.set_metadata("target.providers", list(profile.providers))
    writer.set_metadata("build.options", options)


# What a build measures about itself: the passes' and phases' seconds, and the quantized model's latency
# timed on the build machine.  They are in the BuildResult and its printed report, not in the artifact:
# one model built with the same options and builder gives the same bytes, whenever and in whichever
# process it is built (D174; the build time is not stored either).
_MEASURED_KEYS = frozenset({"seconds", "timings", "latency"})


def _without_measurements(value):
    """``value`` (a report as JSON-like dicts and lists) without the keys of :data:`_MEASURED_KEYS`."""
    if isinstance(value, dict):
        return {k: _without_measurements(v) for k, v in value.items() if k not in _MEASURED_KEYS}
    if isinstance(value, list):
        return [_without_measurements(v) for v in value]
    return value


def _optimizer_metadata(report: dict) -> dict:
    """The optimizer report as the artifact keeps it: only the passes that changed the graph or refused a
    match (the others are named in ``pipeline``), so a small model's artifact does not carry ~2 KB of
    rows of zeros (digits: 2.5 KB of a 57 KB int8 artifact); no timings (D174)."""
    rows = [row for row in report.get("passes", []) if row.get("changed_runs") or row.get("refused")]
    return _without_measurements({**report, "passes": rows})


def _split_disabled(disabled: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--disable-pass`` names -> (the optimizer's, the quantizer's); a clear error for unknown names."""
    optimizer, quantizer = optimizer_pass_names(), quantizer_pass_names()
    unknown = sorted(set(disabled) - set(optimizer) - set(quantizer))
    if unknown:
        raise BuildError(f"--disable-pass: unknown pass name(s) {unknown}; known passes: optimizer {optimizer}, "
                         f"quantizer {quantizer}")
    return [n for n in disabled if n in optimizer], [n for n in disabled if n in quantizer]


def _quantized_anything(report) -> bool:
    """Whether a quantization report changed any layer in its mode: int8 compute or int8 storage for the
    int8 modes (the float16 storage of their small kept-float weights, D174, is not an int8 layer), fp16
    storage for fp16, 4-bit blocks for int4."""
    if report.mode == "fp16":
        return bool((report.fp16 or {}).get("initializers"))
    if report.mode == "int4":
        return bool((report.int4 or {}).get("layers"))
    return bool(report.quantized or report.weight_only)


def _nothing_quantized_reason(model_ir, report, mode: str) -> str:
    """Why a quantization changed nothing, in one line: every candidate kept float (and the first
    reasons), or none found (no layer the mode covers, in the main graph nor in control-flow bodies)."""
    if report.kept_float:
        shown = "; ".join(f"{k['node']}: {k['reason']}" for k in report.kept_float[:3])
        more = f" (and {len(report.kept_float) - 3} more)" if len(report.kept_float) > 3 else ""
        return f"nothing was quantized: all {len(report.kept_float)} candidate layer(s) kept float ({shown}{more})"
    what = "large float32 initializers (>= 1024 elements)" if mode == "fp16" else \
        "MatMul or Gemm layers with a constant float32 weight of at least 4096 values" if mode == "int4" else \
        "Conv, ConvTranspose, MatMul, Gemm or recurrent layers with constant weights"
    bodies = sorted({n.op_type for n in model_ir.graph if has_subgraph(n)})
    where = f" (its {'/'.join(bodies)} bodies included)" if bodies else ""
    return f"nothing was quantized: the model{where} has no {what}"


def _auto_quantize(profile, calibration: Any, model_ir, say: Callable[[str], None]) -> str | None:
    """``--quantize auto``: the target profile's default quantization (None: float32) when its cost model
    estimates it faster than float on this model (at most ``int8_worth_ratio`` x float latency), else
    float32; the profile's "int8" becomes "int8-dynamic" when there is no calibration data to fix the
    activation ranges.  A model without sized layers (dynamic shapes) keeps the profile's default."""
    from minirt.builder.quantize import estimate_mode

    mode = profile.build_defaults()["quantize"]
    if mode == "int8" and calibration is None:
        say(f"--quantize auto: {profile.name} defaults to int8, but without --calibration data int8-dynamic is used")
        mode = "int8-dynamic"
    if mode in ("int8", "int8-dynamic"):
        est = estimate_mode(model_ir, mode, profile)
        if est is None:
            say(f"--quantize auto: no estimate of {mode} (no layer it would compute in int8 has a known size: "
                f"dynamic shapes, or every layer kept float); {profile.name}'s default {mode} is kept")
        elif est.ratio > profile.int8_worth_ratio:
            say(f"--quantize auto: {mode} is estimated at {est.ratio:.2f}x float latency on {profile.name} "
                f"(its cost model; at most {profile.int8_worth_ratio}x pays): float32")
            return None
        else:
            say(f"--quantize auto: {mode} is estimated at {est.ratio:.2f}x float latency on {profile.name}")
    say(f"--quantize auto: {mode or 'no quantization (float32)'} for target {profile.name}")
    return mode


def build(
    model: Any,
    out_path: str | os.PathLike | None = None,
    *,
    target: str = "generic",
    opt_level: int = 2,
    disabled_passes: Sequence[str] = (),
    input_shapes: Mapping[str, Any] | list[str] | None = None,
    input_values: Mapping[str, Any] | list[str] | None = None,
    quantize: str | None = None,
    calibration: Any = None,
    calibration_method: str = "minmax",
    per_channel: bool = True,
    symmetric_activations: bool = False,
    accuracy_budget: str | None = None,
    eval_data: Any = None,
    quantize_final: bool = True,
    block_size: int = 32,
    symmetric_weights: bool = True,
    allow_float_fallback: bool = False,
    progress: Callable[[str], None] | None = None,
    sign_key: str | os.PathLike | bytes | None = None,
    providers: Sequence[str] | str | None = None,
    weight_pack: int | None = None,
    cpu_fallback: bool = True,
    coreml_precision: str | None = None,
    compress_sections: bool = True,
) -> BuildReport:
    """Build ``model`` (path, bytes or ModelProto) into a .mrt artifact.

    Writes ``out_path`` atomically (nothing is left behind on failure).  With
    ``out_path=None`` the artifact is only kept in memory: see :func:`build_bytes`.
    Returns a :class:`BuildReport`; the artifact bytes are in ``report.data``
    (not part of ``as_dict()``).

    ``input_values``: inputs fixed to a value (``{"sr": 16000}`` or ``["sr=16000"]``): the graph is
    specialised for it (folded branches and shapes) and the runtime refuses other values.

    ``allow_float_fallback``: with an explicit ``quantize`` mode, a model in which nothing would be
    quantized (no layer the mode covers, or all of them kept float) is built float with a warning
    instead of failing; ``quantize="auto"`` always falls back so.

    ``weight_pack``: store the native kernels' packed weights for panels of this many output
    channels (8: arm64 NEON and x86 SSE2, 16: AVX2, 32: AVX-512; 0: none), so that a runtime with
    that layout packs nothing on the first run (builder/prepack.py); None: the target's default
    (``weight_pack`` of targets/profiles.py: 8 on the Raspberry Pi targets, else 0).

    ``block_size`` / ``symmetric_weights`` (``quantize="int4"``): the K values one 4-bit scale covers and
    whether the weights are symmetric (zero point 8) or get a zero point per block (MatMulNBits).

    ``compress_sections=False`` (``--uncompressed``): every section stored as it is, a format-version-1
    file that runtimes reading only version 1 load; by default the operators, graph and tensor table are
    zlib streams once they pass 4 KiB (format version 2, docs/format.md; the metadata never is).

    ``cpu_fallback=False`` (``--no-cpu-fallback``): a thin accelerator artifact: each partition keeps
    its provider program and golden tensors but not its CPU version (its nodes and the weights only
    they read); a session where the provider cannot run it refuses the artifact at load.

    ``coreml_precision`` (``--coreml-precision``): "fp16" or "fp32", the compute precision of the Core ML
    programs (None: the target's, fp16 on macos / ios); fp32 where activations leave float16's range
    (``minirt verify`` reports an overflowing program).
    """
    say = progress or (lambda msg: None)
    if opt_level not in OPT_LEVELS:
        raise BuildError(f"opt_level must be one of {OPT_LEVELS}, got {opt_level!r}")
    if quantize not in QUANTIZE_MODES:
        raise BuildError(f"quantize must be one of {[m for m in QUANTIZE_MODES if m]}, got {quantize!r}")
    try:
        profile = get_target(target)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    if providers is not None:
        profile = dataclasses.replace(profile, providers=_parse_providers(providers))
    cpu_only = all(p == CPU for p in profile.providers)  # (no accelerator provider on this target)
    if coreml_precision not in (None, "fp16", "fp32"):
        raise BuildError(f"coreml_precision must be 'fp16' or 'fp32', got {coreml_precision!r}")
    # (the Core ML provider's option, recorded in build.options too; absent: the target's precision)
    precision_option = {"coreml_precision": coreml_precision} if coreml_precision else {}
    if not cpu_fallback and cpu_only:  # (said before the slow part)
        raise BuildError(f"--no-cpu-fallback: target {profile.name!r} has no accelerator provider "
                         f"({', '.join(profile.providers)}); there is no CPU fallback to leave out")
    if weight_pack is None:
        weight_pack = profile.build_defaults()["weight_pack"]
    if weight_pack and weight_pack not in PANEL_WIDTHS:
        raise BuildError(f"weight_pack must be 0 (off) or a panel width in {PANEL_WIDTHS}, got {weight_pack!r}")
    # Mistakes found before the (possibly long) build: a model file, an output folder, calibration or eval
    # data that is not there.
    if isinstance(model, (str, os.PathLike)) and not os.path.exists(model):
        raise BuildError(f"{os.fspath(model)}: no such file")
    if out_path is not None:
        out_dir = os.path.dirname(os.path.abspath(os.fspath(out_path)))
        if not os.path.isdir(out_dir):
            raise BuildError(f"output folder {out_dir} does not exist")
    for what, data in (("--calibration", calibration), ("--eval", eval_data)):
        if isinstance(data, (str, os.PathLike)) and not os.path.exists(data):
            raise BuildError(f"{what} {os.fspath(data)}: no such file or folder")
    if quantize is None and profile.build_defaults()["quantize"] is not None:
        quantize = "auto"  # the target's choice unless the user made one ("none": float32)
        say(f"no --quantize: target {profile.name} chooses (--quantize none builds float32)")
    auto_quantize = quantize == "auto"
    if quantize == "none":
        quantize = None
    shapes = parse_input_shapes(input_shapes)
    values = parse_input_values(input_values)
    optimizer_disabled, quantizer_disabled = _split_disabled(disabled_passes)
    seed = None
    if sign_key is not None:  # read the key first: a bad key file fails before the slow build
        from minirt.format.keys import load_signing_key

        try:
            seed = load_signing_key(sign_key)
        except minirt.Error as exc:
            raise BuildError(f"signing key: {exc}") from None
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    say("loading model")
    model_ir, info = load_model(model)
    timings["load"] = time.perf_counter() - t0
    nodes_before = _count_nodes(model_ir)

    t0 = time.perf_counter()
    say("normalising graph")
    branch_pins = []
    if shapes:
        # (an If that only one branch can take with these shapes: its input pinned as --input-value would)
        branch_pins = derive_branch_pins(model_ir, shapes, values, say)
        values.update({pin.name: pin.value for pin in branch_pins})
        _apply_input_shapes(model_ir, shapes)
    pinned = _pin_input_values(model_ir, values) if values else {}
    for pin in branch_pins:
        pinned[pin.name]["reason"] = pin.reason
    _normalise(model_ir)
    timings["normalise"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    say("optimizing graph")
    try:
        opt_report = optimize_graph(model_ir, opt_level, disabled=optimizer_disabled, input_shapes=shapes,
                                    cpu_only=cpu_only)
    except ValueError as exc:  # unknown pass name, input shape that contradicts the model
        raise BuildError(str(exc)) from None
    try:  # (a wrong --input-shape met a layer's weights: say so now, not at calibration or the first run)
        check_weight_shapes(model_ir, shapes)
    except ValueError as exc:
        raise BuildError(f"{info.path or 'model'}: {exc}") from None
    timings["optimize"] = time.perf_counter() - t0
    # The work of one run, for the runtime's warm-up rule (minirt/session.py, D90): the float graph's
    # (a quantized one does less), control-flow bodies not counted (a runtime does not warm those up).
    from minirt.targets.flops import graph_flops  # (targets.flops imports the builder's helpers)

    flops = graph_flops(model_ir.graph)

    if auto_quantize:  # (decided on the optimized graph: its layers and shapes are the ones to estimate)
        quantize = _auto_quantize(profile, calibration, model_ir, say)
    qreport = None
    if quantize is not None:
        t0 = time.perf_counter()
        say(f"quantizing ({quantize})")
        qreport = quantize_model(
            model_ir,
            quantize,
            calibration,
            QuantizeOptions(
                method=calibration_method,
                per_channel=per_channel,
                symmetric_activations=symmetric_activations,
                accuracy_budget=accuracy_budget,
                eval=eval_data,
                quantize_final=quantize_final,
                disabled_passes=quantizer_disabled,
                int4_block_size=block_size,
                int4_symmetric=symmetric_weights,
            ),
            progress=say,
            target=profile,  # its int8 speed rules (which layers stay float because float is faster there)
        )
        timings["quantize"] = time.perf_counter() - t0
        if not _quantized_anything(qreport):
            why = _nothing_quantized_reason(model_ir, qreport, quantize)
            if not (allow_float_fallback or auto_quantize):
                raise BuildError(f"--quantize {quantize}: {why}; the artifact would be the float model. Pass "
                                 f"--allow-float-fallback to build it float anyway")
            qreport.warnings.append(f"{why}: the artifact is the float model")
            say(f"warning: --quantize {quantize}: {why}: the artifact is the float model")

    t0 = time.perf_counter()
    check_support(model_ir)
    timings["check"] = time.perf_counter() - t0

    plan = None
    if any(p != CPU for p in profile.providers):
        t0 = time.perf_counter()
        say("partitioning for providers " + ", ".join(p for p in profile.providers if p != CPU))
        # (the source model too: the partitions' golden outputs come from onnxruntime on it, fed the
        # pinned inputs' values, which the built graph no longer takes as inputs)
        pinned_feeds = {name: np.asarray(p["values"], dtype=p["dtype"]).reshape(p["shape"]) for name, p in pinned.items()}
        plan = plan_partitions(model_ir, profile, {"input_shapes": shapes, "source": model,  # reorders model_ir.graph
                                                   "pinned": pinned_feeds, **precision_option})
        timings["partition"] = time.perf_counter() - t0
        if not cpu_fallback:
            if plan.partitions:
                dropped = drop_cpu_versions(model_ir, plan)
                plan.notes.append(f"no CPU fallback (--no-cpu-fallback): the partitions' CPU versions are not "
                                  f"stored ({dropped / 2**20:.1f} MiB of weights left out)")
            else:
                plan.notes.append("--no-cpu-fallback: no partition to build without its CPU version")

    t0 = time.perf_counter()
    say("writing artifact")
    writer = ArtifactWriter(compress_sections=compress_sections)
    options = {
        "target": profile.name,
        "providers": list(profile.providers),
        "opt_level": opt_level,
        "input_shapes": {k: list(v) for k, v in shapes.items()},
        "quantize": quantize,
        "calibration_method": calibration_method if quantize else None,
        "per_channel": per_channel if quantize else None,
        **({"block_size": block_size, "symmetric_weights": symmetric_weights} if quantize == "int4" else {}),
        "accuracy_budget": accuracy_budget,
        "disabled_passes": list(disabled_passes),
        "signed": sign_key is not None,
        "weight_pack": weight_pack,
        "cpu_fallback": cpu_fallback,
        **precision_option,
    }
    _metadata(writer, info, options, profile)
    # The device's CPU facts and the defaults derived from them (targets/profiles.py).
    writer.set_metadata("target.profile", profile.as_metadata())
    if pinned:
        writer.set_metadata("pinned_inputs", pinned)  # (the runtime checks that feeds hold these values)
    writer.set_metadata("build.optimizer", _optimizer_metadata(opt_report.as_dict()))
    writer.set_metadata("build.flops", float(flops))
    if qreport is not None:
        stored = _without_measurements(qreport.as_dict())
        if stored.get("passes"):
            stored["passes"] = _optimizer_metadata(stored["passes"])
        writer.set_metadata("build.quantization", stored)
    lower_model(model_ir, writer)
    if plan is not None:
        apply_plan(plan, writer)  # provider blobs, golden tensors, partition records, build.partitions
    if weight_pack:  # (after the partitions: their CPU versions are not packed, see add_packed_weights)
        say(f"packing weights for panels of {weight_pack}")
        add_packed_weights(writer, weight_pack)
    data = writer.to_bytes(sign_key=seed)
    if out_path is not None:
        out_dir = os.path.dirname(os.path.abspath(os.fspath(out_path)))
        if not os.path.isdir(out_dir):
            raise BuildError(f"output folder {out_dir} does not exist")
        if os.path.isdir(out_path):
            raise BuildError(f"output path {os.fspath(out_path)} is a directory; give a file name such as model.mrt")
        write_atomic(data, out_path)
    timings["write"] = time.perf_counter() - t0

    hist = collections.Counter(n.op_type for n in _iter_nodes(model_ir.graph))
    report = BuildReport(
        source=info.path or "<in-memory model>",
        output=os.fspath(out_path) if out_path is not None else None,
        target=profile.name,
        opt_level=opt_level,
        quantize=quantize,
        source_sha256=info.sha256,
        source_bytes=info.size,
        artifact_bytes=len(data),
        weight_bytes=sum(t.nbytes for t in writer.tensors if t.dtype != object),
        nodes_before=nodes_before,
        nodes_after=_count_nodes(model_ir),
        op_histogram=dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0]))),
        inputs=_value_signature(model_ir.graph.inputs),
        outputs=_value_signature(model_ir.graph.outputs),
        timings=timings,
        optimizer=opt_report.as_dict(),
        partitions=plan.report() if plan is not None else {},
        quantization=qreport.as_dict() if qreport is not None else {},
        warnings=list(qreport.warnings) if qreport is not None else [],
    )
    report._quantization_text = str(qreport) if qreport is not None else ""  # type: ignore[attr-defined]
    report.data = data  # type: ignore[attr-defined]
    return report


def build_bytes(model: Any, **options: Any) -> bytes:
    """Build ``model`` and return the artifact's bytes without writing a file."""
    return build(model, None, **options).data  # type: ignore[attr-defined]
