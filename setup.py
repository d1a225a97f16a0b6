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
import shutil
import subprocess
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

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


# (no header either: the runtime's expected ABI version is a constant of minirt/native/__init__.py)
# (and the demo's model and data: a device runs its own artifacts)
_SOURCES = {"minirt.native": ["*.c", "*.h"], "minirt.demo": ["*.onnx", "*.npz"]} if RUNTIME_ONLY else {}
# modules a device does not run: the two that compile the kernels (a wheel holds the compiled module,
# it never builds it) and minirt verify's off-device Core ML references (desktop tools that need
# coremltools; on a device the provider itself runs, and verify says what is missing)
_DESKTOP_ONLY_MODULES = {("minirt.native", "build_native"), ("minirt.native", "build_progress"),
                         ("minirt.tools", "mil_eval"), ("minirt.tools", "coreml_spec_eval")}


def _native_module(name: str):
    """minirt/native/<name>.py, loaded by path (the package is not importable yet)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "minirt", "native", name + ".py")
    spec = importlib.util.spec_from_file_location("minirt_" + name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyRuntime(build_py):
    """build_py that leaves the desktop-only modules out of the device wheel, and starts it from an empty
    build folder: files that an earlier build left in build/lib (the builder of a full build, a module
    excluded since) would otherwise go into the wheel."""

    def run(self):
        if RUNTIME_ONLY:
            shutil.rmtree(os.path.join(self.build_lib, "minirt"), ignore_errors=True)
        super().run()
        if RUNTIME_ONLY:
            # the modules into one archive with their bytecode (scripts/zip_runtime.py, D148): pip compiles
            # none at install, and the installed runtime is half the size
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "zip_runtime.py")
            if not os.path.isfile(script):
                raise SystemExit(f"MINIRT_WHEEL=runtime: {script} is missing (build the device wheel from a "
                                 "source checkout)")
            subprocess.run([sys.executable, "-X", "no_debug_ranges", script, os.path.join(self.build_lib, "minirt")],
                           check=True)

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        if not RUNTIME_ONLY:
            return modules
        return [m for m in modules if (m[0], m[1]) not in _DESKTOP_ONLY_MODULES]


class BuildExtWithProgress(build_ext):
    """build_ext that tells the user's terminal the compile is running (pip hides build output
    without -v); cffi's own build_ext (cffi_modules) subclasses this one."""

    def run(self):
        progress = _native_module("build_progress")
        with progress.reporting(progress.open_terminal() if self.extensions else None):
            super().run()
        if self.inplace:  # (an editable install: the module lands in the source tree, beside older builds)
            drop_shadowed = _native_module("build_native").drop_shadowed
            for path in (self.get_ext_fullpath(ext.name) for ext in self.extensions):
                if os.path.isfile(path):
                    drop_shadowed(path)


setup(packages=_packages(), exclude_package_data=_SOURCES, cmdclass={"build_ext": BuildExtWithProgress, "build_py": BuildPyRuntime},
      cffi_modules=["minirt/native/build_native.py:ffibuilder"])
