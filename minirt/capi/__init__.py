"""onnxruntime's ``capi`` package layout, for scripts that import its error classes by that path.

``from onnxruntime.capi.onnxruntime_pybind11_state import Fail`` becomes
``from minirt.capi.onnxruntime_pybind11_state import Fail``.  Imported only by such scripts.
"""
from __future__ import annotations
