"""Quantization: fp16 and int8 artifacts, with an accuracy report and an accuracy budget.

One entry point, :func:`quantize`, runs on the builder's IR *after* the graph
optimizer and before lowering (the optimizer would fold fp16 Casts back, and
int8 lowering matches the fused ops it produces)::

    report = quantize(model_ir, "int8", calibration, QuantizeOptions(...))

Modes:

``fp16``          float32 weights stored as float16 + a conversion to float32 (half the
                  weight bytes; kernels compute in float32).
``int8``          static: Conv/Gemm/MatMul layers become ``com.minirt::QConv`` /
                  ``QMatMul`` with per-channel symmetric int8 weights and a
                  per-tensor calibrated activation scale.
``int8-dynamic``  the same ops without activation scales: inputs are quantized at
                  run time (for MatMul/Gemm/LSTM-heavy models; no calibration).
``int4``          MatMul/Gemm weights as 4-bit blocks along K (``com.microsoft::MatMulNBits``,
                  block size and symmetric / asymmetric chosen by the user): a float
                  decoder export made int4 as onnxruntime-genai's builder makes it.

Which layers are candidates is candidates.py; which of them are quantized is
decided here (the user's options, and the target profile's int8 speed rules:
targets/profiles.py); the graph rewrites are passes (builder/quantize/passes:
``quant_layers`` and the folds after it), run by the builder's pass manager,
listed in the build report and switched off with ``--disable-pass``.

Every mode measures the quantized model against the float one with minirt
itself (report.py), on ``options.eval`` or the calibration data, and times
both on one feed: a quantized model slower than its float version is a
warning in the report.  ``options.accuracy_budget`` returns the most
sensitive layers to float until the budget holds (sensitivity.py).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np
import onnx_ir as ir

from minirt.builder.errors import BuildError
from minirt.builder.quantize import _run
from minirt.builder.quantize.bias_correction import correct_biases, mean_inputs
from minirt.builder.quantize.calibration import METHODS, Feeds, RangeCollector, load_feeds, split_stacked_feeds
from minirt.builder.quantize import cost as int8_cost
from minirt.builder.quantize import passes as quant_passes
from minirt.builder.quantize.candidates import find_candidates, unique_node_names
from minirt.builder.quantize.qir import Candidate, QuantContext
from minirt.builder.quantize.report import QuantizationReport, compare
from minirt.builder.quantize.sensitivity import Budget, fit_budget, parse_budget
from minirt.builder.quantize.weights import convert_to_fp16, fp16_candidates
from minirt.targets.profiles import TargetProfile, get_target

MODES = ("fp16", "int4", "int8-dynamic", "int8")

__all__ = ["MODES", "QuantizeOptions", "QuantizationReport", "quantize", "demo_rows", "parse_budget"]


@dataclasses.dataclass
class QuantizeOptions:
    method: str = "minmax"  # calibration: minmax, percentile or entropy
    percentile: float = 99.999
    per_channel: bool = True  # weights: one scale per output channel (else one per tensor)
    symmetric_activations: bool = False  # int8 with zero point 0 instead of asymmetric uint8
    reduce_range: bool = False  # 7-bit weights (+-63) for int8 dot products that saturate in 16 bits
    # int8 and int8-dynamic: 8-bit weights whose pairs the int8 GEMM multiplies side by side stay within
    # |w0| + |w1| <= 128, for GEMMs that add such pairs in 16 bits (AVX2 without VNNI, D172); None: the
    # target's int8_pair_limited_weights decides
    pair_limited_weights: bool | None = None
    # the layers that feed the model's outputs compute in int8 too (D149: as onnxruntime's quantize_static;
    # the accuracy budget puts them back in float when their rounding costs too much); False: they compute
    # in float32 from int8-stored weights (D127)
    quantize_final: bool = True
    # The int8 speed rules (which layers stay float because float is faster: depthwise convs, except
    # on large planes in static int8; pointwise convs over few channels; the weights-only threshold of
    # the layers they keep float) describe the device: fields of the target profile
    # (targets/profiles.py: int8_depthwise, int8_depthwise_min_plane, int8_min_reduction, int8_min_window_reduction,
    # int8_min_pointwise_outputs, int8_min_group_outputs, int8_large_plane, int8_min_large_plane_reduction,
    # weight_only_min_elements), passed to quantize() as ``target``.
    # Depthwise convs quantized in static int8 take their input scales per channel (one scale for the
    # tensor instead: PP-OCR det's max abs error vs float 0.70 -> 0.99).
    depthwise_per_channel_inputs: bool = True
    # Convolutions kept float for speed still store their weights int8 (weights-only:
    # com.minirt::DequantizeWeights, materialized in float32 once by the runtime), or float16 under the
    # target's weight_only_min_elements (D174).
    weight_only_float_convs: bool = True
    # The graph rewrites after quantization are passes (builder/quantize/passes/: quant_layers,
    # quant_fold_affine, quant_fuse_max_pool, ...), switched off by name like the optimizer's.
    disabled_passes: Sequence[str] = ()
    # Chained int8 (static only, pass quant_chain_int8): a QConv feeding only QConvs writes uint8 in
    # their input quantization (the same results).  "depthwise": only into and out of depthwise QConvs
    # (between GEMM convs chaining measured slower: docs/decisions.md D20, D46).  True: everywhere; False:
    # nowhere (the same as disabling quant_chain_int8).  None (default): the target profile's
    # int8_chain_everywhere (True on AVX-512 VNNI hosts, whose uint8 store is the cheaper one, D181), else
    # "depthwise".
    chain_int8: bool | str | None = None
    # Aliases kept for the Python API: False disables the passes named (see _ALIASES).
    fold_affine: bool = True  # quant_fold_affine
    fuse_pool_flatten: bool = True  # quant_fuse_max_pool, quant_fuse_flatten
    fold_upsample_add: bool = True  # quant_fold_upsample_add, quant_fold_upsample_concat, quant_fold_channel_mul
    exclude: Sequence[str] = ()  # node names or op types kept float
    weight_only: bool = True  # int8 storage for ConvTranspose / LSTM / GRU / RNN weights and embedding tables (Gather)
    # Static int8: a ConvTranspose with stride == kernel (no overlapping taps: the 2x2 / stride-2
    # upsampling of detection heads) computes in int8 (com.minirt::QConvTranspose, chained in uint8
    # with the int8 layers around it); a final one (feeding a model output) only when asked with
    # quantize_final_conv_transpose, as the final layers of the other kinds (quantize_final);
    # otherwise (and in int8-dynamic) its weight is stored int8 and it computes in float
    # (docs/decisions.md D55).
    int8_conv_transpose: bool = True
    quantize_final_conv_transpose: bool = False
    accuracy_budget: Any = None  # "top1-drop<=1", "cosine>=0.99", ... or a Budget; "none": not even the default
    eval: Any = None  # held-out data for the report (default: the calibration data)
    calibration_spec: Any = None  # preprocessing spec for image folders
    max_feeds: int | None = None  # use at most this many calibration feeds
    fp16_min_elements: int = 1024  # smaller float32 tensors stay float32 in fp16 mode
    # fp16 without an accuracy_budget: keep the most sensitive weights float32 until the outputs stay
    # within this of the float model on the eval / calibration data (None: convert every weight).
    fp16_budget: Any = "max-abs<=0.005"
    # int8 / int8-dynamic without an accuracy_budget: the most sensitive layers return to float until
    # the outputs keep this cosine to the float model's on the calibration / eval data (None or "none":
    # no default budget).  It needs real data: on the random input used without any, it is not applied.
    int8_budget: Any = "cosine>=0.99"
    # ... fitted on at most this many feeds (each fit evaluation runs the model on them; the accuracy
    # in the report is still measured on every eval feed)
    int8_budget_feeds: int = 4
    fp16_max_ratio: float = 0.55  # ... but the default budget never takes the artifact beyond this x float
    # fp16: fold each Conv/Gemm weight's float16 rounding error times its mean input patch (measured on the
    # calibration data, else the eval data) into the layer's float32 bias (pass fp16_bias_correction; False
    # disables it).
    fp16_bias_correction: bool = True
    # int4: the block of K values one scale covers (a power of two >= 16), symmetric weights (zero point 8,
    # none stored) or asymmetric (a zero point per block), layers with fewer weight values stay float
    int4_block_size: int = 32
    int4_symmetric: bool = True
    int4_min_elements: int = 4096
    measure_latency: bool = True
    latency_runs: int = 5

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("eval", "calibration_spec"):
            d[k] = d[k] if isinstance(d[k], (str, type(None))) else f"<{type(d[k]).__name__}>"
        if isinstance(self.accuracy_budget, Budget):
            d["accuracy_budget"] = self.accuracy_budget.spec
        d["exclude"] = list(self.exclude)
        d["disabled_passes"] = list(self.disabled_passes)
        return d

    def non_default(self) -> dict:
        """The options that differ from the defaults (what the report stores: defaults are implied)."""
        defaults = QuantizeOptions().as_dict()
        return {k: v for k, v in self.as_dict().items() if v != defaults.get(k)}


def _input_names(model: ir.Model) -> list[str]:
    return [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]


def _random_feeds(model: ir.Model) -> Feeds:
    """One random feed when every input shape is static (fp16 / dynamic reports without data)."""
    feed = {}
    rng = np.random.default_rng(0)
    for v in model.graph.inputs:
        if v.name in model.graph.initializers:
            continue
        shape = [] if v.shape is None else list(v.shape)
        if v.shape is None or not all(isinstance(d, int) and d >= 0 for d in shape) or v.dtype != ir.DataType.FLOAT:
            return Feeds()
        feed[v.name] = rng.standard_normal(shape).astype(np.float32)
    return Feeds([feed])


def collect_ranges(model: ir.Model, names: list[str], feeds, method: str = "minmax", percentile: float = 99.999,
                   signed: bool = False, channel_names: Sequence[str] = ()) -> dict:
    """Calibrated ranges, running the float ``model`` with minirt.

    ``{name: (lo, hi)}`` for each tensor in ``names``, plus
    ``{("channel", name): (lo[C], hi[C])}`` (per-channel min/max along axis 1)
    for each tensor in ``channel_names``.
    """
    col = RangeCollector(method, percentile)
    per_channel = set(channel_names)

    def first_pass(name, x):
        col.update_minmax(name, x)
        if name in per_channel:
            col.update_channels(name, x)

    _run.collect(model, list(names) + list(channel_names), feeds, first_pass)
    if col.needs_histograms:
        _run.collect(model, names, feeds, col.update_histogram)
    out: dict = {n: r for n in names if (r := col.range(n, signed_levels=signed)) is not None}
    for n in per_channel:
        r = col.channel_range(n)
        if r is not None:
            out[("channel", n)] = r
    return out


def input_planes(model: ir.Model, candidates: Sequence[Candidate], feeds) -> dict[str, int]:
    """Pixels per channel (product of the dimensions after the first two) of each candidate's input:
    from its static shape, else from running the float ``model`` on the first of ``feeds``."""
    planes, unknown = {}, []
    for c in candidates:
        if c.plane:
            planes[c.input] = c.plane
        else:
            unknown.append(c.input)
    if unknown and feeds:

        def record(name, x):
            if x.ndim >= 3:
                planes[name] = int(np.prod(x.shape[2:]))

        _run.collect(model, unknown, list(feeds)[:1], record)
    return planes


def _check_feed_shapes(model: ir.Model, feeds, what: str) -> None:
    """Every feed's arrays against the model's fixed input dimensions (after --input-shape): a clear build
    error naming the feed, instead of the session's error from deep inside the accuracy measurement."""
    fixed = {}
    for v in model.graph.inputs:
        if v.shape is not None:
            # (a negative size, -1 in PaddlePaddle's exports such as PP-OCR's classifier, is a dynamic
            # dimension to onnxruntime, as a symbolic one)
            fixed[v.name] = [d if isinstance(d, int) and d >= 0 else None for d in v.shape]
    for i, feed in enumerate(feeds):
        for name, arr in feed.items():
            want = fixed.get(name)
            shape = list(np.shape(arr))
            if want is None:
                continue
            if len(shape) != len(want) or any(w is not None and w != g for w, g in zip(want, shape)):
                shown = ["?" if w is None else w for w in want]
                raise BuildError(
                    f"{what} feed {i}: input {name!r} has shape {shape}, but the model takes {shown} "
                    f"(fixed by the model or by --input-shape); give {what} data of that shape, or leave the "
                    f"varying dimension symbolic when building"
                )


