"""The build options a sweep can search, as ``minirt build`` / :func:`minirt.builder.build` take them.

One table, :data:`OPTIONS`: each option's name (the config key, the ``build()`` keyword), what values
it takes, its default (``build()``'s, except ``quantize``: ``none`` builds float32 on every target, as
``--quantize none`` does), and the quantization modes it matters in (:data:`RELEVANT`).  A candidate's
options are *canonical*: the options that do not matter for its mode are left out (a float build has
no calibration method), so two points of the search space that build the same artifact are one
candidate, built once.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable

from minirt.builder.errors import BuildError
from minirt.builder.quantize.calibration import METHODS
from minirt.builder.quantize.sensitivity import parse_budget

QUANTIZE = ("none", "fp16", "int8-dynamic", "int8", "auto")
OPT_LEVELS = (0, 1, 2, 3)
WEIGHT_PACKS = ("target", 0, 8, 16, 32)  # "target": the target profile's default (build()'s None)


class OptionValueError(ValueError):
    """A value an option does not take; the message says what was expected."""


def _choice(allowed: tuple) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        # (bool is an int: True must not pass for opt_level 1)
        if isinstance(value, bool) or value not in allowed:
            raise OptionValueError(f"unknown value {value!r}")
        return value

    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise OptionValueError(f"unknown value {value!r}")
    return value


def _budget(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "default"):
        return None  # the builder's default budget (cosine>=0.99 for int8, max-abs<=0.005 for fp16)
    if not isinstance(value, str):
        raise OptionValueError(f"{value!r} is not a budget string")
    try:
        parsed = parse_budget(value)
    except BuildError:
        raise OptionValueError(f"{value!r} is not an accuracy budget (top1-drop<=X, accuracy-drop<=X, cosine>=X, "
                               "max-abs<=X or mean-abs<=X)") from None
    return "none" if parsed is None else parsed.spec


def _shape(text: Any) -> list[int]:
    if isinstance(text, str):
        parts = text.replace(",", "x").split("x")
    elif isinstance(text, (list, tuple)):
        parts = list(text)
    else:
        raise OptionValueError(f"{text!r} is not a shape (expected e.g. \"1x3x48x192\" or [1, 3, 48, 192])")
    try:
        dims = [int(p) for p in parts]
    except (TypeError, ValueError):
        raise OptionValueError(f"{text!r} is not a shape (expected e.g. \"1x3x48x192\" or [1, 3, 48, 192])") from None
    if any(isinstance(p, bool) for p in parts) or any(d < 0 for d in dims):
        raise OptionValueError(f"{text!r}: dimensions must be integers >= 0")
    return dims


def _input_shapes(value: Any) -> dict[str, list[int]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OptionValueError(f"{value!r} is not a table of input name -> shape (e.g. {{x = \"1x3x48x192\"}})")
    return {str(k): _shape(v) for k, v in sorted(value.items())}


def _input_values(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OptionValueError(f"{value!r} is not a table of input name -> value (e.g. {{sr = 16000}})")
    for k, v in value.items():
        items = v if isinstance(v, list) else [v]
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in items):
            raise OptionValueError(f"{k} = {v!r}: expected a number or a list of numbers")
    return dict(sorted(value.items()))


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    check: Callable[[Any], Any]  # value -> canonical value, OptionValueError otherwise
    default: Any
    expected: str  # for messages


OPTIONS: dict[str, Option] = {o.name: o for o in (
    Option("quantize", _choice(QUANTIZE), "none", f"one of {', '.join(QUANTIZE)}"),
    Option("calibration_method", _choice(METHODS), "minmax", f"one of {', '.join(METHODS)}"),
    Option("per_channel", _bool, True, "true or false"),
    Option("symmetric_activations", _bool, False, "true or false"),
    Option("accuracy_budget", _budget, None, "none, default or a budget such as cosine>=0.99 or top1-drop<=1"),
    Option("opt_level", _choice(OPT_LEVELS), 2, "one of 0, 1, 2, 3"),
    Option("input_shapes", _input_shapes, {}, "a table of input name -> shape such as \"1x3x48x192\""),
    Option("quantize_final", _bool, True, "true or false"),
    Option("weight_pack", _choice(WEIGHT_PACKS), "target", "one of target, 0, 8, 16, 32"),
)}
# Options a model may fix (its ``options`` table) but a space does not search.
FIXED_ONLY: dict[str, Option] = {
    "input_values": Option("input_values", _input_values, {}, "a table of input name -> number(s)"),
}

_ALWAYS = {"quantize", "opt_level", "input_shapes", "weight_pack"}
# quantization mode -> the options that change its artifact
RELEVANT: dict[str, frozenset] = {
    "none": frozenset(_ALWAYS),
    "fp16": frozenset(_ALWAYS | {"accuracy_budget"}),
    "int8-dynamic": frozenset(_ALWAYS | {"per_channel", "accuracy_budget", "quantize_final"}),
    "int8": frozenset(OPTIONS),
    "auto": frozenset(OPTIONS),  # (the target decides the mode: any of them may matter)
}


def check_value(name: str, value: Any) -> Any:
    """The canonical form of ``value`` for option ``name``; KeyError for an unknown option,
    OptionValueError for a value it does not take."""
    option = OPTIONS.get(name) or FIXED_ONLY[name]
    return option.check(value)


def canonical(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (checked values) completed with the defaults, without the options that do not matter
    for its quantization mode, in the table's order."""
    full = {name: options.get(name, opt.default) for name, opt in OPTIONS.items()}
    keep = RELEVANT[full["quantize"]]
    return {name: value for name, value in full.items() if name in keep}


def canonical_json(obj: Any) -> str:
    """One text for equal values: the basis of candidate identity and of the cache keys."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def build_kwargs(options: dict[str, Any], fixed: dict[str, Any]) -> dict[str, Any]:
    """Canonical candidate options (+ the model's fixed ones) -> keyword arguments of ``build()``."""
    full = {name: opt.default for name, opt in OPTIONS.items()}
    full.update(options)
    kwargs = {
        "quantize": full["quantize"],
        "opt_level": full["opt_level"],
        "input_shapes": {k: tuple(v) for k, v in full["input_shapes"].items()} or None,
        "weight_pack": None if full["weight_pack"] == "target" else full["weight_pack"],
        "calibration_method": full["calibration_method"],
        "per_channel": full["per_channel"],
        "symmetric_activations": full["symmetric_activations"],
        "accuracy_budget": full["accuracy_budget"],
        "quantize_final": full["quantize_final"],
    }
    if fixed.get("input_values"):
        kwargs["input_values"] = dict(fixed["input_values"])
    return kwargs


def describe(options: dict[str, Any]) -> str:
    """A short label: ``int8 entropy per-tensor budget=none O1 x=1x3x48x160``."""
    parts = [options["quantize"]]
    if "calibration_method" in options:
        parts.append(options["calibration_method"])
    if "per_channel" in options:
        parts.append("per-channel" if options["per_channel"] else "per-tensor")
    if options.get("symmetric_activations"):
        parts.append("sym")
    if "accuracy_budget" in options:
        parts.append(f"budget={options['accuracy_budget'] or 'default'}")
    if not options.get("quantize_final", True):
        parts.append("float-final")
    parts.append(f"O{options['opt_level']}")
    if options.get("weight_pack", "target") != "target":
        parts.append(f"pack{options['weight_pack']}")
    for name, shape in options.get("input_shapes", {}).items():
        parts.append(f"{name}={'x'.join(str(d) for d in shape)}")
    return " ".join(parts)
