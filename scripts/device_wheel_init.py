"""minirt: the on-device runtime for .mrt artifacts (the device wheel's package entry).

The device wheel (``MINIRT_WHEEL=runtime``, setup.py) keeps the runtime's modules in one compressed
archive beside this file, ``_runtime.zip``: each module's source and its bytecode, compiled when the
wheel was built.  pip compiles no bytecode for an archive, and bytecode was the largest part of an
install (docs/packaging.md, D148).  This file is the wheel's ``minirt/__init__.py`` (in the source tree:
scripts/device_wheel_init.py).  It makes the archive the package's folder, runs the real
``minirt/__init__.py`` from it, and lets the compiled kernels (``native/_kernels*.so`` beside this file:
an extension module cannot be loaded from an archive) import as ``minirt.native._kernels``.
"""
import os as _os
import sys as _sys
import zipimport as _zipimport
from importlib.machinery import ExtensionFileLoader as _ExtensionFileLoader
from importlib.machinery import PathFinder as _PathFinder

_FOLDER = _os.path.dirname(_os.path.abspath(__file__))
_ARCHIVE = _os.path.join(_FOLDER, "_runtime.zip")

# Submodules are found in the archive (zipimport); its entries are minirt/<module path>.py and .pyc.
__path__ = [_os.path.join(_ARCHIVE, "minirt")]


class _CompiledModules:
    """The meta path finder of minirt's extension modules: after the archive (which holds none), it finds
    ``minirt.a.b`` as an extension module file in the installed folder a/ beside this file."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if not fullname.startswith("minirt."):
            return None
        parts = fullname.split(".")[1:]
        spec = _PathFinder.find_spec(fullname, [_os.path.join(_FOLDER, *parts[:-1])])
        return spec if spec is not None and isinstance(spec.loader, _ExtensionFileLoader) else None


if _CompiledModules not in _sys.meta_path:
    _sys.meta_path.append(_CompiledModules)

# The real package body, as the archive holds it (``minirt/__init__.py``): names, version, lazy attributes.
exec(_zipimport.zipimporter(_ARCHIVE).get_code("minirt"), globals())
