"""Registration that steps aside for a kernel another family module already provides.

Family modules are imported in alphabetical order.  A few operators sit on
the border between families (e.g. a normalisation that could live in
``nn``); modules that sort after the others register those with
:func:`kernel_if_absent`, so whichever family registered the op first wins
and importing never fails on a duplicate.  Several ``since`` versions from
the same module are all kept.
"""
from __future__ import annotations

from minirt.kernels.registry import _REGISTRY, kernel


def kernel_if_absent(op_type: str, since: int = 1, domain: str = "", context: bool = False):
    def register(fn):
        entries = _REGISTRY.get((domain, op_type), [])
        if any(e.fn.__module__ != fn.__module__ or e.since == since for e in entries):
            return fn
        return kernel(op_type, since=since, domain=domain, context=context)(fn)

    return register
