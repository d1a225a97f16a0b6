"""DeformConv: convolution whose kernel taps are displaced by learned offsets.

For every output position and kernel tap the input is sampled (N-linear
interpolation, zero outside the input) at the tap's regular position plus
its offset and scaled by the optional mask; the sampled columns are then
contracted with the weights per group, exactly like an im2col convolution.
All taps, positions and offset groups are sampled in one vectorised gather
per interpolation corner (2**rank of them), for any number of spatial axes.
"""
from __future__ import annotations

import itertools

import numpy as np

from minirt.kernels import _narrow
from minirt.kernels.nn import _geometry, _per_axis
from minirt.kernels.registry import kernel
from minirt.kernels.sampling import _axis_taps


def _deform_conv(x, w, offset, b, mask, dilations, group, kernel_shape, offset_group, pads, strides):
    x, w, offset = np.asarray(x), np.asarray(w), np.asarray(offset)
    r = x.ndim - 2
    if r < 1 or w.ndim != x.ndim:
        raise ValueError(f"DeformConv: X {x.shape} and W {w.shape} must be (N, C, D1, ...) / (oC, C/group, k1, ...)")
    n, c = x.shape[:2]
    oc = w.shape[0]
    spatial = x.shape[2:]
    k = tuple(kernel_shape) if kernel_shape else tuple(w.shape[2:])
    if tuple(int(v) for v in k) != tuple(w.shape[2:]):
        raise ValueError(f"DeformConv: kernel_shape {list(k)} does not match W shape {w.shape}")
    k = tuple(int(v) for v in k)
    s = _per_axis("DeformConv", "strides", strides, r, 1)
    d = _per_axis("DeformConv", "dilations", dilations, r, 1)
    if group < 1 or c % group or oc % group or w.shape[1] != c // group:
        raise ValueError(f"DeformConv: group {group} does not fit C={c}, oC={oc}, W shape {w.shape}")
    if offset_group < 1 or c % offset_group:
        raise ValueError(f"DeformConv: offset_group {offset_group} must divide C={c}")
    out, pb, _ = _geometry("DeformConv", spatial, k, s, d, pads, "NOTSET")
    kp = int(np.prod(k))
    m = int(np.prod(out))
    if offset.shape != (n, offset_group * kp * r) + tuple(out):
        raise ValueError(f"DeformConv: offset shape {offset.shape} must be "
                         f"{(n, offset_group * kp * r) + tuple(out)}")
    cdt = np.float64 if x.dtype == np.float64 else np.float32
    # regular sampling positions: (K, M, r) pixel coordinates
    grids = np.meshgrid(*(np.arange(o) for o in out), indexing="ij")
    taps = np.array(list(itertools.product(*(range(ki) for ki in k))), dtype=np.float64).reshape(kp, r)
    base = np.stack([g.reshape(-1) * si - pi for g, si, pi in zip(grids, s, pb)], axis=-1)  # (M, r)
    regular = base[None, :, :] + taps[:, None, :] * np.array(d, dtype=np.float64)  # (K, M, r)
    off = _narrow.widen(offset).astype(np.float64).reshape(n, offset_group, kp, r, m)
    coords = regular[None, None] + np.moveaxis(off, 3, 4)  # (N, G, K, M, r)
    axis_taps = [_axis_taps(coords[..., a], spatial[a], "linear", "zeros", 0) for a in range(r)]
    strides_sp = np.cumprod((1,) + tuple(spatial[:0:-1]))[::-1]
    cg = c // offset_group
    img = _narrow.widen(x).astype(cdt, copy=False).reshape(n, offset_group, cg, -1)  # (N, G, Cg, P)
    bi = np.arange(n)[:, None, None]
    gi = np.arange(offset_group)[None, :, None]
    cols = np.zeros((n, offset_group, kp * m, cg), dtype=cdt)
    for corner in itertools.product((0, 1), repeat=r):
        flat = np.zeros(coords.shape[:-1], dtype=np.int64)
        wt = np.ones(coords.shape[:-1], dtype=cdt)
        for a, j in enumerate(corner):
            idx, wa = axis_taps[a]
            flat += idx[..., j] * strides_sp[a]
            wt = wt * wa[..., j]
        vals = img[bi, gi, :, flat.reshape(n, offset_group, -1)]  # (N, G, K*M, Cg)
        cols += vals * wt.reshape(n, offset_group, -1)[..., None]
    if mask is not None:
        mk = _narrow.widen(np.asarray(mask)).astype(cdt)
        if mk.shape != (n, offset_group * kp) + tuple(out):
            raise ValueError(f"DeformConv: mask shape {mk.shape} must be {(n, offset_group * kp) + tuple(out)}")
        cols *= mk.reshape(n, offset_group, kp * m, 1)
    # (N, G, K, M, Cg) -> (N, C, K, M) -> per convolution group (N, group, C/group * K, M)
    cols = np.moveaxis(cols.reshape(n, offset_group, kp, m, cg), 4, 2).reshape(n, c, kp, m)
    cols = cols.reshape(n, group, (c // group) * kp, m)
    wg = _narrow.widen(w).astype(cdt, copy=False).reshape(group, oc // group, (c // group) * kp)
    y = np.matmul(wg[None], cols).reshape(n, oc, m)  # (N, group, oC/group, M)
    if b is not None:
        y = y + _narrow.widen(np.asarray(b)).astype(cdt).reshape(1, oc, 1)
    return y.reshape((n, oc) + tuple(out)).astype(x.dtype)


@kernel("DeformConv", since=19)
def deform_conv_19(x, w, offset, b=None, mask=None, /, *, dilations=(), group=1, kernel_shape=(), offset_group=1,
                   pads=(), strides=()):
    return _deform_conv(x, w, offset, b, mask, dilations, group, kernel_shape, offset_group, pads, strides)


@kernel("DeformConv", since=22)
def deform_conv_22(x, w, offset, b=None, mask=None, /, *, dilations=(), group=1, kernel_shape=(), offset_group=1,
                   pads=(), strides=()):
    return _deform_conv(x, w, offset, b, mask, dilations, group, kernel_shape, offset_group, pads, strides)
