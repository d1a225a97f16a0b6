"""The registry reads a kernel's attribute names and required inputs from its code object (D165):
the same answers as inspect.signature, for every registered kernel and for wrapped callables."""
from __future__ import annotations

import functools
import inspect

from minirt.kernels import registry as R


def _by_inspect(fn, context: bool):
    names, required, counting = set(), 0, True
    for p in inspect.signature(fn).parameters.values():
        positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        if counting and positional and p.default is p.empty:
            required += 1
        else:
            counting = False
        if p.kind is p.VAR_KEYWORD:
            names = None
        elif names is not None and (p.kind is p.KEYWORD_ONLY
                                    or p.kind is p.POSITIONAL_OR_KEYWORD and p.default is not p.empty):
            names.add(p.name)
    if names is not None and context:
        names.discard("ctx")
    return (None if names is None else frozenset(names)), required


def test_every_registered_kernel_agrees_with_inspect():
    R._import_all()
    entries = [e for es in R._REGISTRY.values() for e in es]
    assert len(entries) > 300
    for e in entries:
        got = (R._accepted_attributes(e.fn, e.context), R._required_inputs(e.fn))
        assert got == _by_inspect(e.fn, e.context), e


def _kernel(x, y, /, z, w=1.0, *rest, alpha=0.5, beta, ctx=None):
    return x


def _takes_anything(x, **attrs):
    return x


def test_signature_shapes():
    assert (R._accepted_attributes(_kernel, True), R._required_inputs(_kernel)) == _by_inspect(_kernel, True)
    assert R._accepted_attributes(_kernel, True) == {"w", "alpha", "beta"}
    assert R._required_inputs(_kernel) == 3
    assert R._accepted_attributes(_takes_anything, False) is None
    partial = functools.partial(_kernel, 1)  # (no code object: inspect answers)
    assert (R._accepted_attributes(partial, False), R._required_inputs(partial)) == _by_inspect(partial, False)

    @functools.wraps(_takes_anything)
    def wrapper(*args, **kwargs):  # (carries __wrapped__: the wrapped function's signature counts)
        return _takes_anything(*args, **kwargs)

    assert R._accepted_attributes(wrapper, False) is None and R._required_inputs(wrapper) == 1
