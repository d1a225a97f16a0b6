"""Core ML lowering rules: one function per ONNX (or com.minirt) op -> MIL ops.

Each rule is registered in the rule set :data:`RULES` (``targets/rules.py``)
with ``@RULES.rule(op, ..., check=...)`` and has two parts:

* ``check(node, ctx) -> None | reason``: op-specific support conditions
  (attributes, constant weights, ranks); the generic conditions (float
  tensors, or integer / bool ones for the ops of :data:`INTEGER_OPS`; static
  shapes, rank <= 5) are ``CoreMLSpec.precheck``;
* the decorated function ``(node, env)``: emits MIL ops with
  ``coremltools``' builder (``mb``) and binds the node's outputs in ``env``.

``env`` (:class:`targets.coreml.lower.LowerEnv`) gives ``env.get(value)``
(a MIL Var, or a numpy array for a constant), ``env.set(value, var)``,
``env.const(value)``, ``env.shape(value)`` (static), ``env.mb`` and a
unique-name helper ``env.n(node, suffix)``.

Conventions (from the MIL op documentation): tensors stay NCHW (MIL's conv and
pool layout, the same as ONNX: no layout change); ONNX pads
``[b1, b2, ..., e1, e2, ...]`` become MIL ``pad=[b1, e1, b2, e2, ...]`` with
``pad_type="custom"``; MIL conv weights are ``[C_out, C_in/groups, *K]`` and
conv_transpose weights ``[C_in, C_out/groups, *K]`` (ONNX's layouts);
``linear`` takes a ``[D_out, D_in]`` weight.
"""
from __future__ import annotations

import numpy as np

from minirt.builder.ir_helpers import attr
from minirt import vocabulary as V
from minirt.targets.rules import MINIRT, RuleSet, fused_activation, input_at, same_pads, str_attr, used_outputs

RULES = RuleSet("Core ML")

# The ops whose rules take ONNX int32 / int64 / bool tensors (carried as MIL int32 / bool): indices,
# masks, their comparisons and data movement.  Every other rule sees float tensors only
# (CoreMLSpec.precheck); a rule added here must handle the integer and bool cases (MIL's type domains).
INTEGER_OPS = frozenset(("", op) for op in (
    *V.RESHAPES, "Transpose", "Concat", "Slice", "Gather", "Cast", "Where",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not",
)) | {(MINIRT, "RowLookup")}


# --- activations (shared by fused ops and Activation) ------------------------------

# Core ML lowers every fused activation of the vocabulary (apply_activation has a branch for each;
# tests/test_vocabulary.py checks that each one lowers).
ACTIVATIONS = frozenset(V.ACTIVATIONS)


def _check_activation(node, ctx):
    act, _ = fused_activation(node)
    if act not in ACTIVATIONS:
        return f"activation {act!r} has no Core ML lowering"
    return None


def apply_activation(mb, x, act: str, params, name: str):
    """MIL ops for minirt's activation table (docs/fused_ops.md)."""
    if isinstance(act, bytes):
        act = act.decode()
    params = [float(p) for p in (params or ())]
    if not act:
        return x
    if act == "Relu":
        return mb.relu(x=x, name=name)
    if act == "LeakyRelu":
        return mb.leaky_relu(x=x, alpha=params[0] if params else 0.01, name=name)
    if act == "Clip":
        lo = params[0] if len(params) > 0 else -3.4e38
        hi = params[1] if len(params) > 1 else 3.4e38
        if lo == 0.0 and hi == 6.0:
            return mb.relu6(x=x, name=name)
        return mb.clip(x=x, alpha=np.float32(max(lo, -3.4e38)), beta=np.float32(min(hi, 3.4e38)), name=name)
    if act == "Sigmoid":
        return mb.sigmoid(x=x, name=name)
    if act == "Tanh":
        return mb.tanh(x=x, name=name)
    if act == "HardSigmoid":
        alpha = params[0] if params else 0.2
        beta = params[1] if len(params) > 1 else 0.5
        return mb.sigmoid_hard(x=x, alpha=alpha, beta=beta, name=name)
    if act == "HardSwish":
        hs = mb.sigmoid_hard(x=x, alpha=1.0 / 6.0, beta=0.5, name=name + "_hsig")
        return mb.mul(x=x, y=hs, name=name)
    if act == "SiLU":
        return mb.silu(x=x, name=name)
    if act == "Gelu":
        return mb.gelu(x=x, mode="EXACT", name=name)
    if act == "GeluTanh":
        return mb.gelu(x=x, mode="TANH_APPROXIMATION", name=name)
    raise ValueError(f"activation {act!r} has no Core ML lowering")


def _finish(node, env, y):
    """Residual/activation epilogue of fused ops, then bind output 0."""
    act, params = fused_activation(node)
    y = apply_activation(env.mb, y, act, params, env.n(node, "act")) if act else y
    env.set(node.outputs[0], y, rename=True)


def _add_residual(node, env, y, z_index: int):
    z = input_at(node, z_index)
    if z is not None:
        y = env.mb.add(x=y, y=env.get(z), name=env.n(node, "residual"))
    return y


# --- convolution -----------------------------------------------------------------------


def _mil_pads(node, spatial: int, in_shape, w_shape, strides, dilations, transpose=False):
    """(pad_type, pad list) in MIL order for an ONNX conv/pool node."""
    auto_pad = str_attr(node, "auto_pad", "NOTSET") or "NOTSET"
    if auto_pad == "VALID":
        return "valid", [0] * (2 * spatial)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if transpose:
            raise ValueError("ConvTranspose with auto_pad SAME is not lowered")
        begins, ends = same_pads(in_shape[2:], w_shape, strides, dilations, upper=auto_pad == "SAME_UPPER")
        return "custom", [p for pair in zip(begins, ends) for p in pair]
    onnx_pads = list(attr(node, "pads", None) or [0] * (2 * spatial))
    pads = []
    for i in range(spatial):
        pads += [int(onnx_pads[i]), int(onnx_pads[i + spatial])]
    return "custom", pads


def _check_conv(node, ctx):
    inputs = list(node.inputs)
    w = ctx.const(inputs[1]) if len(inputs) > 1 else None
    if w is None:
        return f"{node.op_type} weights are not constant (Core ML needs constant conv weights)"
    if w.ndim not in (3, 4, 5):
        return f"{node.op_type} with {w.ndim - 2} spatial dims is not supported by Core ML"
    if len(inputs) > 2 and inputs[2] is not None and ctx.const(inputs[2]) is None:
        return f"{node.op_type} bias is not constant"
    if node.op_type == "FusedConv":
        return _check_activation(node, ctx)
    return None


def _conv_kwargs(node, env, transpose: bool = False) -> tuple[dict, list]:
    """The arguments MIL's conv / conv_transpose share: x, weight, strides, dilations, groups, padding
    (``pad`` only with ``pad_type="custom"``) and the bias when there is one; and the explicit pads."""
    inputs = list(node.inputs)
    w = env.const(inputs[1]).astype(np.float32)
    spatial = w.ndim - 2
    strides = [int(s) for s in (attr(node, "strides", None) or [1] * spatial)]
    dilations = [int(d) for d in (attr(node, "dilations", None) or [1] * spatial)]
    groups = int(attr(node, "group", 1) or 1)
    pad_type, pad = _mil_pads(node, spatial, env.shape(inputs[0]), w.shape[2:], strides, dilations,
                              transpose=transpose)
    kwargs = dict(x=env.get(inputs[0]), weight=w, strides=strides, dilations=dilations, groups=groups,
                  pad_type=pad_type)
    if pad_type == "custom":
        kwargs["pad"] = pad
    if len(inputs) > 2 and inputs[2] is not None:
        kwargs["bias"] = env.const(inputs[2]).astype(np.float32).reshape(-1)
    return kwargs, pad


@RULES.rule("Conv", check=_check_conv)
@RULES.rule("FusedConv", domain=MINIRT, check=_check_conv)
def lower_conv(node, env):
    y = env.mb.conv(name=env.n(node, "conv"), **_conv_kwargs(node, env)[0])
    y = _add_residual(node, env, y, 3)
    _finish(node, env, y)


