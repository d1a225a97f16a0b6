"""Run an unmodified onnxruntime application on minirt.

    python -m minirt.shim app.py [ARGS...]        # a script
    python -m minirt.shim -m package.module [ARGS...]   # a module, as ``python -m`` runs it

or, from Python, before the application imports onnxruntime::

    import minirt.shim
    minirt.shim.install()

:func:`install` makes ``import onnxruntime`` (and ``onnxruntime.capi.onnxruntime_pybind11_state``,
where applications find the exception classes) give minirt, whose API is onnxruntime's
(docs/ort_compat.md).  ONNX files the application opens are built in memory by minirt's builder and
cached (``minirt.onnx_in``), so the first start of each model takes a build and the later ones a load.
Nothing of the application changes; what it asks of onnxruntime that minirt does not do raises or
warns as that table says.
"""
from __future__ import annotations

import os
import runpy
import sys

USAGE = "usage: python -m minirt.shim SCRIPT.py [ARGS...]  or  python -m minirt.shim -m MODULE [ARGS...]"


def install() -> None:
    """Make ``import onnxruntime`` import minirt (from now on, in this process)."""
    import minirt
    import minirt.capi.onnxruntime_pybind11_state as state

    sys.modules["onnxruntime"] = minirt
    sys.modules["onnxruntime.capi"] = minirt.capi
    sys.modules["onnxruntime.capi.onnxruntime_pybind11_state"] = state


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr if not argv or argv[0] == "-m" else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    install()
    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        if not os.path.isfile(argv[0]):
            print(f"minirt.shim: cannot open {argv[0]!r}: no such file (expected a Python script, or -m MODULE)",
                  file=sys.stderr)
            return 2
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