def _native_int8() -> bool:
    from minirt import native

    return bool(native.available and hasattr(native, "qgemm"))


def _excluded(c: Candidate, exclude: Sequence[str]) -> bool:
    return c.name in exclude or c.op_type in exclude


# QuantizeOptions booleans kept for the Python API: False disables these passes.
_ALIASES = {
    "fold_affine": ("quant_fold_affine",),
    "fuse_pool_flatten": ("quant_fuse_max_pool", "quant_fuse_flatten"),
    "fold_upsample_add": ("quant_fold_upsample_add", "quant_fold_upsample_concat", "quant_fold_channel_mul"),
    "chain_int8": ("quant_chain_int8",),
    "fp16_bias_correction": ("fp16_bias_correction",),
}


def _disabled_passes(opts: QuantizeOptions) -> list[str]:
    """The quantizer pass names switched off: ``opts.disabled_passes`` plus the aliases set to False."""
    names = list(opts.disabled_passes)
    unknown = sorted(set(names) - set(quant_passes.pass_names()))
    if unknown:
        raise BuildError(f"unknown quantizer pass name(s) {unknown} for --disable-pass; "
                         f"known quantizer passes: {quant_passes.pass_names()}")
    for option, passes in _ALIASES.items():
        if getattr(opts, option) is False:
            names += [p for p in passes if p not in names]
    return names


