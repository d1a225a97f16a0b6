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
               ``"dotprod"``, ``"neon"`` (aarch64) or ``"baseline"`` (override with
               ``MINIRT_NATIVE_ISA=baseline``, or :func:`select_isa`).
``qgemm_isa``  The int8 GEMM microkernel in use: ``"vnni"``, ``"dotprod"`` or ``"portable"``.

The wrappers below take numpy arrays that the caller has already validated
(dtype float32, C-contiguous, shapes consistent): they are the thin layer
between the kernels in ``minirt/kernels`` and the C functions, not a public
API.  Threads come from :func:`threads` (set per session by ``Session``).
"""
from __future__ import annotations

import os
import threading

available = False
reason = ""
features: dict = {}
isa = "none"
qgemm_isa = "none"

(ACT_NONE, ACT_RELU, ACT_CLIP, ACT_LEAKY, ACT_SIGMOID, ACT_SILU, ACT_HARDSIGMOID, ACT_HARDSWISH, ACT_GELU,
 ACT_GELU_TANH) = range(10)

_ffi = _lib = None
_ABI_VERSION = 8


def _truthy(value: str | None) -> bool:
    return bool(value) and value.strip().lower() not in ("0", "false", "no", "off", "")


def _load() -> None:
    global available, reason, features, isa, _ffi, _lib
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
    if lib.mrt_abi_version() != _ABI_VERSION:
        reason = f"extension ABI {lib.mrt_abi_version()} != expected {_ABI_VERSION} (stale build; reinstall minirt)"
        return
    bits = lib.mrt_cpu_features()
    features = {
        name: bool(bits & getattr(lib, "MRT_FEAT_" + name.upper()))
        for name in ("avx2", "fma", "avx512f", "avx512vnni", "neon", "asimddp")
    }
    _ffi, _lib = ffi, lib
    available = True
    wanted = (os.environ.get("MINIRT_NATIVE_ISA") or "best").strip().lower()
    select_isa(wanted)


def select_isa(name: str = "best") -> str:
    """Choose the implementation: "best" (default), "avx512", "avx2" (x86-64), "dotprod",
    "neon" (aarch64) or "baseline".

    An ISA the CPU lacks falls back to the baseline ("dotprod" without the dot
    product falls back to "neon"); returns what is in use.
    """
    global isa, qgemm_isa
    if _lib is None:
        return isa
    codes = {"best": _lib.MRT_ISA_BEST, "avx512": _lib.MRT_ISA_AVX512, "avx2": _lib.MRT_ISA_AVX2,
             "neon": getattr(_lib, "MRT_ISA_NEON", 3), "dotprod": getattr(_lib, "MRT_ISA_DOTPROD", 4),
             "baseline": _lib.MRT_ISA_BASELINE}
    code = codes.get(name)
    if code is None:
        raise ValueError(f"unknown ISA {name!r}; expected one of {', '.join(codes)}")
    chosen = _lib.mrt_select_isa(code)
    isa = {_lib.MRT_ISA_AVX512: "avx512", _lib.MRT_ISA_AVX2: "avx2", codes["neon"]: "neon",
           codes["dotprod"]: "dotprod"}.get(chosen, "baseline")
    qgemm_isa = {1: "vnni", 2: "dotprod"}.get(_lib.mrt_qgemm_isa(), "portable")
    _qpacked.clear()  # the packed weight format may depend on the ISA
    return isa


def describe() -> str:
    """One line for ``minirt info`` / ``minirt bench``."""
    if not available:
        return f"not active ({reason}); using numpy kernels"
    feats = ", ".join(k for k, v in features.items() if v) or "none"
    return f"active, {isa} kernels, int8 GEMM {qgemm_isa} (CPU features: {feats})"


# --------------------------------------------------------------------------- threads

_DEFAULT_THREADS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
_tls = threading.local()


def set_threads(n: int | None) -> None:
    """Threads for native kernels called from this Python thread (None: all CPUs)."""
    _tls.n = _DEFAULT_THREADS if n is None else int(n)


def threads() -> int:
    return getattr(_tls, "n", _DEFAULT_THREADS)


# --------------------------------------------------------------------------- recording (native programs)


class _Recording(threading.local):
    """This thread's recording of a native program (see ``minirt/native/program.py``).

    ``calls``: while a session records, the list the prepared calls below append each native call
    they make to (None otherwise: the only cost outside a recording is that one test per call).
    ``final``: the array the running node's kernel declared its complete result (:func:`final`);
    ``constant``: the one it declared a constant (:func:`constant_result`)."""

    calls = None
    final = None
    constant = None


_recording = _Recording()


def _record(entry, args, reads, writes) -> None:
    """Keep the call ``entry(*args)`` that just ran, for the program being recorded.

    ``reads`` / ``writes``: ``(argument index, array or None)`` of the data the call read and wrote
    (inputs, residuals, results); every other argument is a constant of a prepared call (geometry,
    weights, scales), kept alive by ``args`` itself (cffi pointers hold their arrays)."""
    _recording.calls.append((entry.__name__, args, reads, writes))


def final(y):
    """Declare ``y`` the complete result of the running node and return it.

    A kernel calls this only where its result is exactly what the native calls recorded since the
    node began wrote, and it returns ``y`` untouched: no numpy work before or after those calls
    (a program replays the calls alone).  Outside a recording it only returns ``y``."""
    if _recording.calls is not None:
        _recording.final = y
    return y


def constant_result(y):
    """Declare ``y`` the running node's result and a constant, and return it: the same read-only array
    on every run (a weight materialized once), which a program needs no call to make and reads as it
    reads the model's constants.  Outside a recording it only returns ``y``."""
    if _recording.calls is not None:
        _recording.constant = y
    return y


