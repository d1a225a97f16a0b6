"""cffi build script for ``minirt.native._kernels`` (out-of-line API mode).

``setup.py`` hands ``ffibuilder`` to cffi's setuptools integration
(``cffi_modules``), so ``pip install .`` / ``pip install -e .`` compile the
extension.  The extension is marked optional: without a working C compiler
the install still succeeds and the runtime uses its numpy kernels
(``minirt.native.available`` is then False and says why).

For a quick in-place rebuild during development::

    python minirt/native/build_native.py

Compiler flags are deliberately portable: no ``-march=native``.  The AVX2/FMA
code paths are enabled per function (``__attribute__((target(...)))``) and
chosen at run time from the CPU's features, so one binary runs everywhere.
"""
from __future__ import annotations

import importlib.machinery
import os
import re
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# setuptools wants source paths relative to the directory of setup.py.
REL = os.path.relpath(HERE, ROOT) if os.path.isabs(HERE) else HERE


def _cdef_from_header(text: str) -> str:
    """The header's declarations, minus the include guard (cffi's cdef has no preprocessor)."""
    keep = []
    for line in text.splitlines():
        if re.match(r"\s*#\s*(ifndef|endif|if|else|include)\b", line):
            continue
        if re.match(r"\s*#\s*define\s+MINIRT_KERNELS_H\b", line):
            continue
        keep.append(line)
    return "\n".join(keep)


with open(os.path.join(HERE, "kernels.h"), encoding="utf-8") as f:
    _HEADER = f.read()

_unix = sys.platform != "win32"
# The device wheel (MINIRT_WHEEL=runtime, setup.py) also drops the unwind tables and the symbol table
# (about 60 KB: nothing in the C code unwinds, no exceptions, no pthread_exit / cancel, and cffi finds its
# entry points through the dynamic symbols, which stay); development builds keep them for perf and gdb.
_DEVICE = os.environ.get("MINIRT_WHEEL", "").strip().lower() == "runtime"
_DEVICE_COMPILE = ["-fno-asynchronous-unwind-tables", "-fno-unwind-tables"] if _DEVICE else []
_DEVICE_LINK = ["-Wl,-s"] if _DEVICE else []


def make_builder(src_dir: str = REL) -> FFI:
    """The FFI builder; ``src_dir`` is where the C sources are (relative to setup.py, or absolute)."""
    ffi = FFI()
    ffi.cdef(_cdef_from_header(_HEADER))
    ffi.set_source(
        "minirt.native._kernels",
        '#include "kernels.h"\n',
        sources=[os.path.join(src_dir, "kernels.c")],
        include_dirs=[src_dir],
        # every header beside kernels.c is included by it: a change to any of them rebuilds the module
        depends=[os.path.join(src_dir, n) for n in sorted(os.listdir(HERE)) if n.endswith(".h")],
        # (an undeclared function is an error, not a module that fails to load at run time)
        # (-g0 and the linker's -S: no debug information, which Python's own CFLAGS ask for: the module is
        # about 1.5 MB instead of 9 on a device)
        extra_compile_args=["-O3", "-g0", "-pthread", "-fno-trapping-math", "-fno-math-errno",
                            "-Werror=implicit-function-declaration"] + _DEVICE_COMPILE if _unix else ["/O2"],
        extra_link_args=["-pthread", "-Wl,-S"] + _DEVICE_LINK if _unix else [],
        libraries=["m"] if _unix else [],
        # A failed compile (no compiler, unsupported platform) must not fail the
        # install: setuptools' build_ext warns and skips optional extensions.
        optional=True,
    )
    return ffi


ffibuilder = make_builder()


def drop_shadowed(module_path: str) -> list[str]:
    """Remove the other builds of the compiled module beside ``module_path`` (``_kernels`` with another
    extension suffix) and return their paths.  Python imports the first of EXTENSION_SUFFIXES it finds,
    the interpreter-tagged name before ``.abi3.so``: a module left by an earlier `make native` (tagged) or
    `pip install -e .` (abi3) would otherwise shadow, or be shadowed by, the build just made."""
    folder, name = os.path.split(module_path)
    stem = name.split(".", 1)[0]
    removed = []
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        other = os.path.join(folder, stem + suffix)
        if os.path.abspath(other) != os.path.abspath(module_path) and os.path.isfile(other):
            os.remove(other)
            removed.append(other)
    return removed

def built_since(build_dir: str, since: float) -> list[str]:
    """The compiled modules under ``build_dir`` (ffibuilder.compile's tmpdir) written at or after ``since``
    (a time.time()).  The extension is optional (a failed compile must not fail a pip install), so
    setuptools only warns when the compiler fails and leaves the previous build in ``build_dir``: copying
    that one would install stale kernels under a "installed" line, and the tests would run them."""
    import glob

    found = []
    for so in glob.glob(os.path.join(build_dir, "minirt", "native", "_kernels*")):
        if so.endswith((".so", ".pyd", ".dylib")) and os.path.getmtime(so) >= since:
            found.append(so)
    return found


if __name__ == "__main__":
    import shutil
    import time

    build_dir = os.path.join(ROOT, "build", "native")
    # (whole seconds: some file systems keep modification times in whole seconds)
    started = float(int(time.time()))
    make_builder(HERE).compile(tmpdir=build_dir, verbose=True, target=None)
    # ffibuilder.compile writes the module under tmpdir/minirt/native/; put it next to this file.
    fresh = built_since(build_dir, started)
    if not fresh:
        sys.exit("build_native: the native module did not compile (the compiler's errors are above); nothing "
                 "was installed, and minirt/native keeps its previous build, if any")
    for so in fresh:
        # Copy beside the target, then rename over it: a process that has the
        # old library mapped keeps its (unlinked) copy instead of crashing.
        dest = os.path.join(HERE, os.path.basename(so))
        shutil.copy2(so, dest + ".tmp")
        os.replace(dest + ".tmp", dest)
        print("installed", dest)
        for old in drop_shadowed(dest):
            print("removed", old, "(an older build under another name, which Python could import instead)")
