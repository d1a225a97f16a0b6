"""NNAPI back end of the builder: which nodes NNAPI takes at the target's API level, and the lowering.

``NNAPISpec`` implements ``targets.providers.ProviderSpec`` for the provider
"nnapi".  The API level comes from the target profile (``android-api27`` ..
``android-api34``: ``targets.profiles.nnapi_api_level``), from the build option
``nnapi_api_level``, or defaults to 29.  The blob is the NNAPI model
description of ``targets.nnapi.model`` (docs/nnapi.md).
"""
from __future__ import annotations

import re

from minirt.targets.nnapi import oplevels
from minirt.targets.nnapi.lower import Unsupported, lower_nodes, node_support
from minirt.targets.nnapi.model import NNModel
from minirt.targets.nnapi.rules import RULES
from minirt.targets.rules import RuleSpec

from minirt.targets.providers import LoweringError

DEFAULT_API_LEVEL = 29


def api_level_of(ctx) -> int:
    """The NNAPI (Android API) level a build targets."""
    opts = getattr(ctx, "options", None) or {}
    if opts.get("nnapi_api_level"):
        return int(opts["nnapi_api_level"])
    info = {}
    if hasattr(ctx, "provider_info"):
        info = ctx.provider_info("nnapi") or {}
    if info.get("api_level"):
        return int(info["api_level"])
    profile = getattr(ctx, "profile", None)
    name = getattr(profile, "name", profile if isinstance(profile, str) else "") or ""
    m = re.fullmatch(r"android-api(\d+)", str(name))
    if m:
        return int(m.group(1))
    return DEFAULT_API_LEVEL


class NNAPISpec(RuleSpec):
    """The rules of ``targets.nnapi.rules``; support = a trial lowering of the node at the API level."""

    name = "nnapi"
    rules = RULES
    cache_support = True  # a refusal costs a trial lowering

    def __init__(self, api_level: int | None = None):
        self._fixed_level = api_level

    def level(self, ctx) -> int:
        return int(self._fixed_level) if self._fixed_level else api_level_of(ctx)

    def support_key(self, node, ctx) -> tuple:
        return (id(node), self.level(ctx))

    def refusal(self, node, ctx) -> str | None:
        # The rules refuse while emitting (the conditions sit next to the operations
        # they guard), so the node is lowered alone; that also covers the rule lookup.
        ok, why = node_support(node, ctx, self.level(ctx))
        return None if ok else why

    def lower_model(self, partition, ctx) -> NNModel:
        try:
            return lower_nodes(partition.nodes, partition.inputs, partition.outputs, ctx, self.level(ctx))
        except Unsupported as exc:
            raise LoweringError(str(exc)) from None

    def lower(self, partition, ctx) -> tuple[bytes, dict]:
        model = self.lower_model(partition, ctx)
        options = {
            "api_level": self.level(ctx),
            "min_api_level": model.min_api_level,
            "preference": (getattr(ctx, "options", None) or {}).get("nnapi_preference", "fast_single_answer"),
            "relax_fp32_to_fp16": bool((getattr(ctx, "options", None) or {}).get("nnapi_relax_fp16", False)),
            "operations": len(model.operations),
        }
        return model.to_bytes(), options

    def share_weights(self, blob: bytes, tensors: dict) -> tuple[bytes, dict]:
        """``blob`` with its constants that equal artifact tensors (``tensors``: index -> array, the CPU
        version's initializers) stored as references to them (``targets.nnapi.share``), and the stats."""
        from minirt.targets.nnapi.share import share_weights

        return share_weights(blob, tensors)


__all__ = ["NNAPISpec", "NNModel", "RULES", "Unsupported", "api_level_of", "lower_nodes", "node_support", "oplevels"]
