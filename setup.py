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
from setuptools import find_packages, setup


def _packages() -> list[str]:
    packages = find_packages(include=["minirt", "minirt.*"])
    for folder in ("builder", "targets"):  # installed as minirt.<folder> (pyproject.toml: package-dir)
        packages += ["minirt." + name for name in find_packages(include=[folder, folder + ".*"])]
    return packages


setup(packages=_packages(), cffi_modules=["minirt/native/build_native.py:ffibuilder"])
