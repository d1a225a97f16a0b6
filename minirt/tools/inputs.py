"""Make input feeds for a session: from ``.npy`` files, or random ones matching its signature.

Used by ``minirt run``, ``minirt bench`` and ``minirt demo``::

    given = load_input_specs(["image=batch.npy"])     # --input
    dims = parse_dim_specs(["batch=4"])                # --dim
    feed = make_feed(session.get_inputs(), given, dims, seed=0)

Inputs not given explicitly are random: float -> standard normal, integers ->
small non-negative values (``0 <= x < INT_HIGH``), bool -> coin flips,
string -> short strings.  Symbolic dimensions take their value from ``--dim``,
then from an explicitly given input that uses the same symbol, then default
to 1; unknown (unnamed) dimensions are 1.

Every user mistake raises :class:`minirt.InvalidArgument` with a message
naming the offending spec.  Dtype and shape checks of the arrays themselves
are left to the session, which explains mismatches against the model.
"""
from __future__ import annotations

import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from minirt.dtypes import ONNX_TO_NUMPY, onnx_type_name
from minirt.errors import InvalidArgument

INT_HIGH = 8  # random integer inputs are drawn from [0, INT_HIGH)

# 'float' -> float32, as in the NodeArg type string 'tensor(float)'.
_TYPE_NAME_TO_NUMPY = {onnx_type_name(code): dt for code, dt in ONNX_TO_NUMPY.items()}


def input_dtype(arg) -> np.dtype | None:
    """The numpy dtype of a session input (a ``NodeArg``), ``None`` if unknown."""
    t = str(arg.type)
    name = t[len("tensor(") : -1] if t.startswith("tensor(") and t.endswith(")") else t
    return _TYPE_NAME_TO_NUMPY.get(name)


def _split_spec(spec: str, option: str, example: str) -> tuple[str, str]:
    name, sep, value = str(spec).partition("=")
    if not sep or not name or not value:
        raise InvalidArgument(f"{option} {spec!r}: expected {example}")
    return name, value


def parse_dim_specs(specs: Iterable[str] | None) -> dict[str, int]:
    """``["batch=4", "seq=16"]`` -> ``{"batch": 4, "seq": 16}``."""
    out: dict[str, int] = {}
    for spec in specs or ():
        name, value = _split_spec(spec, "--dim", "SYMBOL=N, e.g. batch=4")
        try:
            n = int(value)
        except ValueError:
            raise InvalidArgument(f"--dim {spec!r}: {value!r} is not an integer") from None
        if n < 0:
            raise InvalidArgument(f"--dim {spec!r}: a dimension must be >= 0")
        out[name] = n
    return out


