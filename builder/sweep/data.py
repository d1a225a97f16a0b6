"""A sweep's data: the models' bytes, the calibration and evaluation arrays, their hashes and shards.

Everything here runs on the driver.  The hashes are of *content* (the model file's bytes, the arrays'
dtypes, shapes and bytes, the preprocess function's module source), so a renamed or re-saved file
with the same content hits the cache and a changed one misses it.  Preprocessing itself runs on the
workers (one Ray task per variant and shard, tasks.py); it is checked here on one sample first, so a
preprocess function that returns the wrong inputs fails before any task starts, naming the config key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from minirt.builder.sweep.config import ModelSpec
from minirt.builder.sweep.errors import ConfigError
from minirt.builder.sweep.metrics import LABEL_KEYS


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def array_hash(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def function_id(fn: Callable | None, name: str) -> str:
    """``module:function`` and the sha256 of its module's source: an edited function misses the cache."""
    if fn is None:
        return ""
    try:
        source = inspect.getsource(inspect.getmodule(fn)).encode()
    except (OSError, TypeError):
        source = name.encode()
    return f"{name}#{sha256_bytes(source)[:16]}"


def model_source(path: Path) -> tuple[str, Any]:
    """(sha256 of the model's content, what build() is given): the file's bytes, or for a model with
    external data its path (the bytes alone cannot find the data; on a multi-machine cluster the path
    must then be visible to the workers) with the external files in the hash."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    data = path.read_bytes()
    model = onnx.load(str(path), load_external_data=False)
    files = sorted({entry.value for t in model.graph.initializer if uses_external_data(t)
                    for entry in t.external_data if entry.key == "location"})
    if not files:
        return sha256_bytes(data), data
    h = hashlib.sha256(data)
    for f in files:
        h.update(f.encode())
        h.update((path.parent / f).read_bytes())
    return h.hexdigest(), str(path)


def load_npz(path: Path, where: str) -> dict[str, np.ndarray]:
    """The arrays of an .npz, samples stacked on axis 0 (all the same count)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(where, f"{path}: cannot read the .npz ({exc})") from None
    if not arrays:
        raise ConfigError(where, f"{path}: the .npz holds no arrays")
    counts = {k: (a.shape[0] if a.ndim else None) for k, a in arrays.items()}
    if len(set(counts.values())) != 1 or None in counts.values():
        raise ConfigError(where, f"{path}: arrays must stack samples on axis 0, all the same count; got "
                                 + ", ".join(f"{k} {list(a.shape)}" for k, a in arrays.items()))
    if next(iter(counts.values())) == 0:
        raise ConfigError(where, f"{path}: no samples")
    return arrays


def take(arrays: dict[str, np.ndarray], start: int, stop: int) -> dict[str, np.ndarray]:
    return {k: np.ascontiguousarray(v[start:stop]) for k, v in arrays.items()}


def shard_bounds(n: int, shard_size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``0..n`` in shards of at most ``shard_size``, sizes within 1."""
    count = max(1, -(-n // shard_size))
    edges = [round(i * n / count) for i in range(count + 1)]
    return [(edges[i], edges[i + 1]) for i in range(count)]


def preprocess(fn: Callable | None, arrays: dict[str, np.ndarray], shapes: dict[str, list]) -> dict[str, np.ndarray]:
    """``fn(arrays, input_shapes)`` (identity without one); the labels kept when ``fn`` drops them."""
    if fn is None:
        return arrays
    out = fn(dict(arrays), {k: tuple(v) for k, v in shapes.items()})
    if not isinstance(out, dict):
        raise TypeError(f"returned {type(out).__name__}, not a dict of arrays")
    out = {k: np.asarray(v) for k, v in out.items()}
    for k in arrays:
        if k.lower() in LABEL_KEYS and k not in out:
            out[k] = arrays[k]
    return out


@dataclasses.dataclass
class ModelData:
    """One model's content and data on the driver."""

    sha256: str
    payload: Any  # bytes, or a path (external data)
    eval: dict
    eval_hash: str
    calibration: dict | None
    calibration_hash: str | None
    preprocess_id: str
    samples: int


def load_model_data(model: ModelSpec, file: str) -> ModelData:
    where = f"{file}: {model.key}"
    sha, payload = model_source(model.path)
    ev = load_npz(model.eval, f"{where}.eval")
    cal = load_npz(model.calibration, f"{where}.calibration") if model.calibration is not None else None
    return ModelData(sha256=sha, payload=payload, eval=ev, eval_hash=array_hash(ev), calibration=cal,
                     calibration_hash=array_hash(cal) if cal is not None else None,
                     preprocess_id=function_id(model.preprocess, model.preprocess_name),
                     samples=int(next(iter(ev.values())).shape[0]))


def check_variant(model: ModelSpec, data: ModelData, shapes: dict[str, list], file: str) -> None:
    """Preprocess one sample of the eval (and calibration) data for an input-shape variant and check that
    it gives every model input, in the variant's shape when one is fixed: a ConfigError naming the key."""
    for what, arrays in (("eval", data.eval), ("calibration", data.calibration)):
        if arrays is None:
            continue
        key = f"{file}: {model.key}.{'preprocess' if model.preprocess else what}"
        try:
            sample = preprocess(model.preprocess, take(arrays, 0, 1), shapes)
        except Exception as exc:  # noqa: BLE001 - the user's function: its failure is a config problem
            raise ConfigError(key, f"{model.preprocess_name} failed on the first {what} sample "
                                   f"(input_shapes {shapes or 'none'}): {type(exc).__name__}: {exc}") from None
        missing = [n for n in model.input_names if n not in sample]
        if missing:
            src = f"{model.preprocess_name}'s result" if model.preprocess else f"{os.path.basename(getattr(model, what))}"
            raise ConfigError(key, f"{src} has arrays {sorted(sample)}; the model's inputs are {model.input_names} "
                                   f"(missing {missing})")
        for name, shape in shapes.items():
            got = list(sample[name].shape)
            if len(got) != len(shape) or any(g != s for g, s in zip(got[1:], shape[1:])):
                raise ConfigError(key, f"input {name!r} of the {what} data has shape {got} per sample batch, but "
                                       f"input_shapes fixes {shape}: resize it (a preprocess function) or change "
                                       "input_shapes")
