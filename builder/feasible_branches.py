"""Pin a scalar input when the fixed input shapes leave an ``If`` only one branch that can run.

Silero VAD v5 as its wheel ships it holds its whole model in ``If(sr == 16000)``: the then-branch for
16 kHz audio, the else-branch for 8 kHz.  Built with ``--input-shape input=1x512`` (a 16 kHz window),
the 8 kHz branch cannot run at all (it squeezes an axis of length 2), so every run the artifact can do
takes the then-branch; yet the condition is data, the If stays, and an accelerator target gets none
of the model (control flow stays on the CPU, and the If's outputs have no shapes).

Rule (run by the builder after ``--input-shape``, before ``--input-value`` pins):

* a top-level ``If`` whose condition is ``X == c`` for a model input ``X`` of one integer or bool
  element and a one-element constant ``c`` (through Cast / Identity / Reshape / Squeeze / Unsqueeze
  and Not on either side), or ``X`` itself when it is bool, and ``X`` not pinned by the user;
* every other model input has a fully static shape (a run can be made up);
* onnxruntime runs the source model (with the fixed shapes) once per branch, ``X`` set to a value
  that takes it, the other inputs zeros and then ones: a branch whose runs both fail cannot run with
  these shapes, one whose runs both succeed can;
* exactly one branch can run, and one value of ``X`` takes it -> ``X`` is pinned to that value, as
  ``--input-value X=value`` would: the If folds into its branch, the shapes become static, and the
  runtime refuses a run that feeds another value (which the source model could not run either), with
  the reason stored beside the pinned value.

Anything else (no onnxruntime, both branches can run, neither can, the branch that can is taken by
many values such as ``X != c``, two Ifs wanting different values) pins nothing.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import numpy as np
import onnx_ir as ir

from minirt.builder import ir_helpers as irh

# Ops that pass a value through unchanged (for the trace from a condition back to an input)
_PASS_THROUGH = ("Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze")


@dataclasses.dataclass(frozen=True)
class BranchPin:
    """An input pinned because only one branch of an If can run with the fixed input shapes."""

    name: str  # the input
    value: Any  # the value that takes the branch that can run
    reason: str  # what the runtime's refusal and the build log say


@dataclasses.dataclass(frozen=True)
class _Condition:
    """``If`` ``node``'s condition as a function of one input: ``taken[branch]`` is the value of ``input``
    that takes that branch, or None when many values take it (``X != c``); ``tries[branch]`` one value
    that takes it (for the trial runs); ``text`` the condition as the log shows it."""

    node: ir.Node
    input: ir.Value
    taken: dict
    tries: dict
    text: str


def _through(value: ir.Value) -> ir.Value:
    """``value`` followed back through pass-through ops to where it comes from."""
    while True:
        producer = value.producer()
        if producer is None or not irh.is_onnx(producer, *_PASS_THROUGH) or not producer.inputs:
            return value
        value = producer.inputs[0]


def _scalar_input(value: ir.Value, graph: ir.Graph) -> ir.Value | None:
    """The model input behind ``value`` when it is one of integer or bool element type and one element."""
    source = _through(value)
    if source not in graph.inputs or source.dtype is None:
        return None
    shape = irh.static_shape(source)
    if source.shape is not None and shape is None:
        return None  # (a symbolic dimension: not known to be one element)
    if shape is not None and int(np.prod(shape)) != 1:
        return None
    kind = np.dtype(source.dtype.numpy()).kind
    return source if kind in "iub" else None


def _condition(node: ir.Node, graph: ir.Graph) -> _Condition | None:
    """The If's condition as ``X == c`` (or its negation), or a bool input ``X``; None otherwise."""
    value, negated = node.inputs[0], False
    while True:
        value = _through(value)
        producer = value.producer()
        if producer is not None and irh.is_onnx(producer, "Not") and producer.inputs:
            value, negated = producer.inputs[0], not negated
            continue
        break
    producer = value.producer()
    if producer is None:
        x = _scalar_input(value, graph)
        if x is None or np.dtype(x.dtype.numpy()).kind != "b":
            return None
        values = {"then_branch": not negated, "else_branch": negated}  # (each branch taken by one value)
        return _Condition(node, x, values, values, f"{'not ' if negated else ''}{x.name}")
    if not irh.is_onnx(producer, "Equal") or len(producer.inputs) != 2:
        return None
    for side, other in ((producer.inputs[0], producer.inputs[1]), (producer.inputs[1], producer.inputs[0])):
        x = _scalar_input(side, graph) if side is not None else None
        c = irh.const_array(_through(other)) if other is not None else None
        if x is None or c is None or c.size != 1 or c.dtype.kind not in "iub":
            continue
        dtype = np.dtype(x.dtype.numpy())
        equal = c.reshape(-1)[0].astype(dtype).item()
        differ = (not equal) if dtype.kind == "b" else equal + 1
        eq_branch, ne_branch = ("else_branch", "then_branch") if negated else ("then_branch", "else_branch")
        # (a bool input: "not equal" is one value too)
        taken = {eq_branch: equal, ne_branch: differ if dtype.kind == "b" else None}
        text = f"{x.name} {'!=' if negated else '=='} {equal}"
        return _Condition(node, x, taken, {eq_branch: equal, ne_branch: differ}, text)
    return None


