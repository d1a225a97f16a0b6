"""Accuracy budget -> mixed precision.

A budget is one condition on the accuracy report (:mod:`builder.quantize.report`)::

    top1-drop<=1        top-1 points lost: accuracy drop with labels, else 100 * (1 - agreement)
    accuracy-drop<=0.5  accuracy points lost (needs labels in the evaluation data)
    cosine>=0.99        smallest cosine similarity over the outputs
    max-abs<=0.05       largest absolute error over the outputs
    mean-abs<=0.01      largest mean absolute error over the outputs

When the fully quantized model misses the budget, each quantized layer's
*sensitivity* is measured by quantizing that layer alone (everything else
float) and scoring the result: the budget's own metric first, then the
cosine deficit (1 - cosine) as a tie-breaker, since one layer alone rarely
flips a top-1 decision.  Layers then go back to float, most sensitive first,
re-evaluating after each, until the budget holds.
"""
from __future__ import annotations

import dataclasses
import re

from minirt.builder.errors import BuildError

_METRICS = {"top1-drop": "<=", "accuracy-drop": "<=", "cosine": ">=", "max-abs": "<=", "mean-abs": "<="}


@dataclasses.dataclass(frozen=True)
class Budget:
    metric: str
    limit: float

    @property
    def spec(self) -> str:
        return f"{self.metric}{_METRICS[self.metric]}{self.limit:g}"

    def value(self, acc: dict) -> float:
        rows = [r for r in acc.values() if "error" not in r]
        if not rows:
            raise BuildError("accuracy budget: no comparable outputs")
        if self.metric == "cosine":
            return min(r["cosine"] for r in rows)
        if self.metric == "max-abs":
            return max(r["max_abs"] for r in rows)
        if self.metric == "mean-abs":
            return max(r["mean_abs"] for r in rows)
        scored = [r for r in rows if "top1_agreement" in r]
        if not scored:
            raise BuildError(f"accuracy budget {self.spec}: no output looks like class scores ([N, C]); "
                             f"use cosine>=X or max-abs<=X")
        if self.metric == "accuracy-drop" or any("float_accuracy" in r for r in scored):
            with_labels = [r for r in scored if "float_accuracy" in r]
            if not with_labels:
                raise BuildError("accuracy budget accuracy-drop needs labels in the evaluation data (key 'label')")
            return max(100.0 * (r["float_accuracy"] - r["quant_accuracy"]) for r in with_labels)
        return max(100.0 * (1.0 - r["top1_agreement"]) for r in scored)

    def met(self, acc: dict) -> bool:
        v = self.value(acc)
        return v >= self.limit if _METRICS[self.metric] == ">=" else v <= self.limit + 1e-9

    def badness(self, acc: dict) -> tuple:
        """Sort key: larger is worse."""
        v = self.value(acc)
        primary = -v if _METRICS[self.metric] == ">=" else v
        cos = min((r["cosine"] for r in acc.values() if "cosine" in r), default=1.0)
        return (round(primary, 9), 1.0 - cos)


def parse_budget(spec) -> Budget | None:
    """``"top1-drop<=1"``, ``"cosine>=0.99"``, ... (or a Budget, or None; "none": None too)."""
    if spec is None or isinstance(spec, Budget):
        return spec
    if str(spec).strip().lower() == "none":
        return None
    m = re.fullmatch(r"\s*([a-z0-9-]+)\s*(<=|>=)\s*([0-9.eE+-]+)\s*", str(spec))
    if not m or m.group(1) not in _METRICS or m.group(2) != _METRICS[m.group(1)]:
        known = ", ".join(f"{k}{op}X" for k, op in _METRICS.items())
        raise BuildError(f"--accuracy-budget {spec!r}: expected one of {known}")
    return Budget(m.group(1), float(m.group(3)))


def fit_budget(budget: Budget, names: list[str], evaluate, say=lambda msg: None, cost=None,
               max_cost: float | None = None) -> dict:
    """Return layers to float until ``evaluate(quantized_names) -> accuracy`` meets ``budget``.

    With ``cost(name) -> float`` and ``max_cost``, a layer whose return to float would take the
    summed cost of the returned layers beyond ``max_cost`` stays quantized (e.g. a size cap); the
    budget may then be missed (``capped`` lists those layers).

    Returns ``{"spec", "met", "value", "quantized", "reverted": [{"node", "why", "score"}],
    "sensitivity": {node: score}, "evaluations"}``.
    """
    acc = evaluate(list(names))
    evaluations = 1
    result = {"spec": budget.spec, "met": budget.met(acc), "value": budget.value(acc), "quantized": list(names),
              "reverted": [], "sensitivity": {}, "accuracy": acc}
    if result["met"]:
        result["evaluations"] = evaluations
        return result
    say(f"budget {budget.spec} missed ({budget.value(acc):.4g}); measuring the sensitivity of {len(names)} layers")
    scores = {}
    for name in names:
        a = evaluate([name])
        evaluations += 1
        scores[name] = (budget.badness(a), a)
    order = sorted(names, key=lambda n: scores[n][0], reverse=True)
    result["sensitivity"] = {n: {"metric": budget.value(scores[n][1]), "cosine_deficit": scores[n][0][1]}
                             for n in order}
    keep = list(names)
    spent, capped = 0.0, []
    for name in order:
        if cost is not None and max_cost is not None and spent + cost(name) > max_cost:
            capped.append(name)
            continue
        spent += cost(name) if cost is not None else 0.0
        keep.remove(name)
        acc = evaluate(keep)
        evaluations += 1
        alone = scores[name][1]
        why = f"quantized alone: {budget.metric} {budget.value(alone):.4g}"
        if budget.metric != "cosine":
            why += f", cosine {1 - scores[name][0][1]:.5f}"
        result["reverted"].append({"node": name, "why": why, "score": list(scores[name][0])})
        if budget.met(acc):
            break
    result.update(met=budget.met(acc), value=budget.value(acc), quantized=keep, accuracy=acc, evaluations=evaluations)
    if capped:
        result["capped"] = capped
    return result