def _profile(target: TargetProfile | str | None) -> TargetProfile:
    if isinstance(target, TargetProfile):
        return target
    try:
        return get_target(target or "generic")
    except ValueError as exc:
        raise BuildError(str(exc)) from None


@dataclasses.dataclass
class _Data:
    """The data a quantization measures on, and the float model's answers on it."""

    calib: Feeds
    evals: Feeds
    labels: Any
    float_model: ir.Model  # the model before quantization (a clone: ``model`` is rewritten in place)
    float_bytes: bytes
    ref: dict | None  # the float model's outputs on ``evals`` (None: no data)

    def evaluate(self, candidate: ir.Model) -> dict:
        """Accuracy of ``candidate`` against the float model on the eval data ({} without data)."""
        if self.ref is None:
            return {}
        return compare(self.ref, _run.run_all(_run.session(candidate), self.evals), self.labels)


def _declared_batches(model: ir.Model) -> dict:
    """Input name -> its declared first dimension, for the inputs where that is a fixed number."""
    out = {}
    for v in model.graph.inputs:
        if v.shape is not None and len(v.shape) and isinstance(v.shape[0], int) and v.shape[0] > 0:
            out[v.name] = v.shape[0]
    return out


def _load_data(model: ir.Model, mode: str, calibration: Any, opts: QuantizeOptions,
               report: QuantizationReport) -> _Data:
    """Calibration and eval feeds (checked against the model's input shapes) and the float reference."""
    t0 = time.perf_counter()
    names = _input_names(model)
    calib = split_stacked_feeds(load_feeds(calibration, names, opts.calibration_spec), _declared_batches(model))
    if opts.max_feeds is not None:
        calib = Feeds(calib[: opts.max_feeds], calib.labels[: opts.max_feeds])
    if mode == "int8" and not calib:
        raise BuildError("--quantize int8 needs calibration data (--calibration PATH); "
                         "int8-dynamic and fp16 do not")
    evals = load_feeds(opts.eval, names, opts.calibration_spec) if opts.eval is not None else calib
    report.eval_source = "the eval data" if opts.eval is not None else "the calibration data"
    if not evals:
        evals = _random_feeds(model)
        report.eval_source = "a random input" if evals else "no data"
    _check_feed_shapes(model, calib, "calibration")
    if opts.eval is not None:
        _check_feed_shapes(model, evals, "--eval")
    report.calibration_feeds, report.eval_feeds = len(calib), len(evals)
    report.timings["load_data"] = time.perf_counter() - t0

    float_model = model.clone()
    float_bytes = _run.artifact_bytes(float_model)
    report.float_bytes = len(float_bytes)
    ref = _run.run_all(_run.minirt.Session(float_bytes, verify_checksums=False), evals) if evals else None
    return _Data(calib, evals, evals.all_labels(), float_model, float_bytes, ref)