# --------------------------------------------------------------------------- kernels


def _ptr(a):
    # from_buffer is the cheapest way to hand a numpy buffer to C (no copy;
    # read-only buffers such as memory-mapped weights are accepted).
    return _ffi.from_buffer("float[]", a)


def dwconv2d(x, w, bias, y, k, s, d, pb, act=0, a0=0.0, a1=0.0, residual=None) -> None:
    """y (N, C, OH, OW) = act(depthwise conv(x, w) + bias[c] + residual); residual has y's shape."""
    dwconv2d_call(dwconv2d_prepare(x.shape, w, bias, k, s, d, pb, y.shape[2:], act, a0, a1), x, y, residual)


def dwconv2d_prepare(x_shape, w, bias, k, s, d, pb, out, act=0, a0=0.0, a1=0.0) -> tuple:
    """The constant arguments of :func:`dwconv2d_call` for one layer and input shape: the cffi
    pointers to ``w`` / ``bias`` (float32, contiguous) made once; the tuple keeps them alive."""
    n, c, h, wd = x_shape
    return ((w, bias), (_ptr(w), _ffi.NULL if bias is None else _ptr(bias)),
            (n, c, h, wd, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0], out[1], act, a0, a1))


def dwconv2d_call(prep, x, y, residual=None) -> None:
    """Run a prepared depthwise conv (:func:`dwconv2d`) of ``x`` into ``y``."""
    _, weights, geometry = prep
    args = (_ptr(x), *weights, _ffi.NULL if residual is None else _ptr(residual), _ptr(y), *geometry, threads())
    _lib.mrt_dwconv2d_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_dwconv2d_f32, args, ((0, x), (3, residual)), ((4, y),))


def maxpool2d(x, y, k, s, d, pb) -> None:
    maxpool2d_call(maxpool2d_prepare(x.shape, k, s, d, pb, y.shape[2:]), x, y)


def maxpool2d_prepare(x_shape, k, s, d, pb, out, separable=False) -> tuple:
    """The constant arguments of :func:`maxpool2d_call` for one input shape.  ``separable``: the
    stride-1, dilation-1 kernel (:func:`maxpool2d_s1`; ``s`` and ``d`` are then ignored)."""
    n, c, h, wd = x_shape
    if separable:
        return True, (n * c, h, wd, k[0], k[1], pb[0], pb[1], out[0], out[1])
    return False, (n * c, h, wd, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0], out[1])


def maxpool2d_call(prep, x, y) -> None:
    """Max pooling of ``x`` into ``y`` (float32, contiguous) with a prepared geometry."""
    separable, geometry = prep
    entry = _lib.mrt_maxpool2d_s1_f32 if separable else _lib.mrt_maxpool2d_f32
    args = (_ptr(x), _ptr(y), *geometry, threads())
    if entry(*args):  # (only the separable kernel returns a code: non-zero without scratch memory)
        raise MemoryError("minirt native MaxPool: could not allocate scratch memory")
    if _recording.calls is not None:
        _record(entry, args, ((0, x),), ((1, y),))


def avgpool2d(x, y, k, s, d, pb, count_box, scale) -> None:
    n, c, h, wd = x.shape
    oh, ow = y.shape[2:]
    (h0, h1), (w0, w1) = count_box
    _lib.mrt_avgpool2d_f32(_ptr(x), _ptr(y), n * c, h, wd, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], oh, ow,
                           h0, h1, w0, w1, scale, threads())


