"""Reading and checking a sweep configuration (TOML, or YAML when PyYAML is installed).

::

    [sweep]                      # optional
    output = "sweep-results"     # the table, plots and chosen artifacts (relative to this file)
    cache = ".minirt-sweep"      # the content-addressed cache (default: .minirt-sweep beside this file)
    shard_size = 256             # evaluation samples per Ray task
    eval_batch = 1               # samples per run (int8-dynamic results depend on it; the device's is usual)
    latency_runs = 10            # host latency: median of this many runs of one sample

    [objective]                  # maximize the metric subject to these, per target
    max_size = "64 KiB"          # artifact bytes (an integer, or "64 KiB", "1.5 MB", ...)
    max_latency_ms = 2.0         # latency modeled from the target profile (never the host's timing)

    [[targets]]                  # or: targets = ["rpi4", "rpi5"]
    name = "rpi4"                # a profile of targets/profiles.py (minirt build --target)
    gmacs = 4.3                  # optional: float32 multiply-adds per second (1e9) of one core
    max_latency_ms = 5.0         # optional: this target's own limits

    [space]                      # every combination is a candidate, per model and target
    quantize = ["none", "fp16", "int8-dynamic", "int8"]
    calibration_method = ["minmax", "entropy"]
    per_channel = [true, false]

    [[models]]
    name = "digits"
    path = "digits_cnn.onnx"     # or: package = "rapidocr_onnxruntime", file = "models/x.onnx"
    calibration = "calib.npz"    # arrays keyed by input name, samples stacked on axis 0
    eval = "heldout.npz"         # the same, and the labels ("label") for accuracy metrics
    metric = "accuracy"          # builder/sweep/metrics.py, or "module:function"
    preprocess = "data:prep"     # optional: function(arrays, input_shapes) -> feeds, per shard
    task = "digits"              # optional: models of one task compete for one choice per target
    options = { input_values = { sr = 16000 } }   # optional: fixed build options
    space = { input_shapes = [{ image = "1x1x8x8" }] }  # optional: this model's own space entries

Every mistake is a :class:`ConfigError` naming the file, the key (``models[1].space.quantize[2]``),
the value and what was expected.  ``module:function`` names are looked up beside the config first.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable

from minirt.builder.sweep import metrics as metrics_mod
from minirt.builder.sweep import options as opts
from minirt.builder.sweep.errors import ConfigError
from minirt.targets.profiles import TargetProfile, get_target, target_names

TOP_KEYS = ("sweep", "models", "targets", "space", "objective")
SWEEP_KEYS = ("name", "output", "cache", "shard_size", "eval_batch", "latency_runs")
MODEL_KEYS = ("name", "path", "package", "file", "task", "calibration", "eval", "metric", "higher_is_better",
              "output", "preprocess", "options", "space", "max_size", "max_latency_ms")
TARGET_KEYS = ("name", "gmacs", "max_size", "max_latency_ms")
OBJECTIVE_KEYS = ("max_size", "max_latency_ms")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# float32 multiply-adds per second (in 1e9) of one core of each profile's CPU, for the modeled latency:
# the core's peak FMA rate (lanes x FMA pipes x clock) x 0.6, a GEMM's usual share of it.  Assumed from
# the CPUs' published figures, not measured on the devices: give `gmacs` in the config to override.
# (generic and host have none: their CPU is not known.)
ASSUMED_GMACS = {
    "rpi3": 1.4,   # Cortex-A53 1.2 GHz, 2 float32 FMAs / cycle
    "rpi4": 4.3,   # Cortex-A72 1.8 GHz, 4 / cycle
    "rpi5": 11.5,  # Cortex-A76 2.4 GHz, 8 / cycle
    "macos": 30.0, "ios": 30.0,  # Apple P-core 3.2 GHz, 16 / cycle (the CPU partition only)
    "x86-64-v3": 29.0,  # 2 x 256-bit FMA at 3 GHz
    "x86-64-v4": 58.0,  # 2 x 512-bit FMA at 3 GHz
    **{f"android-api{level}": 11.5 for level in range(27, 35)},  # a Cortex-A76-class big core
}


@dataclasses.dataclass
class TargetSpec:
    name: str
    profile: TargetProfile
    gmacs: float | None  # None: no modeled latency in ms (only the cost in multiply-adds)
    gmacs_basis: str
    max_size: int | None
    max_latency_ms: float | None


@dataclasses.dataclass
class ModelSpec:
    name: str
    task: str
    path: Path
    input_names: list
    calibration: Path | None
    eval: Path
    metric: metrics_mod.Metric
    output: str | None
    preprocess: Callable | None
    preprocess_name: str
    fixed: dict  # fixed build options (input_values)
    space: dict  # option -> list of checked values (the sweep's space with this model's entries)
    key: str  # "models[i]" (for messages)
    max_size: int | None = None  # this model's own limits (over the target's and the objective's)
    max_latency_ms: float | None = None


@dataclasses.dataclass
class SweepConfig:
    path: Path
    name: str
    models: list
    targets: list
    space: dict
    max_size: int | None
    max_latency_ms: float | None
    output_dir: Path
    cache_dir: Path
    shard_size: int
    latency_runs: int
    eval_batch: int = 1
    user_modules: list = dataclasses.field(default_factory=list)  # modules of module:function names

    def limits(self, model: str, target: str) -> tuple[int | None, float | None]:
        """(max_size, max_latency_ms) of ``model`` on ``target``: the model's own, else the target's, else
        the objective's (the target's already fall back to the objective's)."""
        m = next(x for x in self.models if x.name == model)
        t = next(x for x in self.targets if x.name == target)
        return (m.max_size if m.max_size is not None else t.max_size,
                m.max_latency_ms if m.max_latency_ms is not None else t.max_latency_ms)


