"""The memory guard: refuse a tensor larger than the running session allows, before allocating it.

Most kernels produce outputs whose size follows from their inputs' sizes, so
they can never be much larger than what already exists.  Two families can, from
shapes alone: operands broadcast together ((N, 1) with (1, M): :func:`check_broadcast`,
called by the elementwise kernels before a result is allocated) and windows over
padded inputs (Conv / pooling pads: ``nn._geometry`` checks the padded plane and the
output).  A few take the
output size from input *values* (Expand's shape, Tile's repeats, Pad's pads,
ConstantOfShape, Range, Resize/Upsample scales or sizes, OneHot's depth,
ConvTranspose's output_shape, Loop's accumulated outputs): one damaged or
hostile constant there can ask for terabytes.  Those kernels call
:func:`check_alloc` with the output shape before they allocate.

The limit lives in a :class:`contextvars.ContextVar` that ``Session.run`` sets
for the duration of the run (:func:`limit`), so sessions with different
limits can run concurrently in different threads.  Outside a run (kernels
called directly, in tests) the process default applies.
"""
from __future__ import annotations

import contextvars
import math
import os

import numpy as np

from minirt import native as _native
from minirt.errors import ResourceError

__all__ = ["DEFAULT_MAX_TENSOR_BYTES", "check_alloc", "check_broadcast", "check_elements", "current_limit",
           "default_max_tensor_bytes", "limit"]

_CAP = 2**34  # 16 GiB: no single tensor of an edge model needs more


def _physical_memory() -> int | None:
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None
    if pages <= 0 or page <= 0:
        return None
    return pages * page


def default_max_tensor_bytes() -> int:
    """Half the physical memory, at most 16 GiB (4 GiB when the memory size is unknown)."""
    total = _physical_memory()
    if total is None:
        return 2**32
    return max(min(total // 2, _CAP), 2**26)


DEFAULT_MAX_TENSOR_BYTES = default_max_tensor_bytes()

_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("minirt_max_tensor_bytes", default=DEFAULT_MAX_TENSOR_BYTES)


def current_limit() -> int:
    return _LIMIT.get()


_scratch_limit = -1  # the bound last given to the native kernels' scratch (minirt.native.set_scratch_limit)


class limit:  # noqa: N801 - used like a function, as contextlib's context managers are
    """``with limit(max_bytes):`` runs the body with ``max_bytes`` as the per-tensor limit (restored
    afterwards).  A class rather than a generator context manager: it is entered on every run, and
    costs a third of one."""

    __slots__ = ("_max_bytes", "_token")

    def __init__(self, max_bytes: int):
        self._max_bytes = max_bytes

    def __enter__(self) -> None:
        global _scratch_limit
        self._token = _LIMIT.set(self._max_bytes)
        if self._max_bytes != _scratch_limit:  # (the native kernels' scratch, under the same bound)
            _scratch_limit = self._max_bytes
            _native.set_scratch_limit(self._max_bytes)

    def __exit__(self, *exc) -> None:
        _LIMIT.reset(self._token)


def fmt_bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def check_alloc(shape, dtype, what: str) -> None:
    """Raise :class:`ResourceError` if an array of ``shape`` and ``dtype`` exceeds the limit.

    ``shape`` is any iterable of non-negative ints (Python ints: no overflow);
    ``what`` names the kernel and the tensor, e.g. ``"Expand output"``.
    """
    dims = [int(d) for d in shape]
    itemsize = np.dtype(dtype).itemsize if dtype is not None else 8  # object arrays: one pointer each
    nbytes = math.prod(max(d, 0) for d in dims) * max(itemsize, 1)
    cap = _LIMIT.get()
    if nbytes > cap:
        raise ResourceError(
            f"{what} of shape {dims} and type {np.dtype(dtype) if dtype is not None else '?'} would need "
            f"{fmt_bytes(nbytes)}, above this session's max_tensor_bytes of {fmt_bytes(cap)}; refused before "
            f"allocating "
            f"(raise Session(max_tensor_bytes=...) if the model really needs it)"
        )


def check_elements(count: int, dtype, what: str) -> None:
    """:func:`check_alloc` for a flat element count."""
    check_alloc((count,), dtype, what)


def check_broadcast(op: str, *operands) -> None:
    """Raise :class:`ResourceError` if the operands broadcast together give a result over the limit,
    before it is allocated.  Costs a few attribute reads unless it could be: the product of the
    operands' sizes bounds the result's size; only above the limit is the shape worked out."""
    bound, dtype = 1, None
    for a in operands:
        if a is None:
            continue
        bound *= max(int(getattr(a, "size", 1)), 1)
        dt = getattr(a, "dtype", None)
        if dt is not None and (dtype is None or dt.itemsize > dtype.itemsize):
            dtype = dt
    if bound * (dtype.itemsize if dtype is not None else 8) <= _LIMIT.get():
        return
    try:
        shape = np.broadcast_shapes(*(np.shape(a) for a in operands if a is not None))
    except ValueError:
        return  # (shapes that do not broadcast: the kernel reports them)
    check_alloc(shape, dtype, f"{op} output (its inputs broadcast together)")