def bias_act(y, bias, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """In place: y (N, C, ...) = act(y + bias[c] + residual)."""
    n, c = y.shape[:2]
    plane = y.size // (n * c) if n * c else 0
    _lib.mrt_bias_act_f32(
        _ptr(y), _ffi.NULL if bias is None else _ptr(bias), _ffi.NULL if residual is None else _ptr(residual), n, c,
        plane, act, a0, a1, threads(),
    )


def im2col(x, cols, k, s, d, pb, out) -> None:
    """One image: x (C, H, W) -> cols (C*KH*KW, OH*OW)."""
    c, h, wd = x.shape
    _lib.mrt_im2col_f32(_ptr(x), _ptr(cols), c, h, wd, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0],
                        out[1], threads())


def has_conv2d() -> bool:
    """True when the loaded module has the whole-batch float conv (not in modules built before it)."""
    return _lib is not None and hasattr(_lib, "mrt_conv2d_f32")


def conv2d(x, w, group, k, s, d, pb, out, y, bias=None, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """y = act(conv(x, w) + bias + residual) for the whole batch in one call (float32, NCHW, contiguous)."""
    conv2d_call(conv2d_prepare(x.shape, w, group, k, s, d, pb, out, bias, act, a0, a1), x, y, residual)


def conv2d_prepare(x_shape, w, group, k, s, d, pb, out, bias=None, act=0, a0=0.0, a1=0.0) -> tuple:
    """The constant arguments of :func:`conv2d_call` for one layer and input shape: the cffi
    pointers to ``w`` / ``bias`` (float32, contiguous) made once; the tuple keeps them alive.

    Layers where the channel-vector kernel pays (small outputs, deep sums; ``mrt_conv2d_uses_packed_w``)
    also get ``w`` packed for it, once per weight array and geometry (cached while ``w`` lives), in
    the layout of the ISA in use (see :func:`conv2d_call`).
    """
    n, c, h, wd = x_shape
    bias_ptr = _ffi.NULL if bias is None else _ptr(bias)
    if not hasattr(_lib, "mrt_conv2d_packed_f32"):  # a module built before the packed entry point
        return ((w, bias), _lib.mrt_conv2d_f32,
                (n, c, h, wd, _ptr(w), w.shape[0], group, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0],
                 out[1], bias_ptr),
                (act, a0, a1), None)
    packed = _cached_pack(w, ("conv_f32", c, group, tuple(k), tuple(s), tuple(out)),
                          lambda: _conv_pack_w(w, c, group, k, s, out))
    return ((w, bias, packed), _lib.mrt_conv2d_packed_f32,
            (n, c, h, wd, _ptr(w), _ffi.NULL if packed is None else _ptr(packed), w.shape[0], group, k[0], k[1], s[0],
             s[1], d[0], d[1], pb[0], pb[1], out[0], out[1], bias_ptr),
            (act, a0, a1), None if packed is None else isa)


def conv2d_call(prep, x, y, residual=None) -> None:
    """Run a prepared convolution (:func:`conv2d`) of ``x`` into ``y``.  Weights packed under another
    ISA than the one in use (``select_isa`` since) are not passed: their layout depends on it."""
    _, entry, head, epilogue, packed_isa = prep
    if packed_isa is not None and packed_isa != isa:
        head = head[:5] + (_ffi.NULL,) + head[6:]
    args = (_ptr(x), *head, _ffi.NULL if residual is None else _ptr(residual), _ptr(y), *epilogue, threads())
    if entry(*args) != 0:
        raise MemoryError("minirt native conv2d: could not allocate scratch memory")
    if _recording.calls is not None:
        j = 1 + len(head)  # (x, *head, residual, y, ...)
        _record(entry, args, ((0, x), (j, residual)), ((j + 1, y),))


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
    _lib.mrt_sgemm_f32(
        m, n, k, _ptr(a), a.strides[0] // it, _ptr(b), b.strides[0] // it, _ptr(c), c.strides[0] // it,
        _ffi.NULL if bias is None else _ptr(bias), bias_mode,
        _ffi.NULL if residual is None else _ptr(residual), 0 if residual is None else residual.strides[0] // it,
        act, a0, a1, threads(),
    )


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
    args = (m, n, k, _ptr(a), k, _ptr(packed[1]), _ptr(c), n, _ffi.NULL if bias is None else _ptr(bias), 2, _ffi.NULL,
            0, act, a0, a1, threads())
    _lib.mrt_sgemm_pb_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_sgemm_pb_f32, args, ((3, a),), ((6, c),))


