"""The NNAPI provider: runs a partition through Android's Neural Networks API.

The partition's program (the provider blob) is minirt's description of an
NNAPI model (docs/nnapi.md), written by ``targets.nnapi``.  This module
replays it through the NDK C API of ``libneuralnetworks.so`` with cffi in
ABI mode -- nothing is compiled on the device:

    ANeuralNetworksModel_create / addOperand / setOperandValue /
    setOperandSymmPerChannelQuantParams / addOperation /
    identifyInputsAndOutputs / relaxComputationFloat32toFloat16 / finish
    ANeuralNetworksCompilation_create / setPreference / finish
    ANeuralNetworksExecution_create / setInput / setOutput /
    compute (API 29+)  or  startCompute + ANeuralNetworksEvent_wait (API 27-28)

Every result code is checked and turned into :class:`NNAPIError` naming the
call, the operand or operation and the NNAPI result code.  Every handle is
released: executions and events after each run, the compilation and the
model when the compiled program is garbage collected (or ``close()``d).
An error while building or compiling the model propagates out of
:meth:`NNAPIProvider.compile`, so the session runs the partition's CPU
version instead, with one log line.

The provider is available only where the library loads (Android); the
environment variable ``MINIRT_NNAPI_LIBRARY`` names another library to load
(the tests use a validating fake built from ``tests/nnapi/fake_nnapi.c``).
Execution on Android hardware is untested in this repository.
"""
from __future__ import annotations

import math
import os
import threading
import weakref

import numpy as np

from minirt.errors import Error
from minirt.providers import _program

MAGIC = b"MRTNNAPI"
LIBRARY_ENV = "MINIRT_NNAPI_LIBRARY"
DEFAULT_LIBRARY = "libneuralnetworks.so"

RESULT_CODES = {
    0: "ANEURALNETWORKS_NO_ERROR", 1: "ANEURALNETWORKS_OUT_OF_MEMORY", 2: "ANEURALNETWORKS_INCOMPLETE",
    3: "ANEURALNETWORKS_UNEXPECTED_NULL", 4: "ANEURALNETWORKS_BAD_DATA", 5: "ANEURALNETWORKS_OP_FAILED",
    6: "ANEURALNETWORKS_BAD_STATE", 7: "ANEURALNETWORKS_UNMAPPABLE", 8: "ANEURALNETWORKS_OUTPUT_INSUFFICIENT_SIZE",
    9: "ANEURALNETWORKS_UNAVAILABLE_DEVICE", 10: "ANEURALNETWORKS_MISSED_DEADLINE_TRANSIENT",
    11: "ANEURALNETWORKS_MISSED_DEADLINE_PERSISTENT", 12: "ANEURALNETWORKS_RESOURCE_EXHAUSTED_TRANSIENT",
    13: "ANEURALNETWORKS_RESOURCE_EXHAUSTED_PERSISTENT", 14: "ANEURALNETWORKS_DEAD_OBJECT",
}
PREFERENCES = {"low_power": 0, "fast_single_answer": 1, "sustained_speed": 2}

# operand type code -> numpy dtype of its buffer (tensor types) / of its scalar value
_TENSOR_DTYPES = {3: np.float32, 4: np.int32, 5: np.uint8, 7: np.int16, 8: np.float16, 9: np.bool_, 11: np.int8,
                  12: np.uint16, 13: np.int8, 14: np.int8}
_SCALAR_DTYPES = {0: np.float32, 1: np.int32, 2: np.uint32, 6: np.bool_, 10: np.float16}

