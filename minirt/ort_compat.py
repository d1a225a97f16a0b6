"""onnxruntime's Python API around a minirt session: options, OrtValue, IOBinding (docs/ort_compat.md).

``minirt.SessionOptions``, ``minirt.RunOptions``, ``minirt.GraphOptimizationLevel``,
``minirt.ExecutionMode``, ``minirt.OrtValue``, ``minirt.IOBinding`` and the module functions of
onnxruntime (``get_all_providers``, ``get_device``, ...) live here, loaded on first use of one of
those names (minirt/__init__.py): a script that only loads and runs an artifact never imports it.

What each option does in minirt (honoured, warned about, refused) is decided in
:func:`session_settings`, the one place that reads a ``SessionOptions``; it reads attributes only,
so onnxruntime's own ``SessionOptions`` object works too.  Likewise the session reads only
``terminate`` from run options, so ``onnxruntime.RunOptions`` works as well.
"""
from __future__ import annotations

import enum
import threading
import warnings
from typing import Any, Sequence

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import InvalidArgument, NotImplementedByRuntime


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels (same values).  A .mrt artifact is already optimized by
    the builder; the level applies when a session builds an ONNX model itself (:data:`OPT_LEVELS`)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's execution modes.  minirt runs the nodes in order: ORT_PARALLEL warns."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class ExecutionOrder(enum.IntEnum):
    """onnxruntime's node orders.  minirt runs the builder's order whatever is asked."""

    DEFAULT = 0
    PRIORITY_BASED = 1
    MEMORY_EFFICIENT = 2


# onnxruntime level -> the builder's --opt-level for a session that builds an ONNX model.  ENABLE_ALL
# (onnxruntime's default) is the builder's default, 2, so that a session without options builds what
# `minirt build` builds; 3 (the builder's experimental recognisers) is for `minirt build --opt-level 3`.
OPT_LEVELS = {0: 0, 1: 1, 2: 2, 3: 2, 99: 2}

# onnxruntime log severity (0 verbose .. 4 fatal) -> the "minirt" logger's level
_LOG_LEVELS = {0: 10, 1: 20, 2: 30, 3: 40, 4: 50}


class SessionOptions:
    """onnxruntime's ``SessionOptions``.  Every attribute onnxruntime has exists here with its default;
    what minirt does with each is in docs/ort_compat.md and :func:`session_settings`."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0  # 0: the default (every CPU)
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.execution_order = ExecutionOrder.DEFAULT
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.use_deterministic_compute = False
        self.use_per_session_threads = True
        self._config: dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        """Kept and returned by :meth:`get_session_config_entry`; minirt reads none of onnxruntime's keys."""
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"SessionOptions has no config entry {key!r}; set: {sorted(self._config)}")
        return self._config[key]

    def has_providers(self) -> bool:
        return False

    def _refuse(self, what: str, why: str) -> None:
        raise NotImplementedByRuntime(f"SessionOptions.{what} is not supported by minirt: {why}")

    def register_custom_ops_library(self, path: str) -> None:
        self._refuse("register_custom_ops_library", "custom ops are kernels compiled for onnxruntime's C API")

    def add_initializer(self, name: str, value: Any) -> None:
        self._refuse("add_initializer", "initializers are stored in the artifact; feed an overridable "
                                        "initializer as an input instead")

    def add_external_initializers(self, names: Any, values: Any) -> None:
        self._refuse("add_external_initializers", "a .mrt artifact holds all its weights")

    def add_free_dimension_override_by_name(self, name: str, value: int) -> None:
        self._refuse("add_free_dimension_override_by_name",
                     "fix input shapes at build time: minirt build --input-shape NAME=DIMS")

    def add_free_dimension_override_by_denotation(self, name: str, value: int) -> None:
        self._refuse("add_free_dimension_override_by_denotation",
                     "fix input shapes at build time: minirt build --input-shape NAME=DIMS")

    def add_provider(self, *args: Any, **kwargs: Any) -> None:
        self._refuse("add_provider", "pass providers=[...] to InferenceSession")