def sgemv(a, m: int, n: int, k: int, b, ldb: int, transb: int, c, bias=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) = act(a (M, K) @ B + bias[n]) for a few rows, B read in place (not packed): ``b`` K x N with
    rows of ``ldb`` floats, or with ``transb`` stored N x K; threads split the columns.  ``a`` and ``c``
    C-contiguous float32."""
    _lib.mrt_sgemv_f32(m, n, k, _ptr(a), k, _ptr(b), ldb, int(transb), _ptr(c), n,
                       _ffi.NULL if bias is None else _ptr(bias), act, a0, a1, threads())


def has_sgemv() -> bool:
    """True when the loaded module has the matrix-vector product (not in older modules)."""
    return _lib is not None and hasattr(_lib, "mrt_sgemv_f32")


def has_sgemm_pb() -> bool:
    """True when the loaded module has the packed-B product (not in older modules)."""
    return hasattr(_lib, "mrt_sgemm_pb_f32")


def sgemm_batch(batch, m, n, k, a, lda, sa, b, ldb, sb, transb, c, ldc, sc, bias=None, residual=None, ldr=0, sr=0,
                act=0, a0=0.0, a1=0.0) -> None:
    """``batch`` GEMMs ``c_i (M, N) = act(a_i @ b_i + bias[n] + residual_i)`` (bias per column).

    ``a``, ``b``, ``c``, ``residual``: float32 arrays whose first element is that
    of matrix 0; leading dimensions and batch strides are in elements (batch
    stride 0 broadcasts).  ``transb``: ``b`` is stored (N, K), row stride ``ldb``.
    """
    args = (batch, m, n, k, _ptr(a), lda, sa, _ptr(b), ldb, sb, int(transb), _ptr(c), ldc, sc,
            _ffi.NULL if bias is None else _ptr(bias), 2, _ffi.NULL if residual is None else _ptr(residual), ldr, sr,
            act, a0, a1, threads())
    _lib.mrt_sgemm_batch_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_sgemm_batch_f32, args, ((4, a), (7, b), (16, residual)), ((11, c),))


def _conv_pack_w(w, c, group, k, s, out):
    """``w`` packed for the channel-vector conv kernel, or None when that does not pay for this layer."""
    m = w.shape[0]
    if not _lib.mrt_conv2d_uses_packed_w(c, m, group, k[0], k[1], s[0], s[1], out[0], out[1]):
        return None
    return conv_pack_w(w, group)


def conv_pack_w(w, group):
    """The (m, c/group, kh, kw) float32 weights ``w`` packed for ``mrt_conv2d_packed_f32`` (current ISA)."""
    import numpy as np

    m, kdepth = w.shape[0], w[0].size
    packed = _aligned_floats(int(_lib.mrt_conv2d_packed_w_floats(m, group, kdepth)))
    _lib.mrt_conv2d_pack_w(_ptr(w), m, group, kdepth, _ptr(packed))
    return packed


def _aligned_floats(count: int):
    """An uninitialised float32 array of ``count`` elements starting on a 64-byte boundary (packed panels)."""
    import numpy as np

    raw = np.empty(count + 16, dtype=np.float32)
    off = (-raw.ctypes.data) % 64 // 4
    return raw[off:off + count]


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
    weight are one panel); 0 without native kernels (or switched off) or with a module predating
    packed weights."""
    if not available or _lib is None or not hasattr(_lib, "mrt_conv2d_packed_f32") or not hasattr(_lib, "mrt_sgemm_packed_b_floats"):
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
    _lib.mrt_qgemm_pack_w(_ffi.from_buffer("int8_t[]", wc), m, k, _ffi.from_buffer("char[]", packed))
    return packed


def qgemm(packed_w, m, k, x, x_zero, scale, c, bias=None, residual=None, act=0, a0=0.0, a1=0.0) -> None:
    """c (M, N) float32 = act(scale[m] * (W @ (x - x_zero)) + bias[m] + residual), exact int32 products.

    ``packed_w`` from :func:`qpack` of the (M, K) int8 weights; ``x`` (K, N)
    uint8 with unit stride along its last axis; ``scale`` (M,) float32 (x_scale
    * w_scale[m]); ``bias`` (M,) or None; ``residual`` like ``c`` or None.
    """
    n = x.shape[1]
    _lib.mrt_qgemm_u8s8_f32(
        m, n, k, _ffi.from_buffer("char[]", packed_w), _ffi.from_buffer("uint8_t[]", x), x.strides[0], int(x_zero),
        _ptr(scale), _ffi.NULL if bias is None else _ptr(bias), _ptr(c), c.strides[0] // 4,
        _ffi.NULL if residual is None else _ptr(residual), 0 if residual is None else residual.strides[0] // 4,
        act, a0, a1, threads(),
    )