_CDEF = """
typedef struct ANeuralNetworksModel ANeuralNetworksModel;
typedef struct ANeuralNetworksCompilation ANeuralNetworksCompilation;
typedef struct ANeuralNetworksExecution ANeuralNetworksExecution;
typedef struct ANeuralNetworksEvent ANeuralNetworksEvent;
typedef struct ANeuralNetworksOperandType {
    int32_t type; uint32_t dimensionCount; const uint32_t* dimensions; float scale; int32_t zeroPoint;
} ANeuralNetworksOperandType;
typedef struct ANeuralNetworksSymmPerChannelQuantParams {
    uint32_t channelDim; uint32_t scaleCount; const float* scales;
} ANeuralNetworksSymmPerChannelQuantParams;
int ANeuralNetworksModel_create(ANeuralNetworksModel** model);
void ANeuralNetworksModel_free(ANeuralNetworksModel* model);
int ANeuralNetworksModel_finish(ANeuralNetworksModel* model);
int ANeuralNetworksModel_addOperand(ANeuralNetworksModel* model, const ANeuralNetworksOperandType* type);
int ANeuralNetworksModel_setOperandValue(ANeuralNetworksModel* model, int32_t index, const void* buffer, size_t length);
int ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(ANeuralNetworksModel* model, int32_t index,
    const ANeuralNetworksSymmPerChannelQuantParams* channelQuant);
int ANeuralNetworksModel_addOperation(ANeuralNetworksModel* model, int32_t type, uint32_t inputCount,
    const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs);
int ANeuralNetworksModel_identifyInputsAndOutputs(ANeuralNetworksModel* model, uint32_t inputCount,
    const uint32_t* inputs, uint32_t outputCount, const uint32_t* outputs);
int ANeuralNetworksModel_relaxComputationFloat32toFloat16(ANeuralNetworksModel* model, _Bool allow);
int ANeuralNetworksCompilation_create(ANeuralNetworksModel* model, ANeuralNetworksCompilation** compilation);
void ANeuralNetworksCompilation_free(ANeuralNetworksCompilation* compilation);
int ANeuralNetworksCompilation_setPreference(ANeuralNetworksCompilation* compilation, int32_t preference);
int ANeuralNetworksCompilation_finish(ANeuralNetworksCompilation* compilation);
int ANeuralNetworksExecution_create(ANeuralNetworksCompilation* compilation, ANeuralNetworksExecution** execution);
void ANeuralNetworksExecution_free(ANeuralNetworksExecution* execution);
int ANeuralNetworksExecution_setInput(ANeuralNetworksExecution* execution, int32_t index,
    const ANeuralNetworksOperandType* type, const void* buffer, size_t length);
int ANeuralNetworksExecution_setOutput(ANeuralNetworksExecution* execution, int32_t index,
    const ANeuralNetworksOperandType* type, void* buffer, size_t length);
int ANeuralNetworksExecution_startCompute(ANeuralNetworksExecution* execution, ANeuralNetworksEvent** event);
int ANeuralNetworksExecution_compute(ANeuralNetworksExecution* execution);
int ANeuralNetworksEvent_wait(ANeuralNetworksEvent* event);
void ANeuralNetworksEvent_free(ANeuralNetworksEvent* event);
"""


class NNAPIError(Error):
    """An NNAPI call returned an error code (the message names the call and the code)."""


# --- the blob -----------------------------------------------------------------
BLOB_VERSIONS = (1, 2)  # 2: constant operands may refer to artifact tensors ("r")