def _check_conv_transpose(node, ctx):
    why = _check_conv(node, ctx)
    if why:
        return why
    out_pad = [int(p) for p in (attr(node, "output_padding", None) or ())]
    if any(out_pad):
        # Lowered as less end padding (ONNX keeps output_padding more rows/cols of the full result).
        w = ctx.const(node.inputs[1])
        spatial = w.ndim - 2
        pads = list(attr(node, "pads", None) or [0] * (2 * spatial))
        if any(pads[spatial + i] < out_pad[i] for i in range(spatial)):
            return "ConvTranspose output_padding larger than the end padding is not lowered to Core ML"
    auto_pad = attr(node, "auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in ("NOTSET", "VALID", b"NOTSET", b"VALID"):
        return f"ConvTranspose auto_pad {auto_pad!r} is not lowered to Core ML"
    if attr(node, "output_shape", None):
        return "ConvTranspose output_shape attribute is not lowered to Core ML"
    if node.op_type == "FusedConvTranspose":
        return _check_activation(node, ctx)
    return None


@RULES.rule("ConvTranspose", check=_check_conv_transpose)
@RULES.rule("FusedConvTranspose", domain=MINIRT, check=_check_conv_transpose)
def lower_conv_transpose(node, env):
    kwargs, pad = _conv_kwargs(node, env, transpose=True)
    out_pad = [int(p) for p in (attr(node, "output_padding", None) or ())]
    if any(out_pad):
        pad = [p - (out_pad[i // 2] if i % 2 else 0) for i, p in enumerate(pad)]
        kwargs["pad"], kwargs["pad_type"] = pad, "custom"
    y = env.mb.conv_transpose(name=env.n(node, "deconv"), **kwargs)
    _finish(node, env, y)  # FusedConvTranspose's activation; plain ConvTranspose has none


# --- pooling ----------------------------------------------------------------------------


def _check_pool(node, ctx):
    if len(used_outputs(node)) > 1:
        return "MaxPool's indices output is not supported by Core ML"
    if any(int(d) != 1 for d in (attr(node, "dilations", None) or ())):
        return f"{node.op_type} with dilations is not supported by Core ML"
    if int(attr(node, "storage_order", 0) or 0) != 0:
        return "MaxPool storage_order=1 is not supported by Core ML"
    k = attr(node, "kernel_shape", None)
    if not k or len(k) not in (1, 2, 3):
        return f"{node.op_type} kernel rank {len(k) if k else 0} is not supported by Core ML"
    return None


@RULES.rule("MaxPool", "AveragePool", check=_check_pool)
def lower_pool(node, env):
    mb = env.mb
    inputs = list(node.inputs)
    k = [int(v) for v in attr(node, "kernel_shape")]
    spatial = len(k)
    strides = [int(s) for s in (attr(node, "strides", None) or [1] * spatial)]
    pad_type, pad = _mil_pads(node, spatial, env.shape(inputs[0]), k, strides, [1] * spatial)
    kwargs = dict(x=env.get(inputs[0]), kernel_sizes=k, strides=strides, pad_type=pad_type,
                  ceil_mode=bool(attr(node, "ceil_mode", 0)), name=env.n(node, "pool"))
    if pad_type == "custom":
        kwargs["pad"] = pad
    if node.op_type == "MaxPool":
        y = mb.max_pool(**kwargs)
    else:
        y = mb.avg_pool(exclude_padding_from_average=not bool(attr(node, "count_include_pad", 0)), **kwargs)
    env.set(node.outputs[0], y, rename=True)


@RULES.rule("GlobalAveragePool", "GlobalMaxPool")
def lower_global_pool(node, env):
    x = node.inputs[0]
    axes = list(range(2, len(env.shape(x))))
    fn = env.mb.reduce_mean if node.op_type == "GlobalAveragePool" else env.mb.reduce_max
    env.set(node.outputs[0], fn(x=env.get(x), axes=axes, keep_dims=True, name=env.n(node, "gpool")), rename=True)


# --- matmul / gemm -----------------------------------------------------------------------


def _check_gemm(node, ctx):
    inputs = list(node.inputs)
    if ctx.rank(inputs[0]) != 2:
        return "Gemm input A must be 2-D"
    if len(inputs) > 2 and inputs[2] is not None and ctx.const(inputs[2]) is None:
        return "Gemm C is not constant"
    if node.op_type == "FusedGemm":
        return _check_activation(node, ctx)
    return None


@RULES.rule("Gemm", check=_check_gemm)
@RULES.rule("FusedGemm", domain=MINIRT, check=_check_gemm)
def lower_gemm(node, env):
    mb = env.mb
    inputs = list(node.inputs)
    alpha = float(attr(node, "alpha", 1.0))
    beta = float(attr(node, "beta", 1.0))
    a = env.get(inputs[0])
    if int(attr(node, "transA", 0) or 0):
        a = mb.transpose(x=a, perm=[1, 0], name=env.n(node, "ta"))
    b_const = env.const(inputs[1])
    trans_b = bool(int(attr(node, "transB", 0) or 0))
    out_shape = env.shape(node.outputs[0])
    bias = None
    if len(inputs) > 2 and inputs[2] is not None:
        c = env.const(inputs[2]).astype(np.float32) * beta
        if c.size == out_shape[1] and (c.ndim <= 1 or c.shape[0] == 1):
            bias = c.reshape(-1)
        elif c.size == 1:
            bias = np.full((out_shape[1],), float(c.reshape(-1)[0]), np.float32)
        else:
            bias = None
            c_full = c
    if b_const is not None:
        w = b_const.astype(np.float32)
        w = (w if trans_b else w.T) * alpha  # linear wants [D_out, D_in]
        kwargs = dict(x=a, weight=np.ascontiguousarray(w), name=env.n(node, "linear"))
        if bias is not None:
            kwargs["bias"] = bias
        y = mb.linear(**kwargs)
    else:
        y = mb.matmul(x=a, y=env.get(inputs[1]), transpose_y=trans_b, name=env.n(node, "matmul"))
        if alpha != 1.0:
            y = mb.mul(x=y, y=np.float32(alpha), name=env.n(node, "alpha"))
        if bias is not None:
            y = mb.add(x=y, y=bias, name=env.n(node, "bias"))
    if len(inputs) > 2 and inputs[2] is not None and bias is None:
        y = mb.add(x=y, y=c_full, name=env.n(node, "c"))
    y = _add_residual(node, env, y, 3)
    _finish(node, env, y)


def _check_matmul(node, ctx):
    inputs = list(node.inputs)
    ra, rb = ctx.rank(inputs[0]), ctx.rank(inputs[1])
    if ra is None or rb is None or ra < 1 or rb < 1:
        return "MatMul operand ranks unknown"
    if node.op_type == "FusedMatMul":
        return _check_activation(node, ctx)
    return None


@RULES.rule("MatMul", check=_check_matmul)
@RULES.rule("FusedMatMul", domain=MINIRT, check=_check_matmul)
def lower_matmul(node, env):
    mb = env.mb
    inputs = list(node.inputs)
    a = env.get(inputs[0])
    b_const = env.const(inputs[1])
    bias = env.const(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    if b_const is not None and b_const.ndim == 2:
        kwargs = dict(x=a, weight=np.ascontiguousarray(b_const.astype(np.float32).T), name=env.n(node, "linear"))
        if bias is not None and bias.size == b_const.shape[1]:
            kwargs["bias"] = bias.astype(np.float32).reshape(-1)
            bias = None
        y = mb.linear(**kwargs)
    else:
        y = mb.matmul(x=a, y=env.get(inputs[1]), name=env.n(node, "matmul"))
    if len(inputs) > 2 and inputs[2] is not None and (bias is not None or env.const(inputs[2]) is None):
        y = mb.add(x=y, y=env.get(inputs[2]), name=env.n(node, "bias"))
    y = _add_residual(node, env, y, 3)
    _finish(node, env, y)


# --- elementwise ---------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "real_div", "Max": "maximum", "Min": "minimum", "Pow": "pow"}


def _check_binary(node, ctx):
    if len([v for v in node.inputs if v is not None]) != 2:
        return f"{node.op_type} with {len(node.inputs)} inputs is not lowered (2 only)"
    if node.op_type == "Pow" and ctx.const(node.inputs[1]) is None:
        return "Pow with a non-constant exponent is not lowered to Core ML"
    return None


@RULES.rule(*_BINARY, check=_check_binary)
def lower_binary(node, env):
    a, b = node.inputs[0], node.inputs[1]
    fn = getattr(env.mb, _BINARY[node.op_type])
    xa, xb = env.get(a), env.get(b)
    if node.op_type == "Pow":
        e = env.const(b)
        if e.size == 1 and float(e.reshape(-1)[0]) == 2.0:
            env.set(node.outputs[0], env.mb.mul(x=xa, y=xa, name=env.n(node, "sq")), rename=True)
            return
    env.set(node.outputs[0], fn(x=xa, y=xb, name=env.n(node, "bin")), rename=True)


_UNARY = {
    "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
    "Abs": "abs", "Erf": "erf", "Reciprocal": "inverse", "Floor": "floor", "Ceil": "ceil", "Softplus": "softplus",
    "Identity": "identity",
}


@RULES.rule(*_UNARY)
def lower_unary(node, env):
    fn = getattr(env.mb, _UNARY[node.op_type])
    env.set(node.outputs[0], fn(x=env.get(node.inputs[0]), name=env.n(node, "un")), rename=True)


@RULES.rule("Neg")
def lower_neg(node, env):
    env.set(node.outputs[0], env.mb.mul(x=env.get(node.inputs[0]), y=np.float32(-1), name=env.n(node, "neg")), rename=True)


@RULES.rule("LeakyRelu")
def lower_leaky(node, env):
    x = env.get(node.inputs[0])
    env.set(node.outputs[0], env.mb.leaky_relu(x=x, alpha=float(attr(node, "alpha", 0.01)), name=env.n(node, "lrelu")), rename=True)


@RULES.rule("HardSigmoid")
def lower_hardsigmoid(node, env):
    x = env.get(node.inputs[0])
    y = env.mb.sigmoid_hard(x=x, alpha=float(attr(node, "alpha", 0.2)), beta=float(attr(node, "beta", 0.5)), name=env.n(node, "hsig"))
    env.set(node.outputs[0], y, rename=True)


@RULES.rule("HardSwish")
def lower_hardswish(node, env):
    env.set(node.outputs[0], apply_activation(env.mb, env.get(node.inputs[0]), "HardSwish", (), env.n(node, "hswish")), rename=True)


def _check_clip(node, ctx):
    inputs = list(node.inputs)
    for v in inputs[1:]:
        if v is not None and ctx.const(v) is None:
            return "Clip bounds are not constant"
    return None


@RULES.rule("Clip", check=_check_clip)
def lower_clip(node, env):
    inputs = list(node.inputs)
    lo = attr(node, "min", None)
    hi = attr(node, "max", None)
    if len(inputs) > 1 and inputs[1] is not None:
        lo = float(env.const(inputs[1]).reshape(-1)[0])
    if len(inputs) > 2 and inputs[2] is not None:
        hi = float(env.const(inputs[2]).reshape(-1)[0])
    params = (-3.4e38 if lo is None else float(lo), 3.4e38 if hi is None else float(hi))
    env.set(node.outputs[0], apply_activation(env.mb, env.get(inputs[0]), "Clip", params, env.n(node, "clip")), rename=True)


@RULES.rule("Activation", domain=MINIRT, check=_check_activation)
def lower_activation(node, env):
    y = apply_activation(env.mb, env.get(node.inputs[0]), attr(node, "activation", ""),
                         attr(node, "activation_params", ()), env.n(node, "act"))
    env.set(node.outputs[0], y, rename=True)


@RULES.rule("Gelu")
def lower_gelu(node, env):
    approx = str_attr(node, "approximate", "none")
    act = "GeluTanh" if approx == "tanh" else "Gelu"
    env.set(node.outputs[0], apply_activation(env.mb, env.get(node.inputs[0]), act, (), env.n(node, "gelu")), rename=True)


def _check_prelu(node, ctx):
    if ctx.const(node.inputs[1]) is None:
        return "PRelu slope is not constant"
    return None


@RULES.rule("PRelu", check=_check_prelu)
def lower_prelu(node, env):
    mb = env.mb
    x = env.get(node.inputs[0])
    slope = env.const(node.inputs[1]).astype(np.float32)
    pos = mb.relu(x=x, name=env.n(node, "pos"))
    neg = mb.minimum(x=x, y=np.float32(0), name=env.n(node, "negpart"))
    env.set(node.outputs[0], mb.add(x=pos, y=mb.mul(x=neg, y=slope, name=env.n(node, "scaled")), name=env.n(node, "prelu")), rename=True)


def _check_bn(node, ctx):
    if int(attr(node, "training_mode", 0) or 0):
        return "BatchNormalization in training mode is not supported by Core ML"
    if any(ctx.const(v) is None for v in list(node.inputs)[1:5]):
        return "BatchNormalization parameters are not constant"
    if ctx.rank(node.inputs[0]) not in (3, 4, 5):
        return "BatchNormalization input must be rank 3-5 for Core ML"
    return None


@RULES.rule("BatchNormalization", check=_check_bn)
def lower_bn(node, env):
    scale, bias, mean, var = (env.const(v).astype(np.float32) for v in list(node.inputs)[1:5])
    y = env.mb.batch_norm(x=env.get(node.inputs[0]), mean=mean, variance=var, gamma=scale, beta=bias,
                          epsilon=float(attr(node, "epsilon", 1e-5)), name=env.n(node, "bn"))
    env.set(node.outputs[0], y, rename=True)


# --- integer and bool tensors: comparisons, logic, Where, Cast -------------------------------
#
# ONNX int32 / int64 values are MIL int32 and ONNX bool values MIL bool throughout a program (MIL has no
# int64 arithmetic); targets/coreml/__init__.py lets integer and bool tensors reach these rules and the
# data-movement rules of INTEGER_OPS only.  MIL's comparisons take fp16 / fp32 / int32 (not bool) and
# return bool; its logical ops take bool.

_COMPARE = {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal", "Greater": "greater",
            "GreaterOrEqual": "greater_equal"}
_LOGICAL = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}


def _is_bool(env_or_ctx, value) -> bool:
    ctx = getattr(env_or_ctx, "ctx", env_or_ctx)
    return ctx.dtype(value) == np.bool_


def _bool_as_int(env, node, value, suffix):
    """``value`` as MIL int32 when it is an ONNX bool (MIL comparisons and gather take no bool)."""
    x = env.get(value)
    if not _is_bool(env, value):
        return x
    if isinstance(x, np.ndarray):
        return x.astype(np.int32)
    return env.mb.cast(x=x, dtype="int32", name=env.n(node, suffix))


@RULES.rule(*_COMPARE)
def lower_compare(node, env):
    a, b = (_bool_as_int(env, node, v, f"int{k}") for k, v in enumerate(node.inputs[:2]))
    y = getattr(env.mb, _COMPARE[node.op_type])(x=a, y=b, name=env.n(node, "cmp"))
    env.set(node.outputs[0], y, rename=True)


@RULES.rule(*_LOGICAL)
def lower_logical(node, env):
    a, b = (env.get(v) for v in node.inputs[:2])
    env.set(node.outputs[0], getattr(env.mb, _LOGICAL[node.op_type])(x=a, y=b, name=env.n(node, "logic")), rename=True)


@RULES.rule("Not")
def lower_not(node, env):
    env.set(node.outputs[0], env.mb.logical_not(x=env.get(node.inputs[0]), name=env.n(node, "not")), rename=True)


@RULES.rule("Where")
def lower_where(node, env):
    cond, a, b = (env.get(v) for v in node.inputs[:3])
    env.set(node.outputs[0], env.mb.select(cond=cond, a=a, b=b, name=env.n(node, "where")), rename=True)


def _cast_kind(dtype) -> str | None:
    """"bool", "int" or "float" for the ONNX element types a Core ML program carries, else None."""
    if dtype is None:
        return None
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    if dtype in (np.dtype(np.int32), np.dtype(np.int64)):
        return "int"
    if dtype in (np.dtype(np.float32), np.dtype(np.float16)):
        return "float"
    return None


def _check_cast(node, ctx):
    src, dst = ctx.dtype(node.inputs[0]), ctx.dtype(node.outputs[0])
    ks, kd = _cast_kind(src), _cast_kind(dst)
    if ks is None or kd is None:
        return f"Cast from {src} to {dst} is not lowered to Core ML"
    if ks == "float" and kd == "int":
        # ONNX truncates toward zero; MIL's cast does not document its rounding.
        return "Cast from float to integer is not lowered to Core ML (MIL cast's rounding is not documented)"
    if ks == kd == "float" and np.dtype(src) != np.dtype(dst):
        return "Cast between float32 and float16 is not lowered (a Core ML program computes in one float type)"
    return None


@RULES.rule("Cast", check=_check_cast)
def lower_cast(node, env):
    x = env.get(node.inputs[0])
    src, dst = env.ctx.dtype(node.inputs[0]), env.ctx.dtype(node.outputs[0])
    ks, kd = _cast_kind(src), _cast_kind(dst)
    name = env.n(node, "cast")
    if ks == kd:
        # int64 <-> int32 (both MIL int32) or a cast to the same type.
        y = env.mb.identity(x=x, name=name)
    elif kd == "bool":
        # ONNX: nonzero -> True.  Said with a comparison rather than MIL cast's undocumented rule.
        zero = np.float32(0) if ks == "float" else np.int32(0)
        y = env.mb.not_equal(x=x, y=zero, name=name)
    else:
        y = env.mb.cast(x=x, dtype={"int": "int32", "float": "fp16" if dst == np.float16 else "fp32"}[kd], name=name)
    env.set(node.outputs[0], y, rename=True)


# --- normalisation / softmax ---------------------------------------------------------------


def _check_softmax(node, ctx):
    rank = ctx.rank(node.inputs[0])
    axis = int(attr(node, "axis", -1 if ctx.opset(node) >= 13 else 1))
    if axis < 0:
        axis += rank
    if ctx.opset(node) < 13 and axis != rank - 1 and node.op_type != "Softmax":
        return f"{node.op_type} (opset < 13) over flattened axes {axis}.. is not lowered to Core ML"
    return None


@RULES.rule("Softmax", check=_check_softmax)
def lower_softmax(node, env):
    shape = list(env.shape(node.inputs[0]))
    rank = len(shape)
    axis = int(attr(node, "axis", -1 if env.ctx.opset(node) >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    x = env.get(node.inputs[0])
    if env.ctx.opset(node) < 13 and axis != rank - 1:
        # Softmax-1/11 normalises the input flattened to [prod(dims before axis), prod(dims from axis)]
        # (a classifier's [1, 1000, 1, 1] over its 1000): over the last axis of that 2-D view, reshaped back
        flat = [int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))]
        x = env.mb.reshape(x=x, shape=np.array(flat, np.int32), name=env.n(node, "flat"))
        y = env.mb.softmax(x=x, axis=1, name=env.n(node, "softmax"))
        y = env.mb.reshape(x=y, shape=np.array(shape, np.int32), name=env.n(node, "unflat"))
    else:
        y = env.mb.softmax(x=x, axis=axis, name=env.n(node, "softmax"))
    env.set(node.outputs[0], y, rename=True)


@RULES.rule("LogSoftmax", check=_check_softmax)
def lower_log_softmax(node, env):
    # MIL has no log_softmax; log(softmax(x)) would underflow to -inf where ONNX is finite.  The stable
    # form: s = x - max(x), y = s - log(sum(exp(s))) (every exp(s) <= 1 and the sum >= 1).
    mb = env.mb
    rank = len(env.shape(node.inputs[0]))
    axis = int(attr(node, "axis", -1 if env.ctx.opset(node) >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    x = env.get(node.inputs[0])
    m = mb.reduce_max(x=x, axes=[axis], keep_dims=True, name=env.n(node, "max"))
    shifted = mb.sub(x=x, y=m, name=env.n(node, "shift"))
    total = mb.reduce_sum(x=mb.exp(x=shifted, name=env.n(node, "exp")), axes=[axis], keep_dims=True,
                          name=env.n(node, "sum"))
    y = mb.sub(x=shifted, y=mb.log(x=total, name=env.n(node, "log")), name=env.n(node, "logsoftmax"))
    env.set(node.outputs[0], y, rename=True)


def _check_instance_norm(node, ctx):
    if any(ctx.const(v) is None for v in list(node.inputs)[1:3]):
        return "InstanceNormalization scale/bias are not constant"
    if ctx.rank(node.inputs[0]) not in (3, 4):
        return "InstanceNormalization input must be rank 3 or 4 for Core ML (MIL instance_norm)"
    return None


@RULES.rule("InstanceNormalization", check=_check_instance_norm)
def lower_instance_norm(node, env):
    # MIL instance_norm: per (batch, channel), mean and variance over the spatial axes, as ONNX's.
    scale, bias = (env.const(v).astype(np.float32).reshape(-1) for v in list(node.inputs)[1:3])
    y = env.mb.instance_norm(x=env.get(node.inputs[0]), gamma=scale, beta=bias,
                             epsilon=float(attr(node, "epsilon", 1e-5)), name=env.n(node, "inorm"))
    env.set(node.outputs[0], y, rename=True)


def _check_lrn(node, ctx):
    if ctx.rank(node.inputs[0]) not in (3, 4):
        return "LRN input must be rank 3 or 4 for Core ML (MIL local_response_norm)"
    if int(attr(node, "size")) % 2 == 0:
        return f"LRN of even size {int(attr(node, 'size'))} (its channel window is not centred)"
    return None


@RULES.rule("LRN", check=_check_lrn)
def lower_lrn(node, env):
    # MIL local_response_norm is ONNX's LRN (alpha divided by size, a window of size channels centred on
    # each, clipped at the ends) for odd sizes
    y = env.mb.local_response_norm(x=env.get(node.inputs[0]), size=int(attr(node, "size")),
                                   alpha=np.float32(attr(node, "alpha", 1e-4)),
                                   beta=np.float32(attr(node, "beta", 0.75)), k=np.float32(attr(node, "bias", 1.0)),
                                   name=env.n(node, "lrn"))
    env.set(node.outputs[0], y, rename=True)


def _check_layernorm(node, ctx):
    if any(o in used_outputs(node) for o in list(node.outputs)[1:]):
        return "LayerNormalization mean/inv-std outputs are not supported by Core ML"
    for v in list(node.inputs)[1:]:
        if v is not None and ctx.const(v) is None:
            return "LayerNormalization scale/bias are not constant"
    return None


@RULES.rule("LayerNormalization", check=_check_layernorm)
@RULES.rule("LayerNormalization", domain=MINIRT, check=_check_layernorm)
def lower_layernorm(node, env):
    inputs = list(node.inputs)
    shape = env.shape(inputs[0])
    axis = int(attr(node, "axis", -1))
    axis = axis + len(shape) if axis < 0 else axis
    axes = list(range(axis, len(shape)))
    norm_shape = tuple(shape[axis:])
    kwargs = dict(x=env.get(inputs[0]), axes=axes, epsilon=float(attr(node, "epsilon", 1e-5)), name=env.n(node, "ln"))
    if len(inputs) > 1 and inputs[1] is not None:
        kwargs["gamma"] = np.broadcast_to(env.const(inputs[1]).astype(np.float32), norm_shape).copy()
    if len(inputs) > 2 and inputs[2] is not None:
        kwargs["beta"] = np.broadcast_to(env.const(inputs[2]).astype(np.float32), norm_shape).copy()
    env.set(node.outputs[0], env.mb.layer_norm(**kwargs), rename=True)


_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min"}


def _reduce_axes(node, ctx_or_env, rank):
    inputs = list(node.inputs)
    if len(inputs) > 1 and inputs[1] is not None:
        axes = ctx_or_env.const(inputs[1])
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        axes = attr(node, "axes", None)
        axes = None if axes is None else [int(a) for a in axes]
    if axes is None or len(axes) == 0:
        return list(range(rank))
    return sorted(a + rank if a < 0 else a for a in axes)


def _check_reduce(node, ctx):
    inputs = list(node.inputs)
    if len(inputs) > 1 and inputs[1] is not None and ctx.const(inputs[1]) is None:
        return f"{node.op_type} axes are not constant"
    if int(attr(node, "noop_with_empty_axes", 0) or 0):
        # The flag only matters when the axes are empty or absent (then the op is the identity);
        # with constant, non-empty axes (jax2tf's LayerNorm sums) it is an ordinary reduction.
        axes = ctx.const(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        if axes is None or axes.size == 0:
            return f"{node.op_type} noop_with_empty_axes=1 without axes is not lowered"
    return None


@RULES.rule(*_REDUCE, check=_check_reduce)
def lower_reduce(node, env):
    rank = len(env.shape(node.inputs[0]))
    axes = _reduce_axes(node, env, rank)
    fn = getattr(env.mb, _REDUCE[node.op_type])
    y = fn(x=env.get(node.inputs[0]), axes=axes, keep_dims=bool(attr(node, "keepdims", 1)), name=env.n(node, "reduce"))
    env.set(node.outputs[0], y, rename=True)


# --- tensor shuffles -----------------------------------------------------------------------


@RULES.rule("Concat")
def lower_concat(node, env):
    rank = len(env.shape(node.outputs[0]))
    axis = int(attr(node, "axis"))
    axis = axis + rank if axis < 0 else axis
    values = [env.get(v) for v in node.inputs if v is not None]
    if len(values) == 1:
        env.set(node.outputs[0], env.mb.identity(x=values[0], name=env.n(node, "id")), rename=True)
        return
    env.set(node.outputs[0], env.mb.concat(values=values, axis=axis, name=env.n(node, "concat")), rename=True)


def _check_reshape_like(node, ctx):
    if ctx.static_shape(node.outputs[0]) is None:
        return f"{node.op_type} output shape is not static"
    return None


@RULES.rule(*sorted(V.RESHAPES), check=_check_reshape_like)
def lower_reshape(node, env):
    shape = list(env.shape(node.outputs[0]))
    y = env.mb.reshape(x=env.get(node.inputs[0]), shape=np.array(shape, np.int32), name=env.n(node, "reshape"))
    env.set(node.outputs[0], y, rename=True)


@RULES.rule("Transpose")
def lower_transpose(node, env):
    rank = len(env.shape(node.inputs[0]))
    perm = attr(node, "perm", None)
    perm = list(range(rank))[::-1] if perm is None else [int(p) for p in perm]
    env.set(node.outputs[0], env.mb.transpose(x=env.get(node.inputs[0]), perm=perm, name=env.n(node, "transpose")), rename=True)


def _check_constant_of_shape(node, ctx):
    if ctx.const(node.outputs[0]) is None:
        return "ConstantOfShape of a run-time shape (Core ML programs have static shapes)"
    return None


@RULES.rule("ConstantOfShape", check=_check_constant_of_shape)
def lower_constant_of_shape(node, env):
    # A constant to the program (SupportContext.const fills it): its readers embed it where they take
    # constants (conv / linear weights); a reader of a tensor gets this const (unused ones are removed
    # by MIL's dead-code pass).
    y = env.mb.const(val=env.get(node.outputs[0]), name=env.n(node, "filled"))
    env.set(node.outputs[0], y, rename=True)


def _check_slice(node, ctx):
    if any(v is not None and ctx.const(v) is None for v in list(node.inputs)[1:]):
        return "Slice starts/ends/axes/steps are not constant"
    if ctx.opset(node) < 10:
        return "Slice (opset < 10) is not lowered"
    return None


@RULES.rule("Slice", check=_check_slice)
def lower_slice(node, env):
    inputs = list(node.inputs) + [None] * 5
    shape = env.shape(inputs[0])
    rank = len(shape)
    starts = env.const(inputs[1]).reshape(-1).astype(np.int64)
    ends = env.const(inputs[2]).reshape(-1).astype(np.int64)
    axes = env.const(inputs[3]).reshape(-1).astype(np.int64) if inputs[3] is not None else np.arange(len(starts))
    steps = env.const(inputs[4]).reshape(-1).astype(np.int64) if inputs[4] is not None else np.ones(len(starts), np.int64)
    begin, end, stride = [0] * rank, list(shape), [1] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = int(a) + rank if a < 0 else int(a)
        sl = slice(int(s), int(e), int(st))
        b, en, step = sl.indices(shape[a])
        if step < 0:
            raise ValueError("Slice with a negative step is not lowered")
        begin[a], end[a], stride[a] = b, max(en, b), step
    y = env.mb.slice_by_index(x=env.get(inputs[0]), begin=np.array(begin, np.int32), end=np.array(end, np.int32),
                              stride=np.array(stride, np.int32), name=env.n(node, "slice"))
    env.set(node.outputs[0], y, rename=True)


def _check_split(node, ctx):
    inputs = list(node.inputs)
    if len(inputs) > 1 and inputs[1] is not None and ctx.const(inputs[1]) is None:
        return "Split sizes are not constant"
    if any(ctx.static_shape(o) is None for o in node.outputs):
        return "Split output shapes are not static"
    return None


@RULES.rule("Split", check=_check_split)
def lower_split(node, env):
    rank = len(env.shape(node.inputs[0]))
    axis = int(attr(node, "axis", 0))
    axis = axis + rank if axis < 0 else axis
    sizes = [env.shape(o)[axis] for o in node.outputs]
    outs = env.mb.split(x=env.get(node.inputs[0]), split_sizes=np.array(sizes, np.int32), axis=axis, name=env.n(node, "split"))
    outs = outs if isinstance(outs, (list, tuple)) else [outs]
    for o, v in zip(node.outputs, outs):
        env.set(o, v)


# --- data movement: Gather, Pad ---------------------------------------------------------------


def _check_gather(node, ctx):
    shape = ctx.static_shape(node.inputs[0])
    if shape is None:
        return "Gather data shape is not static"
    axis = int(attr(node, "axis", 0))
    if not -len(shape) <= axis < len(shape):
        return f"Gather axis {axis} is out of range for rank {len(shape)}"
    idx = ctx.const(node.inputs[1])
    if idx is None:
        return None  # run-time indices (an embedding lookup): wrapped at run time, see lower_gather
    dim = shape[axis % len(shape)]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        return f"Gather indices outside [-{dim}, {dim}) (ONNX leaves them undefined)"
    return None


@RULES.rule("Gather", check=_check_gather)
def lower_gather(node, env):
    mb = env.mb
    shape = env.shape(node.inputs[0])
    axis = int(attr(node, "axis", 0)) % len(shape)
    idx = env.const(node.inputs[1])
    if idx is not None:
        # Constant indices are made non-negative here (the check bounded them to [-dim, dim)): MIL
        # documents negative indices, but a constant in [0, dim) needs no run-time wrap on any version.
        idx = idx.astype(np.int64)
        idx = np.where(idx < 0, idx + shape[axis], idx).astype(np.int32)
    else:
        # Run-time indices in [-dim, dim) (ONNX's valid range) become [0, dim): idx + dim where idx < 0.
        # Three int ops with documented semantics (MIL mod does not say which sign its result takes),
        # and no reliance on how a Core ML version treats negative gather indices.
        raw = env.get(node.inputs[1])
        negative = mb.less(x=raw, y=np.int32(0), name=env.n(node, "negative"))
        wrapped = mb.add(x=raw, y=np.int32(shape[axis]), name=env.n(node, "wrapped"))
        idx = mb.select(cond=negative, a=wrapped, b=raw, name=env.n(node, "index"))
    # MIL gather takes fp16 / fp32 / int32 data: bool data goes through int32 and back.
    data = _bool_as_int(env, node, node.inputs[0], "data_int")
    # A scalar index drops the axis (output rank = rank(x) - 1), as in ONNX: MIL gather does the same.
    y = mb.gather(x=data, indices=idx, axis=axis, name=env.n(node, "gather"))
    if _is_bool(env, node.inputs[0]):
        y = mb.cast(x=y, dtype="bool", name=env.n(node, "bool"))
    env.set(node.outputs[0], y, rename=True)


def _check_row_lookup(node, ctx):
    table = ctx.const(node.inputs[1])
    if table is None or table.ndim < 2:
        return "RowLookup's table is not a constant of rank >= 2"
    shape = ctx.static_shape(node.inputs[0])
    if shape is None or not shape or shape[-1] != 1:
        return "RowLookup's ids have no static shape ending in 1"
    return None


@RULES.rule("RowLookup", domain=MINIRT, check=_check_row_lookup)
def lower_row_lookup(node, env):
    """com.minirt::RowLookup (docs/fused_ops.md): an id in [0, K) picks its row of the table, any other id
    row K; select(0 <= id < K, id, K), then gather along the table's rows (the ids' last axis of 1 dropped)."""
    mb = env.mb
    table = env.const(node.inputs[1]).astype(np.float32)
    k = table.shape[0] - 1
    ids = env.get(node.inputs[0])
    inside = mb.logical_and(x=mb.greater_equal(x=ids, y=np.int32(0), name=env.n(node, "nonneg")),
                            y=mb.less(x=ids, y=np.int32(k), name=env.n(node, "below")), name=env.n(node, "inside"))
    idx = mb.select(cond=inside, a=ids, b=np.int32(k), name=env.n(node, "row"))
    idx = mb.squeeze(x=idx, axes=[-1], name=env.n(node, "rows"))
    y = mb.gather(x=table, indices=idx, axis=0, name=env.n(node, "lookup"))
    env.set(node.outputs[0], y, rename=True)


# ONNX Pad mode -> MIL pad mode ("edge" repeats the border element: MIL's "replicate").
_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}


def _pad_pairs(node, ctx_or_env, rank):
    """[(begin, end)] per axis of an ONNX Pad (pads attribute before opset 11, else inputs 1 and 3)."""
    inputs = list(node.inputs)
    if len(inputs) > 1 and inputs[1] is not None:
        pads = [int(p) for p in ctx_or_env.const(inputs[1]).reshape(-1)]
    else:
        pads = [int(p) for p in (attr(node, "pads", None) or [])]
    axes = list(range(rank))
    if len(inputs) > 3 and inputs[3] is not None:
        axes = [int(a) % rank for a in ctx_or_env.const(inputs[3]).reshape(-1)]
    n = len(axes)
    pairs = [(0, 0)] * rank
    for k, a in enumerate(axes):
        pairs[a] = (pads[k], pads[k + n])
    return pairs


def _pad_value(node, ctx_or_env) -> float:
    inputs = list(node.inputs)
    if len(inputs) > 2 and inputs[2] is not None:
        v = ctx_or_env.const(inputs[2])
        return float(v.reshape(-1)[0]) if v.size else 0.0
    return float(attr(node, "value", 0.0) or 0.0)


def _check_pad(node, ctx):
    for i, what in ((1, "pads"), (2, "constant_value"), (3, "axes")):
        v = input_at(node, i)
        if v is not None and ctx.const(v) is None:
            return f"Pad {what} is not constant"
    mode = str_attr(node, "mode", "constant") or "constant"
    if mode not in _PAD_MODES:
        return f"Pad mode {mode!r} has no Core ML equivalent (constant, reflect and edge only)"
    shape = ctx.static_shape(node.inputs[0])
    if shape is None:
        return "Pad input shape is not static"
    pairs = _pad_pairs(node, ctx, len(shape))
    if any(b < 0 or e < 0 for b, e in pairs):
        return "Pad with negative pads (cropping) is not lowered to Core ML"
    if mode != "constant":
        padded = [a for a, (b, e) in enumerate(pairs) if b or e]
        # Conservative: Core ML's non-constant padding is used here on the two innermost axes only
        # (the 1-D / 2-D reflection and replication padding of conv nets).
        if padded and padded[0] < len(shape) - 2:
            return f"Pad mode {mode!r} on an axis other than the last two is not lowered to Core ML"
        # MIL's limits (pad op documentation): reflect at most D-1 per side, replicate at most D.
        limit = 1 if mode == "reflect" else 0
        for a in padded:
            if max(pairs[a]) > shape[a] - limit:
                return f"Pad mode {mode!r} wider than axis {a} allows ({max(pairs[a])} > {shape[a] - limit})"
    return None


@RULES.rule("Pad", check=_check_pad)
def lower_pad(node, env):
    shape = env.shape(node.inputs[0])
    pairs = _pad_pairs(node, env, len(shape))
    mode = _PAD_MODES[str_attr(node, "mode", "constant") or "constant"]
    x = env.get(node.inputs[0])
    padded = [a for a, (b, e) in enumerate(pairs) if b or e]
    if not padded:
        env.set(node.outputs[0], env.mb.identity(x=x, name=env.n(node, "id")), rename=True)
        return
    # MIL pads the last N axes ([b0, e0, b1, e1, ...]); N starts at the outermost padded axis.
    first = padded[0]
    pad = np.array([p for pair in pairs[first:] for p in pair], np.int32)
    kwargs = dict(x=x, pad=pad, mode=mode, name=env.n(node, "pad"))
    if mode == "constant":
        kwargs["constant_val"] = np.float32(_pad_value(node, env))
    env.set(node.outputs[0], env.mb.pad(**kwargs), rename=True)


# --- recurrent: LSTM and GRU ------------------------------------------------------------------
#
# Two lowerings.  MIL's own lstm / gru op where it computes ONNX's formula: LSTM always, GRU with
# linear_before_reset=0 at batch 1 (see _check_gru), every sequence at full length.  Otherwise (torch's
# GRU, linear_before_reset=1; GRU at batch > 1; sequence_lens shorter than the sequence or given at run
# time) the recurrence is unrolled over the static sequence length into MIL matmuls and elementwise
# gates (_emit_unrolled): exact by construction (documented elementwise semantics only), at the price
# of a program that grows with the sequence (_MAX_UNROLLED_STEPS bounds it).

# ONNX stacks LSTM gate blocks as [i, o, f, c]; MIL lstm wants [input, forget, output, cell]
# (MIL op documentation, weight_ih / weight_hh / bias): block k of MIL = block _LSTM_GATES[k] of ONNX.
_LSTM_GATES = [0, 2, 1, 3]
_LSTM_DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}
# Time steps x directions one unrolled node may emit (each step is ~12 MIL ops): 100-frame
# bidirectional speech models fit; a 1500-frame encoder would make a program of tens of thousands of ops.
_MAX_UNROLLED_STEPS = 512


def _rnn_acts(node):
    acts = attr(node, "activations", None)
    return [a.decode() if isinstance(a, bytes) else str(a) for a in acts] if acts else None


def _rnn_common_refusal(op: str, node, ctx, default_acts: tuple, weights: tuple) -> str | None:
    """The conditions both lowerings of an LSTM / GRU share: direction, constant weights, layout, clip,
    default activations, a static 3-D X."""
    inputs = list(node.inputs) + [None] * 8
    direction = str_attr(node, "direction", "forward") or "forward"
    if direction not in _DIRECTIONS:
        return f"{op} direction {direction!r} is unknown"
    for i, what in weights:
        if inputs[i] is not None and ctx.const(inputs[i]) is None:
            return f"{op} {what} is not constant (Core ML takes constant recurrent weights)"
    if int(attr(node, "layout", 0) or 0) != 0:
        return f"{op} layout=1 (batch-major) is not lowered to Core ML"
    if attr(node, "clip", None) is not None:
        # ONNX clips the gate pre-activations; MIL's clip is on the cell gate only: not the same.
        return f"{op} clip is not lowered to Core ML"
    acts = _rnn_acts(node)
    if acts and [a.lower() for a in acts] != list(default_acts) * _DIRECTIONS[direction]:
        names = "/".join(a.capitalize() for a in default_acts)
        return f"{op} activations {acts} are not lowered to Core ML (default {names} only)"
    x_shape = ctx.static_shape(inputs[0])
    if x_shape is None or len(x_shape) != 3:
        return f"{op} input X must be a static 3-D [seq, batch, input] tensor"
    return None


def _full_length(node, ctx) -> bool:
    """True when every sequence runs to X's full length: no sequence_lens, or a constant one equal to it.
    MIL's lstm / gru run every sequence to full length."""
    lens_value = input_at(node, 4)
    if lens_value is None:
        return True
    lens = ctx.const(lens_value)
    return lens is not None and bool(np.all(lens.reshape(-1) == ctx.static_shape(node.inputs[0])[0]))


def _unrolled_refusal(op: str, node, ctx) -> str | None:
    x_shape = ctx.static_shape(node.inputs[0])
    nd = _DIRECTIONS[str_attr(node, "direction", "forward") or "forward"]
    if x_shape[0] * nd > _MAX_UNROLLED_STEPS:
        return (f"{op} over {x_shape[0]} steps x {nd} direction(s) would unroll past {_MAX_UNROLLED_STEPS} steps "
                f"(the Core ML program grows with the sequence)")
    lens_value = input_at(node, 4)
    if lens_value is not None:
        lens = ctx.const(lens_value)
        if lens is not None and (np.any(lens < 0) or np.any(lens > x_shape[0])):
            return f"{op} sequence_lens outside [0, {x_shape[0]}]"
        if lens is None and ctx.static_shape(lens_value) != (x_shape[1],):
            return f"{op} sequence_lens must be a static [batch] tensor"
    return None


def _check_lstm(node, ctx):
    why = _rnn_common_refusal("LSTM", node, ctx, _LSTM_DEFAULT_ACTS, ((1, "W"), (2, "R"), (3, "B"), (7, "P")))
    if why:
        return why
    if int(attr(node, "input_forget", 0) or 0):
        return "LSTM input_forget=1 is not lowered to Core ML"
    p = input_at(node, 7)
    if p is not None and np.any(ctx.const(p)):
        return "LSTM peepholes are not lowered to Core ML"
    return None if _full_length(node, ctx) else _unrolled_refusal("LSTM", node, ctx)


def _rnn_state(env, node, value, nd, batch, hidden, suffix):
    """ONNX state [num_directions, batch, H] -> MIL state [batch, num_directions*H] (zeros when absent)."""
    if value is None:
        return np.zeros((batch, nd * hidden), np.float32)
    const = env.const(value)
    if const is not None:
        return np.ascontiguousarray(const.astype(np.float32).transpose(1, 0, 2).reshape(batch, nd * hidden))
    mb = env.mb
    t = mb.transpose(x=env.get(value), perm=[1, 0, 2], name=env.n(node, suffix + "_t"))
    return mb.reshape(x=t, shape=np.array([batch, nd * hidden], np.int32), name=env.n(node, suffix))


def _lstm_weights(node, env, d, hidden):
    """(weight_ih, weight_hh, bias) of direction ``d`` in MIL's gate order; bias = Wb + Rb."""
    inputs = list(node.inputs) + [None] * 8

    def reorder(a):
        return np.ascontiguousarray(a.reshape(4, hidden, *a.shape[1:])[_LSTM_GATES].reshape(a.shape))

    w = env.const(inputs[1]).astype(np.float32)[d]
    r = env.const(inputs[2]).astype(np.float32)[d]
    if inputs[3] is not None:
        b = env.const(inputs[3]).astype(np.float32)[d]
        b = b[:4 * hidden] + b[4 * hidden:]
    else:
        b = np.zeros(4 * hidden, np.float32)
    return reorder(w), reorder(r), reorder(b)


def _rnn_parts(node, env) -> tuple:
    """(inputs and outputs padded with None to ONNX's full lists, direction, directions, hidden size) of an
    LSTM / GRU node; the hidden size is R's last dimension (R is a constant: the checks say so)."""
    inputs = list(node.inputs) + [None] * (8 - len(node.inputs))
    outputs = list(node.outputs) + [None] * (3 - len(node.outputs))
    direction = str_attr(node, "direction", "forward") or "forward"
    return inputs, outputs, direction, _DIRECTIONS[direction], int(env.const(inputs[2]).shape[-1])


@RULES.rule("LSTM", check=_check_lstm)
def lower_lstm(node, env):
    if not _full_length(node, env.ctx):
        _emit_unrolled(node, env, "LSTM")
        return
    mb = env.mb
    inputs, outputs, direction, nd, hidden = _rnn_parts(node, env)
    seq, batch, _ = env.shape(inputs[0])
    w_ih, w_hh, bias = _lstm_weights(node, env, 0, hidden)
    kwargs = dict(x=env.get(inputs[0]), weight_ih=w_ih, weight_hh=w_hh, bias=bias, direction=direction,
                  initial_h=_rnn_state(env, node, inputs[5], nd, batch, hidden, "h0"),
                  initial_c=_rnn_state(env, node, inputs[6], nd, batch, hidden, "c0"),
                  output_sequence=True, recurrent_activation="sigmoid", cell_activation="tanh", activation="tanh",
                  name=env.n(node, "lstm"))
    if nd == 2:
        kwargs["weight_ih_back"], kwargs["weight_hh_back"], kwargs["bias_back"] = _lstm_weights(node, env, 1, hidden)
    y, h, c = mb.lstm(**kwargs)
    used = set(id(v) for v in used_outputs(node))
    if outputs[0] is not None and id(outputs[0]) in used:
        if direction == "reverse":
            # MIL "reverse" emits steps in processing order (index 0 = the last time step); ONNX's Y
            # is indexed by time step: flip.  (Bidirectional's backward half is already time-aligned.)
            y = mb.reverse(x=y, axes=[0], name=env.n(node, "y_flip"))
        # MIL y [seq, batch, nd*H] -> ONNX Y [seq, nd, batch, H]
        y = mb.reshape(x=y, shape=np.array([seq, batch, nd, hidden], np.int32), name=env.n(node, "y_split"))
        env.set(outputs[0], mb.transpose(x=y, perm=[0, 2, 1, 3], name=env.n(node, "y")), rename=True)
    for out, state, tag in ((outputs[1], h, "y_h"), (outputs[2], c, "y_c")):
        if out is None or id(out) not in used:
            continue
        # MIL final state [batch, nd*H] -> ONNX [nd, batch, H]
        s = mb.reshape(x=state, shape=np.array([batch, nd, hidden], np.int32), name=env.n(node, tag + "_split"))
        env.set(out, mb.transpose(x=s, perm=[1, 0, 2], name=env.n(node, tag)), rename=True)


# --- recurrent: GRU ---------------------------------------------------------------------------

# ONNX stacks GRU gate blocks as [z (update), r (reset), h (hidden)]; MIL gru wants
# [r (reset), o (new/"output"), z (update)] (MIL op documentation, weight_ih / weight_hh).
_GRU_GATES = [1, 2, 0]


def _gru_on_mil_gru(node, ctx) -> bool:
    """Whether MIL's gru op computes this GRU: linear_before_reset=0 (MIL gru resets h before the
    recurrent matmul and has one bias per gate: coremltools' backend tests, o = act(W_o x + R_o (r * h)
    + b_o)), batch 1 (coremltools tests MIL gru at batch 1 only: a known wrong-output bug past the first
    batch row), every sequence at full length.  torch's GRU (linear_before_reset=1) is unrolled."""
    return (not int(attr(node, "linear_before_reset", 0) or 0) and ctx.static_shape(node.inputs[0])[1] == 1
            and _full_length(node, ctx))


def _check_gru(node, ctx):
    why = _rnn_common_refusal("GRU", node, ctx, ("sigmoid", "tanh"), ((1, "W"), (2, "R"), (3, "B")))
    if why:
        return why
    return None if _gru_on_mil_gru(node, ctx) else _unrolled_refusal("GRU", node, ctx)


@RULES.rule("GRU", check=_check_gru)
def lower_gru(node, env):
    if not _gru_on_mil_gru(node, env.ctx):
        _emit_unrolled(node, env, "GRU")
        return
    mb = env.mb
    inputs, outputs, direction, nd, hidden = _rnn_parts(node, env)
    batch = env.shape(inputs[0])[1]
    x = env.get(inputs[0])
    h0 = _rnn_state(env, node, inputs[5], nd, batch, hidden, "h0")  # [batch, nd*H]

    def reorder(a):
        return np.ascontiguousarray(a.reshape(3, hidden, *a.shape[1:])[_GRU_GATES].reshape(a.shape))

    ys, hs = [], []
    for d in range(nd):
        w = env.const(inputs[1]).astype(np.float32)[d]
        r = env.const(inputs[2]).astype(np.float32)[d]
        b = np.zeros(3 * hidden, np.float32)
        if inputs[3] is not None:
            bb = env.const(inputs[3]).astype(np.float32)[d]
            b = bb[:3 * hidden] + bb[3 * hidden:]  # valid: with linear_before_reset=0 Rb_h sits outside r
        mil_dir = "reverse" if direction == "reverse" or d == 1 else "forward"
        if isinstance(h0, np.ndarray):
            h0_d = np.ascontiguousarray(h0[:, d * hidden:(d + 1) * hidden])
        else:
            h0_d = mb.slice_by_index(x=h0, begin=np.array([0, d * hidden], np.int32),
                                     end=np.array([batch, (d + 1) * hidden], np.int32), name=env.n(node, f"h0_{d}"))
        y, h = mb.gru(x=x, initial_h=h0_d, weight_ih=reorder(w), weight_hh=reorder(r), bias=reorder(b),
                      direction=mil_dir, output_sequence=True, recurrent_activation="sigmoid", activation="tanh",
                      name=env.n(node, f"gru_{d}"))
        if mil_dir == "reverse":
            # MIL "reverse" emits steps in processing order (index 0 = last time step): time-align.
            y = mb.reverse(x=y, axes=[0], name=env.n(node, f"y_flip_{d}"))
        ys.append(mb.expand_dims(x=y, axes=[1], name=env.n(node, f"y_{d}")))   # [seq, 1, batch, H]
        hs.append(mb.expand_dims(x=h, axes=[0], name=env.n(node, f"y_h_{d}")))  # [1, batch, H]
    used = set(id(v) for v in used_outputs(node))
    for out, parts, axis, tag in ((outputs[0], ys, 1, "y"), (outputs[1], hs, 0, "y_h")):
        if out is None or id(out) not in used:
            continue
        var = parts[0] if nd == 1 else mb.concat(values=parts, axis=axis, name=env.n(node, tag + "_cat"))
        env.set(out, var, rename=True)


# --- recurrent: the unrolled form ---------------------------------------------------------------


def _initial_state(env, node, value, d, batch, hidden, tag):
    """Direction ``d``'s initial state [1, batch, H] of an ONNX state [nd, batch, H] (zeros when absent)."""
    if value is None:
        return np.zeros((1, batch, hidden), np.float32)
    const = env.const(value)
    if const is not None:
        return np.ascontiguousarray(const.astype(np.float32)[d:d + 1])
    return env.mb.slice_by_index(x=env.get(value), begin=np.array([d, 0, 0], np.int32),
                                 end=np.array([d + 1, batch, hidden], np.int32), name=env.n(node, f"{tag}0_{d}"))


def _step_masks(env, node, lens_value, seq, batch):
    """Per time step t, the bool mask [1, batch, 1] "t < sequence_lens[b]" (None: every step is live).

    ONNX: a sequence of length L computes steps 0..L-1 (reverse: L-1 down to 0); past L its outputs are 0
    and its final state is the one at its last step.  Unrolled over all ``seq`` steps, a masked step keeps
    the carried state unchanged, which gives exactly that in both directions: forward, the state freezes
    after step L-1; reverse, the steps past L-1 come first and leave the initial state in place."""
    if lens_value is None:
        return None
    mb = env.mb
    steps = np.arange(seq, dtype=np.int32).reshape(seq, 1, 1)
    lens = env.const(lens_value)
    if lens is not None:
        live = steps < lens.astype(np.int32).reshape(1, batch, 1)
        return [np.ascontiguousarray(live[t:t + 1]) for t in range(seq)]
    lens_var = mb.reshape(x=env.get(lens_value), shape=np.array([1, batch, 1], np.int32), name=env.n(node, "lens"))
    live = mb.less(x=steps, y=lens_var, name=env.n(node, "live"))  # [seq, batch, 1]
    return list(mb.split(x=live, num_splits=seq, axis=0, name=env.n(node, "live_t"))) if seq > 1 else [live]


def _keep_live(env, node, mask, new, old, tag):
    """``new`` where the step is live, else ``old`` (the state a masked step carries over)."""
    if mask is None:
        return new
    if isinstance(mask, np.ndarray) and mask.all():
        return new
    return env.mb.select(cond=mask, a=new, b=old, name=env.n(node, tag))


def _const(env, node, array, tag):
    return env.mb.const(val=np.ascontiguousarray(array, dtype=np.float32), name=env.n(node, tag))


def _per_step(env, node, x, weight, bias, seq, tag):
    """x [seq, batch, I] @ weight.T + bias for every step at once, split into ``seq`` [1, batch, G] parts."""
    kwargs = dict(x=x, weight=np.ascontiguousarray(weight), name=env.n(node, tag))
    if bias is not None:
        kwargs["bias"] = np.ascontiguousarray(bias)
    y = env.mb.linear(**kwargs)
    return list(env.mb.split(x=y, num_splits=seq, axis=0, name=env.n(node, tag + "_t"))) if seq > 1 else [y]


def _lstm_step(env, node, d, t, xp_t, h, c, r, hidden):
    """One LSTM step (ONNX gate blocks [i, o, f, c], default activations): returns (h, c)."""
    mb = env.mb
    g = mb.add(x=xp_t, y=mb.linear(x=h, weight=r, name=env.n(node, f"rh_{d}_{t}")), name=env.n(node, f"g_{d}_{t}"))
    iof, cand = mb.split(x=g, split_sizes=np.array([3 * hidden, hidden], np.int32), axis=-1,
                         name=env.n(node, f"gsplit_{d}_{t}"))
    i, o, f = mb.split(x=mb.sigmoid(x=iof, name=env.n(node, f"iof_{d}_{t}")), num_splits=3, axis=-1,
                       name=env.n(node, f"iofsplit_{d}_{t}"))
    cand = mb.tanh(x=cand, name=env.n(node, f"cand_{d}_{t}"))
    kept = mb.mul(x=f, y=c, name=env.n(node, f"fc_{d}_{t}"))
    c = mb.add(x=kept, y=mb.mul(x=i, y=cand, name=env.n(node, f"ic_{d}_{t}")), name=env.n(node, f"c_{d}_{t}"))
    h = mb.mul(x=o, y=mb.tanh(x=c, name=env.n(node, f"tc_{d}_{t}")), name=env.n(node, f"h_{d}_{t}"))
    return h, c


def _gru_step(env, node, d, t, xzr_t, xn_t, h, r_zr, r_n, rb_n, lbr: bool, hidden):
    """One GRU step (ONNX gate blocks [z, r, h], default activations): returns h.

    z, r = sigmoid(Wzr x + Wbzr + Rzr h + Rbzr) (both biases folded into the input projection);
    linear_before_reset=1: n = tanh(Wn x + Wbn + r * (Rn h + Rbn)); =0: n = tanh(Wn x + Wbn + Rn (r * h) + Rbn);
    h' = (1 - z) * n + z * h, written n + z * (h - n)."""
    mb = env.mb
    zr = mb.sigmoid(x=mb.add(x=xzr_t, y=mb.linear(x=h, weight=r_zr, name=env.n(node, f"rzr_{d}_{t}")),
                             name=env.n(node, f"zr_pre_{d}_{t}")), name=env.n(node, f"zr_{d}_{t}"))
    z, r = mb.split(x=zr, num_splits=2, axis=-1, name=env.n(node, f"zrsplit_{d}_{t}"))
    if lbr:
        hn = mb.linear(x=h, weight=r_n, bias=rb_n, name=env.n(node, f"rn_{d}_{t}"))
        pre = mb.add(x=xn_t, y=mb.mul(x=r, y=hn, name=env.n(node, f"rhn_{d}_{t}")), name=env.n(node, f"n_pre_{d}_{t}"))
    else:
        rh = mb.mul(x=r, y=h, name=env.n(node, f"rh_{d}_{t}"))
        pre = mb.add(x=xn_t, y=mb.linear(x=rh, weight=r_n, bias=rb_n, name=env.n(node, f"rn_{d}_{t}")),
                     name=env.n(node, f"n_pre_{d}_{t}"))
    n = mb.tanh(x=pre, name=env.n(node, f"n_{d}_{t}"))
    step = mb.mul(x=z, y=mb.sub(x=h, y=n, name=env.n(node, f"hmn_{d}_{t}")), name=env.n(node, f"zh_{d}_{t}"))
    return mb.add(x=n, y=step, name=env.n(node, f"h_{d}_{t}"))


def _emit_unrolled(node, env, op: str):
    """An LSTM / GRU unrolled over its static sequence: per direction, one input projection for all steps,
    then per step the recurrent matmul and the gates; sequence_lens (constant or run-time) masks the carried
    state (_step_masks) and zeroes Y past each sequence's end, as ONNX defines."""
    mb = env.mb
    inputs, outputs, direction, nd, hidden = _rnn_parts(node, env)
    seq, batch, _ = env.shape(inputs[0])
    gates = 4 if op == "LSTM" else 3
    x = env.get(inputs[0])
    w_all = env.const(inputs[1]).astype(np.float32)
    r_all = env.const(inputs[2]).astype(np.float32)
    b_all = (env.const(inputs[3]).astype(np.float32) if inputs[3] is not None
             else np.zeros((nd, 2 * gates * hidden), np.float32))
    masks = _step_masks(env, node, inputs[4], seq, batch)
    lbr = bool(int(attr(node, "linear_before_reset", 0) or 0))
    ys, finals_h, finals_c = [], [], []
    for d in range(nd):
        w, r, wb, rb = w_all[d], r_all[d], b_all[d, :gates * hidden], b_all[d, gates * hidden:]
        h = _initial_state(env, node, inputs[5], d, batch, hidden, "h")
        c = _initial_state(env, node, inputs[6], d, batch, hidden, "c") if op == "LSTM" else None
        # The recurrent weights are one const each, read by every step (not a copy per step).
        if op == "LSTM":
            xp = _per_step(env, node, x, w, wb + rb, seq, f"xp_{d}")
            r_t = _const(env, node, r, f"r_{d}")
        else:
            zr = slice(0, 2 * hidden)
            xzr = _per_step(env, node, x, w[zr], wb[zr] + rb[zr], seq, f"xzr_{d}")
            xn = _per_step(env, node, x, w[2 * hidden:], wb[2 * hidden:], seq, f"xn_{d}")
            r_zr, r_n = _const(env, node, r[zr], f"r_zr_{d}"), _const(env, node, r[2 * hidden:], f"r_n_{d}")
            rb_n = _const(env, node, rb[2 * hidden:], f"rb_n_{d}")
        reverse = direction == "reverse" or d == 1
        steps = range(seq - 1, -1, -1) if reverse else range(seq)
        hs = [None] * seq
        for t in steps:
            mask = masks[t] if masks is not None else None
            if op == "LSTM":
                h_new, c_new = _lstm_step(env, node, d, t, xp[t], h, c, r_t, hidden)
                c = _keep_live(env, node, mask, c_new, c, f"c_keep_{d}_{t}")
            else:
                h_new = _gru_step(env, node, d, t, xzr[t], xn[t], h, r_zr, r_n, rb_n, lbr, hidden)
            h = _keep_live(env, node, mask, h_new, h, f"h_keep_{d}_{t}")
            hs[t] = h
        y = mb.concat(values=hs, axis=0, name=env.n(node, f"y_{d}")) if seq > 1 else hs[0]  # [seq, batch, H]
        if masks is not None:
            # ONNX's Y is 0 past a sequence's end (the carried state there is the frozen / initial one).
            if isinstance(masks[0], np.ndarray):
                live = np.concatenate(masks, axis=0)
            else:
                live = mb.concat(values=masks, axis=0, name=env.n(node, f"live_{d}")) if seq > 1 else masks[0]
            if not (isinstance(live, np.ndarray) and live.all()):
                y = mb.select(cond=live, a=y, b=np.float32(0), name=env.n(node, f"y_masked_{d}"))
        ys.append(mb.expand_dims(x=y, axes=[1], name=env.n(node, f"y4_{d}")))  # [seq, 1, batch, H]
        if masks is not None and not (isinstance(masks[0], np.ndarray) and masks[0].all()):
            # An empty sequence (length 0) has final states 0 in onnxruntime, not its initial state (ONNX
            # leaves it unsaid; the reference is followed).  Step 0 is live exactly when the length is > 0.
            h = mb.select(cond=masks[0], a=h, b=np.float32(0), name=env.n(node, f"h_final_{d}"))
            if c is not None:
                c = mb.select(cond=masks[0], a=c, b=np.float32(0), name=env.n(node, f"c_final_{d}"))
        finals_h.append(h)
        finals_c.append(c)
    used = set(id(v) for v in used_outputs(node))
    for out, parts, axis, tag in ((outputs[0], ys, 1, "y"), (outputs[1], finals_h, 0, "y_h"),
                                  (outputs[2], finals_c, 0, "y_c")):
        if out is None or id(out) not in used:
            continue
        if nd == 1:
            var = parts[0] if not isinstance(parts[0], np.ndarray) else mb.identity(x=parts[0], name=env.n(node, tag))
        else:
            var = mb.concat(values=parts, axis=axis, name=env.n(node, tag + "_cat"))
        env.set(out, var, rename=True)


# --- resize ----------------------------------------------------------------------------------


def _resize_mode(node):
    return (str_attr(node, "mode", "nearest"), str_attr(node, "coordinate_transformation_mode", "half_pixel"),
            str_attr(node, "nearest_mode", "round_prefer_floor"))


def _check_resize(node, ctx):
    mode, ctm, nearest = _resize_mode(node)
    x, y = ctx.static_shape(node.inputs[0]), ctx.static_shape(node.outputs[0])
    if x is None or y is None or len(x) != 4:
        return "Resize needs static 4-D input/output shapes for Core ML"
    if x[:2] != y[:2]:
        return "Resize of the batch/channel axes is not supported by Core ML"
    if attr(node, "antialias", 0):
        return "Resize antialias is not supported by Core ML"
    sh, sw = y[2] / x[2], y[3] / x[3]
    if mode == "nearest":
        if ctm != "asymmetric" or nearest not in ("floor", "round_prefer_floor", "round_prefer_ceil"):
            return f"Resize nearest with coordinate_transformation_mode {ctm!r}/nearest_mode {nearest!r} is not lowered to Core ML"
        if not (sh.is_integer() and sw.is_integer()):
            return "Resize nearest with fractional scales is not lowered to Core ML"
        if nearest != "floor" and not (nearest == "round_prefer_floor" and sh <= 2 and sw <= 2):
            return f"Resize nearest_mode {nearest!r} with scales {sh:g}x{sw:g} differs from Core ML's floor sampling"
        return None
    if mode == "linear":
        if ctm in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            if ctm == "pytorch_half_pixel" and (y[2] == 1 or y[3] == 1):
                return "Resize pytorch_half_pixel to size 1 is not lowered"
            return None
        return f"Resize linear with coordinate_transformation_mode {ctm!r} is not supported by Core ML"
    return f"Resize mode {mode!r} is not supported by Core ML"


@RULES.rule("Resize", "Upsample", check=_check_resize)
def lower_resize(node, env):
    mode, ctm, _ = _resize_mode(node)
    x, y = env.shape(node.inputs[0]), env.shape(node.outputs[0])
    sh, sw = y[2] / x[2], y[3] / x[3]
    name = env.n(node, "resize")
    xv = env.get(node.inputs[0])
    if mode == "nearest":
        out = env.mb.upsample_nearest_neighbor(x=xv, scale_factor_height=int(sh), scale_factor_width=int(sw), name=name)
    else:
        out = env.mb.upsample_bilinear(x=xv, scale_factor_height=float(sh), scale_factor_width=float(sw),
                                       align_corners=ctm == "align_corners", name=name)
    env.set(node.outputs[0], out, rename=True)