def quantize(
    model: ir.Model,
    mode: str,
    calibration: Any = None,
    options: QuantizeOptions | None = None,
    progress: Callable[[str], None] | None = None,
    target: TargetProfile | str | None = None,
) -> QuantizationReport:
    """Quantize ``model`` (optimized onnx-ir, main graph) in place; returns the report.

    ``target``: the device's profile (or its name; default "generic"), whose int8 speed rules decide
    which layers stay float because float is faster there.
    """
    say = progress or (lambda msg: None)
    opts = options or QuantizeOptions()
    if mode not in MODES:
        raise BuildError(f"--quantize must be one of {list(MODES)}, got {mode!r}")
    if opts.method not in METHODS:
        raise BuildError(f"--calibration-method must be one of {list(METHODS)}, got {opts.method!r}")
    profile = _profile(target)
    disabled = _disabled_passes(opts)
    budget = parse_budget(opts.accuracy_budget)
    report = QuantizationReport(mode=mode, method=opts.method if mode == "int8" else None, options=opts.non_default())
    t_start = time.perf_counter()
    # (candidates are found by node name, in If / Loop / Scan bodies too: names made unique first, before
    # the float clone the rewrites start from)
    unique_node_names(model)
    data = _load_data(model, mode, calibration, opts, report)
    if mode == "fp16":
        budget = _quantize_fp16(model, data, opts, disabled, budget, report, say)
    elif mode == "int4":
        _quantize_int4(model, opts, disabled, report, say)
    else:
        _quantize_int8(model, mode, data, opts, profile, disabled, budget, report, say)
        _estimate_on_target(data.float_model, mode, profile, report)
    _measure(model, mode, data, opts, budget, report)
    report.timings["total"] = time.perf_counter() - t_start
    return report


# --- int4 --------------------------------------------------------------------------------------------


def _quantize_int4(model: ir.Model, opts: QuantizeOptions, disabled: Sequence[str], report: QuantizationReport,
                   say: Callable[[str], None]) -> None:
    """4-bit block-wise weights (pass int4_weights); the report's ``int4`` entry."""
    bs = int(opts.int4_block_size)
    if bs < 16 or bs & (bs - 1):
        raise BuildError(f"--block-size must be a power of two of at least 16, got {opts.int4_block_size}")
    context = QuantContext(int4_block_size=bs, int4_symmetric=bool(opts.int4_symmetric),
                           int4_min_elements=int(opts.int4_min_elements))
    done = quant_passes.rewrite(model, "int4", context, disabled)
    report.int4 = {**done.fp16, "block_size": bs, "symmetric": bool(opts.int4_symmetric)}
    report.passes = done.report.as_dict()
    say(f"int4: {done.fp16['layers']} layer(s) as MatMulNBits, block {bs}, "
        f"{'symmetric' if opts.int4_symmetric else 'asymmetric'}")


# --- fp16 --------------------------------------------------------------------------------------------


def _fp16_converter(data: _Data, opts: QuantizeOptions, disabled: Sequence[str], say: Callable[[str], None]):
    """(the fp16 candidate weights, ``convert(model, subset)``): the fp16 passes (bias correction, fed with
    the mean layer inputs measured once on the float model, then conversion) over ``subset`` (None:
    every candidate); ``convert`` returns the passes' :class:`builder.quantize.passes.Rewrite`."""
    all16 = fp16_candidates(data.float_model, opts.fp16_min_elements)
    means = {}
    if "fp16_bias_correction" not in disabled:  # (the option fp16_bias_correction=False disables it too)
        stats_feeds = data.calib or data.evals
        if stats_feeds:
            say(f"fp16 bias correction: mean layer inputs on {len(stats_feeds)} feed(s)")
            means = mean_inputs(data.float_model, all16, stats_feeds)

    def convert(m: ir.Model, subset) -> quant_passes.Rewrite:
        context = QuantContext(fp16_only=set(all16 if subset is None else subset), fp16_means=means,
                               fp16_min_elements=opts.fp16_min_elements)
        return quant_passes.rewrite(m, "fp16", context, disabled)

    return all16, convert


def _quantize_fp16(model: ir.Model, data: _Data, opts: QuantizeOptions, disabled: Sequence[str],
                   budget: Budget | None, report: QuantizationReport, say: Callable[[str], None]) -> Budget | None:
    """fp16 weights, fitted to ``budget`` or to the default fp16 budget; returns the budget applied."""
    t0 = time.perf_counter()
    all16, convert = _fp16_converter(data, opts, disabled, say)
    default = budget is None and opts.fp16_budget is not None
    if default:
        budget = parse_budget(opts.fp16_budget)
        if data.ref is None:
            budget = None
            report.warnings.append(f"fp16: no data to measure on, the default budget {opts.fp16_budget} was "
                                   "not applied (pass --calibration or --eval)")
    only = None
    if budget is not None:
        if data.ref is None:
            raise BuildError("--accuracy-budget needs data to measure on (--calibration or --eval)")
        only = _fit_fp16_budget(data, opts, budget, default, all16, convert, report, say)
    done = convert(model, only)
    report.fp16, report.passes = done.fp16, done.report.as_dict()
    report.timings["convert"] = time.perf_counter() - t0
    return budget


