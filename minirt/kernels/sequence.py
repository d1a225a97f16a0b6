"""Sequence and optional operators.

A sequence value is a Python ``list`` of arrays; an optional value is either
its element (array or list) or ``None`` when empty.  Kernels return their
result wrapped in a 1-tuple so a list is never taken as several outputs.
"""
from __future__ import annotations

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY
from minirt.kernels.registry import kernel


def _pos(position, n: int, allow_end: bool) -> int:
    p = int(np.asarray(position).reshape(-1)[0])
    if p < 0:
        p += n
    hi = n if allow_end else n - 1
    if p < 0 or p > hi:
        raise IndexError(f"sequence position {int(np.asarray(position).reshape(-1)[0])} out of range for length {n}")
    return p


@kernel("SequenceEmpty", since=11)
def sequence_empty(dtype=1):
    _ = ONNX_TO_NUMPY.get(int(dtype))
    return ([],)


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs):
    return (list(inputs),)


@kernel("SequenceInsert", since=11)
def sequence_insert(input_sequence, tensor, position=None):
    seq = list(input_sequence)
    if position is None:
        seq.append(tensor)
    else:
        seq.insert(_pos(position, len(seq), allow_end=True), tensor)
    return (seq,)


@kernel("SequenceAt", since=11)
def sequence_at(input_sequence, position):
    return input_sequence[_pos(position, len(input_sequence), allow_end=False)]


@kernel("SequenceErase", since=11)
def sequence_erase(input_sequence, position=None):
    seq = list(input_sequence)
    p = len(seq) - 1 if position is None else _pos(position, len(seq), allow_end=False)
    del seq[p]
    return (seq,)


@kernel("SequenceLength", since=11)
def sequence_length(input_sequence):
    return np.array(len(input_sequence), dtype=np.int64)


@kernel("SplitToSequence", since=11)
def split_to_sequence(input, split=None, axis=0, keepdims=1):
    x = np.asarray(input)
    ax = axis + x.ndim if axis < 0 else axis
    n = x.shape[ax]
    if split is None:
        parts = [np.take(x, [i], axis=ax) for i in range(n)]
        if not keepdims:
            parts = [np.squeeze(p, axis=ax) for p in parts]
        return (parts,)
    split = np.asarray(split).astype(np.int64)
    if split.ndim == 0:
        size = int(split)
        bounds = list(range(size, n, size))
    else:
        if int(split.sum()) != n:
            raise ValueError(f"SplitToSequence: split sizes {split.tolist()} do not add up to {n}")
        bounds = list(np.cumsum(split)[:-1])
    return (list(np.split(x, bounds, axis=ax)),)


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(input_sequence, axis=0, new_axis=0):
    arrays = [np.asarray(a) for a in input_sequence]
    if new_axis:
        ax = axis + arrays[0].ndim + 1 if axis < 0 else axis
        return np.stack(arrays, axis=ax)
    return np.concatenate(arrays, axis=axis)


@kernel("SequenceMap", since=17)
def sequence_map(input_sequence, *additional_inputs, body=None):
    n = len(input_sequence)
    results: list[list] | None = None
    for i in range(n):
        args = [input_sequence[i]]
        for extra in additional_inputs:
            args.append(extra[i] if isinstance(extra, list) else extra)
        outs = body.run(*args)
        if results is None:
            results = [[] for _ in outs]
        for r, o in zip(results, outs):
            r.append(o)
    if results is None:
        results = [[] for _ in body.output_names]
    return tuple(results)


# --------------------------------------------------------------------------- optionals


@kernel("Optional", since=15)
def optional(input=None, type=None):  # noqa: A002 - ONNX attribute name
    return (input,)


@kernel("OptionalHasElement", since=15)
def optional_has_element(input=None):  # noqa: A002
    return np.array(input is not None, dtype=np.bool_)


@kernel("OptionalGetElement", since=15)
def optional_get_element(input):  # noqa: A002
    if input is None:
        raise ValueError("OptionalGetElement: the optional is empty")
    return (input,)