class RunOptions:
    """onnxruntime's ``RunOptions``.  ``terminate = True`` (from any thread) stops the runs using
    these options before their next node or body run (each Loop iteration), and inside a native kernel
    or a replayed native program (D32) between its work items, with
    :class:`minirt.errors.RunTerminated` (onnxruntime's ``Fail``).  ``timeout`` (a minirt extension, seconds;
    None: none) stops a run the same way once that long has passed since it started."""

    def __init__(self) -> None:
        self._terminate = False
        # the native cancellation structs (mrt_cancel) of the runs in progress with these options, which
        # the terminate setter tells (plan.Cancellation.watched): their kernels stop early too
        self._runs: set = set()
        self._runs_lock = threading.Lock()
        self.timeout = None
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False
        self._config: dict[str, str] = {}

    @property
    def terminate(self) -> bool:
        return self._terminate

    @terminate.setter
    def terminate(self, value: bool) -> None:
        self._terminate = bool(value)
        with self._runs_lock:
            for c in self._runs:
                c.terminate = int(self._terminate)

    def _attach_run(self, c) -> None:
        with self._runs_lock:
            c.terminate = int(self._terminate)
            self._runs.add(c)

    def _detach_run(self, c) -> None:
        with self._runs_lock:
            self._runs.discard(c)

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise InvalidArgument(f"RunOptions has no config entry {key!r}; set: {sorted(self._config)}")
        return self._config[key]

    def add_active_adapter(self, adapter: Any) -> None:
        raise NotImplementedByRuntime("RunOptions.add_active_adapter is not supported by minirt: no LoRA adapters")


_DEFAULTS = SessionOptions()  # what "left at its default" means for each attribute


def session_settings(sess_options: Any) -> dict:
    """minirt's session settings from onnxruntime session options (ours or onnxruntime's own object):
    ``threads`` (None: default), ``opt_level`` (the builder's, for ONNX input), ``memory_plan``
    (None: default), ``profiling`` (None or the file prefix), ``log_level`` (None or a logging level).
    Options with no meaning in minirt warn (once per session) when set away from their default."""
    get = lambda name: getattr(sess_options, name, getattr(_DEFAULTS, name))  # noqa: E731
    threads = get("intra_op_num_threads")
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
        raise InvalidArgument(f"SessionOptions.intra_op_num_threads must be an integer >= 0 (0: default), "
                              f"got {threads!r}")
    level = int(get("graph_optimization_level"))
    if level not in OPT_LEVELS:
        raise InvalidArgument(f"SessionOptions.graph_optimization_level must be one of "
                              f"{[m.name for m in GraphOptimizationLevel]}, got {level!r}")
    severity = int(get("log_severity_level"))
    ignored = []
    if int(get("execution_mode")) != ExecutionMode.ORT_SEQUENTIAL:
        ignored.append("execution_mode=ORT_PARALLEL (minirt runs the nodes in order)")
    if get("inter_op_num_threads"):
        ignored.append("inter_op_num_threads (no inter-op pool: nodes run in order)")
    if get("optimized_model_filepath"):
        ignored.append("optimized_model_filepath (the optimized model is the .mrt artifact: minirt build)")
    if int(get("execution_order")) != ExecutionOrder.DEFAULT:
        ignored.append("execution_order (the builder fixed the order)")
    if not get("enable_cpu_mem_arena"):
        ignored.append("enable_cpu_mem_arena=False (use enable_mem_pattern=False to turn the memory plan off)")
    if not get("use_per_session_threads"):
        ignored.append("use_per_session_threads=False (threads are per session)")
    if ignored:
        warnings.warn("minirt ignores these SessionOptions: " + "; ".join(ignored), UserWarning, stacklevel=3)
    memory_plan = None if (get("enable_mem_pattern") and get("enable_mem_reuse")) else False
    return {
        "threads": threads or None,
        "opt_level": OPT_LEVELS[level],
        "memory_plan": memory_plan,
        "profiling": str(get("profile_file_prefix")) if get("enable_profiling") else None,
        "log_level": _LOG_LEVELS.get(severity) if severity != 2 else None,
    }


# --- OrtValue ------------------------------------------------------------------------------------