def _runner(model: ir.Model) -> Callable[[dict], str | None] | None:
    """A function that runs the model under onnxruntime on a feed and returns None, or its error reduced to
    the node that failed (:func:`_innermost`); None without onnxruntime or when it cannot load the model."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    try:
        proto = ir.serde.serialize_model(model)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - a model onnxruntime cannot load: no trial runs, no pins
        return None

    def run(feed: dict) -> str | None:
        try:
            session.run(None, feed)
        except Exception as exc:  # noqa: BLE001 - the failure is the answer
            return _innermost(str(exc)) or type(exc).__name__
        return None

    return run


def _innermost(message: str) -> str:
    """onnxruntime's error reduced to the node that failed and why: an error inside an If's branch is
    nested once per enclosing If ("... running If node. Name:'If_0' Status Message: ... running LSTM
    node. Name:'lstm' Status Message: Input X must have 3 dimensions only.")."""
    found = re.findall(r"running (\w+) node\. Name:'([^']*)' Status Message: ", message)
    if not found:
        lines = message.strip().splitlines()
        return lines[0] if lines else ""
    op, name = found[-1]
    return f"node {name!r} ({op}): {message.rsplit('Status Message: ', 1)[1].strip()}"


def _feeds(graph: ir.Graph, shapes: dict, x: ir.Value, value: Any) -> list[dict] | None:
    """Two feeds (other inputs all zeros, then all ones) with ``x`` = ``value``; None when an input's
    shape (``shapes``: the --input-shape ones, else the declared one) or element type is not known."""
    feeds: list[dict] = [{}, {}]
    for inp in graph.inputs:
        if inp.dtype is None:
            return None
        dtype = np.dtype(inp.dtype.numpy())
        shape = tuple(shapes[inp.name]) if inp.name in shapes else irh.static_shape(inp)
        if inp is x:
            arr = np.asarray(value, dtype=dtype).reshape(shape or ())
            for feed in feeds:
                feed[inp.name] = arr
            continue
        if shape is None or dtype.kind not in "biuf":
            return None
        feeds[0][inp.name] = np.zeros(shape, dtype)
        feeds[1][inp.name] = np.ones(shape, dtype)
    return feeds


def derive_pins(model: ir.Model, shapes: dict, user_values: dict,
                say: Callable[[str], None] = lambda _s: None) -> list[BranchPin]:
    """The inputs to pin (see the module's rule) of ``model`` as loaded (its declared input shapes:
    onnxruntime loads it as the user's runtime would, and runs it on feeds of the ``shapes`` given
    with --input-shape; with them in the graph, its shape inference may already refuse the branch that
    cannot run, and then the model); ``user_values``: the user's ``--input-value`` pins."""
    graph = model.graph
    conditions = []
    for node in graph:
        if irh.is_onnx(node, "If") and node.inputs and node.inputs[0] is not None:
            cond = _condition(node, graph)
            if cond is not None and cond.input.name not in user_values:
                conditions.append(cond)
    if not conditions:
        return []
    run = _runner(model)
    if run is None:
        return []
    wanted: dict[str, list] = {}
    for cond in conditions:
        outcome = {}
        for branch, value in cond.tries.items():
            feeds = _feeds(graph, shapes, cond.input, value)
            if feeds is None:
                return []
            errors = [run(feed) for feed in feeds]
            outcome[branch] = (all(e is None for e in errors), all(e is not None for e in errors), errors[0])
        runs = [b for b, (ok, _, _) in outcome.items() if ok]
        fails = [b for b, (_, failed, _) in outcome.items() if failed]
        if len(runs) != 1 or len(fails) != 1 or cond.taken[runs[0]] is None:
            continue
        branch, dead = runs[0], fails[0]
        reason = (f"with the input shapes given, only the {branch} of If {cond.node.name!r} ({cond.text} is "
                  f"{branch == 'then_branch'}) can run: onnxruntime fails on the {dead} ({outcome[dead][2]})")
        wanted.setdefault(cond.input.name, []).append(BranchPin(cond.input.name, cond.taken[branch], reason))
    pins = []
    for name, options in wanted.items():
        if len({repr(p.value) for p in options}) != 1:
            say(f"input {name}: Ifs that only one branch can take want different values; not pinned")
            continue
        pins.append(options[0])
        say(f"input {name} pinned to {options[0].value}: {options[0].reason}")
    return pins


__all__ = ["BranchPin", "derive_pins"]
