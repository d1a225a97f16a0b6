"""CPU kernels, one module per operator family.

Importing this package imports every family module, and each module
registers its kernels with :func:`minirt.kernels.registry.kernel`.
"""
from __future__ import annotations

import importlib
import pkgutil

from minirt.kernels.registry import NodeContext, kernel, lookup, registered

__all__ = ["NodeContext", "kernel", "lookup", "registered"]


def _import_families() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "registry" and not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_families()
