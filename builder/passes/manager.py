"""Pass infrastructure: the pass base class, the pass manager and the build report.

A pass is a named, in-place onnx-ir pass (``onnx_ir.passes.InPlacePass``):
``pass_(model)`` returns ``PassResult(model, modified)``.  Passes here also
receive an :class:`OptimizeContext` (options shared by the whole pipeline:
input shapes, the constant-folding size cap) and may *refuse* a match: a
pattern that matched structurally but failed a check is recorded with the
reason, so the build report can say why a fusion did not happen.

The :class:`PassManager` runs a pipeline (an ordered list of passes) again
and again until a whole sweep changes nothing (a fixed point) or
``max_iterations`` sweeps ran, timing each pass and counting nodes around
it.  ``--disable-pass NAME`` removes a pass from the pipeline by name.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Iterable, Mapping, Sequence

import onnx_ir as ir

from minirt.builder import ir_helpers as irh
from minirt.tools.reports import format_report  # noqa: F401  (re-exported: the builder prints it)


@dataclasses.dataclass
class OptimizeContext:
    """Options every pass can read."""

    input_shapes: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
    # Largest constant (in bytes) that folding may create.  Folding a huge
    # ConstantOfShape/Expand/Tile would turn a few bytes of graph into
    # megabytes of artifact; above the cap the node is kept and the refusal
    # is reported.
    fold_size_limit: int = 1 << 20
    opt_level: int = 2


@dataclasses.dataclass
class Refusal:
    pattern: str
    node: str
    reason: str

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Pass(ir.passes.InPlacePass):
    """Base class of minirt's passes.

    Subclasses set ``name`` (what ``--disable-pass`` and the report use) and
    implement :meth:`run`, returning whether they changed the model.  They
    call :meth:`refuse` for a match they declined.
    """

    name: str = ""

    def __init__(self, context: OptimizeContext | None = None):
        super().__init__()
        self.context = context or OptimizeContext()
        self.refusals: list[Refusal] = []

    def refuse(self, pattern: str, node: ir.Node | str, reason: str) -> None:
        name = node if isinstance(node, str) else (node.name or node.op_type)
        self.refusals.append(Refusal(pattern, name, reason))

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        irh.forget_names(model)
        try:
            modified = bool(self.run(model))
        finally:
            irh.forget_names(model)
        return ir.passes.PassResult(model, modified)

    def run(self, model: ir.Model) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclasses.dataclass
class PassRow:
    """One row of the report: a pass summed over every sweep it ran in."""

    name: str
    runs: int = 0
    changed_runs: int = 0
    nodes_before: int = 0  # node count before its first run
    nodes_after: int = 0  # node count after its last run
    nodes_removed: int = 0  # sum over runs of (before - after)
    seconds: float = 0.0
    refused: list = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["seconds"] = round(self.seconds, 6)
        return d


@dataclasses.dataclass
class OptimizationReport:
    opt_level: int
    pipeline: list
    disabled: list
    nodes_before: int = 0
    nodes_after: int = 0
    iterations: int = 0
    converged: bool = True
    seconds: float = 0.0
    passes: list = dataclasses.field(default_factory=list)  # [PassRow]
    # what ran: "optimizer", or "quantizer (MODE)" for the quantizer's rewrite passes (builder/quantize/passes)
    stage: str = "optimizer"

    @property
    def refused(self) -> list:
        return [r for row in self.passes for r in row.refused]

    def as_dict(self) -> dict:
        return {
            "stage": self.stage,
            "opt_level": self.opt_level,
            "pipeline": list(self.pipeline),
            "disabled": list(self.disabled),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "iterations": self.iterations,
            "converged": self.converged,
            "seconds": round(self.seconds, 6),
            "passes": [row.as_dict() for row in self.passes],
        }

    def __str__(self) -> str:
        return format_report(self.as_dict())


class PassManager:
    """Run ``passes`` in order, repeating the sweep until nothing changes."""

    def __init__(self, passes: Sequence[Pass], max_iterations: int = 8, max_refusals_per_pass: int = 50):
        self.passes = list(passes)
        self.max_iterations = max_iterations
        self.max_refusals_per_pass = max_refusals_per_pass

    def run(self, model: ir.Model, report: OptimizationReport) -> OptimizationReport:
        rows = {p.name: PassRow(p.name) for p in self.passes}
        report.passes = list(rows.values())
        start = time.perf_counter()
        report.nodes_before = irh.count_nodes(model)
        report.converged = False
        for iteration in range(self.max_iterations):
            report.iterations = iteration + 1
            any_change = False
            for p in self.passes:
                row = rows[p.name]
                before = irh.count_nodes(model)
                if row.runs == 0:
                    row.nodes_before = before
                p.refusals = []
                t0 = time.perf_counter()
                result = p(model)
                row.seconds += time.perf_counter() - t0
                after = irh.count_nodes(model)
                row.runs += 1
                row.nodes_after = after
                row.nodes_removed += before - after
                if result.modified:
                    row.changed_runs += 1
                    any_change = True
                # Refusals are re-derived every sweep; the last sweep's are the
                # ones that still stand at the fixed point.
                row.refused = [r.as_dict() for r in p.refusals[: self.max_refusals_per_pass]]
            if not any_change:
                report.converged = True
                break
        report.nodes_after = irh.count_nodes(model)
        report.seconds = time.perf_counter() - start
        return report


def select(passes: Iterable[type], disabled: Iterable[str], known: Iterable[str]) -> list:
    disabled = list(disabled)
    unknown = sorted(set(disabled) - set(known))
    if unknown:
        raise ValueError(f"--disable-pass: unknown pass name(s) {unknown}; known passes: {sorted(known)}")
    return [p for p in passes if p.name not in disabled]
