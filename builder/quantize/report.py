"""Accuracy of a quantized model against its float version, and the report.

Per output, over every evaluation feed: max and mean absolute error, cosine
similarity of the flattened outputs, and, when the output looks like class
scores (a float ``[N, C]`` with C >= 2), top-1 agreement; with labels, the
accuracy of both models too.  A float output of rank 3 whose last axis has at least
2 values (a language model's logits [batch, positions, vocabulary]) gets the
next-token agreement: how often both models' argmax over that axis is the same.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from minirt.tools.reports import format_report, format_sensitivity


def looks_like_scores(y: np.ndarray) -> bool:
    return y.dtype.kind == "f" and y.ndim == 2 and y.shape[1] >= 2


def looks_like_logits(y: np.ndarray) -> bool:
    return y.dtype.kind == "f" and y.ndim == 3 and y.shape[-1] >= 2


def compare(ref: dict[str, list], got: dict[str, list], labels: np.ndarray | None = None) -> dict:
    """``{output: {max_abs, mean_abs, cosine, [top1_agreement, float_accuracy, quant_accuracy]}}``."""
    out = {}
    for name, refs in ref.items():
        gots = got[name]
        a = np.concatenate([np.asarray(r, dtype=np.float64).reshape(-1) for r in refs]) if refs else np.zeros(0)
        b = np.concatenate([np.asarray(g, dtype=np.float64).reshape(-1) for g in gots]) if gots else np.zeros(0)
        if a.size == 0 or a.shape != b.shape:
            out[name] = {"error": f"shapes differ ({a.shape} vs {b.shape})" if a.shape != b.shape else "empty"}
            continue
        diff = np.abs(a - b)
        finite = np.isfinite(diff)
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else (1.0 if na == nb else 0.0)
        row = {
            "max_abs": float(diff[finite].max()) if finite.any() else float("inf"),
            "mean_abs": float(diff[finite].mean()) if finite.any() else float("inf"),
            "cosine": cos,
            "elements": int(a.size),
        }
        if all(looks_like_logits(np.asarray(r)) for r in refs):
            ra = np.concatenate([np.asarray(r).argmax(axis=-1).reshape(-1) for r in refs])
            ga = np.concatenate([np.asarray(g).argmax(axis=-1).reshape(-1) for g in gots])
            row["next_token_agreement"] = float((ra == ga).mean())
        if all(looks_like_scores(np.asarray(r)) for r in refs):
            ra = np.concatenate([np.asarray(r).argmax(axis=1) for r in refs])
            ga = np.concatenate([np.asarray(g).argmax(axis=1) for g in gots])
            row["top1_agreement"] = float((ra == ga).mean())
            if labels is not None and labels.shape[0] == ra.shape[0]:
                row["float_accuracy"] = float((ra == labels).mean())
                row["quant_accuracy"] = float((ga == labels).mean())
        out[name] = row
    return out


def format_accuracy(acc: dict, indent: str = "    ") -> list[str]:
    lines = []
    for name, r in acc.items():
        if "error" in r:
            lines.append(f"{indent}{name}: {r['error']}")
            continue
        s = f"{indent}{name}: max abs err {r['max_abs']:.3g}, mean abs err {r['mean_abs']:.3g}, cosine {r['cosine']:.5f}"
        if "top1_agreement" in r:
            s += f", top-1 agreement {r['top1_agreement'] * 100:.2f} %"
        if "next_token_agreement" in r:
            s += f", next-token agreement {r['next_token_agreement'] * 100:.2f} %"
        if "float_accuracy" in r:
            s += f", accuracy float {r['float_accuracy'] * 100:.2f} % -> quantized {r['quant_accuracy'] * 100:.2f} %"
        lines.append(s)
    return lines


@dataclasses.dataclass
class QuantizationReport:
    """What quantization did; stored under the artifact metadata key ``build.quantization``."""

    mode: str
    method: str | None = None
    options: dict = dataclasses.field(default_factory=dict)  # only those that differ from QuantizeOptions()
    calibration_feeds: int = 0
    eval_feeds: int = 0
    eval_source: str = ""
    quantized: list = dataclasses.field(default_factory=list)  # node names
    # the int8 GEMM layers' weights keep |w0| + |w1| <= 128 per pair multiplied side by side (the target's
    # int8_pair_limited_weights: AVX2 without VNNI, D172)
    pair_limited_weights: bool = False
    weight_only: list = dataclasses.field(default_factory=list)
    kept_float: list = dataclasses.field(default_factory=list)  # {"node", "reason"}
    fp16: dict = dataclasses.field(default_factory=dict)
    int4: dict = dataclasses.field(default_factory=dict)  # int4: layers, block size, symmetric, weight bytes
    float_bytes: int = 0  # artifact bytes without metadata, float vs quantized
    quant_bytes: int = 0
    accuracy: dict = dataclasses.field(default_factory=dict)
    budget: dict = dataclasses.field(default_factory=dict)
    latency: dict = dataclasses.field(default_factory=dict)  # measured on the build machine (not the device)
    # int8 modes: the target profile's cost model's estimate of quantized / float latency (cost.py)
    estimate: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    timings: dict = dataclasses.field(default_factory=dict)
    # the rewrite passes' report (builder/quantize/passes; int8 modes): rows as the optimizer's
    passes: dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def size_ratio(self) -> float | None:
        return self.quant_bytes / self.float_bytes if self.float_bytes else None

    def __str__(self) -> str:
        lines = [f"quantization {self.mode}" + (f" (calibration {self.method}, {self.calibration_feeds} feed(s))"
                                                 if self.method else "")]
        if self.quantized or self.weight_only:
            lines.append(f"  int8 layers: {len(self.quantized)}" +
                         (f", weight-only int8: {len(self.weight_only)}" if self.weight_only else "") +
                         (" (pair-limited weights, for 16-bit pair sums)" if self.pair_limited_weights else ""))
        if self.fp16:
            lines.append(f"  fp16 initializers: {self.fp16.get('initializers', 0)}")
        if self.int4:
            q = self.int4
            lines.append(f"  int4 layers (MatMulNBits): {q['layers']}, block {q['block_size']}, "
                         f"{'symmetric' if q['symmetric'] else 'asymmetric'}; weights {q['float_bytes']:,} B float32 "
                         f"-> {q['int4_bytes']:,} B")
        for k in self.kept_float:
            lines.append(f"  kept float: {k['node']} ({k['reason']})")
        if self.float_bytes:
            lines.append(f"  size: {self.quant_bytes} B vs float {self.float_bytes} B ({self.size_ratio:.2f}x)")
        if self.accuracy:
            lines.append(f"  accuracy vs float on {self.eval_source} ({self.eval_feeds} feed(s)):")
            lines += format_accuracy(self.accuracy)
        if self.budget:
            b = self.budget
            lines.append(f"  accuracy budget {b.get('spec')}: {'met' if b.get('met') else 'NOT met'}"
                         f" (value {b.get('value')})")
            for r in b.get("reverted", []):
                lines.append(f"    returned to float: {r['node']} (sensitivity: {r['why']})")
            lines += format_sensitivity(b)
        if self.estimate:
            e = self.estimate
            lines.append(f"  estimated on {e['target']}: {e['ratio']:.2f}x float latency ({e['basis']})"
                         if e.get("ratio") is not None else f"  estimated on {e['target']}: none ({e['why']})")
        if self.latency:
            lt = self.latency
            lines.append(f"  latency on the build machine: quantized {lt['quant_ms']:.2f} ms vs float "
                         f"{lt['float_ms']:.2f} ms ({lt['ratio']:.2f}x) on {lt['on']}")
        lines += [f"  warning: {w}" for w in self.warnings]
        if self.passes:
            lines.append(format_report(self.passes))
        return "\n".join(lines)