def _fit_fp16_budget(data: _Data, opts: QuantizeOptions, budget: Budget, default: bool, all16: list, convert,
                     report: QuantizationReport, say: Callable[[str], None]) -> set:
    """The fp16 weights that may stay float16 within ``budget`` (the others return to float32); with the
    ``default`` budget, capped so the artifact stays within ``opts.fp16_max_ratio`` of float."""
    # Fit on every feed at hand (eval + calibration) for label-free budgets: the few eval feeds
    # alone overfit the per-weight selection (docs/decisions.md D23).
    fit_evals, fit_ref, fit_labels = data.evals, data.ref, data.labels
    if budget.metric in ("max-abs", "mean-abs", "cosine") and opts.eval is not None and data.calib:
        fit_evals = Feeds(list(data.evals) + list(data.calib))
        fit_ref = _run.run_all(_run.minirt.Session(data.float_bytes, verify_checksums=False), fit_evals)
        fit_labels = None

    def with_fp16(subset):
        m = data.float_model.clone()
        convert(m, subset)
        return compare(fit_ref, _run.run_all(_run.session(m), fit_evals), fit_labels)

    cost = max_cost = None
    if default:
        sizes = {n: data.float_model.graph.initializers[n].const_value.size for n in all16}
        full = data.float_model.clone()
        convert(full, None)
        # The cap is on the whole artifact, whose metadata will hold this fit's report: a
        # sensitivity entry per candidate weight (its name and two scores) and its name in the
        # quantized list; room for that is kept out of what returning weights to float may spend.
        report_room = 2048 + sum(2 * len(n) + 96 for n in all16)
        max_cost = opts.fp16_max_ratio * report.float_bytes - len(_run.artifact_bytes(full)) - report_room

        def cost(name):  # bytes a weight adds when it stays float32 (2 per element, plus its scale)
            return 2.0 * sizes[name]

    res = fit_budget(budget, all16, with_fp16, say, cost=cost, max_cost=max_cost)
    res.pop("accuracy", None)
    which = f"the default fp16 budget {budget.spec}" if default else "the accuracy budget"
    for r in res["reverted"]:
        report.kept_float.append({"node": r["node"], "reason": f"kept float32 by {which}: {r['why']}"})
    report.budget = res
    if default:
        report.budget["default"] = True
    if not res["met"]:
        report.warnings.append(f"{which} {budget.spec} not met (value {res['value']:.4g})"
                               + (f"; {len(res['capped'])} sensitive weight(s) stay float16 to keep the "
                                  f"artifact <= {opts.fp16_max_ratio}x float" if res.get("capped") else ""))
    return set(res["quantized"])


# --- int8 --------------------------------------------------------------------------------------------


# Embedding tables (D170) are stored int8 by row from this many values: smaller ones (BERT's token types,
# 2 x hidden) stay float, as they are added to every token and save almost nothing.  (Kept apart from the
# target's weight_only_min_elements, the floor of a conv's weights-only storage, D173.)
EMBEDDING_MIN_ELEMENTS = 1024
# Layers kept float whose weights are under the weights-only floor store them float16 from this many values
# (below, 64-byte alignment leaves the saving at nothing or one line).  int8 weights there cost PP-OCR's
# pipeline 5.6 points of exact lines (D173); float16 (a relative error of 2^-11, against int8's 2^-8 of
# each channel's largest weight) cost it one line of 71 (91.55 %, float 90.14) and no character, and took
# PP-OCR cls's int8 file under 0.3x of the float one (D174).
KEPT_FLOAT16_MIN_ELEMENTS = 64


# The fused activations the int8 depthwise kernels apply in their epilogue (minirt/native/qdwconv*.h);
# with another one (EfficientNet's SiLU) an int8 depthwise conv is not faster than float.
DEPTHWISE_INT8_ACTIVATIONS = frozenset({"", "Relu", "Clip", "HardSwish"})