def qconv2d(x, x_scale: float, x_zero: int, packed_w, m, group, k, s, d, pb, y, scale, bias=None, residual=None,
            act=0, a0=0.0, a1=0.0) -> None:
    """A whole int8 convolution: y (N, M, OH, OW) float32 from x (N, C, H, W) float32 (contiguous).

    ``packed_w`` from :func:`qpack` of the (M, C/group*KH*KW) int8 weights; x is
    quantized with (x_scale, x_zero) (uint8) inside; ``scale`` (M,) = x_scale *
    w_scale[m]; ``bias`` (M,) or None; ``residual`` like ``y`` or None.
    """
    n, c, h, wd = x.shape
    oh, ow = y.shape[2:]
    rc = _lib.mrt_qconv2d_f32(
        _ptr(x), n, c, h, wd, x_scale, int(x_zero), _ffi.from_buffer("char[]", packed_w), m, group, k[0], k[1], s[0],
        s[1], d[0], d[1], pb[0], pb[1], oh, ow, _ptr(scale), _ffi.NULL if bias is None else _ptr(bias),
        _ffi.NULL if residual is None else _ptr(residual), _ptr(y), act, a0, a1, threads(),
    )
    if rc != 0:
        raise MemoryError("minirt native qconv2d: could not allocate its scratch buffer")


def qconv2d_prepare(x_shape, packed_w, m, group, k, s, d, pb, out, scale, bias, act=0, a0=0.0, a1=0.0):
    """The constant arguments of :func:`qconv2d_call` for one layer and input shape (cffi
    pointers made once; the tuple keeps the arrays they point into alive)."""
    n, c, h, wd = x_shape
    keep = (packed_w, scale, bias)
    return (keep, n, c, h, wd, _ffi.from_buffer("char[]", packed_w), m, group, k[0], k[1], s[0], s[1], d[0], d[1],
            pb[0], pb[1], out[0], out[1], _ptr(scale), _ffi.NULL if bias is None else _ptr(bias), act, a0, a1)


def qconv2d_call(prep, x, x_scale: float, x_zero: int, y, residual=None, scale=None, y_q=None,
                 post=(1.0, 0.0)) -> None:
    """Run a prepared int8 convolution (see :func:`qconv2d`); ``scale`` overrides the prepared
    per-row scales (dynamic quantization).  ``x`` may be uint8 (already quantized with
    ``x_zero``); ``post = (a, b)``: the result is ``a * act(...) + b``; with
    ``y_q = (y_scale, y_zero)`` (a float and an int, or float32 and int32 arrays of one value per
    output channel) ``y`` is uint8: the float result requantized."""
    (_, n, c, h, wd, pw, m, group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ps, pbias, act, a0, a1) = prep
    # the common float -> float call (fewer arguments to convert)
    # (``scale`` given: dynamic quantization, derived from this x: recorded as data the call reads)
    if y_q is None and x.itemsize == 4 and post == (1.0, 0.0):
        args = (_ptr(x), n, c, h, wd, x_scale, x_zero, pw, m, group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
                ps if scale is None else _ptr(scale), pbias, _ffi.NULL if residual is None else _ptr(residual),
                _ptr(y), act, a0, a1, threads())
        if _lib.mrt_qconv2d_f32(*args) != 0:
            raise MemoryError("minirt native qconv2d: could not allocate its scratch buffer")
        if _recording.calls is not None:
            _record(_lib.mrt_qconv2d_f32, args, ((0, x), (20, scale), (22, residual)), ((23, y),))
        return
    x_u8 = x.itemsize == 1
    if y_q and not hasattr(y_q[0], "__len__"):  # one scale and zero point for every channel
        import numpy as np

        y_q = (np.full(m, y_q[0], np.float32), np.full(m, y_q[1], np.int32))
    args = (_ffi.from_buffer("char[]", x) if x_u8 else _ptr(x), int(x_u8), n, c, h, wd, x_scale, x_zero, pw, m, group,
            kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ps if scale is None else _ptr(scale), pbias,
            _ffi.NULL if residual is None else _ptr(residual), _ffi.NULL if y_q else _ptr(y),
            _ffi.from_buffer("uint8_t[]", y) if y_q else _ffi.NULL, _ptr(y_q[0]) if y_q else _ffi.NULL,
            _ffi.from_buffer("int32_t[]", y_q[1]) if y_q else _ffi.NULL,
            act, a0, a1, post[0], post[1], threads())
    if _lib.mrt_qconv2d_q(*args) != 0:
        raise MemoryError("minirt native qconv2d: could not allocate its scratch buffer")
    if _recording.calls is not None:
        _record(_lib.mrt_qconv2d_q, args, ((0, x), (21, scale), (23, residual)), ((25 if y_q else 24, y),))



