"""The sweep's driver: candidates -> cache lookups -> Ray tasks -> rows -> choice -> files.

:func:`run_sweep` expands the candidates (space.py), takes every one whose build and evaluation are
in the cache (cache.py) as they are, and submits the rest to Ray at once, as a graph of tasks
(tasks.py) joined by object references, so Ray runs each task as soon as its inputs exist:

    prepare(calibration, variant) ─┐
    model bytes (put once) ────────┴─> build_candidate ─┬─> evaluate_shard(shard 0, + host latency)
    prepare(eval shard i, variant) ─────────────────────┴─> evaluate_shard(shard i) ...
    (reference metrics: a float build on generic -> reference_outputs(shard i) -> evaluate_shard(shard i))

Every task may be retried by Ray (``max_retries``) when its worker dies; a task that raises is not
retried (the error is the row's).  The driver writes a candidate's cache entries when all its tasks
are done, so what an interrupted sweep finished is kept and a rerun resumes from there.  The final
table holds every candidate exactly once (asserted).  Ray is started here only when something is
left to run: locally (``ray.init(num_cpus=workers)``) or joined at ``address``; a Ray already
initialised in this process (a test's cluster, a notebook's) is used as it is.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from pathlib import Path
from typing import Any, Callable

from minirt.builder.sweep import cache as cache_mod
from minirt.builder.sweep import objective, report, tasks
from minirt.builder.sweep import options as opts
from minirt.builder.sweep.config import ModelSpec, SweepConfig, TargetSpec, load_config
from minirt.builder.sweep.data import check_variant, load_model_data, shard_bounds, take
from minirt.builder.sweep.errors import SweepError
from minirt.builder.sweep.metrics import merge
from minirt.builder.sweep.space import Candidate, expand

MAX_RETRIES = 3  # per task, for a worker that dies (os._exit, OOM kill, a lost node)
REFERENCE_TARGET = "generic"
_OPTION_COLUMNS = [n for n in opts.OPTIONS]


@dataclasses.dataclass
class SweepResult:
    name: str
    rows: list  # one per candidate, in candidate order
    choices: list  # one per (task, target): {"task", "target", "candidate" (id or None), "reason", ...}
    out_dir: Path
    csv_path: Path
    json_path: Path
    plots: list
    wall_s: float
    workers: str
    executed: int  # candidates computed in this run (the others came from the cache)

    @property
    def by_id(self) -> dict:
        return {r["candidate"]: r for r in self.rows}

    def chosen(self) -> dict:
        """(task, target) -> chosen candidate id (None: nothing met the limits)."""
        return {(c["task"], c["target"]): c["candidate"] for c in self.choices}


def import_ray():
    if importlib.util.find_spec("ray") is None:
        raise SweepError("minirt sweep runs its builds on Ray, which is not installed: pip install 'minirt[sweep]' "
                         "(or pip install 'ray>=2.9')")
    import ray

    return ray


def _start_ray(ray, workers: int | None, address: str | None, say: Callable[[str], None]) -> tuple[bool, str]:
    """(whether this call started Ray, a description of the workers)."""
    import logging

    if ray.is_initialized():
        if workers is not None or address is not None:
            say("Ray is already initialised in this process: --workers / --address ignored")
        return False, f"the running Ray cluster ({_cpus(ray)} CPUs)"
    env = {"env_vars": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}}
    if address is not None:
        _check_reachable(address)
    try:
        if address is not None:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, runtime_env=env)
            return True, f"the Ray cluster at {address} ({_cpus(ray)} CPUs)"
        n = workers or os.cpu_count() or 1
        # (address "local": a new instance even where a cluster started by `ray start` runs, or left its
        # address file behind)
        ray.init(address="local", num_cpus=n, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False, runtime_env=env)
        return True, f"{n} local Ray worker{'s' if n != 1 else ''}"
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        where = f"the Ray cluster at {address}" if address else "a local Ray instance"
        raise SweepError(f"cannot start or join {where}: {exc}") from None


def _check_reachable(address: str) -> None:
    """A ``HOST:PORT`` address whose port does not answer fails at once (Ray itself retries for minutes)."""
    import re
    import socket

    m = re.fullmatch(r"([^:/\s]+):(\d+)", address.strip())
    if m is None:  # ("auto", "ray://..."): Ray's own checks
        return
    try:
        socket.create_connection((m.group(1), int(m.group(2))), timeout=5).close()
    except OSError as exc:
        raise SweepError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); start one "
                         "with 'ray start --head', or leave --address out to run on this machine") from None


def _cpus(ray) -> int:
    return int(ray.cluster_resources().get("CPU", 0))


def _error_text(exc: BaseException) -> str:
    """A Ray error as one line: the cause's type and message, no traceback."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}".splitlines()[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"


