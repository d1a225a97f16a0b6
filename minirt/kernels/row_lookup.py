"""``com.minirt::RowLookup``: rows of a table picked by integer ids (docs/fused_ops.md).

The builder writes it for a one-hot encoding times a matrix, ``MatMul(Cast(Equal(ids, arange(K))), W)``
(jax's ``one_hot`` before a Dense layer, as magika's byte embedding is exported): the product over K
classes per id becomes one row copy (builder/passes/recognise_one_hot_matmul.py).  Semantics::

    ids   : int32 / int64, shape (..., 1)
    table : float, shape (K + 1, D...)
    y     : shape (...) + (D...),  y[i] = table[ids[i, 0]] if 0 <= ids[i, 0] < K else table[K]

Row K is the row for an id that is none of the classes (its one-hot row is all zeros): the builder
stores the product of zeros there, with whatever it folded after the product (bias, activation).
Unlike ONNX Gather, an id out of range is not an error and a negative id does not count from the end.
"""
from __future__ import annotations

import numpy as np

from minirt import native as _native
from minirt.kernels.registry import kernel
from minirt.kernels._native_copies import _worth
from minirt.vocabulary import MINIRT_DOMAIN


@kernel("RowLookup", since=1, domain=MINIRT_DOMAIN, out=True)
def row_lookup(ids, table, /, *, out=None):
    if ids.dtype not in (np.int32, np.int64):
        raise TypeError(f"RowLookup: ids must be int32 or int64, got {ids.dtype}")
    if ids.ndim < 1 or ids.shape[-1] != 1:
        raise ValueError(f"RowLookup: ids must have a last axis of size 1, got shape {ids.shape}")
    if table.ndim < 2 or table.shape[0] < 1:
        raise ValueError(f"RowLookup: table must have at least 2 axes and 1 row, got shape {table.shape}")
    shape = ids.shape[:-1] + table.shape[1:]
    row_bytes = table.nbytes // table.shape[0]
    if (_native.available and table.flags.c_contiguous and ids.flags.c_contiguous and ids.size
            and _worth(row_bytes * ids.size)):
        y = out if (out is not None and out.shape == shape and out.dtype == table.dtype
                    and out.flags.c_contiguous) else np.empty(shape, table.dtype)
        _native.lookup_rows(_native.gather_shape(1, table.shape[0], ids.size, row_bytes), table, ids, y)
        return _native.final(y)
    classes = table.shape[0] - 1
    rows = ids[..., 0]
    return table[np.where((rows >= 0) & (rows < classes), rows, classes)]