def has_qconvtranspose() -> bool:
    """True when the loaded module has the int8 stride == kernel ConvTranspose (not in older modules)."""
    return _lib is not None and hasattr(_lib, "mrt_qconvtranspose_tiles")


def qconvtranspose_tiles(x, x_zero: int, packed_w, m: int, k, scale, bias, y, y_q=None, act=0, a0=0.0,
                         a1=0.0) -> None:
    """int8 ConvTranspose with stride == kernel ``k`` = (kh, kw), no padding, one group:
    y (N, M, H*kh, W*kw) from x (N, C, H, W) uint8 (zero point ``x_zero``), both contiguous.

    ``packed_w`` from :func:`qpack` of the (M*kh*kw, C) int8 weights (row (m*kh + t)*kw + u is
    W[:, m, t, u]); ``scale`` (float32, x_scale * w_scale per GEMM row), ``bias`` (float32 or None)
    per GEMM row; with ``y_q = (y_scale, y_zero)`` (float32 / int32 per GEMM row) ``y`` is uint8, the
    float result requantized (as :func:`qconv2d_call`'s)."""
    n, c, h, wd = x.shape
    rc = _lib.mrt_qconvtranspose_tiles(
        _ffi.from_buffer("uint8_t[]", x), int(x_zero), n, c, h, wd, _ffi.from_buffer("char[]", packed_w), m, k[0],
        k[1], _ptr(scale), _ffi.NULL if bias is None else _ptr(bias), _ffi.NULL if y_q else _ptr(y),
        _ffi.from_buffer("uint8_t[]", y) if y_q else _ffi.NULL, _ptr(y_q[0]) if y_q else _ffi.NULL,
        _ffi.from_buffer("int32_t[]", y_q[1]) if y_q else _ffi.NULL, act, a0, a1, threads())
    if rc == -1:
        raise MemoryError("minirt native QConvTranspose: could not allocate scratch memory")
    if rc != 0:
        raise ValueError("minirt native QConvTranspose: invalid arguments")

# Largest kh * kw for mrt_qdwconv2d: its integer sums stay exact in float32 (255 * 128 * 514 < 2^24).
QDW_MAX_TAPS = 514


def has_qdwconv2d() -> bool:
    """True when the loaded module has the int8 depthwise conv (not in older modules)."""
    return _lib is not None and hasattr(_lib, "mrt_qdwconv2d")


def qdwconv2d_prepare(x_shape, k, s, d, pb, out, x_scale, x_zero, w, scale, bias, act=0, a0=0.0, a1=0.0,
                      post=(1.0, 0.0)):
    """The constant arguments of :func:`qdwconv2d_call` for one depthwise layer and input shape.

    ``x_scale`` / ``x_zero`` float32 (C,) (the zero points integer valued), ``w`` float32
    (C, KH, KW) holding the int8 weights, ``scale`` float32 (C,) = x_scale * w_scale,
    ``bias`` float32 (C,) or None; ``post = (a, b)``: y = a * act(...) + b.  The returned
    tuple keeps the arrays alive."""
    n, c, h, wd = x_shape
    params = _ffi.new("mrt_qdw_params *")
    params.x_scale, params.x_zero = _ptr(x_scale), _ptr(x_zero)
    params.w, params.scale = _ptr(w), _ptr(scale)
    params.bias = _ffi.NULL if bias is None else _ptr(bias)
    params.act, params.a0, params.a1 = act, a0, a1
    params.post_a, params.post_b = post
    keep = (x_scale, x_zero, w, scale, bias)
    return (keep, params, n, c, h, wd, k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1], out[0], out[1])


def qdwconv2d_call(prep, x, y, residual=None, y_q=None) -> None:
    """Run a prepared int8 depthwise conv: ``x`` float32 or uint8 (already quantized with the
    prepared zero points), ``y`` float32, or uint8 with ``y_q = (y_scale, y_zero)``;
    ``residual`` float32 like the output or None (added before the activation)."""
    (_, template, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow) = prep
    params = _ffi.new("mrt_qdw_params *", template[0])  # per call: sessions may run on several threads
    if x.itemsize == 1:
        params.xq = _ffi.from_buffer("uint8_t[]", x)
    else:
        params.x = _ptr(x)
    if y_q is None:
        params.y = _ptr(y)
    else:
        params.yq = _ffi.from_buffer("uint8_t[]", y)
        params.y_scale, params.y_zero = float(y_q[0]), int(y_q[1])
    if residual is not None:
        params.res = _ptr(residual)
    _lib.mrt_qdwconv2d(params, n, c, h, wd, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, threads())