def _check_cpu(device_type: str, device_id: int = 0) -> None:
    if str(device_type).lower() != "cpu" or device_id != 0:
        raise InvalidArgument(f"minirt runs on the CPU: device {device_type!r} (id {device_id}) is not "
                              f"available; use device_type='cpu'")


class OrtValue:
    """onnxruntime's ``OrtValue`` on the CPU: a numpy array, held without copying."""

    __slots__ = ("_array",)

    def __init__(self, array: Any):
        self._array = array

    @staticmethod
    def ortvalue_from_numpy(numpy_obj: Any, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> "OrtValue":
        """Wraps the array itself (no copy: writes to either are seen by both)."""
        _check_cpu(device_type, device_id)
        if not isinstance(numpy_obj, np.ndarray):
            raise InvalidArgument(f"ortvalue_from_numpy takes a numpy array, got {type(numpy_obj).__name__}")
        return OrtValue(numpy_obj)

    @staticmethod
    def ortvalue_from_numpy_with_onnx_type(data: np.ndarray, onnx_element_type: int) -> "OrtValue":
        dtype = ONNX_TO_NUMPY.get(int(onnx_element_type))
        if dtype is None or np.dtype(dtype) != data.dtype:
            raise InvalidArgument(f"ortvalue_from_numpy_with_onnx_type: array dtype {data.dtype} is not ONNX "
                                  f"element type {onnx_element_type}")
        return OrtValue(data)

    @staticmethod
    def ortvalue_from_shape_and_type(shape: Sequence[int], element_type: Any, device_type: str = "cpu",
                                     device_id: int = 0, vendor_id: int = -1) -> "OrtValue":
        """A new zeroed array (``element_type``: a numpy dtype or an ONNX element type code)."""
        _check_cpu(device_type, device_id)
        dtype = ONNX_TO_NUMPY.get(element_type) if isinstance(element_type, int) else np.dtype(element_type)
        if dtype is None:
            raise InvalidArgument(f"unknown element type {element_type!r}")
        return OrtValue(np.zeros(tuple(shape), dtype))

    def numpy(self) -> Any:
        """The array itself (onnxruntime returns a copy; here a caller's buffer stays the caller's)."""
        return self._array

    def data_ptr(self) -> int:
        return int(self._array.ctypes.data)

    def device_name(self) -> str:
        return "cpu"

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def data_type(self) -> str:
        if isinstance(self._array, list):
            inner = self._array[0].dtype if self._array else np.dtype(np.float32)
            return f"seq(tensor({_type_name(inner)}))"
        return f"tensor({_type_name(self._array.dtype)})"

    def element_type(self) -> type:
        return self._array.dtype.type

    def has_value(self) -> bool:
        return self._array is not None

    def is_tensor(self) -> bool:
        return isinstance(self._array, np.ndarray)

    def is_tensor_sequence(self) -> bool:
        return isinstance(self._array, list)

    def is_sparse_tensor(self) -> bool:
        return False

    def tensor_size_in_bytes(self) -> int:
        return int(self._array.nbytes)

    def update_inplace(self, np_arr: np.ndarray) -> None:
        """Copy ``np_arr`` into this value's array (same shape and dtype)."""
        if np_arr.shape != self._array.shape or np_arr.dtype != self._array.dtype:
            raise InvalidArgument(f"update_inplace: expected {self._array.dtype}{list(self._array.shape)}, "
                                  f"got {np_arr.dtype}{list(np_arr.shape)}")
        np.copyto(self._array, np_arr)

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()})"


def _type_name(dtype: np.dtype) -> str:
    from minirt.dtypes import NUMPY_TO_ONNX

    code = NUMPY_TO_ONNX.get(np.dtype(dtype))
    return onnx_type_name(code) if code else str(dtype)


def unwrap(value: Any) -> Any:
    """The array of an OrtValue, anything else unchanged."""
    return value._array if type(value) is OrtValue else value


# --- IOBinding ------------------------------------------------------------------------------------


