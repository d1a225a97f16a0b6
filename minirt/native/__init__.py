"""Optional native (C) kernels, built with cffi when minirt is installed.

The runtime never needs this module to work: when the extension was not
compiled (no C compiler at install time), cannot be loaded, or is disabled
with ``MINIRT_DISABLE_NATIVE=1``, :data:`available` is False, :data:`reason`
says why, and every kernel uses its numpy implementation.

Public state:

``available``  True when the compiled kernels are loaded and enabled.
``reason``     Why they are not available ("" when they are).
``features``   CPU features detected at run time, e.g. ``{"avx2": True, "fma": True}``.
``isa``        The implementation chosen for this CPU: ``"avx512"``, ``"avx2"`` (x86-64),
               ``"dotprod"``, ``"neon"`` (aarch64; on 32-bit ARM the NEON copy of the float kernels,
               taken when the CPU reports NEON and VFPv4, feature ``fma``) or ``"baseline"`` (32-bit ARM:
               scalar VFP code) (override with ``MINIRT_NATIVE_ISA=baseline``, or :func:`select_isa`).
``qgemm_isa``  The int8 GEMM microkernel in use: ``"amx"`` (AMX tiles where they apply, VNNI elsewhere),
               ``"vnni"``, ``"avx2"`` (exact int16 products), ``"dotprod"`` or ``"portable"``.
``ACTIVATION_CODES``  Fused-activation name (``minirt.vocabulary.ACTIVATIONS``) -> the code of the
               native epilogue computing it, read from the compiled module (empty without it).

The interface is declared once, in ``kernels.h`` (which cffi reads): its parameter structs
(``mrt_conv_geometry``, ``mrt_gemm_shape``, ``mrt_epilogue``, ``mrt_quant``), its activation enum and
its ABI version.  Nothing here repeats a signature or a constant: the wrappers build the structs
(once per prepared call, in the ``*_prepare`` functions, or from a small cache keyed by their
values), the codes come from the module, the expected ABI version from the header beside it.

The wrappers below take numpy arrays that the caller has already validated
(dtype float32, C-contiguous, shapes consistent): they are the thin layer
between the kernels in ``minirt/kernels`` and the C functions, not a public
API.  Threads come from :func:`threads` (set per session by ``Session``).
"""
from __future__ import annotations

import os
import struct
import _thread  # (thread-local state: not threading, whose import costs ~0.5 ms of a cold start)
import time
import weakref

from minirt.errors import ResourceError, UnsupportedGeometry

available = False
reason = ""
features: dict = {}
isa = "none"
qgemm_isa = "none"
ACTIVATION_CODES: dict[str, int] = {}
BINARY_OPS: dict[str, int] = {}  # ONNX op -> mrt_binary_f32's op code (MRT_BINARY_*), from the module

_ffi = _lib = None
_hw_crc32 = False  # mrt_crc32 has the CPU's CRC instructions (set by _load)
# The interface this Python code is written against: kernels.h's MRT_ABI_VERSION when both were written
# (tests/native/test_abi.py keeps the two equal).  A compiled module of another version is refused: its
# structs or entry points differ.  (A constant, not the header read at import: the device wheel ships no
# header, and importing reads no 35 KB file.)
ABI_VERSION = 39


def _truthy(value: str | None) -> bool:
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off", "")


def _load() -> None:
    global available, reason, features, isa, _ffi, _lib, _hw_crc32
    if _truthy(os.environ.get("MINIRT_DISABLE_NATIVE")):
        reason = "disabled by MINIRT_DISABLE_NATIVE"
        return
    try:
        from minirt.native._kernels import ffi, lib  # type: ignore[import-not-found]
    except ImportError as exc:
        if getattr(exc, "name", None) == "minirt.native._kernels":
            reason = "extension not built (no C compiler when minirt was installed?)"
        else:
            reason = f"extension failed to load: {exc}"
        return
    except Exception as exc:  # noqa: BLE001 - a broken binary must never break the runtime
        reason = f"extension failed to load: {type(exc).__name__}: {exc}"
        return
    if lib.mrt_abi_version() != ABI_VERSION:
        reason = f"extension ABI {lib.mrt_abi_version()} != expected {ABI_VERSION} (stale build; reinstall minirt)"
        return
    from minirt.vocabulary import ACTIVATIONS

    try:
        codes = {a.name: int(getattr(lib, a.native)) for a in ACTIVATIONS.values() if a.native is not None}
    except AttributeError as exc:  # (tests/native/test_abi.py keeps the two in step)
        reason = f"extension lacks an activation of minirt.vocabulary: {exc}"
        return
    bits = lib.mrt_cpu_features()
    features = {
        name: bool(bits & getattr(lib, "MRT_FEAT_" + name.upper()))
        for name in ("avx2", "fma", "avx512f", "avx512vnni", "amx", "neon", "asimddp")
    }
    ACTIVATION_CODES.update(codes)
    BINARY_OPS.update({op: getattr(lib, "MRT_BINARY_" + op.upper()) for op in ("Add", "Sub", "Mul", "Div")})
    _ffi, _lib = ffi, lib
    available = True
    _hw_crc32 = bool(lib.mrt_crc32_hw())
    wanted = (os.environ.get("MINIRT_NATIVE_ISA") or "best").strip().lower()
    select_isa(wanted)


def select_isa(name: str = "best") -> str:
    """Choose the implementation: "best" (default), "avx512", "avx512-vnni", "avx2" (x86-64),
    "dotprod", "neon" (aarch64; 32-bit ARM with NEON and VFPv4) or "baseline".

    An ISA the CPU lacks falls back to the baseline ("dotprod" without the dot
    product falls back to "neon"); returns what is in use.  "avx512" takes the AMX tiles for the int8
    GEMMs they apply to where the CPU has AMX-INT8 and the OS grants them (:data:`qgemm_isa` "amx");
    "avx512-vnni" is the same level without them (returns "avx512", :data:`qgemm_isa` "vnni").
    """
    global isa, qgemm_isa
    if _lib is None:
        return isa
    codes = {"best": _lib.MRT_ISA_BEST, "avx512": _lib.MRT_ISA_AVX512, "avx512-vnni": _lib.MRT_ISA_AVX512_VNNI,
             "avx2": _lib.MRT_ISA_AVX2,
             "neon": _lib.MRT_ISA_NEON, "dotprod": _lib.MRT_ISA_DOTPROD, "baseline": _lib.MRT_ISA_BASELINE}
    code = codes.get(name)
    if code is None:
        raise ValueError(f"unknown ISA {name!r}; expected one of {', '.join(codes)}")
    chosen = _lib.mrt_select_isa(code)
    isa = {_lib.MRT_ISA_AVX512: "avx512", _lib.MRT_ISA_AVX2: "avx2", _lib.MRT_ISA_NEON: "neon",
           _lib.MRT_ISA_DOTPROD: "dotprod"}.get(chosen, "baseline")
    qgemm_isa = {1: "vnni", 2: "dotprod", 3: "avx2", 4: "amx"}.get(_lib.mrt_qgemm_isa(), "portable")
    _qpacked.clear()  # the packed weight format may depend on the ISA
    return isa


def crc32(data, crc: int = 0) -> int:
    """``zlib.crc32(data, crc)`` of a C-contiguous buffer (bytes, memoryview, mmap slice).  With the
    CPU's CRC instructions (PCLMULQDQ on x86-64, ARMv8 CRC32 on aarch64) it is the native loop
    (13 GB/s on a 64 MB buffer where zlib's table code gave 5.8, D82); without them, or without the
    native module, it is zlib's.  The loader checks every artifact section with it (minirt.format.reader, D82)."""
    if _hw_crc32:
        return _lib.mrt_crc32(_ffi.from_buffer("uint8_t[]", data), memoryview(data).nbytes, crc)
    import zlib  # (here: a .so of its own in some Pythons, ~0.2 ms of a cold start that CRC instructions spare)

    return zlib.crc32(data, crc)


def prefault(buf) -> bool:
    """Back the memory of the C-contiguous array ``buf`` now, its values kept (kernels.c,
    mrt_prefault).  True when the kernel populated it in one call; False when its pages were written
    one by one, or without the native module (then nothing is done)."""
    if not buf.nbytes:
        return False
    return prefault_span(buf.ctypes.data, buf.ctypes.data + buf.nbytes)


def prefault_span(lo: int, hi: int) -> bool:
    """:func:`prefault` of the bytes at addresses [lo, hi) (memory a run writes whatever it holds)."""
    if not available or hi <= lo:
        return False
    return bool(_lib.mrt_prefault(_ffi.cast("void *", lo), hi - lo))


def describe() -> str:
    """One line for ``minirt info`` / ``minirt bench``."""
    if not available:
        return f"not active ({reason}); using numpy kernels"
    feats = ", ".join(k for k, v in features.items() if v) or "none"
    return f"active, {isa} kernels, int8 GEMM {qgemm_isa} (CPU features: {feats})"


# --------------------------------------------------------------------------- threads

_DEFAULT_THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
class _Threads(_thread._local):
    """This Python thread's setting; a class attribute is the default (``getattr`` with a default would
    raise and catch an AttributeError on every call of a thread that never set it: ~1 us)."""

    n = _DEFAULT_THREADS


_tls = _Threads()


def set_threads(n: int | None) -> None:
    """Threads for native kernels called from this Python thread (None: all CPUs)."""
    _tls.n = _DEFAULT_THREADS if n is None else int(n)


def threads() -> int:
    return _tls.n


def start_threads(n: int | None) -> int:
    """Start the kernels' worker threads for ``n`` participants now (None: all CPUs, as set_threads), as
    the first parallel job would (mrt_start_threads; 1 participant starts none); the count available,
    1 without native kernels."""
    return int(_lib.mrt_start_threads(_DEFAULT_THREADS if n is None else int(n))) if available else 1


# --------------------------------------------------------------------------- recording (native programs)

# The record/replay contract (written in kernels.h above mrt_arg, and in docs/runtime.md, "Native
# programs"), checked here and in Recorder.end (minirt/native/program.py), nowhere else:
#
# * every call that computes a node's values goes through _call (below), which keeps it while a
#   session records (packing weights once and the size queries are not part of any run's values);
# * the entry points a program can replay are the keys of RECORDABLE, each with the argument
#   positions of the data it reads and of the data it writes; every other argument is a constant of
#   the prepared call (parameter structs, weights, scalars, the thread count), the same on every run;
# * a call to any other entry point makes the running node unreplayable (its numbers would be
#   missing from a replay), whatever the kernel declares;
# * a kernel declares its result with final() (what its calls wrote, returned untouched) or
#   constant_result() (a read-only array needing no call); Recorder.end accepts a node only then.
RECORDABLE: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "mrt_conv2d_f32": ((4, 5), (6,)),  # (g, w, packed_w, e, x, res, y, nthreads)
    "mrt_dwconv2d_f32": ((3, 4), (5,)),  # (g, w, e, x, res, y, nthreads)
    "mrt_maxpool2d_f32": ((1,), (2,)),  # (g, x, y, nthreads)
    "mrt_maxpool2d_s1_f32": ((1,), (2,)),  # (g, x, y, nthreads)
    "mrt_sgemm_f32": ((2, 3, 5), (4,)),  # (s, e, A, B, C, res, nthreads)
    "mrt_sgemm_pb_f32": ((2, 5), (4,)),  # (s, e, A, bpack, C, res, nthreads)
    "mrt_qconv2d": ((3, 4), (5,)),  # (g, q, e, x, res, y, nthreads)
    "mrt_qconv2d_pool_f32": ((4, 5), (6,)),  # (g, pool, q, e, x, res, y, nthreads)
    "mrt_qdwconv2d": ((3, 4), (5,)),  # (g, q, e, x, res, y, nthreads)
    "mrt_quantize_u8_f32": ((0,), (1,)),  # (x, q, n, scale, zero point, nthreads)
    "mrt_qconvtranspose_tiles": ((3,), (4,)),  # (g, q, e, x, y, nthreads)
    "mrt_sdpa_f32": ((1, 2, 3, 4), (5,)),  # (s, q, k, v, mask, out, nthreads)
    "mrt_qmatmul_f32": ((3,), (4,)),  # (s, q, e, a, y, nthreads)
    "mrt_plane_means_f32": ((0,), (1,)),  # (x, y, planes, plane, nthreads)
    "mrt_copy_rows_f32": ((0,), (2,)),  # (src, src_ld, dst, dst_ld, rows, cols, nthreads)
    "mrt_binary_f32": ((1, 2), (3,)),  # (op, a, b, y, n, nthreads)
    "mrt_upsample_nearest_f32": ((0,), (1,)),  # (x, y, planes, h, w, fh, fw, nthreads)
    "mrt_rnn_f32": ((1, 2, 3, 4), (5, 6)),  # (s, x, lens, h0, c0, y, state, nthreads)
    "mrt_binary_rows_f32": ((1, 2), (3,)),  # (op, a, b, y, rows, len, bmod, nthreads)
    "mrt_activation_f32": ((1,), (2,)),  # (e, x, y, n, nthreads)
    "mrt_index_copy": ((1,), (2,)),  # (map, x, y, nthreads)
    "mrt_gather_rows": ((1, 2), (3,)),  # (s, x, idx, y, nthreads)
    "mrt_lookup_rows": ((1, 2), (4,)),  # (s, table, ids, id_bytes, y, nthreads)
    "mrt_softmax_f32": ((0,), (1,)),  # (x, y, rows, n, log, nthreads)
    "mrt_layernorm_f32": ((0, 1, 2), (3,)),  # (x, scale, bias, y, rows, n, eps, nthreads)
    "mrt_instancenorm_f32": ((0, 1, 2), (3,)),  # (x, scale, bias, y, rows, n, eps, nthreads)
    "mrt_avgpool2d_f32": ((3,), (4,)),  # (g, count_box, scale, x, y, nthreads)
    "mrt_convtranspose_tiles_f32": ((3,), (4,)),  # (g, wt, e, x, y, nthreads)
    "mrt_cast": ((2,), (3,)),  # (from, to, x, y, n, nthreads)
    "mrt_broadcast": ((1, 2, 3), (4,)),  # (map, a, b, c, y, nthreads)
    "mrt_reduce_f32": ((1,), (2,)),  # (op, x, y, outer, n, inner, nthreads)
    "mrt_quantize_add_up_u8_f32": ((2, 3, 4, 5), (6,)),  # (g, q, x, xm, xu, um, y_u8, nthreads)
    "mrt_reduce_int": ((2,), (3,)),  # (op, type, x, y, outer, n, inner, nthreads)
    # (p, qkv, seqlens_k, k_cache, v_cache, out, nthreads): the caches are read and written in place (a
    # bound past / present buffer, D123); cos / sin are constants in p
    "mrt_gqa_decode_f32": ((1, 2, 3, 4), (3, 4, 5)),
    "mrt_qnbits_matmul": ((1,), (3,)),  # (w, a, M, y, workspace NULL, nthreads)
    "mrt_rmsnorm_f32": ((0, 1), (2,)),  # (x, scale, y, rows, n, eps, nthreads)
    "mrt_tree_votes": ((1,), (4, 5)),  # (e, x, n, n_features, scores, has, nthreads)
    "mrt_tree_finish": ((1, 2), (1, 2, 3, 4)),  # (p, scores, has, label, out, n, nthreads): votes updated in place
}