def has_qconv2d_pool() -> bool:
    """True when the loaded module has the int8 conv with a fused MaxPool (not in older modules)."""
    return _lib is not None and hasattr(_lib, "mrt_qconv2d_pool_f32")


def qconv2d_pool_call(prep, x, x_scale: float, x_zero: int, pool_kernel, pool_strides, y, residual=None,
                      scale=None) -> None:
    """Run a prepared int8 convolution (see :func:`qconv2d_call`; float output) and max-pool its
    result, without padding, into ``y`` (n, m, (oh - kh) // sh + 1, (ow - kw) // sw + 1)."""
    (_, n, c, h, wd, pw, m, group, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ps, pbias, act, a0, a1) = prep
    x_u8 = x.itemsize == 1
    args = (_ffi.from_buffer("char[]", x) if x_u8 else _ptr(x), int(x_u8), n, c, h, wd, x_scale, x_zero, pw, m, group,
            kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, ps if scale is None else _ptr(scale), pbias,
            _ffi.NULL if residual is None else _ptr(residual), pool_kernel[0], pool_kernel[1],
            pool_strides[0], pool_strides[1], _ptr(y), act, a0, a1, threads())
    rc = _lib.mrt_qconv2d_pool_f32(*args)
    if rc == -2:
        raise ValueError(f"minirt native qconv2d: pooling window {pool_kernel} larger than the output {(oh, ow)}")
    if rc != 0:
        raise MemoryError("minirt native qconv2d: could not allocate its scratch buffer")
    if _recording.calls is not None:
        _record(_lib.mrt_qconv2d_pool_f32, args, ((0, x), (21, scale), (23, residual)), ((28, y),))


def qmatmul(a, x_scale: float, x_zero: int, packed_w, n, scale, bias, y, act=0, a0=0.0, a1=0.0) -> None:
    """y (rows, n) float32 = act(scale[j] * (quant(a) - x_zero) @ W^T + bias[j]); a (rows, K) float32
    contiguous; ``packed_w`` from :func:`qpack` of the (n, K) int8 weights."""
    rows, k = a.shape
    args = (_ptr(a), rows, k, x_scale, int(x_zero), _ffi.from_buffer("char[]", packed_w), n, _ptr(scale),
            _ffi.NULL if bias is None else _ptr(bias), _ptr(y), act, a0, a1, threads())
    if _lib.mrt_qmatmul_f32(*args) != 0:
        raise MemoryError("minirt native qmatmul: could not allocate its scratch buffer")
    if _recording.calls is not None:  # (``scale``: the layer's constant, or derived from ``a`` when dynamic)
        _record(_lib.mrt_qmatmul_f32, args, ((0, a),), ((9, y),))


def softmax_rows(x, y, log: bool = False) -> bool:
    """y = Softmax (or LogSoftmax) of x over its last axis; both float32, C-contiguous, same shape.

    Returns False (nothing written) when the loaded module predates this entry point."""
    if not hasattr(_lib, "mrt_softmax_f32"):
        return False
    n = x.shape[-1]
    _lib.mrt_softmax_f32(_ptr(x), _ptr(y), x.size // n, n, int(log), threads())
    return True


def layernorm_rows(x, scale, bias, y, eps: float) -> None:
    """y = LayerNormalization of x over rows of ``scale.size`` floats (the trailing axes): all float32 and
    C-contiguous, ``scale`` / ``bias`` (or None) of the row's size, ``y`` like ``x``."""
    n = scale.size
    _lib.mrt_layernorm_f32(_ptr(x), _ptr(scale), _ffi.NULL if bias is None else _ptr(bias), _ptr(y), x.size // n, n,
                           float(eps), threads())


def quantize_u8(x, q, scale: float, zero_point: int) -> None:
    """q (uint8, same size) = clamp(rint(x / scale) + zero_point, 0, 255); both contiguous."""
    _lib.mrt_quantize_u8_f32(_ptr(x), _ffi.from_buffer("uint8_t[]", q), x.size, scale, int(zero_point), threads())


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
    rc = _lib.mrt_quantize_add_up_u8_f32(_ffi.NULL if x is None else _ptr(x), _ffi.NULL if xm is None else _ptr(xm),
                                         _ptr(xu), _ffi.NULL if um is None else _ptr(um), q.shape[0] * q.shape[1],
                                         q.shape[2], q.shape[3], f, _ffi.from_buffer("uint8_t[]", q), scale,
                                         int(zero_point), threads())
    if rc == -1:
        raise MemoryError("minirt native quantize_add_up_u8: could not allocate its scratch buffer")
    if rc != 0:
        raise ValueError(f"quantize_add_up_u8: {q.shape} is not {xu.shape} upsampled by an integer factor")


def im2col_u8(x, cols, k, s, d, pb, out, pad: int) -> None:
    """One uint8 image: x (C, H, W) -> cols (C*KH*KW, OH*OW), padding with ``pad``."""
    c, h, wd = x.shape
    _lib.mrt_im2col_u8(_ffi.from_buffer("uint8_t[]", x), _ffi.from_buffer("uint8_t[]", cols), c, h, wd, k[0], k[1],
                       s[0], s[1], d[0], d[1], pb[0], pb[1], out[0], out[1], int(pad), threads())


# --------------------------------------------------------------------------- data movement (layout_impl.h)


def has_layout_kernels() -> bool:
    """True when the loaded module has the upsampling / plane-mean / ConvTranspose-tile kernels."""
    return _lib is not None and hasattr(_lib, "mrt_convtranspose_tiles_f32")


def upsample_nearest(x, y, fh: int, fw: int) -> None:
    """y (..., H*fh, W*fw) = x (..., H, W) with every pixel repeated fh x fw times; both contiguous float32."""
    h, wd = x.shape[-2:]
    planes = x.size // (h * wd) if h * wd else 0
    args = (_ptr(x), _ptr(y), planes, h, wd, fh, fw, threads())
    _lib.mrt_upsample_nearest_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_upsample_nearest_f32, args, ((0, x),), ((1, y),))