def _select(candidates: Sequence[Candidate], mode: str, data: _Data | None, opts: QuantizeOptions,
            profile: TargetProfile, report: QuantizationReport, float16: list | None = None) -> list[Candidate]:
    """The candidates to rewrite (computed in int8, or weights-only), with the reason for each kept float:
    the user's exclusions and final layers, and the target's int8 speed rules.  ``data``: the
    calibration data (the plane sizes of depthwise inputs), or None to use the static shapes.
    ``float16``: receives the weight names of the layers kept float whose weights are stored float16
    (see keep_float)."""
    selected = []
    stored = "; weights stored int8 (weights-only)" if opts.weight_only_float_convs else ""

    def keep_float(c: Candidate, reason: str) -> None:
        """Keep ``c`` computing in float (for speed, or a final layer for accuracy); its weights stored
        int8 behind a DequantizeWeights when they are big enough to matter, else float16 (D174)."""
        if opts.weight_only_float_convs and c.weight_elements >= profile.weight_only_min_elements:
            report.kept_float.append({"node": c.name, "reason": reason + stored})
            selected.append(dataclasses.replace(c, weight_only=True))
        elif (opts.weight_only_float_convs and float16 is not None
              and c.weight_elements >= KEPT_FLOAT16_MIN_ELEMENTS):
            report.kept_float.append({"node": c.name, "reason": reason + "; weights stored float16"})
            float16.append(c.weight)
        else:
            report.kept_float.append({"node": c.name, "reason": reason})

    # Depthwise convs computed in int8 for their plane (static int8, int8_depthwise_min_plane > 0): input
    # planes of at least int8_depthwise_min_plane pixels (int8_depthwise_strided_min_plane when strided:
    # splitting the input into column parities costs per input pixel), an activation the int8 depthwise
    # kernel applies in its epilogue, and no residual.  Each is chained in uint8 with the convs that write
    # its input and read its output, so the pointwise and window speed rules leave those neighbours int8
    # (one kept float breaks the chain: PP-OCR det's 16-channel pointwise convs kept float cost it 2.6 ms,
    # D144); the other convs on such planes follow the rules (every conv there int8 cost PP-OCR's pipeline
    # two more lines of 71, D181).
    int8_depthwise = set()
    if mode == "int8" and not profile.int8_depthwise and profile.int8_depthwise_min_plane > 0:
        convs = [c for c in candidates if c.kind == "conv"]
        # (without data: the planes of the static shapes, 0 where unknown)
        planes = (input_planes(data.float_model, convs, data.calib) if data is not None
                  else {c.input: c.plane for c in convs})
        strided_min = max(profile.int8_depthwise_min_plane, profile.int8_depthwise_strided_min_plane)
        int8_depthwise = {c.name for c in convs
                          if c.depthwise and c.activation in DEPTHWISE_INT8_ACTIVATIONS and not c.residual
                          and planes.get(c.input, 0) >= (strided_min if c.strides > 1
                                                         else profile.int8_depthwise_min_plane)}
    chain_inputs = {c.input for c in candidates if c.name in int8_depthwise}
    chain_outputs = {c.output for c in candidates if c.name in int8_depthwise}
    for c in candidates:
        chained = c.kind == "conv" and (c.output in chain_inputs or c.input in chain_outputs)
        if _excluded(c, opts.exclude):
            report.kept_float.append({"node": c.name, "reason": "excluded by option"})
        elif c.op_type == "Gather" and c.weight_elements < EMBEDDING_MIN_ELEMENTS:
            report.kept_float.append({"node": c.name, "reason": f"embedding table of {c.weight_elements} values: "
                                      f"stored float (under {EMBEDDING_MIN_ELEMENTS} values)"})
        elif c.kind == "convt" and (mode != "int8" or not opts.int8_conv_transpose
                                    or (c.final and not opts.quantize_final_conv_transpose)):
            if opts.weight_only:  # as any other ConvTranspose: int8 storage, float compute
                selected.append(dataclasses.replace(c, weight_only=True))
            else:
                report.kept_float.append({"node": c.name, "reason": _convt_float_reason(mode, opts)})
        elif c.depthwise and not profile.int8_depthwise and c.name not in int8_depthwise:
            keep_float(c, f"depthwise convolution: float is faster than int8 on {profile.name} "
                               "(int8_depthwise of the target profile)")
        elif c.kind == "conv" and c.window == 1 and not chained and 0 < c.reduction < profile.int8_min_reduction:
            keep_float(c, f"pointwise conv over {c.reduction} channels: float is faster than int8 on "
                               f"{profile.name} (int8_min_reduction of the target profile)")
        elif (c.kind == "conv" and c.window == 1 and not c.group_outputs and not chained
              and 0 < c.outputs < profile.int8_min_pointwise_outputs):
            keep_float(c, f"pointwise conv to {c.outputs} channels: float is faster than int8 on {profile.name} "
                               "(int8_min_pointwise_outputs of the target profile)")
        elif (c.kind == "conv" and c.window == 1 and not c.group_outputs and not chained
              and profile.int8_large_plane and c.plane // c.strides >= profile.int8_large_plane
              and 0 < c.reduction < profile.int8_min_large_plane_reduction):
            # (the output plane: a strided 1x1 conv reads a part of its input, and int8 pays there)
            keep_float(c, f"pointwise conv over {c.reduction} channels writing planes of {c.plane // c.strides} "
                          f"pixels: float is faster than int8 on {profile.name} (int8_min_large_plane_reduction "
                          "of the target profile)")
        elif c.kind == "conv" and 0 < c.group_outputs < profile.int8_min_group_outputs:
            keep_float(c, f"grouped conv of {c.group_outputs} output channels per group: float is faster than "
                               f"int8 on {profile.name} (int8_min_group_outputs of the target profile)")
        elif (c.kind == "conv" and c.window > 1 and not c.depthwise and not c.group_outputs and not chained
              and 0 < c.reduction < profile.int8_min_window_reduction):
            # (ungrouped convs: a depthwise or grouped conv has its own rule above; a large-plane depthwise
            # conv quantized for its plane must stay int8 here, D144)
            keep_float(c, f"conv summing {c.reduction} products per output: float is faster than int8 on "
                               f"{profile.name} (int8_min_window_reduction of the target profile)")
        elif c.final and not opts.quantize_final and c.kind != "convt":
            # (computed in float for accuracy, but its weights stored int8 like the layers kept float for
            # speed: a classifier's final Gemm was half of an int8 MobileNetV2's file, D127)
            keep_float(c, "final layer (feeds a model output), kept float by quantize_final=False")
        else:
            selected.append(c)
    return selected


def _convt_float_reason(mode: str, opts: QuantizeOptions) -> str:
    if mode != "int8":
        return "int8 ConvTranspose needs static int8"
    if not opts.int8_conv_transpose:
        return "int8_conv_transpose is off"
    return "final layer (feeds a model output); quantize_final_conv_transpose to quantize it"


def _calibrate(selected: Sequence[Candidate], data: _Data, opts: QuantizeOptions, report: QuantizationReport,
               say: Callable[[str], None]) -> dict:
    """Calibrated input ranges of the layers computed in int8 (per channel too for depthwise inputs)."""
    t0 = time.perf_counter()
    computed = [c for c in selected if not c.computes_float]
    say(f"calibrating {len(computed)} layers on {len(data.calib)} feed(s) ({opts.method})")
    ranges = collect_ranges(data.float_model, [c.input for c in computed if c.input], data.calib, opts.method,
                            opts.percentile, signed=opts.symmetric_activations,
                            channel_names=[c.input for c in computed
                                           if c.depthwise and opts.depthwise_per_channel_inputs])
    report.timings["calibrate"] = time.perf_counter() - t0
    return ranges