class _Recording(_thread._local):
    """This thread's recording of a native program (see ``minirt/native/program.py``).

    ``calls``: while a session records, the list :func:`_call` appends each native call to, as
    ``(entry name, args, reads, writes)`` (args None: a call a program cannot replay); None
    otherwise (the only cost outside a recording is that one test per call).
    ``final``: the array the running node's kernel declared its complete result (:func:`final`);
    ``constant``: the one it declared a constant (:func:`constant_result`)."""

    calls = None
    final = None
    constant = None
    # a dry recording (a session's warm-up, D92): the recordable calls are kept but not run (their
    # results are never read: the warm-up's outputs are thrown away), so recording costs no kernel time
    dry = False


_recording = _Recording()
# what a recordable entry point returns when a dry recording skips it: 0 for int, None for void
_DRY_RESULT: dict = {}


def set_dry_recording(dry: bool) -> None:
    """Make this thread's recordings dry (see _Recording.dry) or not: a session's warm-up only."""
    _recording.dry = bool(dry)


def _dry_result(entry):
    name = entry.__name__
    if name not in _DRY_RESULT:
        _DRY_RESULT[name] = None if _ffi.typeof(entry).result.cname == "void" else 0
    return _DRY_RESULT[name]


def _call(entry, args, *data):
    """``entry(*args)``, returning its result; while a session records, also the call, for the program.

    ``data``: for a RECORDABLE entry point, the arrays (or None for NULL) at its data positions, its
    reads then its writes, in the order RECORDABLE lists them; nothing for the others."""
    if _recording.calls is None:  # (outside a recording: this one test per call)
        return entry(*args)
    name = entry.__name__
    rc = _dry_result(entry) if _recording.dry and name in RECORDABLE else entry(*args)
    _record(name, args, data)
    return rc


def _record(name: str, args: tuple, data: tuple) -> None:
    """Keep the call that just ran (see RECORDABLE): its arguments, which hold the cffi pointers to
    the prepared call's structs and weights (kept alive with them), and its reads and writes as
    ``(argument position, array or None)``."""
    positions = RECORDABLE.get(name)
    if positions is None:
        _recording.calls.append((name, None, (), ()))  # (Recorder.end refuses the node)
        return
    reads, writes = positions
    if len(data) != len(reads) + len(writes):  # (a wrapper bug: the recorder would misplace the data)
        raise AssertionError(f"native call {name}: {len(data)} data arrays for positions {positions}")
    _recording.calls.append((name, args, tuple(zip(reads, data)), tuple(zip(writes, data[len(reads):]))))


def recording() -> bool:
    """Whether a session is recording a native program on this thread (kernels that have a cheaper
    numpy way for some inputs keep their recordable native path while it records)."""
    return _recording.calls is not None


def declared_final(y) -> bool:
    """Whether the running node declared ``y`` its complete result (:func:`final`), during a recording;
    a kernel that returns a view of such a result declares the view instead."""
    return _recording.calls is not None and _recording.final is y


def final(y):
    """Declare ``y`` the complete result of the running node and return it.

    A kernel calls this only where its result is exactly what the native calls recorded since the
    node began wrote, and it returns ``y`` untouched: no numpy work before or after those calls
    (a program replays the calls alone).  Outside a recording it only returns ``y``."""
    if _recording.calls is not None:
        _recording.final = y
    return y


def modified(y) -> None:
    """Say that numpy work has just changed ``y`` in place: a replay of the running node's native calls
    would miss that work, so a recording refuses the node (even when a later native call makes its
    declared result: ScaledDotProductAttention scaled the scores in numpy between two recorded calls,
    and its replays skipped the scale).  For composite kernels (``minirt/kernels/fused.py``) that update
    a sub-kernel's fresh result in place."""
    if _recording.calls is not None:
        _recording.calls.append(("numpy work on a native result", None, (), ()))  # (Recorder.end refuses)
        if _recording.final is y:
            _recording.final = None


def constant_result(y):
    """Declare ``y`` the running node's result and a constant, and return it: the same read-only array
    on every run (a weight materialized once), which a program needs no call to make and reads as it
    reads the model's constants.  Outside a recording it only returns ``y``."""
    if _recording.calls is not None:
        _recording.constant = y
    return y


# --------------------------------------------------------------------------- parameter structs

_INT_MAX = 2**31 - 1

# struct -> the arrays its pointer fields point into, alive as long as the struct (cffi keeps
# nothing alive through a pointer stored in a struct field).
_owners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# The largest element count any size a window kernel derives from its geometry may reach: the kernels
# compute sizes in C long, byte counts are up to 8x elements, so 2^59 leaves room where long has 64 bits;
# 2^27 where it has 32 (32-bit ARM: kernels.c's MRT_GEOMETRY_MAX, the same formula).
_GEOMETRY_MAX_ELEMENTS = 1 << (8 * struct.calcsize("l") - 5)


CANCELLED = -101  # (kernels.h MRT_CANCELLED: a replayed program's code for a call it did not run)
_watched = _thread._local()  # .cancel: the mrt_cancel this thread's kernels watch (or None)


def new_cancel(deadline: float | None):
    """A fresh ``mrt_cancel`` (terminate 0; ``deadline``: a time.monotonic() time, or None), or None
    without the native kernels."""
    if not available:
        return None
    c = _ffi.new("mrt_cancel *")
    c.deadline_ns = 0 if deadline is None else max(int(deadline * 1e9), 1)
    return c


def watched_stopped() -> bool:
    """Whether this thread watches a cancellation that has fired (its kernels may have stopped early)."""
    c = getattr(_watched, "cancel", None)
    return c is not None and bool(c.terminate or 0 < c.deadline_ns < time.monotonic_ns())


class watching:  # noqa: N801 - used like a function, as contextlib's context managers are
    """``with watching(c):`` the native calls this thread makes stop early once ``c`` says so (see
    ``mrt_watch_cancel`` in kernels.h); the previously watched one (a nested run's) is watched again after."""

    __slots__ = ("_c", "_previous")

    def __init__(self, c):
        self._c = c

    def __enter__(self) -> None:
        self._previous = getattr(_watched, "cancel", None)
        _watched.cancel = self._c
        _lib.mrt_watch_cancel(self._c)

    def __exit__(self, *exc) -> None:
        _watched.cancel = self._previous
        _lib.mrt_watch_cancel(self._previous if self._previous is not None else _ffi.NULL)


def set_scratch_limit(nbytes: int) -> None:
    """Bound the kernels' own scratch blocks (im2col, quantized inputs, recurrent projections, NMS and
    RoiAlign work areas) by ``nbytes``, the session's ``max_tensor_bytes``: a larger block is refused
    as running out of memory would be (:func:`no_scratch`).  One bound per process (the last set)."""
    if available:
        _lib.mrt_set_scratch_limit(nbytes)


def no_scratch(what: str) -> Exception:
    """The error of a native call that could not have its scratch: a :class:`ResourceError` naming the
    bound when the bound refused it (``mrt_scratch_refused``), else a MemoryError."""
    refused = int(_lib.mrt_scratch_refused())
    if refused:
        from minirt.kernels import _limits

        return ResourceError(f"{what}: its scratch of {_limits.fmt_bytes(refused)} is above this session's "
                             f"max_tensor_bytes of {_limits.fmt_bytes(_limits.current_limit())}")
    return MemoryError(f"{what}: could not allocate its scratch memory")


def check_geometry(fields: dict) -> None:
    """Raise :class:`minirt.errors.UnsupportedGeometry` unless the native kernels can run the window
    geometry ``fields`` (of ``mrt_conv_geometry``: n, c, h, w, m, group, kh, kw, sh, sw, dh, dw, pt, pl,
    oh, ow) without overflow: every field an int from 0 (kernel, strides, dilations: from 1; group 0 is a
    pooling's) to 2^31 - 1, and every size the kernels derive from them (input, output, weights, im2col columns, the
    planes of strided phases) under _GEOMETRY_MAX_ELEMENTS (2^59; 2^27 on 32-bit ARM).  The one place the sizes that reach C arithmetic are
    checked (kernels.c checks the same products again, as a guard); each struct is checked once when it
    is made (prepared calls and shared structs are reused)."""
    g = {k: fields.get(k, 0) for k in _GEOMETRY_FIELDS}
    for name, v in g.items():
        low = 1 if name in ("kh", "kw", "sh", "sw", "dh", "dw") else 0
        if not low <= v <= _INT_MAX:
            raise UnsupportedGeometry(f"the native kernels cannot take {name} = {v} (a window operation's "
                                      f"sizes, strides, pads and dilations must be from {low} to {_INT_MAX})")
    n, c, h, w, m = g["n"], g["c"], g["h"], g["w"], max(g["m"], g["c"])
    kh, kw, sh, sw, dh, dw, oh, ow = g["kh"], g["kw"], g["sh"], g["sw"], g["dh"], g["dw"], g["oh"], g["ow"]
    sizes = {
        "input": n * c * h * w,
        "output": n * m * oh * ow,
        "weights": m * c * kh * kw,
        "im2col columns": c * kh * kw * oh * ow,
        "window extent": ((kh - 1) * dh + 1) * ((kw - 1) * dw + 1),
        "strided phase planes": c * sh * sw * (ow + kw * dw) * (oh + kh * dh),
    }
    for what, size in sizes.items():
        if size >= _GEOMETRY_MAX_ELEMENTS:
            raise UnsupportedGeometry(
                f"the native kernels cannot take this window geometry: its {what} would be {size:.3g} elements "
                f"(n={n} c={c} h={h} w={w} m={g['m']} group={g['group']} kernel={kh}x{kw} strides={sh}x{sw} "
                f"dilations={dh}x{dw} output={oh}x{ow}; at most 2^{_GEOMETRY_MAX_ELEMENTS.bit_length() - 1})")


def _new(ctype: str, fields: dict, *owners):
    """A new ``ctype`` struct (cffi checks every value against its field's type: an out-of-range size
    raises OverflowError, as a positional argument did) keeping ``owners`` alive.  A window geometry is
    checked first (:func:`check_geometry`)."""
    if ctype == "mrt_conv_geometry *":
        check_geometry(fields)
    struct = _ffi.new(ctype, fields)
    if owners:
        _owners[struct] = owners
    return struct


# (kind, values...) -> struct, for the wrappers called without a prepared call: a struct is made
# once per distinct set of values, then read-only (safe to share between threads and recordings).
# An array's identity stands for its address: the struct keeps the array alive, so no other
# array can take that identity while the entry exists.  Emptied when it grows past _SHARED_MAX.
_shared: dict = {}
_SHARED_MAX = 4096


