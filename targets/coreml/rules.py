"""Core ML lowering rules: one function per ONNX (or com.minirt) op -> MIL ops.

Each rule is registered in the rule set :data:`RULES` (``targets/rules.py``)
with ``@RULES.rule(op, ..., check=...)`` and has two parts:

* ``check(node, ctx) -> None | reason``: op-specific support conditions
  (attributes, constant weights, ranks); the generic conditions (float
  tensors, static shapes, rank <= 5) are ``CoreMLSpec.precheck``;
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


# --- normalisation / softmax ---------------------------------------------------------------


def _check_softmax(node, ctx):
    rank = ctx.rank(node.inputs[0])
    axis = int(attr(node, "axis", -1 if ctx.opset(node) >= 13 else 1))
    if axis < 0:
        axis += rank
    if ctx.opset(node) < 13 and axis != rank - 1:
        return f"{node.op_type} (opset < 13) over flattened axes {axis}.. is not lowered to Core ML"
    return None


@RULES.rule("Softmax", check=_check_softmax)
def lower_softmax(node, env):
    rank = len(env.shape(node.inputs[0]))
    axis = int(attr(node, "axis", -1 if env.ctx.opset(node) >= 13 else 1))
    axis = axis + rank if axis < 0 else axis
    env.set(node.outputs[0], env.mb.softmax(x=env.get(node.inputs[0]), axis=axis, name=env.n(node, "softmax")), rename=True)


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
        return f"{node.op_type} noop_with_empty_axes=1 is not lowered"
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
    idx = ctx.const(node.inputs[1])
    if idx is None:
        return "Gather indices are not constant (Core ML lowering needs constant indices)"
    shape = ctx.static_shape(node.inputs[0])
    if shape is None:
        return "Gather data shape is not static"
    axis = int(attr(node, "axis", 0))
    if not -len(shape) <= axis < len(shape):
        return f"Gather axis {axis} is out of range for rank {len(shape)}"
    dim = shape[axis % len(shape)]
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        return f"Gather indices outside [-{dim}, {dim}) (ONNX leaves them undefined)"
    return None


@RULES.rule("Gather", check=_check_gather)
def lower_gather(node, env):
    shape = env.shape(node.inputs[0])
    axis = int(attr(node, "axis", 0)) % len(shape)
    # Indices made non-negative here (the check bounded them to [-dim, dim)): MIL documents negative
    # indices, but a constant in [0, dim) needs no run-time wrap on any Core ML version.
    idx = env.const(node.inputs[1]).astype(np.int64)
    idx = np.where(idx < 0, idx + shape[axis], idx).astype(np.int32)
    # A scalar index drops the axis (output rank = rank(x) - 1), as in ONNX: MIL gather does the same.
    y = env.mb.gather(x=env.get(node.inputs[0]), indices=idx, axis=axis, name=env.n(node, "gather"))
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


# --- recurrent: LSTM --------------------------------------------------------------------------

# ONNX stacks LSTM gate blocks as [i, o, f, c]; MIL lstm wants [input, forget, output, cell]
# (MIL op documentation, weight_ih / weight_hh / bias): block k of MIL = block _LSTM_GATES[k] of ONNX.
_LSTM_GATES = [0, 2, 1, 3]
_LSTM_DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _rnn_acts(node):
    acts = attr(node, "activations", None)
    return [a.decode() if isinstance(a, bytes) else str(a) for a in acts] if acts else None


def _check_lstm(node, ctx):
    inputs = list(node.inputs) + [None] * 8
    direction = str_attr(node, "direction", "forward") or "forward"
    if direction not in _DIRECTIONS:
        return f"LSTM direction {direction!r} is unknown"
    nd = _DIRECTIONS[direction]
    for i, what in ((1, "W"), (2, "R"), (3, "B")):
        if inputs[i] is not None and ctx.const(inputs[i]) is None:
            return f"LSTM {what} is not constant (MIL lstm takes constant weights)"
    if int(attr(node, "layout", 0) or 0) != 0:
        return "LSTM layout=1 (batch-major) is not lowered to Core ML"
    if int(attr(node, "input_forget", 0) or 0):
        return "LSTM input_forget=1 has no MIL lstm equivalent"
    if attr(node, "clip", None) is not None:
        # ONNX clips the gate pre-activations; MIL's clip is on the cell gate only: not the same.
        return "LSTM clip is not lowered to Core ML (MIL clips differently)"
    acts = _rnn_acts(node)
    if acts and [a.lower() for a in acts] != list(_LSTM_DEFAULT_ACTS) * nd:
        return f"LSTM activations {acts} are not lowered to Core ML (default Sigmoid/Tanh/Tanh only)"
    p = inputs[7]
    if p is not None:
        pv = ctx.const(p)
        if pv is None or np.any(pv):
            return "LSTM peepholes are not lowered to Core ML"
    return _rnn_sequence_refusal("LSTM", inputs, ctx)[0]


def _rnn_sequence_refusal(op: str, inputs: list, ctx) -> tuple:
    """(why X or sequence_lens cannot be lowered, or None; X's static shape): Core ML runs every sequence
    to its full length over a static [seq, batch, input] X, so sequence_lens must be constant and full."""
    x_shape = ctx.static_shape(inputs[0])
    if x_shape is None or len(x_shape) != 3:
        return f"{op} input X must be a static 3-D [seq, batch, input] tensor", x_shape
    seq_lens = inputs[4]
    if seq_lens is not None:
        lens = ctx.const(seq_lens)
        if lens is None:
            return f"{op} sequence_lens is not constant (Core ML runs every sequence to full length)", x_shape
        if np.any(lens.reshape(-1) != x_shape[0]):
            return f"{op} sequence_lens shorter than the sequence are not lowered to Core ML", x_shape
    return None, x_shape


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


def _check_gru(node, ctx):
    inputs = list(node.inputs) + [None] * 6
    if int(attr(node, "linear_before_reset", 0) or 0):
        # MIL gru has one bias per gate and applies the reset gate to h_{t-1} before the recurrent
        # matmul (coremltools' backend tests: o = act(W_o x + R_o (r * h) + b_o)): ONNX's
        # linear_before_reset=0.  torch's GRU (linear_before_reset=1, r * (R_h h + b_hn)) has no MIL gru
        # equivalent.
        return ("GRU linear_before_reset=1 (torch's GRU) has no MIL gru equivalent: MIL resets h before "
                "the recurrent matmul and has one bias per gate")
    direction = str_attr(node, "direction", "forward") or "forward"
    if direction not in _DIRECTIONS:
        return f"GRU direction {direction!r} is unknown"
    for i, what in ((1, "W"), (2, "R"), (3, "B")):
        if inputs[i] is not None and ctx.const(inputs[i]) is None:
            return f"GRU {what} is not constant (MIL gru takes constant weights)"
    if int(attr(node, "layout", 0) or 0) != 0:
        return "GRU layout=1 (batch-major) is not lowered to Core ML"
    if attr(node, "clip", None) is not None:
        return "GRU clip is not lowered to Core ML"
    acts = _rnn_acts(node)
    if acts and [a.lower() for a in acts] != ["sigmoid", "tanh"] * _DIRECTIONS[direction]:
        return f"GRU activations {acts} are not lowered to Core ML (default Sigmoid/Tanh only)"
    why, x_shape = _rnn_sequence_refusal("GRU", inputs, ctx)
    if why is None and x_shape[1] != 1:
        # coremltools tests MIL gru at batch 1 only (a known wrong-output bug past the first batch row).
        return "GRU with batch > 1 is not lowered to Core ML (MIL gru is reliable at batch 1 only)"
    return why


@RULES.rule("GRU", check=_check_gru)
def lower_gru(node, env):
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
