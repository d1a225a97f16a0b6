"""The candidates of a sweep: every (model, target, point of the search space), canonical and unique.

A point's options are made canonical (:func:`minirt.builder.sweep.options.canonical`: the options that
do not matter for its quantization mode dropped, defaults filled in), so a space of 4 modes x 3
calibration methods x 2 per-channel settings is 1 float + 1 fp16 + 2 int8-dynamic + 6 int8 = 10
candidates per model and target, not 24 builds of which 14 repeat others.  A candidate's ``id`` is
``model@target#<8 hex digits of its canonical options>``: the same options always give the same id.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools

from minirt.builder.sweep import options as opts
from minirt.builder.sweep.config import SweepConfig


@dataclasses.dataclass(frozen=True)
class Candidate:
    id: str
    model: str
    task: str
    target: str
    options: dict  # canonical (options.canonical)
    label: str  # options.describe

    @property
    def variant(self) -> str:
        """The input-shape variant: candidates of one variant share their prepared data."""
        return opts.canonical_json(self.options.get("input_shapes", {}))


def expand(config: SweepConfig) -> list[Candidate]:
    """Every candidate of the sweep, in config order (model, target, space), each exactly once."""
    out: list[Candidate] = []
    seen: set[tuple] = set()
    for model in config.models:
        names = [n for n in opts.OPTIONS if n in model.space]
        points = [dict(zip(names, values)) for values in itertools.product(*(model.space[n] for n in names))]
        for target in config.targets:
            for point in points:
                options = opts.canonical(point)
                text = opts.canonical_json(options)
                if (model.name, target.name, text) in seen:  # (another point with the same canonical options)
                    continue
                seen.add((model.name, target.name, text))
                cid = f"{model.name}@{target.name}#{hashlib.sha256(text.encode()).hexdigest()[:8]}"
                out.append(Candidate(cid, model.name, model.task, target.name, options, opts.describe(options)))
    ids = [c.id for c in out]
    assert len(set(ids)) == len(ids), "candidate ids collide"  # (8 hex digits of distinct options)
    return out