def _share(key: tuple, ctype: str, fields: dict, *owners):
    if len(_shared) >= _SHARED_MAX:
        _shared.clear()
    struct = _shared[key] = _new(ctype, fields, *owners)
    return struct


def _ptr(a):
    # from_buffer is the cheapest way to hand a numpy buffer to C (no copy;
    # read-only buffers such as memory-mapped weights are accepted).
    return _ffi.from_buffer("float[]", a)


def _opt(a):
    """``a``'s float pointer, or NULL for None."""
    return _ffi.NULL if a is None else _ffi.from_buffer("float[]", a)


_GEOMETRY_FIELDS = ("n", "c", "h", "w", "m", "group", "kh", "kw", "sh", "sw", "dh", "dw", "pt", "pl", "oh", "ow")


def _geometry(n, c, h, w, k=(1, 1), s=(1, 1), d=(1, 1), pb=(0, 0), out=(0, 0), m=0, group=1):
    """The (shared) ``mrt_conv_geometry`` of a window operation over (n, c, h, w)."""
    key = ("g", n, c, h, w, m, group, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0], out[1])
    return _shared.get(key) or _share(key, "mrt_conv_geometry *", dict(zip(_GEOMETRY_FIELDS, key[1:])))


def _planes_geometry(x_shape, k, s, d, pb, out):
    """The geometry of a pooling over the N * C planes of ``x_shape``; the kernels count the planes
    in an int: checked here."""
    n, c, h, wd = x_shape
    if n * c > _INT_MAX:
        raise OverflowError(f"minirt native pooling: {n} x {c} planes do not fit a C int")
    return _geometry(n, c, h, wd, k, s, d, pb, out)


_GEMM_FIELDS = ("batch", "M", "N", "K", "lda", "ldb", "ldc", "ldr", "sa", "sb", "sc", "sr", "transb", "bias_mode")


def _gemm_shape(batch, m, n, k, lda, ldb, ldc, ldr=0, sa=0, sb=0, sc=0, sr=0, transb=0, bias_mode=2):
    """The (shared) ``mrt_gemm_shape`` of ``batch`` products (see kernels.h)."""
    key = ("s", batch, m, n, k, lda, ldb, ldc, ldr, sa, sb, sc, sr, transb, bias_mode)
    return _shared.get(key) or _share(key, "mrt_gemm_shape *", dict(zip(_GEMM_FIELDS, key[1:])))


def _epilogue(bias, act, a0, a1, post=(1.0, 0.0)):
    """The (shared) ``mrt_epilogue``: ``post[0] * act(... + bias) + post[1]``; ``bias`` float32 or None."""
    key = ("e", None if bias is None else id(bias), act, a0, a1, post)
    return _shared.get(key) or _share(key, "mrt_epilogue *", {
        "bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": post[0], "post_b": post[1]}, bias)


def _char(a):
    """A byte pointer to ``a`` (uint8 / int8 data, packed weights)."""
    return _ffi.from_buffer("char[]", a)


def _u8(a):
    return _ffi.from_buffer("uint8_t[]", a)


# --------------------------------------------------------------------------- float kernels


def dwconv2d(x, w, bias, y, k, s, d, pb, act=0, a0=0.0, a1=0.0, residual=None) -> None:
    """y (N, C, OH, OW) = act(depthwise conv(x, w) + bias[c] + residual); residual has y's shape."""
    dwconv2d_call(dwconv2d_prepare(x.shape, w, bias, k, s, d, pb, y.shape[2:], act, a0, a1), x, y, residual)


def dwconv2d_prepare(x_shape, w, bias, k, s, d, pb, out, act=0, a0=0.0, a1=0.0) -> tuple:
    """The constant arguments of :func:`dwconv2d_call` for one layer and input shape: its geometry
    and epilogue structs and the pointer to ``w`` (float32, contiguous), made once."""
    n, c, h, wd = x_shape
    geometry = _new("mrt_conv_geometry *", {"n": n, "c": c, "h": h, "w": wd, "m": c, "group": c, "kh": k[0],
                                            "kw": k[1], "sh": s[0], "sw": s[1], "dh": d[0], "dw": d[1],
                                            "pt": pb[0], "pl": pb[1], "oh": out[0], "ow": out[1]})
    epilogue = _new("mrt_epilogue *", {"bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": 1.0},
                    bias)
    return geometry, _ptr(w), epilogue


def dwconv2d_call(prep, x, y, residual=None) -> None:
    """Run a prepared depthwise conv (:func:`dwconv2d`) of ``x`` into ``y``."""
    geometry, w, epilogue = prep
    _call(_lib.mrt_dwconv2d_f32, (geometry, w, epilogue, _ptr(x), _opt(residual), _ptr(y), threads()),
          x, residual, y)


def maxpool2d(x, y, k, s, d, pb) -> None:
    maxpool2d_call(maxpool2d_prepare(x.shape, k, s, d, pb, y.shape[2:]), x, y)


def maxpool2d_prepare(x_shape, k, s, d, pb, out, separable=False) -> tuple:
    """The constant arguments of :func:`maxpool2d_call` for one input shape.  ``separable``: the
    stride-1, dilation-1 kernel (:func:`maxpool2d_s1`; ``s`` and ``d`` are then ignored)."""
    n, c, h, wd = x_shape
    if n * c > _INT_MAX:
        raise OverflowError(f"minirt native MaxPool: {n} x {c} planes do not fit a C int")
    geometry = _new("mrt_conv_geometry *", {"n": n, "c": c, "h": h, "w": wd, "kh": k[0], "kw": k[1], "sh": s[0],
                                            "sw": s[1], "dh": d[0], "dw": d[1], "pt": pb[0], "pl": pb[1],
                                            "oh": out[0], "ow": out[1]})
    return _lib.mrt_maxpool2d_s1_f32 if separable else _lib.mrt_maxpool2d_f32, geometry


def maxpool2d_call(prep, x, y) -> None:
    """Max pooling of ``x`` into ``y`` (float32, contiguous) with a prepared geometry."""
    entry, geometry = prep
    # (only the separable kernel returns a code: non-zero without scratch memory)
    if _call(entry, (geometry, _ptr(x), _ptr(y), threads()), x, y):
        raise no_scratch("minirt native MaxPool")


def avgpool2d(x, y, k, s, d, pb, count_box, scale) -> None:
    (h0, h1), (w0, w1) = count_box
    key = ("box", h0, h1, w0, w1)
    box = _shared.get(key) or _share(key, "int[4]", [h0, h1, w0, w1])
    _call(_lib.mrt_avgpool2d_f32, (_planes_geometry(x.shape, k, s, d, pb, y.shape[2:]), box, scale, _ptr(x), _ptr(y),
                                   threads()), x, y)