class IOBinding:
    """onnxruntime's ``IOBinding`` on the CPU: inputs bound by reference, outputs either allocated by
    the run (read with :meth:`get_outputs` / :meth:`copy_outputs_to_cpu`) or written into a buffer the
    caller bound (:meth:`bind_ortvalue_output`): the node computing it writes into that memory when its
    kernel takes ``out=``, else the result is copied there once (``Session._run_into``)."""

    def __init__(self, session: Any):
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, OrtValue | None] = {}  # name -> caller's buffer (None: allocated by the run)
        self._results: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Sequence[int],
                   buffer_ptr: int) -> None:
        raise NotImplementedByRuntime(
            f"IOBinding.bind_input({name!r}, buffer_ptr=...): minirt takes no raw device pointers; use "
            f"bind_cpu_input(name, array) or bind_ortvalue_input(name, OrtValue.ortvalue_from_numpy(array))")

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        self._inputs[name] = unwrap(ortvalue)

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Sequence[int] | None = None, buffer_ptr: int | None = None) -> None:
        _check_cpu(device_type, device_id)
        if buffer_ptr is not None:
            raise NotImplementedByRuntime(
                f"IOBinding.bind_output({name!r}, buffer_ptr=...): minirt takes no raw pointers; bind the "
                f"buffer as an array: bind_ortvalue_output(name, OrtValue.ortvalue_from_numpy(buffer))")
        self._outputs[name] = None

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        if type(ortvalue) is not OrtValue or not isinstance(ortvalue._array, np.ndarray):
            raise InvalidArgument(f"bind_ortvalue_output({name!r}): expected a minirt.OrtValue holding an array, "
                                  f"got {type(ortvalue).__name__}")
        self._outputs[name] = ortvalue

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def synchronize_inputs(self) -> None:
        """Nothing to synchronise: CPU memory."""

    def synchronize_outputs(self) -> None:
        """Nothing to synchronise: CPU memory."""

    def get_outputs(self) -> list[OrtValue]:
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[Any]:
        """The results as arrays (copies, as onnxruntime's)."""
        return [np.array(v._array, copy=True) if isinstance(v._array, np.ndarray) else v._array
                for v in self._results]

    def _run(self, run_options: Any) -> None:
        """Run the session on the bound inputs; called by ``Session.run_with_iobinding``."""
        names = list(self._outputs) or None
        buffers = None
        if names is not None:
            buffers = [None if v is None else v._array for v in self._outputs.values()]
            if all(b is None for b in buffers):
                buffers = None
        results = self._session._run(names, self._inputs, None, run_options, buffers)
        out = []
        for i, r in enumerate(results):
            bound = self._outputs.get(names[i]) if names is not None else None
            out.append(bound if bound is not None else OrtValue(r))
        self._results = out


SessionIOBinding = IOBinding  # onnxruntime's name for its C-level binding class


# --- module functions -----------------------------------------------------------------------------


def get_all_providers() -> list[str]:
    """Every provider minirt knows, in onnxruntime's spelling where onnxruntime has one."""
    from minirt import providers as providers_mod

    return [providers_mod.ort_spelling(n) for n in providers_mod.known_providers()]


def get_device() -> str:
    return "CPU"


def disable_telemetry_events() -> None:
    """Nothing to do: minirt sends no telemetry (applications such as magika call this)."""


def enable_telemetry_events() -> None:
    """Nothing to do: minirt sends no telemetry."""


def get_version_string() -> str:
    import minirt

    return minirt.__version__


def get_build_info() -> str:
    import minirt

    return f"minirt {minirt.__version__} (numpy runtime, native kernels: optional)"


def set_default_logger_severity(severity: int) -> None:
    """onnxruntime severity 0..4 -> the level of the "minirt" logger."""
    import logging

    if severity not in _LOG_LEVELS:
        raise InvalidArgument(f"logger severity must be 0 (verbose) .. 4 (fatal), got {severity!r}")
    logging.getLogger("minirt").setLevel(_LOG_LEVELS[severity])


def set_default_logger_verbosity(level: int) -> None:
    """Accepted; minirt has no verbosity levels below DEBUG."""


def set_seed(seed: int) -> None:
    """Seeds numpy's global generator, which minirt's random ops draw from."""
    np.random.seed(seed)