def _read(path: Path) -> dict:
    suffix = path.suffix.lower()
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), "no such file") from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
    if suffix == ".toml":
        import tomllib

        try:
            data = tomllib.loads(text.decode("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(path.name, f"not valid TOML: {exc}") from None
    elif suffix in (".yaml", ".yml"):
        if importlib.util.find_spec("yaml") is None:
            raise ConfigError(path.name, "YAML configs need PyYAML, which is not installed: pip install pyyaml "
                                         "(or pip install 'minirt[sweep]'), or write the config as TOML")
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(path.name, f"not valid YAML: {exc}") from None
    else:
        raise ConfigError(path.name, f"unknown config format {suffix or '(no suffix)'!r}: expected .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise ConfigError(path.name, f"expected a table of {', '.join(TOP_KEYS)} at the top, got {type(data).__name__}")
    return data


class _Where:
    """Builds ``FILE: key.path`` locations for messages."""

    def __init__(self, file: str):
        self.file = file

    def __call__(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: {key}" if key else self.file, message)


def _keys(err: _Where, table: Any, key: str, allowed: tuple, required: tuple = ()) -> dict:
    if not isinstance(table, dict):
        raise err(key, f"expected a table with keys {', '.join(allowed)}, got {table!r}")
    for k in table:
        if k not in allowed:
            raise err(f"{key}.{k}" if key else k, f"unknown key; expected one of {', '.join(allowed)}")
    for k in required:
        if k not in table:
            raise err(key, f"missing key {k!r}")
    return table


def parse_size(value: Any) -> int:
    """``65536``, ``"64 KiB"``, ``"1.5 MB"`` -> bytes."""
    units = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m and (m.group(2).lower() or "b") in units:
            n = int(float(m.group(1)) * units[m.group(2).lower() or "b"])
            if n > 0:
                return n
    raise ValueError(f"{value!r} is not a size: expected bytes (a positive integer) or e.g. \"64 KiB\", \"1.5 MB\"")


def _positive_number(err: _Where, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise err(key, f"{value!r} is not a positive number")
    return float(value)


def _positive_int(err: _Where, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise err(key, f"{value!r} is not a positive integer")
    return value


def _space(err: _Where, key: str, table: Any) -> dict:
    """``{option: [values]}`` checked against the option table (a single value is a list of one)."""
    if not isinstance(table, dict):
        raise err(key, f"expected a table of option -> list of values (options: {', '.join(opts.OPTIONS)})")
    out = {}
    for name, values in table.items():
        if name not in opts.OPTIONS:
            hint = " (a fixed option: put it in the model's options table)" if name in opts.FIXED_ONLY else ""
            raise err(f"{key}.{name}", f"unknown build option{hint}; expected one of {', '.join(opts.OPTIONS)}")
        values = values if isinstance(values, list) else [values]
        if not values:
            raise err(f"{key}.{name}", "an empty list: give at least one value")
        checked = []
        for i, v in enumerate(values):
            try:
                checked.append(opts.check_value(name, v))
            except opts.OptionValueError as exc:
                raise err(f"{key}.{name}[{i}]", f"{exc}; expected {opts.OPTIONS[name].expected}") from None
        out[name] = checked
    return out


def resolve_function(spec: str, base: Path) -> tuple[Callable, Any]:
    """``"module:function"`` -> (the function, its module), the config's folder searched first."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not module:function")
    base_s = str(base)
    added = base_s not in sys.path
    if added:
        sys.path.insert(0, base_s)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} (looked beside the config, in {base_s}, and on "
                         f"sys.path): {exc}") from None
    finally:
        if added:
            sys.path.remove(base_s)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no function {attr!r}")
    return fn, module


def _file(err: _Where, key: str, value: Any, base: Path, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise err(key, f"expected the path of {what}, got {value!r}")
    p = Path(value).expanduser()
    p = p if p.is_absolute() else base / p
    if not p.is_file():
        raise err(key, f"{value}: no such file ({what}; relative paths are relative to the config's folder {base})")
    return p


def _model_path(err: _Where, key: str, m: dict, base: Path) -> Path:
    if "path" in m and ("package" in m or "file" in m):
        raise err(key, "give either path, or package and file, not both")
    if "path" in m:
        return _file(err, f"{key}.path", m["path"], base, "an ONNX model")
    if "package" not in m or "file" not in m:
        raise err(key, "missing the model: path = \"model.onnx\", or package = \"...\" and file = \"models/x.onnx\"")
    spec = importlib.util.find_spec(str(m["package"])) if isinstance(m["package"], str) and m["package"] else None
    if spec is None or spec.origin is None:
        raise err(f"{key}.package", f"package {m['package']!r} is not installed")
    p = Path(spec.origin).parent / str(m["file"])
    if not p.is_file():
        raise err(f"{key}.file", f"{m['file']}: no such file in package {m['package']} ({Path(spec.origin).parent})")
    return p


def _input_names(err: _Where, key: str, path: Path) -> list[str]:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - onnx's parse errors: a file that is not a model is user input
        raise err(key, f"{path}: not an ONNX model ({exc})") from None
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _metric(err: _Where, key: str, m: dict, base: Path, modules: list) -> metrics_mod.Metric:
    name = m.get("metric", "accuracy")
    if not isinstance(name, str):
        raise err(f"{key}.metric", f"{name!r} is not a metric name")
    if ":" in name:
        try:
            fn, module = resolve_function(name, base)
        except ValueError as exc:
            raise err(f"{key}.metric", str(exc)) from None
        higher = m.get("higher_is_better", True)
        if not isinstance(higher, bool):
            raise err(f"{key}.higher_is_better", f"{higher!r} is not true or false")
        modules.append(module)
        return metrics_mod.Metric(name, higher, user=fn, user_name=name)
    if "higher_is_better" in m:
        raise err(f"{key}.higher_is_better", f"only for a module:function metric ({name} is built in)")
    if name not in metrics_mod.BUILTIN:
        raise err(f"{key}.metric", f"unknown metric {name!r}; expected one of {', '.join(metrics_mod.BUILTIN)} "
                                   "or module:function")
    return metrics_mod.BUILTIN[name]


def _model(err: _Where, key: str, m: Any, base: Path, space: dict, modules: list) -> ModelSpec:
    m = _keys(err, m, key, MODEL_KEYS, ("name", "eval"))
    name = m["name"]
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise err(f"{key}.name", f"{name!r}: expected a name of letters, digits, '_', '.', '-'")
    path = _model_path(err, key, m, base)
    inputs = _input_names(err, f"{key}.path" if "path" in m else f"{key}.file", path)
    calibration = _file(err, f"{key}.calibration", m["calibration"], base, "an .npz of calibration inputs") \
        if m.get("calibration") is not None else None
    eval_path = _file(err, f"{key}.eval", m["eval"], base, "an .npz of evaluation inputs")
    for k, p in (("calibration", calibration), ("eval", eval_path)):
        if p is not None and p.suffix.lower() != ".npz":
            raise err(f"{key}.{k}", f"{p.name}: expected an .npz file (arrays keyed by input name)")
    metric = _metric(err, key, m, base, modules)
    preprocess, pre_name = None, ""
    if m.get("preprocess") is not None:
        if not isinstance(m["preprocess"], str):
            raise err(f"{key}.preprocess", f"{m['preprocess']!r} is not module:function")
        try:
            preprocess, module = resolve_function(m["preprocess"], base)
        except ValueError as exc:
            raise err(f"{key}.preprocess", str(exc)) from None
        pre_name = m["preprocess"]
        modules.append(module)
    fixed = {}
    for k, v in _keys(err, m.get("options", {}), f"{key}.options", (*opts.OPTIONS, *opts.FIXED_ONLY)).items():
        try:
            fixed[k] = opts.check_value(k, v)
        except opts.OptionValueError as exc:
            option = opts.OPTIONS.get(k) or opts.FIXED_ONLY[k]
            raise err(f"{key}.options.{k}", f"{exc}; expected {option.expected}") from None
    own = _space(err, f"{key}.space", m["space"]) if "space" in m else {}
    # fixed options of the space's kind are a space of one value (they take part in the candidate's identity)
    merged = {**space, **{k: [v] for k, v in fixed.items() if k in opts.OPTIONS}, **own}
    for k, shapes in (("input_shapes", merged.get("input_shapes", [])),):
        for shape in shapes:
            unknown = [n for n in shape if n not in inputs]
            if unknown:
                raise err(f"{key}.space.{k}", f"input(s) {unknown} are not inputs of {path.name} (its inputs: {inputs})")
    for n in fixed.get("input_values", {}):
        if n not in inputs:
            raise err(f"{key}.options.input_values.{n}", f"not an input of {path.name} (its inputs: {inputs})")
    task = m.get("task", name)
    if not isinstance(task, str) or not _NAME.fullmatch(task):
        raise err(f"{key}.task", f"{task!r}: expected a name of letters, digits, '_', '.', '-'")
    output = m.get("output")
    if output is not None and not isinstance(output, str):
        raise err(f"{key}.output", f"{output!r} is not an output name")
    max_size = None
    if "max_size" in m:
        try:
            max_size = parse_size(m["max_size"])
        except ValueError as exc:
            raise err(f"{key}.max_size", str(exc)) from None
    max_latency = _positive_number(err, f"{key}.max_latency_ms", m["max_latency_ms"]) if "max_latency_ms" in m else None
    return ModelSpec(name=name, task=task, path=path, input_names=inputs, calibration=calibration, eval=eval_path,
                     metric=metric, output=output, preprocess=preprocess, preprocess_name=pre_name,
                     fixed={k: v for k, v in fixed.items() if k in opts.FIXED_ONLY}, space=merged, key=key,
                     max_size=max_size, max_latency_ms=max_latency)


def _target(err: _Where, key: str, t: Any, objective: dict) -> TargetSpec:
    if isinstance(t, str):
        t = {"name": t}
    t = _keys(err, t, key, TARGET_KEYS, ("name",))
    try:
        profile = get_target(str(t["name"]))
    except ValueError:
        raise err(f"{key}.name", f"unknown target {t['name']!r}; expected one of {', '.join(target_names())}") from None
    if "gmacs" in t:
        gmacs, basis = _positive_number(err, f"{key}.gmacs", t["gmacs"]), f"{t['gmacs']:g} GMAC/s (config)"
    elif profile.name in ASSUMED_GMACS:
        gmacs = ASSUMED_GMACS[profile.name]
        basis = f"{gmacs:g} GMAC/s (assumed for one {profile.cpu or profile.description} core)"
    else:
        gmacs, basis = None, "no GMAC/s figure for this target (set gmacs): cost only"
    limits = dict(objective)
    if "max_size" in t:
        try:
            limits["max_size"] = parse_size(t["max_size"])
        except ValueError as exc:
            raise err(f"{key}.max_size", str(exc)) from None
    if "max_latency_ms" in t:
        limits["max_latency_ms"] = _positive_number(err, f"{key}.max_latency_ms", t["max_latency_ms"])
    return TargetSpec(name=profile.name, profile=profile, gmacs=gmacs, gmacs_basis=basis,
                      max_size=limits.get("max_size"), max_latency_ms=limits.get("max_latency_ms"))


def load_config(path: str | os.PathLike) -> SweepConfig:
    """Read and check the sweep configuration at ``path`` (see the module docstring)."""
    path = Path(path).expanduser().resolve()
    data = _read(path)
    err = _Where(path.name)
    base = path.parent
    _keys(err, data, "", TOP_KEYS, ("models", "targets"))
    sweep = _keys(err, data.get("sweep", {}), "sweep", SWEEP_KEYS)
    objective_t = _keys(err, data.get("objective", {}), "objective", OBJECTIVE_KEYS)
    objective: dict = {"max_size": None, "max_latency_ms": None}
    if "max_size" in objective_t:
        try:
            objective["max_size"] = parse_size(objective_t["max_size"])
        except ValueError as exc:
            raise err("objective.max_size", str(exc)) from None
    if "max_latency_ms" in objective_t:
        objective["max_latency_ms"] = _positive_number(err, "objective.max_latency_ms", objective_t["max_latency_ms"])
    space = _space(err, "space", data.get("space", {}))
    targets_raw = data["targets"]
    if not isinstance(targets_raw, list) or not targets_raw:
        raise err("targets", f"expected a non-empty list of target names or tables, got {targets_raw!r}")
    targets = [_target(err, f"targets[{i}]", t, objective) for i, t in enumerate(targets_raw)]
    seen: dict[str, int] = {}
    for i, t in enumerate(targets):
        if t.name in seen:
            raise err(f"targets[{i}].name", f"target {t.name!r} is listed twice (also targets[{seen[t.name]}])")
        seen[t.name] = i
    models_raw = data["models"]
    if not isinstance(models_raw, list) or not models_raw:
        raise err("models", f"expected a non-empty list of model tables, got {models_raw!r}")
    modules: list = []
    models = [_model(err, f"models[{i}]", m, base, space, modules) for i, m in enumerate(models_raw)]
    names: dict[str, int] = {}
    for i, m in enumerate(models):
        if m.name in names:
            raise err(f"models[{i}].name", f"model name {m.name!r} is used twice (also models[{names[m.name]}])")
        names[m.name] = i
    by_task: dict[str, ModelSpec] = {}
    for m in models:  # models of one task compete: one evaluation, one metric
        first = by_task.setdefault(m.task, m)
        if (first.eval, first.metric.label, first.preprocess_name) != (m.eval, m.metric.label, m.preprocess_name):
            raise err(f"{m.key}.task", f"task {m.task!r} is shared with {first.key} ({first.name}): models of one task "
                                       "need the same eval data, preprocess and metric")
    for i, t in enumerate(targets):  # (a latency limit in ms needs the target's speed)
        limited = [m.key for m in models if (m.max_latency_ms if m.max_latency_ms is not None else t.max_latency_ms)
                   is not None]
        if limited and t.gmacs is None:
            raise err(f"targets[{i}]", f"a latency limit (for {', '.join(limited)}) needs the target's speed: target "
                                       f"{t.name} has no assumed GMAC/s figure; add gmacs = N (float32 multiply-adds "
                                       "per second of one core, in 1e9)")
    name = sweep.get("name", path.stem)
    if not isinstance(name, str):
        raise err("sweep.name", f"{name!r} is not a string")

    def folder(key: str, default: str) -> Path:
        value = sweep.get(key, default)
        if not isinstance(value, str) or not value:
            raise err(f"sweep.{key}", f"{value!r} is not a folder path")
        p = Path(value).expanduser()
        return p if p.is_absolute() else base / p

    return SweepConfig(
        path=path, name=name, models=models, targets=targets, space=space,
        max_size=objective["max_size"], max_latency_ms=objective["max_latency_ms"],
        output_dir=folder("output", "sweep-results"), cache_dir=folder("cache", ".minirt-sweep"),
        shard_size=_positive_int(err, "sweep.shard_size", sweep.get("shard_size", 256)),
        latency_runs=_positive_int(err, "sweep.latency_runs", sweep.get("latency_runs", 10)),
        eval_batch=_positive_int(err, "sweep.eval_batch", sweep.get("eval_batch", 1)),
        user_modules=modules,
    )
