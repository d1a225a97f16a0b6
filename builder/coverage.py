"""Generate docs/operators.md, the operator coverage table, from the kernel registry.

Run ``python -m minirt.builder.coverage > docs/operators.md`` after adding kernels;
``tests/test_operators_doc.py`` fails while the checked-in table is stale.

For every registered kernel the table gives the domain, the op, the opset
versions at which minirt registered a kernel (each covers the opsets up to
the next one), the element types the ONNX schema allows for the op's inputs
(restricted to those minirt can hold), and the providers that can run it: the
CPU always; an accelerator where its lowering rules declare the op.
"""
from __future__ import annotations

import collections
import sys

import onnx

from minirt.kernels.registry import registered
from minirt.vocabulary import CPU, MINIRT_DOMAIN

# onnx type strings -> the short names used in the table
_TYPE_NAMES = {
    "tensor(float)": "f32", "tensor(float16)": "f16", "tensor(double)": "f64", "tensor(bfloat16)": "bf16",
    "tensor(int8)": "i8", "tensor(uint8)": "u8", "tensor(int16)": "i16", "tensor(uint16)": "u16",
    "tensor(int32)": "i32", "tensor(uint32)": "u32", "tensor(int64)": "i64", "tensor(uint64)": "u64",
    "tensor(bool)": "bool", "tensor(string)": "str",
    "tensor(float8e4m3fn)": "f8e4m3fn", "tensor(float8e4m3fnuz)": "f8e4m3fnuz", "tensor(float8e5m2)": "f8e5m2",
    "tensor(float8e5m2fnuz)": "f8e5m2fnuz", "tensor(int4)": "i4", "tensor(uint4)": "u4",
    "tensor(float4e2m1)": "f4e2m1", "tensor(float8e8m0)": "f8e8m0", "tensor(int2)": "i2", "tensor(uint2)": "u2",
}
_ORDER = list(_TYPE_NAMES.values())

def _coreml_ops() -> set:
    from minirt.targets.coreml.rules import RULES

    return RULES.ops()


def _nnapi_ops() -> set:
    from minirt.targets.nnapi.rules import RULES

    return RULES.ops()


# provider -> the (domain, op_type) pairs its lowering rules take, for every accelerator of the
# provider table (minirt/vocabulary.py; tests/test_vocabulary.py checks the keys).  TFLite runs
# the NNAPI lowering translated op for op, so it takes the same set.
_PROVIDER_OPS = {"coreml": _coreml_ops, "nnapi": _nnapi_ops, "tflite": _nnapi_ops}


def _schema_types(domain: str, op_type: str) -> str:
    try:
        schema = onnx.defs.get_schema(op_type, domain=domain)  # the newest version onnx knows
    except Exception:  # noqa: BLE001 - our own domain, or an op onnx no longer knows
        return "see docs/fused_ops.md" if domain == MINIRT_DOMAIN else "-"
    input_params = {p.type_str for p in schema.inputs}
    allowed: set[str] = set()
    for tc in schema.type_constraints:
        if tc.type_param_str in input_params:
            allowed.update(_TYPE_NAMES[t] for t in tc.allowed_type_strs if t in _TYPE_NAMES)
    for p in schema.inputs:
        if p.type_str in _TYPE_NAMES:
            allowed.add(_TYPE_NAMES[p.type_str])
    return ", ".join(sorted(allowed, key=_ORDER.index)) or "-"


def _provider_ops() -> dict[str, set]:
    out = {}
    for name, collect in _PROVIDER_OPS.items():
        try:
            out[name] = {(d if d != "ai.onnx" else "", o) for d, o in collect()}
        except ImportError:  # that provider's builder side is not installed
            continue
    return out


def render_operator_table() -> str:
    from minirt.builder.contrib_schemas import ensure_registered

    ensure_registered()  # the types column of SimplifiedLayerNormalization, whatever the process loaded before
    by_op: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for entry in registered():
        if not entry.fn.__module__.startswith("minirt.kernels."):
            continue  # kernels that tests or plug-ins register are not minirt's coverage
        by_op[(entry.domain, entry.op_type)].append(entry.since)
    providers = _provider_ops()
    lines = [
        "# Operator coverage",
        "",
        "Generated from the kernel registry by `python -m minirt.builder.coverage > docs/operators.md`;",
        "`tests/test_operators_doc.py` checks that this file is current.",
        "",
        "- **since**: opset versions at which minirt registers a CPU kernel; each one serves",
        "  models up to the next listed version (a model at opset 15 uses the kernel with the",
        "  largest `since` not above 15).",
        "- **input types**: the element types the newest ONNX schema allows for the op's inputs.",
        "  The ONNX node conformance suite (`tests/conformance/`) checks the kernels on every",
        "  case onnx ships; the cases that still fail are listed with reasons in",
        "  `tests/conformance/unsupported.txt`.",
        "- **providers**: `cpu` always; an accelerator where its lowering rules take the op",
        "  (subject to attributes, shapes and API level; the build report says per node).",
        "",
    ]
    domains = sorted({d for d, _ in by_op})
    total = 0
    for domain in domains:
        ops = sorted(op for d, op in by_op if d == domain)
        total += len(ops)
        lines += [f"## {domain or 'ai.onnx'} ({len(ops)} operators)", "", "| op | since | input types | providers |",
                  "|---|---|---|---|"]
        for op in ops:
            sinces = sorted(by_op[(domain, op)])
            provs = [CPU] + [p for p in sorted(providers) if (domain, op) in providers[p]]
            lines.append(
                f"| {op} | {', '.join(map(str, sinces))} | {_schema_types(domain, op)} | {', '.join(provs)} |"
            )
        lines.append("")
    lines.insert(4, "")
    lines.insert(5, f"{total} operators in {len(domains)} domains.")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_operator_table())
