"""The rule-set base every provider lowering is written in: a lowering is a set of rules over ops.

A :class:`Rule` is an op pattern (op types + domain), an optional
``check(node, ctx) -> None | reason`` and an ``emit(node, env)`` that writes
the provider's operations for the node into ``env`` (an :class:`Emitter`: the
program under construction) and binds the node's outputs.  A :class:`RuleSet`
holds a provider's rules, answers "which rule lowers this node" and "why not"
(the reason the build report prints for a node left on the CPU), and drives
the lowering of a partition (:meth:`RuleSet.emit_all`: per node, find the rule,
check it, emit).  :class:`RuleSpec` is the ``ProviderSpec`` of a rule-driven
provider: ``supports`` = the rule set's refusal, cached per node.

The three lowerings built on it: Core ML (``targets/coreml/rules.py``: ONNX
op -> MIL ops), NNAPI (``targets/nnapi/rules.py``: ONNX op -> NNAPI
operations) and the TFLite translation (``targets/tflite/translate.py``: NNAPI
operation -> TFLite operator; its "nodes" are NNAPI operations, keyed by
operation name in the pseudo-domain ``android.nn``).

How to add a provider
---------------------
1. Its rules, one module (``targets/<name>/rules.py``)::

       RULES = RuleSet("MyProvider")

       def _check_conv(node, ctx):                      # None, or why not
           if ctx.const(node.inputs[1]) is None:
               return "Conv weights are not constant"
           return None

       @RULES.rule("Conv", check=_check_conv)
       @RULES.rule("FusedConv", domain=MINIRT, check=_check_conv)
       def conv(node, env): ...                         # emit into env, bind the outputs

   ``env`` is an :class:`Emitter` subclass of the provider's own holding the
   program being built (value -> provider tensor bindings, constants...).
2. Its spec (``targets/<name>/__init__.py``): a :class:`RuleSpec` with
   ``name``, ``rules = RULES``, optionally ``precheck(node, ctx)`` (conditions
   every node must meet, e.g. dtypes and static shapes) and ``lower(partition,
   ctx) -> (blob, options)``: make the emitter, bind ``partition.inputs``,
   ``RULES.emit_all(partition.nodes, env)``, serialise ``partition.outputs``.
3. Its registration: ``SPEC_CLASSES`` in ``targets/providers.py``, and the
   provider in the ``providers`` tuple (plus its facts in ``provider_info``) of
   the profiles that offer it in ``targets/profiles.py``; the runtime side
   (``minirt/providers/``) compiles and runs the blob.

The op coverage table (``python -m minirt.builder.coverage``) reads
:meth:`RuleSet.ops`, so the new provider's column fills itself in.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional

from minirt.builder import ir_helpers as irh
from minirt.targets.providers import LoweringError, ProviderSpec

MINIRT = irh.MINIRT_DOMAIN

# check(node, ctx) -> None when the rule applies, else the refusal reason (a short sentence
# naming the op and what is wrong); emit(node, env) -> None.
Check = Callable[[Any, Any], Optional[str]]
Emit = Callable[[Any, Any], None]


def op_key(node) -> tuple[str, str]:
    """(domain, op type) of ``node`` with the ONNX domain spelled "" ("ai.onnx" is the same)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return domain, node.op_type


def op_name(node) -> str:
    """The op as the reasons print it: ``Conv``, ``com.minirt::FusedConv``."""
    domain, op = op_key(node)
    return f"{domain}::{op}" if domain else op


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one provider lowers the ops ``op_types`` of ``domain``."""

    domain: str
    op_types: tuple
    emit: Emit
    check: Check | None = None

    def refusal(self, node, ctx) -> str | None:
        return None if self.check is None else self.check(node, ctx)


class RuleSet:
    """A provider's rules, looked up by (domain, op type).

    ``label``: the provider as reasons name it ("Core ML");
    ``missing``: the reason for a node no rule takes (``{op}``: :func:`op_name`,
    ``{label}``);
    ``error``: the exception :meth:`emit_all` raises for a refusal (the
    partitioner keeps a partition whose lowering raises on the CPU);
    ``key``: (domain, op type) of a node; the default reads ``node.domain``
    and ``node.op_type``, which anything lowered here has.
    """

    def __init__(self, label: str, *, missing: str = "{op} has no {label} lowering rule",
                 error: type[Exception] = LoweringError, key: Callable[[Any], tuple] = op_key):
        self.label = label
        self.missing = missing
        self.error = error
        self.key = key
        self._rules: dict[tuple[str, str], Rule] = {}

    # --- registration -------------------------------------------------------------
    def rule(self, *op_types: str, domain: str = "", check: Check | None = None):
        """Decorator: ``emit`` lowers ``op_types`` of ``domain`` (stack it for more domains)."""

        def deco(emit: Emit) -> Emit:
            self.add(Rule(domain, tuple(op_types), emit, check))
            return emit

        return deco

    def add(self, rule: Rule) -> None:
        for op in rule.op_types:
            key = (rule.domain, op)
            # One rule per op: a second registration is a copy-paste slip, not an override.
            if key in self._rules:
                raise ValueError(f"{self.label}: {rule.domain + '::' if rule.domain else ''}{op} has two rules")
            self._rules[key] = Rule(rule.domain, (op,), rule.emit, rule.check)

    # --- lookup -------------------------------------------------------------------
    def lookup(self, node) -> Rule | None:
        return self._rules.get(self.key(node))

    def ops(self) -> set[tuple[str, str]]:
        """Every (domain, op type) some rule takes (the coverage table reads it)."""
        return set(self._rules)

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def missing_reason(self, node) -> str:
        domain, op = self.key(node)
        return self.missing.format(op=f"{domain}::{op}" if domain else op, label=self.label)

    # --- support ------------------------------------------------------------------
    def refusal(self, node, ctx, precheck: Check | None = None) -> str | None:
        """Why ``node`` cannot be lowered (None: it can): no rule, ``precheck``, the rule's check."""
        rule = self.lookup(node)
        if rule is None:
            return self.missing_reason(node)
        if precheck is not None:
            why = precheck(node, ctx)
            if why:
                return why
        return rule.refusal(node, ctx)

    def refusals(self, nodes: Iterable, ctx, precheck: Check | None = None) -> dict:
        """{node: reason} for the nodes of ``nodes`` this provider refuses (a report's "why not")."""
        out = {}
        for node in nodes:
            why = self.refusal(node, ctx, precheck)
            if why:
                out[node] = why
        return out

    # --- lowering -----------------------------------------------------------------
    def emit_all(self, nodes: Iterable, env: "Emitter") -> None:
        """The shared driving loop: every node (topological order) through its rule into ``env``.

        Raises ``self.error`` with the reason when a node has no rule or its
        check refuses, and whatever the rule raises when it refuses mid-way.
        """
        for node in nodes:
            rule = self.lookup(node)
            if rule is None:
                raise self.error(self.missing_reason(node))
            why = rule.refusal(node, env.ctx)
            if why:
                raise self.error(why)
            env.enter(node)
            rule.emit(node, env)