def has_element_kernels() -> bool:
    """True when the loaded module has the row copy and same-shape binary kernels (not older ones)."""
    return _lib is not None and hasattr(_lib, "mrt_binary_f32")


def copy_rows(src, y, offset: int, rows: int, cols: int, src_ld: int, dst_ld: int) -> None:
    """y.flat[offset + r * dst_ld + c] = src.flat[r * src_ld + c] for r < rows, c < cols; ``src`` and
    ``y`` C-contiguous float32 arrays (the copy stays inside them: the caller's check)."""
    args = (_ptr(src), src_ld, _ptr(y) + offset, dst_ld, rows, cols, threads())
    _lib.mrt_copy_rows_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_copy_rows_f32, args, ((0, src),), ((2, y),))


BINARY_OPS = {"Add": 0, "Sub": 1, "Mul": 2, "Div": 3}  # mrt_binary_f32's op codes (MRT_BINARY_*)


def binary(op: int, a, b, y) -> None:
    """y = a op b elementwise (``BINARY_OPS``), all float32, C-contiguous, of one shape (y may be a or b)."""
    args = (op, _ptr(a), _ptr(b), _ptr(y), y.size, threads())
    _lib.mrt_binary_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_binary_f32, args, ((1, a), (2, b)), ((3, y),))


def plane_means(x, y) -> None:
    """y (P,) = the mean of each of the P planes of x (P, plane); float32, contiguous, plane > 0."""
    planes = y.size
    args = (_ptr(x), _ptr(y), planes, x.size // planes if planes else 0, threads())
    _lib.mrt_plane_means_f32(*args)
    if _recording.calls is not None:
        _record(_lib.mrt_plane_means_f32, args, ((0, x),), ((1, y),))


def maxpool2d_s1(x, y, k, pb) -> None:
    """Max pooling, stride 1 and dilation 1, separable: x (N, C, H, W) -> y (N, C, OH, OW); top/left pads ``pb``."""
    maxpool2d_call(maxpool2d_prepare(x.shape, k, (1, 1), (1, 1), pb, y.shape[2:], separable=True), x, y)


def convtranspose_tiles(x, wt, m, k, bias_rows, y, act=0, a0=0.0, a1=0.0) -> None:
    """y (N, M, H*kh, W*kw) = act(ConvTranspose(x) + bias) for stride == kernel (taps never overlap).

    ``wt`` (M*kh*kw, C): the (C, M, kh, kw) weight transposed; ``bias_rows`` (M*kh*kw,) or None."""
    n, c, h, wd = x.shape
    rc = _lib.mrt_convtranspose_tiles_f32(
        _ptr(x), n, c, h, wd, _ptr(wt), m, k[0], k[1], _ffi.NULL if bias_rows is None else _ptr(bias_rows), _ptr(y),
        act, a0, a1, threads())
    if rc != 0:
        raise MemoryError("minirt native ConvTranspose: could not allocate scratch memory")


_load()
