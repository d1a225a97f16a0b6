"""Core ML provider (macOS only): runs a partition's ML Program through coremltools.

``available()`` is cheap: it checks the platform and looks for coremltools
with ``importlib.util.find_spec`` without importing it.

``compile(blob, partition, artifact, options)``:

1. the blob is a zipped ``.mlpackage`` (``targets/coreml/lower.py``); it is
   extracted once into ``~/.cache/minirt/coreml/<sha256 of the blob>/``
   (``MINIRT_CACHE_DIR`` overrides ``~/.cache/minirt``);
2. the first load compiles the package (``coremltools.models.MLModel``) and
   keeps the compiled ``.mlmodelc`` next to it; later loads open the compiled
   model directly (``coremltools.models.CompiledMLModel``) and skip compilation;
3. compute units: ``MINIRT_COREML_COMPUTE_UNITS`` (``all``,
   ``cpu_and_ne``/``cpu-and-neural-engine``, ``cpu_and_gpu``, ``cpu_only``),
   else the partition option ``compute_units`` (the target's default);
4. the returned callable feeds the partition inputs as ``in_0 .. in_{n-1}``
   and returns ``out_0 .. out_{m-1}`` as numpy arrays of the partition's
   output dtypes.

A classical-ML partition (a tree ensemble or linear model: targets/coreml/classical.py) is a blob of
format ``mlmodel-spec``: the serialised Core ML ``Model`` protobuf, written once into the cache as
``<sha256>/model.mlmodel`` and loaded with ``coremltools.models.MLModel``.  Such a model takes one
feature vector (``in_0``, doubles) per prediction: the callable predicts every row of X as one batch
and :func:`partition_outputs` puts the per-row results (a label, a {label: probability} dict, a value)
together as the node's outputs (``options["outputs"]``).

Not verified on Linux (coremltools cannot run ML Programs there); the Linux
tests cover the cache layout and the fallback.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import platform
import shutil
import sys
import threading
import zipfile
from typing import Any, Callable

import numpy as np

_UNITS = {
    "all": "ALL",
    "cpu_and_ne": "CPU_AND_NE",
    "cpu-and-neural-engine": "CPU_AND_NE",
    "cpu_and_neural_engine": "CPU_AND_NE",
    "cpu_and_gpu": "CPU_AND_GPU",
    "cpu-and-gpu": "CPU_AND_GPU",
    "cpu_only": "CPU_ONLY",
    "cpu-only": "CPU_ONLY",
}
_lock = threading.Lock()
# The blob format of a classical Core ML model (tree ensemble / GLM): the Model protobuf's bytes.
SPEC_FORMAT = "mlmodel-spec"


def cache_root() -> str:
    base = os.environ.get("MINIRT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "minirt")
    return os.path.join(base, "coreml")


def compute_units_name(options: dict) -> str:
    raw = os.environ.get("MINIRT_COREML_COMPUTE_UNITS") or options.get("compute_units") or "all"
    key = str(raw).strip().lower()
    if key not in _UNITS:
        raise ValueError(f"unknown Core ML compute units {raw!r}; use one of all, cpu_and_ne, cpu_and_gpu, cpu_only")
    return _UNITS[key]


def extract(blob, root: str | None = None) -> tuple[str, str]:
    """Extract ``blob`` into the cache (once); returns (cache folder, .mlpackage path)."""
    data = bytes(blob)
    digest = hashlib.sha256(data).hexdigest()
    folder = os.path.join(root or cache_root(), digest)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = zf.namelist()
        if not names:
            raise ValueError("empty Core ML blob")
        for n in names:
            if n.startswith("/") or ".." in n.split("/"):
                raise ValueError(f"unsafe path {n!r} in the Core ML blob")
        package = os.path.join(folder, names[0].split("/")[0])
        with _lock:
            if not os.path.isdir(package):
                os.makedirs(folder, exist_ok=True)
                tmp = folder + f".tmp{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                zf.extractall(tmp)
                os.replace(os.path.join(tmp, names[0].split("/")[0]), package)
                shutil.rmtree(tmp, ignore_errors=True)
    return folder, package


class CoreMLProvider:
    name = "coreml"

    def available(self) -> tuple[bool, str]:
        if sys.platform != "darwin":
            return False, f"Core ML needs macOS (this is {platform.system() or sys.platform})"
        if importlib.util.find_spec("coremltools") is None:
            return False, "coremltools is not installed (pip install 'minirt[coreml]')"
        major = int((platform.mac_ver()[0] or "0").split(".")[0] or 0)
        if major and major < 13:
            return False, f"ML Programs need macOS 13 or later (this is {platform.mac_ver()[0]})"
        return True, "macOS with coremltools"

    def compile(self, blob, partition, artifact, options: dict) -> Callable:
        import coremltools as ct

        units = getattr(ct.ComputeUnit, compute_units_name(options))
        if options.get("format") == SPEC_FORMAT:
            return _compile_spec(ct, blob, options, units)
        if options.get("format", "mlpackage-zip") != "mlpackage-zip":
            raise ValueError(f"unknown Core ML blob format {options.get('format')!r}")
        folder, package = extract(blob)
        compiled = os.path.join(folder, "model.mlmodelc")
        if os.path.isdir(compiled):
            model = ct.models.CompiledMLModel(compiled, compute_units=units)
        else:
            model = ct.models.MLModel(package, compute_units=units)
            try:
                src = model.get_compiled_model_path()
                tmp = compiled + f".tmp{os.getpid()}"
                shutil.copytree(src, tmp)
                os.replace(tmp, compiled)
            except Exception:  # noqa: BLE001 - caching is an optimisation only
                pass
        in_names, out_names = io_names(partition, options)
        graph = artifact.graphs[partition.graph]
        out_dtypes = [_value_dtype(graph, v) for v in partition.outputs]

        def run(*arrays: Any):
            # Integer and bool partition inputs are int32 program inputs (targets/coreml/lower.py).
            feeds = {name: np.ascontiguousarray(a if a.dtype.kind not in "biu" else a.astype(np.int32, copy=False))
                     for name, a in zip(in_names, map(np.asarray, arrays))}
            res = model.predict(feeds)
            return tuple(np.asarray(res[n]).astype(dt, copy=False) for n, dt in zip(out_names, out_dtypes))

        return run


def _compile_spec(ct, blob, options: dict, units) -> Callable:
    """A classical model (``mlmodel-spec``): cached as an .mlmodel, every row of X one prediction."""
    data = bytes(blob)
    folder = os.path.join(cache_root(), hashlib.sha256(data).hexdigest())
    path = os.path.join(folder, "model.mlmodel")
    with _lock:
        if not os.path.isfile(path):
            os.makedirs(folder, exist_ok=True)
            tmp = path + f".tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
    model = ct.models.MLModel(path, compute_units=units)
    in_name = (options.get("input_names") or ["in_0"])[0]

    def run(x):
        x = np.asarray(x)
        rows = np.ascontiguousarray(x.reshape(1, -1) if x.ndim == 1 else x, dtype=np.float64)
        feeds = [{in_name: r} for r in rows]
        results = model.predict(feeds) if len(feeds) != 1 else [model.predict(feeds[0])]
        return partition_outputs(results, x, options)

    return run


def partition_outputs(rows: list, x: np.ndarray, options: dict) -> tuple:
    """The partition's outputs from a classical Core ML model's per-row results (``rows``: one dict of
    output feature -> value per row of X, as ``MLModel.predict`` returns them): per entry of
    ``options["outputs"]`` (the partition's outputs, in order), a label becomes an int64 (or str)
    array [N], the {label: probability} dicts an [N, K] array in the order of ``labels``, a value an
    [N, width] array; every number is rounded to the entry's dtype (float32: onnxruntime's type)."""
    n = len(rows)
    out = []
    for entry in options.get("outputs") or []:
        feature, kind = entry["feature"], entry["kind"]
        dtype = np.dtype(object) if entry.get("dtype") == "str" else np.dtype(entry.get("dtype", "float32"))
        if kind == "label":
            arr = np.empty(n, dtype=dtype) if dtype == object else np.zeros(n, dtype=dtype)
            for i, r in enumerate(rows):
                arr[i] = str(r[feature]) if dtype == object else int(r[feature])
        elif kind == "probabilities":
            labels = entry["labels"]
            arr = np.asarray([[float(r[feature][lab]) for lab in labels] for r in rows], dtype=np.float64)
            arr = arr.reshape(n, len(labels)).astype(dtype)
        elif kind == "values":
            width = int(entry.get("width", 1))
            arr = np.asarray([np.asarray(r[feature], dtype=np.float64).reshape(-1) for r in rows], dtype=np.float64)
            arr = arr.reshape(n, width).astype(dtype)
        else:
            raise ValueError(f"unknown Core ML output kind {kind!r}")
        out.append(arr)
    return tuple(out)


def io_names(partition, options: dict) -> tuple[list, list]:
    """The ML program's input and output names, in the partition's order (the lowering's, in the
    partition options; ``in_i`` / ``out_i`` by default)."""
    return (list(options.get("input_names") or [f"in_{i}" for i in range(len(partition.inputs))]),
            list(options.get("output_names") or [f"out_{i}" for i in range(len(partition.outputs))]))


def _value_dtype(graph, index: int):
    from minirt.dtypes import ONNX_TO_NUMPY

    try:
        code = graph.values[index].dtype
        return ONNX_TO_NUMPY.get(code, np.float32)
    except Exception:  # noqa: BLE001
        return np.float32