def decode_blob(blob, artifact=None) -> dict:
    """The NNAPI model description stored in a provider blob (see docs/nnapi.md).

    Constant tensor values are numpy views into ``blob`` (no copy).  A constant stored as a
    reference to one of the artifact's tensors (``"r": [tensor]``, ``[tensor, perm]`` or
    ``[tensor, perm, shape]``, blob version 2: weights shared with the partition's CPU version) is
    resolved against ``artifact`` (anything with ``tensors`` and ``tensor(index)``, e.g.
    ``minirt.format.reader.Artifact``): a view of the mapped tensor, or its transpose made here.  Every offset, length, index, dtype and size is checked: a
    malformed or corrupted blob raises NNAPIError naming the operand, never reads outside its buffers.
    """
    mv0 = memoryview(blob).cast("B")
    if len(mv0) < 16:
        raise NNAPIError("not an NNAPI program: truncated header")
    found = int.from_bytes(bytes(mv0[8:12]), "little")
    version = found if found in BLOB_VERSIONS else BLOB_VERSIONS[-1]
    header, mv, base = _program.unpack(blob, MAGIC, version, "NNAPI", NNAPIError)
    payload = len(mv) - base
    operands = []
    for index, rec in enumerate(header["operands"]):
        t = int(rec["t"])
        o = {"type": t, "dims": tuple(int(d) for d in rec["d"]), "scale": float(rec.get("s", 0.0)),
             "zero_point": int(rec.get("z", 0)), "value": None, "name": rec.get("n", "")}
        if "v" in rec or "r" in rec:
            if t not in _TENSOR_DTYPES:
                raise NNAPIError(f"NNAPI program: operand {index} of type {t} has a tensor value")
            if any(d < 0 for d in o["dims"]):
                raise NNAPIError(f"NNAPI program: operand {index} has a negative dimension {list(o['dims'])}")
            dt = np.dtype(_TENSOR_DTYPES[t])
            count = math.prod(o["dims"])
        if "v" in rec:
            off, length = (int(x) for x in rec["v"])
            if off < 0 or length != count * dt.itemsize or off + length > payload:
                raise NNAPIError(f"NNAPI program: operand {index}: constant [{off}, {length}] does not fit the "
                                 f"program's {payload} data bytes or its dims {list(o['dims'])}")
            o["value"] = np.frombuffer(mv, dtype=dt, count=count, offset=base + off).reshape(o["dims"])
        elif "r" in rec:
            o["value"] = _artifact_value(index, rec["r"], o["dims"], dt, count, artifact)
            o["ref"] = rec["r"]
        elif "c" in rec:
            o["value"] = rec["c"]
        if "cs" in rec:
            o["channel_dim"], o["channel_scales"] = int(rec["cd"]), [float(s) for s in rec["cs"]]
        operands.append(o)
    out = dict(header)
    out["operands"] = operands
    return out


def _artifact_value(index: int, ref, dims, dt, count: int, artifact):
    """The value of constant operand ``index`` stored as ``ref`` = [tensor], [tensor, perm] or
    [tensor, perm, shape] (targets/nnapi/share.py), every part checked against the artifact."""
    where = f"NNAPI program: operand {index} refers to artifact tensor"
    if (not isinstance(ref, list) or len(ref) not in (1, 2, 3) or not isinstance(ref[0], int)
            or isinstance(ref[0], bool)):
        raise NNAPIError(f"NNAPI program: operand {index}: malformed tensor reference {ref!r}")
    tensor = ref[0]
    if artifact is None:
        raise NNAPIError(f"{where} {tensor}, but the program was read without its artifact")
    n = len(artifact.tensors)
    if not 0 <= tensor < n:
        raise NNAPIError(f"{where} {tensor}, out of range (the artifact has {n} tensors)")
    if getattr(artifact.tensors[tensor], "dtype", None) == 8:
        raise NNAPIError(f"{where} {tensor}, a string tensor")
    arr = artifact.tensor(tensor)
    if arr.dtype.newbyteorder("=") != dt.newbyteorder("="):
        raise NNAPIError(f"{where} {tensor} of dtype {arr.dtype}, the operand is {dt}")
    if arr.size != count:
        raise NNAPIError(f"{where} {tensor} of {arr.size} elements {list(arr.shape)}, the operand has {count} "
                         f"{list(dims)}")
    if len(ref) == 3:  # [tensor, perm, shape]: the tensor seen as ``shape`` first
        shape = ref[2]
        if (not isinstance(shape, list) or not 1 <= len(shape) <= 6
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                or math.prod(shape) != arr.size):
            raise NNAPIError(f"{where} {tensor} seen as {shape!r}, not a shape of its {arr.size} elements")
        arr = arr.reshape(shape)
    if len(ref) >= 2:
        perm = ref[1]
        if (not isinstance(perm, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in perm)
                or sorted(perm) != list(range(arr.ndim))):
            raise NNAPIError(f"{where} {tensor} with {perm!r}, not a permutation of its {arr.ndim} axes")
        # the NNAPI layout of the CPU version's weight, made once per compile (kept alive with the program)
        return np.ascontiguousarray(np.transpose(arr, perm), dtype=dt).reshape(dims)
    return arr.reshape(dims)  # a view of the artifact's (mapped) tensor: no copy


