"""``minirt sweep``: the best artifact per device, searched over build options, on Ray.

A sweep builds every candidate of a search space (models x targets x build options: quantization
mode, calibration method, per-channel, accuracy budget, opt-level, input shapes ...), evaluates each
on an evaluation set, scores it on accuracy, artifact size and latency modeled from the target
profile, and keeps per target the best candidate within the size and latency limits.  Builds and
evaluation shards are Ray tasks; results are cached by content, so a rerun or an interrupted sweep
resumes.  See docs/sweep.md.

One unit per file:

    config.py     the TOML / YAML configuration, checked (ConfigError names file and key)
    options.py    the build options a sweep searches, their values and canonical form
    space.py      the candidates (canonical, each once)
    data.py       model bytes, calibration and eval arrays, content hashes, shards
    metrics.py    the metrics, per shard and merged
    latency.py    modeled (target cost model) and measured (host) latency
    tasks.py      the Ray tasks' bodies (build, prepare, reference outputs, evaluate a shard)
    cache.py      the content-addressed cache (atomic entries)
    objective.py  limits, the choice, the Pareto sets
    report.py     the CSV / JSON table, Pareto plots, chosen artifacts
    run.py        the driver: run_sweep()

Ray is imported only by run.py, when there is something to run (``pip install 'minirt[sweep]'``).
"""
from __future__ import annotations

from minirt.builder.sweep.config import SweepConfig, load_config
from minirt.builder.sweep.errors import ConfigError, SweepError
from minirt.builder.sweep.run import SweepResult, run_sweep

__all__ = ["ConfigError", "SweepConfig", "SweepError", "SweepResult", "load_config", "run_sweep"]