def _fit_int8_budget(selected: list[Candidate], data: _Data, budget: Budget, rewrite, report: QuantizationReport,
                     say: Callable[[str], None], max_feeds: int | None = None) -> list[Candidate]:
    """``selected`` minus the most sensitive computed layers, returned to float until ``budget`` holds
    (weights-only layers always stay); ``rewrite(model, candidates)`` quantizes a model clone.
    ``max_feeds``: measure on the first that many eval feeds only (the default budget's fit)."""
    if data.ref is None:
        raise BuildError("--accuracy-budget needs data to measure on (--calibration or --eval)")
    t0 = time.perf_counter()
    tunable = [c.name for c in selected if not c.computes_float]
    fixed = [c.name for c in selected if c.computes_float]
    fit = data
    if max_feeds is not None and len(data.evals) > max_feeds:  # (the same data, its first feeds)
        evals = Feeds(data.evals[:max_feeds], data.evals.labels[:max_feeds])
        fit = dataclasses.replace(data, evals=evals, labels=evals.all_labels(),
                                  ref={name: outs[:max_feeds] for name, outs in data.ref.items()})

    def evaluate(subset) -> dict:
        names = set(subset) | set(fixed)
        m = data.float_model.clone()
        rewrite(m, [c for c in selected if c.name in names])
        return fit.evaluate(m)

    res = fit_budget(budget, tunable, evaluate, say)
    keep = set(res["quantized"]) | set(fixed)
    for r in res["reverted"]:
        report.kept_float.append({"node": r["node"], "reason": f"accuracy budget: {r['why']}"})
    res.pop("accuracy", None)
    report.budget = res
    report.timings["budget"] = time.perf_counter() - t0
    if not res["met"]:
        report.warnings.append(f"accuracy budget {budget.spec} not met even with every layer in float "
                               f"except weight-only ones (value {res['value']:.4g})")
    if res["reverted"]:
        say(f"accuracy budget {budget.spec}: {len(res['reverted'])} of {len(tunable)} layers returned to float")
    return [c for c in selected if c.name in keep]


def _quantize_int8(model: ir.Model, mode: str, data: _Data, opts: QuantizeOptions, profile: TargetProfile,
                   disabled: Sequence[str], budget: Budget | None, report: QuantizationReport,
                   say: Callable[[str], None]) -> None:
    """Static or dynamic int8: choose the layers, calibrate (static), fit the budget, run the rewrite passes."""
    candidates, refused = find_candidates(model, weight_only=opts.weight_only)
    report.kept_float += [{"node": n, "reason": r} for n, r in refused]
    float16: list = []  # (weights of layers kept float, stored float16 once the rewrite is done)
    selected = _select(candidates, mode, data, opts, profile, report, float16)
    if not opts.per_channel:
        report.warnings.append("per-tensor weight scales requested: accuracy is usually lower")
    ranges = _calibrate(selected, data, opts, report, say) if mode == "int8" else None
    pair_limited = not opts.reduce_range and (
        profile.int8_pair_limited_weights if opts.pair_limited_weights is None else opts.pair_limited_weights)
    report.pair_limited_weights = pair_limited
    means = {}
    if mode == "int8" and "int8_bias_correction" not in disabled and data.calib:
        t0 = time.perf_counter()
        weights = {c.weight for c in selected if c.kind in ("conv", "matmul")}
        say(f"int8 bias correction: mean layer inputs on {len(data.calib)} feed(s)")
        means = mean_inputs(data.float_model, weights, data.calib)
        report.timings["bias_correction_means"] = time.perf_counter() - t0

    weight_cache: dict = {}  # (each weight rounded once for the rewrites below)
    chain = opts.chain_int8 if opts.chain_int8 is not None else (
        True if profile.int8_chain_everywhere else "depthwise")

    def rewrite(m: ir.Model, chosen: Sequence[Candidate]):
        context = QuantContext(selected=list(chosen), ranges=ranges, reduce_range=opts.reduce_range,
                               pair_limited=pair_limited, int8_means=means, weight_cache=weight_cache,
                               symmetric=opts.symmetric_activations,
                               per_channel=opts.per_channel, chain=chain)
        return quant_passes.rewrite(m, mode, context, disabled)

    # (the default budget unless the user gave one, or said "none")
    default_budget = parse_budget(opts.int8_budget) if budget is None and opts.accuracy_budget != "none" else None
    default = default_budget is not None
    if default:
        if report.eval_source in ("a random input", "no data"):
            report.warnings.append(f"{mode}: no data to measure on, the default budget {opts.int8_budget} was not "
                                   "applied (pass --calibration or --eval)")
        else:
            budget = default_budget
    if budget is not None:
        selected = _fit_int8_budget(selected, data, budget, rewrite, report, say,
                                    max_feeds=opts.int8_budget_feeds if default else None)
        if default:
            report.budget["default"] = True
    done = rewrite(model, selected)
    if done.run_time_scales:
        _warn_uncalibrated_bodies(done.run_time_scales, report)
    report.passes = done.report.as_dict()
    skipped = done.skipped
    skipped_names = {n for n, _ in skipped}
    report.kept_float += [{"node": n, "reason": r} for n, r in skipped]
    report.quantized = [c.name for c in selected if not c.computes_float and c.name not in skipped_names]
    report.weight_only = [c.name for c in selected if c.computes_float and c.name not in skipped_names]
    if float16:  # (after the rewrite, so that the accuracy measured next includes the float16 rounding)
        report.fp16 = convert_to_fp16(model, KEPT_FLOAT16_MIN_ELEMENTS, only=set(float16))


