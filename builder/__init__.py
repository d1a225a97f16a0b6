"""minirt's builder: ONNX in, optimised and partitioned .mrt artifact out.

Desktop/CI side only; needs the ``builder`` extra (onnx, onnx-ir).
"""
from __future__ import annotations

from minirt.builder.build import BuildReport, build, build_bytes
from minirt.builder.errors import BuildError, UnsupportedModel

__all__ = ["BuildError", "BuildReport", "UnsupportedModel", "build", "build_bytes"]