@dataclasses.dataclass
class _Job:
    candidate: Candidate
    build_key: str
    eval_key: str
    cached_build: tuple | None  # (meta, bytes) from the cache
    meta_ref: Any = None
    art_ref: Any = None
    eval_refs: list = dataclasses.field(default_factory=list)
    writes_build: bool = False  # this job's build is submitted here and written by it


class _Sweep:
    def __init__(self, cfg: SweepConfig, cache: cache_mod.Cache, say: Callable[[str], None]):
        self.cfg = cfg
        self.cache = cache
        self.say = say
        self.models: dict[str, ModelSpec] = {m.name: m for m in cfg.models}
        self.targets: dict[str, TargetSpec] = {t.name: t for t in cfg.targets}
        self.data = {m.name: load_model_data(m, cfg.path.name) for m in cfg.models}
        self.bounds = {m.name: shard_bounds(self.data[m.name].samples, cfg.shard_size) for m in cfg.models}

    # --- keys ---------------------------------------------------------------------------------------

    def build_key(self, model: str, target: str, options: dict) -> str:
        m, d = self.models[model], self.data[model]
        quantized = options["quantize"] != "none"
        calib = None
        if quantized and d.calibration_hash is not None:
            calib = {"data": d.calibration_hash, "preprocess": d.preprocess_id,
                     "shapes": options.get("input_shapes", {})}
        profile = self.targets[target].profile
        return cache_mod.key({"kind": "build", "model": d.sha256, "options": options, "fixed": m.fixed,
                              "target": profile.as_metadata(), "calibration": calib})

    def eval_key(self, model: str, build_key: str, options: dict) -> str:
        m, d = self.models[model], self.data[model]
        from minirt.builder.sweep.data import function_id

        return cache_mod.key({"kind": "eval", "build": build_key, "data": d.eval_hash, "preprocess": d.preprocess_id,
                              "shapes": options.get("input_shapes", {}), "output": m.output,
                              "batch": self.cfg.eval_batch,
                              "metric": m.metric.name if m.metric.user is None else
                              function_id(m.metric.user, m.metric.user_name)})

    # --- rows ---------------------------------------------------------------------------------------

    def row(self, c: Candidate, bkey: str, ekey: str, meta: dict | None, result: dict | None, cached: bool,
            error: str | None = None) -> dict:
        m, t = self.models[c.model], self.targets[c.target]
        r: dict[str, Any] = {"candidate": c.id, "model": c.model, "task": c.task, "target": c.target, "label": c.label}
        for name in _OPTION_COLUMNS:
            r[name] = c.options.get(name)
        r.update({"metric": m.metric.label, "cached": cached, "build_key": bkey, "eval_key": ekey, "error": error})
        if error is not None:
            r["status"] = "error"
            return r
        r["build_s"] = meta.get("build_s")
        if meta["status"] != "ok":
            r.update({"status": "failed", "error": meta.get("error")})
            return r
        cost = meta.get("modeled_cost")
        r.update({
            "status": "ok",
            "quantize_built": meta.get("quantize_built") or "none",
            "size_bytes": meta["size_bytes"],
            "modeled_cost_mmac": None if cost is None else cost / 1e6,
            "latency_modeled_ms": None if cost is None or t.gmacs is None else cost / (t.gmacs * 1e6),
            "latency_modeled_basis": f"{meta.get('modeled_basis')}; {t.gmacs_basis}",
            "accuracy": result["accuracy"],
            "latency_host_ms": None if result.get("host_latency_s") is None else result["host_latency_s"] * 1e3,
            "latency_host_basis": (f"measured: median of {result.get('latency_runs', self.cfg.latency_runs)} batch-1 "
                                   f"runs, 1 thread, on {result.get('host')} while the sweep ran (not the device)"
                                   if result.get("host_latency_s") is not None else None),
            "eval_s": result.get("eval_s"),
            "eval_samples": result.get("samples"),
            "eval_shards": result.get("shards"),
        })
        return r

    # --- Ray ----------------------------------------------------------------------------------------

    def run_jobs(self, ray, jobs: list[_Job], on_row: Callable[[dict], None]) -> None:
        task_opts = {"max_retries": MAX_RETRIES, "retry_exceptions": False, "num_cpus": 1}
        prepare_r = ray.remote(tasks.prepare).options(**task_opts)
        build_r = ray.remote(tasks.build_candidate).options(num_returns=2, **task_opts)
        reference_r = ray.remote(tasks.reference_outputs).options(**task_opts)
        evaluate_r = ray.remote(tasks.evaluate_shard).options(**task_opts)
        model_refs: dict[str, Any] = {}
        raw_shards: dict[str, list] = {}
        raw_calib: dict[str, Any] = {}
        calib_refs: dict[tuple, Any] = {}
        shard_refs: dict[tuple, list] = {}
        reference_refs: dict[tuple, list] = {}
        builds: dict[str, tuple] = {}  # build key -> (meta ref, artifact ref), submitted once

        def shards(model: str, variant: str, shapes: dict) -> list:
            key = (model, variant)
            if key not in shard_refs:
                m, d = self.models[model], self.data[model]
                if model not in raw_shards:
                    raw_shards[model] = [ray.put(take(d.eval, a, b)) for a, b in self.bounds[model]]
                shard_refs[key] = (raw_shards[model] if m.preprocess is None else
                                   [prepare_r.remote(m.preprocess, s, shapes) for s in raw_shards[model]])
            return shard_refs[key]

        def calibration(model: str, variant: str, shapes: dict):
            m, d = self.models[model], self.data[model]
            if d.calibration is None:
                return None
            key = (model, variant)
            if key not in calib_refs:
                if model not in raw_calib:
                    raw_calib[model] = ray.put(d.calibration)
                calib_refs[key] = (raw_calib[model] if m.preprocess is None else
                                   prepare_r.remote(m.preprocess, raw_calib[model], shapes))
            return calib_refs[key]

        def model_ref(model: str):
            if model not in model_refs:
                model_refs[model] = ray.put(self.data[model].payload)
            return model_refs[model]

        def references(model: str, variant: str, shapes: dict) -> list:
            key = (model, variant)
            if key not in reference_refs:
                m = self.models[model]
                options = opts.canonical({"quantize": "none", "input_shapes": shapes})
                _, art = build_r.remote(model_ref(model), self.data[model].sha256, opts.build_kwargs(options, m.fixed),
                                        REFERENCE_TARGET, None, m.fixed)
                reference_refs[key] = [reference_r.remote(art, s, m.input_names, self.cfg.eval_batch)
                                       for s in shards(model, variant, shapes)]
            return reference_refs[key]

        for job in jobs:
            c = job.candidate
            m = self.models[c.model]
            shapes = c.options.get("input_shapes", {})
            if job.cached_build is not None:
                meta, data = job.cached_build
                job.art_ref = ray.put(data) if data is not None else None
            elif job.build_key in builds:
                job.meta_ref, job.art_ref = builds[job.build_key]
            else:
                job.meta_ref, job.art_ref = build_r.remote(
                    model_ref(c.model), self.data[c.model].sha256, opts.build_kwargs(c.options, m.fixed), c.target,
                    calibration(c.model, c.variant, shapes), m.fixed)
                builds[job.build_key] = (job.meta_ref, job.art_ref)
                job.writes_build = True
            refs = references(c.model, c.variant, shapes) if m.metric.needs_reference else None
            job.eval_refs = [
                evaluate_r.remote(job.art_ref, s, refs[i] if refs else None, m.metric, m.input_names, m.output,
                                  self.cfg.eval_batch, self.cfg.latency_runs if i == 0 else 0)
                for i, s in enumerate(shards(c.model, c.variant, shapes))]

        waiting = {id(j): j for j in jobs}
        owner: dict[Any, int] = {}
        for j in jobs:
            for ref in ([j.meta_ref] if j.meta_ref is not None else []) + j.eval_refs:
                owner[ref] = id(j)
        left = {jid: sum(1 for o in owner.values() if o == jid) for jid in waiting}
        # An interruption (Ctrl-C, a progress callback that raises) leaves the submitted tasks alone: ray.cancel
        # racing with tasks that complete meanwhile aborted the driver process in Ray 2.60 ("Tried to complete
        # task that was not pending", task_manager.cc), and their results are not needed.  A sweep that started
        # Ray stops them by shutting it down (run_sweep); on a cluster it joined they finish and are dropped.
        remaining = list(owner)
        while remaining:
            ready, remaining = ray.wait(remaining, num_returns=1)
            if remaining:  # (everything else already done: handled in this pass too)
                more, remaining = ray.wait(remaining, num_returns=len(remaining), timeout=0)
                ready += more
            for ref in ready:
                jid = owner[ref]
                left[jid] -= 1
                if left[jid] == 0:
                    on_row(self.finish(ray, waiting.pop(jid)))
        assert not waiting, f"{len(waiting)} candidate(s) never finished"

    def finish(self, ray, job: _Job) -> dict:
        """A job whose tasks are all done -> its row; its cache entries written."""
        c = job.candidate
        m = self.models[c.model]
        try:
            if job.cached_build is not None:
                meta, data = job.cached_build
            else:
                meta = ray.get(job.meta_ref)
                data = ray.get(job.art_ref) if meta["status"] == "ok" else None
                if job.writes_build:  # (a failure the builder reported is deterministic: cached as well)
                    self.cache.put_build(job.build_key, meta, data)
            if meta["status"] != "ok":
                return self.row(c, job.build_key, job.eval_key, meta, None, cached=False)
            stats = ray.get(job.eval_refs)
        except ray.exceptions.RayError as exc:  # a task that raised, or died more than MAX_RETRIES times
            return self.row(c, job.build_key, job.eval_key, None, None, cached=False, error=_error_text(exc))
        try:
            score = merge(m.metric, stats)
        except (ValueError, KeyError, ZeroDivisionError) as exc:
            return self.row(c, job.build_key, job.eval_key, None, None, cached=False,
                            error=f"metric {m.metric.label}: {exc}")
        first = stats[0]
        result = {"accuracy": score, "metric": m.metric.label, "samples": sum(s["n"] for s in stats),
                  "shards": len(stats), "eval_s": sum(s.get("eval_s", 0.0) for s in stats),
                  "host_latency_s": first.get("host_latency_s"), "host": first.get("host"),
                  "latency_runs": self.cfg.latency_runs}
        self.cache.put_eval(job.eval_key, result)
        return self.row(c, job.build_key, job.eval_key, meta, result, cached=False)