def parse_shape_specs(specs: Iterable[str] | None) -> dict[str, tuple[int, ...]]:
    """``["x=1x3x48x192"]`` -> ``{"x": (1, 3, 48, 192)}`` (``--shape``)."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs or ():
        name, value = _split_spec(spec, "--shape", "NAME=DIMxDIM..., e.g. x=1x3x48x192")
        try:
            shape = tuple(int(d) for d in value.split("x")) if value else ()
        except ValueError:
            raise InvalidArgument(f"--shape {spec!r}: {value!r} is not a list of integers joined by 'x'") from None
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"--shape {spec!r}: dimensions must be >= 0")
        out[name] = shape
    return out


def load_array(path: str, name: str) -> np.ndarray:
    """Read input ``name`` from a ``.npy`` file (or from a ``.npz`` holding ``name`` or a single array)."""
    if not os.path.exists(path):
        raise InvalidArgument(f"--input {name}={path}: no such file")
    if os.path.isdir(path):
        raise InvalidArgument(f"--input {name}={path}: is a directory, expected a .npy file")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InvalidArgument(f"--input {name}={path}: not a readable .npy/.npz file ({exc})") from None
    if isinstance(loaded, np.ndarray):
        return loaded
    with loaded:  # NpzFile
        keys = list(loaded.files)
        if name in keys:
            return loaded[name]
        if len(keys) == 1:
            return loaded[keys[0]]
        raise InvalidArgument(f"--input {name}={path}: the .npz has no array {name!r} (it holds {keys})")


def load_input_specs(specs: Iterable[str] | None) -> dict[str, np.ndarray]:
    """``["image=x.npy"]`` -> ``{"image": array}``."""
    out: dict[str, np.ndarray] = {}
    for spec in specs or ():
        name, path = _split_spec(spec, "--input", "NAME=FILE.npy, e.g. image=batch.npy")
        if name in out:
            raise InvalidArgument(f"--input {name!r} is given twice")
        out[name] = load_array(path, name)
    return out


def resolve_shape(arg, dims: Mapping[str, int]) -> tuple[int, ...]:
    """Concrete shape for a session input: fixed dims kept, symbols from ``dims`` (default 1)."""
    if arg.shape is None:
        raise InvalidArgument(f"input {arg.name!r} has an unknown rank; give it explicitly with --input {arg.name}=FILE.npy")
    out = []
    for d in arg.shape:
        if isinstance(d, int):
            out.append(d)
        elif isinstance(d, str):
            out.append(int(dims.get(d, 1)))
        else:
            out.append(1)
    return tuple(out)


def random_array(shape: Sequence[int], dtype: np.dtype | None, rng: np.random.Generator) -> np.ndarray:
    """A random array of ``shape``/``dtype`` (unknown dtype -> float32)."""
    dt = np.dtype(np.float32) if dtype is None else np.dtype(dtype)
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind in "iu":
        return rng.integers(0, INT_HIGH, size=shape).astype(dt)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind == "O":
        letters = np.array(list("abcdefgh"), dtype=object)
        return letters[rng.integers(0, len(letters), size=shape)]
    raise InvalidArgument(f"cannot make random inputs of dtype {dt}; pass the input with --input NAME=FILE.npy")


def _symbols_from_given(args: Sequence, given: Mapping[str, np.ndarray]) -> dict[str, int]:
    found: dict[str, int] = {}
    for arg in args:
        arr = given.get(arg.name)
        if arr is None or arg.shape is None or len(arg.shape) != arr.ndim:
            continue
        for want, got in zip(arg.shape, arr.shape):
            if isinstance(want, str):
                found.setdefault(want, int(got))
    return found


def make_feed(
    args: Sequence,
    given: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int | None = 0,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """A feed for inputs ``args`` (``session.get_inputs()``): ``given`` arrays plus random ones.

    Names in ``given`` that the model does not have are passed through, so
    the session reports them with the list of the model's inputs.
    """
    given = dict(given or {})
    dims = dict(dims or {})
    shapes = dict(shapes or {})
    names = {a.name for a in args}
    stray = sorted(set(shapes) - names)
    if stray:
        raise InvalidArgument(f"--shape names {stray}, but the model's inputs are {sorted(names)}")
    symbols = {d for a in args if a.shape is not None for d in a.shape if isinstance(d, str)}
    unknown = sorted(set(dims) - symbols)
    if unknown:
        known = ", ".join(sorted(symbols)) or "none: every dimension is fixed"
        raise InvalidArgument(f"--dim names {unknown}, which no input uses (symbolic dimensions: {known})")
    resolved = {**_symbols_from_given(args, given), **dims}
    # a --shape that contradicts a --dim for one of the input's symbolic dimensions: say so (neither wins)
    for arg in args:
        if arg.name in shapes and arg.shape is not None and len(arg.shape) == len(shapes[arg.name]):
            for axis, (sym, size) in enumerate(zip(arg.shape, shapes[arg.name])):
                if isinstance(sym, str) and sym in dims and dims[sym] != size:
                    raise InvalidArgument(
                        f"--shape {arg.name}: dimension {axis} is {size}, but --dim {sym}={dims[sym]} sets that "
                        f"dimension ({sym!r}) to {dims[sym]}; give one or make them agree")
    rng = np.random.default_rng(seed)
    feed: dict[str, np.ndarray] = {}
    for arg in args:
        if arg.name in given:
            feed[arg.name] = given.pop(arg.name)
        elif arg.name in shapes:
            feed[arg.name] = random_array(shapes[arg.name], input_dtype(arg), rng)
        else:
            feed[arg.name] = random_array(resolve_shape(arg, resolved), input_dtype(arg), rng)
    feed.update(given)  # unknown names: the session names the model's real inputs
    return feed


def describe(arr: np.ndarray) -> str:
    """``float32[1, 3, 224, 224]``."""
    return f"{arr.dtype}[{', '.join(str(d) for d in arr.shape)}]"