def _warn_uncalibrated_bodies(names: Sequence[str], report: QuantizationReport) -> None:
    """A warning naming the int8 layers inside control-flow bodies that the calibration data never ran
    (an If branch taken for another sample rate): quant_layers quantized their inputs at run time."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    report.warnings.append(f"{len(names)} int8 layer(s) inside If / Loop / Scan bodies never ran on the "
                           f"calibration data ({shown}): their inputs are quantized at run time (int8-dynamic); "
                           "calibrate with data that takes every branch for static scales")


# --- measurement -------------------------------------------------------------------------------------


def _measure(model: ir.Model, mode: str, data: _Data, opts: QuantizeOptions, budget: Budget | None,
             report: QuantizationReport) -> None:
    """The quantized artifact's size, its accuracy against float on the eval data, the budget's verdict
    when no fit gave one, and the latency of both models on one feed (a warning when int8 does not pay)."""
    quant_bytes = _run.artifact_bytes(model)
    report.quant_bytes = len(quant_bytes)
    if data.ref is None:
        return
    t0 = time.perf_counter()
    qsess = _run.minirt.Session(quant_bytes, verify_checksums=False)
    report.accuracy = compare(data.ref, _run.run_all(qsess, data.evals), data.labels)
    report.timings["evaluate"] = time.perf_counter() - t0
    if budget is not None and not report.budget:
        report.budget = {"spec": budget.spec, "met": budget.met(report.accuracy),
                         "value": budget.value(report.accuracy), "reverted": []}
    if opts.measure_latency:
        _measure_latency(mode, data, qsess, opts, report)


def estimate_mode(model: ir.Model, mode: str, target: TargetProfile | str | None = None,
                  options: QuantizeOptions | None = None) -> "int8_cost.Estimate | None":
    """The target's cost-model estimate for quantizing ``model`` (optimized, main graph; not changed)
    in ``mode`` ("int8" or "int8-dynamic") with the layers the quantizer would choose there (its speed
    rules and final layers, no data): what ``--quantize auto`` decides on; None without an estimate."""
    profile = _profile(target)
    opts = options or QuantizeOptions()
    candidates, _ = find_candidates(model, weight_only=False)
    chosen = _select(candidates, mode, None, opts, profile, QuantizationReport(mode=mode))
    return int8_cost.estimate(model, mode, chosen, profile)


def _estimate_on_target(float_model: ir.Model, mode: str, profile: TargetProfile, report: QuantizationReport) -> None:
    """The target profile's cost-model estimate of the int8 layers' effect on latency, in the report;
    a warning when it says the quantized model is no faster there (the build machine's timing, which
    is not the device's, decides nothing)."""
    candidates, _ = find_candidates(float_model, weight_only=False)
    computed = set(report.quantized)
    est = int8_cost.estimate(float_model, mode, [c for c in candidates if c.name in computed], profile)
    if est is None:
        report.estimate = {"target": profile.name, "mode": mode, "ratio": None,
                           "why": "no int8 layer of known size (dynamic shapes: build with --input-shape)"}
        return
    report.estimate = est.as_dict()
    if est.ratio >= 0.95:
        report.warnings.append(
            f"the {mode} model is estimated {'slower than' if est.ratio > 1.05 else 'no faster than'} the float "
            f"one on {profile.name} ({est.ratio:.2f}x float latency by the target profile's cost model); it is "
            "smaller, not faster")


def _measure_latency(mode: str, data: _Data, qsess, opts: QuantizeOptions, report: QuantizationReport) -> None:
    """Both models timed on the build machine, for the report only: this machine is not the device and
    its load moves the figure (the estimate on the target decides, :func:`_estimate_on_target`)."""
    t0 = time.perf_counter()
    fsess = _run.minirt.Session(data.float_bytes, verify_checksums=False)
    lat = _run.median_latency({"float": fsess, "quant": qsess}, data.evals[0], runs=opts.latency_runs)
    report.latency = {"float_ms": lat["float"] * 1e3, "quant_ms": lat["quant"] * 1e3,
                      "ratio": lat["quant"] / lat["float"] if lat["float"] else float("nan"),
                      "on": "the first evaluation feed", "runs": opts.latency_runs,
                      "native_int8": _native_int8()}
    report.timings["latency"] = time.perf_counter() - t0


def demo_rows(float_artifact: Any, quant_artifact: Any, images: np.ndarray, labels: np.ndarray, runs: int = 20,
              input_name: str | None = None) -> list[tuple]:
    """Rows ``(what, float, int8, ratio)`` for ``minirt demo``: size, accuracy, latency batch 1 and full batch.

    ``*_artifact`` are paths or bytes of the two built artifacts.
    """
    import os

    import minirt
    from minirt.tools.timing import fmt_seconds

    def size(a):
        return os.path.getsize(a) if isinstance(a, (str, os.PathLike)) else len(a)

    f_sess, q_sess = minirt.Session(float_artifact, threads=1), minirt.Session(quant_artifact, threads=1)
    name = input_name or f_sess.get_inputs()[0].name
    out = {}
    for side, s in (("float", f_sess), ("int8", q_sess)):
        logits = s.run(None, {name: images})[0]
        out[side] = float((logits.argmax(axis=1) == labels).mean())
    lat = {}
    for batch in (images[:1], images):
        # batch 1 runs take microseconds: ten times the runs (a few ms) steady its median
        n = runs * 10 if len(batch) == 1 else runs
        lat[len(batch)] = _run.median_latency({"float": f_sess, "int8": q_sess}, {name: batch}, runs=n, warmup=2)
    fs, qs = size(float_artifact), size(quant_artifact)
    rows = [
        ("model size", f"{fs / 1024:.1f} KiB", f"{qs / 1024:.1f} KiB", f"{qs / fs:.3f}x"),
        ("accuracy", f"{out['float'] * 100:.2f} %", f"{out['int8'] * 100:.2f} %",
         f"{(out['int8'] - out['float']) * 100:+.2f} pt"),
    ]
    for n, sec in lat.items():
        rows.append((f"latency batch {n}", fmt_seconds(sec["float"]), fmt_seconds(sec["int8"]),
                     f"{sec['int8'] / sec['float']:.3f}x"))
    return rows
