"""Spatial sampling kernels: GridSample and AffineGrid (spatial-transformer ops).

GridSample works for any number of spatial axes.  Per axis it turns the
normalised grid coordinate into a pixel coordinate, picks the interpolation
taps (1 for nearest, 2 for linear, 4 for cubic) with their weights, and maps
every tap index through the padding mode; the output is the weighted sum over
the product of the per-axis taps, each a vectorised gather from the input
flattened over its spatial axes.  Applying the padding to the tap indices is
equivalent to padding the coordinate for border/reflection and gives the
per-tap zero padding the "zeros" mode needs.
"""
from __future__ import annotations

import itertools

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels._limits import check_alloc
from minirt.kernels.registry import kernel

_CUBIC_A = -0.75


def _unnormalise(g: np.ndarray, length: int, align_corners: int) -> np.ndarray:
    """Normalised [-1, 1] grid coordinate -> pixel coordinate along an axis of ``length``."""
    if align_corners:
        return (g + 1) / 2 * (length - 1)
    return ((g + 1) * length - 1) / 2


def _pad_index(idx: np.ndarray, length: int, padding_mode: str, align_corners: int):
    """(index into the axis, valid mask or None) for integer tap positions."""
    if padding_mode == "zeros":
        valid = (idx >= 0) & (idx < length)
        return np.clip(idx, 0, length - 1), valid
    if padding_mode == "border":
        return np.clip(idx, 0, length - 1), None
    if padding_mode == "reflection":
        if align_corners:
            # mirror about the centres of the edge pixels: period 2 * (length - 1)
            if length == 1:
                return np.zeros_like(idx), None
            period = 2 * (length - 1)
            m = np.mod(idx, period)
            return np.where(m > length - 1, period - m, m), None
        # mirror about the outer edges (-0.5 and length - 0.5): period 2 * length
        period = 2 * length
        m = np.mod(idx, period)
        return np.where(m >= length, period - 1 - m, m), None
    raise ValueError(f"GridSample: padding_mode must be zeros, border or reflection, got {padding_mode!r}")


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    """Keys cubic-convolution weights (a = -0.75) of the taps at floor-1 .. floor+2; t = x - floor(x)."""
    a = _CUBIC_A
    d = np.stack([t + 1, t, 1 - t, 2 - t], axis=-1)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def _axis_taps(coord: np.ndarray, length: int, mode: str, padding_mode: str, align_corners: int):
    """Per-axis taps: (indices, weights), each of shape coord.shape + (k,)."""
    if mode == "nearest":
        pos = np.rint(coord)[..., None]  # halfway rounds to the even index
        weights = np.ones_like(pos)
    elif mode == "linear":
        lo = np.floor(coord)
        t = coord - lo
        pos = lo[..., None] + np.array([0.0, 1.0])
        weights = np.stack([1 - t, t], axis=-1)
    elif mode == "cubic":
        lo = np.floor(coord)
        pos = lo[..., None] + np.array([-1.0, 0.0, 1.0, 2.0])
        weights = _cubic_weights(coord - lo)
    else:
        raise ValueError(f"GridSample: unknown mode {mode!r}")
    # far-away NaN/inf grid values: park them outside so zeros padding yields 0
    pos = np.nan_to_num(pos, nan=-(2**40), posinf=2**40, neginf=-(2**40))
    idx, valid = _pad_index(pos.astype(np.int64), length, padding_mode, align_corners)
    if valid is not None:
        weights = np.where(valid, weights, 0)
    return idx, weights


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    x = np.asarray(x)
    grid = np.asarray(grid)
    r = x.ndim - 2
    if r < 1:
        raise ValueError(f"GridSample: X must be (N, C, D1, ...), got shape {x.shape}")
    if grid.ndim != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
        raise ValueError(f"GridSample: grid shape {grid.shape} does not fit X shape {x.shape}")
    n, c = x.shape[:2]
    spatial = x.shape[2:]
    out_spatial = grid.shape[1:-1]
    out_dtype = x.dtype
    cdt = np.float64 if (x.dtype == np.float64 or grid.dtype == np.float64) else np.float32
    xw = _narrow.widen(x).astype(cdt, copy=False)
    g = _narrow.widen(grid).astype(cdt, copy=False).reshape(n, -1, r)  # (N, M, r)
    m = g.shape[1]
    if x.size == 0 or m == 0:
        return np.zeros((n, c) + tuple(out_spatial), dtype=out_dtype)
    taps = []
    for d in range(r):
        # the grid's last axis lists coordinates innermost-first: (x, y, z, ...)
        coord = _unnormalise(g[..., r - 1 - d], spatial[d], align_corners)
        taps.append(_axis_taps(coord, spatial[d], mode, padding_mode, align_corners))
    strides = np.cumprod((1,) + tuple(spatial[:0:-1]))[::-1]  # row-major strides of the spatial axes
    flat_x = xw.reshape(n, c, -1)
    batch = np.arange(n)[:, None]
    acc = np.zeros((n, m, c), dtype=cdt)
    for combo in itertools.product(*(range(t[0].shape[-1]) for t in taps)):
        flat = np.zeros((n, m), dtype=np.int64)
        w = np.ones((n, m), dtype=cdt)
        for d, k in enumerate(combo):
            idx, wt = taps[d]
            flat += idx[..., k] * strides[d]
            w = w * wt[..., k]
        acc += flat_x[batch, :, flat] * w[..., None]  # (N, M, C)
    y = np.moveaxis(acc, 2, 1).reshape((n, c) + tuple(out_spatial))
    if np.dtype(out_dtype).kind in "iu":
        info = np.iinfo(out_dtype)
        return np.clip(np.rint(y), info.min, info.max).astype(out_dtype)
    return y.astype(out_dtype)