def bias_act(y, bias, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """In place: y (N, C, ...) = act(y + bias[c] + residual)."""
    n, c = y.shape[:2]
    plane = y.size // (n * c) if n * c else 0
    _call(_lib.mrt_bias_act_f32, (_epilogue(bias, act, a0, a1), _ptr(y), _opt(residual), n, c, plane, threads()))


def im2col(x, cols, k, s, d, pb, out) -> None:
    """One image: x (C, H, W) -> cols (C*KH*KW, OH*OW)."""
    c, h, wd = x.shape
    _call(_lib.mrt_im2col_f32, (_geometry(1, c, h, wd, k, s, d, pb, out), _ptr(x), _ptr(cols), threads()))


def conv2d(x, w, group, k, s, d, pb, out, y, bias=None, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """y = act(conv(x, w) + bias + residual) for the whole batch in one call (float32, NCHW, contiguous)."""
    conv2d_call(conv2d_prepare(x.shape, w, group, k, s, d, pb, out, bias, act, a0, a1), x, y, residual)


def conv2d_prepare(x_shape, w, group, k, s, d, pb, out, bias=None, act=0, a0=0.0, a1=0.0, owner=None) -> tuple:
    """The constant arguments of :func:`conv2d_call` for one layer and input shape: its geometry and
    epilogue structs and the pointers to ``w`` (float32, contiguous) and its packed form, made once.
    ``owner``: the array the packed form is cached under, when ``w`` is a view of it (a 1-D conv's
    weight seen as (M, C, 1, K)); by default ``w``.

    Layers where the channel-vector kernel pays (small outputs, deep sums; ``mrt_conv2d_uses_packed_w``)
    also get ``w`` packed for it, once per weight array and group (cached while ``w`` lives), in the
    layout of the ISA in use (see :func:`conv2d_call`).  The packed form does not depend on the input's
    size, only whether the layer takes it: a model with a dynamic width (a text recognizer fed crops of
    every width) packs each weight once, not once per new width (PP-OCRv4 rec: 6 packs, 1.4 ms, on each
    width's first run).
    """
    n, c, h, wd = x_shape
    geometry = _new("mrt_conv_geometry *", {"n": n, "c": c, "h": h, "w": wd, "m": w.shape[0], "group": group,
                                            "kh": k[0], "kw": k[1], "sh": s[0], "sw": s[1], "dh": d[0], "dw": d[1],
                                            "pt": pb[0], "pl": pb[1], "oh": out[0], "ow": out[1]})
    epilogue = _new("mrt_epilogue *", {"bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": 1.0},
                    bias)
    owner = w if owner is None else owner
    if _lib.mrt_conv2d_uses_winograd(_geometry(1, c, 0, 0, k, s, d, out=out, m=w.shape[0], group=group)):
        packed = _cached_pack(owner, WINOGRAD_PACK_TAG, lambda: winograd_pack_w(w))
    else:
        packed = _conv_pack_w(owner, w, c, group, k, s, out)
    return geometry, _ptr(w), _opt(packed), epilogue, None if packed is None else isa


def conv2d_call(prep, x, y, residual=None) -> None:
    """Run a prepared convolution (:func:`conv2d`) of ``x`` into ``y``.  Weights packed under another
    ISA than the one in use (``select_isa`` since) are not passed: their layout depends on it."""
    geometry, w, packed, epilogue, packed_isa = prep
    if packed_isa is not None and packed_isa != isa:
        packed = _ffi.NULL
    rc = _call(_lib.mrt_conv2d_f32, (geometry, w, packed, epilogue, _ptr(x), _opt(residual), _ptr(y), threads()),
               x, residual, y)
    if rc == -2:
        raise UnsupportedGeometry("the native conv kernel refused its geometry (a derived size would overflow)")
    if rc != 0:
        raise no_scratch("minirt native conv2d")


def _conv_pack_w(owner, w, c, group, k, s, out):
    """``w`` packed for the channel-vector conv kernel (cached under ``owner``, the array ``w`` views, by
    group), or None when that kernel does not pay for this layer's geometry (``mrt_conv2d_uses_packed_w``)."""
    if not _lib.mrt_conv2d_uses_packed_w(_geometry(1, c, 0, 0, k, s, out=out, m=w.shape[0], group=group)):
        return None
    return _cached_pack(owner, conv_pack_tag(group), lambda: conv_pack_w(w, group))


# The cache key (with the weight array's identity) of a 3x3 conv weight's Winograd pack (16 x m x c floats,
# the same on every ISA; mrt_conv2d_winograd_pack_w).
WINOGRAD_PACK_TAG = ("conv_winograd_f32",)


def winograd_pack_w(w):
    """The (m, c, 3, 3) float32 weights ``w`` transformed for ``mrt_conv2d_f32``'s Winograd F(2x2, 3x3) path."""
    m, c = w.shape[0], w.shape[1]
    packed = _aligned_floats(int(_lib.mrt_conv2d_winograd_floats(m, c)))
    _lib.mrt_conv2d_winograd_pack_w(_ptr(w), m, c, _ptr(packed))
    return packed


def conv_pack_tag(group: int) -> tuple:
    """The cache key (with the weight array's identity) of a conv weight's packed form: its panels
    depend on the weight and its group alone (and the ISA: the cache is emptied when it changes)."""
    return ("conv_f32", int(group))


def conv_pack_w(w, group):
    """The (m, c/group, kh, kw) float32 weights ``w`` packed for ``mrt_conv2d_f32`` (current ISA)."""
    m, kdepth = w.shape[0], w[0].size
    packed = _aligned_floats(int(_lib.mrt_conv2d_packed_w_floats(m, group, kdepth)))
    _lib.mrt_conv2d_pack_w(_ptr(w), m, group, kdepth, _ptr(packed))
    return packed


def convtranspose_tiles(x, wt, m, k, bias_rows, y, act=0, a0=0.0, a1=0.0) -> None:
    """y (N, M, H*kh, W*kw) = act(ConvTranspose(x) + bias) for stride == kernel (taps never overlap).

    ``wt`` (M*kh*kw, C): the (C, M, kh, kw) weight transposed; ``bias_rows`` (M*kh*kw,) or None."""
    n, c, h, wd = x.shape
    geometry = _geometry(n, c, h, wd, k, k, (1, 1), (0, 0), (h * k[0], wd * k[1]), m)
    if _call(_lib.mrt_convtranspose_tiles_f32, (geometry, _ptr(wt), _epilogue(bias_rows, act, a0, a1), _ptr(x),
                                                _ptr(y), threads()), x, y) != 0:
        raise no_scratch("minirt native ConvTranspose")


# --------------------------------------------------------------------------- float products


def sgemm(a, b, c, bias=None, bias_mode=1, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) = act(a (M, K) @ b (K, N) + bias + residual), float32, rows may be strided.

    ``bias_mode`` 1: ``bias[m]`` per row (conv output channels); 2: ``bias[n]``
    per column (MatMul / Gemm).  ``a``, ``b``, ``c`` and ``residual`` must be 2-D
    with unit stride along their last axis (row strides are passed through,
    so views such as ``x.reshape(C, H*W)`` need no copy).
    """
    m, k = a.shape
    n = b.shape[1]
    it = 4
    shape = _gemm_shape(1, m, n, k, a.strides[0] // it, b.strides[0] // it, c.strides[0] // it,
                        0 if residual is None else residual.strides[0] // it, bias_mode=bias_mode)
    _call(_lib.mrt_sgemm_f32, (shape, _epilogue(bias, act, a0, a1), _ptr(a), _ptr(b), _ptr(c), _opt(residual),
                               threads()), a, b, residual, c)


def sgemm_batch(batch, m, n, k, a, lda, sa, b, ldb, sb, transb, c, ldc, sc, bias=None, residual=None, ldr=0, sr=0,
                act=0, a0=0.0, a1=0.0) -> None:
    """``batch`` GEMMs ``c_i (M, N) = act(a_i @ b_i + bias[n] + residual_i)`` (bias per column).

    ``a``, ``b``, ``c``, ``residual``: float32 arrays whose first element is that
    of matrix 0; leading dimensions and batch strides are in elements (batch
    stride 0 broadcasts).  ``transb``: ``b`` is stored (N, K), row stride ``ldb``.
    """
    # (called per run by the products that are not kept prepared: one key, one lookup for both structs)
    key = ("sgemm", batch, m, n, k, lda, ldb, ldc, ldr, sa, sb, sc, sr, transb, None if bias is None else id(bias),
           act, a0, a1)
    shape, epilogue = _shared.get(key) or _share_product(key, bias)
    _call(_lib.mrt_sgemm_f32, (shape, epilogue, _ptr(a), _ptr(b), _ptr(c), _opt(residual), threads()),
          a, b, residual, c)


def _share_product(key: tuple, bias) -> tuple:
    """The (shape, epilogue) structs of :func:`sgemm_batch`'s ``key``, made and shared."""
    batch, m, n, k, lda, ldb, ldc, ldr, sa, sb, sc, sr, transb, _, act, a0, a1 = key[1:]
    if len(_shared) >= _SHARED_MAX:
        _shared.clear()
    pair = _shared[key] = (_gemm_shape(batch, m, n, k, lda, ldb, ldc, ldr, sa, sb, sc, sr, int(transb), 2),
                           _epilogue(bias, act, a0, a1))
    return pair


def sgemm_pack_b(b, transb: int, ldb: int, k: int, n: int, owner) -> tuple:
    """``(isa, packed)``: the right operand ``b`` of a product (K x N, or stored N x K with
    ``transb``; float32, rows of ``ldb`` floats) packed once for :func:`sgemm_pb` in the layout of
    the ISA in use, cached while the weight array ``owner`` is alive."""

    def pack():
        out = _aligned_floats(int(_lib.mrt_sgemm_packed_b_floats(k, n)))
        _lib.mrt_sgemm_pack_b_f32(_ptr(b), ldb, int(transb), k, n, _ptr(out))
        return out

    return isa, _cached_pack(owner, ("sgemm_b", int(transb), k, n), pack)


def sgemm_pb(a, m: int, n: int, k: int, packed, c, bias=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) = act(a (M, K) @ B + bias[n]) with B from :func:`sgemm_pack_b` (its ``(isa, packed)``,
    made under the ISA in use); ``a`` and ``c`` C-contiguous float32."""
    sgemm_pb_call(sgemm_pb_prepare(m, n, k, bias, act, a0, a1), a, packed, c)


def sgemm_pb_prepare(m: int, n: int, k: int, bias=None, act=0, a0=0.0, a1=0.0) -> tuple:
    """The constant arguments of :func:`sgemm_pb_call` for one product shape: its shape and epilogue
    structs, made once (they keep ``bias`` alive)."""
    shape = _new("mrt_gemm_shape *", {"batch": 1, "M": m, "N": n, "K": k, "lda": k, "ldc": n, "bias_mode": 2})
    return shape, _new("mrt_epilogue *", {"bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": 1.0}, bias)


def sgemm_pb_call(prep, a, packed, c) -> None:
    """Run a prepared :func:`sgemm_pb` of ``a`` into ``c`` with ``packed`` from :func:`sgemm_pack_b`."""
    shape, epilogue = prep
    _call(_lib.mrt_sgemm_pb_f32, (shape, epilogue, _ptr(a), _ptr(packed[1]), _ptr(c), _ffi.NULL, threads()),
          a, None, c)


def sgemv(a, m: int, n: int, k: int, b, ldb: int, transb: int, c, bias=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) = act(a (M, K) @ B + bias[n]) for a few rows, B read in place (not packed): ``b`` K x N with
    rows of ``ldb`` floats, or with ``transb`` stored N x K; threads split the columns.  ``a`` and ``c``
    C-contiguous float32."""
    _call(_lib.mrt_sgemv_f32, (_gemm_shape(1, m, n, k, k, ldb, n, transb=int(transb)), _epilogue(bias, act, a0, a1),
                               _ptr(a), _ptr(b), _ptr(c), threads()))


def aligned_empty(shape, dtype):
    """An uninitialised C-contiguous array starting on a 64-byte boundary (packed panels, weights that
    kernels read in place: numpy's own big arrays start 16 bytes into a page)."""
    import numpy as np

    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _aligned_floats(count: int):
    """An uninitialised float32 array of ``count`` elements starting on a 64-byte boundary (packed panels)."""
    return aligned_empty((count,), "float32")


# --------------------------------------------------------------------------- packed weights

# (id(weight array), tag) -> (weak reference to it, packed form); see _cached_pack().
_qpacked: dict = {}


def _cached_pack(owner, tag, pack):
    """``pack()`` (a packed form of the weight array ``owner``, or None), computed once and
    cached while ``owner`` is alive, under ``(id(owner), tag)``; the cache is emptied when the
    ISA changes (packed layouts depend on it).  A writeable ``owner`` (a computed value, not one
    of the model's read-only constants) is packed anew on every call."""
    if getattr(getattr(owner, "flags", None), "writeable", False):
        return pack()  # a computed array may be refilled in place: its identity says nothing of its values
    key = (id(owner), tag)
    hit = _qpacked.get(key)
    if hit is not None and hit[0]() is owner:
        return hit[1]
    packed = pack()
    _keep_pack(owner, key, packed)
    return packed


def _keep_pack(owner, key, packed) -> None:
    """Cache ``packed`` under ``key`` while ``owner`` lives (an owner that cannot be weakly referenced
    is not cached)."""
    import weakref

    try:
        ref = weakref.ref(owner, lambda _r, key=key: _qpacked.pop(key, None))
    except TypeError:
        return
    _qpacked[key] = (ref, packed)


def packed_panel_width() -> int:
    """The panel width (G_NR: output channels / columns per panel) of the float kernels' packed
    weights under the ISA in use, as the loaded module reports it (the floats of a 1 x 1 packed
    weight are one panel); 0 without native kernels (or switched off)."""
    if not available or _lib is None:
        return 0
    conv, product = int(_lib.mrt_conv2d_packed_w_floats(1, 1, 1)), int(_lib.mrt_sgemm_packed_b_floats(1, 1))
    return conv if conv == product else 0


def seed_pack(owner, tag, packed) -> None:
    """Make ``packed`` the cached packed form of the read-only weight array ``owner`` under ``tag``
    (the key :func:`conv2d_prepare` / :func:`sgemm_pack_b` look up), as if the first run had packed
    it: the builder's packed weights (minirt/format/packed_weights.py), seeded by the session at load.
    The caller has checked that ``packed`` is in the layout of the ISA in use (:func:`packed_panel_width`);
    ``select_isa`` empties the cache, and the kernels then pack lazily again.

    The kernels read packed panels with aligned vector loads: ``packed`` is used in place when it
    starts on a 64-byte boundary (a memory-mapped file: the section and its entries are aligned),
    else copied to memory that does (an artifact loaded from ``bytes``, whose data Python places
    at no particular alignment): a copy, still no packing."""
    if getattr(getattr(owner, "flags", None), "writeable", True):
        return
    if packed.ctypes.data % 64:
        aligned = _aligned_floats(packed.size)
        aligned[:] = packed
        packed = aligned
    _keep_pack(owner, (id(owner), tag), packed)


# --------------------------------------------------------------------------- int8


def qpack(w, owner=None, tag=0):
    """Pack s8 weights ``w`` (M, K) for :func:`qgemm`.

    Cached while ``owner`` (default ``w``; pass the model's weight array when
    ``w`` is a view of it) is alive, under ``(id(owner), tag)``.
    """
    return _cached_pack(w if owner is None else owner, tag, lambda: _qpack_now(w))


def _qpack_now(w):
    import numpy as np

    m, k = w.shape
    wc = np.ascontiguousarray(w, dtype=np.int8)
    size = int(_lib.mrt_qgemm_packed_size(m, k))
    raw = np.empty(size + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    packed = raw[off:off + size]
    _lib.mrt_qgemm_pack_w(_ffi.from_buffer("int8_t[]", wc), m, k, _char(packed))
    return packed


def qpack_winograd(w):
    """The Winograd F(2x2, 3x3) weights of the (M, C, 3, 3) int8 conv weights ``w`` for
    :func:`qconv2d_prepare` (kernels.h, mrt_qconv_winograd_pack_w: int16 (16, M, C rounded up to even)),
    cached while ``w`` is alive."""
    return _cached_pack(w, "winograd", lambda: _qpack_winograd_now(w))


def _qpack_winograd_now(w):
    import numpy as np

    m, c = w.shape[:2]
    wc = np.ascontiguousarray(w, dtype=np.int8)
    u = np.empty(int(_lib.mrt_qconv_winograd_packed_size(m, c)), dtype=np.int16)
    _lib.mrt_qconv_winograd_pack_w(_ffi.from_buffer("int8_t[]", wc), m, c, _ffi.from_buffer("int16_t[]", u))
    return u


def qpacked_pairs16(packed, m: int, k: int) -> bool:
    """Whether :func:`qpack` found |w[i, 2j]| + |w[i, 2j + 1]| <= 128 for every pair of its (m, k) matrix:
    on AVX2 without VNNI those GEMMs multiply with vpmaddubsw (such a pair of u8 x s8 products adds up
    within int16, exact)."""
    return bool(_lib.mrt_qgemm_packed_pairs16(_char(packed), m, k))


def _y_q_arrays(y_q, m: int):
    """``(y_scales, y_zeros)`` float32 / int32 arrays of one value per output channel from ``y_q``: a
    float and an int for every channel, or such arrays already."""
    if hasattr(y_q[0], "__len__"):
        return y_q
    import numpy as np

    return np.full(m, y_q[0], np.float32), np.full(m, y_q[1], np.int32)


def _y_q_key(y_q):
    """What identifies ``y_q`` (None, scalars, or arrays, by identity) in a prepared call's variants."""
    if y_q is None:
        return None
    if hasattr(y_q[0], "__len__"):
        return id(y_q[0]), id(y_q[1])
    return float(y_q[0]), int(y_q[1])


def qgemm(packed_w, m, k, x, x_zero, scale, c, bias=None, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) float32 = act(scale[m] * (W @ (x - x_zero)) + bias[m] + residual), exact int32 products.

    ``packed_w`` from :func:`qpack` of the (M, K) int8 weights; ``x`` (K, N)
    uint8 with unit stride along its last axis; ``scale`` (M,) float32 (x_scale
    * w_scale[m]); ``bias`` (M,) or None; ``residual`` like ``c`` or None.
    """
    n = x.shape[1]
    shape = _gemm_shape(1, m, n, k, 0, x.strides[0], c.strides[0] // 4,
                        0 if residual is None else residual.strides[0] // 4)
    key = ("q gemm", int(x_zero), id(packed_w), id(scale))
    quant = _shared.get(key) or _share(key, "mrt_quant *", {"x_zero": int(x_zero), "packed_w": _char(packed_w),
                                                           "scale": _ptr(scale)}, packed_w, scale)
    _call(_lib.mrt_qgemm_u8s8_f32, (shape, quant, _epilogue(bias, act, a0, a1), _u8(x), _opt(residual), _ptr(c),
                                    threads()))


class _QConvPrepared:
    """The constant arguments of :func:`qconv2d_call` / :func:`qconv2d_pool_call` for one layer and
    input shape: the geometry, and the quantization and epilogue structs per variant of the per-call
    arguments (input dtype, static input quantization, requantization, post map), each made once."""

    __slots__ = ("geometry", "m", "packed_w", "wino", "scale", "bias", "act", "a0", "a1", "variants", "__weakref__")

    def variant(self, x_u8: bool, x_scale, x_zero, y_q, post) -> tuple:
        """``(mrt_quant, mrt_epilogue)`` for these per-call arguments (``x_scale`` 0: dynamic quantization,
        computed by the native call from its input, so the structs stay constant)."""
        key = (x_u8, x_scale, x_zero, _y_q_key(y_q), post)
        hit = self.variants.get(key)
        if hit is not None:
            return hit
        y_arrays = None if y_q is None else _y_q_arrays(y_q, self.m)
        quant = _new("mrt_quant *", {
            "x_u8": int(x_u8), "x_scale": x_scale, "x_zero": int(x_zero), "packed_w": _char(self.packed_w),
            "scale": _ptr(self.scale), "y_u8": int(y_q is not None),
            "y_scales": _ffi.NULL if y_arrays is None else _ptr(y_arrays[0]),
            "y_zeros": _ffi.NULL if y_arrays is None else _ffi.from_buffer("int32_t[]", y_arrays[1]),
            "wino_w": _ffi.NULL if self.wino is None else _ffi.from_buffer("int16_t[]", self.wino)},
            self.packed_w, self.scale, y_arrays, self.wino)
        epilogue = _new("mrt_epilogue *", {"bias": _opt(self.bias), "act": self.act, "a0": self.a0, "a1": self.a1,
                                           "post_a": post[0], "post_b": post[1]}, self.bias)
        if len(self.variants) >= 16:  # (a node has one; a plan shared by a few nodes, a few)
            self.variants.clear()
        self.variants[key] = (quant, epilogue)
        return quant, epilogue


def qconv2d(x, x_scale: float, x_zero: int, packed_w, m, group, k, s, d, pb, y, scale, bias=None, residual=None,
            act=0, a0=0.0, a1=0.0) -> None:
    """A whole int8 convolution: y (N, M, OH, OW) float32 from x (N, C, H, W) float32 (contiguous).

    ``packed_w`` from :func:`qpack` of the (M, C/group*KH*KW) int8 weights; x is
    quantized with (x_scale, x_zero) (uint8) inside; ``scale`` (M,) = x_scale *
    w_scale[m]; ``bias`` (M,) or None; ``residual`` like ``y`` or None.
    """
    prep = qconv2d_prepare(x.shape, packed_w, m, group, k, s, d, pb, y.shape[2:], scale, bias, act, a0, a1)
    qconv2d_call(prep, x, x_scale, int(x_zero), y, residual)


def qconv2d_prepare(x_shape, packed_w, m, group, k, s, d, pb, out, scale, bias, act=0, a0=0.0, a1=0.0, w=None):
    """The constant arguments of :func:`qconv2d_call` for one layer and input shape (a
    :class:`_QConvPrepared`; it keeps the arrays its structs point into alive).  ``w``: the (M, C, KH, KW)
    int8 weights that ``packed_w`` packs, for the convs the kernel computes as Winograd F(2x2, 3x3) on this
    CPU (:func:`qpack_winograd`; the same results, bit for bit)."""
    n, c, h, wd = x_shape
    prep = _QConvPrepared()
    prep.geometry = _new("mrt_conv_geometry *", {"n": n, "c": c, "h": h, "w": wd, "m": m, "group": group,
                                                 "kh": k[0], "kw": k[1], "sh": s[0], "sw": s[1], "dh": d[0],
                                                 "dw": d[1], "pt": pb[0], "pl": pb[1], "oh": out[0], "ow": out[1]})
    prep.m, prep.packed_w, prep.scale, prep.bias = m, packed_w, scale, bias
    prep.wino = qpack_winograd(w) if w is not None and _lib.mrt_qconv_uses_winograd(prep.geometry) else None
    prep.act, prep.a0, prep.a1 = act, a0, a1
    prep.variants = {}
    return prep


def qconv2d_call(prep, x, x_scale: float, x_zero: int, y, residual=None, y_q=None, post=(1.0, 0.0)) -> None:
    """Run a prepared int8 convolution (see :func:`qconv2d`); ``x_scale`` 0 with a float ``x``:
    dynamic quantization (the call derives x's scale and zero point, and the per-row scales from the
    prepared ones, then the weights' scales).  ``x`` may be uint8 (already quantized with
    ``x_zero``); ``post = (a, b)``: the result is ``a * act(...) + b``; with
    ``y_q = (y_scale, y_zero)`` (a float and an int, or float32 and int32 arrays of one value per
    output channel) ``y`` is uint8: the float result requantized."""
    x_u8 = x.itemsize == 1
    quant, epilogue = prep.variant(x_u8, x_scale, x_zero, y_q, post)
    args = (prep.geometry, quant, epilogue, _char(x) if x_u8 else _ptr(x), _opt(residual),
            _char(y) if y_q else _ptr(y), threads())
    rc = _call(_lib.mrt_qconv2d, args, x, residual, y)
    if rc == -2:
        raise UnsupportedGeometry("the native int8 conv kernel refused its geometry (a derived size would overflow)")
    if rc != 0:
        raise no_scratch("minirt native qconv2d")


def qconv2d_pool_call(prep, x, x_scale: float, x_zero: int, pool_kernel, pool_strides, y, residual=None) -> None:
    """Run a prepared int8 convolution (see :func:`qconv2d_call`; float output) and max-pool its
    result, without padding, into ``y`` (n, m, (oh - kh) // sh + 1, (ow - kw) // sw + 1)."""
    x_u8 = x.itemsize == 1
    quant, epilogue = prep.variant(x_u8, x_scale, x_zero, None, (1.0, 0.0))
    pool = _geometry(0, 0, 0, 0, pool_kernel, pool_strides)
    args = (prep.geometry, pool, quant, epilogue, _char(x) if x_u8 else _ptr(x), _opt(residual), _ptr(y), threads())
    rc = _call(_lib.mrt_qconv2d_pool_f32, args, x, residual, y)
    if rc == -2:
        raise ValueError(f"minirt native qconv2d: pooling window {pool_kernel} larger than the output "
                         f"{(prep.geometry.oh, prep.geometry.ow)}")
    if rc != 0:
        raise no_scratch("minirt native qconv2d")


def qconvtranspose_tiles(x, x_zero: int, packed_w, m: int, k, scale, bias, y, y_q=None, act=0, a0=0.0,
                         a1=0.0) -> None:
    """int8 ConvTranspose with stride == kernel ``k`` = (kh, kw), no padding, one group:
    y (N, M, H*kh, W*kw) from x (N, C, H, W) uint8 (zero point ``x_zero``), both contiguous.

    ``packed_w`` from :func:`qpack` of the (M*kh*kw, C) int8 weights (row (m*kh + t)*kw + u is
    W[:, m, t, u]); ``scale`` (float32, x_scale * w_scale per GEMM row), ``bias`` (float32 or None)
    per GEMM row; with ``y_q = (y_scale, y_zero)`` (float32 / int32 per GEMM row) ``y`` is uint8, the
    float result requantized (as :func:`qconv2d_call`'s)."""
    n, c, h, wd = x.shape
    geometry = _geometry(n, c, h, wd, k, k, (1, 1), (0, 0), (h * k[0], wd * k[1]), m)
    key = ("q convt", int(x_zero), id(packed_w), id(scale), None if y_q is None else (id(y_q[0]), id(y_q[1])))
    quant = _shared.get(key) or _share(key, "mrt_quant *", {
        "x_u8": 1, "x_zero": int(x_zero), "packed_w": _char(packed_w), "scale": _ptr(scale),
        "y_u8": int(y_q is not None), "y_scales": _ffi.NULL if y_q is None else _ptr(y_q[0]),
        "y_zeros": _ffi.NULL if y_q is None else _ffi.from_buffer("int32_t[]", y_q[1])}, packed_w, scale, y_q)
    rc = _call(_lib.mrt_qconvtranspose_tiles, (geometry, quant, _epilogue(bias, act, a0, a1), _u8(x),
                                               _u8(y) if y_q else _ptr(y), threads()), x, y)
    if rc == -1:
        raise no_scratch("minirt native QConvTranspose")
    if rc != 0:
        raise ValueError("minirt native QConvTranspose: invalid arguments")


# Largest kh * kw for mrt_qdwconv2d: its integer sums stay exact in float32 (255 * 128 * 514 < 2^24).
QDW_MAX_TAPS = 514


def qdwconv2d_prepare(x_shape, k, s, d, pb, out, x_scale, x_zero, w, scale, bias, act=0, a0=0.0, a1=0.0,
                      post=(1.0, 0.0)):
    """The constant arguments of :func:`qdwconv2d_call` for one depthwise layer and input shape.

    ``x_scale`` / ``x_zero`` float32 (C,) (the zero points integer valued), ``w`` float32
    (C, KH, KW) holding the int8 weights, ``scale`` float32 (C,) = x_scale * w_scale,
    ``bias`` float32 (C,) or None; ``post = (a, b)``: y = a * act(...) + b.  The structs keep the
    arrays alive; the quantization struct is made per variant (input dtype, output requantization)."""
    n, c, h, wd = x_shape
    geometry = _new("mrt_conv_geometry *", {"n": n, "c": c, "h": h, "w": wd, "m": c, "group": c, "kh": k[0],
                                            "kw": k[1], "sh": s[0], "sw": s[1], "dh": d[0], "dw": d[1],
                                            "pt": pb[0], "pl": pb[1], "oh": out[0], "ow": out[1]})
    epilogue = _new("mrt_epilogue *", {"bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": post[0],
                                       "post_b": post[1]}, bias)
    return geometry, epilogue, (x_scale, x_zero, w, scale), {}


def qdwconv2d_call(prep, x, y, residual=None, y_q=None) -> None:
    """Run a prepared int8 depthwise conv: ``x`` float32 or uint8 (already quantized with the
    prepared zero points), ``y`` float32, or uint8 with ``y_q = (y_scale, y_zero)``;
    ``residual`` float32 like the output or None (added before the activation)."""
    geometry, epilogue, (x_scale, x_zero, w, scale), variants = prep
    x_u8 = x.itemsize == 1
    key = (x_u8, None if y_q is None else (float(y_q[0]), int(y_q[1])))
    quant = variants.get(key)
    if quant is None:
        quant = _new("mrt_quant *", {
            "x_u8": int(x_u8), "x_scales": _ptr(x_scale), "x_zeros": _ptr(x_zero), "w": _ptr(w),
            "scale": _ptr(scale), "y_u8": int(y_q is not None), "y_scale": 0.0 if y_q is None else key[1][0],
            "y_zero": 0 if y_q is None else key[1][1]}, x_scale, x_zero, w, scale)
        if len(variants) >= 16:
            variants.clear()
        variants[key] = quant
    _call(_lib.mrt_qdwconv2d, (geometry, quant, epilogue, _char(x) if x_u8 else _ptr(x), _opt(residual),
                               _char(y) if y_q else _ptr(y), threads()), x, residual, y)


def qmatmul(a, x_scale: float, x_zero: int, packed_w, n, scale, bias, y, act=0, a0=0.0, a1=0.0) -> None:
    """y (rows, n) float32 = act(scale[j] * (quant(a) - x_zero) @ W^T + bias[j]); a (rows, K) float32
    contiguous; ``packed_w`` from :func:`qpack` of the (n, K) int8 weights."""
    rows, k = a.shape
    qmatmul_call(qmatmul_prepare(rows, k, x_scale, x_zero, packed_w, n, scale, bias, act, a0, a1), a, y)


def qmatmul_prepare(rows: int, k: int, x_scale: float, x_zero: int, packed_w, n, scale, bias, act=0, a0=0.0,
                    a1=0.0) -> tuple:
    """The constant arguments of :func:`qmatmul_call` for one layer and number of rows: its shape,
    quantization and epilogue structs, made once (they keep the arrays alive).  ``x_scale`` 0:
    dynamic quantization, the kernel derives the input's scale and zero point from it on every call,
    and ``scale`` holds the weights' scales (kernels.h, D89)."""
    shape = _new("mrt_gemm_shape *", {"batch": 1, "M": rows, "N": n, "K": k, "lda": k, "ldc": n})
    quant = _new("mrt_quant *", {"x_scale": x_scale, "x_zero": int(x_zero), "packed_w": _char(packed_w),
                                 "scale": _ptr(scale)}, packed_w, scale)
    epilogue = _new("mrt_epilogue *", {"bias": _opt(bias), "act": act, "a0": a0, "a1": a1, "post_a": 1.0}, bias)
    return shape, quant, epilogue


def qmatmul_call(prep, a, y) -> None:
    """Run a prepared :func:`qmatmul` of ``a`` (rows, K) into ``y`` (rows, n)."""
    shape, quant, epilogue = prep
    if _call(_lib.mrt_qmatmul_f32, (shape, quant, epilogue, _ptr(a), _ptr(y), threads()), a, y) != 0:
        raise no_scratch("minirt native qmatmul")


def quantize_u8(x, q, scale: float, zero_point: int) -> None:
    """q (uint8, same size) = clamp(rint(x / scale) + zero_point, 0, 255); both contiguous."""
    _call(_lib.mrt_quantize_u8_f32, (_ptr(x), _u8(q), x.size, scale, int(zero_point), threads()), x, q)


def quantize_add_up_u8(x, xu, q, scale: float, zero_point: int, xm=None, um=None) -> None:
    """q (uint8 (N, C, H, W)) = quantize_u8 of ``x * xm + nearest-upsampled (xu * um)`` (xm, um:
    float32, one multiplier per (image, channel), or None), or of the upsampled xu * um alone when x
    is None: x float32 like q, xu float32 (N, C, H / f, W / f) for an integer factor f (the same on
    both axes); all contiguous."""
    for m in (xm, um):
        if m is not None and m.size != q.shape[0] * q.shape[1]:
            raise ValueError(f"quantize_add_up_u8: {m.size} multipliers for {q.shape[0] * q.shape[1]} planes")
    f = q.shape[2] // xu.shape[2] if xu.shape[2] else 0
    if x is not None and x.shape != q.shape:
        raise ValueError(f"quantize_add_up_u8: x {x.shape} and q {q.shape} differ")
    n, c, h, wd = q.shape
    geometry = _geometry(n, c, xu.shape[2], xu.shape[3], (f, f), (f, f), (1, 1), (0, 0), (h, wd))
    key = ("q out", scale, int(zero_point))
    quant = _shared.get(key) or _share(key, "mrt_quant *", {"y_u8": 1, "y_scale": scale, "y_zero": int(zero_point)})
    rc = _call(_lib.mrt_quantize_add_up_u8_f32, (geometry, quant, _opt(x), _opt(xm), _ptr(xu), _opt(um), _u8(q),
                                                 threads()), x, xm, xu, um, q)
    if rc == -1:
        raise no_scratch("minirt native quantize_add_up_u8")
    if rc != 0:
        raise ValueError(f"quantize_add_up_u8: {q.shape} is not {xu.shape} upsampled by an integer factor")


def im2col_u8(x, cols, k, s, d, pb, out, pad: int) -> None:
    """One uint8 image: x (C, H, W) -> cols (C*KH*KW, OH*OW), padding with ``pad``."""
    c, h, wd = x.shape
    _call(_lib.mrt_im2col_u8, (_geometry(1, c, h, wd, k, s, d, pb, out), _u8(x), _u8(cols), int(pad), threads()))


# --------------------------------------------------------------------------- row kernels


def softmax_rows(x, y, log: bool = False) -> None:
    """y = Softmax (or LogSoftmax) of x over its last axis; both float32, C-contiguous, same shape."""
    n = x.shape[-1]
    _call(_lib.mrt_softmax_f32, (_ptr(x), _ptr(y), x.size // n, n, int(log), threads()), x, y)


_SDPA_FIELDS = ("bh", "sq", "sk", "d", "dv", "transpose_k", "scale", "mask_b", "mask_r")


def sdpa(q, k, v, mask, out, scale: float, transpose_k: bool, mask_strides=(0, 0)) -> None:
    """out = softmax(scale * q . k^T + mask) . v over the last two axes (sdpa_impl.h), all float32 and
    C-contiguous: q (..., sq, d), k (..., sk, d) (``transpose_k``) or (..., d, sk), v (..., sk, dv), out
    (..., sq, dv), the leading axes the same for all (b of them flattened); ``mask`` None or an array whose
    element (b, i, j) is at flat offset b * mask_strides[0] + i * mask_strides[1] + j."""
    sq, d = q.shape[-2:]
    sk = k.shape[-2] if transpose_k else k.shape[-1]
    key = ("sdpa", q.size // (sq * d) if sq * d else 0, sq, sk, d, v.shape[-1], int(transpose_k), float(scale),
           int(mask_strides[0]), int(mask_strides[1]))
    shape = _shared.get(key) or _share(key, "mrt_sdpa_shape *", dict(zip(_SDPA_FIELDS, key[1:])))
    rc = _call(_lib.mrt_sdpa_f32, (shape, _ptr(q), _ptr(k), _ptr(v), _opt(mask), _ptr(out), threads()),
               q, k, v, mask, out)
    if rc == -2:
        raise UnsupportedGeometry("the native attention kernel refused its sizes")
    if rc != 0:
        raise no_scratch("minirt native attention")


def layernorm_rows(x, scale, bias, y, eps: float) -> None:
    """y = LayerNormalization of x over rows of ``scale.size`` floats (the trailing axes): all float32 and
    C-contiguous, ``scale`` / ``bias`` (or None) of the row's size, ``y`` like ``x``."""
    n = scale.size
    _call(_lib.mrt_layernorm_f32, (_ptr(x), _ptr(scale), _opt(bias), _ptr(y), x.size // n, n, float(eps),
                                   threads()), x, scale, bias, y)


def rmsnorm_rows(x, scale, y, eps: float) -> None:
    """y = RMS normalization of x over rows of ``scale.size`` floats: x / sqrt(mean(x^2) + eps) * scale,
    all float32 C-contiguous, ``y`` like ``x`` (may be x)."""
    n = scale.size
    _call(_lib.mrt_rmsnorm_f32, (_ptr(x), _ptr(scale), _ptr(y), x.size // n, n, float(eps), threads()), x, scale, y)


def instancenorm_rows(x, scale, bias, y, eps: float) -> None:
    """y = InstanceNormalization of x (N, C, ...): float32 C-contiguous, ``scale`` / ``bias`` of C values
    (bias may be None), ``y`` like ``x``; each of the N * C planes normalized over its own values, one
    call per image (a program replays the calls of an image that is a whole buffer: N = 1)."""
    c = scale.size
    n = x.size // (x.shape[0] * c) if x.size else 0
    for img in range(x.shape[0]):
        _call(_lib.mrt_instancenorm_f32, (_ptr(x[img]), _ptr(scale), _opt(bias), _ptr(y[img]), c, n, float(eps),
                                          threads()), x[img], scale, bias, y[img])


# --------------------------------------------------------------------------- data movement (layout_impl.h)


def _bytes(a):
    """``a``'s memory as a ``char *`` (any dtype; C-contiguous)."""
    return _ffi.from_buffer("char[]", a)


INDEX_MAX_RANK = 8  # MRT_INDEX_MAX_RANK of kernels.h


def index_map(shape, offsets, itemsize: int, fill: int = 0):
    """The ``mrt_index_map`` of an index copy (kernels.h): output ``shape`` (at most INDEX_MAX_RANK
    axes, each > 0), per axis an int64 array of ``shape[a]`` element offsets into the source (< 0:
    the element is ``fill``, an integer holding the fill element's little-endian bytes), elements of
    ``itemsize`` bytes.  The struct keeps the tables alive; build it once per input shape."""
    import numpy as np

    tables = [np.ascontiguousarray(o, dtype="l") for o in offsets]  # (C long: int32 on 32-bit ARM)
    last = tables[-1]
    inner_run = int(bool(last.size) and last[0] >= 0 and bool(np.all(last == last[0] + np.arange(last.size))))
    return _new("mrt_index_map *", {"rank": len(shape), "elem": itemsize, "inner_run": inner_run, "fill": fill,
                                    "shape": list(shape), "offsets": [_ffi.from_buffer("long[]", t) for t in tables]},
                tables)


def index_copy(m, x, y) -> None:
    """y = x moved by the prepared map ``m`` (:func:`index_map`); x and y C-contiguous, y of the map's shape."""
    _call(_lib.mrt_index_copy, (m, _bytes(x), _bytes(y), threads()), x, y)


def gather_rows(s, x, idx, y) -> bool:
    """Gather along one axis with run-time int64 indices ``idx`` (prepared shape ``s``: ``mrt_gather_shape``);
    all C-contiguous.  False (nothing written) when an index is out of range."""
    return _call(_lib.mrt_gather_rows, (s, _bytes(x), _ffi.from_buffer("int64_t[]", idx), _bytes(y), threads()),
                 x, idx, y) == 0


def lookup_rows(s, table, ids, y) -> None:
    """y[j] = table[ids[j]] for ids (int32 / int64) in [0, rows - 1), else table's last row (com.minirt::RowLookup;
    prepared shape ``s``: :func:`gather_shape` with outer 1, axis = the table's rows); all C-contiguous."""
    rc = _call(_lib.mrt_lookup_rows, (s, _bytes(table), _bytes(ids), ids.dtype.itemsize,
                                      _bytes(y), threads()), table, ids, y)
    if rc != 0:
        raise ValueError(f"minirt native lookup_rows: ids of {ids.dtype} (code {rc})")


# numpy dtype name -> ONNX data type code, for the types mrt_cast converts between
CAST_CODES = {"float32": 1, "uint8": 2, "int8": 3, "int32": 6, "int64": 7, "bool": 9, "float64": 11}


def cast(x, y) -> None:
    """y = x.astype(y.dtype) for C-contiguous arrays of the same size whose dtypes are in CAST_CODES."""
    _call(_lib.mrt_cast, (CAST_CODES[x.dtype.name], CAST_CODES[y.dtype.name], _bytes(x), _bytes(y), x.size,
                          threads()), x, y)


def broadcast_map(op: str, type_code: int, shape, strides):
    """The ``mrt_broadcast_map`` of op ``op`` (a name of ``mrt_ew_op`` without its prefix: "ADD",
    "EQUAL", "WHERE", ...) over operands of ONNX type ``type_code``: output ``shape`` (at most
    INDEX_MAX_RANK axes) and per operand (up to 3) its element strides per axis."""
    rows = [list(s) for s in strides] + [[0] * len(shape)] * (3 - len(strides))
    return _new("mrt_broadcast_map *", {"op": getattr(_lib, "MRT_EW_" + op), "type": type_code, "rank": len(shape),
                                        "shape": list(shape), "strides": rows})


def broadcast(m, a, b, c, y) -> None:
    """y = the prepared elementwise op ``m`` (:func:`broadcast_map`) of a, b (or None), c (or None)."""
    _call(_lib.mrt_broadcast, (m, _bytes(a), _ffi.NULL if b is None else _bytes(b), _ffi.NULL if c is None
                               else _bytes(c), _bytes(y), threads()), a, b, c, y)


REDUCE_OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceSumSquare": 4}


def reduce(op: str, x, y, outer: int, n: int, inner: int) -> None:
    """y (outer, inner) = ``op`` (a key of REDUCE_OPS) over the middle axis of float32 x (outer, n, inner)."""
    _call(_lib.mrt_reduce_f32, (REDUCE_OPS[op], _ptr(x), _ptr(y), outer, n, inner, threads()), x, y)


# integer dtypes mrt_reduce_int takes (mrt_cast's ONNX codes) and its ops
REDUCE_INT_TYPES = {"int32": 6, "int64": 7}
REDUCE_INT_OPS = {"ReduceSum": 0, "ReduceMax": 2, "ReduceMin": 3}


def reduce_int(op: str, x, y, outer: int, n: int, inner: int) -> None:
    """y (outer, inner) = ``op`` (a key of REDUCE_INT_OPS) over the middle axis of x (outer, n, inner), both
    C-contiguous of one dtype of REDUCE_INT_TYPES, n > 0 (sums wrap in the dtype, as numpy's)."""
    rc = _call(_lib.mrt_reduce_int, (REDUCE_INT_OPS[op], REDUCE_INT_TYPES[x.dtype.name],
                                     _ffi.from_buffer("char[]", x), _ffi.from_buffer("char[]", y), outer, n, inner,
                                     threads()), x, y)
    if rc != 0:
        raise ValueError(f"minirt native reduce: {op} of {x.dtype} as ({outer}, {n}, {inner}) (code {rc})")


def gather_shape(outer: int, axis: int, count: int, inner_bytes: int):
    key = ("gather", outer, axis, count, inner_bytes)
    return _shared.get(key) or _share(key, "mrt_gather_shape *",
                                      {"outer": outer, "axis": axis, "count": count, "inner_bytes": inner_bytes})


def upsample_nearest(x, y, fh: int, fw: int) -> None:
    """y (..., H*fh, W*fw) = x (..., H, W) with every pixel repeated fh x fw times; both contiguous float32."""
    h, wd = x.shape[-2:]
    planes = x.size // (h * wd) if h * wd else 0
    _call(_lib.mrt_upsample_nearest_f32, (_ptr(x), _ptr(y), planes, h, wd, fh, fw, threads()), x, y)


def copy_rows(src, y, offset: int, rows: int, cols: int, src_ld: int, dst_ld: int) -> None:
    """y.flat[offset + r * dst_ld + c] = src.flat[r * src_ld + c] for r < rows, c < cols; ``src`` and
    ``y`` C-contiguous float32 arrays (the copy stays inside them: the caller's check)."""
    _call(_lib.mrt_copy_rows_f32, (_ptr(src), src_ld, _ptr(y) + offset, dst_ld, rows, cols, threads()), src, y)




def binary(op: int, a, b, y) -> None:
    """y = a op b elementwise (``BINARY_OPS``), all float32, C-contiguous, of one shape (y may be a or b)."""
    _call(_lib.mrt_binary_f32, (op, _ptr(a), _ptr(b), _ptr(y), y.size, threads()), a, b, y)


def binary_rows(op: int, a, b, y, rows: int, length: int, bmod: int, reversed_: bool = False,
                columns: bool = False) -> None:
    """y (rows, length) = a op b with b broadcast: ``b[r % bmod]`` for row r, or with ``columns``
    ``b[i]`` for column i (b of ``length`` values); with ``reversed_`` b is the left operand (b op a).
    ``op`` from ``BINARY_OPS``; a, b, y float32 C-contiguous, a and y of rows * length values (y may be
    a, never b): checked here, the C loops index with these sizes."""
    if rows < 0 or length < 0 or a.size != rows * length or y.size != a.size:
        raise ValueError(f"minirt native binary: a of {a.size} and y of {y.size} values are not "
                         f"{rows} rows of {length}")
    if b.size != (length if columns else bmod) or (not columns and (bmod <= 0 or rows % bmod)):
        raise ValueError(f"minirt native binary: b of {b.size} values does not broadcast over {rows} rows "
                         f"of {length} (bmod {bmod}, columns {columns})")
    code = op | (_lib.MRT_BINARY_REVERSED if reversed_ else 0) | (_lib.MRT_BINARY_COLUMNS if columns else 0)
    _call(_lib.mrt_binary_rows_f32, (code, _ptr(a), _ptr(b), _ptr(y), rows, length, bmod if not columns else 1,
                                     threads()), a, b, y)


def activation(act: int, a0: float, a1: float, x, y) -> None:
    """y = act(x) with the fused epilogues' activation ``act`` (``ACTIVATION_CODES``) and its parameters;
    x, y float32, C-contiguous, of one size (y may be x, no other overlap)."""
    if y.size != x.size:
        raise ValueError(f"minirt native activation: x of {x.size} values, y of {y.size}")
    _call(_lib.mrt_activation_f32, (_epilogue(None, act, float(a0), float(a1)), _ptr(x), _ptr(y), x.size,
                                    threads()), x, y)


def plane_means(x, y) -> None:
    """y (P,) = the mean of each of the P planes of x (P, plane); float32, contiguous, plane > 0."""
    planes = y.size
    _call(_lib.mrt_plane_means_f32, (_ptr(x), _ptr(y), planes, x.size // planes if planes else 0, threads()), x, y)


def maxpool2d_s1(x, y, k, pb) -> None:
    """Max pooling, stride 1 and dilation 1, separable: x (N, C, H, W) -> y (N, C, OH, OW); top/left pads ``pb``."""
    maxpool2d_call(maxpool2d_prepare(x.shape, k, (1, 1), (1, 1), pb, y.shape[2:], separable=True), x, y)


_load()


# --------------------------------------------------------------------------- recurrent layers

_INT64_FLOATS_MAX = 2**62 // 4  # (bytes of a malloc'd scratch: far below what size_t holds)


def rnn_prepare(kind: str, seq: int, batch: int, input_size: int, hidden: int, dirs: int, reverse: bool,
                layout: int, w, r, bias=None, rbh=None, p=None, clip: float = 0.0, linear_before_reset: int = 0,
                input_forget: int = 0):
    """The ``mrt_rnn_shape`` of one LSTM / GRU layer (``kind`` "LSTM" or "GRU") for one input shape,
    made once, as (with W packed for the input projection, without, the ISA of that pack) for
    :func:`rnn_call`; it keeps the weights alive.  ``w`` (dirs, G*H, I), ``r`` (dirs, G*H, H), ``bias``
    (dirs, G*H: both biases folded; for a GRU with linear_before_reset the h gate's input bias only),
    ``rbh`` (dirs, H) that gate's recurrent bias, ``p`` the LSTM peepholes (dirs, 3*H): C-contiguous
    float32 arrays or None.  Every size the C code multiplies is checked here."""
    gates = 4 if kind == "LSTM" else 3
    sizes = {"seq": seq, "batch": batch, "input": input_size, "hidden": hidden}
    for name, v in sizes.items():
        if not 0 <= v <= _INT_MAX:
            raise OverflowError(f"minirt native {kind}: {name} {v} does not fit a C int")
    # the C code holds seq * batch (GEMM rows) and dirs * G * H (GEMM columns) in ints, and allocates
    # seq * batch * dirs * G * H + batch * (G + 3) * H floats of scratch
    if seq * batch > _INT_MAX or dirs * gates * hidden > _INT_MAX:
        raise OverflowError(f"minirt native {kind}: seq {seq} x batch {batch} or {dirs} x {gates} x hidden "
                            f"{hidden} do not fit a C int")
    if seq * batch * dirs * gates * hidden + batch * (gates + 3) * hidden > _INT64_FLOATS_MAX:
        raise OverflowError(f"minirt native {kind}: scratch for seq {seq}, batch {batch}, hidden {hidden} too large")
    fields = {
        "kind": _lib.MRT_RNN_LSTM if kind == "LSTM" else _lib.MRT_RNN_GRU, "seq": seq, "batch": batch,
        "input": input_size, "hidden": hidden, "dirs": dirs, "reverse": int(bool(reverse)), "layout": int(layout),
        "linear_before_reset": int(bool(linear_before_reset)), "input_forget": int(bool(input_forget)),
        "clip": float(clip), "w": _ptr(w), "r": _ptr(r), "bias": _opt(bias), "rbh": _opt(rbh), "p": _opt(p)}
    plain = _new("mrt_rnn_shape *", fields, w, r, bias, rbh, p)
    if input_size == 0 or seq * batch == 0:
        return plain, plain, isa
    # W (dirs * G * H, I) packed once as the input projection's B (transposed), cached while w lives;
    # for a batch of several rows, R too (each direction's (G * H, H), as the recurrent product's B)
    packed_isa, wpack = sgemm_pack_b(w, 1, input_size, input_size, dirs * gates * hidden, owner=w)
    rpack = (_rnn_pack_r(r, dirs, gates * hidden, hidden)
             if batch >= 2 and hidden and (kind == "LSTM" or linear_before_reset) else None)
    packed = _new("mrt_rnn_shape *", {**fields, "wpack": _ptr(wpack), "rpack": _opt(rpack)}, w, r, bias, rbh, p,
                  wpack, rpack)
    return packed, plain, packed_isa


def _rnn_pack_r(r, dirs: int, n: int, k: int):
    """The recurrent weights r (dirs, n, k) packed per direction as a transposed B (K = k, N = n), one
    after the other, for the ISA in use; cached while ``r`` lives."""

    def pack():
        each = int(_lib.mrt_sgemm_packed_b_floats(k, n))  # (a multiple of the panel width: aligned)
        out = _aligned_floats(dirs * each)
        for d in range(dirs):
            _lib.mrt_sgemm_pack_b_f32(_ptr(r[d]), k, 1, k, n, _ptr(out[d * each:(d + 1) * each]))
        return out

    return _cached_pack(r, ("rnn_r", dirs, n, k), pack)


def rnn_call(prep, x, lens, h0, c0, y, state) -> None:
    """Run a prepared LSTM / GRU (:func:`rnn_prepare`): ``x`` float32 and ``lens`` int32 (or None),
    ``h0`` / ``c0`` (or None) C-contiguous, into ``y`` and ``state`` (Y_h then, for an LSTM, Y_c)."""
    packed, plain, packed_isa = prep
    rc = _call(_lib.mrt_rnn_f32, (packed if packed_isa == isa else plain, _ptr(x), _ffi.NULL if lens is None else _ffi.from_buffer("int32_t[]", lens),
                                  _opt(h0), _opt(c0), _ptr(y), _ptr(state), threads()),
               x, lens, h0, c0, y, state)
    if rc == -1:
        raise no_scratch("minirt native LSTM / GRU")
    if rc != 0:
        raise ValueError(f"minirt native LSTM / GRU: bad sizes or sequence lengths (code {rc})")


# --------------------------------------------------------------------------- detection (nms_impl.h, roialign_impl.h)


def nms(boxes, scores, max_output: int, iou_threshold: float, score_threshold: float | None,
        center_point_box: int):
    """NonMaxSuppression's selected indices, (k, 3) int64 rows (batch, class, box): ``boxes`` (B, N, 4) and
    ``scores`` (B, K, N) C-contiguous float32 (shapes checked by the caller), ``max_output`` >= 0 per
    batch and class, ``iou_threshold`` in [0, 1], ``score_threshold`` None for none.  Not recordable: the
    result's size depends on the data."""
    import numpy as np

    b, k, n = scores.shape
    if n > 2**31 - 1:
        raise OverflowError(f"minirt native NonMaxSuppression: {n} boxes do not fit the kernel's int32 indices")
    capacity = b * k * min(max_output, n)
    selected = np.empty((capacity, 3), dtype=np.int64)  # (pages past the rows written are never touched)
    params = _ffi.new("mrt_nms_params *", {
        "batches": b, "classes": k, "boxes": n, "max_output": max_output, "iou_threshold": iou_threshold,
        "score_threshold": 0.0 if score_threshold is None else score_threshold,
        "has_score_threshold": int(score_threshold is not None), "center_point_box": center_point_box})
    rows = _call(_lib.mrt_nms_f32, (params, _ptr(boxes), _ptr(scores),
                                    _ffi.from_buffer("int64_t[]", selected), capacity))
    if rows == -1:
        raise no_scratch("minirt native NonMaxSuppression")
    if rows < 0:
        raise ValueError(f"minirt native NonMaxSuppression: bad parameters (code {rows}): batches {b}, classes {k}, "
                         f"boxes {n}, max_output {max_output}, iou_threshold {iou_threshold}, "
                         f"center_point_box {center_point_box}")
    return selected[:rows].copy() if rows < capacity // 2 else selected[:rows]


_ROI_FIELDS = ("n", "c", "h", "w", "oh", "ow", "sampling_ratio", "mode", "half_pixel", "spatial_scale")


def roi_align(x, rois, batch_indices, y, mode: str, sampling_ratio: int, spatial_scale: float,
              half_pixel: bool) -> None:
    """RoiAlign into ``y`` (R, C, OH, OW): ``x`` (N, C, H, W) and ``rois`` (R, 4) C-contiguous float32,
    ``batch_indices`` (R,) int64 in [0, N) (checked by the caller; the kernel refuses others too)."""
    n, c, h, w = x.shape
    nrois, _, oh, ow = y.shape
    for name, v in (("N", n), ("C", c), ("H", h), ("W", w), ("output_height", oh), ("output_width", ow),
                    ("sampling_ratio", sampling_ratio)):
        if abs(v) > _INT_MAX:
            raise OverflowError(f"minirt native RoiAlign: {name} {v} does not fit a C int")
    key = ("roi", n, c, h, w, oh, ow, int(sampling_ratio), _lib.MRT_ROI_MAX if mode == "max" else _lib.MRT_ROI_AVG,
           int(bool(half_pixel)), float(spatial_scale))
    shape = _shared.get(key) or _share(key, "mrt_roi_align_shape *", dict(zip(_ROI_FIELDS, key[1:])))
    rc = _call(_lib.mrt_roi_align_f32, (shape, _ptr(x), _ptr(rois), _ffi.from_buffer("int64_t[]", batch_indices),
                                        nrois, _ptr(y), threads()))
    if rc == -1:
        raise no_scratch("minirt native RoiAlign")
    if rc == -3:
        raise ValueError("RoiAlign: a RoI needs more than 65536 samples per bin along an axis "
                         "(sampling_ratio 0 and a RoI far larger than its output bins)")
    if rc != 0:
        raise ValueError(f"minirt native RoiAlign: bad sizes or batch index (code {rc}) for X {x.shape}, "
                         f"rois {rois.shape}")


# --------------------------------------------------------------------------- tree ensembles (trees_impl.h)


def tree_ensemble(nodes, roots, values, has, n_trees: int, n_leaves: int, n_targets: int, max_feature: int,
                  node_double: bool, acc_double: bool, mode: int, aggregate: int):
    """The ``mrt_tree_ensemble`` of a layout's native arrays (built and checked by
    minirt/kernels/trees.py, _native_layout: every node index, root and leaf row in range), keeping them
    alive: ``nodes`` (n_nodes + 1 packed nodes, the last the pad leaf), ``roots`` int32 padded to a
    multiple of MRT_TREE_GROUP, ``values`` / ``has`` the dense leaf table (n_leaves, n_targets) in the
    accumulation type / uint8 (or bool)."""
    n_nodes = len(nodes) - 1
    if not 0 <= n_nodes < _INT_MAX or len(roots) % int(_lib.MRT_TREE_GROUP) or len(roots) < n_trees:
        raise ValueError(f"minirt native trees: {n_nodes} nodes, {len(roots)} roots for {n_trees} trees")
    return _new("mrt_tree_ensemble *", {
        "nodes": _ffi.from_buffer(nodes), "roots": _ffi.from_buffer("int32_t[]", roots),
        "values": _ffi.from_buffer(values), "has": _ffi.from_buffer("uint8_t[]", has),
        "n_nodes": n_nodes, "n_trees": n_trees, "n_leaves": n_leaves, "n_targets": n_targets,
        "max_feature": max_feature, "node_double": int(node_double), "acc_double": int(acc_double),
        "mode": mode, "aggregate": aggregate, "inline_leaves": int(n_targets == 1)}, nodes, roots, values, has)


def tree_group() -> int:
    """The number of trees one sample walks at once (roots are padded to a multiple of it)."""
    return int(_lib.MRT_TREE_GROUP)


def tree_votes(ens, x, scores, has) -> None:
    """Run :func:`tree_ensemble` ``ens`` on ``x`` (N, F) C-contiguous (double when the ensemble's nodes are,
    else float32) into ``scores`` (N, K) (the accumulation type) and ``has`` (N, K) bool, both C-contiguous.
    Recordable (with :func:`tree_finish`, a tree op is two native calls)."""
    n, f = x.shape
    rc = _call(_lib.mrt_tree_votes, (ens, _ffi.from_buffer(x), n, f, _ffi.from_buffer(scores),
                                     _ffi.from_buffer("uint8_t[]", has), threads()), x, scores, has)
    if rc != 0:
        raise ValueError(f"minirt native trees: bad parameters (code {rc}) for X {x.shape}")


def tree_outputs(k: int, acc_double: bool, base, labels):
    """The ``mrt_tree_outputs`` of a tree op's finishing step (:func:`tree_finish`), keeping its arrays alive:
    ``base`` float64 (C-contiguous) or None, ``labels`` int64 of k class labels (a classifier) or None."""
    return _new("mrt_tree_outputs *", {
        "k": k, "acc_double": int(acc_double), "n_base": 0 if base is None else len(base),
        "base": _ffi.NULL if base is None else _ffi.from_buffer("double[]", base),
        "labels": _ffi.NULL if labels is None else _ffi.from_buffer("int64_t[]", labels)}, base, labels)


def tree_finish(p, scores, has, label, out) -> None:
    """The outputs of a tree op from :func:`tree_votes`' ``scores`` / ``has`` (updated in place) into ``out``
    (n, k) float32 and, for a classifier, ``label`` (n,) int64 (kernels.h, mrt_tree_finish); recordable."""
    n = scores.shape[0]
    rc = _call(_lib.mrt_tree_finish, (p, _ffi.from_buffer(scores), _ffi.from_buffer("uint8_t[]", has),
                                      _ffi.NULL if label is None else _ffi.from_buffer("int64_t[]", label),
                                      _ptr(out), n, threads()), scores, has, scores, has, label, out)
    if rc != 0:
        raise ValueError(f"minirt native trees: bad outputs (code {rc}) for scores {scores.shape}")


# --------------------------------------------------------------------------- 4-bit block-quantized products

def qnbits_weights(b, scales, zs, bias, N: int, K: int, block_size: int):
    """The ``mrt_qnbits_weights`` of a MatMulNBits node (4 bits, block_size a power of two >= 32), keeping
    its arrays alive: ``b`` uint8 and ``scales`` float32 packed by groups of 16 columns (kernels.h;
    minirt/kernels/decoder.py, _pack_nibbles), ``zs`` float32 in the scales' layout (scale * zero point)
    or None for the zero point 8 (no zero points), ``bias`` float32 (N) or None.  Sizes checked here: the C side trusts them."""
    kb = -(-K // block_size)
    groups = -(-N // 16)
    if block_size < 32 or block_size & (block_size - 1) or b.nbytes != groups * kb * block_size // 32 * 256 \
            or scales.size != groups * kb * 16 or (zs is not None and zs.size != groups * kb * 16) or (bias is not None and bias.size != N):
        raise ValueError(f"minirt native qnbits: weights {b.shape} / scales {scales.shape} / zs {zs.shape} do not "
                         f"fit N={N}, K={K}, block_size={block_size}")
    return _new("mrt_qnbits_weights *", {
        "N": N, "K": K, "block_size": block_size, "b": _ffi.from_buffer("uint8_t[]", b),
        "scales": _ptr(scales), "zs": _opt(zs), "bias": _opt(bias)}, b, scales, zs, bias)


def qnbits_workspace_bytes(M: int, K: int, block_size: int) -> int:
    """The bytes of scratch :func:`qnbits_matmul` needs for M rows."""
    return int(_lib.mrt_qnbits_workspace(M, K, block_size))


def qnbits_matmul(w, a, y, workspace=None) -> None:
    """y (M, N) = a (M, K) . W^T (+ bias) for the :func:`qnbits_weights` ``w`` at accuracy_level 4 (a
    quantized to int8 per block inside); a, y float32 C-contiguous; ``workspace`` a uint8 array of
    :func:`qnbits_workspace_bytes` bytes, or None (allocated inside).  Recordable without a workspace (a
    decode step replayed as a program, D123)."""
    if workspace is None:
        rc = _call(_lib.mrt_qnbits_matmul, (w, _ptr(a), a.shape[0], _ptr(y), _ffi.NULL, threads()), a, y)
    else:  # (scratch outside the recorded buffers: not replayed)
        rc = _call(_lib.mrt_qnbits_matmul, (w, _ptr(a), a.shape[0], _ptr(y),
                                            _ffi.from_buffer("uint8_t[]", workspace), threads()))
    if rc == -1:
        raise no_scratch("minirt native qnbits")
    if rc != 0:
        raise ValueError(f"minirt native qnbits: bad parameters (code {rc}) for A {a.shape}")


# --------------------------------------------------------------------------- attention over a KV cache

def gqa_step(raw, heads: int, kv_heads: int, head_size: int, positions, cos, sin, interleaved: bool, k_cache,
             v_cache, pasts, totals, out, scale: float, softcap: float, local_window: int) -> None:
    """A GroupQueryAttention step (kernels.h, mrt_gqa_attention_f32).  ``raw``: ((array, offset) of q, of k,
    of v), each array float32 [B, S, row] C-contiguous with the heads' values at ``offset`` in a row
    (packed QKV: one array, three offsets); k / v may be (None, 0) when the caches already hold every
    position.  ``positions`` int64 [B, S] and ``cos`` / ``sin`` float32 [max_position, rotary_dim / 2] or
    all None (no rotary).  The new keys / values go into k_cache / v_cache float32 [B, KVH, T, D] at
    rows pasts[b] + s; out float32 [B, S, heads * head_size].  Sizes checked here and in C.  Not recordable."""
    (q, q_off), (k, k_off), (v, v_off) = raw
    B, S = q.shape[0], q.shape[1]
    arrays = [a for a in (q, k, v, k_cache, v_cache, out, cos, sin) if a is not None]
    if any(a.dtype.char != "f" or not a.flags.c_contiguous for a in arrays) or (k is None) != (v is None) \
            or k_cache.shape != v_cache.shape or k_cache.shape[:2] != (B, kv_heads) or k_cache.shape[3] != head_size \
            or out.size != B * S * heads * head_size or q_off + heads * head_size > q.shape[2] \
            or (k is not None and (k_off + kv_heads * head_size > k.shape[2] or v_off + kv_heads * head_size > v.shape[2]
                                   or k.shape[:2] != (B, S) or v.shape[:2] != (B, S) or k.shape[2] != v.shape[2])):
        raise ValueError(f"minirt native attention: q {q.shape}, caches {k_cache.shape} / {v_cache.shape}, out "
                         f"{out.shape} do not fit")
    rot = cos is not None
    for a, n in ((positions, B * S), (pasts, B), (totals, B)):
        if a is not None and (a.dtype.char not in "lq" or a.itemsize != 8 or not a.flags.c_contiguous or a.size != n):
            raise ValueError("minirt native attention: positions / pasts / totals must be C-contiguous int64 "
                             f"of {B} x {S} / {B} / {B} values")
    pos = positions
    shape = _ffi.new("mrt_attention_shape *", {
        "batch": B, "seq": S, "heads": heads, "kv_heads": kv_heads, "head_size": head_size,
        "capacity": k_cache.shape[2], "scale": scale, "softcap": softcap, "local_window": local_window,
        "rotary_half": cos.shape[1] if rot else 0, "rotary_interleaved": int(interleaved),
        "max_position": cos.shape[0] if rot else 0})
    step = _ffi.new("mrt_attention_step *", {
        "q": _ptr(q) + q_off, "k": _ptr(k) + k_off if k is not None else _ffi.NULL,
        "v": _ptr(v) + v_off if v is not None else _ffi.NULL, "q_row": q.shape[2],
        "kv_row": k.shape[2] if k is not None else 0,
        "positions": _ffi.from_buffer("int64_t[]", pos) if rot else _ffi.NULL})
    cache = _ffi.new("mrt_kv_cache *", {"k": _ptr(k_cache), "v": _ptr(v_cache),
                                        "pasts": _ffi.from_buffer("int64_t[]", pasts),
                                        "totals": _ffi.from_buffer("int64_t[]", totals)})
    _gqa_call(shape, step, cos, sin, cache, out,
              lambda: f"pasts {pasts.tolist()}, totals {totals.tolist()} for {S} new positions in a cache of "
                      f"{k_cache.shape[2]}")


def _gqa_call(shape, step, cos, sin, cache, out, what) -> None:
    """mrt_gqa_attention_f32 on prepared structs; ``what()`` describes the positions for an error."""
    rc = _call(_lib.mrt_gqa_attention_f32, (shape, step, _opt(cos), _opt(sin), cache, _ptr(out), threads()))
    if rc == -1:
        raise no_scratch("minirt native attention")
    if rc != 0:
        raise ValueError(f"minirt native attention: bad parameters (code {rc}): {what()}")


def gqa_decode_prepare(heads: int, kv_heads: int, head_size: int, capacity: int, scale: float, softcap: float,
                       local_window: int, interleaved: bool, cos, sin, ring: bool = False):
    """The ``mrt_gqa_decode`` of a one-token, one-sequence GroupQueryAttention step (:func:`gqa_decode`), made
    once per node and cache size, keeping the rotary caches ``cos`` / ``sin`` (float32 C-contiguous
    [max_position, rotary_dim / 2], or both None: no rotary) alive.  ``ring``: the caches are a ring of the
    local window (sliding_window_cache; local_window must then be 0: the capacity is the window)."""
    rot = cos is not None
    if rot and (cos.dtype.char != "f" or sin.dtype.char != "f" or not cos.flags.c_contiguous
                or not sin.flags.c_contiguous or cos.ndim != 2 or sin.shape != cos.shape
                or 2 * cos.shape[1] > head_size):
        raise ValueError(f"minirt native attention: cos {cos.shape} / sin {sin.shape} caches do not fit heads of "
                         f"{head_size}")
    return _new("mrt_gqa_decode *", {
        "shape": {"batch": 1, "seq": 1, "heads": heads, "kv_heads": kv_heads, "head_size": head_size,
                  "capacity": capacity, "scale": scale, "softcap": softcap, "local_window": local_window,
                  "rotary_half": cos.shape[1] if rot else 0, "rotary_interleaved": int(interleaved),
                  "max_position": cos.shape[0] if rot else 0},
        "cos": _opt(cos), "sin": _opt(sin), "ring": int(ring)}, cos, sin)


def gqa_decode(prepared, qkv, seqlens_k, k_cache, v_cache, out) -> None:
    """The decode step of :func:`gqa_step` for one sequence and one token with packed QKV (mrt_gqa_decode_f32)
    of a :func:`gqa_decode_prepare` call: ``qkv`` float32 C-contiguous (1, 1, (H + 2 KVH) D), the new
    position read from ``seqlens_k`` (int32, one value; checked in C against the caches), rotary at that
    position when prepared with it.  Recordable: the position is read when the call runs (D123)."""
    rc = _call(_lib.mrt_gqa_decode_f32, (prepared, _ptr(qkv), _ffi.from_buffer("int32_t[]", seqlens_k),
                                         _ptr(k_cache), _ptr(v_cache), _ptr(out), threads()),
               qkv, seqlens_k, k_cache, v_cache, k_cache, v_cache, out)
    if rc == -1:
        raise no_scratch("minirt native attention")
    if rc != 0:
        raise ValueError(f"minirt native attention: bad parameters (code {rc}): position {int(seqlens_k[0])} "
                         f"in a cache of {prepared.shape.capacity}")

