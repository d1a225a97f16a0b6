"""numpy 1.24 .. 2.x compatibility: the few facts the runtime must not assume.

minirt supports numpy >= 1.24 (Raspberry Pi OS bookworm / Debian 12 ship
1.24.2 as ``python3-numpy``) as well as 2.x.  The runtime stays inside the
API common to both; ``tests/test_numpy_compat.py`` checks that statically
(no numpy-2-only or numpy-1-only names) and behaviourally (the kernels whose
results depend on the version-specific rules below).

What differs, and how the runtime copes:

* Scalar promotion (NEP 50, numpy 2): ``float32_array * np.float64(x)`` is
  float64 on 2.x but float32 on 1.x; ``np.float32(1) * 2.0`` is float32 on 2.x
  but float64 on 1.x; ``uint8_array + 300`` raises on 2.x but upcasts on 1.x;
  and on 1.x a Python int/float next to an ml_dtypes array (bfloat16,
  float8...) becomes int64/float64, for which no common type exists.  Kernels
  therefore use scalars of the array's own type (:func:`scalar`) and cast
  results to the ONNX output type explicitly.
* ``np.array(x, copy=False)`` means "never copy" on 2.x (raises if it must)
  but "copy if needed" on 1.x: use :data:`COPY_IF_NEEDED` or ``np.asarray``.
  ``np.asarray(..., copy=...)`` and the function ``np.astype`` exist on 2.x
  only (the method ``ndarray.astype(dtype, copy=False)`` works everywhere).
* ``np.unique(..., return_inverse=True)``: the inverse has the input's shape
  on 2.0 (with ``axis=None``) and is 1-D on 1.x: flatten it.
* Names: ``np.bool``, ``np.concat``, ``np.pow``, ``np.trapezoid``... are 2.x
  only; ``np.product``, ``np.in1d``, ``np.trapz``, ``np.float_``... are gone or
  deprecated in 2.x.  :func:`trapezoid` picks whichever exists.
"""
from __future__ import annotations

import numpy as np

NUMPY_VERSION: tuple = tuple(int(p) for p in np.__version__.split(".")[:2] if p.isdigit())
NUMPY2: bool = NUMPY_VERSION >= (2, 0)

# ``np.array(x, copy=COPY_IF_NEEDED)``: copy only when a conversion needs it,
# on both major versions.
COPY_IF_NEEDED = None if NUMPY2 else False

trapezoid = getattr(np, "trapezoid", None) or getattr(np, "trapz")


def scalar(dtype, value):
    """``value`` as a numpy scalar of ``dtype``: promotes the same way on numpy 1.x and 2.x."""
    return np.dtype(dtype).type(value)


def unique_inverse(inverse: np.ndarray) -> np.ndarray:
    """The inverse indices of ``np.unique(..., return_inverse=True)`` as 1-D, whatever the numpy version."""
    return np.asarray(inverse).reshape(-1)
