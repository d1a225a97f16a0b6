"""Build hook: the package list and the optional native kernels; all metadata lives in pyproject.toml.

Packages: ``minirt`` (the runtime) plus the folders ``builder/`` and ``targets/`` installed as
``minirt.builder`` and ``minirt.targets`` (pyproject.toml's ``package-dir`` maps the names to the
folders): the installed distribution has one top-level name, ``minirt``.

cffi's setuptools integration (``cffi_modules``) generates and compiles
``minirt.native._kernels`` from ``minirt/native/build_native.py``.  The
extension is declared optional there (``Extension(optional=True)``), so a
machine without a working C compiler still installs minirt: setuptools warns
("building extension ... failed") and the runtime falls back to its numpy
kernels (``minirt info`` says so).
"""
import importlib.util
import os

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

# MINIRT_WHEEL=runtime builds the device wheel: the runtime alone (no builder, no targets: a device
# runs artifacts, it does not build them) and no C sources (the compiled module is inside).  The
# default builds everything, as `pip install -e .` and the extras need.
RUNTIME_ONLY = os.environ.get("MINIRT_WHEEL", "").strip().lower() == "runtime"


def _packages() -> list[str]:
    packages = find_packages(include=["minirt", "minirt.*"])
    if RUNTIME_ONLY:
        return packages
    for folder in ("builder", "targets"):  # installed as minirt.<folder> (pyproject.toml: package-dir)
        packages += ["minirt." + name for name in find_packages(include=[folder, folder + ".*"])]
    return packages


# (kernels.h stays: the runtime reads the ABI version it expects from it)
# (a header kernels.c includes is named *_impl.h or q*.h; tests/test_runtime_wheel.py checks that only
# kernels.h is left)
# (and the demo's model and data: a device runs its own artifacts)
_SOURCES = {"minirt.native": ["*.c", "*_impl.h", "q*.h"], "minirt.demo": ["*.onnx", "*.npz"]} if RUNTIME_ONLY else {}


def _progress():
    """minirt/native/build_progress.py, loaded by path (the package is not importable yet)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minirt", "native", "build_progress.py")
    spec = importlib.util.spec_from_file_location("minirt_build_progress", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildExtWithProgress(build_ext):
    """build_ext that tells the user's terminal the compile is running (pip hides build output
    without -v); cffi's own build_ext (cffi_modules) subclasses this one."""

    def run(self):
        progress = _progress()
        with progress.reporting(progress.open_terminal() if self.extensions else None):
            super().run()


setup(packages=_packages(), exclude_package_data=_SOURCES, cmdclass={"build_ext": BuildExtWithProgress},
      cffi_modules=["minirt/native/build_native.py:ffibuilder"])