def _fmt_row(r: dict) -> str:
    if r["status"] != "ok":
        return f"{r['status']}: {r.get('error')}"
    lat = f"{r['latency_modeled_ms']:.4g} ms modeled" if r.get("latency_modeled_ms") is not None else "latency unknown"
    return f"{r['metric']} {r['accuracy']:.4g}, {r['size_bytes'] / 1024:.1f} KiB, {lat}"


def run_sweep(config: SweepConfig | str | os.PathLike, *, workers: int | None = None, address: str | None = None,
              cache_dir: str | os.PathLike | None = None, out_dir: str | os.PathLike | None = None,
              use_cache: bool = True, progress: Callable[[str], None] | None = None) -> SweepResult:
    """Run the sweep described by ``config`` (a path or a loaded :class:`SweepConfig`); see the module
    docstring.  ``use_cache=False`` recomputes everything (the cache is still written)."""
    t_start = time.perf_counter()
    say = progress or (lambda message: None)
    cfg = config if isinstance(config, SweepConfig) else load_config(config)
    out = Path(out_dir) if out_dir is not None else cfg.output_dir
    out.mkdir(parents=True, exist_ok=True)
    cache = cache_mod.Cache(Path(cache_dir) if cache_dir is not None else cfg.cache_dir, enabled=use_cache)
    candidates = expand(cfg)
    sweep = _Sweep(cfg, cache, say)
    for model in cfg.models:  # (every input-shape variant's data checked on one sample before any task)
        for variant in sorted({c.variant for c in candidates if c.model == model.name}):
            shapes = next(c.options.get("input_shapes", {}) for c in candidates
                          if c.model == model.name and c.variant == variant)
            check_variant(model, sweep.data[model.name], shapes, cfg.path.name)

    rows: dict[str, dict] = {}
    jobs: list[_Job] = []
    for c in candidates:
        bkey = sweep.build_key(c.model, c.target, c.options)
        ekey = sweep.eval_key(c.model, bkey, c.options)
        built = cache.get_build(bkey)
        evaluated = cache.get_eval(ekey) if built is not None else None
        if built is not None and (built[0]["status"] != "ok" or evaluated is not None):
            rows[c.id] = sweep.row(c, bkey, ekey, built[0], evaluated, cached=True)
        else:
            jobs.append(_Job(c, bkey, ekey, built))
    total = len(candidates)
    per_model = {m.name: sum(1 for c in candidates if c.model == m.name) for m in cfg.models}
    say(f"{total} candidates ({', '.join(f'{k} {v}' for k, v in per_model.items())}; {len(cfg.targets)} targets): "
        f"{len(rows)} from the cache, {len(jobs)} to run")
    best: dict[tuple, dict] = {}
    higher = {m.task: m.metric.higher_is_better for m in cfg.models}
    done = [0]

    def on_row(r: dict) -> None:
        rows[r["candidate"]] = r
        done[0] += 1
        say(f"[{len(rows)}/{total}] {r['candidate']} {r['label']}: {_fmt_row(r)}{' (cached)' if r.get('cached') else ''}")
        ok, _ = objective.feasibility(r, *cfg.limits(r["model"], r["target"]))
        key = (r["task"], r["target"])
        if ok and (key not in best or objective.rank_key(r, higher[r["task"]]) < objective.rank_key(best[key], higher[r["task"]])):
            best[key] = r
            say(f"  best so far for {r['task']} @ {r['target']}: {r['label']} ({_fmt_row(r)})")

    for r in list(rows.values()):  # (the cached ones count towards the best so far too)
        if objective.feasibility(r, *cfg.limits(r["model"], r["target"]))[0]:
            key = (r["task"], r["target"])
            if key not in best or objective.rank_key(r, higher[r["task"]]) < objective.rank_key(best[key], higher[r["task"]]):
                best[key] = r
    workers_text = "no workers (everything from the cache)"
    if jobs:
        ray = import_ray()
        started, workers_text = _start_ray(ray, workers, address, say)
        say(f"running {len(jobs)} candidates on {workers_text}")
        try:
            for module in cfg.user_modules:  # (workers may not import modules beside the config: send them)
                ray.cloudpickle.register_pickle_by_value(module)
            sweep.run_jobs(ray, jobs, on_row)
        finally:
            if started:
                ray.shutdown()

    ordered = [rows[c.id] for c in candidates if c.id in rows]
    missing = [c.id for c in candidates if c.id not in rows]
    ids = [r["candidate"] for r in ordered]
    assert not missing and len(ids) == len(set(ids)) == total, \
        f"the results table is incomplete or repeats candidates: missing {missing[:5]}, {len(ids) - len(set(ids))} repeated"
    return _finish(cfg, sweep, ordered, out, t_start, workers_text, len(jobs))