# --- the C API through cffi (ABI mode) -----------------------------------------
_lib_lock = threading.Lock()
_lib_cache: dict = {}


def _load():
    """(ffi, lib) for the NNAPI library, or raises OSError/ImportError with the reason."""
    path = os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY
    with _lib_lock:
        if path in _lib_cache:
            return _lib_cache[path]
        import cffi  # lazy: only when an NNAPI program is used

        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(path)
        _lib_cache[path] = (ffi, lib)
        return ffi, lib


def _symbol(lib, name):
    try:
        return getattr(lib, name)
    except (AttributeError, NotImplementedError):
        return None


class _Api:
    """Checked calls: every result code other than NO_ERROR raises NNAPIError."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib = ffi, lib

    def check(self, code: int, call: str, what: str = "") -> None:
        if code != 0:
            name = RESULT_CODES.get(code, "unknown result code")
            where = f" ({what})" if what else ""
            raise NNAPIError(f"{call}{where} failed: {name} ({code})")


def _operand_type(ffi, keep: list, type_code: int, dims, scale=0.0, zero_point=0):
    t = ffi.new("ANeuralNetworksOperandType*")
    t.type = int(type_code)
    t.dimensionCount = len(dims)
    if dims:
        d = ffi.new("uint32_t[]", [int(x) for x in dims])
        keep.append(d)
        t.dimensions = d
    else:
        t.dimensions = ffi.NULL
    t.scale = float(scale)
    t.zeroPoint = int(zero_point)
    keep.append(t)
    return t


class CompiledModel:
    """A finished NNAPI model and its compilation; calling it runs one execution."""

    def __init__(self, api: _Api, desc: dict, blob, preference: int, relax_fp16: bool, use_compute: bool | None):
        self._api = api
        self._desc = desc
        # constant values > 128 bytes are referenced, not copied: keep them alive (the blob, and through
        # desc the artifact's tensors and the transposed copies that references to them made)
        self._blob = blob
        self._lock = threading.Lock()
        ffi, lib = api.ffi, api.lib
        self._keep: list = []
        self._model = self._compilation = None
        self._finalizer = None
        compute = _symbol(lib, "ANeuralNetworksExecution_compute")
        self._use_compute = (compute is not None) if use_compute is None else (use_compute and compute is not None)
        try:
            self._build(desc, relax_fp16)
            pp = ffi.new("ANeuralNetworksCompilation**")
            api.check(lib.ANeuralNetworksCompilation_create(self._model, pp), "ANeuralNetworksCompilation_create")
            self._compilation = pp[0]
            self._set_finalizer()
            api.check(lib.ANeuralNetworksCompilation_setPreference(self._compilation, preference),
                      "ANeuralNetworksCompilation_setPreference", f"preference {preference}")
            api.check(lib.ANeuralNetworksCompilation_finish(self._compilation), "ANeuralNetworksCompilation_finish",
                      "the driver refused to compile the model")
        except BaseException:
            self.close()
            raise
        self._in_types = [desc["operands"][i] for i in desc["inputs"]]
        self._out_types = [desc["operands"][i] for i in desc["outputs"]]

    def _set_finalizer(self):
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _release, self._api.lib, self._model, self._compilation)

    def _build(self, desc: dict, relax_fp16: bool) -> None:
        api, ffi, lib, keep = self._api, self._api.ffi, self._api.lib, self._keep
        pm = ffi.new("ANeuralNetworksModel**")
        api.check(lib.ANeuralNetworksModel_create(pm), "ANeuralNetworksModel_create")
        self._model = m = pm[0]
        self._set_finalizer()
        for index, o in enumerate(desc["operands"]):
            t = _operand_type(ffi, keep, o["type"], o["dims"], o["scale"], o["zero_point"])
            api.check(lib.ANeuralNetworksModel_addOperand(m, t), "ANeuralNetworksModel_addOperand",
                      f"operand {index}, type {o['type']}, dims {list(o['dims'])}")
            if o.get("channel_scales") is not None:
                p = ffi.new("ANeuralNetworksSymmPerChannelQuantParams*")
                scales = ffi.new("float[]", o["channel_scales"])
                keep.extend([p, scales])
                p.channelDim, p.scaleCount, p.scales = o["channel_dim"], len(o["channel_scales"]), scales
                api.check(lib.ANeuralNetworksModel_setOperandSymmPerChannelQuantParams(m, index, p),
                          "ANeuralNetworksModel_setOperandSymmPerChannelQuantParams", f"operand {index}")
            value = o["value"]
            if value is None:
                continue
            if isinstance(value, np.ndarray):
                buf = ffi.from_buffer(value)  # a view of the blob: alive as long as self._blob
                size = value.nbytes
            else:
                arr = np.array([value], dtype=_SCALAR_DTYPES[o["type"]])
                buf = ffi.new("char[]", arr.tobytes())
                size = arr.nbytes
            keep.append(buf)
            api.check(lib.ANeuralNetworksModel_setOperandValue(m, index, buf, size),
                      "ANeuralNetworksModel_setOperandValue", f"operand {index}")
        for number, (code, ins, outs) in enumerate(desc["operations"]):
            ci = ffi.new("uint32_t[]", list(ins))
            co = ffi.new("uint32_t[]", list(outs))
            keep.extend([ci, co])
            api.check(lib.ANeuralNetworksModel_addOperation(m, code, len(ins), ci, len(outs), co),
                      "ANeuralNetworksModel_addOperation", f"operation {number}, code {code}")
        ci = ffi.new("uint32_t[]", list(desc["inputs"]))
        co = ffi.new("uint32_t[]", list(desc["outputs"]))
        keep.extend([ci, co])
        api.check(lib.ANeuralNetworksModel_identifyInputsAndOutputs(m, len(desc["inputs"]), ci, len(desc["outputs"]),
                                                                    co),
                  "ANeuralNetworksModel_identifyInputsAndOutputs")
        if relax_fp16:
            relax = _symbol(lib, "ANeuralNetworksModel_relaxComputationFloat32toFloat16")
            if relax is not None:  # API 28+
                api.check(relax(m, True), "ANeuralNetworksModel_relaxComputationFloat32toFloat16")
        api.check(lib.ANeuralNetworksModel_finish(m), "ANeuralNetworksModel_finish")

    def run(self, arrays: list) -> list:
        api, ffi, lib = self._api, self._api.ffi, self._api.lib
        if self._compilation is None:
            raise NNAPIError("the NNAPI program was closed")
        keep: list = []
        pe = ffi.new("ANeuralNetworksExecution**")
        with self._lock:
            api.check(lib.ANeuralNetworksExecution_create(self._compilation, pe), "ANeuralNetworksExecution_create")
            execution = pe[0]
            try:
                for i, (a, o) in enumerate(zip(arrays, self._in_types)):
                    a = np.ascontiguousarray(a, dtype=_TENSOR_DTYPES[o["type"]])
                    if tuple(a.shape) != tuple(o["dims"]):
                        raise NNAPIError(f"NNAPI input {i}: shape {a.shape} does not match the model's {o['dims']}")
                    keep.append(a)
                    buf = ffi.from_buffer(a)
                    api.check(lib.ANeuralNetworksExecution_setInput(execution, i, ffi.NULL, buf, a.nbytes),
                              "ANeuralNetworksExecution_setInput", f"input {i}")
                outs = []
                for i, o in enumerate(self._out_types):
                    out = np.empty(o["dims"], dtype=_TENSOR_DTYPES[o["type"]])
                    outs.append(out)
                    buf = ffi.from_buffer(out, require_writable=True)
                    api.check(lib.ANeuralNetworksExecution_setOutput(execution, i, ffi.NULL, buf, out.nbytes),
                              "ANeuralNetworksExecution_setOutput", f"output {i}")
                if self._use_compute:
                    api.check(lib.ANeuralNetworksExecution_compute(execution), "ANeuralNetworksExecution_compute")
                else:
                    pev = ffi.new("ANeuralNetworksEvent**")
                    api.check(lib.ANeuralNetworksExecution_startCompute(execution, pev),
                              "ANeuralNetworksExecution_startCompute")
                    try:
                        api.check(lib.ANeuralNetworksEvent_wait(pev[0]), "ANeuralNetworksEvent_wait")
                    finally:
                        lib.ANeuralNetworksEvent_free(pev[0])
            finally:
                lib.ANeuralNetworksExecution_free(execution)
        return outs

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._model = self._compilation = None


def _release(lib, model, compilation) -> None:
    # compilation first: the model must outlive every compilation made from it
    if compilation is not None:
        lib.ANeuralNetworksCompilation_free(compilation)
    if model is not None:
        lib.ANeuralNetworksModel_free(model)


def make_program(compiled, desc: dict, n_partition_inputs: int | None = None):
    """Wrap a compiled model into the session's callable: layout changes, input selection."""
    input_map = desc.get("input_map") or list(range(len(desc["inputs"])))
    in_perm = desc.get("input_perm") or [None] * len(desc["inputs"])
    out_perm = desc.get("output_perm") or [None] * len(desc["outputs"])
    n_runtime = len(desc["inputs"])

    def program(*args):
        if len(args) == len(input_map):
            feeds = [None] * n_runtime
            for arg, pos in zip(args, input_map):
                if pos is not None:
                    feeds[pos] = arg
        elif len(args) == n_runtime:
            feeds = list(args)
        else:
            raise NNAPIError(f"the program takes {n_runtime} runtime inputs ({len(input_map)} with constants), "
                             f"got {len(args)}")
        feeds = [np.transpose(a, p) if p is not None else a for a, p in zip(feeds, in_perm)]
        outs = compiled.run(feeds)
        return tuple(np.ascontiguousarray(np.transpose(o, p)) if p is not None else o for o, p in zip(outs, out_perm))

    program.close = compiled.close
    program.compiled = compiled
    return program