class Emitter:
    """Base of a provider's per-partition lowering state (the ``env`` rules emit into).

    ``ctx``: what the rules' checks see (``targets.providers.SupportContext``
    for the ONNX lowerings).  :meth:`enter` runs before each node's rule:
    the place for conditions every node must meet during lowering.
    """

    def __init__(self, ctx):
        self.ctx = ctx

    def enter(self, node) -> None:
        pass


class RuleSpec(ProviderSpec):
    """A ProviderSpec whose support comes from a :class:`RuleSet` (see the module docstring).

    ``supports`` = :meth:`refusal`, which by default is the rule set's (rule
    lookup, :meth:`precheck`, the rule's check).  A provider whose rules
    refuse while emitting (NNAPI) overrides :meth:`refusal` with a trial
    lowering of the node.  ``cache_support``: memoise per (context, node);
    worth it when a refusal costs a trial lowering.
    """

    rules: RuleSet
    cache_support: bool = False

    def precheck(self, node, ctx) -> str | None:
        return None

    def refusal(self, node, ctx) -> str | None:
        return self.rules.refusal(node, ctx, self.precheck)

    def support_key(self, node, ctx) -> tuple:
        """The memo key of :meth:`supports` (with ``cache_support``) within one context: the node."""
        return (id(node),)

    def supports(self, node, ctx) -> tuple[bool, str]:
        if not self.cache_support:
            return _verdict(self.refusal(node, ctx))
        # The memo lives on the context, so it dies with it: keyed by id() on a long-lived
        # spec, a later build's context and nodes could reuse the ids and hit stale answers.
        # Node ids are stable while the context (and so its model) lives.
        cache = ctx.__dict__.setdefault("_rule_support", {})
        key = (type(self).__name__, *self.support_key(node, ctx))
        if key not in cache:
            cache[key] = _verdict(self.refusal(node, ctx))
        return cache[key]


def _verdict(why: str | None) -> tuple[bool, str]:
    # None is "supported"; any string, even an empty one, is a refusal.
    return (True, "") if why is None else (False, why)


# --- node plumbing the rules of every provider share ------------------------------------


def input_at(node, i: int):
    """Input ``i`` of ``node``, or None when it is absent (omitted optional inputs included)."""
    return node.inputs[i] if len(node.inputs) > i else None


def str_attr(node, name: str, default=None):
    """A STRING attribute as ``str`` (onnx-ir may hand bytes), or ``default``."""
    v = irh.attr(node, name, default)
    return v.decode() if isinstance(v, bytes) else v


def fused_activation(node) -> tuple[str, list]:
    """(activation, params) of a com.minirt fused op (docs/fused_ops.md); ("", []) for none."""
    act = str_attr(node, "activation", "") or ""
    return act, list(irh.attr(node, "activation_params", None) or [])


def used_outputs(node) -> list:
    """The outputs of ``node`` somebody reads: named, and used or a graph output."""
    return [o for o in node.outputs if o is not None and o.name and (o.uses() or o.is_graph_output())]


def same_pads(in_spatial, kernel, strides, dilations, upper: bool) -> tuple[list, list]:
    """(begin pads, end pads) of ONNX's SAME_UPPER (``upper``) / SAME_LOWER auto_pad.

    Output size ceil(in / stride); the total padding splits evenly with the odd
    element at the end (SAME_UPPER) or the beginning (SAME_LOWER).
    """
    begins, ends = [], []
    for size, k, s, d in zip(in_spatial, kernel, strides, dilations):
        eff = (k - 1) * d + 1
        out = -(-size // s)
        total = max((out - 1) * s + eff - size, 0)
        small, big = total // 2, total - total // 2
        begins.append(small if upper else big)
        ends.append(big if upper else small)
    return begins, ends