def _finish(cfg: SweepConfig, sweep: _Sweep, rows: list[dict], out: Path, t_start: float, workers_text: str,
            executed: int) -> SweepResult:
    """Feasibility, Pareto sets and choices; the table, the plots and the chosen artifacts."""
    higher = {m.task: m.metric.higher_is_better for m in cfg.models}
    metric_names = {m.task: m.metric.label for m in cfg.models}
    tasks_ = list(dict.fromkeys(m.task for m in cfg.models))
    choices = []
    chosen_ids: dict[tuple, str | None] = {}
    for t in cfg.targets:
        for task in tasks_:
            group = [r for r in rows if r["task"] == task and r["target"] == t.name]
            for r in group:
                ok, why = objective.feasibility(r, *cfg.limits(r["model"], t.name))
                r["feasible"] = ok
                r["infeasible_reason"] = None if ok else why
            front = objective.pareto(group, higher[task])
            for r in group:
                r["pareto"] = r["candidate"] in front
            pick = objective.best([r for r in group if r["feasible"]], higher[task])
            chosen_ids[(task, t.name)] = pick["candidate"] if pick else None
            for r in group:
                r["chosen"] = pick is not None and r["candidate"] == pick["candidate"]
            usable = [r for r in group if objective.usable(r)]
            max_size, max_latency = cfg.limits(next(m.name for m in cfg.models if m.task == task), t.name)
            reason = "" if pick else (
                "no candidate built and evaluated" if not usable else
                f"none of {len(usable)} candidates meets the limits (max_size {max_size}, max_latency_ms "
                f"{max_latency}); the best overall is {objective.best(usable, higher[task])['candidate']}")
            choices.append({"task": task, "target": t.name, "candidate": pick["candidate"] if pick else None,
                            "reason": reason, "metric": metric_names[task], "higher_is_better": higher[task],
                            "max_size": max_size, "max_latency_ms": max_latency,
                            "feasible_count": sum(1 for r in group if r["feasible"]), "candidates": len(group)})
    for choice in choices:
        row = next((r for r in rows if r["candidate"] == choice["candidate"]), None)
        artifact = meta = None
        if row is not None:
            got = sweep.cache.get_build(row["build_key"], always=True)  # (a --rebuild run: what it just wrote)
            if got is None or got[1] is None:
                raise SweepError(f"the cache lost the artifact of {row['candidate']} ({sweep.cache.folder}): "
                                 "was it removed while the sweep ran? Run the sweep again")
            meta, artifact = got
        paths = report.write_chosen(choice, row, artifact, meta, out)
        choice["artifact"], choice["report"] = paths["artifact"], paths["report"]
    header = {
        "sweep": cfg.name, "config": str(cfg.path), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "workers": workers_text,
        "targets": [{"name": t.name, "gmacs": t.gmacs, "gmacs_basis": t.gmacs_basis, "max_size": t.max_size,
                     "max_latency_ms": t.max_latency_ms} for t in cfg.targets],
        "tasks": {task: {"metric": metric_names[task], "higher_is_better": higher[task]} for task in tasks_},
        "latency_note": "latency_modeled_ms: the target profile's cost model (builder/quantize/cost.py) at the "
                        "target's GMAC/s, one core, batch 1 - what the objective uses; latency_host_ms: timed on "
                        "the sweep's own machine, for information only",
        "chosen": choices,
    }
    csv_path, json_path = report.write_table(rows, out, header)
    plots = []
    for t in cfg.targets:
        groups = {task: [r for r in rows if r["task"] == task and r["target"] == t.name] for task in tasks_}
        limits = {task: dict(zip(("max_size", "max_latency_ms"),
                                 cfg.limits(next(m.name for m in cfg.models if m.task == task), t.name)))
                  for task in tasks_}
        chosen = {task: chosen_ids[(task, t.name)] for task in tasks_}
        plots.append(str(report.plot_target(t.name, groups, metric_names, higher, limits, chosen,
                                            out / f"pareto-{t.name}.png")))
    return SweepResult(name=cfg.name, rows=rows, choices=choices, out_dir=out, csv_path=csv_path, json_path=json_path,
                       plots=plots, wall_s=time.perf_counter() - t_start, workers=workers_text, executed=executed)


__all__ = ["MAX_RETRIES", "SweepResult", "import_ray", "run_sweep"]