@kernel("GridSample", since=16)
def grid_sample_16(x, grid, /, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    if x.ndim != 4:
        raise ValueError(f"GridSample-16: only 4-D input (N, C, H, W) is defined, got rank {x.ndim}")
    modes = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
    if mode not in modes:
        raise ValueError(f"GridSample: mode must be bilinear, nearest or bicubic, got {mode!r}")
    return _grid_sample(x, grid, modes[mode], padding_mode, align_corners)


@kernel("GridSample", since=20)
def grid_sample_20(x, grid, /, *, align_corners=0, mode="linear", padding_mode="zeros"):
    if mode not in ("linear", "nearest", "cubic"):
        raise ValueError(f"GridSample: mode must be linear, nearest or cubic, got {mode!r}")
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@kernel("GridSample", since=22)
def grid_sample_22(x, grid, /, *, align_corners=0, mode="linear", padding_mode="zeros"):
    return grid_sample_20(x, grid, align_corners=align_corners, mode=mode, padding_mode=padding_mode)


# --------------------------------------------------------------------------- AffineGrid


def _base_positions(length: int, align_corners: int, dtype) -> np.ndarray:
    # align_corners with a single position: the centre 0 (as torch's affine_grid)
    if align_corners:
        return np.linspace(-1, 1, length, dtype=np.float64).astype(dtype) if length > 1 \
            else np.zeros(length, dtype=dtype)
    return ((2 * np.arange(length, dtype=np.float64) + 1) / length - 1).astype(dtype)


@kernel("AffineGrid", since=20)
def affine_grid(theta, size, /, *, align_corners=0):
    theta = np.asarray(theta)
    size = [int(v) for v in np.asarray(size).reshape(-1)]
    if len(size) not in (4, 5):
        raise ValueError(f"AffineGrid: size must be (N, C, H, W) or (N, C, D, H, W), got {size}")
    r = len(size) - 2
    n = size[0]
    if theta.shape != (n, r, r + 1):
        raise ValueError(f"AffineGrid: theta shape {theta.shape} must be ({n}, {r}, {r + 1}) for size {size}")
    out_dtype = theta.dtype
    cdt = np.float64 if theta.dtype == np.float64 else np.float32
    spatial = size[2:]
    check_alloc([n] + [max(s, 0) for s in spatial] + [r + 1], np.float64, "AffineGrid output")
    # per-axis positions; homogeneous coordinates listed innermost axis first (x, y[, z], 1)
    axes = [_base_positions(length, align_corners, cdt) for length in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")  # each of shape spatial
    base = np.stack(list(mesh[::-1]) + [np.ones(spatial, dtype=cdt)], axis=-1)  # spatial + (r + 1,)
    base = base.reshape(-1, r + 1)
    th = _narrow.widen(theta).astype(cdt, copy=False)
    grid = np.einsum("pk,njk->npj", base, th)  # (N, P, r)
    return grid.reshape([n] + spatial + [r]).astype(out_dtype)
