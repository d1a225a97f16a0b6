"""Best-effort control of the BLAS thread count behind numpy (OpenBLAS).

numpy's wheels bundle OpenBLAS (``numpy.libs/libscipy_openblas*.so``);
distribution builds link the system OpenBLAS.  OpenBLAS exposes
``openblas_set_num_threads`` (under a prefixed/suffixed name in the wheels),
which we call through ``ctypes`` (standard library, no dependency) on the
library numpy already loaded.  There is no threadpoolctl dependency.

If no OpenBLAS can be found (another BLAS, an unusual platform),
:func:`set_threads` does nothing and :data:`status` says so; the limit is a
performance knob, never a correctness one.

The OpenBLAS setting is process-wide: a session with ``threads=N`` applies it
when it runs (see ``Session``), and a session with ``threads=None`` restores
the value OpenBLAS started with.
"""
from __future__ import annotations

import os
import sys
from typing import Iterator

# Symbol names of openblas_set/get_num_threads across builds: numpy/scipy
# wheels (scipy_openblas, 64-bit ints), older wheels (64_ suffix), plain builds.
_SETTERS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)

# OpenBLAS's own "stop the worker threads" entry point (exported unprefixed, also by numpy's
# scipy-openblas wheels); the library restarts them by itself at its next threaded call.
_SHUTDOWN = "blas_thread_shutdown_"

status = "not probed"
_set = _get = None
_shutdown = None
_initial: int | None = None
_current: int | None = None
_probed = False


def _wheel_libraries() -> list[str]:
    """The BLAS libraries of numpy's wheel layout: numpy.libs (Linux), numpy/.dylibs (macOS)."""
    import numpy as np

    paths: list[str] = []
    root = os.path.dirname(os.path.dirname(np.__file__))
    for d in (os.path.join(root, "numpy.libs"), os.path.join(os.path.dirname(np.__file__), ".dylibs")):
        if os.path.isdir(d):
            paths.extend(os.path.join(d, name) for name in sorted(os.listdir(d)) if "blas" in name.lower())
    return paths


def _mapped_libraries() -> list[str]:
    """The BLAS libraries mapped into this process (Linux /proc/self/maps): the one numpy loaded."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError:
        return paths
    for line in maps.splitlines():
        if "blas" in line.lower():  # (the cheap test first: the file has hundreds of lines)
            parts = line.split()
            if len(parts) >= 6 and "blas" in os.path.basename(parts[-1]).lower() and parts[-1] not in paths:
                paths.append(parts[-1])
    return paths


def _candidate_libraries() -> Iterator[tuple[str, int]]:
    """(path, extra dlopen flags) of the libraries to try, in order, made as they are needed.

    First the wheel's libraries that are already loaded (``RTLD_NOLOAD``: the common install, found
    without reading and parsing /proc/self/maps, ~0.4 ms of a cold start's first run); then the
    libraries mapped into this process (a distribution's numpy linked to the system OpenBLAS); then
    the wheel's libraries loaded anew (a platform without /proc)."""
    wheel = _wheel_libraries()
    noload = getattr(os, "RTLD_NOLOAD", None)
    if noload is not None:
        yield from ((p, noload) for p in wheel)
    yield from ((p, 0) for p in _mapped_libraries())
    yield from ((p, 0) for p in wheel)


def _probe() -> None:
    global status, _set, _get, _shutdown, _initial, _probed
    _probed = True
    try:
        import ctypes
    except ImportError:  # pragma: no cover - CPython always has ctypes, some embedded builds do not
        status = "ctypes unavailable"
        return
    for path, flags in _candidate_libraries():
        try:
            lib = ctypes.CDLL(path, mode=ctypes.DEFAULT_MODE | flags)
        except OSError:  # (with RTLD_NOLOAD: not loaded in this process)
            continue
        for set_name, get_name in _SETTERS:
            setter = getattr(lib, set_name, None)
            getter = getattr(lib, get_name, None)
            if setter is None or getter is None:
                continue
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            _set, _get = setter, getter
            _shutdown = getattr(lib, _SHUTDOWN, None)
            if _shutdown is not None:
                _shutdown.argtypes, _shutdown.restype = [], ctypes.c_int
            _initial = int(getter())
            status = f"OpenBLAS via {os.path.basename(path)} ({_initial} threads by default)"
            return
    status = "no OpenBLAS found in this process; BLAS threads left at the library default"


def set_threads(n: int | None) -> bool:
    """Limit BLAS to ``n`` threads (None: back to the library's initial value).

    Cheap when nothing changes (the last value is cached). Returns True when
    the setting is known to be in effect.
    """
    global _current
    if not _probed:
        if n is None:
            return True  # never touched: nothing to restore
        _probe()
    if _set is None:
        return False
    want = _initial if n is None else max(1, int(n))
    if want != _current:
        _set(want)
        _current = want
    return True


def stop_idle_threads() -> bool:
    """Stop OpenBLAS's worker threads, once BLAS is limited to 1 thread (set_threads(1)) and no other
    Python thread exists.  Returns whether they were stopped.

    Why: after numpy's import (and after every threaded BLAS call) OpenBLAS's workers busy-wait for
    work for ~0.1 s (2**28 cycles) before they sleep.  A session created in that window ran its first
    runs at 2 threads with one of the two cores taken by that spinner: measured on a 2-vCPU VM, magika's
    first two runs 6-12 ms against 3.7 steady, 13-18 ms of process CPU per run against 7 (D136).  With
    BLAS at 1 thread the workers have nothing left to do; OpenBLAS starts them again by itself if a
    later call asks for more threads.  Its shutdown joins them after taking their queues, which would
    break a threaded BLAS call running at that moment in another thread: hence only when this is the
    process's only Python thread (a native thread of another library calling OpenBLAS is not seen)."""
    import _thread  # (_count: threads started and not finished, the main thread not counted; threading's
    # import, ~0.5 ms, is left to programs that use it)

    if not _probed:
        _probe()
    if _shutdown is None or _current != 1 or _thread._count() != 0:
        return False
    _shutdown()
    return True


def get_threads() -> int | None:
    if not _probed:
        _probe()
    return None if _get is None else int(_get())


if __name__ == "__main__":  # pragma: no cover
    print(get_threads(), status, file=sys.stdout)