class NNAPIProvider:
    name = "nnapi"

    def available(self) -> tuple[bool, str]:
        try:
            import cffi  # noqa: F401
        except ImportError:
            return False, "cffi not installed"
        path = os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY
        try:
            _, lib = _load()
        except OSError as exc:
            return False, f"{path} does not load here ({exc}); NNAPI exists on Android 8.1+ only"
        if _symbol(lib, "ANeuralNetworksModel_create") is None:
            return False, f"{path} has no ANeuralNetworksModel_create"
        return True, f"{path} loaded"

    def compile(self, blob, partition, artifact, options):
        options = dict(options or {})
        desc = decode_blob(blob, artifact)
        ffi, lib = _load()
        pref_name = os.environ.get("MINIRT_NNAPI_PREFERENCE") or options.get("preference", "fast_single_answer")
        if pref_name not in PREFERENCES:
            raise NNAPIError(f"unknown NNAPI preference {pref_name!r}; expected one of {sorted(PREFERENCES)}")
        compiled = CompiledModel(_Api(ffi, lib), desc, blob, PREFERENCES[pref_name],
                                 bool(options.get("relax_fp32_to_fp16", False)), options.get("use_compute"))
        n_inputs = len(partition.inputs) if partition is not None else None
        return make_program(compiled, desc, n_inputs)
