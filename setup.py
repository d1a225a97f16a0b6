"""Build hook for the optional native kernels; all metadata lives in pyproject.toml.

cffi's setuptools integration (``cffi_modules``) generates and compiles
``minirt.native._kernels`` from ``minirt/native/build_native.py``.  The
extension is declared optional there (``Extension(optional=True)``), so a
machine without a working C compiler still installs minirt: setuptools warns
("building extension ... failed") and the runtime falls back to its numpy
kernels (``minirt info`` says so).
"""
from setuptools import setup

setup(cffi_modules=["minirt/native/build_native.py:ffibuilder"])
