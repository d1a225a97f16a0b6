"""CPU kernels, one module per operator family.

Each family module registers its kernels with
:func:`minirt.kernels.registry.kernel` when it is imported.  Importing this
package imports none of them: :func:`lookup` imports the family that the
generated index (``_index.py``) names for an operator, on first use, so a
process loads only the families its models need (cold start).
"""
from __future__ import annotations

from minirt.kernels.registry import NodeContext, kernel, lookup, registered

__all__ = ["NodeContext", "kernel", "lookup", "registered"]


def family_modules() -> list[str]:
    """Names of the family modules, in the (alphabetical) order they register."""
    import pkgutil

    return sorted(info.name for info in pkgutil.iter_modules(__path__)
                  if info.name != "registry" and not info.name.startswith("_"))


def _import_families() -> None:
    import importlib

    for name in family_modules():
        importlib.import_module(f"{__name__}.{name}")
