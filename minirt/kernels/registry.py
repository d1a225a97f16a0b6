"""Kernel registry: maps (domain, op_type, since-version) to a CPU kernel.

A kernel is a plain function.  ONNX inputs arrive positionally (``None`` for
an absent optional input), ONNX attributes arrive as keyword arguments whose
Python defaults are the schema defaults.  A kernel returns one ``np.ndarray``
or a tuple of them (one per ONNX output, in order).

Registration is explicit::

    @kernel("Relu", since=6)
    def relu(x):
        return np.maximum(x, x.dtype.type(0))

Lookup for a model whose opset for the domain is ``v`` takes the entry with
the largest ``since`` that is not above ``v`` (the same rule ONNX uses to pick
an operator schema), so a later opset that changed semantics registers a new
function with a higher ``since`` and older models keep the old behaviour.

Kernels that need to know about the node itself (how many outputs it has,
the declared dtypes of its outputs) register with ``context=True`` and
receive a :class:`NodeContext` as the keyword argument ``ctx``.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable, Iterable

KernelFn = Callable[..., object]


@dataclasses.dataclass(frozen=True)
class NodeContext:
    """What a ``context=True`` kernel learns about the node it runs."""

    name: str
    op_type: str
    n_outputs: int
    output_dtypes: tuple  # numpy dtypes (or None where unknown), one per output
    opset: int


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    domain: str
    op_type: str
    since: int
    fn: KernelFn
    context: bool
    # Names of keyword parameters the function accepts (the ONNX attributes it
    # understands).  ``None`` means it takes **kwargs and accepts anything.
    attributes: frozenset | None
    # Leading positional parameters without a default: ONNX inputs that must be present.
    required_inputs: int = 0


# (domain, op_type) -> entries sorted by ascending ``since``
_REGISTRY: dict[tuple[str, str], list[KernelEntry]] = {}


def _accepted_attributes(fn: KernelFn, context: bool) -> frozenset | None:
    names = set()
    for param in inspect.signature(fn).parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            return None
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            names.add(param.name)
        elif param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and param.default is not inspect.Parameter.empty:
            names.add(param.name)
    if context:
        names.discard("ctx")
    return frozenset(names)


def _required_inputs(fn: KernelFn) -> int:
    n = 0
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) and (
            param.default is inspect.Parameter.empty
        ):
            n += 1
        else:
            break
    return n


def kernel(op_type: str, since: int = 1, domain: str = "", context: bool = False) -> Callable[[KernelFn], KernelFn]:
    """Register ``fn`` as the CPU kernel for ``domain::op_type`` from opset ``since``."""

    def register(fn: KernelFn) -> KernelFn:
        entry = KernelEntry(
            domain, op_type, since, fn, context, _accepted_attributes(fn, context), _required_inputs(fn)
        )
        entries = _REGISTRY.setdefault((domain, op_type), [])
        if any(e.since == since for e in entries):
            raise RuntimeError(f"kernel {domain or 'ai.onnx'}::{op_type} since {since} registered twice")
        entries.append(entry)
        entries.sort(key=lambda e: e.since)
        return fn

    return register


def _normalise_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def lookup(domain: str, op_type: str, opset: int) -> KernelEntry | None:
    """The kernel for ``op_type`` at ``opset``, or ``None`` if there is none."""
    from minirt import kernels  # noqa: F401  (importing the package registers every kernel)

    entries = _REGISTRY.get((_normalise_domain(domain), op_type))
    if not entries:
        return None
    best = None
    for entry in entries:
        if entry.since <= opset:
            best = entry
    return best


def registered() -> Iterable[KernelEntry]:
    """Every registered kernel, in a stable order (for the coverage table)."""
    from minirt import kernels  # noqa: F401

    for key in sorted(_REGISTRY):
        yield from _REGISTRY[key]
